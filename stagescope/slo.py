"""Service-level objectives: one format shared by the alerts generator and the analysis.

Two ways to state an SLO:

* a one-line spec for the command line: ``p99<300ms``, ``ttft:p95<500ms``, ``itl:p99<60ms``
  (the SLI defaults to ``e2e``; thresholds in ``ms`` or ``s``);
* a YAML file with a list ``slos:`` whose items have ``name``, ``service`` (the Prometheus scrape
  job), ``sli`` (``e2e``, ``ttft`` or ``itl``), optional ``route`` and ``model``, ``threshold_ms``,
  ``objective`` (for example 0.99, read by the analysis as the p99), ``window`` (default ``30d``) and
  optional ``quality_budget``: the points of accuracy (on the model's eval set, as the service exports
  it) that a lever changing the model may cost, for example 0.5; a lever that costs more is marked
  not acceptable and the next lever is recommended.

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
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stagescope.errors import UserError
from stagescope.names import SLI_E2E, SLIS

__all__ = ["SLO", "load_slo_file", "parse_duration_s", "parse_slo"]

_SPEC = re.compile(
    r"^\s*(?:(?P<sli>[a-z0-9]+)\s*:\s*)?p(?P<pct>\d+(?:\.\d+)?)\s*<\s*(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>ms|s)\s*$"
)
_DURATION = re.compile(r"^(?P<num>\d+(?:\.\d+)?)(?P<unit>ms|s|m|h|d|w)$")
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

    def __post_init__(self) -> None:
        if self.sli not in SLIS:
            raise ValueError(f"unknown SLI {self.sli!r}; expected one of {', '.join(SLIS)}")
        if not 0.0 < self.objective < 1.0:
            raise ValueError(f"objective must be between 0 and 1 (exclusive), got {self.objective}")
        if self.threshold_ms <= 0:
            raise ValueError(f"threshold_ms must be positive, got {self.threshold_ms}")
        parse_duration_s(self.window)
        qb = self.quality_budget
        if qb is not None and (isinstance(qb, bool) or not isinstance(qb, int | float) or not 0.0 <= qb <= 100.0):
            raise ValueError(f"quality_budget must be a number of accuracy points in [0, 100], got {qb!r}")
        price = self.accelerator_price_per_hour
        if price is not None and (
            isinstance(price, bool) or not isinstance(price, int | float) or not math.isfinite(price) or price <= 0
        ):
            raise ValueError(
                f"accelerator_price_per_hour must be a positive number (the price of one accelerator-hour), got {price!r}"
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
        pct = f"{self.objective * 100:.10g}"
        prefix = "" if self.sli == SLI_E2E else f"{self.sli}:"
        return f"{prefix}p{pct}<{self.threshold_ms:g}ms"

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
        }


def parse_duration_s(text: str) -> float:
    """``"30d"`` -> 2592000.0. Units: ms, s, m, h, d, w."""
    m = _DURATION.match(str(text).strip())
    if not m:
        raise ValueError(f"bad duration {text!r}; expected a number and one of ms, s, m, h, d, w (e.g. 30d)")
    return float(m["num"]) * _UNIT_S[m["unit"]]


def parse_slo(spec: str) -> list[SLO]:
    """Parse ``--slo``: a one-line spec, or the path of an SLO YAML file (returns all its SLOs)."""
    text = spec.strip()
    if _SPEC.match(text) is None and (Path(text).exists() or text.endswith((".yaml", ".yml"))):
        return load_slo_file(text)
    m = _SPEC.match(text)
    if m is None:
        raise UserError(
            f"bad SLO {spec!r}: expected e.g. 'p99<300ms', 'ttft:p95<500ms', 'itl:p99<60ms' or an SLO YAML file"
        )
    sli = m["sli"] or SLI_E2E
    if sli not in SLIS:
        raise UserError(f"bad SLO {spec!r}: unknown SLI {sli!r}; expected one of {', '.join(SLIS)}")
    pct = float(m["pct"])
    if not 0 < pct < 100:
        raise UserError(f"bad SLO {spec!r}: percentile must be between 0 and 100")
    threshold_ms = float(m["num"]) * (1000.0 if m["unit"] == "s" else 1.0)
    try:
        return [SLO(name=text.replace(" ", ""), sli=sli, threshold_ms=threshold_ms, objective=pct / 100.0)]
    except ValueError as exc:
        raise UserError(f"bad SLO {spec!r}: {exc}") from None


def load_slo_file(path: str | Path) -> list[SLO]:
    """Read an SLO YAML file; every problem is a UserError naming the file and the item."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{p}: SLO file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{p}: cannot read SLO file: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise UserError(f"{p}{where}: not valid YAML") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("slos"), list) or not doc["slos"]:
        raise UserError(f"{p}: expected a mapping with a non-empty list 'slos:'")
    known = {"name", "service", "sli", "route", "model", "threshold_ms", "objective", "window", "description",
             "quality_budget", "accelerator_price_per_hour"}  # fmt: skip
    out: list[SLO] = []
    names: set[str] = set()
    for i, item in enumerate(doc["slos"]):
        where = f"{p}: slos[{i}]"
        if not isinstance(item, dict):
            raise UserError(f"{where}: expected a mapping")
        unknown = set(item) - known
        if unknown:
            raise UserError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        for key in ("name", "service", "sli", "threshold_ms", "objective"):
            if key not in item:
                raise UserError(f"{where}: missing '{key}'")
        try:
            slo = SLO(
                name=str(item["name"]),
                service=str(item["service"]),
                sli=str(item["sli"]),
                route=None if item.get("route") is None else str(item["route"]),
                model=None if item.get("model") is None else str(item["model"]),
                threshold_ms=float(item["threshold_ms"]),
                objective=float(item["objective"]),
                window=str(item.get("window", "30d")),
                quality_budget=item.get("quality_budget"),
                accelerator_price_per_hour=item.get("accelerator_price_per_hour"),
            )
        except (TypeError, ValueError) as exc:
            raise UserError(f"{where} ({item.get('name')}): {exc}") from None
        if slo.name in names:
            raise UserError(f"{where}: duplicate SLO name {slo.name!r}")
        names.add(slo.name)
        out.append(slo)
    return out
