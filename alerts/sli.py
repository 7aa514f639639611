"""Latency SLIs as PromQL: the share of samples slower than the SLO threshold, from a classic histogram.

``bad / total = (count - bucket{le=T}) / count`` over a window, where ``T`` must be a bucket bound of
the histogram the SLI reads (``names.SLI_HISTOGRAM``): a threshold between two bounds cannot be read
off a classic histogram without interpolation, so such an SLO file is rejected with the nearest bounds.

Which histogram each SLI reads, and its labels (see :mod:`stagescope.instrumentation.metrics`):

* ``e2e``: ``stagescope_request_duration_seconds`` [route, model, status_class], server arrival to
  last byte; requests whose client left before the answer was complete
  (``status_class="client_closed"``) are neither good nor bad: the ratio leaves them out;
* ``ttft``: ``gen_ai_server_time_to_first_token_seconds`` [model], server arrival to first token;
* ``itl``: ``stagescope_inter_token_latency_seconds`` [model], one sample per gap between tokens.

The TTFT and ITL histograms carry no ``route`` label: a ``route`` on such an SLO is kept for the
analysis (which reads traces) and is not applied in PromQL; the rule's annotation says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from stagescope import names
from stagescope.promql import Matcher, eq, le_matcher, ne, rate, sel, sum_by
from stagescope.slo import SLO

__all__ = ["SLI_LABELS", "SliQuery", "check_threshold", "nearest_bounds", "sli_query"]

#: Labels (besides ``job`` and ``le``) of the histogram each SLI reads.
SLI_LABELS: dict[str, frozenset[str]] = {
    names.SLI_E2E: frozenset({names.LABEL_ROUTE, names.LABEL_MODEL, names.LABEL_STATUS_CLASS}),
    names.SLI_TTFT: frozenset({names.LABEL_MODEL}),
    names.SLI_ITL: frozenset({names.LABEL_MODEL}),
}


def nearest_bounds(value: float, bounds: Sequence[float]) -> tuple[float | None, float | None]:
    """The bucket bounds just below and just above ``value`` (``None`` past either end)."""
    below = [b for b in bounds if b < value]
    above = [b for b in bounds if b > value]
    return (max(below) if below else None, min(above) if above else None)


def check_threshold(slo: SLO, bounds: Sequence[float] | None = None) -> float:
    """Return the bucket bound equal to ``slo.threshold_s``; raise ``ValueError`` if there is none.

    ``bounds`` defaults to the stagescope bucket set of the histogram the SLI reads.
    """
    metric = names.SLI_HISTOGRAM[slo.sli]
    bounds = names.DEFAULT_BUCKETS[metric] if bounds is None else bounds
    for b in bounds:
        if math.isclose(b, slo.threshold_s, rel_tol=1e-9, abs_tol=1e-12):
            return b
    lo, hi = nearest_bounds(slo.threshold_s, bounds)
    near = " and ".join(f"{b * 1000:g} ms" for b in (lo, hi) if b is not None)
    raise ValueError(
        f"threshold_ms {slo.threshold_ms:g} is not a bucket boundary of {metric} "
        f"(the {slo.sli} SLI is read off that histogram); nearest boundaries: {near}"
    )


@dataclass(frozen=True)
class SliQuery:
    """The PromQL pieces of one SLO's SLI."""

    metric: str
    matchers: tuple[Matcher, ...]
    bound: float
    ignored: tuple[str, ...]  # SLO fields that the histogram cannot filter on (e.g. route on TTFT)

    def error_ratio(self, window: str) -> str:
        """Share of samples above the threshold over ``window`` (bad / total); empty when idle."""
        total = sum_by(rate(sel(self.metric, self.matchers, "_count"), window))
        good = sum_by(rate(sel(self.metric, (*self.matchers, le_matcher(self.bound)), "_bucket"), window))
        return f"(\n  {total}\n  -\n  {good}\n)\n/\n{total}"


def sli_query(slo: SLO, bounds: Sequence[float] | None = None) -> SliQuery:
    """Build the SLI of ``slo``; raises ``ValueError`` when the threshold is not a bucket bound."""
    bound = check_threshold(slo, bounds)
    labels = SLI_LABELS[slo.sli]
    matchers: list[Matcher] = []
    if slo.service:
        matchers.append(eq("job", slo.service))
    ignored: list[str] = []
    for key, label, value in (
        ("route", names.LABEL_ROUTE, slo.route),
        ("model", names.LABEL_MODEL, slo.model),
    ):
        if value is None:
            continue
        if label in labels:
            matchers.append(eq(label, value))
        else:
            ignored.append(key)
    if names.LABEL_STATUS_CLASS in labels:  # a client that went away waited for nothing we served
        matchers.append(ne(names.LABEL_STATUS_CLASS, names.STATUS_CLASS_CLIENT_CLOSED))
    return SliQuery(names.SLI_HISTOGRAM[slo.sli], tuple(matchers), bound, tuple(ignored))
