"""PromQL building blocks shared by the dashboards and the alert rules: one place writes selectors.

Every query stagescope generates goes through :func:`sel`, so label matchers are quoted and escaped
the same way everywhere, and metric names always come from :mod:`stagescope.names`.

Histogram bucket bounds (``le``) are matched with :func:`le_matcher`: clients format the same bound
differently (prometheus_client writes ``0.3`` and ``1.0``, Go clients ``1``, Prometheus 3 rewrites
integers as ``1.0``), so an exact ``le="1"`` silently matches nothing on some scrapes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "Matcher",
    "eq",
    "histogram_quantile",
    "le_matcher",
    "le_regex",
    "mean_from_histogram",
    "ne",
    "rate",
    "rx",
    "sel",
    "sum_by",
]

#: What a Prometheus stores for a colon-named engine metric (``vllm:...``, ``sglang:...``) depends on the
#: exposition it was served: prometheus_client 0.26's OpenMetrics writer, the format Prometheus asks for
#: first, keeps the colons in ``# TYPE`` but writes them as underscores in the sample lines
#: (prometheus/client_python#1177, open), so a Prometheus scraping such a vLLM stores
#: ``vllm_time_to_first_token_seconds_bucket``; the text format keeps ``vllm:...``. ``sel(...,
#: any_spelling=True)`` matches both.


@dataclass(frozen=True)
class Matcher:
    """One label matcher, for example ``job=~"$job"``."""

    label: str
    op: str
    value: str

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.label}{self.op}"{escaped}"'


def eq(label: str, value: str) -> Matcher:
    """``label="value"``."""
    return Matcher(label, "=", value)


def ne(label: str, value: str) -> Matcher:
    """``label!="value"``."""
    return Matcher(label, "!=", value)


def rx(label: str, pattern: str) -> Matcher:
    """``label=~"pattern"`` (Prometheus anchors the regex at both ends)."""
    return Matcher(label, "=~", pattern)


def sel(metric: str, matchers: Iterable[Matcher] = (), suffix: str = "", *, any_spelling: bool = False) -> str:
    """A series selector: ``metric<suffix>{m1,m2}``; ``suffix`` is ``_bucket``, ``_sum`` or ``_count``.
    ``any_spelling``: a colon-named metric is matched as written and with its colons as underscores
    (``{__name__=~"vllm[:_]x", m1}``; see above); a name without colons is unchanged."""
    ms = tuple(matchers)
    if any_spelling and ":" in metric:
        ms = (rx("__name__", f"{metric}{suffix}".replace(":", "[:_]")), *ms)
        return "{" + ", ".join(str(m) for m in ms) + "}"
    inner = ", ".join(str(m) for m in ms)
    return f"{metric}{suffix}{{{inner}}}" if inner else f"{metric}{suffix}"


def rate(selector: str, window: str, fn: str = "rate") -> str:
    """``rate(selector[window])`` (or ``increase``, ``avg_over_time`` ... via ``fn``)."""
    return f"{fn}({selector}[{window}])"


def sum_by(expr: str, by: Iterable[str] = ()) -> str:
    """``sum by (a, b) (expr)``; a plain ``sum(expr)`` when ``by`` is empty."""
    labels = ", ".join(by)
    return f"sum by ({labels}) ({expr})" if labels else f"sum({expr})"


def histogram_quantile(
    q: float, metric: str, matchers: Iterable[Matcher], window: str, by: Iterable[str] = (), *, any_spelling: bool = False
) -> str:
    """The ``q`` quantile of a classic histogram over ``window``, kept apart per ``by`` label."""
    buckets = rate(sel(metric, matchers, "_bucket", any_spelling=any_spelling), window)
    return f"histogram_quantile({q:g}, {sum_by(buckets, ('le', *by))})"


def mean_from_histogram(
    metric: str, matchers: Iterable[Matcher], window: str, by: Iterable[str] = (), *, any_spelling: bool = False
) -> str:
    """Mean observation over ``window``: ``sum(rate(_sum)) / sum(rate(_count))``, per ``by`` label."""
    ms = tuple(matchers)
    by = tuple(by)
    num = sum_by(rate(sel(metric, ms, "_sum", any_spelling=any_spelling), window), by)
    den = sum_by(rate(sel(metric, ms, "_count", any_spelling=any_spelling), window), by)
    return f"{num} / {den}"


def le_regex(bound: float) -> str:
    """A regex matching every way clients write the bucket bound ``bound`` (seconds).

    ``0.3`` -> ``0[.]30*`` (``0.3``, ``0.30``); ``1.0`` -> ``1([.]0*)?`` (``1``, ``1.0``). ``[.]`` keeps
    backslashes out of YAML and PromQL string escaping.
    """
    if not math.isfinite(bound) or bound <= 0:
        raise ValueError(f"bucket bound must be a positive finite number, got {bound!r}")
    if bound == int(bound):
        return f"{int(bound)}([.]0*)?"
    text = repr(float(bound))
    if "e" in text or "E" in text:
        raise ValueError(f"bucket bound {bound!r} needs exponent notation; use a bound between 1e-4 and 1e15")
    whole, frac = text.split(".")
    return f"{whole}[.]{frac}0*"


def le_matcher(bound: float) -> Matcher:
    """The ``le`` matcher for bucket bound ``bound`` (see :func:`le_regex`)."""
    return rx("le", le_regex(bound))
