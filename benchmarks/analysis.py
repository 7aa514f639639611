"""Benchmark: breach analysis at scale (issue 6).

Builds a SYNTHETIC incident of ``--requests`` requests (default 1,000,000) with 8 stage spans each
(about 8 million stage rows; a slow feature store on 6 % of requests, with two parallel feature reads
per request so the critical-path code runs) and writes the pinned ``requests`` and ``stages``
relations as Parquet, with the integer keys the ingest adds (``trace_key``, ``request_key``,
``input_key``: see analysis.keys; ``--no-keys`` leaves them out, as in relations built by hand;
``--routes N`` spreads the requests over N routes, each checked on its own) and the sampling
probability the ingest reads from each span's ``th`` (every trace kept: ``sampling_p`` 1). Then,
each in a fresh subprocess so peak memory is the analysis's own:

* **time to a verdict from Parquet**: ``analyze()`` over DuckDB views on the Parquet files (goal
  <= 3 s here), printed beside DuckDB's plain ``GROUP BY stage`` over the same stage file, and their
  ratio (goal <= 10x), and beside a ``GROUP BY trace_key`` (``trace_id`` with ``--no-keys``: the key
  the verdict joins stage rows to their requests on).
  Each of the three runs ``--repeat`` times, interleaved, each run on a fresh connection in one warm
  process; the medians are compared;
* **peak memory** (the verdict process's own high-water RSS, ``VmHWM``; goal <= 2 GB);
* **OTLP/JSON ingest rate**: ``load_dataset`` (the ingest part) over OTLP/JSON lines of
  ``--otlp-requests`` requests written by ``stagescope.analysis.synth`` (goal >= 200,000 spans/s).

The machine is shared, so figures vary from run to run; compare ratios.

    .venv/bin/python benchmarks/analysis.py [--requests 1000000] [--otlp-requests 25000] [--repeat 3] [--no-keys] [--routes 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

T0_NS = 1_764_460_800 * 10**9

_GEN_SQL = """
CREATE TABLE r AS
WITH u AS (
    SELECT i, random() AS u0, random() AS u1, random() AS u2, random() AS u3, random() AS u4, random() AS u5,
           random() AS u6, random() AS u7, random() AS u8, random() AS u9, random() AS u10, random() AS u11
    FROM range({n}) t(i)
), z AS (
    SELECT *, sqrt(-2 * ln(greatest(u0, 1e-12))) * cos(2 * pi() * u1) AS z1,
              sqrt(-2 * ln(greatest(u2, 1e-12))) * cos(2 * pi() * u3) AS z2,
              sqrt(-2 * ln(greatest(u4, 1e-12))) * cos(2 * pi() * u5) AS z3
    FROM u
)
SELECT i, md5(i::VARCHAR) AS trace_id, md5_number_lower(md5(i::VARCHAR)) AS trace_key,
       md5_number_lower(md5(i::VARCHAR) || substr(md5(i::VARCHAR), 1, 16)) AS request_key, {t0} + i * {step_ns} AS s0,
       4 * exp(0.3 * z1) + CASE WHEN u6 < 0.06 THEN 350 + 350 * u7 ELSE 0 END AS ff,
       0.3 + 0.7 * u8 AS ff2_share, 3 * exp(0.3 * z2) AS pre, 5 * u9 AS bw,
       -2 * ln(greatest(u10, 1e-12)) AS q, 20 * exp(0.15 * z3) AS comp, 1.0 + u11 AS post, 1.0 + u11 / 2 AS eg,
       CAST(8 + floor(u9 * 9) AS BIGINT) AS batch, CAST(floor(-3 * ln(greatest(u10, 1e-12))) AS BIGINT) AS qd,
       md5((i % 400000)::VARCHAR) AS h, md5_number_lower(md5((i % 400000)::VARCHAR)) AS input_key
FROM z;
COPY (
    SELECT trace_id, substr(trace_id, 1, 16) AS span_id, 'synthetic-service' AS service, 'POST /v1/predict' AS name,
           {route_sql} AS route, 'ranker' AS model, 200 AS status_code, false AS is_error, s0 AS start_unix_ns,
           ff + pre + bw + q + comp + post + eg + 0.3 AS duration_ms, NULL::DOUBLE AS ttft_ms,
           NULL::DOUBLE AS itl_mean_ms, NULL::DOUBLE AS itl_p99_ms, NULL::DOUBLE AS itl_max_ms,
           NULL::BIGINT AS input_tokens, NULL::BIGINT AS output_tokens, batch AS batch_size, qd AS queue_depth,
           h AS input_hash, false AS cold_start, ff + pre + bw + q + comp + post + eg + 1.8 AS client_duration_ms,
           'stagescope' AS source, 'baseline' AS sampled_reason, 1.0::DOUBLE AS sampling_p{req_keys}
    FROM r
) TO '{out}/requests.parquet' (FORMAT parquet, ROW_GROUP_SIZE 262144);
COPY (
    WITH b AS (
        SELECT trace_id, trace_key, request_key, s0, ff, ff2_share, pre, bw, q, comp, post, eg,
               ff AS c1, ff + pre AS c2, ff + pre + bw AS c3, ff + pre + bw + q AS c4,
               ff + pre + bw + q + comp AS c5, ff + pre + bw + q + comp + post AS c6
        FROM r
    ), x AS (
        SELECT trace_id, trace_key, request_key, s0,
               unnest(['feature_fetch', 'feature_fetch', 'preprocess', 'batch_wait', 'queue', 'compute',
                       'postprocess', 'egress']) AS stage,
               unnest(['fetch', 'fetch', 'cpu', 'batch_wait', 'queue', 'compute', 'cpu', 'egress']) AS kind,
               unnest([0, 0, c1, c2, c3, c4, c5, c6]) AS a_ms,
               unnest([ff, ff * ff2_share, c2, c3, c4, c5, c6, c6 + eg]) AS b_ms
        FROM b
    )
    SELECT trace_id, stage, s0 + CAST(a_ms * 1e6 AS BIGINT) AS start_unix_ns, s0 + CAST(b_ms * 1e6 AS BIGINT) AS end_unix_ns,
           b_ms - a_ms AS duration_ms{st_keys}
    FROM x
) TO '{out}/stages.parquet' (FORMAT parquet, ROW_GROUP_SIZE 262144);
"""

_PEAK = r"""
def peak_mb():  # VmHWM: this process's own high-water RSS (ru_maxrss would include the forking parent)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")
"""

_VERDICT_CHILD = (
    _PEAK
    + r"""
import json, statistics, sys, time
import duckdb
from stagescope.analysis.api import analyze
out, reps, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def fresh():
    con = duckdb.connect()
    con.execute("SET memory_limit = '1500MB'")
    return con

def plain():
    con = fresh()
    con.execute(f"SELECT stage, count(*), avg(duration_ms) FROM read_parquet('{out}/stages.parquet') GROUP BY stage").fetchall()
    con.close()

def by_trace():
    con = fresh()
    con.execute(f"SELECT count(*) FROM (SELECT {key}, sum(duration_ms) FROM read_parquet('{out}/stages.parquet') GROUP BY {key})").fetchall()
    con.close()

def verdict():
    con = fresh()
    for rel in ("requests", "stages"):
        con.execute(f"CREATE VIEW {rel} AS SELECT * FROM read_parquet('{out}/{rel}.parquet')")
    con.execute("CREATE TABLE token_gaps (trace_id VARCHAR, gap_ms DOUBLE)")
    con.execute("CREATE TABLE metric_samples (metric VARCHAR, labels MAP(VARCHAR, VARCHAR), value DOUBLE, ts_ms BIGINT, source VARCHAR)")
    rep = analyze(con, "p99<300ms")
    con.close()
    return rep

duckdb.connect().execute("SELECT 1").fetchall()  # load the library before any timing
times = {"plain": [], "by_trace": [], "verdict": []}
for _ in range(reps):  # interleaved, each on a fresh connection, so drift hits all three alike
    for name, fn in (("plain", plain), ("by_trace", by_trace), ("verdict", verdict)):
        t = time.perf_counter()
        got = fn()
        times[name].append(time.perf_counter() - t)
        if got is not None:
            rep = got
med = {k: statistics.median(v) for k, v in times.items()}
print(json.dumps({"plain_groupby_s": med["plain"], "by_trace_groupby_s": med["by_trace"], "verdict_s": med["verdict"],
                  "runs": times, "verdict": rep["verdict"],
                  "p99_ms": rep["latency_ms"]["p99"], "predicted_p99_ms": rep["levers"][0]["predicted_p99_ms"],
                  "requests": rep["requests"], "max_rss_mb": peak_mb()}))
"""
)

_INGEST_CHILD = (
    _PEAK
    + r"""
import json, sys, time
from stagescope.analysis.ingest import load_dataset
path, spans = sys.argv[1], int(sys.argv[2])
t = time.perf_counter()
ds = load_dataset(traces=[path])
n = ds.con.execute("SELECT count(*) FROM requests").fetchone()[0]
dt = time.perf_counter() - t
print(json.dumps({"ingest_s": dt, "spans": spans, "requests": n, "spans_per_s": spans / dt,
                  "max_rss_mb": peak_mb()}))
"""
)


def build(out: Path, n: int, keys: bool = True, routes: int = 1) -> dict[str, Any]:
    import duckdb

    t = time.perf_counter()
    con = duckdb.connect()
    con.execute("SELECT setseed(0.42)")
    step_ns = max(1, int(3600e9 / n))  # the incident spans one hour
    # with keys: the relations as the ingest writes them now (stage rows also carry their kind)
    req_keys, st_keys = (", trace_key, input_key, request_key", ", trace_key, request_key, kind") if keys else ("", "")
    # one route, or ``routes`` of them taking requests in turn (each with the same slow feature store)
    route_sql = "'/v1/predict'" if routes <= 1 else f"'/v1/r' || (i % {int(routes)})"
    con.execute(
        _GEN_SQL.format(
            n=n, t0=T0_NS, step_ns=step_ns, out=out, req_keys=req_keys, st_keys=st_keys, route_sql=route_sql
        )
    )
    rows = con.execute(f"SELECT count(*) FROM read_parquet('{out}/stages.parquet')").fetchone()
    con.close()
    return {"build_s": time.perf_counter() - t, "stage_rows": int(rows[0]) if rows else 0}


def write_otlp(out: Path, n: int) -> tuple[Path, int]:
    from stagescope.analysis import synth_scenarios as S

    data = S.generate("slow-feature-store", n, seed=1, duration_s=max(60.0, n / 50))
    path = out / "spans.jsonl"
    return path, S.write_otlp(data, path)


def _child(code: str, *args: str) -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{res.stderr[-2000:]}")
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--otlp-requests", type=int, default=25_000)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each query (median reported)")
    ap.add_argument("--no-keys", action="store_true", help="write the relations without the integer keys")
    ap.add_argument(
        "--routes", type=int, default=1, help="spread the requests over this many routes (each checked on its own)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stagescope-bench-") as tmp:
        out = Path(tmp)
        built = build(out, args.requests, keys=not args.no_keys, routes=args.routes)
        verdict = _child(_VERDICT_CHILD, str(out), str(args.repeat), "trace_id" if args.no_keys else "trace_key")
        path, spans = write_otlp(out, args.otlp_requests)
        ingest = _child(_INGEST_CHILD, str(path), str(spans))
    res = {"requests": args.requests, "routes": args.routes, **built, **verdict, "ingest": ingest}
    res["verdict_vs_groupby"] = verdict["verdict_s"] / verdict["plain_groupby_s"]
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"synthetic incident: {args.requests:,} requests, {built['stage_rows']:,} stage rows "
          f"(built in {built['build_s']:.1f} s; {'no integer keys' if args.no_keys else 'with the integer keys the ingest writes'}"
          f"{f'; {args.routes} routes, each checked on its own' if args.routes > 1 else ''})")  # fmt: skip
    print(f"verdict from Parquet      {verdict['verdict_s']:6.2f} s   (goal <= 3 s)   verdict {verdict['verdict']}, "
          f"p99 {verdict['p99_ms']:.0f} ms -> predicted {verdict['predicted_p99_ms']:.0f} ms")  # fmt: skip
    print(f"DuckDB plain GROUP BY     {verdict['plain_groupby_s']:6.2f} s   "
          f"ratio {res['verdict_vs_groupby']:.1f}x (goal <= 10x)")  # fmt: skip
    print(f"DuckDB GROUP BY {'trace_id ' if args.no_keys else 'trace_key'} {verdict['by_trace_groupby_s']:6.2f} s   "
          f"ratio {verdict['verdict_s'] / verdict['by_trace_groupby_s']:.1f}x (the key the verdict joins stage rows to requests on)")  # fmt: skip
    print(f"peak memory (verdict)     {verdict['max_rss_mb']:6.0f} MB  (goal <= 2048 MB)")
    print(f"OTLP/JSON ingest          {ingest['spans_per_s']:8,.0f} spans/s ({ingest['spans']:,} spans in "
          f"{ingest['ingest_s']:.2f} s; goal >= 200,000/s), peak {ingest['max_rss_mb']:.0f} MB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
