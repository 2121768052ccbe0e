"""The writer's publisher thread: rows a writer left unpublished are published within its interval.

Invariant: the thread only ever publishes under the writer's mutex, and ends at ``close()``
(which sets ``_stop`` before ``_wake``, so a clear of ``_wake`` here cannot lose the signal).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .writer import Writer


def publisher_loop(w: Writer) -> None:
    """Publish rows left unpublished for ``publish_interval_s``. The thread sleeps until rows are
    staged (``_wake``), never on a timer: waking every few ms cost a CPU-bound actor loop ~10%
    (GIL handoffs; CartPole, ``python benchmarks/collect.py`` when this was written)."""
    interval = w.publish_interval_s
    while not w._stop.is_set():  # close() sets _stop, then _wake: a clear below cannot lose it
        w._wake.wait()
        if w._stop.is_set():
            return
        delay = w._staged_at + interval - time.monotonic()
        if delay > 0 and w._stop.wait(delay):
            return
        with w._mutex:
            if w._closed or w._failed is not None:
                return
            if not w._segs or w._n == w._pub:
                w._wake.clear()  # published by an add meanwhile: sleep until rows are staged again
            elif time.monotonic() - w._staged_at >= interval:
                try:
                    w._publish()
                except BaseException as exc:  # pragma: no cover - I/O failure
                    w._failed = exc
                    return
                w._wake.clear()
