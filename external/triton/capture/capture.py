"""Capture real Triton Inference Server traces and metrics (run by hand; not part of the package).

Runs the ``tritonserver`` binary that the ``nvidia-pytriton`` wheel ships (0.7.0: Triton 2.51.0) on the
CPU, with the Python-backend models of ``models/`` (their compute is SIMULATED: they sleep; queueing,
scheduling, the frontends, the tracer and the metrics are Triton's own), and records:

* ``incident``: a queue-bound incident on ``sleep_8ms`` (one instance, 8 ms per request, about 110
  requests/s of capacity): open-loop arrivals from stagescope's load generator, 60/s for 10 s,
  150/s for 8 s, 60/s for 12 s; every 4th request traced (``--trace-config rate=4``); the metrics
  endpoint scraped before and after (``--metrics-config histogram_latencies=true``);
* ``models``: a few requests each to an ensemble, a BLS model calling another with the request's
  trace, a model behind the response cache (repeated inputs), the same over gRPC, and a decoupled
  model streaming 5 responses (gRPC stream); every request traced;

once with ``--trace-config triton,file=...`` (the trace file) and once with ``--trace-config
mode=opentelemetry`` to a local OTLP/HTTP receiver. The receiver stands in for the collector: it
writes each export request it gets as one line of OTLP/JSON, as the collector's ``file`` exporter
does (the JSON body unchanged when Triton sends JSON; a protobuf body converted field by field, with
ids as lowercase hex and 64-bit integers as decimal strings, the OTLP/JSON encoding).

    python -m venv /tmp/pytriton-venv && /tmp/pytriton-venv/bin/pip install nvidia-pytriton==0.7.0 \\
        opentelemetry-proto
    /tmp/pytriton-venv/bin/python external/triton/capture/capture.py --out /tmp/triton-capture \\
        --stagescope .venv/bin/stagescope
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent
BODY = {"inputs": [{"name": "INPUT0", "shape": [16], "datatype": "FP32", "data": list(range(16))}]}


def triton_dir() -> Path:
    import pytriton

    return Path(pytriton.__file__).parent / "tritonserver"


def prepare(work: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the server with the stub for this Python, the model repository, the environment."""
    src = triton_dir()
    dst = work / "tritonserver"
    if not dst.exists():
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("python_backend_stubs"))
        stub = src / "python_backend_stubs" / f"{sys.version_info[0]}.{sys.version_info[1]}" / "triton_python_backend_stub"
        shutil.copy(stub, dst / "backends" / "python" / "triton_python_backend_stub")
    repo = work / "models"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(HERE / "models", repo)
    (repo / "ensemble_pipeline" / "1").mkdir(exist_ok=True)
    env = dict(os.environ)
    libs = src.parent.parent / "nvidia_pytriton.libs"
    env["LD_LIBRARY_PATH"] = f"{libs}:{env.get('LD_LIBRARY_PATH', '')}"
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # the Python backend finds numpy here
    return repo, env


def _hexify(obj: object) -> object:
    """protobuf JSON -> OTLP/JSON: the id fields from base64 to lowercase hex."""
    if isinstance(obj, dict):
        return {k: (base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") and v else _hexify(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_hexify(x) for x in obj]
    return obj


class Receiver(BaseHTTPRequestHandler):
    out: Path
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if "json" in self.headers.get("Content-Type", ""):
            line = json.dumps(json.loads(body), separators=(",", ":"))
        else:
            from google.protobuf.json_format import MessageToDict
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

            msg = ExportTraceServiceRequest()
            msg.ParseFromString(body)
            line = json.dumps(_hexify(MessageToDict(msg, use_integers_for_enums=True)), separators=(",", ":"))
        with self.lock, open(self.out, "a") as f:
            f.write(line + "\n")
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def start_server(work: Path, repo: Path, env: dict[str, str], trace_args: list[str], log: Path) -> subprocess.Popen[bytes]:
    exe = work / "tritonserver" / "bin" / "tritonserver"
    cmd = [str(exe), f"--model-repository={repo}", f"--backend-directory={work / 'tritonserver' / 'backends'}",
           f"--cache-directory={work / 'tritonserver' / 'caches'}", "--cache-config=local,size=1048576",
           "--http-port=18000", "--grpc-port=18001", "--metrics-port=18002",
           "--metrics-config=histogram_latencies=true", "--allow-gpu-metrics=false", *trace_args]
    proc = subprocess.Popen(cmd, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    for _ in range(120):
        try:
            if urllib.request.urlopen("http://127.0.0.1:18000/v2/health/ready", timeout=1).status == 200:
                return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"tritonserver did not get ready; see {log}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)  # a graceful stop writes the trace file and closes its array
    proc.wait(timeout=60)


def scrape(path: Path) -> None:
    path.write_bytes(urllib.request.urlopen("http://127.0.0.1:18002/metrics", timeout=5).read())


def incident_load(stagescope: str, work: Path, tag: str) -> None:
    schedule = work / "incident_offsets.csv"
    if not schedule.exists():
        import random

        rng, t, rows = random.Random(16), 0.0, []
        while t < 30.0:
            t += rng.expovariate(150.0 if 10.0 <= t < 18.0 else 60.0)
            rows.append(f"{t:.6f}")
        schedule.write_text("\n".join(rows) + "\n")
    body = work / "body.json"
    body.write_text(json.dumps(BODY))
    subprocess.run([stagescope, "load", "--url", "http://127.0.0.1:18000/v2/models/sleep_8ms/infer",
                    "--trace", str(schedule), "--body", str(body), "--out", str(work / f"{tag}_results.parquet"),
                    "--no-progress"], check=True)


def model_requests() -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    x = np.arange(16, dtype=np.float32)
    with httpclient.InferenceServerClient("127.0.0.1:18000") as c:
        for model in ("ensemble_pipeline", "bls_caller", "cached_5ms"):
            for i in range(6):
                inp = httpclient.InferInput("INPUT0", [16], "FP32")
                inp.set_data_from_numpy(x + (i % 2 if model == "cached_5ms" else i))
                c.infer(model, [inp])
    g = grpcclient.InferenceServerClient("127.0.0.1:18001")
    for i in range(4):
        inp = grpcclient.InferInput("INPUT0", [16], "FP32")
        inp.set_data_from_numpy(x + i)
        g.infer("sleep_8ms", [inp])
    done = threading.Event()
    got: list[object] = []

    def callback(result: object, error: object) -> None:
        got.append(result if error is None else error)
        if len(got) >= 15:
            done.set()

    g.start_stream(callback=callback)
    for i in range(3):
        inp = grpcclient.InferInput("INPUT0", [16], "FP32")
        inp.set_data_from_numpy(x + i)
        g.async_stream_infer("decoupled_stream", [inp], request_id=f"stream-{i}")
    done.wait(30)
    g.stop_stream()
    g.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--stagescope", required=True, help="the stagescope executable (load generator)")
    args = ap.parse_args()
    work = args.out
    work.mkdir(parents=True, exist_ok=True)
    repo, env = prepare(work)
    common = ["--trace-config=level=TIMESTAMPS"]
    for mode in ("file", "otel"):
        for part in ("incident", "models"):
            rate = "4" if part == "incident" else "1"
            if mode == "file":
                trace = [f"--trace-config=triton,file={work / f'trace_{part}.json'}", f"--trace-config=rate={rate}"]
                httpd = None
            else:
                Receiver.out = work / f"otel_{part}.jsonl"
                Receiver.out.unlink(missing_ok=True)
                httpd = ThreadingHTTPServer(("127.0.0.1", 4318), Receiver)
                threading.Thread(target=httpd.serve_forever, daemon=True).start()
                trace = ["--trace-config=mode=opentelemetry", f"--trace-config=rate={rate}",
                         "--trace-config=opentelemetry,url=http://127.0.0.1:4318/v1/traces",
                         "--trace-config=opentelemetry,bsp_schedule_delay=500"]
            proc = start_server(work, repo, env, common + trace, work / f"server_{mode}_{part}.log")
            try:
                scrape(work / f"{mode}_{part}_metrics_before.prom")
                if part == "incident":
                    incident_load(args.stagescope, work, f"{mode}_{part}")
                else:
                    model_requests()
                time.sleep(1.5)
                scrape(work / f"{mode}_{part}_metrics_after.prom")
            finally:
                stop_server(proc)
                if httpd is not None:
                    time.sleep(1.0)
                    httpd.shutdown()
                    httpd.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
