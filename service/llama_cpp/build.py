"""Build llama.cpp's ``llama-server`` from source, once, and cache it outside the repository.

The sources are the llama.cpp tree that the ``llama-cpp-python`` source distribution on PyPI vendors
(``vendor/llama.cpp/``), fetched with pip itself (``pip download --no-deps --no-binary
llama-cpp-python llama-cpp-python==VERSION``), built with CMake (server on; tests, examples, the web
UI and HTTPS off; nothing else is downloaded: ``LLAMA_USE_PREBUILT_UI=OFF`` keeps the build from
fetching the web UI's assets). The result lives in ``$STAGESCOPE_CACHE_DIR/llama.cpp/<version>-<key>/``
(default ``~/.cache/stagescope``), ``<key>`` hashing the version, the CMake flags, the compiler and the
CPU's instruction-set flags (the build targets this CPU: ``GGML_NATIVE``), so a second run, and CI's
second run, finds it and skips the build. Beside the binary: ``manifest.json`` (how it was made),
llama.cpp's ``LICENSE`` and the vocabulary GGUF files the same tree ships under ``models/`` (the model
writer takes its tokenizer from there, see :mod:`.gguf_model`).

A build takes 5-10 minutes on two idle cores (47 minutes was measured under a load of 8-10).
Concurrent callers wait on a lock file; a half-built entry is never used (the folder is written under a
temporary name and renamed when complete). A failed build leaves ``<version>-<key>.failed`` beside
where the entry would be, holding its one-line reason: from then on :func:`cannot_build_reason` says
so (the llama.cpp tests skip with it, the demo stops with it) instead of starting the same long build
again, until the build is asked for explicitly (``python -m stagescope.service.llama_cpp.build``, which
always tries, and removes the mark when it succeeds).

Run it directly (``.ci/run`` does, before ``make test``)::

    python -m stagescope.service.llama_cpp.build          # prints the binary's path
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from stagescope.errors import UserError
from stagescope.paths import cache_root

__all__ = [
    "CMAKE_FLAGS",
    "LLAMA_CPP_PYTHON_VERSION",
    "Build",
    "build_key",
    "cache_root",
    "cannot_build_reason",
    "ensure_server",
    "failure_mark",
    "find_server",
]

#: The llama-cpp-python release whose vendored llama.cpp is built (its sdist is 77 MB).
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
#: CMake cache entries of the build. Any change makes a new cache entry.
CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # else the build downloads the web UI
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_NATIVE=ON",
)
#: Vocabulary files kept from ``vendor/llama.cpp/models/`` (vocab only: no weights).
VOCAB_FILES = ("ggml-vocab-llama-spm.gguf",)
#: Bumped when this module's recipe changes in a way the flags do not show.
RECIPE_VERSION = 1
SERVER_NAME = "llama-server"


def _cpu_flags() -> str:
    """The CPU's instruction-set flags (``/proc/cpuinfo``), which a native build depends on."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    return platform.processor() or platform.machine()


def _tool_version(cmd: str) -> str:
    path = shutil.which(cmd)
    if path is None:
        return "missing"
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.splitlines()[0].strip() if out else "unknown"


def build_key(version: str = LLAMA_CPP_PYTHON_VERSION, flags: tuple[str, ...] = CMAKE_FLAGS) -> str:
    """12 hex digits naming one build: version, flags, recipe, compilers, machine and CPU flags."""
    parts = [version, *flags, f"recipe={RECIPE_VERSION}", _tool_version("c++"), _tool_version("cmake"),
             platform.machine(), _cpu_flags()]  # fmt: skip
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Build:
    """A finished build: the folder, the binary, and its manifest."""

    folder: Path
    manifest: dict[str, object]

    @property
    def server(self) -> Path:
        return self.folder / "bin" / SERVER_NAME

    def vocab(self, name: str = VOCAB_FILES[0]) -> Path:
        return self.folder / "models" / name


def _entry(root: Path | None, version: str) -> Path:
    return (root or cache_root()) / "llama.cpp" / f"{version}-{build_key(version)}"


def find_server(root: Path | None = None, version: str = LLAMA_CPP_PYTHON_VERSION) -> Build | None:
    """The cached build for this version and machine, or None when there is none (or it is damaged)."""
    folder = _entry(root, version)
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    b = Build(folder, manifest)
    if not os.access(b.server, os.X_OK) or not all(b.vocab(v).is_file() for v in VOCAB_FILES):
        return None
    return b


def failure_mark(root: Path | None = None, version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """Where a failed build of this version and machine leaves its one-line reason."""
    folder = _entry(root, version)
    return folder.with_name(folder.name + ".failed")


def cannot_build_reason(root: Path | None = None, version: str = LLAMA_CPP_PYTHON_VERSION) -> str | None:
    """Why ``llama-server`` cannot be built here (one line): missing tools, another platform, or an
    earlier build of this version on this machine that failed; None when a build can be tried."""
    missing = [t for t in ("cmake", "c++", "cc") if shutil.which(t) is None]
    if missing:
        return f"cannot build llama.cpp's server: {', '.join(missing)} not installed (apt-get install cmake g++)"
    if sys.platform != "linux":
        return f"cannot build llama.cpp's server here: built and tested on Linux only, this is {sys.platform}"
    mark = failure_mark(root, version)
    with contextlib.suppress(OSError):
        why = " ".join(mark.read_text(errors="replace").split())
        return (f"cannot build llama.cpp's server: the build failed here earlier ({why[:300]}); "
                "`python -m stagescope.service.llama_cpp.build` tries again")  # fmt: skip
    return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _say(msg: str) -> None:
    print(f"llama.cpp build: {msg}", file=sys.stderr, flush=True)


def _sdist(root: Path, version: str) -> Path:
    """The llama-cpp-python source archive, downloaded once into the cache with pip."""
    dest = root / "llama.cpp" / "sdist"
    name = f"llama_cpp_python-{version}.tar.gz"
    if (dest / name).is_file():
        return dest / name
    dest.mkdir(parents=True, exist_ok=True)
    _say(f"downloading the llama-cpp-python {version} source distribution (77 MB) with pip")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", "llama-cpp-python",
           f"llama-cpp-python=={version}", "-d", str(dest)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not (dest / name).is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UserError(f"pip download llama-cpp-python=={version} failed: {tail[0]}")
    return dest / name


def _extract_vendor(sdist: Path, into: Path, version: str) -> Path:
    """Unpack ``vendor/llama.cpp/`` of the archive into ``into``; return the tree's root."""
    prefix = f"llama_cpp_python-{version}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise UserError(f"{sdist}: no vendor/llama.cpp/ in the archive")
        tar.extractall(into, members=members, filter="data")
    return into / prefix


def _run(cmd: list[str], log: Path, cwd: Path | None = None) -> None:
    with log.open("ab") as fh:
        fh.write(("\n$ " + " ".join(cmd) + "\n").encode())
        fh.flush()
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd).returncode
    if rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        raise UserError(f"llama.cpp build failed ({cmd[0]} exit {rc}; log {log}): {tail[0][:200]}")


def _jobs() -> int:
    env = os.environ.get("STAGESCOPE_BUILD_JOBS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise UserError(f"STAGESCOPE_BUILD_JOBS must be a positive integer, got {env!r}") from None
    return max(1, min(os.cpu_count() or 1, 4))


def ensure_server(root: Path | None = None, version: str = LLAMA_CPP_PYTHON_VERSION, *, retry: bool = False) -> Build:
    """The cached ``llama-server`` build, built first when absent (minutes; said on stderr). An earlier
    failed build of the same version stops it with that reason unless ``retry``; a failure now leaves
    the reason in :func:`failure_mark`."""
    found = find_server(root, version)
    if found is not None:
        return found
    mark = failure_mark(root, version)
    if retry:
        with contextlib.suppress(OSError):
            mark.unlink()
    reason = cannot_build_reason(root, version)
    if reason:
        raise UserError(reason)
    folder = _entry(root, version)
    base = folder.parent
    with _locked(base / f".{folder.name}.lock"):
        found = find_server(root, version)  # another process built it while we waited
        if found is not None:
            return found
        try:
            _build(folder, base, version)
        except UserError as exc:
            with contextlib.suppress(OSError):
                mark.write_text(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}: {exc}\n")
            raise
        with contextlib.suppress(OSError):
            mark.unlink()
    built = find_server(root, version)
    if built is None:  # pragma: no cover - we just wrote it
        raise UserError(f"{folder}: the build finished but its entry is incomplete")
    return built


def _build(folder: Path, base: Path, version: str) -> None:
    """Download (once), unpack and build the sources into the cache entry ``folder`` (under the lock)."""
    sdist = _sdist(base.parent, version)
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=base))
    try:
        src = _extract_vendor(sdist, work / "src", version)
        build_dir, log = work / "build", work / "build.log"
        jobs = _jobs()
        _say(f"building {SERVER_NAME} from {sdist.name} with {jobs} jobs (5-10 minutes; log {log})")
        _run(["cmake", "-S", str(src), "-B", str(build_dir), *CMAKE_FLAGS], log)
        _run(["cmake", "--build", str(build_dir), "--target", SERVER_NAME, "-j", str(jobs)], log)
        stage = work / "entry"
        (stage / "bin").mkdir(parents=True)
        (stage / "models").mkdir()
        shutil.copy2(build_dir / "bin" / SERVER_NAME, stage / "bin" / SERVER_NAME)
        for v in VOCAB_FILES:
            shutil.copy2(src / "models" / v, stage / "models" / v)
        shutil.copy2(src / "LICENSE", stage / "LICENSE")
        shutil.copy2(log, stage / "build.log")
        manifest = {
            "what": "llama.cpp's llama-server, built on this machine from source",
            "source": f"PyPI llama-cpp-python=={version} source distribution, vendor/llama.cpp/",
            "sdist_sha256": hashlib.sha256(sdist.read_bytes()).hexdigest(),
            "cmake_flags": list(CMAKE_FLAGS),
            "build_key": build_key(version),
            "compiler": _tool_version("c++"),
            "cmake": _tool_version("cmake"),
            "machine": platform.machine(),
            "build_seconds": round(time.monotonic() - t0, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "built_by": "python -m stagescope.service.llama_cpp.build",
            "vocab_files": list(VOCAB_FILES),
            "license": "llama.cpp is MIT-licensed: LICENSE beside this file",
        }
        (stage / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if folder.exists():  # a damaged earlier entry
            shutil.rmtree(folder)
        stage.rename(folder)
    except OSError as exc:
        raise UserError(f"cannot build llama.cpp's server under {base}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _say(f"built in {manifest['build_seconds']:.0f} s -> {folder}")


def main() -> int:
    """Build (or find) the server and print its path; one line and exit 2 on failure."""
    try:
        b = ensure_server(retry=True)  # asked for explicitly: an earlier failure is tried again
    except UserError as exc:
        print(f"llama.cpp build: error: {exc}", file=sys.stderr)
        return 2
    print(b.server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
