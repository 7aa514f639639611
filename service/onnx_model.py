"""The ONNX Runtime engine's model: a real classifier trained here, exported, quantized, cached.

What it is: a multilayer perceptron (64 inputs, three hidden layers of 1,024 ReLU units, 10 outputs,
softmax) trained with scikit-learn's ``MLPClassifier`` on the **8x8 handwritten digits that ship
inside scikit-learn** (``sklearn.datasets.load_digits``: 1,797 images, no download). A stratified
quarter of the images (450, with their labels) is held out before training: that is the **eval
set**, never trained on. The training images are augmented with their one-pixel shifts in four
directions (6,735 images). The accuracy the service reports is that model's real accuracy on the
eval set.

Artifacts, all produced on this machine (nothing is downloaded): ``fp32.onnx`` (an ONNX graph built
with ``onnx.helper`` from the trained weights: MatMul, Add, Relu, Softmax), ``int8.onnx``
(``onnxruntime.quantization.quantize_dynamic``: INT8 weights, activations quantized per batch at run
time), ``eval.npz`` (eval images and labels) and ``manifest.json`` (the recipe, the library versions,
the hash, accuracies, file digests: how each file was made). They live under
``$STAGESCOPE_CACHE_DIR`` (default ``~/.cache/stagescope``) in ``onnx-digits-mlp/<hash>/``, the hash
of the recipe and of the scikit-learn, onnx and onnxruntime versions: a second service start reuses
them, a changed recipe or library builds anew. Training is deterministic (fixed seeds, one BLAS
thread); building takes one to three minutes on one core.

A second model, ``digits-ink-mlp`` (:data:`INK_RECIPE`, its own cache folder
``onnx-digits-ink-mlp/<hash>/`` and manifest), is the one INT8 hurts, by a mechanism rather than by
luck: it takes a 65th input, the image's **total ink** (the sum of its 64 raw pixel values, 0-16
each: 185-433 on these images) in raw units beside the 64 pixels in [0, 1], as a tabular model fed
one unnormalised count does. It is trained on the ink standardised and the standardisation is folded
into its first layer, so FP32 computes exactly the trained model on raw inputs. Dynamic INT8 quantizes
each MatMul's input with ONE scale per tensor from its range (ONNX ``DynamicQuantizeLinear``:
``scale = (max(0, max x) - min(0, min x)) / 255``): the ink column's ~400 makes the step ~1.6, so
every pixel below ~0.8 reads as 0 and the rest as 1.6, whatever the machine or library version
(21.6-29.6 points lost over 8 training seeds; the same network without the ink input loses none).
Building it takes 20-40 s on one core.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stagescope.errors import UserError
from stagescope.paths import cache_root

__all__ = [
    "DEFAULT_MODEL",
    "INK_RECIPE",
    "MODELS",
    "RECIPE",
    "Artifacts",
    "cache_root",
    "ensure_artifacts",
    "missing_packages",
    "recipe_hash",
]

#: How the model is made. Any change here (or in the library versions) builds a new cache entry.
RECIPE: dict[str, Any] = {
    "name": "onnx-digits-mlp",
    "recipe_version": 1,
    "dataset": "sklearn.datasets.load_digits (1,797 8x8 images bundled with scikit-learn), pixels / 16",
    "split": {"eval_share": 0.25, "stratified": True, "seed": 0},
    "augment": "training images also shifted by one pixel right, left, down and up (zero fill); eval images not",
    "model": {
        "trainer": "sklearn.neural_network.MLPClassifier (adam)",
        "hidden_layer_sizes": [1024, 1024, 1024],
        "activation": "relu",
        "max_iter": 12,
        "batch_size": 64,
        "seed": 0,
        "blas_threads": 1,
    },
    "export": "onnx.helper graph from the trained weights: (MatMul, Add, Relu) x3, MatMul, Add, Softmax; opset 17",
    "quantize": "onnxruntime.quantization.quantize_dynamic(weight_type=QInt8, per_channel=False)",
}
#: The model INT8 hurts by a mechanism (module docstring): the digits plus their total ink in raw units.
INK_RECIPE: dict[str, Any] = {
    "name": "onnx-digits-ink-mlp",
    "recipe_version": 1,
    "dataset": RECIPE["dataset"],
    "inputs": "65: the 64 pixels / 16 (0-1) and the image's total ink, the sum of its 64 raw pixel values "
              "(0-16 each), in raw units (185-433 on these images)",
    "split": RECIPE["split"],
    "augment": RECIPE["augment"] + "; a shifted image's ink is its own (pixels shifted out are lost)",
    "model": {
        "trainer": "sklearn.neural_network.MLPClassifier (adam), the ink standardised by the training set's "
                   "mean and standard deviation",
        "hidden_layer_sizes": [512, 512, 512],
        "activation": "relu",
        "max_iter": 12,
        "batch_size": 64,
        "seed": 0,
        "blas_threads": 1,
    },
    "export": "onnx.helper graph as digits-mlp's, the ink standardisation folded into the first layer "
              "(its ink row / std, its bias - mean / std * that row): the graph takes the ink in raw units",
    "quantize": RECIPE["quantize"],
    "why_int8_hurts": (
        "quantize_dynamic quantizes each MatMul's input at run time with one uint8 scale per tensor from its "
        "range (ONNX DynamicQuantizeLinear: scale = (max(0, max x) - min(0, min x)) / 255); the first MatMul's "
        "input holds the raw ink (up to ~430), so its step is ~1.6 and every pixel in [0, 1] is rounded to 0 or "
        "one step: the image is lost to a coarse threshold, whatever the machine or the library version; the "
        "weights are per-tensor too (per_channel=False), and the ink's row (divided by its std) falls to a step or two"
    ),
}  # fmt: skip
#: The models by their ``onnx_model`` setting (settings.ONNX_MODELS lists the same names).
MODELS: dict[str, dict[str, Any]] = {"digits-mlp": RECIPE, "digits-ink-mlp": INK_RECIPE}
DEFAULT_MODEL = "digits-mlp"
_SHIFTS = ((1, 0), (-1, 0), (0, 1), (0, -1))
INPUT_NAME = "x"
OUTPUT_NAME = "probs"
N_FEATURES = 64
N_CLASSES = 10


def missing_packages() -> list[str]:
    """The distributions of the ``onnx`` extra that are not importable here (empty when all are)."""
    from stagescope.extras import missing

    return missing("onnx")


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import sklearn

    return {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__, "scikit-learn": sklearn.__version__}


def _recipe(model: str) -> dict[str, Any]:
    try:
        return MODELS[model]
    except KeyError:
        raise UserError(f"unknown onnx model {model!r}; known: {', '.join(MODELS)}") from None


def recipe_hash(model: str = DEFAULT_MODEL) -> str:
    """16 hex digits of SHA-256 over the model's recipe and the library versions that shape the files."""
    doc = json.dumps({"recipe": _recipe(model), "versions": _versions()}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Artifacts:
    """Paths of one built model and its manifest (read from ``manifest.json``)."""

    folder: Path
    manifest: dict[str, Any]

    @property
    def fp32(self) -> Path:
        return self.folder / "fp32.onnx"

    @property
    def int8(self) -> Path:
        return self.folder / "int8.onnx"

    def eval_set(self) -> tuple[np.ndarray, np.ndarray]:
        """The held-out eval images (float32, N x the model's inputs) and their labels (int64)."""
        with np.load(self.folder / "eval.npz") as z:
            return z["x"].astype(np.float32), z["y"].astype(np.int64)


def _shift(images: np.ndarray, dx: int, dy: int) -> np.ndarray:
    img = images.reshape(-1, 8, 8)
    out = np.zeros_like(img)
    out[:, max(dy, 0) : 8 + min(dy, 0), max(dx, 0) : 8 + min(dx, 0)] = img[
        :, max(-dy, 0) : 8 + min(-dy, 0), max(-dx, 0) : 8 + min(-dx, 0)
    ]
    return out.reshape(-1, N_FEATURES)


def _augment(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([x, *(_shift(x, dx, dy) for dx, dy in _SHIFTS)]), np.tile(y, 1 + len(_SHIFTS))


def _features(raw: np.ndarray, recipe: dict[str, Any]) -> np.ndarray:
    """The model's inputs from raw 0-16 pixels: pixels / 16, and for the ink model their raw sum too."""
    x = raw / 16.0
    if recipe["name"] == INK_RECIPE["name"]:
        x = np.concatenate([x, raw.sum(axis=1, keepdims=True)], axis=1)
    return x.astype(np.float32)


def _graph(coefs: list[np.ndarray], intercepts: list[np.ndarray]) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, x = [], [], INPUT_NAME
    last = len(coefs) - 1
    for i, (w, b) in enumerate(zip(coefs, intercepts, strict=True)):
        inits += [numpy_helper.from_array(w.astype(np.float32), f"W{i}"),
                  numpy_helper.from_array(b.astype(np.float32), f"b{i}")]  # fmt: skip
        nodes += [helper.make_node("MatMul", [x, f"W{i}"], [f"mm{i}"]),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"z{i}"])]  # fmt: skip
        x = f"z{i}"
        if i < last:
            nodes.append(helper.make_node("Relu", [x], [f"h{i}"]))
            x = f"h{i}"
    nodes.append(helper.make_node("Softmax", [x], [OUTPUT_NAME], axis=1))
    graph = helper.make_graph(
        nodes, "digits_mlp",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", coefs[0].shape[0]])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", N_CLASSES])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="stagescope")
    model.doc_string = "stagescope digits MLP, trained on this machine; see manifest.json for the recipe"
    return model


def accuracy(path: Path, x: np.ndarray, y: np.ndarray, batch: int | None = None) -> float:
    """Share of ``x`` that the model at ``path`` classifies as ``y`` (one thread, default optimizations),
    in one run (``batch`` None) or in runs of ``batch`` rows."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    step = batch or len(x)
    pred = np.concatenate([sess.run([OUTPUT_NAME], {INPUT_NAME: x[i : i + step]})[0].argmax(axis=1)
                           for i in range(0, len(x), step)])  # fmt: skip
    return float((pred == y).mean())


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _build(folder: Path, key: str, recipe: dict[str, Any]) -> None:
    """Train, export, quantize and write the manifest into ``folder`` (a fresh temporary folder)."""
    import logging

    import threadpoolctl
    from onnx import save
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    t0 = time.monotonic()
    raw, y = load_digits(return_X_y=True)
    split = recipe["split"]
    raw_tr, raw_ev, y_tr, y_ev = train_test_split(
        raw, y, test_size=split["eval_share"], random_state=split["seed"], stratify=y
    )
    raw_tr, y_tr = _augment(raw_tr, y_tr)  # shifted in raw units: the ink feature is the shifted image's own
    x_tr, x_ev = _features(raw_tr, recipe), _features(raw_ev, recipe)
    fit_x, ink = x_tr, None
    if x_tr.shape[1] > N_FEATURES:  # the trainer sees the ink standardised; the export folds it back
        ink = (float(x_tr[:, N_FEATURES].mean()), float(x_tr[:, N_FEATURES].std()))
        fit_x = x_tr.copy()
        fit_x[:, N_FEATURES] = (fit_x[:, N_FEATURES] - ink[0]) / ink[1]
    m = recipe["model"]
    clf = MLPClassifier(
        hidden_layer_sizes=tuple(m["hidden_layer_sizes"]), activation=m["activation"], max_iter=m["max_iter"],
        batch_size=m["batch_size"], random_state=m["seed"],
    )  # fmt: skip
    import warnings

    with threadpoolctl.threadpool_limits(m["blas_threads"]), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: max_iter is the recipe's, on purpose
        clf.fit(fit_x, y_tr)
    trained_s = time.monotonic() - t0
    coefs, intercepts = [c.copy() for c in clf.coefs_], [b.copy() for b in clf.intercepts_]
    if ink is not None:  # W.(v - mean)/std + b == (W/std).v + (b - mean/std W): the graph takes raw ink
        row = coefs[0][N_FEATURES].copy()
        coefs[0][N_FEATURES] = row / ink[1]
        intercepts[0] = intercepts[0] - ink[0] / ink[1] * row
    save(_graph(coefs, intercepts), str(folder / "fp32.onnx"))
    logging.getLogger("root").setLevel(logging.ERROR)  # quantize_dynamic's "consider pre-processing" hint
    quantize_dynamic(str(folder / "fp32.onnx"), str(folder / "int8.onnx"), weight_type=QuantType.QInt8)
    np.savez_compressed(folder / "eval.npz", x=x_ev, y=y_ev.astype(np.int64))
    manifest = {
        "what": "stagescope's ONNX Runtime engine model: a digits classifier trained on this machine",
        "model": next(n for n, r in MODELS.items() if r is recipe),
        "hash": key,
        "recipe": recipe,
        "versions": _versions(),
        "built_unix_s": round(time.time(), 3),
        "train_seconds": round(trained_s, 1),
        "train_images": len(y_tr),
        "train_accuracy_sklearn": round(float(clf.score(fit_x, y_tr)), 6),
        **({"ink_standardisation": {"mean": ink[0], "std": ink[1]}} if ink is not None else {}),
        "inputs": int(x_ev.shape[1]),
        "eval_images": len(y_ev),
        "eval_accuracy": {"fp32": accuracy(folder / "fp32.onnx", x_ev, y_ev),
                          "int8": accuracy(folder / "int8.onnx", x_ev, y_ev)},
        # dynamic INT8's activation scale comes from the whole batch: one image per run is another figure
        "eval_accuracy_one_image_per_run": {"fp32": accuracy(folder / "fp32.onnx", x_ev, y_ev, batch=1),
                                            "int8": accuracy(folder / "int8.onnx", x_ev, y_ev, batch=1)},
        "files": {
            "fp32.onnx": "the trained weights as an ONNX graph (onnx.helper), float32",
            "int8.onnx": "fp32.onnx after onnxruntime.quantization.quantize_dynamic (INT8 weights)",
            "eval.npz": f"held-out eval images (x, float32 N x {x_ev.shape[1]}, the graph's inputs) and labels (y), "
                        "never trained on",
        },
        "sha256": {n: _sha256(folder / n) for n in ("fp32.onnx", "int8.onnx", "eval.npz")},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _load(folder: Path) -> Artifacts | None:
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for name, digest in manifest.get("sha256", {}).items():
        p = folder / name
        if not p.exists() or _sha256(p) != digest:
            return None
    return Artifacts(folder, manifest)


def ensure_artifacts(root: Path | None = None, model: str = DEFAULT_MODEL) -> Artifacts:
    """The cached ``model`` (:data:`MODELS`) for its current recipe, built first when absent or damaged.

    Processes starting at once wait for one build (a lock file); the folder appears whole or not at
    all (built in a temporary folder, then renamed)."""
    from stagescope.extras import require

    require("onnx", "the onnx engine")
    recipe = _recipe(model)
    base = (root or cache_root()) / recipe["name"]
    key = recipe_hash(model)
    folder = base / key
    got = _load(folder)
    if got is not None:
        return got
    try:
        with _locked(base / ".lock"):
            got = _load(folder)
            if got is not None:
                return got
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=base))
            try:
                _build(tmp, key, recipe)
                if folder.exists():
                    shutil.rmtree(folder)
                tmp.rename(folder)
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:
        raise UserError(f"cannot write the onnx model cache under {base}: {exc.strerror or exc}") from None
    got = _load(folder)
    if got is None:
        raise UserError(f"{folder}: the model just built does not match its manifest")
    return got
