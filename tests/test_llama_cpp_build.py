"""The llama.cpp build's cache and skip logic (no build runs here: the cached entry is what is checked).

The build itself runs in ``.ci/run`` before ``make test`` (``python -m stagescope.service.llama_cpp.build``)
and is exercised by the slow llama.cpp tests, which use its cached binary.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from stagescope.errors import UserError
from stagescope.service.llama_cpp import build as B


def _fake_entry(root: Path, *, executable: bool = True, vocab: bool = True, manifest: str | None = None) -> Path:
    """A cache entry laid out as ensure_server leaves one (the binary is a shell script here)."""
    folder = root / "llama.cpp" / f"{B.LLAMA_CPP_PYTHON_VERSION}-{B.build_key()}"
    (folder / "bin").mkdir(parents=True)
    (folder / "models").mkdir()
    server = folder / "bin" / B.SERVER_NAME
    server.write_text("#!/bin/sh\necho fake\n")
    if executable:
        server.chmod(server.stat().st_mode | stat.S_IXUSR)
    if vocab:
        for v in B.VOCAB_FILES:
            (folder / "models" / v).write_bytes(b"GGUF")
    (folder / "manifest.json").write_text(manifest if manifest is not None else json.dumps({"what": "test"}))
    return folder


def test_build_key_names_version_and_flags() -> None:
    k = B.build_key()
    assert len(k) == 12 and k == B.build_key()
    assert B.build_key("0.0.1") != k
    assert B.build_key(flags=(*B.CMAKE_FLAGS, "-DGGML_AVX512=ON")) != k
    # the build never fetches: the web UI's prebuilt assets are off, and so is HTTPS
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in B.CMAKE_FLAGS and "-DLLAMA_OPENSSL=OFF" in B.CMAKE_FLAGS


def test_cached_entry_is_found_and_a_damaged_one_is_not(tmp_path: Path) -> None:
    assert B.find_server(tmp_path) is None
    folder = _fake_entry(tmp_path)
    found = B.find_server(tmp_path)
    assert found is not None and found.folder == folder and found.server == folder / "bin" / B.SERVER_NAME
    assert found.vocab() == folder / "models" / B.VOCAB_FILES[0]
    # ensure_server returns the cached entry without building (no cmake is run)
    assert B.ensure_server(tmp_path).folder == folder
    for bad in ({"executable": False}, {"vocab": False}, {"manifest": "{not json"}):
        root = tmp_path / str(sorted(bad))
        _fake_entry(root, **bad)  # type: ignore[arg-type]
        assert B.find_server(root) is None, bad


def test_cache_root_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGESCOPE_CACHE_DIR", str(tmp_path))
    assert B.cache_root() == tmp_path
    monkeypatch.delenv("STAGESCOPE_CACHE_DIR")
    assert B.cache_root() == Path.home() / ".cache" / "stagescope"


def test_no_build_tools_is_one_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no cmake, no compiler
    reason = B.cannot_build_reason()
    assert reason is not None and "cmake" in reason and "\n" not in reason
    with pytest.raises(UserError, match="cannot build"):
        B.ensure_server(tmp_path / "cache")
    env = dict(os.environ, PATH=str(tmp_path), STAGESCOPE_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "stagescope.service.llama_cpp.build"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cmake" in lines[0] and "Traceback" not in proc.stderr


def test_bad_job_count_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAGESCOPE_BUILD_JOBS", "many")
    with pytest.raises(UserError, match="STAGESCOPE_BUILD_JOBS"):
        B._jobs()
    monkeypatch.setenv("STAGESCOPE_BUILD_JOBS", "3")
    assert B._jobs() == 3


def test_a_failed_build_is_remembered_until_asked_for_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing CMake (a script on PATH) leaves the reason beside the entry: the next caller (the
    tests, the demo) gets it as one line instead of a second long build; the explicit build retries."""
    import io
    import tarfile

    tools = tmp_path / "bin"
    tools.mkdir()
    calls = tmp_path / "cmake-calls"
    for name, body in (("cmake", f'[ "$1" = --version ] && {{ echo "cmake version 0"; exit 0; }}\n'
                                  f'echo run >> "{calls}"; echo "CMake Error: no compiler works" >&2; exit 1'),
                       ("c++", "echo 'c++ (fake) 1.0'"), ("cc", "echo 'cc (fake) 1.0'")):  # fmt: skip
        (tools / name).write_text(f"#!/bin/sh\n{body}\n")
        (tools / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    root = tmp_path / "cache"
    sdist = root / "llama.cpp" / "sdist" / f"llama_cpp_python-{B.LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    sdist.parent.mkdir(parents=True)
    with tarfile.open(sdist, "w:gz") as tar:  # the sources' layout, no download
        data = b"project(fake)\n"
        info = tarfile.TarInfo(f"llama_cpp_python-{B.LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/CMakeLists.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    assert B.cannot_build_reason(root) is None
    with pytest.raises(UserError, match="cmake exit 1"):
        B.ensure_server(root)
    assert calls.read_text().count("run") == 1 and B.failure_mark(root).is_file()
    reason = B.cannot_build_reason(root)
    assert reason is not None and "failed here earlier" in reason and "cmake exit 1" in reason and "\n" not in reason
    with pytest.raises(UserError, match="failed here earlier"):
        B.ensure_server(root)  # no second build
    assert calls.read_text().count("run") == 1
    with pytest.raises(UserError, match="cmake exit 1"):
        B.ensure_server(root, retry=True)  # asked for explicitly: it builds again
    assert calls.read_text().count("run") == 2
    env = dict(os.environ, STAGESCOPE_CACHE_DIR=str(root))
    proc = subprocess.run([sys.executable, "-m", "stagescope.service.llama_cpp.build"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and calls.read_text().count("run") == 3 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("llama.cpp build: error: llama.cpp build failed")
    # another version (another key) is not held back by this one's failure
    assert B.cannot_build_reason(root, "0.0.1") is None
