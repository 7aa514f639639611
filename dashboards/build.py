"""``stagescope dashboards build``: every dashboard as Grafana JSON, one file each.

File names are stable (``<uid>.json``): Grafana's file provisioning (the local stack mounts
``dashboards/generated/``) and the regeneration test rely on them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from stagescope.dashboards import gpu, latency, llm, slo
from stagescope.dashboards.panels import render
from stagescope.errors import UserError
from stagescope.paths import ensure_writable_dir

__all__ = ["DASHBOARDS", "build_dashboards", "rendered"]

#: file name -> builder, in the order Grafana lists them
DASHBOARDS: dict[str, Callable[[], Any]] = {
    "stagescope-latency.json": latency.dashboard,
    "stagescope-llm.json": llm.dashboard,
    "stagescope-gpu.json": gpu.dashboard,
    "stagescope-slo.json": slo.dashboard,
}


def rendered() -> dict[str, str]:
    """File name -> Grafana JSON text of every dashboard."""
    return {name: render(build()) for name, build in DASHBOARDS.items()}


def build_dashboards(out_dir: str | Path) -> list[Path]:
    """Write every dashboard into ``out_dir`` (created if missing); returns the paths written."""
    out = ensure_writable_dir(out_dir, "dashboards")
    try:
        written = []
        for name, text in rendered().items():
            (out / name).write_text(text, encoding="utf-8")
            written.append(out / name)
    except OSError as exc:
        raise UserError(f"{out}: cannot write dashboards: {exc}") from None
    return written
