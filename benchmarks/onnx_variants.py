"""The onnx engine's model variants side by side: batch time and eval-set accuracy, with ratios.

Variants of the digits MLP (``stagescope.service.onnx_model``, built or found in the cache):
FP32 with ONNX Runtime's graph optimizations off and at ``all`` (the ``compile-runtime`` lever),
dynamic INT8 (``quantize``, what the service serves) and static INT8 (QDQ, activations calibrated on
the training images with MinMax), the alternative the issue asked to measure. For each batch size
it prints the median wall and CPU milliseconds of ``--repeat`` interleaved batches on one thread
(``intra_op_num_threads=1``, as the service runs) and each variant's ratio to FP32 at ``all``.

    .venv/bin/python benchmarks/onnx_variants.py [--rows 1,16,256,5000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,16,256,5000", help="batch sizes (rows), comma-separated")
    ap.add_argument("--repeat", type=int, default=7, help="batches per variant and size (median shown)")
    args = ap.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]

    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from stagescope.service.onnx_model import INPUT_NAME, OUTPUT_NAME, RECIPE, ensure_artifacts

    art = ensure_artifacts()
    x_ev, y_ev = art.eval_set()
    x, y = load_digits(return_X_y=True)
    x_tr, _, _, _ = train_test_split(
        (x / 16.0).astype(np.float32), y, test_size=RECIPE["split"]["eval_share"],
        random_state=RECIPE["split"]["seed"], stratify=y,
    )  # fmt: skip

    class Calib(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter([{INPUT_NAME: x_tr[i : i + 64]} for i in range(0, len(x_tr), 64)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    tmp = Path(tempfile.mkdtemp(prefix="stagescope-onnx-bench-"))
    static = tmp / "int8-static.onnx"
    quantize_static(str(art.fp32), str(static), Calib(), quant_format=QuantFormat.QDQ,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)  # fmt: skip

    def session(path: Path, level: str) -> ort.InferenceSession:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    variants = {
        "fp32, optimizations off": session(art.fp32, "ORT_DISABLE_ALL"),
        "fp32, all (compile-runtime)": session(art.fp32, "ORT_ENABLE_ALL"),
        "int8 dynamic (quantize)": session(art.int8, "ORT_ENABLE_ALL"),
        "int8 static QDQ": session(static, "ORT_ENABLE_ALL"),
    }
    ref = "fp32, all (compile-runtime)"
    print(f"model {art.folder}; load average {os.getloadavg()[0]:.1f}; {args.repeat} batches each, median")
    print(f"{'variant':30}{'eval accuracy':>15}")
    for name, sess in variants.items():
        acc = float((sess.run([OUTPUT_NAME], {INPUT_NAME: x_ev})[0].argmax(1) == y_ev).mean())
        print(f"{name:30}{acc:>14.2%}")
    rng = np.random.default_rng(0)
    print(f"\n{'rows':>6} {'variant':30}{'wall ms':>10}{'cpu ms':>10}{'cpu ratio':>11}{'wall ratio':>11}")
    for rows in rows_list:
        batch = x_ev[rng.integers(0, len(x_ev), rows)]
        wall: dict[str, list[float]] = {n: [] for n in variants}
        cpu: dict[str, list[float]] = {n: [] for n in variants}
        for sess in variants.values():
            sess.run([OUTPUT_NAME], {INPUT_NAME: batch})
        for _ in range(args.repeat):
            for name, sess in variants.items():
                t0, c0 = time.perf_counter(), time.process_time()
                sess.run([OUTPUT_NAME], {INPUT_NAME: batch})
                wall[name].append((time.perf_counter() - t0) * 1000)
                cpu[name].append((time.process_time() - c0) * 1000)
        w = {n: float(np.median(v)) for n, v in wall.items()}
        c = {n: float(np.median(v)) for n, v in cpu.items()}
        for name in variants:
            print(f"{rows:>6} {name:30}{w[name]:>10.2f}{c[name]:>10.2f}{c[name] / c[ref]:>11.2f}{w[name] / w[ref]:>11.2f}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
