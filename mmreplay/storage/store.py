"""ReplayStore: the user's object: create and open a store, write, read, inspect, close.

The store's directory and the protocol over its files (locks, the segment-id counter, the
catalog, eviction) belong to ``StoreFiles`` (``files.py``), which a ``ReplayStore`` holds as
``files`` and hands to its writers, recovery and verify; reading is ``StoreReader``'s
(``reader.py``). What is left here is the user's surface: ``create_store`` / ``open_store``,
``writer``, ``refresh``, ``transitions`` / ``rows``, ``info``, ``verify`` / ``repair``, ``close``.

Invariants kept here:

* ``create_store`` fails if the path exists; the manifest is written temp → fsync → rename (its
  copy first) and the directory only becomes a store once STORE.json is in place;
* opening reads only the manifest and each segment's first two pages: it costs the same for a
  thousand rows or a hundred million; a writable open runs recovery first (``recovery.py``);
* a store handle is used only in the process that opened it (never after ``fork()``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from pathlib import Path
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..core.version import __version__
from .format import MASKED, STATE_SEALED, Layout
from ..core.fs import atomic_write, fsync_dir, writable_error
from ..core.errors import (
    ReadOnlyStoreError,
    SchemaError,
    StoreClosedError,
    StoreExistsError,
)
from .files import OnFull, StoreFiles
from .manifest import (
    COUNTERS,
    MANIFEST,
    MANIFEST_COPY,
    STORE_FORMAT,
    STORE_MAGIC,
    default_segment_records,
    manifest_bytes,
    load_manifest,
    restore_manifest,
    write_counter,
)
from .reader import StoreReader
from ..core.schema import Schema
from .catalog import CatalogState, short_list
from .checks import Checker

if TYPE_CHECKING:
    from collections.abc import Callable
    from .writer import Durability, Writer

log = logging.getLogger(__name__)


def create_store(
    path: str | os.PathLike[str],
    schema: Schema,
    capacity: int = 1_000_000,
    *,
    segment_records: int | None = None,
    on_full: OnFull = "evict",
    metadata: dict[str, Any] | None = None,
    writers: int = 1,
) -> ReplayStore:
    """Create a new store at ``path`` (which must not exist) and open it with ``mode="a"``.

    Parameters
    ----------
    capacity
        Rows kept once full: when a new segment is needed, the oldest sealed segments are
        deleted while the others still hold at least ``capacity`` rows (``on_full="evict"``),
        or ``StoreFullError`` is raised (``on_full="error"``).
    segment_records
        Rows per segment file (a writer with ``lanes`` lanes uses ``segment_records // lanes *
        lanes``). A full store holds at most ``capacity + (writers + 1) * segment_records``
        rows; the default, ``capacity // (4 * (writers + 1)) + 1024`` (at most ~32 MiB a
        segment), keeps that under ``1.25 * capacity + (writers + 1) * 1024``.
    writers
        Writers expected to append at once: it only sizes the default segments.
    metadata
        JSON-serialisable facts about the data (env id, policy, seeds), kept in the manifest.

    Example
    -------
    A store of CartPole-sized rows, written by a writer with two lanes (two env copies):

    >>> import tempfile
    >>> import numpy as np
    >>> import mmreplay
    >>> path = tempfile.mkdtemp() + "/replay"  # a path that does not exist yet
    >>> schema = mmreplay.Schema.transition(obs_shape=(4,))  # obs float32 (4,), action int64
    >>> store = mmreplay.create_store(path, schema, capacity=10_000)
    >>> with store.writer(lanes=2) as w:
    ...     for t in range(100):
    ...         w.add(obs=np.full((2, 4), t, np.float32), action=np.zeros(2, np.int64),
    ...               reward=np.ones(2, np.float32), terminated=np.zeros(2, bool), truncated=np.zeros(2, bool))
    >>> store.num_rows, len(store.transition_ids())  # a lane's last row starts no transition yet
    (200, 198)
    >>> store.close()
    """
    p = Path(path)
    if not isinstance(schema, Schema):
        raise SchemaError(f"`schema` must be a mmreplay.Schema, got {type(schema).__name__}")
    if segment_records is None:
        segment_records = default_segment_records(schema, capacity, writers)
    segment_records = int(segment_records)
    if segment_records < 1:
        raise ValueError(f"`segment_records` must be >= 1, got {segment_records}")
    if capacity < 1:
        raise ValueError(f"`capacity` must be >= 1, got {capacity}")
    if on_full not in ("evict", "error"):
        raise ValueError(f"`on_full` must be 'evict' or 'error', got {on_full!r}")
    try:
        p.mkdir(parents=True, exist_ok=False)
    except FileExistsError:
        raise StoreExistsError(f"{p} already exists") from None
    except OSError as exc:
        raise writable_error(exc, p) from exc
    (p / "segments").mkdir()
    (p / "locks").mkdir()
    write_counter(p / COUNTERS, 0, 1)
    body = {
        "magic": STORE_MAGIC,
        "format_version": STORE_FORMAT,
        "store_uuid": uuid.uuid4().hex,
        "schema": schema.to_json(),
        "schema_hash": f"{schema.hash:016x}",
        "segment_records": segment_records,
        "capacity": int(capacity),
        "on_full": on_full,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "mmreplay_version": __version__,
        "metadata": metadata or {},
    }
    atomic_write(p / MANIFEST_COPY, manifest_bytes(body))  # the copy first: a store is a directory with STORE.json
    atomic_write(p / MANIFEST, manifest_bytes(body))
    fsync_dir(p.parent if str(p.parent) else Path("."))
    return ReplayStore(p, "a")


MAP_AHEAD_MIN_BYTES = 64 << 20
"""Smallest store ``map_pages(background=True)`` maps ahead."""


def open_store(
    path: str | os.PathLike[str],
    mode: Literal["r", "a"] = "r",
    *,
    on_corrupt: Literal["raise", "skip"] = "skip",
    verify: Literal["off", "strict", "salvage"] = "off",
    check_at_open: bool | None = None,
) -> ReplayStore:
    """Open an existing store: ``"r"`` to read (no locks, no writes) or ``"a"`` to also write.

    ``on_corrupt``: a segment file with a bad header, wrong size or foreign origin is left out
    and reported (``"skip"``, the default: damage to one file costs that file's rows, never the
    store; ``info()["unreadable_segments"]`` lists it and ``verify --repair`` quarantines it), or
    raises ``CorruptSegmentError`` (``"raise"``).

    Sealed segments, and open segments whose writer is dead (no process holds its lock: killed, or
    gone with a power loss), are always checked once before their rows are served (``mmreplay.storage.checks``;
    ``check_at_open``: start those checks at open, the default for ``"r"``, or at the first
    ``refresh()``, the default for ``"a"``). ``verify`` is about rows of segments being written:
    ``"off"`` (default) serves them as their writer published them; ``"strict"`` checks each one's
    stamp and crc32c before it becomes visible and raises ``CorruptSegmentError`` on a mismatch;
    ``"salvage"`` leaves the damaged rows (and the rest of their segment) out.

    Example
    -------
    >>> import tempfile
    >>> import mmreplay
    >>> path = tempfile.mkdtemp() + "/replay"
    >>> mmreplay.create_store(path, mmreplay.Schema.transition(obs_shape=(4,)), capacity=10_000).close()
    >>> store = mmreplay.open_store(path)  # "r": read, in any process, while writers append
    >>> store.schema.names, store.num_rows
    (('obs', 'action', 'reward', 'terminated', 'truncated'), 0)
    >>> store.close()
    >>> with mmreplay.open_store(path, mode="a") as store:  # "a": write too
    ...     with store.writer(cast="same_kind") as w:  # lists of Python floats: float64, cast to float32
    ...         w.add(obs=[[0.0, 0, 0, 0]], action=[1], reward=[1.0], terminated=[False], truncated=[False])
    ...     store.num_rows
    1
    """
    for name, value, allowed in (("verify", verify, ("off", "strict", "salvage")), ("mode", mode, ("r", "a")),
                                 ("on_corrupt", on_corrupt, ("raise", "skip"))):
        if value not in allowed:
            raise ValueError(f"`{name}` must be {' or '.join(map(repr, allowed))}, got {value!r}")
    return ReplayStore(Path(path), mode, on_corrupt=on_corrupt, verify=verify, check_at_open=check_at_open)


class ReplayStore:
    """An open store. Use :func:`create_store` / :func:`open_store` to get one.

    Reading: :meth:`refresh` picks up what writers published; samplers draw row ids and
    :meth:`transitions` turns them into batches. Writing: :meth:`writer` opens a writer
    session with its own lanes and segments. Not to be used after ``fork()``. Its attributes are
    to read, not to set: the manifest fixes most of them at creation.
    """

    manifest: dict[str, Any]
    """The manifest (``STORE.json``) as read at open."""
    schema: Schema
    """The fields of a row."""
    store_uuid: str
    """The store's identity, written in every segment header."""
    layout: Layout
    """The segment file layout (offsets and strides of every column; ``mmreplay.storage.format``)."""
    segment_records: int
    """Rows per segment file."""
    capacity: int
    """Rows kept once full (see ``create_store``)."""
    on_full: OnFull
    """``"evict"`` or ``"error"``: what a writer does when a new segment would pass ``capacity``."""
    metadata: dict[str, Any]
    """The facts about the data given at creation (``create_store(metadata=)``)."""

    def __init__(self, path: Path, mode: Literal["r", "a"], *, on_corrupt: Literal["raise", "skip"] = "skip",
                 verify: Literal["off", "strict", "salvage"] = "off", check_at_open: bool | None = None) -> None:
        self.path = path
        """The store's directory."""
        self.mode = mode
        """``"r"`` (read only) or ``"a"`` (read and write)."""
        m, damaged = load_manifest(path)
        if damaged and MANIFEST in damaged:
            log.warning("%s is %s: its copy %s is used (a writable open or `mmreplay verify --repair` writes it "
                        "back)", path / MANIFEST, "damaged" if (path / MANIFEST).exists() else
                        "missing (a store still being created, or a lost file)", MANIFEST_COPY)
        self.manifest_restored: list[str] = []
        """Manifest files a writable open wrote back from the other copy (``verify --repair`` says so)."""
        if damaged and mode == "a" and os.access(path, os.W_OK):
            restore_manifest(path, m, damaged)
            self.manifest_restored = damaged
        self.files = StoreFiles(path, m)
        """The store's files and the protocol over them (``files.py``): for the storage room and tools."""
        f = self.files
        self.manifest, self.schema, self.store_uuid, self.layout = f.manifest, f.schema, f.store_uuid, f.layout
        self.segment_records, self.capacity, self.on_full, self.metadata = (f.segment_records, f.capacity,
                                                                           f.on_full, f.metadata)
        self.segments_dir = f.segments_dir
        """The directory of the segment files (``<path>/segments``)."""
        self._pid = os.getpid()
        self._writers: list[Writer] = []
        self.recovery_report: Any = None
        """What recovery did at a ``mode="a"`` open (``mmreplay.storage.recovery.RecoveryReport``)."""
        if mode == "a":
            if not os.access(path, os.W_OK) or not os.access(self.segments_dir, os.W_OK):
                raise ReadOnlyStoreError(f"{path} is read-only here (filesystem or permissions): no row can be added",
                                         hint="read it with mode='r', or copy it to a writable filesystem to add rows")
            from .recovery import recover_abandoned

            self.recovery_report = recover_abandoned(self.files)
            _say_recovered(path, self.recovery_report)
        windows = max(16, 2 * (-(-self.capacity // self.segment_records)) + 8)
        checker = Checker(self.segments_dir, self.layout, self.store_uuid, self.schema.hash, f.catalog,
                          writable=mode == "a")
        self.reader = StoreReader(self.segments_dir, self.layout, self.store_uuid, self.schema.hash,
                                  initial_windows=min(windows, max(16, (1 << 44) // self.layout.file_size)),
                                  on_corrupt=on_corrupt, verify=verify, checker=checker)
        """This process's view of the segments (``mmreplay.storage.reader.StoreReader``): the snapshot,
        the row gathers and the checks the samplers use; ``None`` once the store is closed."""
        self._dirty = False  # a writer of this handle published rows
        self._need_scan = False  # a writer of this handle made a segment
        # a writable handle checks sealed segments it has not seen written at its first refresh,
        # not here: a process that only writes never reads (nor checks) a row
        self.reader.refresh(checks=mode == "r" if check_at_open is None else check_at_open)
        self._check_catalog()

    # -- lifecycle ------------------------------------------------------------------------
    def _check(self) -> None:
        if self._pid != os.getpid():
            raise StoreClosedError("store used after fork(); open it again in the child process")
        if self.reader is None:
            raise StoreClosedError("store is closed")

    def close(self) -> None:
        """Close every writer of this handle (cleanly) and unmap the segments."""
        for w in list(self._writers):
            w.close()
        if self.reader is not None and self._pid == os.getpid():
            self.reader.close()
        self.reader = None  # type: ignore[assignment]

    def __enter__(self) -> ReplayStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ReplayStore({str(self.path)!r}, mode={self.mode!r}, rows={self.num_rows})"

    # -- writing --------------------------------------------------------------------------
    def writer(
        self,
        lanes: int = 1,
        *,
        writer_id: int | None = None,
        durability: Durability = "segment",
        cast: Literal["no", "safe", "same_kind"] = "no",
        nonfinite: Literal["error", "warn", "allow"] = "error",
        publish_rows: int = 1024,
        publish_interval_s: float = 0.005,
        lane_segments: bool | None = None,
    ) -> Writer:
        """Open a writer session with ``lanes`` parallel environments (one per vector-env copy).

        ``writer_id=None`` takes the lowest free id; an explicit id held by a live session
        raises ``WriterBusyError`` at once. ``lane_segments``: each lane writes segments of its
        own (frame stacks read one run); ``None`` (default): for frame-sized rows when the
        capacity allows. See :class:`mmreplay.Writer`.
        """
        self._check()
        if self.mode != "a":
            raise ReadOnlyStoreError(f"{self.path} was opened with mode='r'; open it with mode='a' to write")
        from .writer import Writer, WriterHooks

        validate_writer_args(self, lanes, durability, cast, nonfinite, publish_rows, publish_interval_s)
        checker = self.reader.checker
        hooks = WriterHooks(published=self._published, rolled=self._rolled,
                            sealed=checker.written_here if checker is not None else None, closed=self._writer_closed,
                            damaged=checker.written_damaged if checker is not None else None)
        w = Writer(self.files, lanes=lanes, writer_id=writer_id, durability=durability, cast=cast,
                   nonfinite=nonfinite, publish_rows=publish_rows, publish_interval_s=publish_interval_s,
                   lane_segments=lane_segments, hooks=hooks)
        self._writers.append(w)
        return w

    def _published(self) -> None:
        self._dirty = True  # a writer of this handle published rows: the next read refreshes counts

    def _rolled(self) -> None:
        self._need_scan = True  # a writer of this handle took a segment: the next read lists the directory

    def _writer_closed(self, w: Writer) -> None:
        if w in self._writers:
            self._writers.remove(w)

    def _check_catalog(self) -> None:
        """Catalogue sealed segments not in the catalog yet (writable handles), and warn once
        about segments the catalog expects whose files are gone (one read of the catalog)."""
        if self.mode == "a":
            self.files.catalog_sealed({m.name: m.committed for m in self.reader.segments.values()
                                       if m.state == STATE_SEALED})
        lost = self.lost_segments()
        if lost:
            names = sorted(lost)
            log.warning("%s: %d segment file(s) lost, %d rows: %s (not evicted; run `mmreplay verify`)", self.path,
                        len(lost), sum(lost.values()), short_list(names))

    def lost_segments(self, state: CatalogState | None = None) -> dict[str, int]:
        """Segments the catalog lists as sealed and never evicted or quarantined whose files are
        gone: name -> rows lost."""
        return self.files.lost_segments(state)

    # -- reading --------------------------------------------------------------------------
    def refresh(self, *, scan: bool = True) -> None:
        """Make rows published since the last refresh visible; drop evicted segments.

        ``scan=False`` only rereads the counts of known open segments (no directory listing).
        """
        self._check()
        for w in self._writers:
            w.publish()  # this handle's own writers: everything added is visible here at once
        self.reader.refresh(scan=scan or self._need_scan)
        self._dirty = self._need_scan = False

    @property
    def num_rows(self) -> int:
        """Committed rows (every lane, ``is_last`` rows included), as of the last refresh or
        this handle's own writers' last append."""
        if self.reader is None:
            return 0
        if self.reader.checks_waiting():
            self.refresh()  # rows of segments checked now count (a writable handle defers checks)
        self.sync_local()
        return self.reader.snapshot.total_rows

    def __len__(self) -> int:
        return self.num_rows

    def check_counts(self) -> dict[str, int]:
        """Checks of sealed segments as of the last refresh (``mmreplay.storage.checks``): see
        ``StoreReader.check_counts``."""
        self._check()
        return self.reader.check_counts()

    def map_pages(self, *, background: bool = False) -> int:
        """Map every served row into this process at once (``MADV_POPULATE_READ``, Linux >= 5.14),
        for a store that fits in RAM: otherwise the first batches after an open each take a page
        fault per page they touch (the first 200 uniform batches of 256 on a 10M-row, 1.5 GB store
        took ~17,000 faults: 0.32 ms a batch, against 0.05 ms once every page is mapped;
        docs/results.md, "Big stores"). Reads from disk what the page cache lacks; the pages count
        in the process's resident memory (``unmap_pages`` gives them back). Returns the bytes mapped.

        ``background=True`` (what an exact-mode sampler without ``cache_bytes`` does when made):
        in a daemon thread, once per handle, and only for a store of 64 MiB to half the RAM
        available (fewer pages fault little; a store larger than RAM is left to faults or
        windowed mode). Returns the bytes it will map (0: it does nothing)."""
        self._check()
        self.sync_local()
        if not background:
            return self.reader.map_pages()
        from .info import mem_available

        total = int(self.reader.snapshot.total_rows) * self.layout.record_bytes
        if not MAP_AHEAD_MIN_BYTES <= total <= mem_available() // 2 or not self.reader.map_ahead():
            return 0
        return total

    def unmap_pages(self) -> None:
        """Drop this process's mappings of every row (the page cache keeps them): the inverse of
        ``map_pages``."""
        self._check()
        self.reader.unmap_pages()

    def wait_for_rows(self, timeout: float | None = None) -> bool:
        """When no row is served yet but sealed segments wait for their first check (a store copied
        or built elsewhere, opened read-only: larger ones are checked in the background), wait until
        the checks serve some: a sampler's first batch waits here instead of finding the store
        empty. True once rows are served; False when none will be (no check pending) or on timeout."""
        self._check()
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.reader.snapshot.total_rows == 0:
            if not self.reader.check_counts()["unchecked_segments"] or self.reader.checker is None:
                return False
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            self.reader.checker.wait(0.05 if left is None else min(left, 0.05))
            self.refresh()
        return True

    def wait_checked(self, timeout: float | None = None) -> bool:
        """Wait until every sealed segment seen so far is checked and served; False on timeout."""
        self._check()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.refresh()
            if not self.reader.check_counts()["unchecked_segments"]:
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            assert self.reader.checker is not None
            self.reader.checker.wait(None if left is None else min(left, 1.0))

    def valid_transition_mask(self, k: int) -> np.ndarray:
        """Which committed rows of snapshot segment ``k`` start a sampleable transition."""
        return self.reader.segment_starts(k)[0]

    @contextlib.contextmanager
    def scan_segment(self, k: int, fields: Iterable[str] = ()) -> Iterator[dict[str, np.ndarray]]:
        """Views (no copy) of ``fields`` over snapshot segment ``k``'s committed rows, for one pass
        over a whole segment (statistics, exports): the segment is read ahead sequentially while
        the block runs, and the next snapshot segment is asked for meanwhile; afterwards no page of
        it stays mapped in this process (the page cache keeps them), so a pass over a store larger
        than RAM does not grow the process. The views are read-only and valid inside the block
        only; masked rows read as zeros (``valid_transition_mask`` leaves them out)."""
        self._check()
        with self.reader.scanning(k, ahead=k + 1):
            views = {}
            for name in fields:
                if name not in self.reader.columns:
                    raise KeyError(f"{name!r} is not a field of this store (fields: {self.schema.names})")
                v = self.reader.column(name, k)
                v.flags.writeable = False
                views[name] = v
            yield views

    def refresh_if_stale(self, interval_s: float) -> None:
        """Refresh when the last directory scan is older than ``interval_s`` or a writer of this
        handle made a segment since; otherwise only reread counts if one of them published."""
        if time.monotonic() - self.reader.last_scan > interval_s or self._need_scan or self.reader.checks_waiting():
            self.refresh()
        elif self._dirty:
            self.refresh(scan=False)

    def sync_local(self) -> None:
        """Refresh if a writer of this handle published or rolled since the last refresh."""
        if self._need_scan or self._dirty:
            self.refresh(scan=self._need_scan)

    def segments(self, *, unchecked: bool = False) -> list[Any]:
        """The segments this handle serves, as of the last refresh, in id order: one
        :class:`mmreplay.storage.SegmentInfo` each (name, ids, lanes, chain, rows, sealed).
        ``unchecked``: also the sealed segments whose check has not run yet (not served yet)."""
        from .segment import segment_info

        self._check()
        self.sync_local()
        ms = sorted((m for m in self.reader.segments.values() if not m.failed and (unchecked or not m.pending)),
                    key=lambda m: m.header.segment_id)
        return [segment_info(m.name, m.header, m.committed, m.state == STATE_SEALED) for m in ms]

    def transition_ids(self) -> np.ndarray:
        """Global ids of every sampleable transition start (for tests and tools; O(rows))."""
        self._check()
        self.sync_local()
        s = self.reader.snapshot
        out = []
        for k in range(len(s.segment_ids)):
            with self.reader.scanning(k, ahead=k + 1):  # every record's flags: in order, with read-ahead
                out.append(s.segment_ids[k] * self.segment_records + np.flatnonzero(self.valid_transition_mask(k)))
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def transitions(self, ids: np.ndarray) -> Any:
        """The transitions starting at global row ids (see :class:`mmreplay.TransitionBatch`)."""
        from .transitions import transitions_at

        self._check()
        k, slot = self.reader.locate(ids)
        return transitions_at(self.reader, self.schema, k, slot, np.asarray(ids, np.int64))

    def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Field ``name`` of the rows with global ids ``ids`` (a copy); ``KeyError`` if one is not
        visible or is masked (a damaged row: its bytes are never served)."""
        self._check()
        k, slot = self.reader.locate(ids)
        flags = self.reader.flag_bytes(k, slot)
        if (flags == MASKED).any():
            bad = np.asarray(ids, np.int64)[flags == MASKED][:5]
            raise KeyError(f"row ids {bad.tolist()} are masked (damaged rows are never served; `mmreplay info` counts them)")
        if name == "is_last":
            return flags == 1
        return self.reader.gather(name, k, slot)

    def verify(self, *, fast: bool = False, notes: list[Any] | None = None,
               progress: Callable[[int, int], None] | None = None) -> list[Any]:
        """Check every segment's header, control slots, stamps and checksums; returns the problems
        found (``mmreplay.storage.verify.Problem``: file, slot, reason; an empty list means clean).
        ``fast``: a sealed segment's stamp column is compared with its seal, its payload is not
        read. Findings that cost nothing (leftovers the next writable open finishes, a damaged
        control slot whose twin holds the count) are appended to ``notes`` when given.
        ``progress(done, total)`` is called as segment files are checked (one per core at a time).
        Writes nothing, takes no locks."""
        from .verify import verify_store

        self._check()
        return verify_store(self.files, fast=fast, notes=notes, writable=self.mode == "a", progress=progress)

    def masked_rows(self) -> int:
        """Damaged rows a repair masked (in files unchanged since): left out of every batch."""
        from .verify import masked_rows

        self._check()
        return masked_rows(self.files)

    def repair(self) -> Any:
        """Run recovery, write back damaged stamps and control slots, mask damaged rows (their
        segments' good rows are kept) and quarantine segments whose header is damaged as
        ``.corrupt`` (``mode="a"``, no live writer). Returns a
        :class:`mmreplay.storage.verify.RepairReport`: the actions taken, the rows masked,
        quarantined and lost, and the problems left."""
        from .verify import repair_store

        self._check()
        if self.mode != "a":
            raise ReadOnlyStoreError(f"{self.path} was opened with mode='r'; repair needs mode='a'")
        report = repair_store(self.files, recovered=self.recovery_report, restored=self.manifest_restored)
        self.recovery_report, self.manifest_restored = None, []  # reported
        self.refresh()
        return report

    def record_provenance(self, record: dict[str, Any], name: str | None = None) -> str:
        """Write (or rewrite) one JSON provenance record, e.g. a collect run's env id, seeds and policy.

        Records live in ``provenance/<name>.json`` beside the manifest, each replaced atomically, so
        concurrent runs never rewrite the manifest or each other's records. Returns the name.
        """
        from .provenance import record_provenance

        self._check()
        if self.mode != "a":
            raise ReadOnlyStoreError(f"{self.path} was opened with mode='r'; open it with mode='a' to write")
        return record_provenance(self.path, record, name)

    def provenance(self) -> list[dict[str, Any]]:
        """Every provenance record, oldest first (by name); unreadable records are skipped."""
        from .provenance import read_provenance

        return read_provenance(self.path)

    def info(self) -> dict[str, Any]:
        """Schema, rows, transitions, episodes, segments, bytes and writers, as plain data."""
        from .info import store_info

        self._check()
        self.wait_checked()  # every row is counted: segments not checked yet are checked first
        return store_info(self.files, self.reader)

    def episode_ends(self, segment_ids: Iterable[int] | None = None) -> dict[int, dict[str, int]]:
        """Episodes by how they ended (``terminated``, ``truncated`` by the env, ``cut`` by the end of
        a run, ``incomplete``), per segment holding their last step, as :meth:`info` counts them
        (its ``episodes_*`` are these summed): ``{segment id: counts}`` for ``segment_ids`` (default:
        every segment). Empty when the schema has no ``terminated`` / ``truncated`` fields."""
        from .info import episode_ends

        self._check()
        self.wait_checked()
        return episode_ends(self.files, self.reader, None if segment_ids is None else {int(i) for i in segment_ids})


def _say_recovered(path: Path, report: Any) -> None:
    """One line for what recovery did when it cost or removed anything (rows lost, masked, files)."""
    lost, masked = report.rows_lost, sum(report.masked.values())
    if lost or masked or report.unreadable or report.catalog:  # (leftovers finished, names fixed: nothing lost)
        log.warning("%s: recovery after an unclean stop: %d segment(s) recovered, %d row(s) lost (never made durable, "
                    "or in segments gone), %d damaged row(s) masked, %d file(s) left for `mmreplay verify --repair`%s",
                    path, len(report.recovered), lost, masked, len(report.unreadable),
                    f"; CATALOG.log {report.catalog}" if report.catalog else "")
    for line in report.lines():
        log.info("%s: %s", path, line)


def validate_writer_args(store: ReplayStore, lanes: Any, durability: str, cast: str, nonfinite: str,
                         publish_rows: int, publish_interval_s: float) -> None:
    """One ``ValueError`` naming the argument, before a writer takes any lock."""
    checks = [
        (isinstance(lanes, (int, np.integer)) and lanes >= 1, f"`lanes` must be a positive int, got {lanes!r}"),
        (not isinstance(lanes, (int, np.integer)) or lanes <= store.segment_records,
         f"`lanes`={lanes} is more than the store's segment_records={store.segment_records}"),
        (durability in ("process", "segment", "batch"),
         f"`durability` must be 'process', 'segment' or 'batch', got {durability!r}"),
        (cast in ("no", "safe", "same_kind"), f"`cast` must be 'no', 'safe' or 'same_kind', got {cast!r}"),
        (nonfinite in ("error", "warn", "allow"), f"`nonfinite` must be 'error', 'warn' or 'allow', got {nonfinite!r}"),
        (publish_rows >= 1 and publish_interval_s > 0, "`publish_rows` must be >= 1 and `publish_interval_s` > 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
