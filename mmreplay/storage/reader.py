"""StoreReader: a process's read-only view of every segment of a store, and row gathers.

The reader maps every live segment file read-only into one reserved address range
(``_fs.AddressRegion``), one equal-sized window per segment. Because every segment of a store
has the same layout, a field is one strided numpy array of shape
``(windows, segment_records, *field_shape)`` over that range, and a batch gather is **one fancy
index per field whatever the number of segments** (``column[window_ids, slots]``).

Invariants kept here:

* a reader takes no locks and writes nothing, so a store on a read-only mount can be read;
* rows at or beyond a segment's ``committed`` count as of the last ``refresh()`` are never read
  (SQLite's ``mxFrame`` snapshot); ``refresh()`` also checks the stamp of the last committed row
  and keeps the older count if it is not there yet;
* a segment deleted by eviction stays mapped, and readable, until the next ``refresh()``;
* a file is checked (header, store uuid, schema, size) before it is mapped: never a SIGBUS;
* access hints: a sealed segment's window is ``MADV_RANDOM`` (a fault reads the page it needs,
  no read-ahead); an open one's ``MADV_NORMAL`` with ``MADV_WILLNEED`` over its committed rows
  when first mapped (newest rows are read soon after written), ``MADV_RANDOM`` once sealed;
* a window may hold a **RAM copy** of a sealed segment instead of the file mapping (``pin``:
  the learner's resident set, ``tiers.py``). The copy is moved in with one atomic ``mremap``
  and the file is mapped back the same way (``unpin``), so a thread reading the window sees
  identical bytes throughout (sealed segments never change). Copies survive ``refresh()`` and
  region growth, go when their segment is evicted, and are never touched by ``unmap_pages()``;
* a sealed segment first seen sealed, and an open one whose writer is dead when first seen, is
  served only once checked (``checks.py``): it is left out of the snapshot until then. A segment with damaged rows is mapped copy-on-write and patched
  (``checks.damage_patch``) in this process's view, file or RAM copy alike, so every gather
  leaves the damaged rows out with no per-row test on the sampling path.

Global row ids are ``segment_id * segment_records + slot``: stable for the life of a row.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .format import (CONTROL_OFFSET, CONTROL_SLOT_SIZE, IS_LAST, MASKED, STAMPS, STATE_SEALED, Header, Layout,
                     kernel, read_control, seq_matches)
from ..core.fs import (HUGE_PAGE, MADV_DONTNEED, MADV_NORMAL, MADV_POPULATE_READ, MADV_RANDOM, MADV_SEQUENTIAL,
                       MADV_WILLNEED, AddressRegion)
from ..core.errors import CorruptSegmentError
from .locks import held_elsewhere, writer_lock_name
from .segment import never_held_rows, parse_segment_name, read_segment_meta
from .checks import SYNC_CHECK_BYTES, Checker, DamagePatch, CheckJob, apply_patch, damage_patch, identity, to_ranges
from ..core.fs import map_private, write_private
from .snapshot import (SEG_BASE, SEG_COLS, SEG_COMMITTED, SEG_CUM_END, SEG_FIRST, SEG_ID, SEG_LANES, SEG_PRED,
                    SEG_SUCC, SEG_USABLE, PRED_GONE, Snapshot, index_draws, recount)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

log = logging.getLogger(__name__)
_HUGE_SLOTS = 8 * HUGE_PAGE  # segments at least this large get HUGE_PAGE-multiple windows (<= 25% more)



@dataclass(slots=True)
class _Mapped:
    """One segment as this reader knows it."""

    name: str
    header: Header
    window: int
    committed: int
    state: int
    version: int = 0
    raw: bytes = b""  # the control page as last read in full (an unchanged page is not parsed again)
    pending: bool = False
    """Sealed when first seen and not checked yet: left out of the snapshot."""
    queued: bool = False
    """Handed to the background checker."""
    failed: str = ""
    """Why its check could not read it (left out for good)."""
    patch: DamagePatch | None = None
    """Its damaged rows, patched out of this reader's view."""
    dead: bool = False
    """An open segment whose writer was dead when this reader mapped it (checked like a sealed one)."""
    ident: tuple[int, int, int, int] = (0, 0, 0, 0)
    """The identity (``checks.identity``) of the file its window maps."""


class StoreReader:
    """Maps a store's segments and gathers rows by id. Owned by ``ReplayStore``."""

    def __init__(self, segments_dir: Path, layout: Layout, store_uuid: bytes, schema_hash: int, *,
                 initial_windows: int = 16, on_corrupt: str = "skip", verify: str = "off",
                 checker: Checker | None = None) -> None:
        self.on_corrupt = on_corrupt
        self.checker = checker
        """Checks of segments first seen sealed (``None``: serve them unchecked, e.g. recovery)."""
        self.verify = verify
        self.dir = segments_dir
        self.layout = layout
        self.store_uuid = store_uuid
        self.schema_hash = schema_hash
        self.R = layout.segment_records
        self.segments: dict[int, _Mapped] = {}
        slot = layout.file_size
        if slot >= _HUGE_SLOTS:
            slot = -(-slot // HUGE_PAGE) * HUGE_PAGE
        self.copy_bytes = slot
        """Bytes of a RAM copy (``pin``): the file, rounded up to whole huge pages when the
        windows allow it."""
        self.region = AddressRegion(max(initial_windows, 4), slot)
        self._free = list(range(self.region.slots - 1, -1, -1))
        self.columns: dict[str, np.ndarray] = {}
        self.is_last: np.ndarray
        self.stamps: np.ndarray
        self._build_views()
        self.snapshot = Snapshot()
        self._table: np.ndarray | None = None
        self.skipped: dict[str, str] = {}
        self.last_scan = 0.0
        self.pinned: dict[int, int] = {}
        """Segment id -> open fd of each segment whose window holds a RAM copy (``pin``)."""
        self.pin_owner: object | None = None  # the one resident set allowed to pin (tiers.py)
        self._unstarted = False  # a segment waits for a check not started yet
        self._lock = threading.RLock()  # window changes: map, release, pin, unpin, unmap_pages
        self._mapper: threading.Thread | None = None  # map_ahead's thread

    # -- mapping --------------------------------------------------------------------------
    def _build_views(self) -> None:
        buf = self.region.buffer
        cols = {}
        for c in self.layout.columns:
            # is_last as bytes: a masked row's is MASKED in a patched view (tests compare the byte)
            dt = np.dtype(np.uint8) if c.name == IS_LAST else c.dtype
            cols[c.name] = np.ndarray((self.region.slots, self.R, *c.shape), dt, buffer=buf, offset=c.offset,
                                      strides=c.strides((self.region.slot_bytes,)))
        self.stamps = cols.pop(STAMPS)
        self.is_last = cols.pop(IS_LAST)
        self.columns = cols
        self.bytes = np.ndarray((self.region.size,), np.uint8, buffer=buf)  # the whole region, for kernels
        self._control = np.ndarray((self.region.slots, 2 * CONTROL_SLOT_SIZE), np.uint8, buffer=buf,
                                   offset=CONTROL_OFFSET, strides=(self.region.slot_bytes, 1))

    def _grow(self) -> None:
        """Move every mapping into a region twice the size (rare: more live segments than windows)."""
        old = self.region
        self.region = AddressRegion(old.slots * 2, old.slot_bytes)
        remap = {}
        for sid, m in self.segments.items():
            if sid in self.pinned:  # a RAM copy moves with its window
                self.region.move_into(m.window, old.address(m.window), self.copy_bytes)
                remap[sid] = m.window
                continue
            self._remap(m)
            remap[sid] = m.window
        self._free = sorted(set(range(self.region.slots)) - set(remap.values()), reverse=True)
        self._build_views()
        old.close()

    def _map(self, name: str, path: Path) -> _Mapped:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            header, control = read_segment_meta(fd, path, self.layout, self.store_uuid, self.schema_hash)
            ident = identity(os.fstat(fd))
            if not self._free:
                self._grow()
            window = self._free.pop()
            try:
                self.region.map_file(window, fd, self.layout.file_size)
            except BaseException:
                self._free.append(window)
                raise
        finally:
            os.close(fd)
        m = _Mapped(name, header, window, 0, 0, ident=ident)
        self._read_control(m)
        if not m.version and self.checker is not None:  # both control slots damaged
            rows = self.checker.catalogued_rows(name)
            if rows is not None:  # sealed, says the catalog: its count is the catalog's, checked below
                m.committed, m.state = min(rows, header.usable_records), STATE_SEALED
        self.advise(m, first=True)
        if m.state == STATE_SEALED and self.checker is not None:
            bad = self.checker.known(name, ident)
            if bad is None:
                m.pending = self._unstarted = True
            elif len(bad):
                self._damaged(m, bad, self.checker.acknowledged(name, ident))
        elif self.checker is not None and m.committed and not held_elsewhere(
                self.dir.parent / "locks" / writer_lock_name(header.writer_id)):
            m.pending = m.dead = self._unstarted = True  # a dead writer's open segment: checked before it is served
        return m

    def _map_window(self, m: _Mapped, fd: int) -> None:
        """Map ``m``'s file into its window (atomically over what was there): shared, or, if it
        has damaged rows, a copy-on-write mapping patched before it moves in."""
        if m.patch is None:
            self.region.map_file(m.window, fd, self.layout.file_size)
            return
        addr = map_private(fd, self.layout.file_size)
        self._write_patch(m, addr)
        self.region.move_into(m.window, addr, self.layout.file_size)

    def _remap(self, m: _Mapped) -> None:
        """Map ``m``'s file into its window again (``_map_window``), with its access hint."""
        fd = os.open(self.dir / m.name, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._map_window(m, fd)
            m.ident = identity(os.fstat(fd))
        finally:
            os.close(fd)
        self.advise(m)

    def _write_patch(self, m: _Mapped, addr: int) -> None:
        assert m.patch is not None
        write_private(addr, self.layout.file_size, lambda buf: apply_patch(m.patch, self.layout, buf))

    def _damaged(self, m: _Mapped, bad: np.ndarray, acknowledged: bool = False) -> None:
        """Mask ``m``'s damaged slots ``bad`` in this reader's view (see ``checks.py``); ``m`` is
        not in the snapshot yet (never resident), or a segment a writer of this handle just sealed
        (unpinned first). ``acknowledged``: a repair masked them already (no warning: ``info`` and
        ``verify`` count them)."""
        m.patch = damage_patch(bad)
        self._remap(m)
        slots = ", ".join(f"{a}-{b - 1}" for a, b in to_ranges(m.patch.zero)[:5])
        if acknowledged:
            log.info("%s: %d row(s) masked by a repair (slots %s) are left out of every batch", self.dir / m.name,
                     len(m.patch.zero), slots)
        else:
            log.warning("%s: %d damaged row(s) (slots %s) fail their stamp or crc32c check; masked: left out of "
                        "every batch with every window that needs them (`mmreplay verify --repair` records it)",
                        self.dir / m.name, len(m.patch.zero), slots)

    # -- checks ---------------------------------------------------------------------------
    def _run_checks(self) -> bool:
        """Apply finished background checks; check new pending segments now if they are few
        bytes, else queue them for the background thread. True if a check's result was applied."""
        c = self.checker
        if c is None:
            return False
        applied, done, sealed_bad = False, c.take_done(), c.take_seal_damage()
        by_name = {m.name: m for m in self.segments.values()} if done or sealed_bad else {}
        for name, bad in sealed_bad.items():  # rows a writer of this handle found changed when it sealed them
            m = by_name.get(name)
            if m is not None:
                self.unpin(m.header.segment_id)
                self._damaged(m, bad)
                applied = True
        for name, (ident, result) in done.items():
            if name in by_name:
                self._checked(by_name[name], ident, result)
                applied = True
        todo = [m for m in self.segments.values() if m.pending and not m.queued]
        self._unstarted = False  # every one is checked or queued below
        if todo and not c.busy() and sum(m.committed for m in todo) * self.layout.record_bytes <= SYNC_CHECK_BYTES:
            # checked in place, through this reader's windows (no window moves until run_all returns:
            # this thread holds the lock): the pages the check reads are then mapped for the first reads
            size = self.layout.file_size
            for m in todo:
                self.region.advise(m.window, size, MADV_WILLNEED)  # the whole file read ahead at once
            jobs = [CheckJob(m.name, m.committed, not m.dead,
                             mapped=None if m.patch is not None else (m.header, self.window_bytes(m.window), m.ident))
                    for m in todo]  # (a patched window is a private copy: the file is read instead)
            for m, result in zip(todo, c.run_all(jobs)):
                self._checked(m, *result)
            applied = True
        elif todo:
            todo.sort(key=lambda x: x.header.segment_id)  # oldest first
            c.submit([CheckJob(m.name, m.committed, not m.dead) for m in todo])
            for m in todo:
                m.queued = True
        return applied

    def window_bytes(self, window: int) -> np.ndarray:
        """The bytes of the file mapped in ``window`` (uint8, the file's size): valid while it maps
        that file (under this reader's lock)."""
        off = window * self.region.slot_bytes
        return self.bytes[off : off + self.layout.file_size]

    def _checked(self, m: _Mapped, ident: tuple[int, ...] | None, result: np.ndarray | str) -> None:
        m.pending = m.queued = False
        if ident is None and result != "gone":
            m.failed = str(result)
            log.warning("%s: left out: %s", self.dir / m.name, result)
        elif ident is not None and len(result):
            self._damaged(m, np.asarray(result))

    def checks_waiting(self) -> bool:
        """Some segment waits for a check nobody has started (a refresh with ``checks`` starts
        it). O(1): asked before every draw."""
        return self._unstarted

    def check_counts(self) -> dict[str, int]:
        """``damaged_rows`` left out of checked segments, ``unchecked_segments`` and
        ``unchecked_rows`` not served yet, ``unreadable_segments`` left out for good, and
        ``checked_segments``: how many this handle checked by reading them. A writable handle
        starts its checks at its first ``refresh()`` (or ``len``), not when it opens."""
        ms = list(self.segments.values())
        return {
            "damaged_rows": sum(len(m.patch.zero) for m in ms if m.patch is not None),
            "unchecked_segments": sum(m.pending for m in ms),
            "unchecked_rows": sum(m.committed for m in ms if m.pending),
            "unreadable_segments": sum(bool(m.failed) for m in ms),
            "checked_segments": self.checker.checked if self.checker is not None else 0,
        }

    def advise(self, m: _Mapped, *, first: bool = False) -> None:
        """Access hints by state (see the module docstring)."""
        if m.state == STATE_SEALED:
            self.region.advise(m.window, self.layout.file_size, MADV_RANDOM)
            return
        self.region.advise(m.window, self.layout.file_size, MADV_NORMAL)
        if first and m.committed:
            lo, hi = self.layout.records_span(0, m.committed)
            self.region.advise(m.window, hi - lo, MADV_WILLNEED, offset=lo)

    @contextlib.contextmanager
    def scanning(self, k: int, ahead: int | None = None) -> Iterator[None]:
        """One pass over snapshot segment ``k``'s committed rows, in order: read ahead
        (``MADV_SEQUENTIAL`` and ``MADV_WILLNEED``; the window is ``MADV_RANDOM`` for sampling)
        for the pass, and snapshot segment ``ahead``'s rows asked for meanwhile, so the disk
        reads the next segment while this one is worked on; afterwards the sampling hint is back
        and no page of it stays mapped in this process (the page cache keeps them: a store larger
        than RAM must not end up in the RSS of a whole-store pass). RAM copies and patched
        windows are left as they are."""
        s, size = self.snapshot, self.layout.file_size
        m = self.segments.get(int(s.segment_ids[k]))  # (None: gone from the mapped set since the snapshot)
        plain = m is not None and m.header.segment_id not in self.pinned and m.patch is None
        if plain:
            self._read_in_order(m, int(s.committed[k]))
        if ahead is not None and 0 <= ahead < len(s.segment_ids):
            lo, hi = self.layout.records_span(0, int(s.committed[ahead]))
            self.region.advise(int(s.windows[ahead]), hi - lo, MADV_WILLNEED, offset=lo)
        try:
            yield
        finally:
            if plain and m is not None:
                self.region.advise(m.window, size, MADV_DONTNEED)
                self.advise(m)

    def _read_in_order(self, m: _Mapped, rows: int) -> int:
        """Hint ``m``'s window for one pass in order (``MADV_SEQUENTIAL``) and ask for its first
        ``rows`` records now (``MADV_WILLNEED``); returns the bytes of the window through them."""
        lo, hi = self.layout.records_span(0, rows)
        self.region.advise(m.window, self.layout.file_size, MADV_SEQUENTIAL)
        self.region.advise(m.window, hi - lo, MADV_WILLNEED, offset=lo)
        return hi

    def column(self, name: str, k: int) -> np.ndarray:
        """Field ``name`` over snapshot segment ``k``'s committed rows: a view of the mapping (no
        copy; masked rows read as zeros), valid until the next refresh."""
        return self.columns[name][int(self.snapshot.windows[k]), : int(self.snapshot.committed[k])]

    # -- refresh --------------------------------------------------------------------------
    def refresh(self, *, scan: bool = True, checks: bool = True) -> None:
        """Pick up new segments (``scan``), new rows and evicted segments; ``checks``: also check
        segments first seen sealed (else they wait, unserved, for a refresh that does)."""
        with self._lock:
            changed = scan  # the set of segments or their states: a new snapshot; else only counts grew
            if scan:
                self._scan()
            grown = {}
            for m in self.segments.values():
                if m.state != STATE_SEALED:
                    n, state = m.committed, m.state
                    self._read_control(m)  # sealed segments are immutable
                    if m.state == STATE_SEALED:
                        self.advise(m)
                    changed |= m.state != state
                    if m.committed != n:
                        grown[m.header.segment_id] = m.committed
            if checks:
                changed |= self._run_checks()
            if changed:
                self._rebuild()
            elif grown:  # rows appended to open segments: the counts, not the whole snapshot (per batch)
                self.snapshot = self.snapshot.with_counts(grown)
                self._table = None if self._table is None else recount(self._table, self.snapshot)

    def _scan(self) -> None:
        seen: dict[int, str] = {}
        with os.scandir(self.dir) as it:
            for e in it:
                parsed = parse_segment_name(e.name)
                if parsed is not None and e.is_file():
                    seen[parsed[0]] = e.name
        for sid in [s for s in self.segments if s not in seen]:
            self._free.append(self.segments.pop(sid).window)
            self.region.release(self._free[-1])  # frees a RAM copy too
            fd = self.pinned.pop(sid, None)
            if fd is not None:
                os.close(fd)
        for sid, name in seen.items():
            if sid in self.segments or name in self.skipped:
                continue
            try:
                self.segments[sid] = self._map(name, self.dir / name)
            except FileNotFoundError:
                continue  # evicted between listing and opening
            except CorruptSegmentError as exc:
                if (exc.kind != "foreign" and never_held_rows(self.dir / name, self.layout)
                        and (self.checker is None or self.checker.catalogued_rows(name) is None)):
                    self.skipped[name] = ""  # never held a row (a creation a crash cut short): nothing to say
                    log.debug("%s holds no row (an unfinished creation): %s", name, exc)
                    continue
                if self.on_corrupt == "raise" or self.verify == "strict":
                    raise
                self.skipped[name] = str(exc)
                log.warning("left out (its rows are not served; `mmreplay verify --repair` rebuilds its header from its "
                            "writer session where its rows verify, else quarantines it): %s", exc)
        self.last_scan = time.monotonic()

    def _read_control(self, m: _Mapped) -> None:
        raw = self._control[m.window].tobytes()
        if raw == m.raw:  # (most refreshes, for every open segment but the one being written)
            return
        control, _ = read_control(raw)
        if control is None or control.version == m.version:
            m.raw = raw  # (nothing new in it)
            return
        n = min(control.committed, m.header.usable_records)
        # stamps are written before the count: if the last one is not visible yet (weakly ordered CPU), keep the old
        # count (an open segment's; a sealed one's count is final, and its last row may be masked, i.e. unstamped)
        if (n > m.committed and control.state != STATE_SEALED
                and not seq_matches(m.header, self.stamps[m.window, n - 1]["seq"], m.header.first_seq + n)):
            return
        if self.verify != "off" and n > m.committed:
            n = self._verified(m, n)
        m.committed, m.state, m.version, m.raw = n, control.state, control.version, raw

    def _verified(self, m: _Mapped, n: int) -> int:
        """Check the new rows' stamps and checksums before they become visible (``verify=``)."""
        from .recovery import check_groups

        w = m.window
        base = w * self.region.slot_bytes
        view = self.bytes[base : base + self.layout.file_size]
        good = check_groups(m.header, self.layout, self.stamps[w], view, m.committed, n)
        if good >= n:
            return n
        msg = f"{self.dir / m.name}: row {good} fails its stamp or crc32c check"
        if self.verify == "strict":
            raise CorruptSegmentError(msg, hint="run `mmreplay verify --repair`, or open with verify='salvage'",
                                     kind="rows")
        log.warning("%s; rows from there on are left out (verify='salvage')", msg)
        self.skipped[m.name] = msg
        return good

    def _rebuild(self) -> None:
        ms = sorted((m for m in self.segments.values() if not (m.pending or m.failed)),
                    key=lambda m: m.header.segment_id)
        s = Snapshot()
        s.segment_ids = np.array([m.header.segment_id for m in ms], np.int64)
        s.windows = np.array([m.window for m in ms], np.int64)
        s.committed = np.array([m.committed for m in ms], np.int64)
        s.usable = np.array([m.header.usable_records for m in ms], np.int64)
        s.lanes = np.array([m.header.lanes for m in ms], np.int64)
        s.cum_end = np.cumsum(s.committed)
        s.index = {int(sid): k for k, sid in enumerate(s.segment_ids)}
        s.sealed = np.array([m.state == STATE_SEALED for m in ms], np.bool_)
        chain = {(m.header.writer_id, m.header.session_epoch, m.header.chain_index): k for k, m in enumerate(ms)}
        s.succ = np.array(
            [chain.get((m.header.writer_id, m.header.session_epoch, m.header.chain_index + 1), -1) for m in ms],
            np.int64,
        )
        s.first_seq = np.array([m.header.first_seq for m in ms], np.int64)
        # the predecessor in the chain; PRED_GONE when the session had one that is not in the snapshot
        # (evicted, quarantined, not checked yet): a frame stack cannot tell whether its episode went on there
        s.pred = np.array(
            [chain.get((m.header.writer_id, m.header.session_epoch, m.header.chain_index - 1),
                       PRED_GONE if m.header.chain_index else -1) for m in ms],
            np.int64,
        )
        self.snapshot = s
        self._table = None

    def segment_table(self) -> np.ndarray:
        """The snapshot as one int64 table for the compiled kernels (built once per refresh)."""
        if self._table is None:
            s = self.snapshot
            t = np.empty((len(s.cum_end), SEG_COLS), np.int64)
            t[:, SEG_CUM_END] = s.cum_end
            t[:, SEG_COMMITTED] = s.committed
            t[:, SEG_USABLE] = s.usable
            t[:, SEG_LANES] = s.lanes
            t[:, SEG_SUCC] = s.succ
            t[:, SEG_BASE] = s.windows * self.region.slot_bytes + self.layout.records_offset
            t[:, SEG_ID] = s.segment_ids
            t[:, SEG_PRED] = s.pred
            t[:, SEG_FIRST] = s.first_seq
            self._table = index_draws(t)
        return self._table

    def close(self) -> None:
        if self.checker is not None:
            self.checker.close()
        with self._lock:
            self.columns = {}
            self.segments.clear()
            for fd in self.pinned.values():
                os.close(fd)
            self.pinned.clear()
            self.region.close()

    # -- RAM copies and mapped pages (the tiers, ``tiers.py``) ------------------------------
    def pin(self, segment_id: int, addr: int, fd: int) -> bool:
        """Move a RAM copy of sealed segment ``segment_id`` (``copy_bytes`` at ``addr``, an
        anonymous mapping holding the file from its start) into its window; ``fd`` (the segment
        file, kept open to map it back) is owned by the reader from then on. Returns False, and
        frees the copy and ``fd``, if the segment is no longer live or not sealed."""
        with self._lock:
            m = self.segments.get(segment_id)
            if m is None or m.state != STATE_SEALED or segment_id in self.pinned or self.region.closed:
                from ..core.fs import unmap

                unmap(addr, self.copy_bytes)
                os.close(fd)
                return False
            if m.patch is not None:  # the copy was read from the file: patch it before it moves in
                self._write_patch(m, addr)
            self.region.move_into(m.window, addr, self.copy_bytes)
            self.pinned[segment_id] = fd
            return True

    def unpin(self, segment_id: int) -> None:
        """Map segment ``segment_id``'s file back over its RAM copy (which is freed)."""
        with self._lock:
            fd = self.pinned.pop(segment_id, None)
            if fd is None:
                return
            try:
                m = self.segments.get(segment_id)
                if m is not None:
                    self._map_window(m, fd)  # atomic over the copy
                    if self.copy_bytes > self.layout.file_size:  # the copy's tail past the file
                        self.region.release(m.window, self.layout.file_size)
                    self.advise(m)
            finally:
                os.close(fd)

    def unmap_pages(self) -> None:
        """Drop this process's page-table entries for every file-mapped window
        (``MADV_DONTNEED``): the pages stay in the page cache (a later read maps them again,
        or reads them from disk if the kernel reclaimed them) but no longer count in this
        process's resident memory. RAM copies and patched (copy-on-write) windows are left alone."""
        with self._lock:
            size = self.layout.file_size
            pinned = {self.segments[s].window for s in self.pinned if s in self.segments}
            for m in self.segments.values():
                if m.window not in pinned and m.patch is None:  # DONTNEED would drop a patch's pages
                    self.region.advise(m.window, size, MADV_DONTNEED)

    def map_pages(self) -> int:
        """Map every committed row of the snapshot's segments into this process's page tables at
        once (``MADV_POPULATE_READ``; the page cache supplies the pages, the disk what it lacks, read
        in order with read-ahead: under the window's sampling hint, random, it would be read 4 KiB
        a fault, ~100 MB/s): the inverse of ``unmap_pages``. One segment at a time under the
        window lock (a close or an eviction meanwhile stops or skips it); RAM copies are left
        alone. Returns the bytes asked for."""
        total = 0
        for sid in self.snapshot.segment_ids.tolist():
            with self._lock:
                m = self.segments.get(int(sid))
                if self.region.closed:
                    break
                if m is None or m.header.segment_id in self.pinned:
                    continue
                hi = self._read_in_order(m, m.committed)
                self.region.advise(m.window, hi, MADV_POPULATE_READ)
                self.advise(m)  # back to the sampling hint
                total += hi
        return total

    def map_ahead(self) -> bool:
        """``map_pages`` in a daemon thread, once per reader; False if it was started before."""
        with self._lock:
            if self._mapper is not None or self.region.closed:
                return False
            self._mapper = threading.Thread(target=self.map_pages, name="mmreplay-map-pages", daemon=True)
            self._mapper.start()
        return True

    # -- row addressing -------------------------------------------------------------------
    def visible(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ok, k, slot)`` of global row ids: ``ok`` where the row is visible in this snapshot."""
        s = self.snapshot
        sid, slot = np.divmod(np.asarray(ids, np.int64), self.R)
        k = np.minimum(np.searchsorted(s.segment_ids, sid), max(len(s.segment_ids) - 1, 0))
        if len(s.segment_ids) == 0:
            return np.zeros(len(sid), np.bool_), k, slot
        return (s.segment_ids[k] == sid) & (slot < s.committed[k]) & (sid >= 0), k, slot

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Snapshot indices ``k`` and slots of global row ids; raises on ids not visible (one compiled
        call once numba is loaded, as a sampler loads it: ~10 numpy calls cost more than a gather)."""
        ids, kern, s = np.asarray(ids, np.int64), kernel(load=False), self.snapshot
        if kern is not None and ids.ndim == 1:
            k, slot = np.empty(len(ids), np.int64), np.empty(len(ids), np.int64)
            ok = kern.locate_ids(s.segment_ids, s.committed, self.R, np.ascontiguousarray(ids), k, slot)
        else:
            ok, k, slot = self.visible(ids)
        if ok is not True and not np.all(ok):  # the kernel's bool, else a mask (np.all of a bool costs ~3 us)
            raise KeyError("some row ids are not visible in this snapshot (evicted, unpublished or invalid)")
        return k, slot

    def successors(self, k: np.ndarray, slot: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where the next row of the same lane is: ``(ok, k_next, slot_next)``."""
        s = self.snapshot
        nxt = slot + s.lanes[k]
        in_seg = nxt < s.committed[k]
        succ = s.succ[k]
        nslot = nxt - s.usable[k]
        cross = (nxt >= s.usable[k]) & (succ >= 0)
        cross &= nslot < s.committed[np.maximum(succ, 0)]
        ok = in_seg | cross
        return ok, np.where(in_seg, k, np.maximum(succ, 0)), np.where(in_seg, nxt, np.maximum(nslot, 0))

    def damaged_slots(self, segment_id: int) -> tuple[np.ndarray, bool]:
        """``(masked slots, not checked yet)`` of a segment this reader maps (none and False if
        it maps no such segment)."""
        m = self.segments.get(int(segment_id))
        if m is None:
            return np.zeros(0, np.int64), False
        return (m.patch.zero if m.patch is not None else np.zeros(0, np.int64)), m.pending

    def flag_bytes(self, k: np.ndarray, slot: np.ndarray) -> np.ndarray:
        """The ``is_last`` bytes of rows ``slot`` of segments ``k``: 0, 1 (an episode's final
        observation) or ``format.MASKED`` (a damaged row, excluded)."""
        return self.is_last[self.snapshot.windows[k], slot]

    def transition_starts(self, k: np.ndarray, slot: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(valid, k_next, slot_next)`` of candidate transition starts: a start is an ordinary
        row (not an episode's final observation, not masked) whose next row is written and not
        masked."""
        ok, nk, ns = self.successors(k, slot)
        ok &= self.flag_bytes(k, slot) == 0
        ok &= self.flag_bytes(nk, ns) != MASKED
        return ok, nk, ns

    def segment_flags(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(flags, has_next, next_flags)`` over snapshot segment ``k``'s committed rows: their
        ``is_last`` bytes (a copy), whether the lane's next row is written, and its byte (0 where
        there is none). Slices for the rows whose next row is in the segment, ``successors`` for
        each lane's last row only: no gather over the whole segment."""
        s = self.snapshot
        n, lanes = int(s.committed[k]), int(s.lanes[k])
        flags = np.array(self.is_last[int(s.windows[k]), :n])
        inner = max(n - lanes, 0)
        has = np.ones(n, np.bool_)
        nxt = np.empty(n, np.uint8)
        nxt[:inner] = flags[lanes:]
        tail = np.arange(inner, n)
        ok, nk, ns = self.successors(np.full_like(tail, k), tail)
        has[inner:] = ok
        nxt[inner:] = np.where(ok, self.flag_bytes(nk, ns), 0)
        return flags, has, nxt

    def segment_starts(self, k: int, seg_flags: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
        """``(valid, blocked)`` over snapshot segment ``k``'s committed rows: the rows that start a
        one-step transition (``transition_starts``), and those that would but for their next row
        being masked. ``seg_flags``: ``segment_flags(k)``, when the caller has it already."""
        flags, has, nxt = seg_flags if seg_flags is not None else self.segment_flags(k)
        ok = (flags == 0) & has
        return ok & (nxt != MASKED), ok & (nxt == MASKED)

    def gather(self, name: str, k: np.ndarray, slot: np.ndarray) -> np.ndarray:
        """Rows ``slot`` of segments ``k`` of field ``name`` (a copy)."""
        return self.columns[name][self.snapshot.windows[k], slot]
