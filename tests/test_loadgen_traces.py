"""Load generator: schedules, real trace files, request bodies, and bad input (no network)."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import ks_2samp

from stagescope.errors import UserError
from stagescope.loadgen import build_schedule, read_trace, synthetic_schedule
from stagescope.loadgen.bodies import BodyFactory, input_hash, synthetic_prompt

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "external" / "llm_traces"
AZURE_CONV = TRACES / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
AZURE_CODE = TRACES / "azure2023" / "AzureLLMInferenceTrace_code.csv"
MOONCAKE = TRACES / "mooncake" / "conversation_trace.jsonl"


def test_real_traces_match_their_provenance() -> None:
    # counts and spans as documented in external/PROVENANCE.md
    conv = read_trace(AZURE_CONV)
    assert len(conv) == 19366 and conv.duration_s == pytest.approx(3502, abs=1)
    assert conv.prompt_tokens is not None and conv.output_tokens is not None
    assert (conv.prompt_tokens[:3].tolist(), conv.output_tokens[:3].tolist()) == (
        [374, 396, 879],
        [44, 109, 55],
    )
    code = read_trace(AZURE_CODE)
    assert len(code) == 8819 and code.duration_s == pytest.approx(3436, abs=1)
    moon = read_trace(MOONCAKE)
    assert len(moon) == 12031 and moon.duration_s == pytest.approx(3536.999)
    assert moon.hash_ids is not None and list(moon.hash_ids[0]) == list(range(14))
    for s in (conv, code, moon):
        assert s.offsets_s[0] == 0.0 and bool(np.all(np.diff(s.offsets_s) >= 0))


def _independent_gaps(path: Path) -> np.ndarray:
    """Inter-arrival gaps (s) parsed another way (strptime, microsecond precision)."""
    stamps = []
    for line in path.read_text().splitlines()[1:]:
        ts = line.split(",")[0]
        stamps.append(datetime.strptime(ts[:26], "%Y-%m-%d %H:%M:%S.%f").timestamp())
    return np.diff(np.sort(np.asarray(stamps)))


def test_azure_conversation_replay_at_speedup_10_keeps_interarrival_distribution() -> None:
    schedule = build_schedule(trace=AZURE_CONV, speedup=10)
    assert len(schedule) == 19366
    assert schedule.rate_rps == pytest.approx(19366 / 350.2, rel=1e-3)
    gaps = np.diff(schedule.offsets_s)
    reference = _independent_gaps(AZURE_CONV) / 10.0
    assert ks_2samp(gaps, reference).statistic <= 0.05
    # the statistic does discriminate: the trace at its real pace is far from the /10 reference
    assert ks_2samp(np.diff(read_trace(AZURE_CONV).offsets_s), reference).statistic > 0.3


def test_azure_2024_variant_mixed_fractions_and_utc_offset(tmp_path: Path) -> None:
    f = tmp_path / "azure2024.csv"
    f.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:00.009930+00:00,100,10\n"
        "2024-05-10 00:00:01+00:00,200,20\n"
        "2024-05-10 00:00:01.5+00:00,300,30\n"
        "2024-05-10 02:00:02.250000+02:00,400,40"  # 00:00:02.25 UTC, no trailing newline
    )
    s = read_trace(f)
    assert s.offsets_s.tolist() == pytest.approx([0.0, 0.99007, 1.49007, 2.24007])
    assert s.prompt_tokens is not None and s.prompt_tokens.tolist() == [100, 200, 300, 400]


def test_offsets_csv_with_and_without_header(tmp_path: Path) -> None:
    plain = tmp_path / "plain.csv"
    plain.write_text("0.5\n0\n1.25\n")
    s = read_trace(plain)
    assert s.offsets_s.tolist() == [0.0, 0.5, 1.25] and s.prompt_tokens is None
    headed = tmp_path / "headed.csv"
    headed.write_text("offset_s,prompt_tokens,output_tokens\n0,10,5\n2.0,20,6\n")
    h = read_trace(headed)
    assert h.offsets_s.tolist() == [0.0, 2.0]
    assert h.prompt_tokens is not None and h.prompt_tokens.tolist() == [10, 20]


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("empty.csv", "", "empty.csv: empty trace file"),
        ("blank.jsonl", "\n\n", "blank.jsonl: empty trace file"),
        ("header_only.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
        (
            "bad_row.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396\n",
            "bad_row.csv:3: expected 3 fields",
        ),
        (
            "bad_count.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,x,44\n",
            "bad_count.csv:2: ContextTokens is not an integer",
        ),
        (
            "bad_time.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n",
            "bad_time.csv:2: bad TIMESTAMP",
        ),
        ("layout.csv", "when,tokens\n1,2\n", "layout.csv:1: unknown column layout"),
        (
            "bad.jsonl",
            '{"timestamp": 0, "input_length": 1, "output_length": 2}\n{"timestamp": 5,\n',
            "bad.jsonl:2: not JSON",
        ),
        ("missing.jsonl", '{"timestamp": 0, "input_length": 1}\n', "missing.jsonl:1: missing output_length"),
        ("neg.csv", "0\n-1\n", "neg.csv:2: offset must be"),
    ],
)
def test_bad_traces_name_file_and_line(tmp_path: Path, name: str, content: str, expected: str) -> None:
    f = tmp_path / name
    f.write_text(content)
    with pytest.raises(UserError) as err:
        read_trace(f)
    assert expected in str(err.value)
    assert str(tmp_path) in str(err.value)


def test_cli_bad_trace_is_one_line_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "bad.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "stagescope.cli",
            "load",
            "--url",
            "http://127.0.0.1:9",
            "--trace",
            str(f),
            "--out",
            str(tmp_path / "r.parquet"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{f}:2:" in lines[0] and "Traceback" not in proc.stderr


def test_synthetic_schedules_rate_and_burstiness() -> None:
    for arrival, cv in (("poisson", 1.0), ("gamma:3", 3.0), ("constant", 0.0)):
        s = synthetic_schedule(500.0, 40.0, arrival, seed=3)
        gaps = np.diff(s.offsets_s)
        assert len(s) / 40.0 == pytest.approx(500.0, rel=0.1 if cv > 1 else 0.03)
        assert float(gaps.std() / gaps.mean()) == pytest.approx(cv, abs=0.1 * max(cv, 1.0))
    with pytest.raises(UserError, match="unknown --arrival"):
        synthetic_schedule(1.0, 1.0, "weibull")
    with pytest.raises(UserError, match="gamma:CV"):
        synthetic_schedule(1.0, 1.0, "gamma:-1")


def test_trace_scaled_to_rate_and_cut_to_duration() -> None:
    s = build_schedule(trace=AZURE_CONV, rate=50.0, duration_s=10.0)
    assert s.duration_s == 10.0 and s.offsets_s[-1] < 10.0
    assert len(s) / 10.0 == pytest.approx(50.0, rel=0.35)  # bursty real arrivals over 10 s
    assert s.target_rate_rps == 50.0
    with pytest.raises(UserError, match="not both"):
        build_schedule(trace=AZURE_CONV, rate=5.0, speedup=2.0)


def test_mooncake_shared_hash_ids_give_shared_prompt_prefixes() -> None:
    s = read_trace(MOONCAKE)
    assert s.hash_ids is not None and s.prompt_tokens is not None
    # requests 0 and 1 share block 0 only; request 5 shares 0..13 with request 0 (real trace rows)
    a = synthetic_prompt(int(s.prompt_tokens[0]), hash_ids=s.hash_ids[0])
    b = synthetic_prompt(int(s.prompt_tokens[1]), hash_ids=s.hash_ids[1])
    assert len(a.split()) == int(s.prompt_tokens[0])
    words_a, words_b = a.split(), b.split()
    common = next(i for i, (x, y) in enumerate(zip(words_a, words_b, strict=False)) if x != y)
    assert 512 <= common < 1024  # exactly the first 512-token block is shared
    # one real conversation (rows 285 and 412 start with blocks 0, 7402, 7403, ...): the prompts share
    # exactly the words of their common leading blocks, and differ in the next block
    i, j = 285, 412
    hi, hj = list(s.hash_ids[i]), list(s.hash_ids[j])
    k = next(n for n, (x, y) in enumerate(zip(hi, hj, strict=False)) if x != y)
    assert k >= 3
    wi = synthetic_prompt(int(s.prompt_tokens[i]), hash_ids=hi).split()
    wj = synthetic_prompt(int(s.prompt_tokens[j]), hash_ids=hj).split()
    assert wi[: k * 512] == wj[: k * 512] and wi[k * 512 : (k + 1) * 512] != wj[k * 512 : (k + 1) * 512]
    # requests without block ids never share text
    f = BodyFactory("/v1/generate", prompt_tokens=[600, 600])
    assert f(0).body[:2000] != f(1).body[:2000]


def test_generate_and_predict_bodies() -> None:
    import orjson

    g = BodyFactory("/v1/generate", prompt_tokens=[7], output_tokens=[3])(0)
    body = orjson.loads(g.body)
    assert body["max_tokens"] == 3 and body["stream"] is True and len(body["prompt"].split()) == 7
    assert g.input_hash == input_hash(body["prompt"])  # the hash the service puts on its span
    f = BodyFactory("/v1/predict", repeat_share=0.5, seed=1)
    hashes = [f(i).input_hash for i in range(2000)]
    repeated = sum(1 for i, h in enumerate(hashes) if h in set(hashes[:i]))
    assert repeated / len(hashes) == pytest.approx(0.5, abs=0.05)
    one = f(0)
    p = orjson.loads(one.body)
    assert len(p["inputs"]) == 16 and all(isinstance(x, float) for x in p["inputs"])
    assert one.input_hash == input_hash(orjson.dumps(p["inputs"]))  # the service's hash of its inputs
    none = BodyFactory("/v1/predict", repeat_share=0.0)
    assert len({none(i).input_hash for i in range(500)}) == 500
