"""Acceptance: what we emit under a dcgm-exporter name has dcgm-exporter's type and label keys.

Their side is the real dcgm-exporter exposition in external/prometheus/dcgm-exporter/, parsed with
prometheus_client's parser. Quirks handled (see external/PROVENANCE.md):

- README_metrics_excerpt.prom lists every ``# HELP``/``# TYPE`` pair first and the samples after, so
  the parser returns typed families without samples and then ``unknown`` families with the samples:
  the two are merged by name. It is an excerpt: its samples carry only ``gpu`` and ``UUID``.
- datadog_dcgm_metrics.txt merges several real scrapes, adds ``# NOTE`` lines, empty ``# HELP NAME``
  lines, and ends with label-less dummy samples DataDog wrote by hand; it has no trailing newline.
- Counter samples are bare names (``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``, no ``_total``).

How label keys are compared (theirs depend on the release and the deployment):

- ``hostname`` (HEAD, and ours) and ``Hostname`` (releases up to 4.5.3-4.8.2, and ours with
  ``--legacy-hostname-label``) are the same key; the real scrapes are older and write ``Hostname``,
  HEAD's own label set is read from its template (external/prometheus/dcgm-exporter/
  render_metrics_head_excerpt.go) and compared exactly;
- ``pod``/``namespace``/``container`` exist only with Kubernetes pod mapping, which we do not do;
- ``DCGM_FI_*`` label keys come from the ``label`` rows of the counters CSV in use; we compare those
  our CSV lists (``DCGM_FI_DRIVER_VERSION``) and drop the others (``DCGM_FI_PROCESS_NAME``, ...);
- ``pci_bus_id`` appeared in dcgm-exporter 3.x; the DataDog scrapes are 2.x (driver 460/470), so it is
  dropped before comparing, and checked separately to be on every one of our samples;
- samples without labels (DataDog's hand-written dummies) and the README excerpt's trimmed label
  sets are compared as subsets: their keys must all be ours.

Types: equal, except ``DCGM_FI_PROF_PCIE_{TX,RX}_BYTES``, which the DataDog dummies type ``counter``
(total bytes, the definition in dcgm-exporter 1.x and in the commented rows of default-counters.csv)
while the active rows of default-counters.csv type them ``gauge`` (bytes/s). We follow the CSV; the
test pins that this is the only disagreement.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stagescope import names
from stagescope.instrumentation.gpu import GpuCollector, generate_text, load_counters_csv
from stagescope.instrumentation.gpu.fake_nvml import FakeGpu, FakeNvml

ROOT = Path(__file__).resolve().parents[1]
SCRAPES = [
    *sorted((ROOT / "external/prometheus/dcgm-exporter").glob("*.prom")),
    ROOT / "external/prometheus/dcgm-exporter/datadog_dcgm_metrics.txt",
]
K8S_LABELS = {"pod", "namespace", "container"}
TYPE_DISAGREEMENTS = {names.DCGM_PCIE_TX_BYTES, names.DCGM_PCIE_RX_BYTES}


def load_scrape(text: str) -> dict[str, tuple[str, list[frozenset[str]]]]:
    """family -> (type, label-key sets of its samples), merging split HELP/TYPE and sample blocks."""
    out: dict[str, tuple[str, list[frozenset[str]]]] = {}
    for fam in text_string_to_metric_families(text):
        typ, keys = out.get(fam.name, ("unknown", []))
        if fam.type != "unknown":
            typ = fam.type
        keys = keys + [frozenset(s.labels) for s in fam.samples]
        out[fam.name] = (typ, keys)
    return out


def normalize(keys: frozenset[str], our_label_fields: set[str]) -> frozenset[str]:
    k = {"Hostname" if x == "hostname" else x for x in keys} - K8S_LABELS - {"pci_bus_id"}
    return frozenset(x for x in k if not x.startswith("DCGM_FI_") or x in our_label_fields)


def ours_text() -> str:
    gpus = [FakeGpu(processes=[(4242, 1024**3, 50, 20)]), FakeGpu()]
    c = GpuCollector(FakeNvml(gpus), hostname="node-a", start_sampler=False)
    c.sampler.sample_once()  # type: ignore[union-attr]
    return generate_text(c).decode()


def test_scrape_files_parse_with_their_quirks() -> None:
    readme = load_scrape(SCRAPES[0].read_text())
    assert readme[names.DCGM_SM_CLOCK] == ("gauge", [frozenset({"gpu", "UUID"})])
    datadog = load_scrape(SCRAPES[1].read_text())
    assert datadog[names.DCGM_TOTAL_ENERGY][0] == "counter"
    assert len(datadog) >= 35


def test_every_dcgm_family_we_emit_matches_theirs() -> None:
    text = ours_text()
    ours = load_scrape(text)
    label_fields = {s.name for s in load_counters_csv() if s.type == "label"}
    for name in ours:  # counters written under their bare names, as dcgm-exporter writes them
        if ours[name][0] == "counter" and name.startswith("DCGM_"):
            assert f"# TYPE {name} counter\n{name}{{" in text, name
    compared: set[str] = set()
    type_mismatch: set[str] = set()
    for path in SCRAPES:
        theirs = load_scrape(path.read_text())
        for name, (typ, our_keys) in ours.items():
            if not name.startswith("DCGM_") or name not in theirs:
                continue
            compared.add(name)
            their_type, their_keys = theirs[name]
            if typ != their_type:
                type_mismatch.add(name)
            (mine,) = set(our_keys)  # every GPU sample carries the same keys
            assert "pci_bus_id" in mine and set(names.DCGM_LABELS) <= mine, name
            for keys in their_keys:
                full_identity = {"gpu", "UUID"} <= keys and ({"Hostname", "hostname"} & keys)
                if full_identity:
                    assert normalize(mine, label_fields) == normalize(keys, label_fields), (path.name, name)
                else:  # dummy or excerpt: what they show must be ours
                    assert normalize(keys, label_fields) <= mine, (path.name, name)
    assert type_mismatch == TYPE_DISAGREEMENTS
    # the comparison covered the core of the default list, not a handful
    assert {
        names.DCGM_GPU_UTIL, names.DCGM_MEM_COPY_UTIL, names.DCGM_FB_USED, names.DCGM_FB_FREE,
        names.DCGM_POWER_USAGE, names.DCGM_SM_CLOCK, names.DCGM_GPU_TEMP, names.DCGM_XID_ERRORS,
        names.DCGM_TOTAL_ENERGY, names.DCGM_PCIE_REPLAY, names.DCGM_MEMORY_TEMP,
    } <= compared  # fmt: skip
    assert len(compared) >= 20


def _head_identity_keys() -> list[str]:
    """The label keys of dcgm-exporter HEAD's GPU metric lines (its text/template), in order; MIG's
    GPU_I_* keys appear only on MIG devices and are left out. The UUID key is configurable there
    (``{{ $metric.UUID }}``, default ``UUID``)."""
    src = (ROOT / "external/prometheus/dcgm-exporter/render_metrics_head_excerpt.go").read_text()
    line = next(x for x in src.splitlines() if x.startswith("{{ $counter.FieldName }}{gpu="))
    line = re.sub(r"\{\{if \$metric\.MigProfile\}\}.*?\{\{end\}\}", "", line)
    line = line.removeprefix("{{ $counter.FieldName }}{")
    return [("UUID" if k == "{{ $metric.UUID }}" else k) for k in re.findall(r'(?:^|[,}])(\w+|\{\{ \$metric\.UUID \}\})="\{\{', line)]


@pytest.mark.parametrize("legacy", [False, True])
def test_identity_labels_are_dcgm_exporter_heads(legacy: bool) -> None:
    head = _head_identity_keys()
    assert head == ["gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname"]
    c = GpuCollector(FakeNvml([FakeGpu()]), hostname="node-a", start_sampler=False,
                     hostname_label="Hostname" if legacy else "hostname")  # fmt: skip
    fam = load_scrape(generate_text(c).decode())[names.DCGM_GPU_TEMP]
    (keys,) = set(fam[1])
    want = [("Hostname" if legacy and k == "hostname" else k) for k in head]
    assert keys - {names.DCGM_LABEL_DRIVER_VERSION} == set(want)
    assert list(names.DCGM_LABELS_LEGACY if legacy else names.DCGM_LABELS) == want


def test_counters_csv_is_dcgm_exporter_heads_default_list() -> None:
    """Every active row of dcgm-exporter's default-counters.csv (byte-identical at HEAD d5e5f51) is in
    ours with its type, in its order; ours adds only the rows named after them."""
    theirs = [(c.name, c.type) for c in load_counters_csv(ROOT / "external/prometheus/dcgm-exporter/default-counters.csv")]
    ours = [(c.name, c.type) for c in load_counters_csv()]
    assert ours[: len(theirs)] == theirs
    assert [n for n, _ in ours[len(theirs) :]] == [
        names.DCGM_CLOCKS_EVENT_REASONS, names.DCGM_ECC_SBE_VOL_TOTAL, names.DCGM_ECC_DBE_VOL_TOTAL,
        names.DCGM_ECC_SBE_AGG_TOTAL, names.DCGM_ECC_DBE_AGG_TOTAL,
    ]  # fmt: skip


def test_stagescope_families_never_take_a_dcgm_name() -> None:
    ours = load_scrape(ours_text())
    own = {n for n in ours if not n.startswith("DCGM_")}
    assert own and all(n.startswith("stagescope_gpu_") for n in own)
