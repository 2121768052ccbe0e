"""The two claims a writer session makes on a store: a writer id, and each new segment's id.

* :func:`claim_writer_id` takes a writer id's lock (``locks.writer_lock_name``): the one claim
  loop, for a ``Writer`` and for an ingest session alike. The lock is an ``flock``, so a killed
  session's id is free at once.
* :func:`allocating` is the one evict-then-allocate step: under the store-wide ``alloc.lock``,
  delete the oldest sealed segments capacity no longer needs, then take the next segment id;
  the lock stays held while the caller makes the segment file (a writer) or is released at
  once (an ingest, which builds its segment in a staging directory and renames it in).
"""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..core.errors import WriterBusyError
from .locks import ALLOC, writer_lock_name
from .segment import now_ns

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .files import StoreFiles
    from .locks import FileLock

MAX_WRITERS = 1000


def claim_writer_id(store: StoreFiles, writer_id: int | None = None, role: str = "") -> tuple[int, FileLock]:
    """Take writer id ``writer_id`` (``None``: the lowest free one) of ``store``: its lock, held
    until released, with the owner's pid, host and start time (and ``role``) written in it.

    Raises ``WriterBusyError`` if that id (or every id) is held by a live session.
    """
    if writer_id is not None and not 0 <= writer_id < MAX_WRITERS:
        raise ValueError(f"`writer_id` must be in [0, {MAX_WRITERS}), got {writer_id}")
    ids = range(MAX_WRITERS) if writer_id is None else (int(writer_id),)
    for wid in ids:
        lock = store.lock(writer_lock_name(wid))
        # (an explicit id is tried 3 times 1 ms apart: a reader's probe of a dead writer's lock, ``locks.held_elsewhere``,
        # holds it shared for microseconds; a live session holds it for good)
        if lock.acquire(exclusive=True) or (writer_id is not None and _retry(lock)):
            tail = f" {role}" if role else ""
            lock.write_owner(f"pid={os.getpid()} host={socket.gethostname()} start_ns={now_ns()}{tail}\n")
            return wid, lock
    if writer_id is not None:
        raise WriterBusyError(f"writer id {writer_id} of {store.path} is held by a live writer session")
    raise WriterBusyError(f"all {MAX_WRITERS} writer ids of {store.path} are busy")


def _retry(lock: FileLock, tries: int = 3, pause_s: float = 0.001) -> bool:
    import time

    for _ in range(tries):
        time.sleep(pause_s)
        if lock.acquire(exclusive=True):
            return True
    return False


@contextmanager
def allocating(store: StoreFiles, *, pending_rows: int = 0, durable: bool = False,
               defer: bool = False) -> Iterator[int]:
    """Under ``alloc.lock``: evict what capacity requires, then yield a new segment id.

    ``pending_rows``: rows of segments already made for the same batch and not written yet
    (counted as held). ``durable``: fsync the id counter. ``defer``: evicted files are unlinked
    by the caller's ``files.doomed.reap()`` (``files.py``). The lock is held until the block
    ends, so the caller makes its segment file before another allocation's eviction counts.
    """
    alloc = store.lock(ALLOC)
    alloc.acquire(exclusive=True, blocking=True)
    try:
        store.evict_for_new_segment(pending_rows=pending_rows, defer=defer)
        yield store.allocate_segment_id(durable=durable)
    finally:
        alloc.release()
