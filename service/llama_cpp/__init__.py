"""The llama.cpp engine: a real continuous-batching LLM server (``llama-server``) on this machine's CPUs.

``build``: builds ``llama-server`` from the llama.cpp sources that the ``llama-cpp-python`` source
distribution on PyPI vendors, cached outside the repository. ``gguf_model``: writes the model it
serves, a RANDOM-WEIGHT llama (real compute, meaningless text) with a real vocabulary, cached by
recipe. ``server``: runs one or two servers (and a router); ``gateway``: the stagescope-instrumented
proxy in front of them that gives the analysis its spans; ``scenarios``: the llama.cpp fault scenarios.
"""
