"""StoreFiles: a store's directory and the on-disk protocol over it, owned in one place.

A store is a directory::

    STORE.json        immutable manifest (and STORE.copy.json, the same bytes: ``manifest.py``)
    counters.bin      next segment id, two checksummed slots, under alloc.lock (``manifest.py``)
    CATALOG.log       every segment sealed and how it left (``catalog.py``)
    locks/            admin.lock (writers hold it shared), alloc.lock, ingest.lock, writer-NNN.lock
    segments/         NNNNNNNNNNNNN-wWWW.seg files; .tmp while being made, .deleted while evicted,
                      .corrupt once quarantined
    ingest.tmp/       segments being built whole before they are renamed in (``ingest.py``)

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
  catalogued back to life), and eviction records a departure before a file goes (``eviction.py``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..core.errors import CorruptStoreError
from ..core.schema import Schema
from .catalog import Catalog, CatalogState
from .eviction import Doomed
from .format import Layout
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
        """Evicted files renamed ``.deleted``, not unlinked yet (``eviction.py``)."""
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
        see :func:`mmreplay.storage.eviction.evict_for_new_segment`."""
        from .eviction import evict_for_new_segment

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
