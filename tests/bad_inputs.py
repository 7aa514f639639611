"""The bad-input table: every row is one thing a user may get wrong, and what stagescope must answer.

Read by ``tests/test_bad_inputs.py``. Kinds of rows:

* :class:`Cli`: a command line (after ``stagescope``). Expected: exit status ``exit`` and no traceback;
  for bad input (2) exactly one line on stderr matching ``match`` (a regex); for no data (3) the
  report on stdout matches ``match`` (its first line says why) and stderr holds no error line. Placeholders in
  ``argv``: ``{tmp}`` (a fresh folder holding ``files``), ``{traces}`` (a valid OTLP/JSON spans file of
  800 requests), ``{dead}`` (``http://127.0.0.1:<a port nobody listens on>``). ``env`` is added to the
  environment. ``real=True`` rows also run through the installed ``stagescope`` executable.
* :class:`Http`: one request to a running ``stagescope serve``. Expected: the status (4xx; 200 for the
  inputs the W3C spec says to ignore, such as a malformed ``traceparent``) and a body matching ``match``;
  at the end the server's log holds no traceback and no 5xx.
* :class:`Starts`: a command that must *keep running* despite an input it cannot use (the design says
  so), with exactly one warning line matching ``warning``; ``probes`` are requests and their statuses.

A new option gets a row here: ``test_every_option_has_a_row`` fails otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["CLI_ROWS", "EXEMPT_OPTIONS", "HTTP_ROWS", "STARTS_ROWS", "Cli", "Http", "Starts", "slo_yaml"]


@dataclass(frozen=True)
class Cli:
    id: str
    argv: tuple[str, ...]
    match: str
    exit: int = 2
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    real: bool = False


@dataclass(frozen=True)
class Http:
    id: str
    method: str
    path: str
    status: int
    match: str
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})
    raw: bytes | None = None  # sent as-is on a socket instead (malformed framing; the answer may be text)
    half_close: bool = False  # then the client stops sending (shutdown SHUT_WR): status 0 = no answer


@dataclass(frozen=True)
class Starts:
    id: str
    argv: tuple[str, ...]
    warning: str | None  # exactly one stderr line matches it (None: not counted, see the row)
    probes: tuple[tuple[str, str, int], ...]  # (method, path, expected status)
    env: Mapping[str, str] = field(default_factory=dict)


_SLO_BASE = {
    "name": "predict-latency",
    "service": "inference",
    "sli": "e2e",
    "route": "/v1/predict",
    "threshold_ms": "300",
    "objective": "0.99",
    "window": "30d",
}


def slo_yaml(**over: str | None) -> str:
    """A one-SLO file; each keyword replaces a field's raw YAML text (``None`` drops the field)."""
    item = {**_SLO_BASE, **over}
    lines = [f"    {k}: {v}" for k, v in item.items() if v is not None]
    return "slos:\n  -\n" + "\n".join(lines) + "\n"


_ALIAS_BOMB = (
    "a: &a ['lol','lol','lol','lol','lol','lol','lol','lol','lol']\n"
    + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    + "slos:\n  - {name: *i, service: inference, sli: e2e, threshold_ms: 300, objective: 0.99}\n"
)
_BINARY = bytes(range(256)) * 4
_NESTED = "slos: " + "[" * 5000 + "]" * 5000 + "\n"

# SLO files that both `analyze --slo FILE` and `alerts build --slo FILE` must refuse: (id, text, match).
_SLO_FILES: list[tuple[str, str | bytes, str]] = [
    ("threshold-nan", slo_yaml(threshold_ms=".nan"), r"threshold_ms must be a finite number > 0, got nan"),
    ("threshold-NaN", slo_yaml(threshold_ms=".NaN"), r"threshold_ms must be a finite number"),
    ("threshold-inf", slo_yaml(threshold_ms=".inf"), r"threshold_ms must be a finite number"),
    ("threshold-neg-inf", slo_yaml(threshold_ms="-.inf"), r"threshold_ms must be a finite number"),
    ("threshold-true", slo_yaml(threshold_ms="true"), r"threshold_ms must be a finite number > 0, got True"),
    ("threshold-yes", slo_yaml(threshold_ms="yes"), r"threshold_ms must be a finite number > 0, got True"),
    ("threshold-zero", slo_yaml(threshold_ms="0"), r"threshold_ms must be a finite number > 0, got 0"),
    ("threshold-negative", slo_yaml(threshold_ms="-300"), r"threshold_ms must be a finite number > 0"),
    ("threshold-text", slo_yaml(threshold_ms="300ms"), r"threshold_ms must be a finite number > 0, got '300ms'"),
    ("threshold-list", slo_yaml(threshold_ms="[300]"), r"threshold_ms must be a finite number > 0, got \[300\]"),
    ("threshold-null", slo_yaml(threshold_ms="null"), r"threshold_ms must be a finite number > 0, got None"),
    ("threshold-huge", slo_yaml(threshold_ms="1" + "0" * 400), r"threshold_ms must be a finite number"),
    ("threshold-missing", slo_yaml(threshold_ms=None), r"missing 'threshold_ms'"),
    ("objective-one", slo_yaml(objective="1"), r"objective must be a finite number in \(0, 1\), got 1"),
    ("objective-zero", slo_yaml(objective="0.0"), r"objective must be a finite number in \(0, 1\)"),
    ("objective-percent", slo_yaml(objective="99"), r"objective must be a finite number in \(0, 1\), got 99"),
    ("objective-nan", slo_yaml(objective=".nan"), r"objective must be a finite number in \(0, 1\), got nan"),
    ("objective-true", slo_yaml(objective="true"), r"objective must be a finite number in \(0, 1\), got True"),
    ("objective-text", slo_yaml(objective="high"), r"objective must be a finite number in \(0, 1\), got 'high'"),
    ("window-0d", slo_yaml(window="0d"), r":9: slos\[0\] \(predict-latency\): window: bad duration '0d': must be > 0"),
    ("window-negative", slo_yaml(window="-1d"), r"bad duration '-1d'"),
    ("window-no-unit", slo_yaml(window="30"), r"window: bad duration 30; expected a number and a unit"),
    ("window-1m", slo_yaml(window="1m"), r"window must be at least 5m"),
    ("window-decades", slo_yaml(window="10000d"), r"window must be at most 366d"),
    ("window-huge", slo_yaml(window="1" + "0" * 400 + "d"), r"window: bad duration '1000.*must be > 0 and finite"),
    ("window-true", slo_yaml(window="true"), r"window must be a duration"),
    ("sli-unknown", slo_yaml(sli="tpot"), r"unknown SLI 'tpot'"),
    ("quality-budget-nan", slo_yaml(quality_budget=".nan"), r":10: slos\[0\] .*quality_budget \(accuracy points\) must be a finite number in \[0, 100\]"),
    ("quality-budget-true", slo_yaml(quality_budget="true"), r"quality_budget \(accuracy points\) must be a finite number in \[0, 100\], got True"),
    ("quality-budget-percent-sign", slo_yaml(quality_budget="0.5%"), r"quality_budget \(accuracy points\) must be a finite number"),
    ("price-zero", slo_yaml(accelerator_price_per_hour="0"), r":10: slos\[0\] .*accelerator_price_per_hour \(the price of one accelerator-hour\) must be a finite number > 0, got 0"),
    ("price-negative", slo_yaml(accelerator_price_per_hour="-2.5"), r"accelerator_price_per_hour \(the price of one accelerator-hour\) must be a finite number > 0, got -2.5"),
    ("price-nan", slo_yaml(accelerator_price_per_hour=".nan"), r"accelerator_price_per_hour \(the price of one accelerator-hour\) must be a finite number > 0, got nan"),
    ("price-inf", slo_yaml(accelerator_price_per_hour=".inf"), r"accelerator_price_per_hour \(the price of one accelerator-hour\) must be a finite number > 0"),
    ("price-true", slo_yaml(accelerator_price_per_hour="true"), r"accelerator_price_per_hour \(the price of one accelerator-hour\) must be a finite number > 0, got True"),
    ("price-currency", slo_yaml(accelerator_price_per_hour="'$2.50'"), r"accelerator_price_per_hour \(the price of one accelerator-hour\) must be a finite number > 0, got '\$2.50'"),
    ("autoscaler-metric-empty", slo_yaml(autoscaler_metric="''"), r":10: slos\[0\] .*autoscaler_metric must not be empty"),
    ("autoscaler-metric-list", slo_yaml(autoscaler_metric="[cpu, memory]"), r"autoscaler_metric must be text, got \['cpu', 'memory'\]"),
    ("autoscaler-metric-sentence", slo_yaml(autoscaler_metric="'cpu at 70%'"), r"autoscaler_metric must name one metric .*got 'cpu at 70%'"),
    ("name-list", slo_yaml(name="[a, b]"), r"name must be text"),
    ("name-empty", slo_yaml(name="''"), r"name must not be empty"),
    ("name-newline", slo_yaml(name='"a\\nb"'), r"name must not contain control characters"),
    ("service-quote-newline", slo_yaml(service='"infer\\nence"'), r"service must not contain control characters"),
    ("service-mapping", slo_yaml(service="{a: 1}"), r"service must be text"),
    ("route-list", slo_yaml(route="[/v1/predict]"), r"route must be text"),
    ("model-true", slo_yaml(model="true"), r"model must be text"),
    ("unknown-key", slo_yaml(threshold="300"), r"unknown key\(s\) threshold"),
    ("int-key", "slos:\n  - {1: 2, name: a, service: s, sli: e2e, threshold_ms: 300, objective: 0.99}\n",
     r"unknown key\(s\) 1"),
    ("duplicate-key", slo_yaml() + "    threshold_ms: 500\n", r":10: duplicate key 'threshold_ms' \(first at line 7\)"),
    ("duplicate-name", slo_yaml() + slo_yaml()[len("slos:\n"):], r"duplicate SLO name 'predict-latency'"),
    ("alias-bomb", _ALIAS_BOMB, r"YAML aliases expand to more than"),
    ("recursive-alias", "slos: &s\n  - *s\n", r"YAML aliases expand to more than|recursive"),
    ("deep-nesting", _NESTED, r"nested too deeply"),
    ("not-yaml", "slos: [\n", r":2: not valid YAML"),
    ("binary", _BINARY, r"not valid YAML|not UTF-8|cannot read"),
    ("empty-file", "", r"expected a mapping with a non-empty list 'slos:'"),
    ("slos-empty", "slos: []\n", r"expected a mapping with a non-empty list 'slos:'"),
    ("slos-mapping", "slos: {name: x}\n", r"expected a mapping with a non-empty list 'slos:'"),
    ("top-list", "- name: x\n", r"expected a mapping with a non-empty list 'slos:'"),
    ("item-scalar", "slos: [p99]\n", r"slos\[0\]: expected a mapping"),
    ("python-tag", "slos: !!python/object:os.system [ls]\n", r"not valid YAML"),
    ("timestamp-threshold", slo_yaml(threshold_ms="2001-12-14"), r"threshold_ms must be a finite number"),
    ("huge-file", "# " + "x" * (2 * 1024 * 1024) + "\n" + slo_yaml(), r"larger than 1 MiB"),
    # scalars YAML resolves but cannot build: a traceback from PyYAML's constructor before s11
    ("date-that-does-not-exist", slo_yaml(threshold_ms="2001-13-45"),
     r"slo.yaml:7: cannot read the value '2001-13-45' \(timestamp\): month must be in 1\.\.12"),
    ("int-tag-on-text", slo_yaml(threshold_ms="!!int abc"), r"slo.yaml:7: cannot read the value 'abc' \(int\)"),
    ("float-tag-on-text", slo_yaml(window="!!float soon"), r"slo.yaml:9: cannot read the value 'soon' \(float\)"),
    ("objective-5000-digits", slo_yaml(objective="1" + "0" * 5000),
     r"slo.yaml:8: cannot read the value '1000.*\.\.\.' \(int\): 5001 characters; a number has at most \d+ digits"),
]

_SPAN = (
    '{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"0123456789abcdef0123456789abcdef",'
    '"spanId":"0123456789abcdef","name":"GET /x","kind":2,"startTimeUnixNano":"%s","endTimeUnixNano":"%s"}]}]}]}\n'
)
# Trace files `analyze --traces` must refuse with file:line: (id, file name, content, match).
_TRACE_FILES: list[tuple[str, str, str | bytes, str]] = [
    ("json-list", "t.json", "[]\n", r"t.json:1: JSON of an unknown shape"),
    ("resource-spans-number", "t.json", '{"resourceSpans": 5}\n', r"t.json:1: no resourceSpans list"),
    ("bad-trace-id", "t.json", _SPAN.replace("0123456789abcdef0123456789abcdef", "zz") % ("1", "2"),
     r"t.json:1: traceId 'zz' is not 32 hex digits"),
    ("time-overflow", "t.json", _SPAN % ("9" * 23, "1"), r"t.json:1: startTimeUnixNano .* is not a plausible"),
    ("time-text", "t.json", _SPAN % ("soon", "later"), r"t.json:1: "),
    ("ends-before-start", "t.json", _SPAN % ("1700000000200000000", "1700000000100000000"),
     r"t.json:1: span 0123456789abcdef ends before it starts"),
    ("fake-gzip", "t.jsonl.gz", b"not gzip", r"t.jsonl.gz: named .gz but is not gzip data"),
    ("jaeger-no-spans", "t.json", '{"data":[{"traceID":5,"spans":"x"}]}\n', r"t.json:1: Jaeger trace without"),
    ("truncated-line", "t.jsonl", '{"resourceSpans":[{"scopeSpans":[\n', r"t.jsonl:\d: malformed JSON"),
    # a NUL byte on line 2 of JSON lines was "t.jsonl:1: not JSON (starts with b'{\"resourceSpans\"')" before s11
    ("nul-byte-on-line-2", "t.jsonl", (_SPAN % ("1700000000100000000", "1700000000200000000")).encode() + b'{"a\x00": 1}\n',
     r"t.jsonl:2: binary data \(a NUL byte at offset \d+\), not JSON text"),
    # past int64 (2**63): the hint was "looks like microseconds" before s11
    ("time-int64-overflow", "t.json", _SPAN % (str(2**63), str(2**63 + 5)),
     r"t.json:1: startTimeUnixNano 9223372036854775808 is not a plausible Unix-nanosecond time \(after 2099\)"),
    ("time-beyond-any-unit", "t.json", _SPAN % ("1" + "0" * 22, "1" + "0" * 22),
     r"t.json:1: startTimeUnixNano 1000+ is not a plausible Unix-nanosecond time \(too large for a time in any unit\)"),
    # Zipkin's timestamp is microseconds: nanoseconds there were called "microseconds" before s11
    ("zipkin-nanoseconds", "t.json",
     '[{"traceId": "aaaaaaaaaaaaaaaa", "id": "aaaaaaaaaaaaaaaa", "name": "x", "timestamp": 1764000000000000000, "duration": 1}]\n',
     r"t.json.*timestamp 1764000000000000000 is not plausible epoch microseconds \(looks like nanoseconds\)"),
    ("jaeger-nanoseconds", "t.json",
     '{"data": [{"traceID": "aaaaaaaaaaaaaaaa", "spans": [{"traceID": "aaaaaaaaaaaaaaaa", "spanID": "aaaaaaaaaaaaaaaa", '
     '"operationName": "x", "startTime": 1764000000000000000, "duration": 1, "processID": "p1"}], '
     '"processes": {"p1": {"serviceName": "s"}}}]}\n',
     r"t.json.*startTime 1764000000000000000 is not plausible Unix microseconds \(looks like nanoseconds\)"),
]

_ONE_LINE_SLOS: list[tuple[str, str, str]] = [
    ("empty-threshold", "p99<", r"bad SLO 'p99<'"),
    ("huge-threshold", "p99<" + "9" * 400 + "ms", r"threshold must be a finite number"),
    ("zero-threshold", "p99<0ms", r"threshold_ms must be a finite number > 0"),
    ("p100", "p100<300ms", r"percentile must be between 0 and 100"),
    ("p0", "p0<300ms", r"percentile must be between 0 and 100"),
    # the load generator's summary names the 99.9th 'p999': the error says how to write it
    ("p999", "p999<300ms", r"percentile must be between 0 and 100 \(the 99\.9th percentile is p99\.9\)"),
    ("no-unit", "p99<300", r"bad SLO 'p99<300'"),
    ("microseconds", "p99<300us", r"bad SLO 'p99<300us'"),
    ("unknown-sli", "tpot:p99<30ms", r"unknown SLI 'tpot'"),
    ("nan", "p99<nanms", r"bad SLO 'p99<nanms'"),
    ("missing-file", "{tmp}/nope.yaml", r"nope.yaml: SLO file not found"),
    ("directory", "{tmp}/", r"cannot read SLO file|bad SLO"),
    # '' and ' ' were read as the folder '.' ("cannot read SLO file: Is a directory") before s11
    ("empty", "", r"bad SLO '': expected e\.g\. 'p99<300ms'"),
    ("blank", " ", r"bad SLO ' ': expected e\.g\. 'p99<300ms'"),
    # longer than a file name may be: Path.exists() raised OSError (a traceback) before s11
    ("longer-than-a-file-name", "p" * 5000, r"bad SLO 'ppp+\.\.\.': expected"),
]

_ANALYZE = ("analyze", "--traces", "{traces}")
_EV_OK = '{"time": "2026-11-20T12:00:05Z", "kind": "deploy", "target": "ranker"}\n'
# Events files `analyze --events` must refuse, naming the file and the line: (id, content, match).
_EVENT_FILES: list[tuple[str, str | bytes, str]] = [
    ("bad-json", _EV_OK + '{"time": "2026-11-20T12:01:00Z", "kind": \n', r"ev.jsonl:2: not JSON"),
    ("not-object", "[1, 2]\n", r"ev.jsonl:1: expected a JSON object with 'time' and 'kind', got list"),
    ("unknown-kind", '{"time": "2026-11-20T12:00:05Z", "kind": "restart"}\n',
     r"ev.jsonl:1: unknown kind 'restart'; expected one of deploy, scale, model_swap, config"),
    ("missing-time", '{"kind": "scale"}\n', r"ev.jsonl:1: missing 'time'"),
    ("missing-kind", '{"time": 1763640005}\n', r"ev.jsonl:1: missing 'kind'"),
    ("time-no-zone", '{"time": "2026-11-20T12:00:05", "kind": "deploy"}\n', r"ev.jsonl:1: 'time' .* has no time zone"),
    ("time-garbage", '{"time": "yesterday", "kind": "deploy"}\n', r"ev.jsonl:1: 'time' 'yesterday' is not an RFC 3339 time"),
    ("time-millis", '{"time": 1763640005000, "kind": "deploy"}\n', r"ev.jsonl:1: 'time' 1763640005000 looks like milliseconds"),
    ("time-nan", '{"time": NaN, "kind": "deploy"}\n', r"ev.jsonl:1: 'time' nan is not a Unix time"),
    ("time-bool", '{"time": true, "kind": "deploy"}\n', r"ev.jsonl:1: 'time' must be an RFC 3339 time or Unix seconds"),
    ("end-before-time", '{"time": 1763640005, "end": 1763640000, "kind": "deploy"}\n', r"ev.jsonl:1: 'end' is before 'time'"),
    ("replicas-negative", '{"time": 1763640005, "kind": "scale", "replicas_to": -1}\n',
     r"ev.jsonl:1: 'replicas_to' must be a whole number of replicas"),
    ("target-number", '{"time": 1763640005, "kind": "scale", "target": 3}\n', r"ev.jsonl:1: 'target' must be a string"),
    ("binary", b"\xff\xfe\x00garbage", r"ev.jsonl: not UTF-8 text"),
]
_LOAD = ("load", "--url", "{dead}", "--out", "{tmp}/r.parquet")
_SYN = ("--rate", "10", "--duration", "1")
_ALERTS = ("alerts", "build", "--out", "{tmp}/rules")

CLI_ROWS: list[Cli] = [
    # -- the parser itself: one line, not argparse's usage block ----------------------------------------
    Cli("cli-unknown-command", ("frobnicate",), r"invalid choice: 'frobnicate'", real=True),
    Cli("cli-unknown-option", ("analyze", "--bogus"), r"unrecognized arguments|required"),
    Cli("analyze-missing-slo", ("analyze", "--traces", "{traces}"), r"required: --slo"),
    Cli("analyze-no-input", ("analyze", "--slo", "p99<300ms"), r"nothing to analyse: give --traces, --metrics"),
    Cli("analyze-format-choice", (*_ANALYZE, "--slo", "p99<300ms", "--format", "pdf"), r"invalid choice: 'pdf'"),
    # -- analyze --slo, one-line specs ------------------------------------------------------------------
    *[Cli(f"analyze-slo-{i}", (*_ANALYZE, "--slo", s), m, real=(i == "huge-threshold")) for i, s, m in _ONE_LINE_SLOS],
    # -- SLO files, read by analyze and alerts build alike ------------------------------------------------
    *[Cli(f"analyze-slofile-{i}", (*_ANALYZE, "--slo", "{tmp}/slo.yaml"), m, files={"slo.yaml": t},
          real=i in ("threshold-nan", "alias-bomb")) for i, t, m in _SLO_FILES],
    *[Cli(f"alerts-slofile-{i}", (*_ALERTS, "--slo", "{tmp}/slo.yaml"), m, files={"slo.yaml": t},
          real=(i == "window-0d")) for i, t, m in _SLO_FILES],
    # -- analyze, the other options ---------------------------------------------------------------------
    Cli("analyze-window-0", (*_ANALYZE, "--slo", "p99<300ms", "--window", "0s"), r"bad --window: .*must be > 0"),
    Cli("analyze-window-negative", (*_ANALYZE, "--slo", "p99<300ms", "--window=-1m"), r"bad --window"),
    Cli("analyze-window-sub-ms", (*_ANALYZE, "--slo", "p99<300ms", "--window", "0.0000001ms"),
        r"bad --window '0.0000001ms': must be from 1ms to 366d"),
    Cli("analyze-window-1000w", (*_ANALYZE, "--slo", "p99<300ms", "--window", "1000w"), r"must be from 1ms to 366d"),
    Cli("analyze-window-nan", (*_ANALYZE, "--slo", "p99<300ms", "--window", "nan"), r"bad --window"),
    Cli("analyze-window-huge", (*_ANALYZE, "--slo", "p99<300ms", "--window", "9" * 400 + "s"), r"bad --window: .*finite"),
    # -- analyze --events FILE (deploys, scale events, model swaps: analysis/events_file.py) ----------------
    Cli("analyze-events-missing", (*_ANALYZE, "--slo", "p99<300ms", "--events", "{tmp}/ev.jsonl"),
        r"argument --events: .*ev.jsonl: no such file"),
    Cli("analyze-events-directory", (*_ANALYZE, "--slo", "p99<300ms", "--events", "{tmp}"),
        r"argument --events: .*not a regular file"),
    *[Cli(f"analyze-events-{i}", (*_ANALYZE, "--slo", "p99<300ms", "--events", "{tmp}/ev.jsonl"), m,
          files={"ev.jsonl": text}) for i, text, m in _EVENT_FILES],
    Cli("analyze-traces-missing", ("analyze", "--traces", "{tmp}/nope.jsonl", "--slo", "p99<300ms"), r"nope.jsonl"),
    Cli("analyze-traces-binary", ("analyze", "--traces", "{tmp}/b.bin", "--slo", "p99<300ms"), r"b.bin",
        files={"b.bin": _BINARY}),
    *[Cli(f"analyze-traces-{i}", ("analyze", "--traces", "{tmp}/" + name, "--slo", "p99<300ms"), m,
          files={name: text}) for i, name, text, m in _TRACE_FILES],
    Cli("analyze-metrics-garbage", (*_ANALYZE, "--slo", "p99<300ms", "--metrics", "{tmp}/m.prom"),
        r"m.prom:1: malformed labels '\{ 1'", files={"m.prom": "foo{ 1\n"}),
    Cli("analyze-results-wrong-columns", (*_ANALYZE, "--slo", "p99<300ms", "--results", "{tmp}/r.parquet"),
        r"r.parquet: not a readable Parquet file", files={"r.parquet": b"PAR1garbage"}),
    Cli("analyze-traces-proc", ("analyze", "--traces", "/proc/nope", "--slo", "p99<300ms"), r"/proc/nope"),
    Cli("analyze-metrics-timestamp-overflow", (*_ANALYZE, "--slo", "p99<300ms", "--metrics", "{tmp}/m.prom"),
        r"m.prom:2: timestamp 99999999999999999999999 is not Unix milliseconds",
        files={"m.prom": "up 1 1763640005000\nup 1 99999999999999999999999\n"}),
    Cli("analyze-traces-name-too-long", ("analyze", "--traces", "{tmp}/" + "t" * 300, "--slo", "p99<300ms"),
        r"/ttt+: file name too long"),
    Cli("analyze-metrics-name-too-long", (*_ANALYZE, "--slo", "p99<300ms", "--metrics", "{tmp}/" + "m" * 300),
        r"/mmm+: file name too long"),
    Cli("analyze-results-name-too-long", (*_ANALYZE, "--slo", "p99<300ms", "--results", "{tmp}/" + "r" * 300),
        r"/rrr+: file name too long"),
    Cli("analyze-out-name-too-long", (*_ANALYZE, "--slo", "p99<300ms", "--out", "{tmp}/" + "o" * 300),
        r"/ooo+: cannot write the report: File name too long"),
    Cli("analyze-metrics-missing", (*_ANALYZE, "--slo", "p99<300ms", "--metrics", "{tmp}/m.prom"), r"m.prom"),
    Cli("analyze-metrics-binary", (*_ANALYZE, "--slo", "p99<300ms", "--metrics", "{tmp}/m.prom"), r"m.prom",
        files={"m.prom": _BINARY}),
    Cli("analyze-results-missing", (*_ANALYZE, "--slo", "p99<300ms", "--results", "{tmp}/r.parquet"), r"r.parquet"),
    Cli("analyze-results-not-parquet", (*_ANALYZE, "--slo", "p99<300ms", "--results", "{tmp}/r.parquet"),
        r"r.parquet", files={"r.parquet": "a,b\n1,2\n"}),
    Cli("analyze-prometheus-not-url", (*_ANALYZE, "--slo", "p99<300ms", "--prometheus", "localhost:9090"),
        r"argument --prometheus: URL 'localhost:9090' is not an http\(s\) URL"),
    Cli("analyze-prometheus-port", (*_ANALYZE, "--slo", "p99<300ms", "--prometheus", "http://127.0.0.1:99999"),
        r"argument --prometheus: .*(port|Port)"),
    Cli("analyze-prometheus-port-0", (*_ANALYZE, "--slo", "p99<300ms", "--prometheus", "http://127.0.0.1:0"),
        r"argument --prometheus: .*port must be from 1 to 65535, got 0"),
    Cli("analyze-prometheus-down", (*_ANALYZE, "--slo", "p99<300ms", "--prometheus", "{dead}"),
        r"--prometheus http://127\.0\.0\.1:\d+: cannot connect: Connection refused"),
    Cli("analyze-prometheus-down-checked-first", ("analyze", "--traces", "{tmp}/nope.jsonl", "--slo", "p99<300ms",
        "--prometheus", "{dead}"), r"--prometheus http://127\.0\.0\.1:\d+: cannot connect"),
    Cli("analyze-out-directory", (*_ANALYZE, "--slo", "p99<300ms", "--out", "{tmp}"), r"is a directory", real=True),
    Cli("analyze-out-newline-directory", (*_ANALYZE, "--slo", "p99<300ms", "--out", "{tmp}/a\nb"),
        r"a\\nb: is a directory", files={"a\nb/x": "x"}),
    Cli("analyze-out-no-folder", (*_ANALYZE, "--slo", "p99<300ms", "--out", "{tmp}/no/such/r.json"),
        r"output folder .* does not exist"),
    Cli("analyze-out-proc", (*_ANALYZE, "--slo", "p99<300ms", "--out", "/proc/nope.json"), r"/proc/nope.json"),
    Cli("analyze-out-file-parent", (*_ANALYZE, "--slo", "p99<300ms", "--out", "{tmp}/f/r.json"),
        r"f/r.json: output folder .* does not exist", files={"f": "x"}),
    Cli("analyze-skip-bad-missing", (*_ANALYZE, "{tmp}/nope.jsonl", "--skip-bad", "--slo", "p99<300ms",
        "--window", "0m"), r"bad --window"),
    Cli("analyze-route-empty", (*_ANALYZE, "--slo", "p99<300ms", "--route", ""), r"--route: empty route"),
    Cli("analyze-route-newline", (*_ANALYZE, "--slo", "p99<300ms", "--route", "/a\nb"),
        r"--route '/a\\nb': control characters"),
    Cli("analyze-route-not-in-slo-file", (*_ANALYZE, "--slo", "{tmp}/slo.yaml", "--route", "/v1/generate"),
        r"--route /v1/generate: no SLO in .*slo.yaml is for it", files={"slo.yaml": slo_yaml()}),
    # -- no data is never a verdict: exit 3, the reason in the report's first line (stdout) -------------
    Cli("analyze-nodata-empty-folder", ("analyze", "--traces", "{tmp}/spans", "--slo", "p99<300ms"),
        r"NO DATA -- 0 samples: no trace files read: .*spans holds no trace files", exit=3,
        files={"spans/notes.txt": "x"}, real=True),
    Cli("analyze-nodata-route", (*_ANALYZE, "--slo", "p99<300ms", "--route", "/nope"),
        r"NO DATA -- 0 samples: route /nope not in the data: routes seen are /v1/predict", exit=3),
    Cli("analyze-nodata-slo-file-route", (*_ANALYZE, "--slo", "{tmp}/slo.yaml"),
        r"NO DATA -- 0 samples: route /nope not in the data", exit=3, files={"slo.yaml": slo_yaml(route="/nope")}),
    Cli("analyze-nodata-ttft", (*_ANALYZE, "--slo", "ttft:p95<500ms"),
        r"NO DATA -- 0 samples: .* none with a TTFT", exit=3),
    Cli("analyze-nodata-itl", (*_ANALYZE, "--slo", "itl:p99<60ms"), r"NO DATA -- 0 samples", exit=3),
    Cli("analyze-nodata-json", ("analyze", "--traces", "{tmp}/spans", "--slo", "p99<300ms", "--format", "json"),
        r'"status": "no_data"', exit=3, files={"spans/notes.txt": "x"}),
    Cli("analyze-nodata-out-file", ("analyze", "--traces", "{tmp}/spans", "--slo", "p99<300ms", "--out",
        "{tmp}/r.txt"), r"\A\Z", exit=3, files={"spans/notes.txt": "x"}),
    # -- load ------------------------------------------------------------------------------------------
    Cli("load-no-schedule", _LOAD, r"give --rate R \(with --duration S\) or --trace PATH"),
    Cli("load-url-not-url", ("load", "--url", "localhost:8000", *_SYN, "--out", "{tmp}/r.parquet"),
        r"argument --url: URL 'localhost:8000' is not an http\(s\) URL"),
    Cli("load-url-port-99999", ("load", "--url", "http://127.0.0.1:99999", *_SYN, "--out", "{tmp}/r.parquet"),
        r"argument --url: .*(port|Port)", real=True),
    Cli("load-url-port-0", ("load", "--url", "http://127.0.0.1:0", *_SYN, "--out", "{tmp}/r.parquet"),
        r"argument --url: .*port must be from 1 to 65535"),
    Cli("load-url-port-text", ("load", "--url", "http://127.0.0.1:http", *_SYN, "--out", "{tmp}/r.parquet"),
        r"argument --url: .*(port|Port)"),
    Cli("load-url-ftp", ("load", "--url", "ftp://127.0.0.1/", *_SYN, "--out", "{tmp}/r.parquet"),
        r"not an http\(s\) URL"),
    Cli("load-url-no-host", ("load", "--url", "http://:8000", *_SYN, "--out", "{tmp}/r.parquet"), r"has no host"),
    Cli("load-url-bad-ipv6", ("load", "--url", "http://[::1", *_SYN, "--out", "{tmp}/r.parquet"),
        r"argument --url: .*not a valid URL"),
    Cli("load-url-space", ("load", "--url", "http://127.0.0.1:8000/a b", *_SYN, "--out", "{tmp}/r.parquet"),
        r"spaces or control characters"),
    Cli("load-url-refused", (*_LOAD, *_SYN), r"cannot connect"),
    Cli("load-out-name-too-long", ("load", "--url", "{dead}", *_SYN, "--out", "{tmp}/" + "o" * 300),
        r"/ooo+: cannot write results: File name too long"),
    # the reason alone, not Python's "[Errno 21] Is a directory: '<the path again>'" (before s11)
    Cli("load-trace-directory-reason", (*_LOAD, "--trace", "{tmp}"), r"cannot read trace: Is a directory$"),
    Cli("load-rate-nan", (*_LOAD, "--rate", "nan", "--duration", "1"), r"argument --rate: expected a finite number in \(0, 1e\+06\]"),
    Cli("load-rate-inf", (*_LOAD, "--rate", "inf", "--duration", "1"), r"argument --rate: expected a finite", real=True),
    Cli("load-rate-zero", (*_LOAD, "--rate", "0", "--duration", "1"), r"argument --rate: expected a finite number in \(0"),
    Cli("load-rate-negative", (*_LOAD, "--rate=-5", "--duration", "1"), r"argument --rate"),
    Cli("load-rate-text", (*_LOAD, "--rate", "fast", "--duration", "1"), r"argument --rate"),
    Cli("load-petabytes", (*_LOAD, "--rate", "1e12", "--duration", "1e5"), r"--rate"),
    Cli("load-too-many-requests", (*_LOAD, "--rate", "100000", "--duration", "1000"),
        r"100000000 requests; at most 10000000"),
    Cli("load-duration-nan", (*_LOAD, "--rate", "10", "--duration", "nan"), r"argument --duration: expected a finite"),
    Cli("load-duration-zero", (*_LOAD, "--rate", "10", "--duration", "0"), r"argument --duration"),
    Cli("load-duration-inf", (*_LOAD, "--rate", "10", "--duration", "inf"), r"argument --duration"),
    Cli("load-duration-missing", (*_LOAD, "--rate", "10"), r"give --rate and --duration"),
    Cli("load-arrival-unknown", (*_LOAD, *_SYN, "--arrival", "bursty"), r"unknown --arrival 'bursty'"),
    Cli("load-arrival-gamma-nan", (*_LOAD, *_SYN, "--arrival", "gamma:nan"), r"--arrival gamma:CV needs"),
    Cli("load-arrival-gamma-inf", (*_LOAD, *_SYN, "--arrival", "gamma:inf"), r"--arrival gamma:CV needs"),
    Cli("load-arrival-gamma-zero", (*_LOAD, *_SYN, "--arrival", "gamma:0"), r"--arrival gamma:CV needs"),
    Cli("load-arrival-gamma-tiny", (*_LOAD, *_SYN, "--arrival", "gamma:1e-300"), r"--arrival gamma:CV needs"),
    Cli("load-arrival-gamma-huge", (*_LOAD, *_SYN, "--arrival", "gamma:1e300"), r"--arrival gamma:CV needs"),
    Cli("load-arrival-gamma-empty", (*_LOAD, *_SYN, "--arrival", "gamma"), r"--arrival gamma needs"),
    Cli("load-trace-missing", (*_LOAD, "--trace", "{tmp}/t.csv"), r"t.csv: no such trace file"),
    Cli("load-trace-binary", (*_LOAD, "--trace", "{tmp}/t.csv"), r"t.csv", files={"t.csv": _BINARY}),
    Cli("load-trace-directory", (*_LOAD, "--trace", "{tmp}"), r"cannot read trace"),
    Cli("load-trace-empty", (*_LOAD, "--trace", "{tmp}/t.csv"), r"empty trace file", files={"t.csv": "\n"}),
    Cli("load-trace-nan-offset", (*_LOAD, "--trace", "{tmp}/t.csv"), r"t.csv:2: ", files={"t.csv": "0.5\nnan\n1\n"}),
    Cli("load-trace-inf-offset", (*_LOAD, "--trace", "{tmp}/t.csv"), r"t.csv:2: ", files={"t.csv": "0.5\ninf\n"}),
    Cli("load-trace-negative-tokens", (*_LOAD, "--trace", "{tmp}/t.csv"), r"t.csv:2: ",
        files={"t.csv": "offset_s,prompt_tokens,output_tokens\n0.1,-5,10\n"}),
    Cli("load-trace-bad-jsonl", (*_LOAD, "--trace", "{tmp}/t.jsonl"), r"t.jsonl:1: ",
        files={"t.jsonl": '{"timestamp": "soon", "input_length": 5, "output_length": 5}\n'}),
    Cli("load-trace-mooncake-nan", (*_LOAD, "--trace", "{tmp}/t.jsonl"), r"t.jsonl:1: timestamp must be",
        files={"t.jsonl": '{"timestamp": NaN, "input_length": 5, "output_length": 5}\n'}),
    Cli("load-trace-mooncake-huge-tokens", (*_LOAD, "--trace", "{tmp}/t.jsonl"), r"t.jsonl:1: input_length must be",
        files={"t.jsonl": '{"timestamp": 0, "input_length": 100000000000000000000000, "output_length": 5}\n'}),
    Cli("load-trace-azure-huge-tokens", (*_LOAD, "--trace", "{tmp}/t.csv"), r"t.csv:2: ContextTokens is",
        files={"t.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,99999999999,5\n"}),
    Cli("load-trace-too-long", (*_LOAD, "--trace", "{tmp}/t.csv"), r"lasts \d+ s; at most 1000000 s",
        files={"t.csv": "0\n5000000\n"}),
    Cli("load-trace-slowed-down", (*_LOAD, "--trace", "{tmp}/t.csv", "--speedup", "0.000001"),
        r"lasts \d+ s; at most", files={"t.csv": "0\n100\n"}),
    Cli("load-speedup-nan", (*_LOAD, "--trace", "{tmp}/t.csv", "--speedup", "nan"), r"argument --speedup",
        files={"t.csv": "0\n1\n"}),
    Cli("load-speedup-zero", (*_LOAD, "--trace", "{tmp}/t.csv", "--speedup", "0"), r"argument --speedup",
        files={"t.csv": "0\n1\n"}),
    Cli("load-speedup-inf", (*_LOAD, "--trace", "{tmp}/t.csv", "--speedup", "inf"), r"argument --speedup",
        files={"t.csv": "0\n1\n"}),
    Cli("load-speedup-synthetic", (*_LOAD, *_SYN, "--speedup", "2"), r"--speedup applies to --trace"),
    Cli("load-speedup-and-rate", (*_LOAD, "--trace", "{tmp}/t.csv", "--speedup", "2", "--rate", "3"),
        r"either --speedup or --rate", files={"t.csv": "0\n1\n"}),
    Cli("load-cap-zero", (*_LOAD, *_SYN, "--concurrency-cap", "0"), r"argument --concurrency-cap"),
    Cli("load-cap-fraction", (*_LOAD, *_SYN, "--concurrency-cap", "2.5"), r"argument --concurrency-cap"),
    Cli("load-cap-huge", (*_LOAD, *_SYN, "--concurrency-cap", "1" + "0" * 30), r"argument --concurrency-cap"),
    Cli("load-out-directory", ("load", "--url", "{dead}", *_SYN, "--out", "{tmp}"), r"is a directory", real=True),
    Cli("load-out-proc", ("load", "--url", "{dead}", *_SYN, "--out", "/proc/nope/r.parquet"), r"/proc/nope"),
    Cli("load-out-under-file", ("load", "--url", "{dead}", *_SYN, "--out", "{tmp}/f/r.parquet"), r"f/r.parquet",
        files={"f": "x"}),
    Cli("load-spans-dir-proc", (*_LOAD, *_SYN, "--spans-dir", "/proc/nope"), r"/proc/nope: cannot write", real=True),
    Cli("load-spans-dir-file", (*_LOAD, *_SYN, "--spans-dir", "{tmp}/f"), r"f: cannot write", files={"f": "x"}),
    Cli("load-spans-env-proc", (*_LOAD, *_SYN), r"/proc/nope: cannot write", env={"STAGESCOPE_SPANS_DIR": "/proc/nope"}),
    Cli("load-env-shutdown-timeout", (*_LOAD, *_SYN, "--spans-dir", "{tmp}/s"), r"STAGESCOPE_SHUTDOWN_TIMEOUT_S",
        env={"STAGESCOPE_SHUTDOWN_TIMEOUT_S": "soon"}),
    Cli("load-otlp-endpoint-bad", (*_LOAD, *_SYN), r"OTEL_EXPORTER_OTLP_ENDPOINT",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:99999"}),
    Cli("load-repeat-share-nan", (*_LOAD, *_SYN, "--repeat-share", "nan"), r"argument --repeat-share"),
    Cli("load-repeat-share-above-1", (*_LOAD, *_SYN, "--repeat-share", "1.5"), r"argument --repeat-share"),
    Cli("load-predict-dim-zero", (*_LOAD, *_SYN, "--predict-dim", "0"), r"argument --predict-dim"),
    Cli("load-predict-dim-huge", (*_LOAD, *_SYN, "--predict-dim", "1000000000"), r"argument --predict-dim"),
    Cli("load-timeout-nan", (*_LOAD, *_SYN, "--timeout", "nan"), r"argument --timeout"),
    Cli("load-timeout-zero", (*_LOAD, *_SYN, "--timeout", "0"), r"argument --timeout"),
    Cli("load-timeout-tiny", (*_LOAD, *_SYN, "--timeout", "1e-300"), r"argument --timeout"),
    Cli("load-timeout-inf", (*_LOAD, *_SYN, "--timeout", "inf"), r"argument --timeout"),
    Cli("load-seed-negative", (*_LOAD, *_SYN, "--seed=-1"), r"argument --seed"),
    Cli("load-seed-text", (*_LOAD, *_SYN, "--seed", "lucky"), r"argument --seed"),
    Cli("load-route-no-slash", (*_LOAD, *_SYN, "--route", "v1/predict"), r"argument --route: a route must start"),
    Cli("load-route-crlf", (*_LOAD, *_SYN, "--route", "/v1/predict\r\nX-Injected: 1"), r"argument --route"),
    Cli("load-api-choice", (*_LOAD, *_SYN, "--api", "openai"), r"argument --api: invalid choice: 'openai'"),
    Cli("load-api-route-mismatch", (*_LOAD, *_SYN, "--api", "openai-completions", "--route", "/v1/chat/completions"),
        r"--route /v1/chat/completions is the openai-chat endpoint"),
    Cli("load-method-choice", (*_LOAD, *_SYN, "--method", "FETCH"), r"argument --method: invalid choice: 'FETCH'"),
    Cli("load-method-crlf", (*_LOAD, *_SYN, "--method", "GET /x HTTP/1.1\r\nX: 1"), r"argument --method: invalid choice"),
    Cli("load-method-api", (*_LOAD, *_SYN, "--api", "openai-chat", "--method", "GET"),
        r"--api openai-chat sends POST requests \(the OpenAI API's\), not GET"),
    Cli("load-model-newline", (*_LOAD, *_SYN, "--model", "llama\n3"), r"argument --model: the model name must not"),
    Cli("load-model-empty", (*_LOAD, *_SYN, "--model", ""), r"argument --model: the model name must not be empty"),
    Cli("load-body-missing", (*_LOAD, *_SYN, "--body", "{tmp}/b.json"), r"b.json: cannot read the body template"),
    Cli("load-body-binary", (*_LOAD, *_SYN, "--body", "{tmp}/b.json"), r"b.json: not JSON", files={"b.json": _BINARY}),
    Cli("load-body-not-json", (*_LOAD, *_SYN, "--body", "{tmp}/b.json"), r"b.json: not JSON \(line 1",
        files={"b.json": "{prompt: {{prompt}}}"}),
    Cli("load-body-nan", (*_LOAD, *_SYN, "--body", "{tmp}/b.json"), r"b.json: not JSON", files={"b.json": '{"x": NaN}'}),
    Cli("load-body-placeholder", (*_LOAD, *_SYN, "--body", "{tmp}/b.json"), r"unknown placeholder \{\{promt\}\}",
        files={"b.json": '{"prompt": "{{promt}}"}'}),
    Cli("load-body-deep", (*_LOAD, *_SYN, "--body", "{tmp}/b.json"), r"b.json: the body template is nested too deeply",
        files={"b.json": "[" * 1000 + "]" * 1000}),
    Cli("load-body-directory", (*_LOAD, *_SYN, "--body", "{tmp}"), r"cannot read the body template"),
    Cli("load-body-model-unknown", (*_LOAD, *_SYN, "--body", "{tmp}/b.json"), r"uses \{\{model\}\}: give --model",
        files={"b.json": '{"model": "{{model}}", "prompt": "{{prompt}}"}'}),
    Cli("load-header-no-colon", (*_LOAD, *_SYN, "--header", "Authorization Bearer x"), r"--header must be 'NAME: VALUE'"),
    Cli("load-header-crlf", (*_LOAD, *_SYN, "--header", "X-A: 1\r\nX-B: 2"), r"--header must be 'NAME: VALUE'"),
    Cli("load-header-empty-name", (*_LOAD, *_SYN, "--header", ": v"), r"--header must be 'NAME: VALUE'"),
    Cli("load-prompt-tokens-zero", (*_LOAD, *_SYN, "--prompt-tokens", "0"), r"argument --prompt-tokens"),
    Cli("load-prompt-tokens-huge", (*_LOAD, *_SYN, "--prompt-tokens", "1e12"), r"argument --prompt-tokens"),
    Cli("load-prompt-tokens-nan", (*_LOAD, *_SYN, "--prompt-tokens", "nan"), r"argument --prompt-tokens"),
    Cli("load-output-tokens-negative", (*_LOAD, *_SYN, "--output-tokens=-1"), r"argument --output-tokens"),
    Cli("load-flags-still-checked", (*_LOAD, *_SYN, "--json", "--no-progress", "--realtime", "--timeout", "-1"),
        r"argument --timeout"),
    # -- serve -----------------------------------------------------------------------------------------
    Cli("serve-port-70000", ("serve", "--port", "70000"), r"argument --port: a port must be", real=True),
    Cli("serve-port-negative", ("serve", "--port=-1"), r"argument --port"),
    Cli("serve-port-text", ("serve", "--port", "http"), r"argument --port"),
    Cli("serve-port-fraction", ("serve", "--port", "80.5"), r"argument --port"),
    Cli("serve-host-bad", ("serve", "--host", "999.1.1.1", "--port", "0"), r"cannot listen on 999\.1\.1\.1"),
    Cli("serve-host-empty", ("serve", "--host", "", "--port", "0"), r"argument --host|--host"),
    Cli("serve-scenario-unknown", ("serve", "--scenario", "nope"), r"unknown scenario 'nope'"),
    Cli("serve-backend-choice", ("serve", "--backend", "tpu"), r"invalid choice: 'tpu'"),
    Cli("serve-log-level-choice", ("serve", "--log-level", "loud"), r"invalid choice: 'loud'"),
    Cli("serve-apply-lever-healthy", ("serve", "--apply-lever"), r"no lever"),
    Cli("serve-spans-out-proc", ("serve", "--port", "0", "--spans-out", "/proc/nope"), r"/proc/nope: cannot write"),
    Cli("serve-spans-out-file", ("serve", "--port", "0", "--spans-out", "{tmp}/f"), r"cannot write",
        files={"f": "x"}),
    Cli("serve-feature-store-scheme", ("serve", "--feature-store", "mysql://x"), r"bad --feature-store 'mysql://x'"),
    Cli("serve-feature-store-port", ("serve", "--feature-store", "redis://127.0.0.1:99999/0"),
        r"--feature-store .*port"),
    Cli("serve-feature-store-db", ("serve", "--feature-store", "redis://127.0.0.1:6379/abc"),
        r"--feature-store .*database"),
    Cli("serve-set-launch-nan", ("serve", "--set", "launch_ms=nan"), r"setting launch_ms must be a finite number",
        real=True),
    Cli("serve-set-wait-inf", ("serve", "--set", "max_batch_wait_ms=inf"), r"setting max_batch_wait_ms must be"),
    Cli("serve-set-wait-huge", ("serve", "--set", "max_batch_wait_ms=1e12"), r"setting max_batch_wait_ms must be"),
    Cli("serve-set-negative-ms", ("serve", "--set", "feature_latency_ms=-4"), r"setting feature_latency_ms"),
    Cli("serve-set-batch-zero", ("serve", "--set", "max_batch_size=0"), r"setting max_batch_size must be"),
    Cli("serve-set-batch-fraction", ("serve", "--set", "max_batch_size=1.5"), r"setting max_batch_size"),
    Cli("serve-set-batch-true", ("serve", "--set", "max_batch_size=true"), r"setting max_batch_size"),
    Cli("serve-set-entities-huge", ("serve", "--set", "num_entities=1000000000"), r"setting num_entities must be"),
    Cli("serve-set-model-dim-huge", ("serve", "--set", "model_dim=100000"), r"setting model_dim must be"),
    Cli("serve-set-workers-huge", ("serve", "--set", "preprocess_workers=100000"), r"setting preprocess_workers"),
    Cli("serve-set-body-huge", ("serve", "--set", "max_body_bytes=1e15"), r"setting max_body_bytes"),
    Cli("serve-set-prob", ("serve", "--set", "feature_slow_prob=2"), r"setting feature_slow_prob must be"),
    Cli("serve-set-prob-nan", ("serve", "--set", "heavy_share=nan"), r"setting heavy_share must be"),
    Cli("serve-set-sigma-inf", ("serve", "--set", "feature_latency_sigma=inf"), r"setting feature_latency_sigma"),
    Cli("serve-set-seed-negative", ("serve", "--set", "seed=-1"), r"setting seed must be"),
    Cli("serve-set-redis-port", ("serve", "--set", "feature_store=redis://h:99999/0"), r"bad --feature-store .*port"),
    Cli("serve-set-backend", ("serve", "--set", "backend=tpu"), r"unknown backend 'tpu'"),
    Cli("serve-set-int-exponent", ("serve", "--set", "max_queue=1e3"), r"setting max_queue: expected an integer"),
    Cli("serve-set-body-zero", ("serve", "--set", "max_body_bytes=0"), r"setting max_body_bytes must be"),
    Cli("serve-set-table-too-big", ("serve", "--set", "num_entities=1000000", "--set", "feature_dim=4096"),
        r"num_entities x feature_dim"),
    Cli("serve-set-egress-crawl", ("serve", "--set", "egress_bytes_per_s=1e-300"),
        r"setting egress_bytes_per_s must be 0 \(off\) or at least 1000"),
    Cli("serve-set-reload-busy", ("serve", "--set", "model_reload_every_s=0.000001"),
        r"setting model_reload_every_s must be 0 \(off\) or at least 1"),
    Cli("serve-backend-scenario", ("serve", "--backend", "onnx", "--scenario", "saturated"),
        r"unknown scenario 'saturated' for engine onnx"),
    Cli("serve-set-onnx-threads", ("serve", "--set", "onnx_threads=0"), r"setting onnx_threads must be a whole number"),
    Cli("serve-set-ort-level", ("serve", "--set", "ort_optimization=max"), r"setting ort_optimization must be one of"),
    Cli("serve-set-onnx-model", ("serve", "--set", "onnx_model=resnet50"),
        r"setting onnx_model must be one of digits-mlp, digits-ink-mlp, got 'resnet50'"),
    Cli("serve-set-bool", ("serve", "--set", "quantize=maybe"), r"setting quantize: expected true/false"),
    Cli("serve-set-unknown", ("serve", "--set", "warp_speed=9"), r"unknown setting\(s\) warp_speed"),
    Cli("serve-set-no-equals", ("serve", "--set", "max_batch_size"), r"bad --set 'max_batch_size'"),
    Cli("serve-set-empty-key", ("serve", "--set", "=3"), r"bad --set '=3'"),
    Cli("serve-set-empty-name", ("serve", "--set", "model_name="), r"setting model_name must not be empty"),
    Cli("serve-set-name-newline", ("serve", "--set", "model_name=a\nb"), r"setting model_name must not contain"),
    Cli("serve-set-list-settings", ("serve", "--list-settings", "--set", "launch_ms=nan"), r"setting launch_ms"),
    Cli("serve-list-scenarios-bad-set", ("serve", "--list-scenarios", "--set", "x"), r"bad --set 'x'"),
    Cli("serve-slow-threshold-nan", ("serve", "--slow-threshold-ms", "nan"), r"argument --slow-threshold-ms",
        real=True),
    Cli("serve-slow-threshold-negative", ("serve", "--slow-threshold-ms=-1"), r"argument --slow-threshold-ms"),
    Cli("serve-slow-threshold-inf", ("serve", "--slow-threshold-ms", "inf"), r"argument --slow-threshold-ms"),
    Cli("serve-baseline-nan", ("serve", "--baseline-sample", "nan"), r"argument --baseline-sample"),
    Cli("serve-baseline-above-1", ("serve", "--baseline-sample", "1.5"), r"argument --baseline-sample"),
    Cli("serve-env-slow-threshold-nan", ("serve", "--port", "0"), r"STAGESCOPE_SLOW_THRESHOLD_MS",
        env={"STAGESCOPE_SLOW_THRESHOLD_MS": "nan"}),
    Cli("serve-env-baseline-text", ("serve", "--port", "0"), r"STAGESCOPE_BASELINE_SAMPLE",
        env={"STAGESCOPE_BASELINE_SAMPLE": "half"}),
    Cli("serve-env-spans-dir-proc", ("serve", "--port", "0"), r"/proc/nope: cannot write",
        env={"STAGESCOPE_SPANS_DIR": "/proc/nope"}),
    Cli("serve-env-otlp-endpoint", ("serve", "--port", "0"), r"OTEL_EXPORTER_OTLP_ENDPOINT",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": "127.0.0.1:4318"}),
    Cli("serve-env-shutdown-timeout-nan", ("serve", "--port", "0"), r"STAGESCOPE_SHUTDOWN_TIMEOUT_S",
        env={"STAGESCOPE_SHUTDOWN_TIMEOUT_S": "nan"}),
    Cli("serve-env-shutdown-timeout-negative", ("serve", "--port", "0"), r"STAGESCOPE_SHUTDOWN_TIMEOUT_S",
        env={"STAGESCOPE_SHUTDOWN_TIMEOUT_S": "-5"}),
    Cli("serve-env-mode", ("serve", "--port", "0"), r"STAGESCOPE_INSTRUMENTATION_MODE",
        env={"STAGESCOPE_INSTRUMENTATION_MODE": "turbo"}),
    # -- demo ------------------------------------------------------------------------------------------
    Cli("demo-duration-nan", ("demo", "--duration", "nan", "--out", "{tmp}/d"), r"argument --duration", real=True),
    Cli("demo-duration-short", ("demo", "--duration", "1", "--out", "{tmp}/d"), r"argument --duration"),
    Cli("demo-duration-inf", ("demo", "--duration", "inf", "--out", "{tmp}/d"), r"argument --duration"),
    Cli("demo-port-70000", ("demo", "--port", "70000", "--out", "{tmp}/d"), r"argument --port"),
    Cli("demo-port-negative", ("demo", "--port=-1", "--out", "{tmp}/d"), r"argument --port"),
    Cli("demo-scenario-unknown", ("demo", "--scenario", "nope", "--out", "{tmp}/d"), r"unknown scenario 'nope'"),
    # '' was read as "no --scenario" and the default scenario ran (20 s) before s11
    Cli("demo-scenario-empty", ("demo", "--scenario", "", "--out", "{tmp}/d"), r"unknown scenario ''"),
    Cli("demo-engine-choice", ("demo", "--engine", "tpu", "--out", "{tmp}/d"), r"argument --engine: invalid choice: 'tpu'"),
    Cli("demo-engine-scenario", ("demo", "--engine", "onnx", "--scenario", "saturated", "--out", "{tmp}/d"),
        r"unknown scenario 'saturated' for engine onnx"),
    Cli("demo-all-and-scenario", ("demo", "--all", "--scenario", "saturated"), r"not allowed with argument"),
    Cli("demo-out-proc", ("demo", "--out", "/proc/nope"), r"/proc/nope: cannot write"),
    Cli("demo-out-file", ("demo", "--out", "{tmp}/f", "--apply-lever"), r"cannot write", files={"f": "x"}),
    Cli("demo-port-busy", ("demo", "--port", "{busy}", "--out", "{tmp}/d"), r"port \d+ .*in use"),
    Cli("demo-duration-text", ("demo", "--duration", "long", "--out", "{tmp}/d"), r"argument --duration"),
    Cli("demo-port-99999", ("demo", "--port", "99999", "--out", "{tmp}/d"), r"argument --port"),
    Cli("demo-out-empty", ("demo", "--out", ""), r"'': expected a folder"),
    Cli("demo-all-out-proc", ("demo", "--all", "--out", "/proc/nope"), r"/proc/nope: cannot write"),
    # -- dashboards build ------------------------------------------------------------------------------
    Cli("dashboards-missing-out", ("dashboards", "build"), r"required: --out"),
    Cli("dashboards-missing-action", ("dashboards",), r"required: ACTION|arguments are required"),
    Cli("dashboards-out-file", ("dashboards", "build", "--out", "{tmp}/f"), r"cannot write", files={"f": "x"},
        real=True),
    Cli("dashboards-out-proc", ("dashboards", "build", "--out", "/proc/nope"), r"/proc/nope: cannot write"),
    Cli("dashboards-out-under-file", ("dashboards", "build", "--out", "{tmp}/f/d"), r"cannot write",
        files={"f": "x"}),
    Cli("dashboards-out-empty", ("dashboards", "build", "--out", ""), r"'': expected a folder for dashboards"),
    # -- alerts build, the options besides the SLO file --------------------------------------------------
    Cli("alerts-missing-slo", ("alerts", "build", "--out", "{tmp}/r"), r"required: --slo"),
    Cli("alerts-slo-missing-file", (*_ALERTS, "--slo", "{tmp}/nope.yaml"), r"nope.yaml: SLO file not found"),
    Cli("alerts-slo-spec-not-file", (*_ALERTS, "--slo", "p99<300ms"), r"p99<300ms: SLO file not found"),
    Cli("alerts-slo-directory", (*_ALERTS, "--slo", "{tmp}"), r"cannot read SLO file"),
    Cli("alerts-threshold-not-bucket", (*_ALERTS, "--slo", "{tmp}/slo.yaml"), r"not a bucket|bucket bound",
        files={"slo.yaml": slo_yaml(threshold_ms="301")}),
    Cli("alerts-window-decimal", (*_ALERTS, "--slo", "{tmp}/slo.yaml"), r"not a Prometheus duration",
        files={"slo.yaml": slo_yaml(window="1.5d")}),
    Cli("alerts-out-file", ("alerts", "build", "--slo", "{tmp}/slo.yaml", "--out", "{tmp}/f"), r"cannot write",
        files={"slo.yaml": slo_yaml(), "f": "x"}),
    Cli("alerts-out-proc", ("alerts", "build", "--slo", "{tmp}/slo.yaml", "--out", "/proc/nope"),
        r"/proc/nope: cannot write", files={"slo.yaml": slo_yaml()}),
    Cli("alerts-runbook-newline", (*_ALERTS, "--slo", "{tmp}/slo.yaml", "--runbook-url", "http://x/\nrun"),
        r"argument --runbook-url", files={"slo.yaml": slo_yaml()}),
    Cli("alerts-runbook-empty", (*_ALERTS, "--slo", "{tmp}/slo.yaml", "--runbook-url", ""),
        r"argument --runbook-url", files={"slo.yaml": slo_yaml()}),
    # -- gpu-exporter ----------------------------------------------------------------------------------
    Cli("gpu-port-70000", ("gpu-exporter", "--port", "70000"), r"argument --port: a port must be"),
    Cli("gpu-port-text", ("gpu-exporter", "--port", "dcgm"), r"argument --port"),
    Cli("gpu-interval-nan", ("gpu-exporter", "--interval", "nan"), r"argument --interval"),
    Cli("gpu-interval-zero", ("gpu-exporter", "--interval", "0"), r"argument --interval"),
    Cli("gpu-interval-tiny", ("gpu-exporter", "--interval", "1e-9"), r"argument --interval"),
    Cli("gpu-interval-inf", ("gpu-exporter", "--interval", "inf"), r"argument --interval"),
    Cli("gpu-window-nan", ("gpu-exporter", "--window", "nan"), r"argument --window"),
    Cli("gpu-window-negative", ("gpu-exporter", "--window=-1"), r"argument --window"),
    # a flag takes no value: "--legacy-hostname-label=yes" is refused, not read as "on"
    Cli("gpu-legacy-hostname-label-value", ("gpu-exporter", "--legacy-hostname-label=yes"),
        r"--legacy-hostname-label: ignored explicit argument 'yes'"),
    Cli("gpu-window-below-interval", ("gpu-exporter", "--interval", "2", "--window", "1"),
        r"--window .* at least --interval"),
    Cli("gpu-collectors-binary", ("gpu-exporter", "--collectors", "{tmp}/c.csv"), r"c.csv: .*not UTF-8 text",
        files={"c.csv": _BINARY}, real=True),
    Cli("gpu-collectors-missing", ("gpu-exporter", "--collectors", "{tmp}/nope.csv"), r"nope.csv: cannot read"),
    Cli("gpu-collectors-directory", ("gpu-exporter", "--collectors", "{tmp}"), r"cannot read counters CSV"),
    Cli("gpu-collectors-bad-type", ("gpu-exporter", "--collectors", "{tmp}/c.csv"), r"c.csv:1: unknown metric type",
        files={"c.csv": "DCGM_FI_DEV_GPU_UTIL, gaug, typo\n"}),
    Cli("gpu-collectors-empty", ("gpu-exporter", "--collectors", "{tmp}/c.csv"), r"c.csv: no counters",
        files={"c.csv": "# only a comment\n"}),
    Cli("gpu-collectors-short-row", ("gpu-exporter", "--collectors", "{tmp}/c.csv"), r"c.csv:1: ",
        files={"c.csv": "DCGM_FI_DEV_GPU_UTIL\n"}),
    Cli("gpu-collectors-bad-name", ("gpu-exporter", "--collectors", "{tmp}/c.csv"), r"c.csv:1: .* is not a field name",
        files={"c.csv": "DCGM FI DEV, gauge, spaces\n"}),
    Cli("gpu-collectors-twice", ("gpu-exporter", "--collectors", "{tmp}/c.csv"), r"c.csv:2: field .* listed twice",
        files={"c.csv": "DCGM_FI_DEV_GPU_UTIL, gauge, a\nDCGM_FI_DEV_GPU_UTIL, gauge, b\n"}),
    Cli("gpu-window-inf", ("gpu-exporter", "--window", "inf"), r"argument --window"),
    Cli("gpu-host-empty", ("gpu-exporter", "--host", ""), r"argument --host: an address must not be empty"),
    Cli("gpu-host-bad", ("gpu-exporter", "--host", "999.1.1.1", "--port", "0"), r"cannot listen on 999\.1\.1\.1"),
    Cli("gpu-port-busy", ("gpu-exporter", "--port", "{busy}"), r"port \d+ on 127.0.0.1 is already in use"),
    Cli("gpu-hostname-newline", ("gpu-exporter", "--hostname", "a\nb"), r"argument --hostname"),
]

#: Options that take no user value worth a row of their own (help and version print and exit 0).
EXEMPT_OPTIONS: frozenset[str] = frozenset({"-h", "--help", "--version"})

_PREDICT = "/v1/predict"
_GENERATE = "/v1/generate"


def _j(text: str) -> bytes:
    return text.encode()


_BODY = b'{"inputs": [1]}'


def _head(extra: bytes) -> bytes:
    return b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra + (
        b"\r\nConnection: close\r\n\r\n"
    )


HTTP_ROWS: list[Http] = [
    Http("predict-not-json", "POST", _PREDICT, 400, r"not valid JSON", _j("{inputs: [1]}")),
    Http("predict-empty-body", "POST", _PREDICT, 400, r"empty request body", b""),
    Http("predict-truncated", "POST", _PREDICT, 400, r"not valid JSON", _j('{"inputs": [1, 2')),
    Http("predict-array-body", "POST", _PREDICT, 422, r"invalid request body", _j("[1, 2, 3]")),
    Http("predict-inputs-string", "POST", _PREDICT, 422, r"invalid request body", _j('{"inputs": "1,2"}')),
    Http("predict-inputs-bools", "POST", _PREDICT, 422, r"invalid request body", _j('{"inputs": [true, false]}')),
    Http("predict-inputs-nan", "POST", _PREDICT, 422, r"invalid request body|not valid JSON", _j('{"inputs": [NaN]}')),
    Http("predict-inputs-inf", "POST", _PREDICT, 422, r"invalid request body|not valid JSON",
         _j('{"inputs": [Infinity]}')),
    Http("predict-inputs-overflow", "POST", _PREDICT, 422, r"invalid request body", _j('{"inputs": [1e999]}')),
    Http("predict-inputs-too-many", "POST", _PREDICT, 422, r"invalid request body",
         _j('{"inputs": [' + ",".join(["1"] * 5000) + "]}")),
    Http("predict-entity-negative", "POST", _PREDICT, 422, r"invalid request body", _j('{"entity_id": -1}')),
    Http("predict-entity-huge", "POST", _PREDICT, 422, r"invalid request body", _j('{"entity_id": ' + "9" * 40 + "}")),
    Http("predict-entity-bool", "POST", _PREDICT, 422, r"invalid request body", _j('{"entity_id": true}')),
    Http("predict-entity-float", "POST", _PREDICT, 422, r"invalid request body", _j('{"entity_id": 1.5}')),
    Http("predict-deep-nesting", "POST", _PREDICT, 400, r"not valid JSON|nested",
         _j('{"inputs": ' + "[" * 100000 + "]" * 100000 + "}")),
    Http("predict-not-utf8", "POST", _PREDICT, 400, r"not valid JSON|UTF-8", b'{"inputs": [1], "x": "\xff\xfe"}'),
    Http("predict-text-plain", "POST", _PREDICT, 415, r"Content-Type", _j('{"inputs": [1]}'),
         {"Content-Type": "text/plain"}),
    Http("predict-form", "POST", _PREDICT, 415, r"Content-Type", _j("inputs=1"),
         {"Content-Type": "application/x-www-form-urlencoded"}),
    Http("predict-too-large", "POST", _PREDICT, 413, r"larger than", b'{"inputs": [' + b"1," * 600000 + b"1]}"),
    Http("predict-declared-too-large", "POST", _PREDICT, 413, r"larger than", b"",
         raw=b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         b"Content-Length: 99999999999\r\nConnection: close\r\n\r\n"),
    Http("predict-chunked-too-large", "POST", _PREDICT, 413, r"larger than", b"",
         raw=b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
         + b"".join(b"%x\r\n" % 65536 + b" " * 65536 + b"\r\n" for _ in range(20)) + b"0\r\n\r\n"),
    Http("predict-gzip", "POST", _PREDICT, 415, r"Content-Encoding", _j('{"inputs": [1]}'),
         {"Content-Type": "application/json", "Content-Encoding": "gzip"}),
    Http("predict-latin1", "POST", _PREDICT, 400, r"not valid JSON", '{"inputs": [1], "x": "é"}'.encode("latin-1"),
         {"Content-Type": "application/json; charset=latin-1"}),
    Http("predict-content-length-text", "POST", _PREDICT, 400, r"Invalid HTTP request",
         raw=_head(b"Content-Length: abc") + _BODY),
    Http("predict-content-length-negative", "POST", _PREDICT, 400, r"Invalid HTTP request",
         raw=_head(b"Content-Length: -1") + _BODY),
    Http("predict-content-length-twice", "POST", _PREDICT, 400, r"Invalid HTTP request",
         raw=_head(b"Content-Length: 14\r\nContent-Length: 15") + _BODY),
    Http("predict-no-host", "POST", _PREDICT, 400, r"Invalid HTTP request",
         raw=b"POST /v1/predict HTTP/1.1\r\nContent-Length: 14\r\nConnection: close\r\n\r\n" + _BODY),
    Http("garbage-request-line", "GET", "/", 400, r"Invalid HTTP request", raw=b"GARBAGE\r\n\r\n"),
    Http("non-ascii-path", "POST", "/", 400, r"Invalid HTTP request",
         raw="POST /v1/prédict HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode("latin-1")),
    Http("traceparent-garbage-ignored", "POST", _PREDICT, 200, r'"top"', _BODY,
         {"Content-Type": "application/json", "traceparent": "garbage"}),
    Http("traceparent-zero-ids-ignored", "POST", _PREDICT, 200, r'"top"', _BODY,
         {"Content-Type": "application/json", "traceparent": "00-" + "0" * 32 + "-" + "0" * 16 + "-01"}),
    Http("predict-bad-chunk-size", "POST", _PREDICT, 400, r"Invalid HTTP request",
         raw=b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n"),
    Http("predict-body-cut-short", "POST", _PREDICT, 0, r"\A\Z",
         raw=_head(b"Content-Length: 100") + b'{"inputs": [1', half_close=True),
    Http("generate-body-cut-short", "POST", _GENERATE, 0, r"\A\Z",
         raw=_head(b"Content-Length: 100").replace(b"/v1/predict", b"/v1/generate") + b'{"prompt": "a', half_close=True),
    Http("predict-brew", "BREW", _PREDICT, 405, r"Method Not Allowed"),
    Http("healthz-post", "POST", "/healthz", 405, r"Method Not Allowed", _BODY),
    Http("predict-get", "GET", _PREDICT, 405, r"Method Not Allowed"),
    Http("unknown-path", "POST", "/v1/nope", 404, r"Not Found", _j("{}")),
    Http("generate-no-prompt", "POST", _GENERATE, 422, r"invalid request body", _j('{"max_tokens": 4}')),
    Http("generate-empty-prompt", "POST", _GENERATE, 422, r"invalid request body", _j('{"prompt": ""}')),
    Http("generate-prompt-number", "POST", _GENERATE, 422, r"invalid request body", _j('{"prompt": 42}')),
    Http("generate-max-tokens-zero", "POST", _GENERATE, 422, r"invalid request body",
         _j('{"prompt": "hi", "max_tokens": 0}')),
    Http("generate-max-tokens-bool", "POST", _GENERATE, 422, r"invalid request body",
         _j('{"prompt": "hi", "max_tokens": true}')),
    Http("generate-max-tokens-text", "POST", _GENERATE, 422, r"invalid request body",
         _j('{"prompt": "hi", "max_tokens": "8"}')),
    Http("generate-max-tokens-huge", "POST", _GENERATE, 422, r"max_tokens must be at most",
         _j('{"prompt": "hi", "max_tokens": 100000000}')),
    Http("generate-stream-text", "POST", _GENERATE, 422, r"invalid request body",
         _j('{"prompt": "hi", "stream": "yes"}')),
    Http("generate-stream-number", "POST", _GENERATE, 422, r"invalid request body",
         _j('{"prompt": "hi", "stream": 1}')),
    Http("generate-prompt-too-long", "POST", _GENERATE, 422, r"at most \d+ allowed",
         _j('{"prompt": "' + "w " * 40000 + '"}')),
    Http("generate-json-null", "POST", _GENERATE, 422, r"invalid request body", _j("null")),
    Http("generate-xml", "POST", _GENERATE, 415, r"Content-Type", _j("<prompt>hi</prompt>"),
         {"Content-Type": "application/xml"}),
]

STARTS_ROWS: list[Starts] = [
    Starts(
        "serve-redis-unreachable",
        ("serve", "--port", "0", "--feature-store", "redis://127.0.0.1:{dead_port}/0"),
        r"feature store redis://127\.0\.0\.1:\d+/0 is unreachable",
        (("GET", "/healthz", 200), ("GET", "/readyz", 503), ("POST", _PREDICT, 503), ("POST", _GENERATE, 200)),
    ),
    Starts(
        "serve-collector-unreachable",
        ("serve", "--port", "0"),
        r"exporting spans to .* failed",
        (("GET", "/healthz", 200), ("GET", "/readyz", 200), ("POST", _PREDICT, 200)),
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:{dead_port}"},
    ),
]
