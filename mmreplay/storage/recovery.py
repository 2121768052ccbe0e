"""Recovery: bring back what a crash left unfinished, losing only what was never made durable.

A crash (``kill -9``, a power loss) may leave segments still OPEN, control pages or headers that
never reached the disk (zeros), files half made or half evicted, and files under names that no
longer match their headers. Counters are caches; the checksummed stamps are the truth (SQLite's
wal-index, Kafka's ``LogSegment.recover``). Recovery runs at every writable open, for every writer
id no live session holds, and when a writer session takes its id.

**Files first** (:func:`recover_abandoned`, under ``alloc.lock``):

* a file is **removed** only with durable evidence that it holds no needed row: a departure line
  in the catalog (``catalog.py``) names it (an interrupted eviction is finished: its departure is
  written, fsynced, before the unlink), or no ``sealed`` line names it and neither its control
  page nor its stamps show a row (an unfinished creation: ``.tmp`` files, spares made ahead of
  need, files whose header or size never reached the disk);
* a file whose header is unreadable but whose stamps show rows gets its header **rebuilt** when
  another segment of the same writer holds the session: every candidate session's epoch is tried
  and the one under which the file's rows verify (the crc seed binds a row to its store, segment,
  slot, sequence and session) is written back; every row that verifies is kept;
* a file under the wrong name (its header names another segment id or writer) is **renamed** to
  its header's name, through ``<name>.renaming`` so that two swapped files never overwrite each
  other; a second file claiming a segment another file holds is set aside as a ``.dup.corrupt``;
* anything else that cannot be read (a damaged header that cannot be rebuilt, a file cut short, a
  segment of another store) is left in place and reported; ``verify --repair`` quarantines it
  (renamed ``.corrupt``, kept) and counts its rows (the catalog's count) as lost.

**Then each dead writer's segments**, session by session in chain order
(:func:`recover_writer`). Every segment follows one rule, whatever its control page says: its
count comes from the catalog (a segment recorded sealed), the chain (a session only moves on from
a full segment), the control page, or, where a control slot is damaged, the stamps; every row from
row 0 is checked (``check_kernel``); a failing row before the durable point (the control page's
``synced`` count, every row for a segment sealed and synced) is **damaged**: masked, left in the
file, excluded by every reader (``checks.py``) and reported for ``verify --repair``; a failing row
past it was **torn** by a power loss (never made durable): lost, counted, and masked in place, or
cut off when it ends the segment; every row after a bad one whose own stamp verifies is kept.
The control page is then written again (SEALED, synced) and the check recorded in the catalog.
Rows stamped past the control page's count were never published (or their publication never
reached the disk): dropped and counted, their stamps zeroed so that they cannot come back.

So damage in one segment never costs another, and a published row survives a ``kill -9`` (the page
cache survives the process: every published row verifies). ``RecoveryReport.lines()`` says what was
done, with the rows lost (a writable open logs them).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .format import CONTROL_OFFSET, PAGE_SIZE, SEQ_MASK, STATE_SEALED, Control, Header, Layout, damaged_control_slots
from ..core.errors import CorruptSegmentError
from ..core import fs
from ..core.fs import fsync_dir
from .segment import (Segment, never_held_rows, parse_segment_name, read_segment_meta, segment_name, segment_state,
                      shows_rows, stamp_column)
from .checks import identity, to_ranges
from .locks import ALLOC, writer_lock_name

if TYPE_CHECKING:
    from .catalog import CatalogState
    from .files import StoreFiles

log = logging.getLogger(__name__)

RENAMING = ".renaming"
"""Suffix of a segment file being moved to its header's name (finished by the next recovery)."""


@dataclass
class RecoveryReport:
    """What recovery did: segments sealed, rows dropped or masked, files cleaned, renamed,
    rebuilt, and files it could not read."""

    recovered: dict[str, int] = field(default_factory=dict)
    """segment file -> rows kept (served)."""
    dropped: dict[str, int] = field(default_factory=dict)
    """segment file -> rows a dead writer never made durable that fail their checks (torn), or that
    it stamped past its last published count: lost."""
    masked: dict[str, int] = field(default_factory=dict)
    """segment file -> damaged durable rows masked (their bytes stay in the file; never served)."""
    torn: dict[str, int] = field(default_factory=dict)
    """segment file -> of its ``dropped`` rows, the torn ones left in place inside its count (masked
    there like damaged rows: a reader's ``check_counts()["damaged_rows"]`` counts them too)."""
    cleaned: list[str] = field(default_factory=list)
    """Files removed: unfinished creations, finished evictions, segments that never held a row."""
    renamed: dict[str, str] = field(default_factory=dict)
    """old file name -> new: files moved to their header's name."""
    rebuilt: dict[str, int] = field(default_factory=dict)
    """segment file -> rows that verify under the header rebuilt from its session."""
    unreadable: dict[str, str] = field(default_factory=dict)
    gaps: dict[tuple[int, int, int], int] = field(default_factory=dict)
    """``(writer id, session epoch, chain index)`` -> rows: chain positions no file holds and no
    catalog line explains (the catalog was missing or cut), acknowledged in the catalog: lost."""
    catalog: str = ""
    """What was wrong with ``CATALOG.log`` (missing, cut): rebuilt from the segment files."""

    def __bool__(self) -> bool:
        return bool(self.recovered or self.cleaned or self.unreadable or self.renamed or self.rebuilt or self.gaps
                    or self.catalog)

    @property
    def rows_lost(self) -> int:
        return sum(self.dropped.values()) + sum(self.gaps.values())

    def lines(self) -> list[str]:
        """One line per thing done, each with the rows it cost."""
        out = [f"renamed {a} to {b} (the segment its header names)" for a, b in sorted(self.renamed.items())]
        out += [f"rebuilt the header of {n} from its writer session's other segments ({k:,} rows verify)"
                for n, k in sorted(self.rebuilt.items())]
        out += [f"recovered {n}: kept {k:,} rows"
                + (f", lost {self.dropped[n]:,} rows a dead writer never made durable (torn) or never published"
                   if self.dropped.get(n) else "")
                + (f", masked {self.masked[n]:,} damaged rows" if self.masked.get(n) else "")
                for n, k in sorted(self.recovered.items())]
        out += [f"removed {n} (no row: {_why_clean(n)})" for n in self.cleaned]
        out += [f"left {n} alone: {why}" for n, why in sorted(self.unreadable.items())]
        if self.catalog:
            out.append(f"CATALOG.log {self.catalog}: every sealed segment file is catalogued again")
        out += [f"lost: writer {w}'s session {ep:016x} has no segment at chain position {ci} ({rows:,} rows; "
                "acknowledged)" for (w, ep, ci), rows in sorted(self.gaps.items())]
        return out


def _why(exc: CorruptSegmentError) -> str:
    """The error's message without the library's hint (the report says what to do)."""
    return str(exc.args[0]) if exc.args else str(exc)


def _why_clean(name: str) -> str:
    if name.endswith(".tmp"):
        return "an interrupted creation"
    if name.endswith(".deleted"):
        return "an interrupted eviction, finished"
    return "made ahead of need and never written, or its creation never reached the disk"


# -- evidence read without trusting a header ------------------------------------------------------
def stamped_extent(h: Header, st: np.ndarray) -> int:
    """One past the last row whose stamp holds its own row number (0 if none)."""
    n = min(len(st), h.usable_records)
    want = np.arange(h.first_seq + 1, h.first_seq + n + 1, dtype=np.uint64)
    seq = st["seq"][:n]
    ok = (seq & np.uint64(SEQ_MASK)) == (want & np.uint64(SEQ_MASK)) if h.format_version >= 2 else seq == want
    hit = np.flatnonzero(ok)
    return int(hit[-1]) + 1 if len(hit) else 0


# -- files: leftovers, names, headers --------------------------------------------------------------
def _remove(path: Path) -> None:
    doomed = path.with_name(path.name + ".deleted")
    try:
        fs.rename(path, doomed)
    except FileNotFoundError:
        return
    fs.unlink(doomed)  # another recovering process may have finished it
    fsync_dir(path.parent)


def _depart(store: StoreFiles, name: str, remove: Any, why: str = "recovery") -> None:
    """Record segment ``name`` as removed (fsynced), then ``remove()`` its file; the caller holds
    ``alloc.lock``, so a catalog compaction (run by evictions under it) never rewrites the log
    between the two and drops the departure."""
    store.catalog.departed(name, "removed", why)
    remove()


def _finish_leftovers(store: StoreFiles, state: CatalogState, names: list[str], report: RecoveryReport) -> None:
    """``.tmp`` files (interrupted creations) and ``.deleted`` ones (interrupted evictions or
    discards); caller holds ``alloc.lock``."""
    d = store.segments_dir
    if any(n.endswith(".deleted") for n in names):
        store.catalog.sync()  # a departure is durable before its file goes (an eviction defers this fsync)
    for name in names:
        path = d / name
        if name.endswith(".tmp"):
            final = name.removeprefix(".").removesuffix(".tmp")
            if shows_rows(path, store.layout):
                # a segment whose creation's rename a power loss undid while its rows reached the disk: put back
                if parse_segment_name(final) and not os.path.exists(d / final):
                    fs.rename(path, d / final)
                    fsync_dir(d)
                    report.renamed[name] = final
                else:
                    report.unreadable[name] = "a leftover .tmp file that holds rows (kept)"
                continue
            fs.unlink(path)
            report.cleaned.append(name)
        elif name.endswith(".deleted"):
            base = name.removesuffix(".deleted")
            if base not in state.departed and shows_rows(path, store.layout):
                # an eviction whose departure a power loss lost (it is fsynced before the unlink): written now
                store.catalog.departed(base, "evicted", "capacity")
                state.departed.add(base)
                state.live.pop(base, None)
            fs.unlink(path)
            report.cleaned.append(name)


def _finish_renames(store: StoreFiles, names: list[str], report: RecoveryReport) -> None:
    """Move ``<name>.renaming`` files (a rename to the header's name a crash interrupted) to their
    name; caller holds ``alloc.lock``."""
    d = store.segments_dir
    moved = False
    for tmp in names:
        if not tmp.endswith(RENAMING):
            continue
        name = tmp.removesuffix(RENAMING)
        if os.path.exists(d / name):
            dup = _free_name(d, name + ".dup.corrupt")
            fs.rename(d / tmp, d / dup)
            report.unreadable[dup] = f"another file holds {name}: set aside (its rows are served from {name})"
        else:
            fs.rename(d / tmp, d / name)
            report.renamed[tmp] = name
        moved = True
    if moved:
        fsync_dir(d)


def _free_name(d: Path, name: str) -> str:
    n, out = 1, name
    while os.path.exists(d / out):
        n += 1
        out = f"{name.removesuffix('.corrupt')}{n}.corrupt"
    return out


@dataclass
class _Seen:
    """One segment file as recovery found it."""

    name: str
    header: Header | None
    control: Control | None
    error: CorruptSegmentError | None = None


def _survey(store: StoreFiles, writer_id: int | None = None) -> dict[str, _Seen]:
    """Every segment-named file (of ``writer_id``, by its name, if given): its header and control
    page, or why they cannot be read."""
    out = {}
    for name in sorted(os.listdir(store.segments_dir)):
        parsed = parse_segment_name(name)
        if parsed is None or (writer_id is not None and parsed[1] != writer_id) \
                or not os.path.isfile(store.segments_dir / name):
            continue  # (a directory under a segment's name is left alone; verify names it)
        try:
            fd = os.open(store.segments_dir / name, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            h, c = read_segment_meta(fd, name, store.layout, store.store_uuid, store.schema.hash)
            out[name] = _Seen(name, h, c)
        except CorruptSegmentError as exc:
            out[name] = _Seen(name, _intact_header(fd, store) if exc.kind in ("short", "counts") else None, None, exc)
        finally:
            os.close(fd)
    return out


def _intact_header(fd: int, store: StoreFiles) -> Header | None:
    """The header of a file refused for its size or counts, when the header itself is this store's
    and intact (its identity: a file cut short under the wrong name is renamed like any other)."""
    try:
        h = Header.unpack(os.pread(fd, PAGE_SIZE, 0), "")
    except CorruptSegmentError:
        return None
    return h if h.store_uuid == store.store_uuid and h.schema_hash == store.schema.hash else None


def _fix_names(store: StoreFiles, seen: dict[str, _Seen], report: RecoveryReport) -> None:
    """Rename files whose header names another segment to that name (two phases through
    ``.renaming``, so swapped files never overwrite each other); caller holds ``alloc.lock``."""
    d = store.segments_dir
    wrong = [(n, s) for n, s in seen.items() if s.header is not None
             and parse_segment_name(n) != (s.header.segment_id, s.header.writer_id)]
    if not wrong:
        return
    staged = []
    for name, s in wrong:
        assert s.header is not None
        target = segment_name(s.header.segment_id, s.header.writer_id)
        holder = seen.get(target)
        if (holder is not None and holder.error is not None and s.error is None and holder.header is not None
                and parse_segment_name(target) == (holder.header.segment_id, holder.header.writer_id)):
            aside = _free_name(d, target + ".dup.corrupt")  # a damaged copy under the name: the intact one takes it
            fs.rename(d / target, d / aside)
            report.unreadable[aside] = f"a damaged copy of {target} ({_why(holder.error)}): set aside"
            del seen[target]
            holder = None
        if holder is not None and holder.header is not None and parse_segment_name(target) == (
                holder.header.segment_id, holder.header.writer_id):
            dup = _free_name(d, target + ".dup.corrupt")  # the segment is held by the file of its name
            fs.rename(d / name, d / dup)
            report.unreadable[dup] = f"a second copy of {target} under the name {name}: set aside (its rows are " \
                                     f"served from {target})"
            del seen[name]
            continue
        if holder is not None and holder.header is None and all(t != name for _, t in staged):
            # a file whose header cannot be read holds the name: the two traded names (the likeliest), so it
            # takes this one's (its header is rebuilt there, or it is quarantined under it)
            fs.rename(d / target, d / (name + RENAMING))
            staged.append((target, name))
        fs.rename(d / name, d / (target + RENAMING))
        staged.append((name, target))
    fsync_dir(d)
    moving = {name: seen.pop(name) for name, _ in staged}  # (all out first: two swapped files trade names)
    for name, target in staged:
        s = moving[name]
        if os.path.exists(d / target):  # an unreadable file holds the name: both kept, for a repair
            report.unreadable[target + RENAMING] = f"its header names {target}, which another file holds"
            continue
        fs.rename(d / (target + RENAMING), d / target)
        report.renamed[name] = target
        seen[target] = s
    fsync_dir(d)


def _rebuild_header(store: StoreFiles, name: str, seen: dict[str, _Seen]) -> tuple[int, Header | None]:
    """Write back the header of segment file ``name`` (unreadable) from another segment of the same
    writer: the session under whose epoch its stamped rows verify. Returns the rows that verify and
    the header written (``(0, None)``: nothing written)."""
    from .checks import scan

    parsed = parse_segment_name(name)
    assert parsed is not None
    sid, wid = parsed
    lay = store.layout
    path = store.segments_dir / name
    if os.stat(path).st_size < lay.file_size:
        return 0, None
    st = stamp_column(path, lay)
    stamped = np.flatnonzero(st["seq"])
    if not len(stamped):
        return 0, None
    sessions = {}
    for s in seen.values():
        h = s.header
        if h is not None and h.writer_id == wid and h.segment_id != sid:
            sessions.setdefault(h.session_epoch, []).append(h)
    if not sessions:
        return 0, None
    with open(path, "rb") as fh:
        data = os.pread(fh.fileno(), lay.file_size, 0)
    best, best_good = None, 0
    i0 = int(stamped[0])
    for epoch, hs in sessions.items():
        h0 = hs[0]
        field_ = int(st["seq"][i0])
        first = (field_ & SEQ_MASK) - i0 - 1 if h0.format_version >= 2 else field_ - i0 - 1
        chains = {h.chain_index for h in hs}
        candidates = {c + 1 for c in chains} | {c - 1 for c in chains if c} | (
            {first // h0.usable_records} if first >= 0 and first % h0.usable_records == 0 else set())
        for ci in sorted(candidates - chains):
            h = Header(store.store_uuid, sid, wid, h0.lanes, epoch, ci, ci * h0.usable_records, store.schema.hash,
                       lay.segment_records, h0.usable_records, lay.file_size, h0.created_ns, h0.format_version)
            n = stamped_extent(h, st)
            if not n:
                continue
            good = n - int(np.count_nonzero(np.asarray(scan(h, lay, st, data, 0, n))[:n]))
            if good > best_good:
                best, best_good = h, good
    if best is None:
        return 0, None
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        fs.pwrite(fd, best.pack(), 0)
        fs.fsync(fd)
    finally:
        os.close(fd)
    return best_good, best


def _triage(store: StoreFiles, state: CatalogState, report: RecoveryReport) -> None:
    """Names, headers and files that hold no row (see the module docstring); caller holds
    ``alloc.lock``."""
    seen = _survey(store)
    _fix_names(store, seen, report)
    for name, s in list(seen.items()):
        exc = s.error
        if exc is None:
            continue
        path = store.segments_dir / name
        if exc.kind == "foreign":  # another store's: no row of this one; a repair quarantines it
            report.unreadable[name] = _why(exc)
        elif name not in state.live and never_held_rows(path, store.layout):
            _depart(store, name, lambda p=path: fs.unlink(p))  # an unfinished creation
            report.cleaned.append(name)
        elif exc.kind == "header" and (rebuilt := _rebuild_header(store, name, seen))[0]:
            report.rebuilt[name] = rebuilt[0]
            seen[name] = _Seen(name, rebuilt[1], None)
        else:
            report.unreadable[name] = _why(exc)  # kept; `verify --repair` quarantines it
    if report.renamed or report.cleaned:
        fsync_dir(store.segments_dir)


def _acknowledge_gaps(store: StoreFiles, state: CatalogState, missing: bool, report: RecoveryReport) -> None:
    """A missing or cut catalog: chain positions nothing explains are lost rows (``files.chain_gaps``),
    recorded in the catalog and reported. Run after the dead writers' segments were recovered (their
    counts are final: a segment that holds no row says nothing of the position before it); caller
    holds ``alloc.lock``."""
    from .files import chain_gaps

    seen = _survey(store)
    headers = [s.header for n, s in seen.items() if s.header is not None and s.error is None
               and ((s.control is not None and s.control.committed) or n in state.live)]
    if not headers:
        return
    readable = {segment_name(h.segment_id, h.writer_id) for h in headers}
    # departed, catalogued, and files present but not counted (unreadable, quarantined, empty) explain a position
    others = [*state.departed, *state.live, *(n for n in os.listdir(store.segments_dir) if n not in readable)]
    for w, ep, ci, rows in chain_gaps(headers, state, others, catalog_incomplete=missing or bool(state.torn_lines)):
        store.catalog.gap(w, ep, ci)
        state.gaps.add((w, ep, ci))
        report.gaps[(w, ep, ci)] = rows


def recover_abandoned(store: StoreFiles) -> RecoveryReport:
    """On open with ``mode='a'``: finish interrupted creations, evictions and renames, fix names and
    headers (see the module docstring), recover the segments of every writer no live session holds
    (live writers' segments are left alone), and, where the catalog is missing or cut, name the
    chain positions it would have explained."""
    report = RecoveryReport()
    missing = not store.catalog.path.exists()  # (read first: recovery's own lines make the file)
    alloc = store.lock(ALLOC)
    alloc.acquire(exclusive=True, blocking=True)
    try:
        state = store.catalog.read()
        names = os.listdir(store.segments_dir)
        _finish_leftovers(store, state, names, report)
        _finish_renames(store, names, report)
        _triage(store, state, report)
    finally:
        alloc.release()
    writers = sorted({p[1] for n in os.listdir(store.segments_dir) if (p := parse_segment_name(n))})
    for wid in writers:
        lock = store.lock(writer_lock_name(wid))
        if not lock.acquire(exclusive=True):
            continue  # a live writer owns it
        try:
            recover_writer(store, wid, report, state.live)
        finally:
            lock.release()
    if missing or state.torn_lines:
        if missing and any(parse_segment_name(n) and segment_state(store.segments_dir / n)[0] == STATE_SEALED
                           for n in os.listdir(store.segments_dir)):
            report.catalog = "was missing"  # (before any segment is sealed, a store has none: nothing odd)
        alloc.acquire(exclusive=True, blocking=True)
        try:
            _acknowledge_gaps(store, state, missing, report)
        finally:
            alloc.release()
    return report


# -- a dead writer's segments -----------------------------------------------------------------------
def recover_writer(store: StoreFiles, writer_id: int, report: RecoveryReport | None = None,
                   catalogued: dict[str, int] | None = None) -> RecoveryReport:
    """Recover the segments of ``writer_id`` left unfinished (caller holds that writer's lock);
    see the module docstring. ``catalogued``: the catalog's sealed segments (name -> rows), read
    once by the caller (else here)."""
    report = report if report is not None else RecoveryReport()
    if catalogued is None:
        catalogued = store.catalog.read().live
    sessions: dict[int, list[tuple[int, str, Header, Control | None]]] = {}
    for name, seen in _survey(store, writer_id).items():
        if seen.error is not None:
            report.unreadable[name] = _why(seen.error)  # verify --repair quarantines it
            continue
        h = seen.header
        assert h is not None
        sessions.setdefault(h.session_epoch, []).append((h.chain_index, name, h, seen.control))
    for chain in sessions.values():
        chain.sort(key=lambda x: x[0])
        rows = [_held(store, name, h, c, catalogued) for _, name, h, c in chain]
        for i, (_, name, h, c) in enumerate(chain):
            full = any(rows[i + 1:])  # the session wrote past it: it was full
            path = store.segments_dir / name
            if not rows[i] and not full and (c is not None or never_held_rows(path, store.layout)):
                # no row by the catalog, the control page and the stamps: a spare
                if name not in catalogued and (c is None or c.state != STATE_SEALED):
                    alloc = store.lock(ALLOC)
                    alloc.acquire(exclusive=True, blocking=True)
                    try:
                        _depart(store, name, lambda p=store.segments_dir / name: _remove(p))
                    finally:
                        alloc.release()
                    report.cleaned.append(name)
                continue
            if c is not None and c.state == STATE_SEALED and c.synced >= c.committed:
                continue  # sealed and durable: trusted (checked by the first reader, or verify)
            # a dead writer's last segment, open or with no readable control page: its count is its own
            tail = not full and name not in catalogued and (c is None or c.state != STATE_SEALED)
            count = h.usable_records if full else catalogued.get(name, rows[i])
            _recover_one(store, name, report, tail=tail, count=count)
    return report


def _held(store: StoreFiles, name: str, h: Header, c: Control | None, catalogued: dict[str, int]) -> int:
    """Rows a segment holds as far as its records say: the catalog's count; else a sealed control
    page's; else the larger of an open control page's and the extent of its stamped rows."""
    if name in catalogued:
        return catalogued[name]
    if c is not None and c.state == STATE_SEALED:
        return min(c.committed, h.usable_records)
    st = stamp_column(store.segments_dir / name, store.layout)
    return max(min(c.committed, h.usable_records) if c is not None else 0, stamped_extent(h, st))


def _recover_one(store: StoreFiles, name: str, report: RecoveryReport, *, tail: bool, count: int) -> None:
    """Recover one segment by the one rule (module docstring): a dead writer's open tail takes its
    count from its control page (from its stamps if a control slot is damaged); any other is sealed
    with ``count`` rows."""
    path = store.segments_dir / name
    try:
        seg = Segment.open_rw(path, store.layout, store.store_uuid, store.schema.hash)
    except FileNotFoundError:
        return
    except CorruptSegmentError as exc:
        report.unreadable[name] = _why(exc)
        return
    try:
        kept, bad, torn, unpublished = _check_and_seal(seg, tail=tail, count=count)
        damaged = bad[~np.isin(bad, torn)]
        lost = len(torn) + unpublished
        if lost:
            report.dropped[name] = lost
        if np.count_nonzero(torn < kept):
            report.torn[name] = int(np.count_nonzero(torn < kept))
        if len(damaged):
            report.masked[name] = len(damaged)
        report.recovered[name] = kept - len(bad)
        log.info("recovered %s: kept %d rows, lost %d, masked %d", path, kept - len(bad), lost, len(damaged))
    finally:
        seg.close(fdatasync=True)
    try:  # every row now checked: remember it for this file (its identity changed with the new control page)
        store.catalog.checked(name, identity(os.stat(path)), to_ranges(damaged), torn=to_ranges(torn[torn < kept]))
    except OSError:
        pass  # the first reader checks it


def _check_and_seal(seg: Segment, *, tail: bool, count: int) -> tuple[int, np.ndarray, np.ndarray, int]:
    """Check every row of ``seg`` up to its count and seal it; returns ``(rows kept in the count,
    bad slots left in it, torn slots (in it or cut off), rows stamped past it)``."""
    from .checks import scan

    c, h = seg.control, seg.header
    usable = h.usable_records
    intact = bool(c.version) and not damaged_control_slots(seg.view[CONTROL_OFFSET:])
    extent = stamped_extent(h, seg.stamps)
    if not intact and not extent:  # the count is the stamps' (and, where they are gone too, the records written)
        extent = _written_extent(seg)
    if tail:
        committed = min(c.committed, usable) if c.version else 0
        count = committed if intact else max(committed, extent)
        synced = min(c.synced, count) if c.version else 0
    else:
        count = min(count, usable)
        # (a control slot damaged: the durable point it holds is not the writer's last word, so every
        # row is taken as durable and a bad one as damaged)
        synced = min(c.synced, count) if intact else count
    unpublished = int(np.count_nonzero(seg.stamps["seq"][count:extent])) if extent > count else 0
    bad = np.flatnonzero(scan(h, seg.layout, seg.stamps, seg.view, 0, count)).astype(np.int64)
    torn = bad[bad >= synced]
    if tail and len(torn):  # torn rows that end the segment are cut off, not masked
        good_after = np.setdiff1d(np.arange(synced, count), torn)
        count = max(synced, int(good_after[-1]) + 1 if len(good_after) else synced)
    nz = np.flatnonzero(seg.stamps["seq"][count:])
    if len(nz):
        seg.stamps[count : count + nz[-1] + 1] = 0  # stale stamps past the count must never come back
    seg.sync_rows(0, usable)
    seg.publish(count, synced=count, state=STATE_SEALED, seal_crc=seg.stamps_crc(count))
    seg.sync_control()
    return count, bad[bad < count], torn, unpublished


def _written_extent(seg: Segment) -> int:
    """One past the last row whose record holds a non-zero byte (rows written, whatever their stamps)."""
    recs = np.frombuffer(seg.view, np.uint8, seg.layout.record_bytes * seg.header.usable_records,
                         seg.layout.records_offset).reshape(seg.header.usable_records, -1)
    hit = np.flatnonzero(recs.any(axis=1))
    return int(hit[-1]) + 1 if len(hit) else 0


def seal_checked(seg: Segment, count: int) -> tuple[int, np.ndarray]:
    """Seal ``seg`` with ``count`` rows after checking all of them; returns ``(count, damaged
    slots)``. Damaged rows stay where they are (masked by every reader); no row is cut."""
    count, bad, _, _ = _check_and_seal(seg, tail=False, count=count)
    return count, bad


def check_groups(h: Header, layout: Layout, st: np.ndarray, view: Any, start: int, stop: int) -> int:
    """Walk commit groups from ``start`` (a group boundary) towards ``stop``; return where the
    first invalid group begins (``>= stop`` when all are valid). ``st`` is the segment's stamp
    column, ``view`` a buffer of the whole segment file. The rule is ``check_kernel``'s."""
    from .checks import scan

    return int(scan(h, layout, st, view, start, stop, first_only=True))
