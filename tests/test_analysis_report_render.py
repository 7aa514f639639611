"""The HTML report is self-contained and renders in headless Chromium with its verdict and plots."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess

import duckdb
import numpy as np
import pytest
from matplotlib import image as mpimg

from stagescope.analysis import synth_scenarios as S
from stagescope.analysis.api import analyze
from stagescope.analysis.report import to_html, to_json, to_text

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def report() -> dict:  # type: ignore[type-arg]
    data = S.generate("saturated", 1500, seed=2)
    con = duckdb.connect()
    S.to_tables(con, data)
    return analyze(con, data.scenario.slo, window="20s")


def _colour_share(img: np.ndarray, rgb: tuple[int, int, int], tol: int = 40) -> float:
    px = (img[..., :3] * 255).astype(int) if img.dtype != np.uint8 else img[..., :3].astype(int)
    return float((np.abs(px - np.array(rgb)).sum(axis=-1) < tol).mean())


def test_html_is_self_contained_with_every_plot(report) -> None:  # type: ignore[no-untyped-def]
    page = to_html(report)
    assert "http://" not in page and "https://" not in page and "<script" not in page
    imgs = re.findall(r'<img class="(plot-\w+)"[^>]*src="data:image/png;base64,([^"]+)"', page)
    assert [c for c, _ in imgs] == ["plot-breakdown", "plot-cdf", "plot-timeline", "plot-slowest"]
    for cls, b64 in imgs:
        arr = mpimg.imread(io.BytesIO(base64.b64decode(b64)), format="png")
        assert arr.shape[0] > 150 and arr.shape[1] > 300, cls
        assert arr[..., :3].std() > 0.05, f"{cls} is blank"
    assert "BREACHED" in page and "scale-out" in page
    assert '"verdict"' in to_json(report) and "lever: scale-out" in to_text(report)


@pytest.mark.skipif(
    not shutil.which("chromium") and not __import__("os").path.exists(CHROMIUM), reason="no chromium"
)
def test_report_renders_in_headless_chromium(report, tmp_path) -> None:  # type: ignore[no-untyped-def]
    html_file = tmp_path / "report.html"
    html_file.write_text(to_html(report), encoding="utf-8")
    shot = tmp_path / "shot.png"
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1100,3600",
        html_file.as_uri(),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    img = mpimg.imread(shot)
    assert img.shape[0] >= 3000
    # the verdict box (light red) and the plots' tail red and baseline blue are on screen
    assert _colour_share(img, (0xFD, 0xEC, 0xEA), 8) > 0.002, "verdict box not rendered"
    assert _colour_share(img, (0xD6, 0x27, 0x28)) > 0.0005, "no tail-coloured plot pixels"
    assert _colour_share(img, (0x1F, 0x77, 0xB4)) > 0.0003, "no baseline-coloured plot pixels"
    # each quarter of the page below the header has ink: no plot rendered blank
    h = img.shape[0]
    for k in range(4):
        band = img[int(h * (0.1 + 0.2 * k)) : int(h * (0.3 + 0.2 * k)), :, :3]
        assert (band.mean(axis=-1) < 0.6).mean() > 0.005, f"band {k} is blank"
