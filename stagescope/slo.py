"""Service-level objectives: one format shared by the alerts generator and the analysis.

Two ways to state an SLO:

* a one-line spec for the command line: ``p99<300ms``, ``ttft:p95<500ms``, ``itl:p99<60ms``
  (the SLI defaults to ``e2e``; thresholds in ``ms`` or ``s``);
* a YAML file with a list ``slos:`` whose items have ``name``, ``service`` (the Prometheus scrape
  job), ``sli`` (``e2e``, ``ttft`` or ``itl``), optional ``route`` and ``model``, ``threshold_ms``,
  ``objective`` (for example 0.99, read by the analysis as the p99), ``window`` (default ``30d``) and
  optional ``quality_budget``: the points of accuracy (on the model's eval set, as the service exports
  it) that a lever changing the model may cost, for example 0.5; a lever that costs more is marked
  not acceptable and the next lever is recommended; optional ``accelerator_price_per_hour`` (cost
  figures in money) and ``autoscaler_metric``: what the service's autoscaler scales on (``cpu``,
  ``memory`` or a metric name), read by the fleet lever rules where kube-state-metrics' HPA series
  are not scraped (a queue tail while it scales on CPU: scale on queue depth instead).

SLI definitions (server side): ``e2e`` is request arrival to last byte written; ``ttft`` is request
arrival to first token written; ``itl`` is the gap between two consecutive tokens of one stream, one
sample per gap (vLLM's meaning, not AIPerf's per-request mean).

Routes. ``route`` is a route template (``/v1/score``, as ``http.route`` and the ``route`` label carry
it). The analysis never pools routes: an SLO with a ``route`` is checked on that route alone (so is
any SLO under ``analyze --route``); an SLO without one, a one-line spec or a file item alike, is checked
on each route its SLI applies to, on its own (``ttft`` and ``itl``: streaming routes; ``e2e``: the
non-streaming routes when the data has both), and the report leads with the worst (see
stagescope.analysis.routes). The alert rules read the same field: they select the route where the
SLI's histogram has a ``route`` label (``e2e``) and, without one, alert on all routes together.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from stagescope.errors import UserError
from stagescope.names import SLI_E2E, SLIS, VLLM_NUM_WAITING
from stagescope.safe_yaml import load_config_yaml
from stagescope.validate import check_number, check_text

__all__ = ["SLO", "load_slo_file", "parse_duration_s", "parse_slo"]

_SPEC = re.compile(
    r"^\s*(?:(?P<sli>[a-z0-9]+)\s*:\s*)?p(?P<pct>\d+(?:\.\d+)?)\s*<\s*(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>ms|s)\s*$"
)
_DURATION = re.compile(r"^(?P<num>\d+(?:\.\d+)?)(?P<unit>ms|s|m|h|d|w)$")
#: Bounds of an SLO's ``window``: at least the shortest burn-rate window, at most a leap year.
MIN_WINDOW_S = 300.0
MAX_WINDOW_S = 366 * 86400.0
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


@dataclass(frozen=True)
class SLO:
    """One latency objective: ``objective`` of ``sli`` samples must be at most ``threshold_ms``."""

    name: str
    sli: str
    threshold_ms: float
    objective: float
    service: str | None = None
    route: str | None = None
    model: str | None = None
    window: str = "30d"
    #: accuracy points (0-100 scale) a model-changing lever may cost; None: no quality gate
    quality_budget: float | None = None
    #: price of one accelerator-hour (any currency); None: the report gives accelerator-seconds only
    accelerator_price_per_hour: float | None = None
    #: the metric the service's autoscaler scales on (``cpu``, ``memory``, or a metric name such as
    #: ``vllm:num_requests_waiting``), where kube-state-metrics' HPA series are not scraped; None: unknown
    autoscaler_metric: str | None = None

    def __post_init__(self) -> None:
        if self.sli not in SLIS:
            raise ValueError(f"unknown SLI {self.sli!r}; expected one of {', '.join(SLIS)}")
        check_number(
            self.objective, "objective", lo=0.0, hi=1.0, lo_open=True, hi_open=True, error=ValueError
        )
        check_number(self.threshold_ms, "threshold_ms", lo=0.0, lo_open=True, error=ValueError)
        check_text(self.name, "name", error=ValueError)
        for key in ("service", "route", "model"):
            if getattr(self, key) is not None:
                check_text(getattr(self, key), key, max_len=1024, error=ValueError)
        if not isinstance(self.window, str):
            raise ValueError(f"window must be a duration such as 30d, got {self.window!r}")
        try:
            window_s = parse_duration_s(self.window)
        except ValueError as exc:
            raise ValueError(f"window: {exc}") from None
        if window_s < MIN_WINDOW_S:
            raise ValueError(
                f"window must be at least 5m (the shortest burn-rate window), got {self.window!r}"
            )
        if window_s > MAX_WINDOW_S:
            raise ValueError(f"window must be at most 366d, got {self.window[:40]!r}")
        if self.quality_budget is not None:
            check_number(self.quality_budget, "quality_budget (accuracy points)", lo=0.0, hi=100.0, error=ValueError)
        if self.autoscaler_metric is not None:
            check_autoscaler_metric(self.autoscaler_metric)
        if self.accelerator_price_per_hour is not None:
            check_number(
                self.accelerator_price_per_hour,
                "accelerator_price_per_hour (the price of one accelerator-hour)",
                lo=0.0,
                lo_open=True,
                error=ValueError,
            )

    @property
    def quantile(self) -> float:
        """The percentile the analysis checks, as a fraction (0.99 for p99)."""
        return self.objective

    @property
    def error_budget(self) -> float:
        """Share of samples allowed above the threshold (1 - objective)."""
        return 1.0 - self.objective

    @property
    def threshold_s(self) -> float:
        return self.threshold_ms / 1000.0

    @property
    def spec(self) -> str:
        """The one-line form, for example ``ttft:p95<500ms``."""
        prefix = "" if self.sli == SLI_E2E else f"{self.sli}:"
        return f"{prefix}p{_plain(self.objective * 100)}<{_plain(self.threshold_ms)}ms"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "sli": self.sli,
            "threshold_ms": self.threshold_ms,
            "objective": self.objective,
            "quantile": self.quantile,
            "service": self.service,
            "route": self.route,
            "model": self.model,
            "window": self.window,
            "spec": self.spec,
            "quality_budget": self.quality_budget,
            "accelerator_price_per_hour": self.accelerator_price_per_hour,
            "autoscaler_metric": self.autoscaler_metric,
        }


def _plain(x: float) -> str:
    """``x`` in plain decimal digits that :func:`parse_slo` reads back: 15 significant digits (so a
    float's noise, ``99.99999999000001``, goes), never an exponent (``1.23457e+06`` is no SLO)."""
    text = f"{x:.15g}"
    return text if "e" not in text else format(Decimal(text), "f")


def parse_duration_s(text: str) -> float:
    """``"30d"`` -> 2592000.0. Units: ms, s, m, h, d, w. Zero, negative and overflowing ones are refused."""
    shown = str(text) if len(str(text)) <= 40 else str(text)[:37] + "..."
    m = _DURATION.match(str(text).strip())
    if not m:
        raise ValueError(f"bad duration {shown!r}; expected a number and one of ms, s, m, h, d, w (e.g. 30d)")
    seconds = float(m["num"]) * _UNIT_S[m["unit"]]
    if not 0.0 < seconds < math.inf:
        raise ValueError(f"bad duration {shown!r}: must be > 0 and finite")
    return seconds


def parse_slo(spec: str) -> list[SLO]:
    """Parse ``--slo``: a one-line spec, or the path of an SLO YAML file (returns all its SLOs)."""
    text = spec.strip()
    shown = spec if len(spec) <= 40 else spec[:37] + "..."
    # os.path.exists, not Path.exists: that raises for a name too long, and '' would be the folder '.'
    if text and _SPEC.match(text) is None and (os.path.exists(text) or text.endswith((".yaml", ".yml"))):
        return load_slo_file(text)
    m = _SPEC.match(text)
    if m is None:
        raise UserError(
            f"bad SLO {shown!r}: expected e.g. 'p99<300ms', 'ttft:p95<500ms', 'itl:p99<60ms' or an SLO YAML file"
        )
    sli = m["sli"] or SLI_E2E
    if sli not in SLIS:
        raise UserError(f"bad SLO {spec!r}: unknown SLI {sli!r}; expected one of {', '.join(SLIS)}")
    pct = float(m["pct"])
    if not 0 < pct < 100:
        # 'p999' is how load tools (stagescope load's summary too) name the 99.9th: say how to write it
        digits = m["pct"]
        hint = (
            f" (the {digits[:2]}.{digits[2:]}th percentile is p{digits[:2]}.{digits[2:]})"
            if len(digits) > 2 and set(digits) == {"9"}
            else ""
        )
        raise UserError(f"bad SLO {spec!r}: percentile must be between 0 and 100{hint}")
    threshold_ms = float(m["num"]) * (1000.0 if m["unit"] == "s" else 1.0)
    if not math.isfinite(threshold_ms):
        raise UserError(f"bad SLO {shown!r}: the threshold must be a finite number of ms or s")
    try:
        return [SLO(name=text.replace(" ", ""), sli=sli, threshold_ms=threshold_ms, objective=pct / 100.0)]
    except ValueError as exc:
        raise UserError(f"bad SLO {spec!r}: {exc}") from None


def load_slo_file(path: str | Path) -> list[SLO]:
    """Read an SLO YAML file; every problem is a UserError naming the file, the line and the item.

    The file is read with :func:`stagescope.safe_yaml.load_config_yaml` (size, alias expansion and
    nesting bounded, duplicate keys refused); numbers must be numbers (``true`` is not 1, ``.nan`` is
    not a threshold), text fields text.
    """
    p = Path(path)
    doc, root = load_config_yaml(p, "SLO file")
    if not isinstance(doc, dict) or not isinstance(doc.get("slos"), list) or not doc["slos"]:
        raise UserError(f"{p}: expected a mapping with a non-empty list 'slos:'")
    lines = _item_lines(root)
    out: list[SLO] = []
    names: set[str] = set()
    for i, item in enumerate(doc["slos"]):
        item_line, key_lines = lines[i] if i < len(lines) else (None, {})
        where = f"{p}:{item_line}: slos[{i}]" if item_line else f"{p}: slos[{i}]"
        if not isinstance(item, dict):
            raise UserError(f"{where}: expected a mapping")
        unknown = set(map(str, item)) - _KNOWN_KEYS
        if unknown:
            raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        for key in ("name", "service", "sli", "threshold_ms", "objective"):
            if key not in item:
                raise UserError(f"{where}: missing '{key}'")
        try:
            slo = _slo_from_item(item)
        except ValueError as exc:
            bad_key = next((k for k in key_lines if str(exc).startswith(k)), None)
            at = f"{p}:{key_lines[bad_key]}: slos[{i}]" if bad_key else where
            name = item["name"]
            label = name if isinstance(name, str) and name.isprintable() and len(name) < 80 else None
            raise UserError(f"{at}{f' ({label})' if label else ''}: {exc}") from None
        if slo.name in names:
            raise UserError(f"{where}: duplicate SLO name {slo.name!r}")
        names.add(slo.name)
        out.append(slo)
    return out


_KNOWN_KEYS = frozenset(
    {"name", "service", "sli", "route", "model", "threshold_ms", "objective", "window", "description",
     "quality_budget", "accelerator_price_per_hour", "autoscaler_metric"}
)


def _slo_from_item(item: dict[str, Any]) -> SLO:
    """One SLO from its YAML mapping; ``ValueError`` messages start with the offending key."""

    def text(key: str, optional: bool = False) -> str | None:
        value = item.get(key)
        if value is None and optional:
            return None
        return check_text(value, key, max_len=1024, error=ValueError)

    return SLO(
        name=str(text("name")),
        service=text("service"),
        sli=str(check_text(item["sli"], "sli", error=ValueError)),
        route=text("route", optional=True),
        model=text("model", optional=True),
        threshold_ms=check_number(
            item["threshold_ms"], "threshold_ms", lo=0.0, lo_open=True, error=ValueError
        ),
        objective=check_number(
            item["objective"], "objective", lo=0.0, hi=1.0, lo_open=True, hi_open=True, error=ValueError
        ),
        window=item.get("window", "30d") if isinstance(item.get("window", "30d"), str) else _bad_window(item),
        quality_budget=None
        if item.get("quality_budget") is None
        else check_number(item["quality_budget"], "quality_budget (accuracy points)", lo=0.0, hi=100.0, error=ValueError),
        accelerator_price_per_hour=None
        if item.get("accelerator_price_per_hour") is None
        else check_number(
            item["accelerator_price_per_hour"],
            "accelerator_price_per_hour (the price of one accelerator-hour)",
            lo=0.0,
            lo_open=True,
            error=ValueError,
        ),
        autoscaler_metric=None
        if item.get("autoscaler_metric") is None
        else check_autoscaler_metric(item["autoscaler_metric"]),
    )


#: ``autoscaler_metric``: a Kubernetes resource name (``cpu``) or a metric name as an HPA or KEDA
#: names it (letters, digits and ``_ : . / -``, starting with a letter or ``_``).
AUTOSCALER_METRIC_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_:./-]{0,255}")


def check_autoscaler_metric(value: Any) -> str:
    """The SLO's ``autoscaler_metric``, checked: text naming one metric; ``ValueError`` otherwise."""
    text = check_text(value, "autoscaler_metric", max_len=256, error=ValueError)
    if not AUTOSCALER_METRIC_PATTERN.fullmatch(text):
        raise ValueError(
            "autoscaler_metric must name one metric (cpu, memory, or a metric name such as "
            f"{VLLM_NUM_WAITING}: letters, digits, _ : . / -), got {text[:80]!r}"
        )
    return text


def _bad_window(item: dict[str, Any]) -> str:
    value = item["window"]
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError(f"window: bad duration {value!r}; expected a number and a unit, e.g. 30d")
    raise ValueError(f"window must be a duration such as 30d, got {value!r}")


def _item_lines(root: Any) -> list[tuple[int | None, dict[str, int]]]:
    """Per item of ``slos:``, its line and the line of each of its keys (from the composed YAML)."""
    if not isinstance(root, yaml.MappingNode):
        return []
    for k, v in root.value:
        if getattr(k, "value", None) == "slos" and isinstance(v, yaml.SequenceNode):
            out: list[tuple[int | None, dict[str, int]]] = []
            for item in v.value:
                keys = {}
                if isinstance(item, yaml.MappingNode):
                    keys = {str(ik.value): int(ik.start_mark.line) + 1 for ik, _ in item.value
                            if isinstance(ik, yaml.ScalarNode)}  # fmt: skip
                out.append((int(item.start_mark.line) + 1, keys))
            return out
    return []
