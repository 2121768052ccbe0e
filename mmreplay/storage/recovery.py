"""Recovery: bring segments left unfinished by a dead writer back, losing only what it left open.

A segment whose writer died (``kill -9``, power loss) may still be OPEN. Its counters are caches;
the checksummed stamps are the truth (SQLite's wal-index, Kafka's ``LogSegment.recover``).
Recovery works session by session, in chain order, and tells two kinds of segment apart:

* **the tail**: the last segment of a session that holds rows, if its control page says OPEN and
  the catalog has no record of it sealed. This is what a dead writer left open: starting at the
  control slot's ``synced`` count (all rows before it were made durable first), commit groups
  are checked (``check_kernel``) and the segment is cut back to its longest valid prefix of
  whole groups; groups past ``committed`` were never published and are dropped; the stamps of
  the invalid tail are zeroed (so stale stamps cannot come back), and the segment is published
  SEALED with ``committed = synced = prefix``;
* **every other segment**, whatever its control page says: one the catalog records as sealed,
  one the session wrote past (a session only moves on from a full segment, so its count is its
  usable rows), one whose control page is SEALED but not yet synced, one whose two control slots
  are damaged. Its count comes from the catalog, the chain or the control page, else from the
  stamps; its rows are checked, and a damaged row is **masked** (left in the file, excluded by
  every reader: ``checks.py``), never a cut. Its control page is then written again (SEALED,
  synced) and its check recorded in the catalog.

So damage in one segment never costs another: no later segment of a session is ever removed
because an earlier one is damaged, and a sealed segment never loses its good rows. Recovery
removes a file only when it holds no row (a segment made ahead of need and never written, an
unfinished creation: ``.tmp`` files and zero headers), or when an eviction already recorded its
departure (``.deleted``); each removal of a segment is recorded in the catalog first.
``RecoveryReport.lines()`` says what was done, with the rows lost (a writable open logs them).
Rows published before a ``kill -9`` are always kept (the page cache survives the process); after
a power loss only rows before ``synced`` are guaranteed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .format import (CONTROL_OFFSET, PAGE_SIZE, SEQ_MASK, STAMP_DTYPE, STATE_SEALED, Control, Header, Layout,
                     damaged_control_slots)
from ..core.errors import CorruptSegmentError
from ..core.fs import fsync_dir
from .segment import Segment, parse_segment_name, read_segment_meta
from .checks import identity, to_ranges
from .locks import ALLOC, writer_lock_name

if TYPE_CHECKING:
    from .files import StoreFiles

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    """What recovery did: segments sealed, rows dropped or masked, files cleaned, files it could not read."""

    recovered: dict[str, int] = field(default_factory=dict)
    """segment file -> rows kept."""
    dropped: dict[str, int] = field(default_factory=dict)
    """segment file -> rows a dead writer never made durable that fail their checks (its open
    tail past the valid prefix, or torn rows past the synced point of a segment it wrote past):
    lost."""
    masked: dict[str, int] = field(default_factory=dict)
    """segment file -> damaged rows masked (their bytes stay in the file; never served)."""
    cleaned: list[str] = field(default_factory=list)
    """Files removed: unfinished creations, finished evictions, segments that never held a row."""
    unreadable: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.recovered or self.cleaned or self.unreadable)

    @property
    def rows_lost(self) -> int:
        return sum(self.dropped.values())

    def lines(self) -> list[str]:
        """One line per thing done, each with the rows it cost."""
        out = [f"recovered {n}: kept {k:,} rows"
               + (f", dropped {self.dropped[n]:,} torn or unpublished rows a dead writer never made durable (lost)"
                  if self.dropped.get(n) else "")
               + (f", masked {self.masked[n]:,} damaged rows" if self.masked.get(n) else "")
               for n, k in sorted(self.recovered.items())]
        out += [f"removed {n} (no row: {_why_clean(n)})" for n in self.cleaned]
        out += [f"left {n} alone: {why}" for n, why in sorted(self.unreadable.items())]
        return out


def _why_clean(name: str) -> str:
    if name.endswith(".tmp"):
        return "an interrupted creation"
    if name.endswith(".deleted"):
        return "an interrupted eviction, finished"
    return "made ahead of need and never written"


def valid_prefix(seg: Segment, start: int, stop: int) -> int:
    """Length of the longest valid prefix of ``seg``'s rows, checking groups from ``start``."""
    return check_groups(seg.header, seg.layout, seg.stamps, seg.view, start, stop)


def check_groups(h: Header, layout: Layout, st: np.ndarray, view: Any, start: int, stop: int) -> int:
    """Walk commit groups from ``start`` (a group boundary) towards ``stop``; return where the
    first invalid group begins (``>= stop`` when all are valid). ``st`` is the segment's stamp
    column, ``view`` a buffer of the whole segment file. The rule is ``check_kernel``'s."""
    from .checks import scan

    return int(scan(h, layout, st, view, start, stop, first_only=True))


def recover_segment(seg: Segment) -> tuple[int, int]:
    """Cut an OPEN segment back to its valid prefix and seal it. Returns ``(kept, dropped)``.

    Rows are checked from ``synced`` up to ``committed``: rows stamped but never published were
    never acknowledged, so they are dropped like any unpublished row. With both control slots
    damaged the count is unknown and every stamped row is checked.
    """
    c = seg.control
    usable = seg.header.usable_records
    start = min(c.synced, usable)
    stop = min(c.committed, usable) if c.version else usable
    n = valid_prefix(seg, start, stop)
    dropped = max(stop - n, 0) if c.version else 0
    tail = seg.stamps[n:]
    nz = np.flatnonzero(tail["seq"])
    if len(nz):
        tail[: nz[-1] + 1] = 0  # stale stamps past the prefix must never come back
    seg.sync_rows(0, usable)
    seg.publish(n, synced=n, state=STATE_SEALED, seal_crc=seg.stamps_crc(n))
    seg.sync_control()
    return n, dropped


def recover_writer(store: StoreFiles, writer_id: int, report: RecoveryReport | None = None,
                   catalogued: dict[str, int] | None = None) -> RecoveryReport:
    """Recover the segments of ``writer_id`` left unfinished (caller holds that writer's lock);
    see the module docstring. ``catalogued``: the catalog's sealed segments (name -> rows), read
    once by the caller (else here)."""
    report = report if report is not None else RecoveryReport()
    if catalogued is None:
        catalogued = store.catalog.read().live if store.catalog.path.exists() else {}
    sessions: dict[int, list[tuple[int, str, Header, Control | None]]] = {}
    for name in os.listdir(store.segments_dir):
        parsed = parse_segment_name(name)
        if parsed is None or parsed[1] != writer_id:
            continue
        try:
            fd = os.open(store.segments_dir / name, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            header, control = read_segment_meta(fd, name, store.layout, store.store_uuid, store.schema.hash)
        except CorruptSegmentError as exc:
            report.unreadable[name] = str(exc)  # its header is damaged: verify --repair quarantines it
            continue
        finally:
            os.close(fd)
        sessions.setdefault(header.session_epoch, []).append((header.chain_index, name, header, control))
    for chain in sessions.values():
        chain.sort(key=lambda x: x[0])
        rows = [_held(store, name, h, c, catalogued) for _, name, h, c in chain]
        for i, (_, name, h, c) in enumerate(chain):
            full = any(rows[i + 1:])  # the session wrote past it: it was full
            if not rows[i] and not full:  # made ahead of need, never written (a spare)
                if c is None or c.state != STATE_SEALED:
                    _depart(store, name, lambda p=store.segments_dir / name: _remove(p))
                    report.cleaned.append(name)
                continue
            if c is not None and c.state == STATE_SEALED and c.synced >= c.committed:
                continue  # sealed and durable: trusted (checked by the first reader, or verify)
            tail = not full and name not in catalogued and c is not None and c.state != STATE_SEALED
            _recover_one(store, name, report, tail=tail,
                         count=h.usable_records if full else catalogued.get(name, rows[i]))
    return report


def _held(store: StoreFiles, name: str, h: Header, c: Control | None, catalogued: dict[str, int]) -> int:
    """Rows a segment holds as far as its records say: the catalog's count, else its control page's,
    else (both control slots damaged) the extent of its stamped rows."""
    if name in catalogued:
        return catalogued[name]
    if c is not None:
        return min(c.committed, h.usable_records)
    try:
        with open(store.segments_dir / name, "rb") as fh:
            raw = os.pread(fh.fileno(), 16 * h.usable_records, store.layout.stamps_offset)
    except FileNotFoundError:
        return 0
    st = np.frombuffer(raw, STAMP_DTYPE)
    want = np.arange(h.first_seq + 1, h.first_seq + len(st) + 1, dtype=np.uint64)
    ok = (st["seq"] & np.uint64(SEQ_MASK)) == (want & np.uint64(SEQ_MASK)) if h.format_version >= 2 else st["seq"] == want
    hit = np.flatnonzero(ok)
    return int(hit[-1]) + 1 if len(hit) else 0


def _recover_one(store: StoreFiles, name: str, report: RecoveryReport, *, tail: bool, count: int) -> None:
    """Recover one segment: a dead writer's open tail is cut back to its valid prefix (``tail``);
    any other is sealed with ``count`` rows, its damaged rows masked."""
    path = store.segments_dir / name
    try:
        seg = Segment.open_rw(path, store.layout, store.store_uuid, store.schema.hash)
    except FileNotFoundError:
        return
    except CorruptSegmentError as exc:
        report.unreadable[name] = str(exc)
        return
    try:
        torn = damaged = np.zeros(0, np.int64)
        if tail:
            kept, dropped = recover_segment(seg)
            if dropped:
                report.dropped[name] = dropped
        else:
            # (a control slot damaged: the durable point it holds is not the writer's last word, so
            # every row is taken as durable and a bad one as damaged)
            intact = seg.control.version and not damaged_control_slots(seg.view[CONTROL_OFFSET:])
            synced = min(seg.control.synced, count) if intact else count
            kept, bad = seal_checked(seg, count)
            # rows past the durable point that fail were torn by a power loss (never made durable): lost,
            # and recorded so; rows before it are durable rows damaged since: masked, for verify to report
            torn, damaged = bad[bad >= synced], bad[bad < synced]
            if len(torn):
                report.dropped[name] = len(torn)
            if len(damaged):
                report.masked[name] = len(damaged)
            kept -= len(bad)
        report.recovered[name] = kept
        log.info("recovered %s: kept %d rows, dropped %d, masked %d", path, kept, report.dropped.get(name, 0),
                 len(damaged))
    finally:
        seg.close(fdatasync=True)
    try:  # every row now checked: remember it for this file (its identity changed with the new control page)
        bad = np.union1d(torn, damaged)
        # torn rows alone are acknowledged (recovery reported them lost); damaged durable rows wait for a repair
        store.catalog.checked(name, identity(os.stat(path)), to_ranges(bad), masked=bool(len(torn)) and not len(damaged))
    except OSError:
        pass  # the first reader checks it


def seal_checked(seg: Segment, count: int) -> tuple[int, np.ndarray]:
    """Seal ``seg`` with ``count`` rows after checking all of them; returns ``(count, damaged
    slots)``. Damaged rows stay where they are (masked by every reader); no row is cut."""
    from .checks import scan

    count = min(count, seg.header.usable_records)
    bad = np.flatnonzero(scan(seg.header, seg.layout, seg.stamps, seg.view, 0, count)).astype(np.int64)
    seg.sync_rows(0, count)
    seg.publish(count, synced=count, state=STATE_SEALED, seal_crc=seg.stamps_crc(count))
    seg.sync_control()
    return count, bad


def _remove(path: Path) -> None:
    doomed = path.with_name(path.name + ".deleted")
    try:
        os.rename(path, doomed)
    except FileNotFoundError:
        return
    doomed.unlink(missing_ok=True)  # another recovering process may have finished it
    fsync_dir(path.parent)


def _depart(store: StoreFiles, name: str, remove: Any) -> None:
    """Record segment ``name`` as removed by recovery, then ``remove()`` its file, under
    ``alloc.lock``: a catalog compaction (``catalog.py``, run by evictions under that lock)
    never rewrites the log between the two and drops the departure."""
    alloc = store.lock(ALLOC)
    alloc.acquire(exclusive=True, blocking=True)
    try:
        store.catalog.departed(name, "removed", "recovery")
        remove()
    finally:
        alloc.release()


def recover_abandoned(store: StoreFiles) -> RecoveryReport:
    """On open with ``mode='a'``: recover OPEN segments of dead writers, finish interrupted
    creations and evictions. Live writers' segments are left alone."""
    report = RecoveryReport()
    alloc = store.lock(ALLOC)
    alloc.acquire(exclusive=True, blocking=True)
    try:
        names = os.listdir(store.segments_dir)
        # an eviction renames a file .deleted after its departure line; a power loss may have lost
        # that line (it is fsynced before the unlink): then it is written here, before the unlink
        live = set(store.catalog.read().live) if any(n.endswith(".deleted") for n in names) else set()
        undeparted = [n.removesuffix(".deleted") for n in names if n.removesuffix(".deleted") in live
                      and n.endswith(".deleted")]
        if undeparted:
            store.catalog.departed(undeparted, "evicted", "capacity")
        for name in names:
            if name.endswith((".tmp", ".deleted")):
                (store.segments_dir / name).unlink(missing_ok=True)
                report.cleaned.append(name)
    finally:
        alloc.release()
    for name in os.listdir(store.segments_dir):
        if parse_segment_name(name) and _never_written(store.segments_dir / name):
            # created but its header never reached the disk (power loss right after creation,
            # before any row of it was synced): an unfinished creation, like a .tmp file
            _depart(store, name, lambda p=store.segments_dir / name: p.unlink(missing_ok=True))
            report.cleaned.append(name)
    writers = sorted({p[1] for n in os.listdir(store.segments_dir) if (p := parse_segment_name(n))})
    catalogued: dict[str, int] | None = None
    for wid in writers:
        lock = store.lock(writer_lock_name(wid))
        if not lock.acquire(exclusive=True):
            continue  # a live writer owns it
        try:
            if catalogued is None:
                catalogued = store.catalog.read().live if store.catalog.path.exists() else {}
            recover_writer(store, wid, report, catalogued)
        finally:
            lock.release()
    return report


def _never_written(path: os.PathLike[str]) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(PAGE_SIZE * 2)
    except FileNotFoundError:
        return False  # evicted meanwhile by a live writer
    return len(head) > 0 and not any(head)
