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


def recipe_hash() -> str:
    """16 hex digits of SHA-256 over the recipe and the library versions that shape the files."""
    doc = json.dumps({"recipe": RECIPE, "versions": _versions()}, sort_keys=True)
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
        """The held-out eval images (float32, N x 64) and their labels (int64)."""
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
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", N_FEATURES])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", N_CLASSES])], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="stagescope")
    model.doc_string = "stagescope digits MLP, trained on this machine; see manifest.json for the recipe"
    return model


def accuracy(path: Path, x: np.ndarray, y: np.ndarray) -> float:
    """Share of ``x`` that the model at ``path`` classifies as ``y`` (one thread, default optimizations)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    pred = sess.run([OUTPUT_NAME], {INPUT_NAME: x})[0].argmax(axis=1)
    return float((pred == y).mean())


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _build(folder: Path, key: str) -> None:
    """Train, export, quantize and write the manifest into ``folder`` (a fresh temporary folder)."""
    import logging

    import threadpoolctl
    from onnx import save
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    t0 = time.monotonic()
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    split = RECIPE["split"]
    x_tr, x_ev, y_tr, y_ev = train_test_split(
        x, y, test_size=split["eval_share"], random_state=split["seed"], stratify=y
    )
    x_tr, y_tr = _augment(x_tr, y_tr)
    m = RECIPE["model"]
    clf = MLPClassifier(
        hidden_layer_sizes=tuple(m["hidden_layer_sizes"]), activation=m["activation"], max_iter=m["max_iter"],
        batch_size=m["batch_size"], random_state=m["seed"],
    )  # fmt: skip
    import warnings

    with threadpoolctl.threadpool_limits(m["blas_threads"]), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: max_iter is the recipe's, on purpose
        clf.fit(x_tr, y_tr)
    trained_s = time.monotonic() - t0
    save(_graph(list(clf.coefs_), list(clf.intercepts_)), str(folder / "fp32.onnx"))
    logging.getLogger("root").setLevel(logging.ERROR)  # quantize_dynamic's "consider pre-processing" hint
    quantize_dynamic(str(folder / "fp32.onnx"), str(folder / "int8.onnx"), weight_type=QuantType.QInt8)
    np.savez_compressed(folder / "eval.npz", x=x_ev, y=y_ev.astype(np.int64))
    manifest = {
        "what": "stagescope's ONNX Runtime engine model: a digits classifier trained on this machine",
        "hash": key,
        "recipe": RECIPE,
        "versions": _versions(),
        "built_unix_s": round(time.time(), 3),
        "train_seconds": round(trained_s, 1),
        "train_images": len(y_tr),
        "train_accuracy_sklearn": round(float(clf.score(x_tr, y_tr)), 6),
        "eval_images": len(y_ev),
        "eval_accuracy": {"fp32": accuracy(folder / "fp32.onnx", x_ev, y_ev),
                          "int8": accuracy(folder / "int8.onnx", x_ev, y_ev)},
        "files": {
            "fp32.onnx": "the trained weights as an ONNX graph (onnx.helper), float32",
            "int8.onnx": "fp32.onnx after onnxruntime.quantization.quantize_dynamic (INT8 weights)",
            "eval.npz": "held-out eval images (x, float32 N x 64) and labels (y), never trained on",
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


def ensure_artifacts(root: Path | None = None) -> Artifacts:
    """The cached model for the current recipe, built first when absent or damaged (minutes).

    Processes starting at once wait for one build (a lock file); the folder appears whole or not at
    all (built in a temporary folder, then renamed)."""
    from stagescope.extras import require

    require("onnx", "the onnx engine")
    base = (root or cache_root()) / RECIPE["name"]
    key = recipe_hash()
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
                _build(tmp, key)
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
