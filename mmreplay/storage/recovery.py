"""Recovery: bring segments left OPEN by a dead writer back to their longest valid prefix.

A segment whose writer died (``kill -9``, power loss) is still OPEN. Its counters are caches;
the checksummed stamps are the truth (SQLite's wal-index, Kafka's ``LogSegment.recover``):

1. start at the control slot's ``synced`` count (all rows before it were made durable first);
2. walk commit groups: a group at slot ``i`` is valid iff every row of it carries
   ``seq == first_seq + slot + 1`` (its low 32 bits in format 2), the same crc and length, and
   the crc of its payload, seeded with store/segment/slot/seq/session, matches, and (format 2)
   every row's digest matches (``_checkkernel``). An all-zero stamp means never written;
   Groups past ``committed`` were never published: they are dropped (and only when both
   control slots are damaged is the count rebuilt from the stamps alone);
3. keep the valid prefix, zero the stamps of the invalid tail (so stale stamps cannot come back),
   msync, and publish ``committed = synced = prefix`` with state SEALED.

A SEALED segment whose rows were not yet made durable (``synced < committed``: its writer died
before the background sync finished, or writes with ``durability="process"``) is checked the
same way once, by the first ``mode="a"`` open after its writer is gone; recovery then records it
as synced. Rows published before a ``kill -9`` are always kept (the page cache survives the process); after
a power loss only rows before ``synced`` are guaranteed. Leftover ``.tmp`` files (a segment being
created) are removed and ``.deleted`` files (an eviction in progress) are finished.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .format import PAGE_SIZE, STATE_SEALED, Header, Layout
from ..core.errors import CorruptSegmentError
from ..core.fs import fsync_dir
from .segment import Segment, parse_segment_name, read_segment_meta
from .checks import identity
from .locks import ALLOC, writer_lock_name

if TYPE_CHECKING:
    from .store import ReplayStore

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    """What recovery did: segments sealed, rows dropped, files cleaned, files it could not read."""

    recovered: dict[str, int] = field(default_factory=dict)
    """segment file -> rows kept."""
    dropped: dict[str, int] = field(default_factory=dict)
    """segment file -> rows dropped past the valid prefix (published or not)."""
    cleaned: list[str] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.recovered or self.cleaned or self.unreadable)


def valid_prefix(seg: Segment, start: int, stop: int) -> int:
    """Length of the longest valid prefix of ``seg``'s rows, checking groups from ``start``."""
    return check_groups(seg.header, seg.layout, seg.stamps, seg.view, start, stop)


def check_groups(h: Header, layout: Layout, st: np.ndarray, view: Any, start: int, stop: int) -> int:
    """Walk commit groups from ``start`` (a group boundary) towards ``stop``; return where the
    first invalid group begins (``>= stop`` when all are valid). ``st`` is the segment's stamp
    column, ``view`` a buffer of the whole segment file. The rule is ``_checkkernel``'s."""
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


def recover_writer(store: ReplayStore, writer_id: int, report: RecoveryReport | None = None) -> RecoveryReport:
    """Recover the segments of ``writer_id`` left unfinished (caller holds that writer's lock).

    Segments are taken session by session in chain order. Once one had to be cut short (its
    rows never reached the disk whole), every later segment of the same session is removed,
    like Kafka deleting the log after a truncated segment: a writer's visible rows always stay
    an exact prefix of what it wrote, never a later stretch without the rows before it.
    """
    report = report if report is not None else RecoveryReport()
    sessions: dict[int, list[tuple[int, str, int, int]]] = {}
    for name in os.listdir(store.segments_dir):
        parsed = parse_segment_name(name)
        if parsed is None or parsed[1] != writer_id:
            continue
        try:
            fd = os.open(store.segments_dir / name, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            header, _ = read_segment_meta(fd, name, store.layout, store.store_uuid, store.schema.hash)
        except CorruptSegmentError as exc:
            report.unreadable[name] = str(exc)
            continue
        finally:
            os.close(fd)
        sessions.setdefault(header.session_epoch, []).append((header.chain_index, name, header.usable_records, 0))
    for chain in sessions.values():
        chain.sort()
        cut = False
        for i, (_, name, usable, _) in enumerate(chain):
            path = store.segments_dir / name
            if cut:
                _depart(store, name, lambda p=path: _remove(p))  # rows past a cut: not durable, dropped
                report.dropped[name] = report.dropped.get(name, 0) + store.segment_state(path)[1]
                report.cleaned.append(name)
                continue
            kept = _recover_one(store, path, name, report)
            if kept is not None and kept < usable and i + 1 < len(chain):
                cut = True  # a session only moves on from a full segment: the rest is unreachable
    return report


def _recover_one(store: ReplayStore, path: Path, name: str, report: RecoveryReport) -> int | None:
    """Recover one segment if it needs it; its row count afterwards (None if unreadable)."""
    state, committed, synced = store.segment_state(path)
    if state == STATE_SEALED and synced >= committed:
        return committed  # sealed and durable: trusted (verify checks it on demand)
    try:
        seg = Segment.open_rw(path, store.layout, store.store_uuid, store.schema.hash)
    except FileNotFoundError:
        return None
    except CorruptSegmentError as exc:
        report.unreadable[name] = str(exc)
        return None
    try:
        kept, dropped = recover_segment(seg)
        report.recovered[name] = kept
        if dropped:
            report.dropped[name] = dropped
        log.info("recovered %s: kept %d rows, dropped %d", path, kept, dropped)
    finally:
        seg.close(fdatasync=True)
    try:  # its writer checksummed the rows before ``synced``, recovery checked the rest: checked
        store.catalog.checked(name, identity(os.stat(path)), ())
    except OSError:
        pass  # the first reader checks it
    return kept


def _remove(path: Path) -> None:
    doomed = path.with_name(path.name + ".deleted")
    try:
        os.rename(path, doomed)
    except FileNotFoundError:
        return
    doomed.unlink(missing_ok=True)  # another recovering process may have finished it
    fsync_dir(path.parent)


def _depart(store: ReplayStore, name: str, remove: Any) -> None:
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


def recover_abandoned(store: ReplayStore) -> RecoveryReport:
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
    for wid in writers:
        lock = store.lock(writer_lock_name(wid))
        if not lock.acquire(exclusive=True):
            continue  # a live writer owns it
        try:
            recover_writer(store, wid, report)
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
