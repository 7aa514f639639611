"""GPU exporter against a FAKE NVML (simulated GPUs: this machine has none), healthy and broken."""

from __future__ import annotations

import inspect
import logging
import sys
import time
from pathlib import Path

import pynvml
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from stagescope import names
from stagescope.errors import UserError
from stagescope.instrumentation.gpu import GpuCollector, NvmlUnavailable, fields, generate_text, load_nvml
from stagescope.instrumentation.gpu.fake_nvml import FakeGpu, FakeNvml
from stagescope.instrumentation.gpu.fields import READERS, load_counters_csv, parse_counters_csv

ROOT = Path(__file__).resolve().parents[1]
DCGM_CSV = ROOT / "external/prometheus/dcgm-exporter/default-counters.csv"


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def scrape(c: GpuCollector) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """sample name -> {sorted labels: value}, parsed back from our own exposition text.

    The parser reports a counter sample ``X`` as ``X_total``; dcgm-exporter counters are keyed by
    their bare family name (what the text says, checked in test_gpu_dcgm_compat)."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(generate_text(c).decode()):
        for s in fam.samples:
            key = fam.name if fam.name.startswith("DCGM_") else s.name
            out.setdefault(key, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def value(samples: dict[str, dict], name: str, **labels: str) -> float | None:
    for key, v in samples.get(name, {}).items():
        d = dict(key)
        if all(d.get(k) == val for k, val in labels.items()):
            return v
    return None


def gpus_of(samples: dict[str, dict], name: str) -> set[str]:
    return {dict(k)["gpu"] for k in samples.get(name, {})}


def make(fake: FakeNvml, **kw) -> GpuCollector:  # type: ignore[no-untyped-def]
    kw.setdefault("start_sampler", False)
    kw.setdefault("hostname", "node-a")
    return GpuCollector(fake, **kw)


def test_multi_gpu_machine_all_fields_with_dcgm_labels_and_units() -> None:
    fake = FakeNvml(
        [FakeGpu(power_mw=312_500, mem_used=3 * 1024**3, pcie_tx_kbs=2, sm_clock=1410) for _ in range(4)]
    )
    c = make(fake)
    s = scrape(c)
    assert value(s, names.METRIC_GPU_EXPORTER_UP) == 1.0
    assert {value(s, names.METRIC_GPU_UP, gpu=str(i)) for i in range(4)} == {1.0}
    served = [s.name for s in load_counters_csv() if s.type != "label" and s.name not in fields.NOT_PROVIDED]
    assert len(served) >= 26
    for name in served:
        assert gpus_of(s, name) == {"0", "1", "2", "3"}, name
    labels = dict(next(iter(s[names.DCGM_POWER_USAGE])))
    assert set(labels) == {*names.DCGM_LABELS, names.DCGM_LABEL_DRIVER_VERSION}
    g2 = fake.gpus[2]
    assert value(s, names.DCGM_POWER_USAGE, gpu="2") == pytest.approx(312.5)  # mW -> W
    assert value(s, names.DCGM_FB_USED, gpu="2") == 3 * 1024  # bytes -> MiB
    assert value(s, names.DCGM_PCIE_TX_BYTES, gpu="2") == 2048  # KB/s -> bytes/s
    assert (
        value(
            s,
            names.DCGM_SM_CLOCK,
            gpu="2",
            UUID=g2.uuid,
            pci_bus_id=g2.bus_id,
            device="nvidia2",
            modelName=g2.name,
            hostname="node-a",
            DCGM_FI_DRIVER_VERSION="550.54.15",
        )
        == 1410
    )
    assert g2.name.startswith("fake-nvml ")  # the simulated GPUs say what they are
    # counters keep dcgm-exporter's bare names (no _total)
    assert value(s, names.DCGM_TOTAL_ENERGY, gpu="0") == 1_000_000
    assert names.DCGM_TOTAL_ENERGY + "_total" not in generate_text(c).decode()


def test_label_values_are_escaped_in_the_exposition() -> None:
    odd = 'node "a"\\b\nc'
    s = scrape(make(FakeNvml(1), hostname=odd))
    assert value(s, names.DCGM_GPU_TEMP, hostname=odd) == 40


def test_legacy_hostname_label_for_old_dashboards() -> None:
    """dcgm-exporter HEAD writes ``hostname``; --legacy-hostname-label keeps its older releases' key."""
    new = dict(next(iter(scrape(make(FakeNvml(1)))[names.DCGM_GPU_TEMP])))
    old = dict(next(iter(scrape(make(FakeNvml(1), hostname_label="Hostname"))[names.DCGM_GPU_TEMP])))
    assert new["hostname"] == old["Hostname"] == "node-a"
    assert "Hostname" not in new and "hostname" not in old
    assert set(old) - {names.DCGM_LABEL_DRIVER_VERSION} == set(names.DCGM_LABELS_LEGACY)
    with pytest.raises(ValueError, match="hostname_label"):
        make(FakeNvml(1), hostname_label="host")


def test_clock_events_field_under_both_names() -> None:
    """The default CSV lists HEAD's DCGM_FI_DEV_CLOCKS_EVENT_REASONS; a CSV with the pre-3.3 name gets
    the same bitmask under that name."""
    s = scrape(make(FakeNvml(1)))
    assert names.DCGM_CLOCKS_EVENT_REASONS in s and names.DCGM_CLOCK_THROTTLE_REASONS not in s
    old_csv = [c for c in load_counters_csv() if c.name != names.DCGM_CLOCKS_EVENT_REASONS]
    old_csv.append(fields.CounterSpec(names.DCGM_CLOCK_THROTTLE_REASONS, "gauge", "old name", 1))
    s2 = scrape(make(FakeNvml(1), counters=old_csv))
    assert value(s2, names.DCGM_CLOCK_THROTTLE_REASONS, gpu="0") == value(s, names.DCGM_CLOCKS_EVENT_REASONS, gpu="0")


def test_unsupported_fields_are_omitted_and_not_asked_again() -> None:
    fake = FakeNvml([FakeGpu(), FakeGpu(unsupported={"nvmlDeviceGetTotalEnergyConsumption", "field:82"})])
    c = make(fake)
    s = scrape(c)
    assert gpus_of(s, names.DCGM_TOTAL_ENERGY) == {"0"}
    assert gpus_of(s, names.DCGM_MEMORY_TEMP) == {"0"}
    assert gpus_of(s, names.DCGM_GPU_TEMP) == {"0", "1"}
    assert value(s, names.METRIC_GPU_UP, gpu="1") == 1.0
    assert c.gpus[1].unsupported == {names.DCGM_TOTAL_ENERGY, names.DCGM_MEMORY_TEMP}
    fake.gpus[1].unsupported.clear()  # cached: a field found unsupported is not asked again
    assert gpus_of(scrape(c), names.DCGM_TOTAL_ENERGY) == {"0"}


def test_gpu_falling_off_the_bus_sets_up_0_and_the_others_keep_reporting(caplog) -> None:  # type: ignore[no-untyped-def]
    fake = FakeNvml(3)
    c = make(fake)
    assert gpus_of(scrape(c), names.DCGM_GPU_TEMP) == {"0", "1", "2"}
    fake.gpus[1].lost = True
    with caplog.at_level(logging.WARNING):
        s = scrape(c)
        scrape(c)
    assert value(s, names.METRIC_GPU_UP, gpu="1") == 0.0
    assert value(s, names.METRIC_GPU_UP, gpu="0") == value(s, names.METRIC_GPU_UP, gpu="2") == 1.0
    for name in (names.DCGM_GPU_TEMP, names.DCGM_FB_USED, names.DCGM_GPU_UTIL):
        assert gpus_of(s, name) == {"0", "2"}, name
    assert value(s, names.METRIC_GPU_SCRAPE_ERRORS, gpu="1") == 1.0
    assert sum("GpuIsLost" in r.getMessage() for r in caplog.records) == 1  # logged once, not per scrape
    c.sampler.sample_once()  # the sampler survives the lost GPU too
    fake.gpus[1].lost = False  # back (e.g. after a reset): reported again
    assert value(scrape(c), names.METRIC_GPU_UP, gpu="1") == 1.0


def test_gpu_lost_at_start_up() -> None:
    fake = FakeNvml(2)
    fake.gpus[0].lost = True
    c = make(fake)
    s = scrape(c)
    assert value(s, names.METRIC_GPU_UP, gpu="0") == 0.0
    assert gpus_of(s, names.DCGM_GPU_TEMP) == {"1"}
    fake.gpus[0].lost = False
    s = scrape(c)
    assert gpus_of(s, names.DCGM_GPU_TEMP) == {"0", "1"}
    c.sampler.sample_once()
    assert c.sampler.stats(0, "gpu") is not None  # identified late, sampled from then on


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVMLError_DriverNotLoaded"),
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVMLError_LibraryNotFound"),
    ],
)
def test_no_nvml_serves_exporter_up_0_and_logs_one_line(caplog, code: int, cls: str) -> None:  # type: ignore[no-untyped-def]
    with caplog.at_level(logging.INFO):
        c = make(FakeNvml(2, init_error=code))
        s1, s2 = scrape(c), scrape(c)
    assert s1 == s2 == {names.METRIC_GPU_EXPORTER_UP: {(): 0.0}}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and cls in lines[0] and names.METRIC_GPU_EXPORTER_UP in lines[0]
    assert c.sampler is None


def test_pynvml_not_installed(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def no_module(name: str) -> object:
        raise ImportError(f"No module named {name!r}")

    with pytest.raises(NvmlUnavailable, match="not installed"):
        load_nvml(no_module)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now raises ImportError
    c = GpuCollector(hostname="h", start_sampler=False)
    assert scrape(c) == {names.METRIC_GPU_EXPORTER_UP: {(): 0.0}}
    assert "not installed" in (c.unavailable_reason or "")


def test_real_pynvml_on_this_machine_never_crashes() -> None:
    """The real library: on a machine without a GPU driver it must degrade to exporter_up 0."""
    c = GpuCollector(hostname="h", start_sampler=False)
    try:
        s = scrape(c)
        if c.available:  # a GPU machine: every GPU is reported up or down, nothing raises
            assert len(s[names.METRIC_GPU_UP]) == len(c.gpus)
        else:
            assert s == {names.METRIC_GPU_EXPORTER_UP: {(): 0.0}}
            assert "nvmlInit failed" in (c.unavailable_reason or "")
    finally:
        c.close()


def test_one_second_saturation_shows_in_a_15s_scrape_when_polling() -> None:
    clock = Clock()
    fake = FakeNvml(2)
    c = make(fake, clock=clock, interval_s=0.1, window_s=15.0)
    for i in range(150):  # 15 s at 0.1 s: 10% busy, with 1 s (10 samples) at 100% on gpu 0
        fake.gpus[0].util_gpu = 100 if 70 <= i < 80 else 10
        fake.gpus[1].util_gpu = 30
        clock.t += 0.1
        c.sampler.sample_once()
    s = scrape(c)
    assert value(s, names.DCGM_GPU_UTIL, gpu="0") == 10  # the instantaneous value misses the spike
    assert value(s, names.METRIC_GPU_UTIL_WINDOW_MAX, gpu="0", engine="gpu") == 100
    assert value(s, names.METRIC_GPU_UTIL_WINDOW_MEAN, gpu="0", engine="gpu") == pytest.approx(16.0)
    assert value(s, names.METRIC_GPU_UTIL_WINDOW_SAMPLES, gpu="0", engine="gpu") == 150
    assert value(s, names.METRIC_GPU_UTIL_WINDOW_MAX, gpu="1", engine="gpu") == 30
    assert value(s, names.METRIC_GPU_WINDOW_SECONDS, gpu="0") == 15.0
    clock.t += 16  # the spike leaves the window
    c.sampler.sample_once()
    assert value(scrape(c), names.METRIC_GPU_UTIL_WINDOW_MAX, gpu="0", engine="gpu") == 10


def test_driver_sample_buffer_is_drained_with_its_own_timestamps() -> None:
    clock = Clock(1_700_000_100.0)
    t0 = int((clock.t - 20) * 1e6)  # 20 s of driver samples every 1/6 s; 1 s at 100 % at t-5 s
    gpu_samples = [(t0 + i * 166_667, 100 if 90 <= i < 96 else 20) for i in range(120)]
    fake = FakeNvml([FakeGpu(sample_buffer=True, samples={1: gpu_samples, 2: [(t0, 5)]})])
    c = make(fake, clock=clock)
    c.sampler.sample_once()
    c.sampler.sample_once()  # nothing new: NVML_ERROR_NOT_FOUND, no duplicates
    st = c.sampler.stats(0, "gpu")
    assert st is not None and st.max == 100
    in_window = [v for ts, v in gpu_samples if ts / 1e6 >= clock.t - 15]
    assert st.count == len(in_window) and st.mean == pytest.approx(sum(in_window) / len(in_window))
    assert c.sampler.stats(0, "memory_copy") is None  # its only sample is older than the window


def test_per_process_memory_and_utilization_with_pid() -> None:
    fake = FakeNvml([FakeGpu(), FakeGpu(processes=[(4242, 6 * 1024**3, 85, 40), (777, None, 3, 1)])])
    s = scrape(make(fake))
    uuid = fake.gpus[1].uuid
    assert value(s, names.METRIC_GPU_PROCESS_MEMORY, gpu="1", UUID=uuid, pid="4242") == 6 * 1024**3
    assert value(s, names.METRIC_GPU_PROCESS_MEMORY, pid="777") is None  # NVML: not available
    assert value(s, names.METRIC_GPU_PROCESS_UTIL, pid="4242", engine="sm") == 85
    assert value(s, names.METRIC_GPU_PROCESS_UTIL, pid="4242", engine="memory_copy") == 40
    assert value(s, names.METRIC_GPU_PROCESS_UTIL, pid="777", engine="sm") == 3


def test_profiling_fields_come_from_gpm_as_dcgm_ratios_and_are_omitted_before_hopper() -> None:
    h100 = FakeGpu(gr_engine_pct=87.5, tensor_pct=40.0, dram_pct=25.0)
    t4 = FakeGpu(name="fake-nvml Tesla T4", gpm=False)
    c = make(FakeNvml([h100, t4]))
    s = scrape(c)
    assert value(s, names.DCGM_PROF_GR_ENGINE_ACTIVE, gpu="0") == 0.875  # percent -> DCGM's ratio
    assert value(s, names.DCGM_PROF_PIPE_TENSOR_ACTIVE, gpu="0") == 0.4
    assert value(s, names.DCGM_PROF_DRAM_ACTIVE, gpu="0") == 0.25
    for name in (names.DCGM_PROF_GR_ENGINE_ACTIVE, names.DCGM_PROF_DRAM_ACTIVE):
        assert gpus_of(s, name) == {"0"}
    assert value(s, names.METRIC_GPU_UP, gpu="1") == 1.0 and gpus_of(s, names.DCGM_GPU_TEMP) == {"0", "1"}
    h100.gr_engine_pct = 10.0  # each scrape: the activity since the previous one
    assert value(scrape(c), names.DCGM_PROF_GR_ENGINE_ACTIVE, gpu="0") == 0.1
    c.close()


def test_xid_errors_come_from_nvml_events() -> None:
    fake = FakeNvml(2)
    c = make(fake)
    c.sampler.sample_once()
    assert value(scrape(c), names.DCGM_XID_ERRORS, gpu="0") == 0
    fake.xid(0, 79)  # GPU has fallen off the bus (XID 79), as NVML would report it
    c.sampler.sample_once()
    s = scrape(c)
    assert value(s, names.DCGM_XID_ERRORS, gpu="0") == 79
    assert value(s, names.DCGM_XID_ERRORS, gpu="1") == 0


def test_sampler_thread_and_registry_injection() -> None:
    reg = CollectorRegistry()
    c = GpuCollector(FakeNvml(1), hostname="h", interval_s=0.01, window_s=5, registry=reg)
    try:
        deadline = time.monotonic() + 10
        while (st := c.sampler.stats(0, "gpu")) is None or st.count < 3:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "sampler thread produced no samples"
            time.sleep(0.01)
        assert reg.get_sample_value(names.METRIC_GPU_EXPORTER_UP) == 1.0
    finally:
        c.close()
    assert c.sampler is None and not c.available


def test_counters_csv_quirks_and_errors(tmp_path: Path) -> None:
    specs = parse_counters_csv(
        "# c\n\nDCGM_FI_DEV_DEC_UTIL ,     gauge, Decoder utilization (in %).\n"
        "  DCGM_FI_DRIVER_VERSION,        label, Driver Version\n"
    )
    assert [(s.name, s.type, s.help) for s in specs] == [
        ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
        ("DCGM_FI_DRIVER_VERSION", "label", "Driver Version"),
    ]
    bad = tmp_path / "c.csv"
    bad.write_text("# x\nDCGM_FI_DEV_GPU_UTIL, gauge, ok\nDCGM_FI_DEV_SM_CLOCK, histogramm, no\n")
    with pytest.raises(UserError, match=r"c\.csv:3: unknown metric type"):
        load_counters_csv(bad)
    with pytest.raises(UserError, match="cannot read"):
        load_counters_csv(tmp_path / "missing.csv")


def test_bundled_csv_holds_dcgm_default_list_and_each_row_is_read_or_explained() -> None:
    theirs = parse_counters_csv(DCGM_CSV.read_text(), str(DCGM_CSV))
    ours = {s.name: s for s in load_counters_csv()}
    assert len(theirs) == 26
    for spec in theirs:
        assert (ours[spec.name].type, ours[spec.name].help) == (spec.type, spec.help), spec.name
        known = (
            READERS.keys()
            | fields.LABEL_READERS.keys()
            | fields.SAMPLER_FIELDS
            | fields.GPM_FIELDS.keys()
            | fields.NOT_PROVIDED.keys()
        )
        assert spec.name in known, spec.name
    assert set(fields.NOT_PROVIDED) <= {s.name for s in theirs}


def test_nvml_constants_match_pynvml() -> None:
    for const in ("NVML_CLOCK_SM", "NVML_CLOCK_MEM", "NVML_TEMPERATURE_GPU", "NVML_PCIE_UTIL_TX_BYTES",
                  "NVML_PCIE_UTIL_RX_BYTES", "NVML_FI_DEV_MEMORY_TEMP", "NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL",
                  "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC",
                  "NVML_AGGREGATE_ECC", "NVML_VALUE_TYPE_DOUBLE", "NVML_VALUE_TYPE_UNSIGNED_INT",
                  "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG"):  # fmt: skip
        assert getattr(fields, const) == getattr(pynvml, const), const
    assert pynvml.nvmlMemory_v2 == fields.NVML_MEMORY_V2
    assert fields.GPM_FIELDS == {
        names.DCGM_PROF_GR_ENGINE_ACTIVE: pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
        names.DCGM_PROF_PIPE_TENSOR_ACTIVE: pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
        names.DCGM_PROF_DRAM_ACTIVE: pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
    }
    for name in dir(FakeNvml):  # the fake mirrors real pynvml functions and signatures, nothing invented
        if name.startswith("nvml"):
            real = getattr(pynvml, name, None)
            assert callable(real), name
            fake_params = list(inspect.signature(getattr(FakeNvml, name)).parameters)[1:]
            assert fake_params == list(inspect.signature(real).parameters), name
