"""GPU exporter: NVML metrics under dcgm-exporter's names, sampled sub-second.

Teams already have dashboards and alerts on dcgm-exporter's names; its 30 s default interval is too
coarse to line up with a p99 spike. This exporter reads NVML (nvidia-ml-py's ``pynvml``) and serves:

- every field of dcgm-exporter's counters CSV that NVML can provide, with its name, type, unit and
  labels ``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``hostname`` as dcgm-exporter
  HEAD writes them (``Hostname``, as its releases up to 4.5.3-4.8.2 do, with
  ``--legacy-hostname-label``), plus the CSV's ``label`` fields such as ``DCGM_FI_DRIVER_VERSION``;
  see :mod:`.fields` for the field table;
- per process (``pid``): GPU memory and utilization, so a service can be matched to its GPU;
- ``stagescope_gpu_utilization_window_{max,mean}_percent``: utilization sampled every ``--interval``
  (0.1 s) from NVML's sample buffer or by polling, over the last ``--window`` seconds, so a 15 s scrape
  still shows a 1 s saturation;
- ``stagescope_gpu_up{gpu}`` and ``stagescope_gpu_exporter_up``: it never crashes on a missing field,
  a lost GPU, or a machine with no GPU at all.

Use::

    stagescope gpu-exporter --port 9400 --interval 0.1 --window 15

or in code, with NVML injected (``pynvml`` itself, or the simulated :mod:`.fake_nvml` in tests)::

    from stagescope.instrumentation.gpu import GpuCollector, generate_text
    collector = GpuCollector(nvml)              # nvml=None loads pynvml
    text = generate_text(collector)            # keeps dcgm-exporter's counter names (no _total)
"""

from __future__ import annotations

from stagescope.instrumentation.gpu.collector import GpuCollector, NvmlUnavailable, load_nvml
from stagescope.instrumentation.gpu.exposition import generate_text, serve
from stagescope.instrumentation.gpu.fields import CounterSpec, load_counters_csv, parse_counters_csv

__all__ = [
    "CounterSpec",
    "GpuCollector",
    "NvmlUnavailable",
    "generate_text",
    "load_counters_csv",
    "load_nvml",
    "parse_counters_csv",
    "serve",
]
