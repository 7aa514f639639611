"""Terminal display of a load run: a live progress bar and the summary table (rich)."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from stagescope.loadgen.results import Summary
from stagescope.loadgen.runner import ProgressSnapshot

__all__ = ["LiveProgress", "rate_line", "summary_table"]


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


def rate_line(s: Summary) -> str:
    """What was sent against what was scheduled, and the schedule's own mean rate apart from the target.

    A Poisson schedule of 20 req/s over 20 s holds about 400 +- 20 arrivals: "sent 363 of 363 scheduled;
    schedule's own mean rate 18.1 req/s (target 20.0)" says every request went out, where "18.1 req/s
    achieved (target 20.0)" read like a shortfall of the load generator. The rate requests were sent
    at is added only when it differs (stopped early, or requests held back)."""
    line = f"sent {s.sent:,} of {s.scheduled:,} scheduled, {s.ok:,} ok, {s.errors:,} errors; "
    line += f"schedule's own mean rate {s.schedule_rate_rps:,.1f} req/s"
    if s.target_rate_rps is not None and abs(s.target_rate_rps - s.schedule_rate_rps) > 0.05:
        line += f" (target {s.target_rate_rps:,.1f})"
    if s.sent < s.scheduled or abs(s.achieved_rate_rps - s.schedule_rate_rps) > 0.05:
        line += f", sent at {s.achieved_rate_rps:,.1f} req/s over {s.duration_s:,.1f} s"
    if s.api:
        line += f"; {s.api}" + (f" model {s.model}" if s.model else "")
    return line


def summary_table(s: Summary) -> Table:
    """Corrected (from intended send) and naive (from actual send) latency side by side."""
    title = f"{s.route} at {s.url}"  # the rate line goes beside the table (a title wraps at its width)
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
