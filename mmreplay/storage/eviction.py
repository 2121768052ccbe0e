"""Eviction: which sealed segments go when a new one is made (capacity kept, Kafka-style retention).

Invariants: only sealed segments are evicted, oldest first, never an open one; the caller holds
``alloc.lock``; a departure is in the catalog (``catalog.py``) before its file is renamed
``.deleted``, and the catalog is fsynced before any such file is unlinked (``Doomed``), so no
file is ever gone while the catalog, after a power loss, could still list it as sealed. Writers
defer that fsync and the unlinks to a background thread (``defer=True``): an fsync on the writer's
thread cost ~12 ms per evicted segment on this machine kind, and a small store evicts one every
few thousand rows; the unlink of a file whose last mapping is gone frees its blocks, which is
kernel work best kept off the appending thread too.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

from ..core import failpoint as _failpoint
from ..core.errors import StoreFullError
from .format import STATE_SEALED
from .segment import parse_segment_name

if TYPE_CHECKING:
    from .catalog import Catalog
    from .files import StoreFiles

log = logging.getLogger(__name__)


class Doomed:
    """A store handle's evicted segment files, renamed ``.deleted`` and not unlinked yet."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._paths: deque[Path] = deque()
        self._lock = threading.Lock()  # one reap at a time: the fsync comes before its unlinks

    def __len__(self) -> int:
        return len(self._paths)

    def add(self, path: Path) -> None:
        self._paths.append(path)

    def reap(self) -> None:
        """fsync the catalog (the departures of these files are then durable), then unlink them.
        An interrupted reap leaves ``.deleted`` files, which recovery finishes."""
        with self._lock:
            paths = []
            while self._paths:
                paths.append(self._paths.popleft())
            if not paths:
                return
            self.catalog.sync()
            for p in paths:
                p.unlink(missing_ok=True)  # another process opening the store may finish it first


def evict_for_new_segment(store: StoreFiles, known: dict[str, int], *, force_one: bool = False,
                          pending_rows: int = 0, defer: bool = False) -> list[int]:
    """Delete the oldest sealed segments not needed to keep ``capacity`` rows (alloc.lock held).

    Rows held are the published rows of every segment, open ones included: then, with each
    writer calling this (through its next segment) once per segment and publishing first,
    a store holds at most ``capacity`` + one segment + one segment per writer.

    ``force_one`` deletes exactly the oldest sealed segment whatever the capacity (used
    when the disk is full and ``on_full='evict'``; its file is unlinked at once). ``pending_rows``:
    rows of segments made for one batch and not written yet (a batch spanning segments counts as
    held, so ``on_full='error'`` refuses it before any of it is written). ``defer``: leave the
    catalog fsync and the unlinks to the caller's ``store.doomed.reap()`` (a writer's background
    thread); else they are done here.
    """
    sealed: list[tuple[int, str, int]] = []
    held = pending_rows
    names = sorted(os.listdir(store.segments_dir))
    # known: this handle's memory of sealed segments' rows (immutable: each control page is read once)
    found: dict[str, int] = {}  # sealed segments this pass read for the first time
    for gone in known.keys() - set(names):
        del known[gone]
    for name in names:
        parsed = parse_segment_name(name)
        if parsed is None:
            continue
        committed = known.get(name)
        if committed is None:
            state, committed, _ = store.segment_state(store.segments_dir / name)
            if state == STATE_SEALED:
                known[name] = committed
                found[name] = committed  # sealed by recovery, an import, or before the catalog
        held += committed  # open segments' published rows count too (they cannot be evicted yet)
        if name in known:
            sealed.append((parsed[0], name, committed))
    if found:
        store.catalog.sealed_many(found)  # one write for all of them
    if store.on_full == "error" and not sealed and pending_rows > store.capacity:
        raise StoreFullError(f"{store.path} would hold {pending_rows} rows from one batch, capacity {store.capacity}, "
                             "and on_full='error'")
    doomed_names: list[tuple[int, str, int]] = []
    for sid, name, committed in sealed:
        if force_one and doomed_names:
            break
        if held - committed < store.capacity and not force_one:
            break
        if store.on_full == "error":
            raise StoreFullError(f"{store.path} holds {held} rows, capacity {store.capacity}, and on_full='error'")
        doomed_names.append((sid, name, committed))
        held -= committed
    if doomed_names:  # one write for all departures, before any file is renamed (fsynced by reap())
        store.catalog.departed([n for _, n, _ in doomed_names], "evicted", "disk" if force_one else "capacity",
                               sync=False)
    evicted: list[int] = []
    for sid, name, _ in doomed_names:
        doomed = store.segments_dir / (name + ".deleted")
        os.rename(store.segments_dir / name, doomed)
        if _failpoint.ACTIVE:
            _failpoint.hit("mid_evict")
        store.doomed.add(doomed)
        known.pop(name, None)
        evicted.append(sid)
    if evicted and (force_one or not defer):
        store.doomed.reap()  # a full disk needs the space now
    if evicted:
        try:
            store.catalog.compact_if_large(set(names) - {n for _, n, _ in doomed_names})
        except OSError:  # a full disk: the log stays as it is, and is compacted by a later pass
            pass
        # no directory fsync here (it queued behind the disk under alloc.lock, ~3 ms a segment):
        # the departures are fsynced by reap(), and the renames reach the disk with the next directory
        # fsync (a writer's next ``make_durable`` or ``flush``, a segment's durable close). After a
        # power loss before it, an evicted file may come back as ``.deleted`` (recovery removes
        # it) or under its name (it is then served and catalogued again, and the next eviction
        # takes it first: it is the oldest)
        log.debug("evicted segments %s from %s", evicted, store.path)
        if force_one and not store.warned_disk_full:  # once per store handle
            store.warned_disk_full = True
            log.warning("%s: the disk is full: the oldest segment was evicted to make room, so the store holds "
                        "fewer rows than its capacity (%s); `mmreplay info` counts these evictions", store.path,
                        f"{store.capacity:,}")
    return evicted
