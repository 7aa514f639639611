"""Terminal display of a load run: a live progress bar and the summary table (rich)."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from stagescope.loadgen.results import Summary
from stagescope.loadgen.runner import ProgressSnapshot

__all__ = ["LiveProgress", "summary_table"]


def _fmt(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:,.1f}" if ms >= 10 else f"{ms:.2f}"


class LiveProgress:
    """Progress bar over the schedule's span (seconds), with rate, in flight, p50 and p99 (corrected)."""

    def __init__(self, console: Console, duration_s: float, total: int, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.total = total
        self._progress = Progress(
            TextColumn("[bold]load[/bold]"),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
            console=console,
            disable=not enabled,
            transient=False,
        )
        self._task: TaskID = self._progress.add_task("load", total=max(duration_s, 1e-9), info="starting")

    def __enter__(self) -> LiveProgress:
        self._progress.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.__exit__(exc_type, exc, tb)

    def update(self, s: ProgressSnapshot) -> None:
        info = (
            f"sent {s.sent:,}/{s.total:,}  {s.rate_rps:,.0f} req/s  in flight {s.in_flight}"
            + (f" (+{s.waiting} capped)" if s.waiting else "")
            + f"  p50 {_fmt(s.p50_ms)} ms  p99 {_fmt(s.p99_ms)} ms"
            + (f"  errors {s.errors:,}" if s.errors else "")
        )
        self._progress.update(self._task, completed=min(s.elapsed_s, s.duration_s), info=info)


def summary_table(s: Summary) -> Table:
    """Corrected (from intended send) and naive (from actual send) latency side by side."""
    title = (
        f"{s.route} at {s.url}: {s.sent:,} sent of {s.scheduled:,} scheduled, {s.ok:,} ok, {s.errors:,} errors; "
        f"{s.achieved_rate_rps:,.1f} req/s achieved (target {s.target_rate_rps:,.1f})"
    )
    t = Table(title=title, title_justify="left")
    t.add_column("ms", justify="left")
    for q in ("p50", "p90", "p99", "p999", "max"):
        t.add_column(q, justify="right")
    rows = [
        ("latency (corrected)", s.latency_ms),
        ("latency (naive)", s.naive_latency_ms),
        ("send lag", s.send_lag_ms),
    ]
    if s.ttft_ms.get("p50") is not None:
        rows += [
            ("TTFT (corrected)", s.ttft_ms),
            ("TTFT (naive)", s.ttft_naive_ms),
            ("ITL p99 per stream", s.itl_p99_ms),
        ]
    for name, qs in rows:
        t.add_row(name, *(_fmt(qs.get(q)) for q in ("p50", "p90", "p99", "p999", "max")))
    if s.status_counts:
        t.caption = "status: " + ", ".join(f"{k} x{v:,}" for k, v in sorted(s.status_counts.items()))
        if s.stopped_early:
            t.caption += f"; stopped early: {s.stopped_early}"
    return t
