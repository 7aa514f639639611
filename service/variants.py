"""What a backend measures about the model variants its levers would switch to, and its export.

A lever that changes the model (``quantize``, ``compile-runtime``) has an effect only measurement can
tell: how much faster a batch runs and how much accuracy it costs. A backend that can build those
variants measures them when it loads (a micro-benchmark of each variant's batch time at a few batch
sizes, and its accuracy on the model's held-out eval set) and :class:`VariantCollector` exports the
result on ``/metrics``, so the analysis, which reads exported data only, predicts a lever's effect
from the service's own measurements:

* ``stagescope_model_eval_accuracy_ratio{model, variant}``: share of the eval set classified right;
* ``stagescope_model_eval_samples{model, variant}``: size of that eval set;
* ``stagescope_model_variant_batch_seconds{model, variant, rows}``: median seconds of one batch of
  ``rows`` rows, on the clock of the work: CPU seconds on a CPU engine (not wall time: on a machine
  shared with other work the ratio of two variants' CPU times stays put while their wall times
  stretch with the load), device seconds on an accelerator.

``variant`` is ``serving`` (the model as served now) or the name of the lever that would serve the
other variant. The SIMULATED backend exports the batch times its latency model states (computed, not
measured, and no accuracy: it has no model).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from stagescope import names as N

__all__ = ["VariantCollector", "VariantReport", "VariantSource"]


@dataclass
class VariantReport:
    """Measured facts per variant (``serving`` or a lever name)."""

    model: str
    #: variant -> share of the eval set classified right (0..1)
    accuracy: dict[str, float] = field(default_factory=dict)
    #: variant -> eval set size
    eval_samples: dict[str, int] = field(default_factory=dict)
    #: variant -> rows per batch -> median seconds per batch (CPU seconds on a CPU engine)
    batch_seconds: dict[str, dict[int, float]] = field(default_factory=dict)
    #: how the numbers were obtained (one line, for logs and the manifest)
    how: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "accuracy": self.accuracy, "eval_samples": self.eval_samples,
            "batch_seconds": {v: {str(r): s for r, s in d.items()} for v, d in self.batch_seconds.items()},
            "how": self.how,
        }  # fmt: skip


@runtime_checkable
class VariantSource(Protocol):
    """A backend that can say what its variants measured (None until loaded)."""

    def variant_report(self) -> VariantReport | None: ...


class VariantCollector(Collector):
    """Exports a backend's :class:`VariantReport` as three gauge families (nothing before it loads)."""

    def __init__(self, source: VariantSource) -> None:
        self.source = source

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rep = self.source.variant_report()
        if rep is None:
            return
        labels = [N.LABEL_MODEL, N.LABEL_VARIANT]
        acc = GaugeMetricFamily(
            N.METRIC_MODEL_EVAL_ACCURACY, "Share of the model's held-out eval set the variant classifies right",
            labels=labels,
        )
        n = GaugeMetricFamily(N.METRIC_MODEL_EVAL_SAMPLES, "Size of the model's held-out eval set", labels=labels)
        for variant, value in sorted(rep.accuracy.items()):
            acc.add_metric([rep.model, variant], value)
            n.add_metric([rep.model, variant], float(rep.eval_samples.get(variant, 0)))
        bt = GaugeMetricFamily(
            N.METRIC_MODEL_VARIANT_BATCH,
            "Median seconds of one batch of `rows` rows through the variant (CPU seconds on a CPU engine; "
            "micro-benchmark at load)",
            labels=[*labels, N.LABEL_ROWS],
        )
        for variant, per_rows in sorted(rep.batch_seconds.items()):
            for rows, sec in sorted(per_rows.items()):
                bt.add_metric([rep.model, variant, str(rows)], sec)
        if rep.accuracy:
            yield acc
            yield n
        if rep.batch_seconds:
            yield bt
