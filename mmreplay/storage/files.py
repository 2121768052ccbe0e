"""StoreFiles: a store's directory and the on-disk protocol over it, owned in one place.

A store is a directory::

    STORE.json        immutable manifest (and STORE.copy.json, the same bytes: ``manifest.py``)
    counters.bin      next segment id, two checksummed slots, under alloc.lock (``manifest.py``)
    CATALOG.log       every segment sealed and how it left (``catalog.py``)
    locks/            admin.lock (writers hold it shared), alloc.lock, ingest.lock, writer-NNN.lock
    segments/         NNNNNNNNNNNNN-wWWW.seg files; .tmp while being made, .deleted while evicted,
                      .corrupt once quarantined
    ingest.tmp/       segments being built whole before they are renamed in (``exchange.py``)

``StoreFiles`` holds the manifest's facts (schema, store uuid, layout, capacity), the lock files,
the segment-id counter, the catalog, segment states as their control pages say, and eviction.
A ``ReplayStore`` (the user's object), each ``Writer``, its ``SegmentSupply``, recovery, verify and
ingest hold one ``StoreFiles`` and ask it: none of them needs the whole store handle.

Invariants kept here:

* segment ids only grow: the counter is persisted before a segment is made, and an id is
  always above every id a file or the catalog names (a damaged counter is a cache, rebuilt);
* only the allocation/eviction critical section takes the store-wide ``alloc.lock``, for
  milliseconds; every lock name lives in ``locks.py`` and is taken through :meth:`lock`;
* a sealed segment is catalogued only while its file is there (an evicted one is never
  catalogued back to life).

Eviction (:func:`evict_for_new_segment`): which sealed segments go when a new one is made
(capacity kept, Kafka-style retention). Only sealed segments are evicted, oldest first, never an open one; the caller holds
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
from typing import TYPE_CHECKING, Any, Literal

from ..core import failpoint as _failpoint
from ..core import fs
from ..core.errors import CorruptStoreError, StoreFullError
from ..core.schema import Schema
from .catalog import Catalog, CatalogState
from .format import STATE_SEALED, Header, Layout
from .locks import ALLOC, LOCK_NAMES, FileLock
from .manifest import COUNTERS, MANIFEST, read_counter, write_counter
from .segment import parse_segment_name, segment_state

if TYPE_CHECKING:
    from collections.abc import Mapping

log = logging.getLogger(__name__)

OnFull = Literal["evict", "error"]


class StoreFiles:
    """The files of the store at ``path`` and the protocol over them (see the module docstring).

    ``manifest``: its checked manifest (``manifest.load_manifest``)."""

    def __init__(self, path: Path, manifest: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.manifest = dict(manifest)
        self.schema = Schema.from_json(manifest["schema"])
        if f"{self.schema.hash:016x}" != manifest["schema_hash"]:
            raise CorruptStoreError(f"{self.path / MANIFEST}: schema hash mismatch")
        self.store_uuid = bytes.fromhex(manifest["store_uuid"])
        self.segment_records = int(manifest["segment_records"])
        self.capacity = int(manifest["capacity"])
        self.on_full: OnFull = manifest.get("on_full", "evict")
        self.metadata: dict[str, Any] = manifest.get("metadata", {})
        self.layout = Layout.of(self.schema, self.segment_records)
        self.segments_dir = self.path / "segments"
        self.locks_dir = self.path / "locks"
        self.catalog = Catalog(self.path)
        self.doomed = Doomed(self.catalog)
        """Evicted files renamed ``.deleted``, not unlinked yet (``Doomed``, below)."""
        self.sealed_rows: dict[str, int] = {}
        """Committed rows of the sealed segments this handle has seen (immutable: each control page
        is read once), for eviction."""
        self.warned_disk_full = False
        """Eviction warns once per handle when a full disk evicts."""

    def segment_path(self, name: str) -> Path:
        return self.segments_dir / name

    # -- locks ------------------------------------------------------------------------------
    def lock(self, name: str) -> FileLock:
        """The store's lock file ``name`` (one of ``locks.LOCK_NAMES`` or a writer lock), not taken yet."""
        if name not in LOCK_NAMES and not name.startswith("writer-"):
            raise ValueError(f"unknown lock {name!r}; expected one of {LOCK_NAMES} or a writer lock")
        return FileLock(self.locks_dir / name)

    # -- segment ids and states -------------------------------------------------------------
    def allocate_segment_id(self, *, durable: bool = False) -> int:
        """Next segment id (caller holds alloc.lock).

        The id is above the counter, every segment file present and every id the catalog names,
        so ids never repeat even if a crash lost the counter's last update (the counter is then
        written without an fsync unless ``durable``) or damage destroyed it (it is rebuilt)."""
        path = self.path / COUNTERS
        try:
            value, version, slot = read_counter(path)
        except (CorruptStoreError, FileNotFoundError) as exc:  # a cache: rebuilt from every id the store has known
            log.warning("%s (rebuilt from the segment files and the catalog)", exc)
            value, version, slot = self.catalog.read().max_segment_id + 1, 0, None
        on_disk = [p[0] for n in os.listdir(self.segments_dir)
                   if (p := parse_segment_name(n.removesuffix(".deleted").removesuffix(".corrupt")))]
        value = max([value, *(i + 1 for i in on_disk)])
        write_counter(path, value + 1, version + 1, None if slot is None else 1 - slot, fsync=durable or slot is None)
        return value

    def segment_state(self, path: Path) -> tuple[int, int, int]:
        """``(state, committed, synced)`` from a segment's control page (0s if it is gone)."""
        return segment_state(path)

    # -- eviction and the catalog -------------------------------------------------------------
    def evict_for_new_segment(self, *, force_one: bool = False, pending_rows: int = 0, defer: bool = False) -> list[int]:
        """Delete the oldest sealed segments not needed to keep ``capacity`` rows (alloc.lock held);
        see :func:`evict_for_new_segment`."""
        return evict_for_new_segment(self, self.sealed_rows, force_one=force_one, pending_rows=pending_rows,
                                     defer=defer)

    def catalog_sealed(self, segments: dict[str, int], identities: dict[str, tuple[int, ...]] | None = None) -> None:
        """Catalogue sealed segments (name -> rows; ``identities``: their files' as their writer
        closed them) under ``alloc.lock``, the eviction lock, and only those whose files are there:
        a segment evicted meanwhile is never catalogued back to life."""
        lock = self.lock(ALLOC)
        lock.acquire(exclusive=True, blocking=True)
        try:
            present = set(os.listdir(self.segments_dir)) if len(segments) > 4 else {
                n for n in segments if os.path.exists(os.path.join(self.segments_dir, n))}
            self.catalog.sealed_many({n: r for n, r in segments.items() if n in present}, identities)
        finally:
            lock.release()

    def lost_segments(self, state: CatalogState | None = None) -> dict[str, int]:
        """Segments the catalog lists as sealed and never evicted or quarantined whose files are
        gone: name -> rows lost (``state``: a catalog read *after* the caller last listed the
        directory, else it is read now)."""
        # the directory is listed before the catalog is read: an eviction writes its departure before
        # the file goes, so a file missing from the listing has its departure in the catalog read after
        present = set(os.listdir(self.segments_dir))
        if state is None:
            if not self.catalog.path.exists():
                return {}
            state = self.catalog.read()
        return {name: rows for name, rows in state.live.items() if name not in present}


def chain_gaps(headers: list[Header], state: CatalogState, others: list[str], *,
               catalog_incomplete: bool) -> list[tuple[int, int, int, int]]:
    """Chain positions of writer sessions that no segment file holds and nothing explains:
    ``(writer id, session epoch, chain index, rows)``; for a store whose catalog is missing or cut
    (an intact catalog names every sealed segment, and its departures). A session writes its
    chain in order (segment ids rising along it) and moves on only from a full segment, so every
    position below the highest one present held ``usable_records`` rows. One between two present
    positions is explained by a departure line or a quarantined (``.corrupt``) file of that writer
    with an id between theirs (an eviction takes the oldest first, so never such a one); one before
    the first present position is an eviction or a loss, which only a catalog tells apart: each
    departed, quarantined or unreadable name of that writer with a lower id explains one, as does
    each eviction of the writer a compaction folded into a count (``folded_by_writer``); what is
    left is reported (the caller asks only when the catalog is missing or cut:
    ``catalog_incomplete``). ``others``: file and catalog names that may explain a position (departed,
    quarantined). Positions a repair acknowledged (``catalog.gap``) are left out. Segment ids have
    gaps by design (one store-wide counter); chain indices do not."""
    gone: dict[int, list[int]] = {}
    for n in others:
        parsed = parse_segment_name(n.split(".seg")[0] + ".seg") if ".seg" in n else None
        if parsed is not None:
            gone.setdefault(parsed[1], []).append(parsed[0])
    chains: dict[tuple[int, int], dict[int, int]] = {}
    usable: dict[tuple[int, int], int] = {}
    for h in headers:
        chains.setdefault((h.writer_id, h.session_epoch), {})[h.chain_index] = h.segment_id
        usable[(h.writer_id, h.session_epoch)] = h.usable_records
    out = []
    for (wid, epoch), have in sorted(chains.items()):
        present = sorted(have)
        for lo, hi in zip(present, present[1:]):
            if hi - lo > 1 and not any(have[lo] < i < have[hi] for i in gone.get(wid, ())):
                out += [(wid, epoch, ci, usable[(wid, epoch)]) for ci in range(lo + 1, hi)]
        if catalog_incomplete:  # each file of that writer gone, quarantined or unreadable before the first explains one
            explained = sum(1 for i in gone.get(wid, ()) if i < have[present[0]]) + state.folded_by_writer.get(wid, 0)
            out += [(wid, epoch, ci, usable[(wid, epoch)]) for ci in range(max(0, present[0] - explained))]
    return [g for g in out if g[:3] not in state.gaps]


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
                fs.unlink(p)  # another process opening the store may finish it first


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
        fs.rename(store.segments_dir / name, doomed)
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
