"""The llama.cpp engine's fault scenarios: ground truth as data, as the reference service holds them.

Each is a :class:`~stagescope.service.scenarios.Scenario` whose ``overrides`` and ``lever_overrides``
are :class:`~stagescope.service.llama_cpp.server.EngineConfig` settings (the lever is a setting
change of the real engine, nothing else), driven over the gateway's ``/v1/completions`` (the load
generator's ``--api openai-completions``). The model is the random-weight llama of
:mod:`.gguf_model` on one CPU thread per server; its costs on this 2-core machine, measured with
llama.cpp's own timings, are about 0.8 ms per prompt token and 2 ms per generated token in a step
(the per-step cost grows with the tokens the step carries). Why each one breaches:

* ``llama-long-prompts``: one request in 15 carries a long prompt (1,500 tokens in the table; the demo
  sizes it to the machine first, :func:`.engine.sizing`: what llama.cpp processes in 2x the SLO
  threshold, up to 4,000 tokens); llama.cpp puts a whole prompt of up to ``--batch-size`` (4,096)
  tokens into one step, so for that long no other slot gets a token: first tokens of the requests
  arriving meanwhile wait for it. Lever: a smaller prompt-processing batch (``--batch-size``/
  ``--ubatch-size`` 256, llama.cpp's form of chunked prefill): a step then carries at most 256 prompt
  tokens (llama.cpp fills it slot by slot, so a prompt in a later slot still waits: see the README).
* ``llama-many-slots``: 16 slots at a load that keeps about ten streams decoding: every step carries
  all of them, and the per-step time, which grows with the streams in it, passes the inter-token
  SLO (the demo sizes the rate and the threshold to the machine first, :mod:`.sizing`). Lever: fewer
  slots (``--parallel 4``; the demo applies the analysis' cap): the excess waits for a slot instead.
* ``llama-slots-busy``: 2 slots and long answers: arrivals need more slot time than two slots give,
  so requests wait for a free slot at the gateway. The demo sizes it to the machine first
  (:mod:`.slot_probe`): a probe times a request with both slots busy (S) and reads the CPU its server
  got; a probe whose servers got under 70 % of the cores they may use (their threads, within the
  affinity mask and cgroup quota) is repeated, and S is taken at the server's full cores
  (:mod:`.probe_share`), as the run's server gets them. The rate is slot_probe.SLOTS_OVERLOAD (1.15)
  x the two slots' capacity at that S, so the queue grows through the run and the TTFT p95 passes
  the threshold of 2 x S; with the lever the four slots are about 67-80 % busy (by the probe): lower
  on the queueing curve than at the earlier 1.25 x of an unscaled S, but still near its knee (the
  predicted p95 moves 4.3-6.2x as much as the slot times; README, "Sizing on a trustworthy probe"). Lever: a second llama-server behind the router (scale-out; on a 2-core machine it only
  helps while a core is free for it: about 1.6x the capacity).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from stagescope import names as N
from stagescope.errors import UserError
from stagescope.service.scenarios import Scenario, Workload

__all__ = ["COMPLETIONS_ROUTE", "LLAMA_SCENARIOS", "get_scenario"]

#: The route the load generator drives (the OpenAI completions API the gateway forwards).
COMPLETIONS_ROUTE = "/v1/completions"


def _frozen(d: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(d))


LLAMA_SCENARIOS: Mapping[str, Scenario] = MappingProxyType(
    {
        s.name: s
        for s in (
            Scenario(
                "llama-healthy", "light load on 4 slots: every first token and gap within budget",
                COMPLETIONS_ROUTE, 1.0, "ttft:p95<1000ms", None, None,
                _frozen({"parallel": 4}), _frozen({}),
                Workload(prompt_tokens=48, max_tokens=32),
            ),
            Scenario(
                "llama-long-prompts", "1 in 15 prompts is long (sized to 2x the SLO); one prompt step holds every slot",
                COMPLETIONS_ROUTE, 3.0, "ttft:p95<750ms", N.STAGE_PREFILL, N.LEVER_CHUNKED_PREFILL,
                _frozen({"parallel": 8, "batch_size": 4096, "ubatch_size": 4096, "ctx_per_slot": 4096}),
                _frozen({"batch_size": 256, "ubatch_size": 256}),
                Workload(prompt_tokens=48, long_prompt_tokens=1500, long_prompt_every=15, max_tokens=16),
            ),
            Scenario(
                "llama-many-slots", "16 slots decode together: every step carries ~10 streams",
                COMPLETIONS_ROUTE, 3.0, "itl:p95<40ms", N.STAGE_DECODE, N.LEVER_REDUCE_BATCH_TOKENS,
                _frozen({"parallel": 16, "ctx_per_slot": 512}),
                _frozen({"parallel": 4}),
                Workload(prompt_tokens=8, max_tokens=96),
            ),
            Scenario(
                "llama-slots-busy", "2 slots, long answers: requests wait for a free slot",
                COMPLETIONS_ROUTE, 1.3, "ttft:p95<1000ms", N.STAGE_QUEUE, N.LEVER_SCALE_OUT,
                _frozen({"parallel": 2, "ctx_per_slot": 1024}),
                _frozen({"replicas": 2}),
                Workload(prompt_tokens=16, max_tokens=128),
            ),
        )
    }
)  # fmt: skip


def get_scenario(name: str) -> Scenario:
    """The llama.cpp scenario called ``name``; an unknown name is a UserError listing the known ones."""
    try:
        return LLAMA_SCENARIOS[name]
    except KeyError:
        raise UserError(f"unknown llama.cpp scenario {name!r}; known: {', '.join(LLAMA_SCENARIOS)}") from None
