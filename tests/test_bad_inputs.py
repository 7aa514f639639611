"""Every bad input in ``tests/bad_inputs.py`` gets its one line and exit status, and never a traceback.

Command-line rows run in-process through :func:`stagescope.cli.main` (stdout and stderr captured, a
watchdog alarm in case a bad input is accepted and a server starts); rows marked ``real`` also run
through the installed ``stagescope`` executable. HTTP rows are sent to one real ``stagescope serve``
under uvicorn, whose log is checked for tracebacks and 5xx answers at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import io
import json
import logging
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bad_inputs import CLI_ROWS, EXEMPT_OPTIONS, HTTP_ROWS, STARTS_ROWS, Cli, Http, Starts

from stagescope.cli import build_parser, main

REPO = Path(__file__).resolve().parents[1]
EXE = shutil.which("stagescope", path=str(Path(sys.executable).parent)) or "stagescope"
WATCHDOG_S = 30


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stagescope.analysis import synth_scenarios as S

    path = tmp_path_factory.mktemp("traces") / "spans.jsonl"
    S.write_otlp(S.generate("saturated", 800, seed=7), path)
    return path


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield int(s.getsockname()[1])


def _prepare(row: Cli, tmp: Path, traces: Path, busy: int) -> list[str]:
    for name, content in row.files.items():
        target = tmp / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content, encoding="utf-8")
    subs = {"tmp": str(tmp), "traces": str(traces), "dead": f"http://127.0.0.1:{_closed_port()}", "busy": str(busy)}
    return [re.sub(r"\{(tmp|traces|dead|busy)\}", lambda m: subs[m[1]], a) for a in row.argv]


class _Watchdog(Exception):
    pass


@contextlib.contextmanager
def _alarm(seconds: int) -> Iterator[None]:
    def fire(signum: int, frame: Any) -> None:
        raise _Watchdog(f"still running after {seconds} s: the bad input was accepted")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _run_in_process(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    root.handlers[:] = []  # pytest's capture would hide log lines a user sees: they count as stderr lines
    try:
        with _alarm(WATCHDOG_S), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 2
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return int(code), out.getvalue(), err.getvalue()


def _check(row: Cli, code: int, stderr: str, stdout: str = "") -> None:
    lines = stderr.splitlines()
    assert "Traceback" not in stderr + stdout, f"{row.id}: traceback:\n{stderr}"
    assert code == row.exit, f"{row.id}: exit {code}, expected {row.exit}; stderr:\n{stderr}"
    if row.exit == 3:  # no data: the report says why (its first line), nothing is an error
        assert not any("error" in line for line in lines), f"{row.id}: {stderr}"
        assert re.search(row.match, stdout, re.MULTILINE), f"{row.id}: {stdout[:500]!r} does not match {row.match!r}"
        return
    assert len(lines) == 1, f"{row.id}: expected one line on stderr, got {len(lines)}:\n{stderr}"
    assert re.search(row.match, lines[0]), f"{row.id}: {lines[0]!r} does not match {row.match!r}"
    assert lines[0].startswith("stagescope"), f"{row.id}: the line does not say which command: {lines[0]!r}"


@pytest.mark.parametrize("row", CLI_ROWS, ids=[r.id for r in CLI_ROWS])
def test_cli_row(row: Cli, tmp_path: Path, traces: Path, busy_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = _prepare(row, tmp_path, traces, busy_port)
    monkeypatch.chdir(tmp_path)  # a row that is wrongly accepted writes its output there, not in the repo
    started = time.monotonic()
    code, out, err = _run_in_process(argv, dict(row.env), monkeypatch)
    _check(row, code, err, out)
    assert time.monotonic() - started < 20, f"{row.id}: took {time.monotonic() - started:.1f} s to refuse"


REAL_ROWS = [r for r in CLI_ROWS if r.real]


@pytest.mark.parametrize("row", REAL_ROWS, ids=[r.id for r in REAL_ROWS])
def test_cli_row_through_the_executable(row: Cli, tmp_path: Path, traces: Path, busy_port: int) -> None:
    argv = _prepare(row, tmp_path, traces, busy_port)
    env = {**os.environ, **row.env}
    proc = subprocess.run([EXE, *argv], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    _check(row, proc.returncode, proc.stderr, proc.stdout)


def test_the_table_is_big_enough() -> None:
    assert len(CLI_ROWS) + len(HTTP_ROWS) + len(STARTS_ROWS) >= 150
    ids = [r.id for r in [*CLI_ROWS, *HTTP_ROWS, *STARTS_ROWS]]
    assert len(ids) == len(set(ids)), "row ids must be unique"
    commands = {r.argv[0] for r in CLI_ROWS}
    assert commands >= {"analyze", "load", "serve", "demo", "alerts", "dashboards", "gpu-exporter"}


def _options(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, (*prefix, name))
        else:
            for opt in action.option_strings:
                if opt.startswith("--"):
                    yield prefix, opt


def test_every_option_has_a_row() -> None:
    """A new option without a row here fails: bad input for it has to be thought about."""
    missing = []
    for command, opt in _options(build_parser()):
        if opt in EXEMPT_OPTIONS:
            continue
        rows = [*CLI_ROWS, *STARTS_ROWS]
        if not any(r.argv[: len(command)] == command and any(a == opt or a.startswith(opt + "=") for a in r.argv)
                   for r in rows):  # fmt: skip
            missing.append(f"stagescope {' '.join(command)} {opt}")
    assert not missing, "options without a bad-input row: " + ", ".join(missing)


# -- HTTP ------------------------------------------------------------------------------------------------


def _start_serve(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], int, list[str]]:
    proc = subprocess.Popen([EXE, *argv], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, **env})  # fmt: skip
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 0.5)
        if ready:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                _DRAINS[proc.pid] = threading.Thread(target=_drain, args=(proc, lines), daemon=True)
                _DRAINS[proc.pid].start()
                return proc, int(m[1]), lines
    proc.kill()
    raise AssertionError(f"serve did not start: {''.join(lines)}")


#: per server pid, the thread reading its log (joined once the server has exited)
_DRAINS: dict[int, threading.Thread] = {}


def _drain(proc: subprocess.Popen[str], lines: list[str]) -> None:
    """Keep reading the server's log (a full pipe would stall it) into ``lines``."""
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)


def _request(port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
             timeout: float = 10.0) -> tuple[int, bytes]:  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body or None, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _raw(port: int, data: bytes, timeout: float = 10.0, half_close: bool = False) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        with contextlib.suppress(OSError):  # the server may answer and close before reading it all
            s.sendall(data)
            if half_close:  # a client that goes away mid-upload
                s.shutdown(socket.SHUT_WR)
        chunks = []
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                chunks.append(chunk)
    reply = b"".join(chunks)
    head, _, body = reply.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    return status, body


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    # every line up to the exit (a warning written while the server drains at shutdown, a traceback)
    # is in the log once its reader reached the end of the pipe, however long a loaded machine takes
    drain = _DRAINS.pop(proc.pid, None)
    if drain is not None:
        drain.join(30)
        assert not drain.is_alive(), "the server's log pipe stayed open after it exited"


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, list[str], subprocess.Popen[str]]]:
    proc, port, lines = _start_serve(["serve", "--port", "0", "--log-level", "info"], {})
    deadline = time.monotonic() + 30
    while _request(port, "GET", "/readyz")[0] != 200:
        assert time.monotonic() < deadline, "serve never became ready"
        time.sleep(0.1)
    yield port, lines, proc
    _stop(proc)


@pytest.mark.parametrize("row", HTTP_ROWS, ids=[r.id for r in HTTP_ROWS])
def test_http_row(row: Http, server: tuple[int, list[str], subprocess.Popen[str]]) -> None:
    port = server[0]
    if row.raw is not None:
        status, body = _raw(port, row.raw, half_close=row.half_close)
    else:
        status, body = _request(port, row.method, row.path, row.body, dict(row.headers))
    assert status == row.status, f"{row.id}: {status} {body[:300]!r}"
    message = body.decode("utf-8", "replace") if row.raw is not None else json.dumps(json.loads(body))
    assert re.search(row.match, message), f"{row.id}: {message[:300]} does not match {row.match!r}"
    assert _request(port, "GET", "/healthz")[0] == 200, f"{row.id}: the server stopped answering"


def test_http_log_has_no_traceback_or_5xx(server: tuple[int, list[str], subprocess.Popen[str]]) -> None:
    """Runs after the rows (pytest keeps file order): the server's log and its own request counts."""
    from stagescope import names

    port, lines, _proc = server
    status, metrics = _request(port, "GET", "/metrics")
    assert status == 200
    counts = [  # /readyz answered 503 while the fixture waited for the model: not a row's answer
        (cls, n) for labels, cls, n in re.findall(
            rf'^{names.METRIC_REQUEST_DURATION}_count{{([^}}]*{names.LABEL_STATUS_CLASS}="(\w+)"[^}}]*)}} (\S+)$',
            metrics.decode(), re.MULTILINE,
        ) if 'route="/readyz"' not in labels
    ]  # fmt: skip
    seen = {cls for cls, n in counts if float(n) > 0}
    assert "4xx" in seen, counts  # the rows were counted: the check below can fail
    assert "5xx" not in seen, counts
    log = "".join(lines)
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-3000:]


@pytest.mark.parametrize("row", STARTS_ROWS, ids=[r.id for r in STARTS_ROWS])
def test_keeps_serving_with_one_warning(row: Starts) -> None:
    dead = str(_closed_port())
    argv = [a.replace("{dead_port}", dead) for a in row.argv]
    env = {k: v.replace("{dead_port}", dead) for k, v in row.env.items()}
    proc, port, lines = _start_serve(argv, env)
    try:
        for method, path, expected in row.probes:
            body = b'{"prompt": "a b c", "max_tokens": 2, "stream": false}' if path.endswith("generate") else b"{}"
            deadline = time.monotonic() + 10
            while True:
                status, reply = _request(port, method, path, body if method == "POST" else b"",
                                         {"Content-Type": "application/json"})  # fmt: skip
                if status == expected or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert status == expected, f"{row.id}: {method} {path} -> {status} {reply[:200]!r}"
        time.sleep(1.5)
    finally:
        _stop(proc)
    log = "".join(lines)
    assert "Traceback" not in log, log
    if row.warning is not None:
        warnings = [line for line in log.splitlines() if re.search(row.warning, line)]
        assert len(warnings) == 1, f"{row.id}: expected one warning matching {row.warning!r}:\n{log}"


# -- the rules behind the rows ---------------------------------------------------------------------------


def test_every_numeric_setting_is_bounded() -> None:
    """A new `--set` knob gets a range: an unbounded one is how `launch_ms=1e12` starts a dead server."""
    import dataclasses

    from stagescope.service.settings import BOUNDS, Settings

    numeric = {f.name for f in dataclasses.fields(Settings) if f.type in ("int", "float", int, float)}
    assert numeric - set(BOUNDS) == set(), "settings without BOUNDS"
    assert set(BOUNDS) <= numeric


def test_slo_file_anchors_and_merge_keys_are_read(tmp_path: Path) -> None:
    """Anchors are bounded, not refused: the common `<<: *defaults` keeps working."""
    from stagescope.slo import load_slo_file

    p = tmp_path / "slo.yaml"
    p.write_text(
        "defaults: &d {service: inference, sli: e2e, objective: 0.99, window: 30d}\n"
        "slos:\n"
        "  - {<<: *d, name: predict, route: /v1/predict, threshold_ms: 300}\n"
        "  - {<<: *d, name: generate, sli: ttft, route: /v1/generate, threshold_ms: 500, objective: 0.95}\n"
    )
    a, b = load_slo_file(p)
    assert (a.service, a.objective, a.threshold_ms) == ("inference", 0.99, 300.0)
    assert (b.sli, b.objective, b.window) == ("ttft", 0.95, "30d")


def test_alias_bomb_costs_little_memory(tmp_path: Path) -> None:
    """The 9**9 alias bomb is refused before anything expands (it took 3.1 GB before)."""
    import tracemalloc

    from bad_inputs import _ALIAS_BOMB

    from stagescope.errors import UserError
    from stagescope.slo import load_slo_file

    p = tmp_path / "bomb.yaml"
    p.write_text(_ALIAS_BOMB)
    tracemalloc.start()
    try:
        with pytest.raises(UserError, match="aliases expand to more than"):
            load_slo_file(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB"


# -- beyond the table: generic bad values on every option -------------------------------------------------
# The table says what each bad input must answer; this sweep says that nothing a user might type into any
# option (with the rest of the command line valid up to a quick stop) reaches them as a traceback.

#: Values a user gets wrong for any kind of option; each option must refuse them in one line or accept them.
GENERIC_VALUES = ("nan", "inf", "-inf", "-1", "1e400", "1e-300", "", " ", "x", "9" * 40, "a\nb", "/proc/nope",
                  "{tmp}", "{tmp}/bin", "true", "http://127.0.0.1:99999", "%s")  # fmt: skip


def _bases(tmp: Path, traces: Path, busy: int) -> dict[tuple[str, ...], list[str]]:
    """Per command, a command line that is valid up to a quick stop (a busy port, a dead URL)."""
    slo = tmp / "slo.yaml"
    slo.write_text("slos:\n  - {name: a, service: inference, sli: e2e, threshold_ms: 300, objective: 0.99}\n")
    return {
        ("analyze",): ["--traces", str(traces), "--slo", "p99<300ms"],
        ("load",): ["--url", f"http://127.0.0.1:{_closed_port()}", *("--rate", "10", "--duration", "1"),
                    "--out", str(tmp / "r.parquet")],
        ("serve",): ["--port", str(busy)],
        ("demo",): ["--port", str(busy), "--out", str(tmp / "demo"), "--duration", "2"],
        ("alerts", "build"): ["--slo", str(slo), "--out", str(tmp / "rules")],
        ("dashboards", "build"): ["--out", str(tmp / "dash")],
        ("gpu-exporter",): ["--port", str(busy)],
    }


def _value_options() -> list[tuple[tuple[str, ...], str]]:
    out = []

    def walk(parser: argparse.ArgumentParser, prefix: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*prefix, name))
            elif action.option_strings and action.nargs != 0 and action.option_strings[-1].startswith("--"):
                out.append((prefix, action.option_strings[-1]))

    walk(build_parser(), ())
    return out


@pytest.mark.parametrize(("command", "option"), _value_options(), ids=[" ".join((*c, o)) for c, o in _value_options()])
def test_generic_bad_values(command: tuple[str, ...], option: str, tmp_path: Path, traces: Path, busy_port: int,
                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Exit 0 (accepted), 3 (accepted, no data) or 2 with one line; never a traceback."""
    (tmp_path / "bin").write_bytes(bytes(range(256)) * 8)
    monkeypatch.chdir(tmp_path)
    base = _bases(tmp_path, traces, busy_port)[command]
    if option in base:
        i = base.index(option)
        del base[i : i + 2]
    problems = []
    for value in GENERIC_VALUES:
        value = value.replace("{tmp}", str(tmp_path))
        arg = [f"{option}={value}"] if value.startswith("-") else [option, value]
        code, _out, err = _run_in_process([*command, *base, *arg], {}, monkeypatch)
        lines = err.splitlines()
        if "Traceback" in err or code not in (0, 2, 3) or (code == 2 and len(lines) != 1):
            problems.append(f"{value!r}: exit {code}, {len(lines)} lines: {err[-300:]!r}")
    assert not problems, "\n".join(problems)
