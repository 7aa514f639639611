"""The onnx engine: a real digits model trained here, real INT8, measured variants, the quality gate.

The models are built once per machine into the cache (``$STAGESCOPE_CACHE_DIR``, default
``~/.cache/stagescope``; digits-mlp one to three minutes the first time, digits-ink-mlp under a
minute) and reused. The end-to-end tests run
the demo on the real model (marked slow).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the onnx engine needs the onnx extra (pip install 'stagescope[onnx]')")
pytest.importorskip("onnx", reason="the onnx engine needs the onnx extra (pip install 'stagescope[onnx]')")
pytest.importorskip("sklearn", reason="the onnx engine needs the onnx extra (pip install 'stagescope[onnx]')")

from prometheus_client import CollectorRegistry, generate_latest

from stagescope import names as N
from stagescope.service import onnx_model as M
from stagescope.service.backends import PredictItem
from stagescope.service.engines import get_engine
from stagescope.service.onnx_backend import OnnxBackend
from stagescope.service.scenarios import settings_for
from stagescope.service.variants import VariantCollector

ONNX = get_engine("onnx")
CLI = [sys.executable, "-m", "stagescope.cli"]


@pytest.fixture(scope="module")
def artifacts() -> M.Artifacts:
    return M.ensure_artifacts()


@pytest.fixture(scope="module")
def ink() -> M.Artifacts:
    return M.ensure_artifacts(model="digits-ink-mlp")


def test_the_model_is_built_once_and_says_how_it_was_made(artifacts: M.Artifacts) -> None:
    again = M.ensure_artifacts()
    assert again.folder == artifacts.folder and artifacts.folder.name == M.recipe_hash()
    assert artifacts.folder.is_relative_to(M.cache_root())
    man = artifacts.manifest
    assert man["recipe"] == M.RECIPE and set(man["versions"]) == {"onnxruntime", "onnx", "scikit-learn"}
    assert set(man["sha256"]) == {"fp32.onnx", "int8.onnx", "eval.npz"} and set(man["files"]) == set(man["sha256"])
    x, y = artifacts.eval_set()
    assert x.shape == (man["eval_images"], M.N_FEATURES) and sorted(set(y.tolist())) == list(range(10))
    # the accuracy in the manifest is the model's, recomputed here from the files
    assert M.accuracy(artifacts.fp32, x, y) == man["eval_accuracy"]["fp32"] > 0.9
    assert M.accuracy(artifacts.int8, x, y) == man["eval_accuracy"]["int8"] > 0.9
    assert artifacts.int8.stat().st_size < 0.4 * artifacts.fp32.stat().st_size  # INT8 weights, really


def test_a_damaged_cache_entry_is_rebuilt_not_used(tmp_path: Path, artifacts: M.Artifacts, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import shutil

    root = tmp_path / "cache"
    shutil.copytree(artifacts.folder, root / M.RECIPE["name"] / artifacts.folder.name)
    good = M.ensure_artifacts(root)
    assert good.manifest["hash"] == artifacts.manifest["hash"]
    (good.folder / "int8.onnx").write_bytes(b"not a model")
    built: list[Path] = []
    monkeypatch.setattr(M, "_build", lambda folder, key, recipe: (built.append(folder), shutil.copytree(
        artifacts.folder, folder, dirs_exist_ok=True)))  # fmt: skip
    fixed = M.ensure_artifacts(root)
    assert built and M._sha256(fixed.int8) == artifacts.manifest["sha256"]["int8.onnx"]


def test_the_ink_model_is_its_own_recipe_and_int8_breaks_it_by_the_per_tensor_scale(
    artifacts: M.Artifacts, ink: M.Artifacts
) -> None:
    """digits-ink-mlp takes the image's total ink in raw units (the sum of its 0-16 pixels) beside pixels
    in [0, 1]. FP32 computes the trained model on those raw inputs (the standardisation folded into its
    first layer), so it stays accurate; dynamic INT8 quantizes the first MatMul's input with one scale
    per tensor, ``(max(0, max x) - min(0, min x)) / 255`` (ONNX DynamicQuantizeLinear), which the ink
    makes ~1.6: the pixels collapse and INT8 costs far more than a realistic 0.5-point budget."""
    import onnxruntime as ort

    from stagescope.service.settings import ONNX_MODELS

    assert tuple(M.MODELS) == ONNX_MODELS and M.MODELS["digits-ink-mlp"] is M.INK_RECIPE
    man = ink.manifest
    assert ink.folder.parent.name == M.INK_RECIPE["name"] != M.RECIPE["name"]
    assert ink.folder.name == M.recipe_hash("digits-ink-mlp") != artifacts.folder.name
    assert man["recipe"] == M.INK_RECIPE and man["model"] == "digits-ink-mlp" and "why_int8_hurts" in man["recipe"]
    x, y = ink.eval_set()
    assert x.shape == (man["eval_images"], M.N_FEATURES + 1) and man["inputs"] == M.N_FEATURES + 1
    assert float(x[:, :-1].max()) <= 1.0 and float(x[:, -1].min()) > 100  # pixels in [0, 1], ink in raw units
    fp32, int8 = M.accuracy(ink.fp32, x, y), M.accuracy(ink.int8, x, y)
    assert (fp32, int8) == (man["eval_accuracy"]["fp32"], man["eval_accuracy"]["int8"])
    assert fp32 > 0.95 and (fp32 - int8) * 100 > 10  # 21.6-29.6 points over 8 training seeds
    assert (fp32 - M.accuracy(ink.int8, x, y, batch=1)) * 100 > 5  # one image per run: its own ink, still
    # the mechanism, on the FP32 graph: its input rounded as DynamicQuantizeLinear rounds it loses much
    step = float(x.max()) / 255  # the inputs are >= 0, so the zero point is 0
    sess = ort.InferenceSession(str(ink.fp32), providers=["CPUExecutionProvider"])
    rounded = (np.round(x / step) * step).astype(np.float32)
    rounded_acc = float((sess.run([M.OUTPUT_NAME], {M.INPUT_NAME: rounded})[0].argmax(axis=1) == y).mean())
    assert step > 1.5 and (fp32 - rounded_acc) * 100 > 10
    # the graph's input is what INT8 quantizes, per tensor, at run time; and the whole INT8 result is
    # those formulas: FP32's weights and every MatMul input rounded per tensor give ORT's predictions
    assert onnx_ops(ink.int8)[0] == ("DynamicQuantizeLinear", M.INPUT_NAME)
    assert float((_per_tensor_int8(ink.fp32, x) == sess_pred(ink.int8, x)).mean()) > 0.95
    with pytest.raises(M.UserError, match="unknown onnx model 'resnet'; known: digits-mlp, digits-ink-mlp"):
        M.ensure_artifacts(model="resnet")


def _per_tensor_int8(fp32: Path, x: np.ndarray) -> np.ndarray:
    """The FP32 graph's predictions with quantize_dynamic's arithmetic in numpy: each MatMul's input as
    DynamicQuantizeLinear rounds it (uint8, one scale and zero point per tensor), its weights as
    per-tensor symmetric INT8 (QInt8, per_channel=False)."""
    import onnx
    from onnx import numpy_helper

    p = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in onnx.load(str(fp32)).graph.initializer}
    h, layers = x.astype(np.float64), sum(1 for k in p if k.startswith("W"))
    for i in range(layers):
        scale = (max(0.0, h.max()) - min(0.0, h.min())) / 255
        zero = np.clip(np.round(-min(0.0, h.min()) / scale), 0, 255)
        h = (np.clip(np.round(h / scale) + zero, 0, 255) - zero) * scale
        w = p[f"W{i}"]
        w_scale = np.abs(w).max() / 127
        h = h @ (np.round(w / w_scale) * w_scale) + p[f"b{i}"]
        h = np.maximum(h, 0) if i < layers - 1 else h
    return h.argmax(axis=1)


def sess_pred(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run([M.OUTPUT_NAME], {M.INPUT_NAME: x})[0].argmax(axis=1))


def onnx_ops(path: Path) -> list[tuple[str, str]]:
    import onnx

    return [(n.op_type, n.input[0]) for n in onnx.load(str(path)).graph.node]


def test_the_strict_scenario_serves_the_ink_model_under_a_realistic_budget() -> None:
    strict = ONNX.scenarios["slow-compute-strict"]
    assert strict.quality_budget == 0.5 and strict.lever == N.LEVER_COMPILE_RUNTIME
    s = settings_for("slow-compute-strict", scenarios=ONNX.scenarios)
    assert (s.onnx_model, s.model_name, s.ort_optimization) == ("digits-ink-mlp", "digits-ink-mlp", "disable")
    assert settings_for("slow-compute", scenarios=ONNX.scenarios).onnx_model == "digits-mlp"  # INT8 free there


def _backend(**overrides: object) -> OnnxBackend:
    s = settings_for("slow-compute", scenarios=ONNX.scenarios, overrides={"heavy_items": 64, **overrides})
    b = OnnxBackend(s)
    b._load_sync()
    return b


def test_the_backend_measures_its_variants_and_exports_them(artifacts: M.Artifacts) -> None:
    b = _backend()
    rep = b.variant_report()
    assert rep is not None and set(rep.accuracy) == {N.VARIANT_SERVING, N.LEVER_QUANTIZE}
    acc = artifacts.manifest["eval_accuracy"]
    assert rep.accuracy == {N.VARIANT_SERVING: acc["fp32"], N.LEVER_QUANTIZE: acc["int8"]}
    assert set(rep.batch_seconds[N.VARIANT_SERVING]) >= {1, 64} and all(
        v > 0 for d in rep.batch_seconds.values() for v in d.values()
    )
    reg = CollectorRegistry()
    reg.register(VariantCollector(b))
    text = generate_latest(reg).decode()
    for name in (N.METRIC_MODEL_EVAL_ACCURACY, N.METRIC_MODEL_EVAL_SAMPLES, N.METRIC_MODEL_VARIANT_BATCH):
        assert f"# TYPE {name} gauge" in text
    assert f'{N.METRIC_MODEL_VARIANT_BATCH}{{model="digits-mlp",rows="64",variant="quantize"}}' in text
    # graph optimizations off: compile-runtime's variant is measured too; quantize served: no quantize variant
    assert set(_backend(ort_optimization="disable").variant_report().batch_seconds) == {  # type: ignore[union-attr]
        N.VARIANT_SERVING, N.LEVER_QUANTIZE, N.LEVER_COMPILE_RUNTIME}  # fmt: skip
    assert set(_backend(quantize=True).variant_report().accuracy) == {N.VARIANT_SERVING}  # type: ignore[union-attr]


def test_a_batch_is_the_models_real_answer(artifacts: M.Artifacts) -> None:
    import asyncio

    import onnxruntime as ort

    b = _backend()
    items = [PredictItem(np.zeros(32, np.float32), units, 10, seed) for units, seed in ((1, 5), (64, 77), (3, 123))]
    out = asyncio.run(b.run_batch(items))
    x, _ = artifacts.eval_set()
    ref = ort.InferenceSession(str(artifacts.fp32), providers=["CPUExecutionProvider"])
    for it, got in zip(items, out, strict=True):
        first = x[[it.seed % len(x)]]
        want = ref.run(None, {M.INPUT_NAME: first})[0][0]
        assert got.shape == (10,) and np.allclose(got, np.round(want, 4), atol=2e-4)
        assert abs(got.sum() - 1.0) < 1e-2  # class probabilities


def test_bad_engine_settings_are_one_line() -> None:
    for args, text in (
        (["serve", "--backend", "onnx", "--scenario", "cold-start"], "unknown scenario 'cold-start' for engine onnx"),
        (["serve", "--backend", "onnx", "--set", "ort_optimization=fastest"], "setting ort_optimization must be"),
        (["demo", "--engine", "onnx", "--scenario", "saturated-nope"], "unknown scenario 'saturated-nope'"),
    ):
        proc = subprocess.run([*CLI, *args, "--port", "0"] if args[0] == "serve" else [*CLI, *args],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and text in proc.stderr, proc.stderr


def _demo(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "demo", "--engine", "onnx", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=900)  # fmt: skip


@pytest.mark.slow
def test_slow_compute_is_found_on_the_real_model_and_int8_applied(tmp_path: Path, artifacts: M.Artifacts) -> None:
    out = tmp_path / "sc"
    proc = _demo(out, "--scenario", "slow-compute", "--apply-lever", "--duration", "15")
    print(proc.stdout, proc.stderr[-1500:])
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["breached"] and report["verdict"] == {"stage": N.STAGE_COMPUTE, "lever": N.LEVER_QUANTIZE}
    lever = next(lv for lv in report["levers"] if lv["lever"] == N.LEVER_QUANTIZE)
    assert lever["acceptable"] is True and "that the service measured" in lever["rationale"]
    check = json.loads((out / "lever_check.json").read_text())
    acc = artifacts.manifest["eval_accuracy"]
    assert (check["accuracy_before"], check["accuracy_after"]) == pytest.approx((acc["fp32"], acc["int8"]), abs=1e-6)
    assert check["p99_after_ms"] < check["p99_before_ms"] and check["predicted_p99_ms"] is not None
    assert "Model accuracy on its held-out eval set: before" in proc.stdout


@pytest.mark.slow
def test_int8_over_a_tight_quality_budget_is_not_acceptable(tmp_path: Path, ink: M.Artifacts) -> None:
    """slow-compute-strict serves digits-ink-mlp, which INT8 costs some 30 points (a raw-unit input under a
    per-tensor activation scale), under a 0.5-point budget: quantize is not acceptable and the lever
    recommended, and checked, is compile-runtime."""
    acc = ink.manifest["eval_accuracy"]
    drop = round((acc["fp32"] - acc["int8"]) * 100, 4)
    out = tmp_path / "strict"
    proc = _demo(out, "--scenario", "slow-compute-strict", "--duration", "10", "--apply-lever")
    print(proc.stdout, proc.stderr[-1500:])
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["breached"] and report["slo"]["quality_budget"] == 0.5
    q = next(lv for lv in report["levers"] if lv["lever"] == N.LEVER_QUANTIZE)
    assert q["quality"]["drop_points"] == pytest.approx(drop, abs=1e-3) and drop > 10
    assert q["predicted_p99_ms"] is not None  # fast enough, but not acceptable
    assert q["acceptable"] is False and q["rationale"].startswith("not acceptable")
    assert report["verdict"] == {"stage": N.STAGE_COMPUTE, "lever": N.LEVER_COMPILE_RUNTIME}
    cr = next(lv for lv in report["levers"] if lv["lever"] == N.LEVER_COMPILE_RUNTIME)
    assert "that the service measured" in cr["rationale"]
    assert "Lever quantize not acceptable" in proc.stdout
    check = json.loads((out / "lever_check.json").read_text())  # the lever run kept FP32 and its accuracy
    assert check["lever"] == N.LEVER_COMPILE_RUNTIME and check["lever_settings"] == {"ort_optimization": "all"}
    assert (check["accuracy_before"], check["accuracy_after"]) == pytest.approx((acc["fp32"], acc["fp32"]), abs=1e-6)
