"""Report plots drawn from the report dict alone (matplotlib, Agg backend), returned as PNG bytes.

Each function returns ``None`` when the report has nothing to draw for it. Latencies in ms.
"""

from __future__ import annotations

import io
import zlib
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from stagescope.names import STAGE_KINDS, STAGES, UNATTRIBUTED

__all__ = ["breakdown_png", "cdf_png", "slowest_png", "timeline_png"]

TAIL = "#d62728"
BASE = "#1f77b4"
_PALETTE = [plt.get_cmap("tab20")(i) for i in range(20)]


def _color(stage: str) -> Any:
    if stage == UNATTRIBUTED:
        return "#bbbbbb"
    # a team's own stages: a colour from the name's CRC (stable from run to run, unlike hash())
    i = STAGES.index(stage) if stage in STAGES else len(STAGES) + (zlib.crc32(stage.encode()) % 8)
    return _PALETTE[(2 * i) % len(_PALETTE)]


def _label(row: dict[str, Any]) -> str:
    """A stage as the plots name it: a team's own stage with its kind."""
    kind = row.get("kind")
    return row["stage"] if kind is None or row["stage"] in STAGE_KINDS else f"{row['stage']} [{kind}]"


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _what(report: dict[str, Any]) -> str:
    sli = report["slo"]["sli"]
    return {"e2e": "request latency", "ttft": "time to first token", "itl": "inter-token gap"}.get(sli, sli)


def breakdown_png(report: dict[str, Any]) -> bytes | None:
    """Mean time per stage: tail (slow requests) against baseline (normal ones)."""
    rows = [r for r in report.get("attribution", []) if r.get("tail_mean_ms") is not None]
    if not rows:
        return None
    rows = rows[:10][::-1]
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(rows) + 1.4))
    y = range(len(rows))
    ax.barh([i + 0.2 for i in y], [r["tail_mean_ms"] for r in rows], 0.4, color=TAIL, label="tail (slow)")
    ax.barh(
        [i - 0.2 for i in y], [r["baseline_mean_ms"] or 0 for r in rows], 0.4, color=BASE, label="baseline"
    )
    ax.set_yticks(list(y), [f"{_label(r)} ({r['share']:.0%})" for r in rows])
    ax.set_xlabel("mean time per request (ms)")
    ax.set_title(f"Stage breakdown of the {_what(report)}: tail vs baseline")
    ax.legend(loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def cdf_png(report: dict[str, Any]) -> bytes | None:
    """Empirical CDF of the SLI with the SLO threshold and quantile marked."""
    cdf = report.get("cdf") or []
    if not cdf:
        return None
    xs = [max(c[0], 1e-3) for c in cdf]
    ps = [c[1] for c in cdf]
    thr = report["slo"]["threshold_ms"]
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    ax.plot(xs, ps, color=BASE, lw=2, label=_what(report))
    ax.axvline(thr, color=TAIL, ls="--", label=f"threshold {thr:g} ms")
    ax.axhline(
        report["slo"]["objective"], color="#555555", ls=":", label=f"objective {report['slo']['objective']:g}"
    )
    ax.set_xscale("log")
    ax.set_xlabel(f"{_what(report)} (ms, log scale)")
    ax.set_ylabel("share of samples at or below")
    ax.set_ylim(0, 1.01)
    ax.set_title("Latency CDF")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    return _png(fig)


def timeline_png(report: dict[str, Any]) -> bytes | None:
    """SLO quantile per window, with queue depth and accelerator utilization below it."""
    tl = report.get("timeline") or report.get("windows") or []
    if not tl:
        return None
    t0 = tl[0]["start_unix_ms"]
    xs = [(w["start_unix_ms"] - t0) / 1000.0 for w in tl]
    q = report["slo"]["objective"]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7.5, 4.8), sharex=True, height_ratios=[3, 2])
    ax.plot(xs, [w["quantile_ms"] for w in tl], marker="o", ms=3, color=TAIL, label=f"p{q * 100:g}")
    ax.plot(xs, [w["p50_ms"] for w in tl], color=BASE, lw=1, label="p50")
    ax.axhline(report["slo"]["threshold_ms"], color="#555555", ls="--", label="threshold")
    for i, ev in enumerate(report.get("events") or []):  # deploys, scale events, model swaps
        # from the earliest it can have happened (a scraped event: after the scrape before) to its end
        since = (ev.get("detail") or {}).get("since_unix_ms") or ev["time_unix_ms"]
        x = (min(since, ev["time_unix_ms"]) - t0) / 1000.0
        x_end = (max(ev["time_unix_ms"], ev.get("end_unix_ms") or 0) - t0) / 1000.0
        for a in (ax, ax2):
            a.axvline(x, color="#d62728", ls=":", lw=1, label=None if i or a is ax2 else "event")
            if x_end > x:
                a.axvspan(x, x_end, color="#d62728", alpha=0.08, lw=0)
        ax.annotate(ev["kind"], (x, 1.0), xycoords=("data", "axes fraction"), fontsize=7, color="#d62728",
                    rotation=90, va="top", ha="right")  # fmt: skip
    ax.set_ylabel("ms")
    ax.set_title(f"{_what(report)} over time ({tl[0]['seconds']:g} s windows)")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    qd = [w.get("queue_depth_mean") for w in tl]
    ut = [w.get("utilization_pct") for w in tl]
    drew = False
    if any(v is not None for v in qd):
        ax2.plot(
            xs, [float("nan") if v is None else v for v in qd], color="#2ca02c", label="queue depth (mean)"
        )
        drew = True
    ax2.set_ylabel("queue depth")
    if any(v is not None for v in ut):
        ax3 = ax2.twinx()
        ax3.plot(xs, [float("nan") if v is None else v for v in ut], color="#9467bd", label="utilization %")
        ax3.set_ylabel("utilization %")
        ax3.set_ylim(0, 105)
        ax3.legend(loc="upper left", fontsize=8)
        drew = True
    if not drew:
        ax2.text(
            0.5,
            0.5,
            "no queue depth or utilization in the data",
            ha="center",
            va="center",
            transform=ax2.transAxes,
        )
    else:
        ax2.legend(loc="upper right", fontsize=8)
    ax2.set_xlabel("seconds since first window")
    ax2.grid(alpha=0.3)
    return _png(fig)


def slowest_png(report: dict[str, Any]) -> bytes | None:
    """The slowest requests as stacked bars of their stage times."""
    slow = [s for s in report.get("slowest", []) if s.get("stages")]
    if not slow:
        return None
    slow = slow[:12][::-1]
    stages = [s for s in [*STAGES, UNATTRIBUTED] if any(s in x["stages"] for x in slow)]
    stages += sorted({k for x in slow for k in x["stages"]} - set(stages))
    fig, ax = plt.subplots(figsize=(7.5, 0.35 * len(slow) + 1.5))
    left = [0.0] * len(slow)
    for st in stages:
        vals = [x["stages"].get(st, 0.0) for x in slow]
        ax.barh(range(len(slow)), vals, left=left, color=_color(st), label=st)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_yticks(range(len(slow)), [x["trace_id"][:12] for x in slow], fontsize=8)
    ax.set_xlabel("ms")
    ax.set_title("Slowest requests by stage")
    ax.legend(fontsize=7, ncol=3, loc="lower right")
    return _png(fig)
