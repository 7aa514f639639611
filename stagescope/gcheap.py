"""Keeping the garbage collector's full passes off the path a process measures or serves.

CPython's cyclic collector walks every object it tracks on each full (generation 2) collection, and
a full collection runs whenever enough long-lived objects pile up. In a web service nearly all of
them are the startup heap (modules, classes, functions, pydantic and FastAPI schemas): the reference
service has about 72,000 tracked objects once it is ready, and each full collection during traffic
paused its event loop for 55-73 ms on this project's 2-core machine (``gc.callbacks``, three
``make demo`` runs), so every request in flight took the pause; one such pause was the whole miss of
a ``make demo`` lever check (requests 75 ms outside every stage). The load generator's process has
about 118,000 and its full collections took 145-160 ms, which would land in the latencies it reports.

:func:`freeze_startup_heap` collects once and moves every surviving object into the permanent
generation (``gc.freeze``), which later collections skip: what vLLM does after its server's
initialisation and warm-up (``vllm/utils/gc_utils.py``, ``freeze_gc_heap``). Objects made afterwards
are still tracked and collected; this is not ``gc.disable()``.

:func:`frozen_heap` freezes for the length of a ``with`` block and unfreezes after it, without the
collection first: in a large process (a notebook, a test session) a full collection can take seconds,
which a run must not wait for, and what garbage the freeze holds goes back to the oldest generation,
and is collected there, when the block ends. (A make test session's first version collected first,
and a load run stopped 0.6 s after it was called had not sent a request yet.)
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["freeze_startup_heap", "frozen_heap"]


def freeze_startup_heap() -> int:
    """Collect garbage, then freeze what is alive into the permanent generation; the objects frozen."""
    gc.collect()  # what is garbage now must not become permanent
    gc.freeze()
    return gc.get_freeze_count()


@contextmanager
def frozen_heap() -> Iterator[int]:
    """Freeze every tracked object for the block (yields the count frozen), ``gc.unfreeze()`` after.

    No collection first (see the module docstring): ``gc.freeze()`` alone moves the generations' lists
    and costs next to nothing however large the heap."""
    was_frozen = gc.get_freeze_count()
    gc.freeze()
    count = gc.get_freeze_count()
    try:
        yield count
    finally:
        if not was_frozen:  # a process that froze its own heap before keeps it frozen
            gc.unfreeze()
