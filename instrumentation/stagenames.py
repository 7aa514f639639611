"""Which stage names a process admits, and the kind of each: a team's own stages, bounded.

``stagescope.stage("rerank", kind="compute")`` records a stage under any name a team picks. The name
becomes the ``stage`` label of ``stagescope_stage_duration_seconds`` and the ``stagescope.stage``
attribute of a span, so it must be a sensible label value and the number of distinct names must
stay bounded whatever the code does (a name built from request data would otherwise add series
without end). Rules, checked once per distinct (name, kind) and then served from a cache:

* a name is 1 to 64 letters, digits and ``_ . : -`` starting with a letter or digit
  (:data:`~stagescope.names.STAGE_NAME_PATTERN`); ``unattributed`` and the overflow name are
  reserved;
* ``kind`` is one of :data:`~stagescope.names.KINDS`. A built-in stage implies its kind
  (:data:`~stagescope.names.STAGE_KINDS`); a custom stage without one is ``unknown``: the analysis
  reports it and chooses no lever, and the process logs that once per name. One name has one kind per
  process, so the ``kind`` label adds no series to the ``stage`` label;
* breaking those rules is a programmer error, but telemetry must never fail a request: on the request
  path (``stage()``, ``add_stage``: :func:`resolve_stage`) the stage is recorded anyway
  (:meth:`StageNames._lenient`: a bad kind as the name's kind, else ``unknown``; a kind other than the
  name's as the name's; a bad name as the overflow name), with one warning per distinct mistake that
  lists the kinds, and counted (``stagescope_stage_kind_errors_total``; bad names in
  ``stagescope_stages_folded_total``). :meth:`StageNames.resolve` (``strict``, the default) and
  ``record.validate_stage`` raise ``ValueError`` instead, for checks where stages are declared;
* the first ``max_custom`` custom names (argument to :func:`configure` or ``instrument_app``, else
  ``$STAGESCOPE_MAX_CUSTOM_STAGES``, else :data:`~stagescope.names.DEFAULT_MAX_CUSTOM_STAGES`) keep
  their name; later new names are recorded as :data:`~stagescope.names.STAGE_OVERFLOW` with their
  own kind, one log line says so the first time, and every folded interval is counted in
  ``stagescope_stages_folded_total``. Built-in stages never count against the cap.
"""

from __future__ import annotations

import logging
import os
import re
import threading

from stagescope import names as N

__all__ = ["StageNames", "configure", "resolve_stage", "stage_names"]

_log = logging.getLogger("stagescope.instrumentation")
_NAME = re.compile(N.STAGE_NAME_PATTERN)
_KIND_SET = frozenset(N.KINDS)
#: Past this many remembered (name, kind) pairs, folded names are checked again on each use instead
#: of being remembered (a name built from request data must not grow the cache without end).
_CACHE_LIMIT = 4096


def _cap_from_env() -> int:
    raw = os.environ.get(N.ENV_MAX_CUSTOM_STAGES, "").strip()
    if not raw:
        return N.DEFAULT_MAX_CUSTOM_STAGES
    try:
        cap = int(raw)
    except ValueError:
        cap = -1
    if cap < 0:
        _log.warning(
            "stagescope: %s=%r is not a whole number >= 0; using %d",
            N.ENV_MAX_CUSTOM_STAGES, raw, N.DEFAULT_MAX_CUSTOM_STAGES,
        )  # fmt: skip
        return N.DEFAULT_MAX_CUSTOM_STAGES
    return cap


def _kind_problem(kind: object) -> str | None:
    if kind is None or (isinstance(kind, str) and kind in _KIND_SET):
        return None
    return f"unknown stage kind {kind!r}; kinds are: {', '.join(N.KINDS)}"


def _name_problem(name: object) -> str | None:
    if not isinstance(name, str):
        return f"a stage name is a string, got {type(name).__name__} {name!r}"
    if not _NAME.fullmatch(name):
        return (
            f"stage name {name!r} is not a label value stagescope accepts: 1 to 64 letters, digits, "
            "'_', '.', ':' or '-', starting with a letter or digit (e.g. 'rerank', 'safety-filter')"
        )
    if name in N.RESERVED_STAGE_NAMES:
        return f"stage name {name!r} is reserved by stagescope; pick another"
    return None


def _count_kind_error() -> None:
    """One more in ``stagescope_stage_kind_errors_total`` of the installed StageMetrics (if any)."""
    from stagescope.instrumentation import metrics

    installed = metrics._default
    if installed is not None:
        installed.stage_kind_error()


class StageNames:
    """The stage names of one process (see the module docstring); :func:`stage_names` is the one
    the API uses. ``max_custom``: custom names kept before folding (None: environment, default)."""

    def __init__(self, max_custom: int | None = None) -> None:
        self._lock = threading.Lock()
        self.max_custom = _cap_from_env() if max_custom is None else self._valid_cap(max_custom)
        #: (name, kind argument) -> (recorded name, kind); the fast path of :meth:`resolve`
        self._cache: dict[tuple[str, str | None], tuple[str, str]] = {
            (s, k): (s, N.STAGE_KINDS[s]) for s in N.STAGES for k in (None, N.STAGE_KINDS[s])
        }
        #: name -> what ``_cache[(name, None)]`` holds: ``stage(name)`` without a kind reads it with no
        #: tuple to build and hash (filled and bounded with ``_cache``)
        self._plain: dict[str, tuple[str, str]] = {s: (s, N.STAGE_KINDS[s]) for s in N.STAGES}
        #: custom name -> its kind, in the order admitted
        self.custom: dict[str, str] = {}
        self.folded_names = 0  # distinct names folded (remembered ones only)
        self._fold_logged = False
        self._lenient_logged: set[tuple[str, str]] = set()  # bad kinds, names, conflicts warned about

    @staticmethod
    def _valid_cap(cap: int) -> int:
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise ValueError(f"max_custom_stages must be a whole number >= 0, got {cap!r}")
        return cap

    def set_max_custom(self, cap: int) -> None:
        """Change the cap; names already admitted keep theirs, names already folded stay folded."""
        with self._lock:
            self.max_custom = self._valid_cap(cap)

    def resolve(self, name: str, kind: str | None = None, *, strict: bool = True) -> tuple[str, str]:
        """``(name recorded, kind)`` for a stage called ``name`` with ``kind`` (None: the built-in
        stage's, else unknown). A bad name or kind (module docstring) raises ``ValueError`` when
        ``strict``; otherwise it is recorded anyway, as :meth:`_lenient` says, and logged once."""
        try:
            got = self._cache.get((name, kind))
        except TypeError:  # an unhashable name or kind: a bad one
            got = None
        if got is not None:
            return got
        return self._resolve_new(name, kind, strict)

    def _resolve_new(self, name: str, kind: str | None, strict: bool = True) -> tuple[str, str]:
        problem = _kind_problem(kind)
        if problem is not None:
            return self._reject(name, kind, problem, strict)
        builtin = N.STAGE_KINDS.get(name) if isinstance(name, str) else None
        if builtin is not None:  # only a conflicting kind reaches here
            return self._reject(name, kind, f"stage {name!r} is built in with kind {builtin!r}; got kind={kind!r}", strict)
        problem = _name_problem(name)
        if problem is not None:
            return self._reject(name, kind, problem, strict)
        want = N.KIND_UNKNOWN if kind is None else kind
        with self._lock:
            have = self.custom.get(name)
            if have is not None and have != want:
                problem = (
                    f"stage {name!r} already has kind {have!r} in this process; got "
                    f"kind={kind!r} (one kind per stage name)"
                )
            elif have is not None:
                out = (name, have)
            else:
                out = self._admit(name, want)
                if kind is None and out[0] == name:
                    _log.warning(
                        "stagescope: stage %r has no kind, so the analysis will choose no lever for it; "
                        "name one: stagescope.stage(%r, kind=...) with one of %s",
                        name, name, ", ".join(N.KINDS),
                    )  # fmt: skip
                if out[0] == N.STAGE_OVERFLOW:
                    if len(self._cache) >= _CACHE_LIMIT:
                        return out
                    self.folded_names += 1
            if problem is None:
                self._cache[(name, kind)] = out
                if kind is None:
                    self._plain[name] = out
        if problem is not None:  # _lenient takes the lock itself
            return self._reject(name, kind, problem, strict)
        return out

    def _reject(self, name: object, kind: object, problem: str, strict: bool) -> tuple[str, str]:
        """A stage call with a programmer error in it: ``ValueError`` when ``strict``, else recorded anyway
        (:meth:`_lenient`)."""
        if strict:
            raise ValueError(problem)
        return self._lenient(name, kind, problem)

    def _admit(self, name: str, kind: str) -> tuple[str, str]:
        """A new custom name (under the lock): kept with ``kind`` while under the cap, else folded."""
        if len(self.custom) < self.max_custom:
            self.custom[name] = kind
            return name, kind
        if not self._fold_logged:
            self._fold_logged = True
            _log.warning(
                "stagescope: more than %d custom stage names in this process: %r and every "
                "later new name are recorded as stage %r (counted in %s); raise %s or "
                "instrument_app(max_custom_stages=...) if the names are few and fixed",
                self.max_custom, name, N.STAGE_OVERFLOW, N.METRIC_STAGES_FOLDED,
                N.ENV_MAX_CUSTOM_STAGES,
            )  # fmt: skip
        return N.STAGE_OVERFLOW, kind

    def _lenient(self, name: object, kind: object, problem: str) -> tuple[str, str]:
        """Where a stage with a programmer error in its name or kind is recorded on the request path
        (a request must not fail for its telemetry): a name that is no label value as
        :data:`~stagescope.names.STAGE_OVERFLOW` (counted in ``stagescope_stages_folded_total``); a kind
        outside the list as the name's kind if it has one (built in, or given before in this process),
        else ``unknown``; a kind other than the name's as the name's (one kind per name). Kind errors
        count in ``stagescope_stage_kind_errors_total``. One warning per distinct bad kind or name, or
        conflicting (name, kind). Not cached: every such call is counted."""
        kind_ok = _kind_problem(kind) is None
        name_ok = _name_problem(name) is None or (isinstance(name, str) and name in N.STAGE_KINDS)
        if not name_ok:
            out = (N.STAGE_OVERFLOW, str(kind) if kind is not None and kind_ok else N.KIND_UNKNOWN)
            key: tuple[str, str] = ("name", repr(name)[:80])
            then = f"recorded as stage {N.STAGE_OVERFLOW!r} (counted in {N.METRIC_STAGES_FOLDED})"
        else:
            assert isinstance(name, str)
            builtin = N.STAGE_KINDS.get(name)
            if builtin is not None:
                out = (name, builtin)
            else:
                with self._lock:
                    have = self.custom.get(name)
                    out = (name, have) if have is not None else self._admit(name, N.KIND_UNKNOWN)
            key = ("kind", repr(kind)[:80]) if not kind_ok else ("conflict", f"{name}\0{kind}")
            then = f"recorded as kind {out[1]!r} (counted in {N.METRIC_STAGE_KIND_ERRORS})"
        if not kind_ok or name_ok:
            _count_kind_error()
        with self._lock:
            fresh = key not in self._lenient_logged and len(self._lenient_logged) < _CACHE_LIMIT
            if fresh:
                self._lenient_logged.add(key)
        if fresh:
            _log.warning(
                "stagescope: %s: %s so that the request goes on; fix the stage call (further uses not logged)",
                problem, then,
            )  # fmt: skip
        return out


_NAMES: StageNames | None = None
_NAMES_LOCK = threading.Lock()


def stage_names() -> StageNames:
    """The process's :class:`StageNames`, built on first use (reads the environment then)."""
    global _NAMES
    if _NAMES is None:
        with _NAMES_LOCK:
            if _NAMES is None:
                _NAMES = StageNames()
    return _NAMES


def configure(max_custom: int | None = None) -> StageNames:
    """Set the process's cap of custom stage names (None: leave it); returns the registry."""
    names = stage_names()
    if max_custom is not None:
        names.set_max_custom(max_custom)
    return names


def resolve_stage(name: str, kind: str | None = None) -> tuple[str, str]:
    """``stage_names().resolve(name, kind, strict=False)``, what ``stage()`` and ``add_stage`` call on the
    request path: the name recorded and its kind; a bad name or kind is recorded anyway and logged
    once, never raised (its cache read here, one call less per ``stage()`` block)."""
    names = _NAMES or stage_names()
    try:
        got = names._cache.get((name, kind))
    except TypeError:  # an unhashable name or kind
        got = None
    return got if got is not None else names._resolve_new(name, kind, False)
