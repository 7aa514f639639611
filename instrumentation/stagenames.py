"""Which stage names a process admits, and the kind of each: a team's own stages, bounded.

``stagescope.stage("rerank", kind="compute")`` records a stage under any name a team picks. The name
becomes the ``stage`` label of ``stagescope_stage_duration_seconds`` and the ``stagescope.stage``
attribute of a span, so it must be a sensible label value and the number of distinct names must
stay bounded whatever the code does (a name built from request data would otherwise add series
without end). Rules, checked once per distinct (name, kind) and then served from a cache:

* a name is 1 to 64 letters, digits and ``_ . : -`` starting with a letter or digit
  (:data:`~stagescope.names.STAGE_NAME_PATTERN`); ``unattributed`` and the overflow name are
  reserved. Anything else is a programmer error: ``ValueError``;
* ``kind`` is one of :data:`~stagescope.names.KINDS` (``ValueError`` listing them otherwise). A
  built-in stage implies its kind (:data:`~stagescope.names.STAGE_KINDS`; naming another is a
  ``ValueError``); a custom stage without one is ``unknown``: the analysis reports it and chooses no
  lever, and the process logs that once per name. One name has one kind per process (a second kind
  is a ``ValueError``), so the ``kind`` label adds no series to the ``stage`` label;
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


def _check_kind(kind: str | None) -> None:
    if kind is not None and kind not in _KIND_SET:
        raise ValueError(f"unknown stage kind {kind!r}; kinds are: {', '.join(N.KINDS)}")


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise ValueError(f"a stage name is a string, got {type(name).__name__} {name!r}")
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"stage name {name!r} is not a label value stagescope accepts: 1 to 64 letters, digits, "
            "'_', '.', ':' or '-', starting with a letter or digit (e.g. 'rerank', 'safety-filter')"
        )
    if name in N.RESERVED_STAGE_NAMES:
        raise ValueError(f"stage name {name!r} is reserved by stagescope; pick another")
    return name


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
        #: custom name -> its kind, in the order admitted
        self.custom: dict[str, str] = {}
        self.folded_names = 0  # distinct names folded (remembered ones only)
        self._fold_logged = False

    @staticmethod
    def _valid_cap(cap: int) -> int:
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise ValueError(f"max_custom_stages must be a whole number >= 0, got {cap!r}")
        return cap

    def set_max_custom(self, cap: int) -> None:
        """Change the cap; names already admitted keep theirs, names already folded stay folded."""
        with self._lock:
            self.max_custom = self._valid_cap(cap)

    def resolve(self, name: str, kind: str | None = None) -> tuple[str, str]:
        """``(name recorded, kind)`` for a stage called ``name`` with ``kind`` (None: the built-in
        stage's, else unknown); raises ``ValueError`` for a bad name or kind (module docstring)."""
        got = self._cache.get((name, kind))
        if got is not None:
            return got
        return self._resolve_new(name, kind)

    def _resolve_new(self, name: str, kind: str | None) -> tuple[str, str]:
        _check_kind(kind)
        builtin = N.STAGE_KINDS.get(name) if isinstance(name, str) else None
        if builtin is not None:  # only a conflicting kind reaches here
            raise ValueError(f"stage {name!r} is built in with kind {builtin!r}; got kind={kind!r}")
        _check_name(name)
        want = N.KIND_UNKNOWN if kind is None else kind
        with self._lock:
            have = self.custom.get(name)
            if have is not None:
                if have != want:
                    raise ValueError(
                        f"stage {name!r} already has kind {have!r} in this process; got "
                        f"kind={kind!r} (one kind per stage name)"
                    )
                out = (name, have)
            elif len(self.custom) < self.max_custom:
                self.custom[name] = want
                out = (name, want)
                if kind is None:
                    _log.warning(
                        "stagescope: stage %r has no kind, so the analysis will choose no lever for it; "
                        "name one: stagescope.stage(%r, kind=...) with one of %s",
                        name, name, ", ".join(N.KINDS),
                    )  # fmt: skip
            else:
                out = (N.STAGE_OVERFLOW, want)
                if not self._fold_logged:
                    self._fold_logged = True
                    _log.warning(
                        "stagescope: more than %d custom stage names in this process: %r and every "
                        "later new name are recorded as stage %r (counted in %s); raise %s or "
                        "instrument_app(max_custom_stages=...) if the names are few and fixed",
                        self.max_custom, name, N.STAGE_OVERFLOW, N.METRIC_STAGES_FOLDED,
                        N.ENV_MAX_CUSTOM_STAGES,
                    )  # fmt: skip
                if len(self._cache) >= _CACHE_LIMIT:
                    return out
                self.folded_names += 1
            self._cache[(name, kind)] = out
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
    """``stage_names().resolve(name, kind)``: the name recorded and its kind (its cache read here, one
    call less per ``stage()`` block)."""
    names = _NAMES or stage_names()
    got = names._cache.get((name, kind))
    return got if got is not None else names._resolve_new(name, kind)
