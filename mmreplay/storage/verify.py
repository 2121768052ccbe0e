"""verify: check a store's files without changing them, and repair what can be repaired.

Checks, per segment file: header (magic, version, crc, store uuid, schema hash, size before
mapping), the name against the header, the two control slots (and the count against the
catalog's for a sealed segment), and the rows: every commit group's stamps and crc32c up to the
committed count (``checks.scan_rows``), each damaged run of rows one problem. ``fast=True`` reads
only the stamp column of a sealed segment and compares its crc with the one recorded at seal;
where it differs the segment is checked in full. Every segment the catalog (``catalog.py``) lists
as sealed and never evicted whose file is gone is a problem (**lost** rows).

Words: a row is **masked** when its bytes are present but excluded from every view (a damaged
row; ``checks.py``); **lost** when no file holds it any more. Problems are findings that cost
rows or need a repair; **notes** (``verify_store(notes=...)``) are findings that cost nothing:
leftovers of an interrupted creation or eviction (the next writable open finishes them), a
quarantined file, a damaged control slot whose twin holds the count. Damaged rows that a repair
masked are not problems while the file is unchanged: ``masked_rows`` counts them. Verification
takes no locks and writes nothing.

``repair_store`` takes the admin lock (no writer may be active), runs recovery (``recovery.py``:
dead writers' open tails are cut back to their valid prefix, every other unfinished segment is
sealed with its damaged rows masked), writes back damaged stamps of rows whose records their
commit group's crc32c proves intact and damaged control slots (from the twin slot or the
catalog), **masks** damaged rows (a ``masked`` catalog line: every good row stays, row ids and
saved priorities stay valid), and **quarantines** a segment whose header is damaged by renaming
it to ``.corrupt`` (recorded in the catalog first, never deleted). It never removes a file that
holds a row; it says what it did, with the rows masked, quarantined and lost, in
``RepairReport``. A second repair finds nothing to do.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .catalog import CATALOG, SegmentRecord
from .checks import CHECK_THREADS, from_ranges, identity, scan_rows, to_ranges
from .format import CONTROL_OFFSET, CONTROL_SLOT_SIZE, STATE_SEALED, Header, damaged_control_slots, read_control
from ..core import fs
from ..core.errors import CorruptSegmentError, StoreLockedError
from .segment import Segment, never_held_rows, parse_segment_name, shows_rows
from .locks import ADMIN, writer_lock_name
from .manifest import MANIFEST, load_manifest, restore_manifest

from .recovery import RENAMING

if TYPE_CHECKING:
    from collections.abc import Callable
    from .catalog import CatalogState
    from .files import StoreFiles
    from .recovery import RecoveryReport


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding: which file, which row (if any), and what is wrong."""

    file: str
    slot: int | None
    reason: str
    rows: tuple[tuple[int, int], ...] = ()
    """Damaged rows as ``[start, stop)`` slot ranges (a row-level problem a repair masks)."""
    fix: str = ""
    """What a repair does about it: ``"mask"``, ``"stamps"`` (write the stamps back), ``"control"``
    (write the control page back), ``"quarantine"``, ``"lost"`` (acknowledge), or ``""``."""

    def __str__(self) -> str:
        where = f"{self.file}" + (f" slot {self.slot}" if self.slot is not None else "")
        return f"{where}: {self.reason}"


@dataclass
class RepairReport:
    """What ``verify --repair`` did."""

    actions: list[str] = field(default_factory=list)
    """One line per thing done."""
    problems: list[Problem] = field(default_factory=list)
    """Problems left after the repair (a verify run after it)."""
    rows_masked: int = 0
    """Damaged rows masked by this repair (their bytes stay in the file, never served)."""
    rows_quarantined: int = 0
    """Rows of the segments quarantined (their files kept as ``.corrupt``, no longer served)."""
    rows_lost: int = 0
    """Rows lost: a dead writer's torn or unpublished rows, files found gone, chain positions no file
    holds."""
    rows_torn: int = 0
    """Of ``rows_lost``, torn rows left masked in place (inside their segment's count: a reader's
    ``check_counts()["damaged_rows"]`` counts them too)."""
    unknown: list[str] = field(default_factory=list)
    """Files quarantined whose row count nothing records (not in ``rows_quarantined``)."""

    @property
    def rows_cost(self) -> int:
        """Rows the store no longer serves because of what this repair found (quarantined or lost)."""
        return self.rows_quarantined + self.rows_lost


def verify_store(store: StoreFiles, *, fast: bool = False, notes: list[Problem] | None = None,
                 writable: bool = False, progress: Callable[[int, int], None] | None = None) -> list[Problem]:
    """Every problem found in the store's segment files (an empty list means clean); findings that
    cost nothing are appended to ``notes`` when given. ``writable``: the caller may take locks
    (a dead writer's open segment is then reported as needing recovery). ``progress(done, total)``
    is called as segment files are checked."""
    problems: list[Problem] = []
    notes = notes if notes is not None else []
    state = store.catalog.read() if store.catalog.path.exists() else None
    checks = state.checks if state is not None else {}
    live = state.live if state is not None else {}
    names = sorted(os.listdir(store.segments_dir))
    headers: list[Header] = []
    todo: list[tuple[int, int, str, tuple[int, int]]] = []  # segment files, checked below, in parallel
    for name in names:
        if name.endswith(".tmp"):
            if shows_rows(store.segments_dir / name, store.layout):
                problems.append(Problem(name, None, "a segment whose creation a crash undid while its rows reached the "
                                                    "disk: not served (a writable open or `verify --repair` puts it "
                                                    "back under its name)", fix="rename"))
            else:
                notes.append(Problem(name, None, "leftover of an interrupted segment creation (no row; the next "
                                                 "writable open removes it)"))
            continue
        if name.endswith(".deleted"):
            notes.append(Problem(name, None, "leftover of an interrupted eviction (the next writable open finishes "
                                             "it)"))
            continue
        if name.endswith(RENAMING):
            notes.append(Problem(name, None, "a segment file being moved to its header's name (the next writable "
                                             "open finishes it; its rows are served meanwhile)", fix="rename"))
            continue
        if name.endswith(".corrupt"):
            notes.append(Problem(name, None, "quarantined by a repair (kept as a file, not served)"))
            continue
        parsed = parse_segment_name(name)
        if parsed is None:
            notes.append(Problem(name, None, "not a segment file name (left alone, not served)"))
            continue
        if not os.path.isfile(store.segments_dir / name):
            notes.append(Problem(name, None, "not a regular file (a directory?): left alone, not served"))
            continue
        todo.append((len(problems), len(notes), name, parsed))

    def one(job: tuple[int, int, str, tuple[int, int]]) -> tuple[list[Problem], list[Problem], list[Header]]:
        own_notes: list[Problem] = []
        own_headers: list[Header] = []
        found = _verify_segment(store, store.segments_dir / job[2], job[3], fast=fast, checks=checks, live=live,
                                notes=own_notes, writable=writable, headers=own_headers)
        return found, own_notes, own_headers

    # one segment per core at a time (the check kernel runs without the GIL), each file read ahead whole;
    # the findings are put back where a loop over the files in name order puts them
    found: list[tuple[int, int, list[Problem], list[Problem]]] = []
    with ThreadPoolExecutor(max(1, min(len(todo), CHECK_THREADS))) as pool:
        for i, ((at, note_at, _, _), (own, own_notes, own_headers)) in enumerate(zip(todo, pool.map(one, todo))):
            found.append((at, note_at, own, own_notes))
            headers.extend(own_headers)
            if progress is not None:
                progress(i + 1, len(todo))
    for at, note_at, own, own_notes in reversed(found):  # later insertion points first: earlier ones hold
        problems[at:at] = own
        notes[note_at:note_at] = own_notes
    for name, rows in sorted(store.lost_segments(state).items()):
        problems.append(Problem(name, None, f"lost: the catalog lists it sealed with {rows} rows, and its file is "
                                            "gone (it was not evicted)", fix="lost"))
    problems += _catalog_problems(store, state, headers, names)
    for name in load_manifest(store.path)[1]:
        (problems if name == MANIFEST else notes).append(Problem(
            name, None, "damaged or missing: the store's manifest is read from its other copy (nothing lost; "
                        "a writable open or `verify --repair` writes it back)", fix="manifest"))
    return problems


def _catalog_problems(store: StoreFiles, state: CatalogState | None, headers: list[Header],
                      names: list[str]) -> list[Problem]:
    """A missing or cut catalog, and the chain positions it would have explained (``files.chain_gaps``)."""
    from .catalog import CatalogState
    from .files import chain_gaps

    from .segment import segment_name, segment_state

    out = []
    missing = state is None
    sealed = [h for h in headers if missing and segment_state(store.segments_dir / segment_name(
        h.segment_id, h.writer_id))[0] == STATE_SEALED]
    if missing and sealed:
        out.append(Problem(CATALOG, None, f"missing: the record of the store's sealed segments and of how each left "
                                          f"is gone ({len(sealed)} sealed segment file(s) present; a writable open or "
                                          "`verify --repair` writes it again from the files)", fix="catalog"))
    elif state is not None and state.torn_lines:
        out.append(Problem(CATALOG, None, f"{state.torn_lines} line(s) cut or damaged (a crash mid-append, or damage); "
                                          "`verify --repair` rewrites it with what its other lines say",
                           fix="catalog"))
    if missing or (state is not None and state.torn_lines):
        st = state if state is not None else CatalogState()
        readable = {segment_name(h.segment_id, h.writer_id) for h in headers}
        others = [*st.departed, *st.live, *(n for n in names if n not in readable)]  # departed, unreadable, quarantined
        for w, ep, ci, rows in chain_gaps(headers, st, others, catalog_incomplete=missing or bool(st.torn_lines)):
            out.append(Problem(CATALOG, None, f"possibly lost: writer {w}'s session {ep:016x} has no segment at "
                                              f"chain position {ci} ({rows:,} rows; nothing records it evicted)",
                               fix="gap"))
    return out


def _masks(store: StoreFiles) -> dict[str, SegmentRecord]:
    """Masks (``verify --repair``) recorded in the catalog, by segment name."""
    if not store.catalog.path.exists():
        return {}
    return {n: r for n, r in store.catalog.read().checks.items() if r.masked}


def _records(store: StoreFiles) -> dict[str, SegmentRecord]:
    """The latest check of each segment the catalog records."""
    return store.catalog.read().checks if store.catalog.path.exists() else {}


def _gap_of(reason: str) -> tuple[int, int, int, int]:
    """``(writer id, epoch, chain index, rows)`` of a ``gap`` problem's text."""
    import re

    m = re.search(r"writer (\d+)'s session ([0-9a-f]{16}) has no segment at chain position (\d+) \(([\d,]+) rows",
                  reason)
    assert m is not None, reason
    return int(m.group(1)), int(m.group(2), 16), int(m.group(3)), int(m.group(4).replace(",", ""))


def masked_rows(store: StoreFiles) -> int:
    """Rows masked by a repair in segment files still unchanged since (left out of every batch)."""
    total = 0
    for name, rec in _masks(store).items():
        try:
            if identity(os.stat(store.segments_dir / name)) == tuple(rec.identity):
                total += sum(b - a for a, b in rec.bad)
        except FileNotFoundError:
            pass
    return total


def _ranges_text(ranges: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(f"{a}-{b - 1}" for a, b in ranges[:5]) + (f" and {len(ranges) - 5} more" if len(ranges) > 5 else "")


def _acknowledged(rec: SegmentRecord | None, ident: tuple[int, ...]) -> np.ndarray:
    """Slots whose failure the catalog already accounts for in this very file: masked by a repair,
    or found torn (lost, reported) by recovery."""
    if rec is None or tuple(rec.identity) != tuple(ident):
        return np.zeros(0, np.int64)
    return np.union1d(from_ranges(rec.bad) if rec.masked else np.zeros(0, np.int64), from_ranges(rec.torn))


def _verify_segment(store: StoreFiles, path: Path, parsed: tuple[int, int], *, fast: bool,
                    checks: dict[str, SegmentRecord], live: dict[str, int], notes: list[Problem],
                    writable: bool, headers: list[Header]) -> list[Problem]:
    name = path.name
    try:
        seg = Segment.open_rw(path, store.layout, store.store_uuid, store.schema.hash, writable=False)
    except CorruptSegmentError as exc:
        if exc.kind != "foreign" and name not in live and never_held_rows(path, store.layout):
            notes.append(Problem(name, None, f"{str(exc).removeprefix(f'{path}: ')}: it holds no row (a creation a "
                                             "crash cut short; the next writable open removes it)"))
            return []
        if exc.kind == "foreign":
            return [Problem(name, None, f"{str(exc).removeprefix(f'{path}: ')}: no row of this store "
                                        "(`verify --repair` quarantines the file)", fix="quarantine")]
        n = _rows_of(store, name, live)
        rows = f"its {n:,} rows" if n is not None else "its rows"
        return [Problem(name, None, f"{str(exc).removeprefix(f'{path}: ')}: {rows} are not served "
                                    "(`verify --repair` rebuilds its header from its writer session where the rows "
                                    "verify, else quarantines the file)", fix="quarantine")]
    except FileNotFoundError:
        return []  # evicted meanwhile
    try:
        h = seg.header
        if seg.control.committed or seg.control.version == 0 or name in live:  # (a spare holds no row: see chain_gaps)
            headers.append(h)
        if (h.segment_id, h.writer_id) != parsed:
            return [Problem(name, None, f"its header says segment {h.segment_id} of writer {h.writer_id}: its rows are "
                                        "served under that id (`verify --repair` renames the file; nothing lost)",
                            fix="rename")]
        c = seg.control
        out: list[Problem] = []
        if c.version == 0:
            if name not in live:
                return [Problem(name, None, "both control slots are damaged and the catalog has no record of it: "
                                            "the next writable open rebuilds its count from its stamps")]
            n = min(live[name], h.usable_records)
            out.append(Problem(name, None, f"both control slots are damaged: the catalog's count ({n:,} rows) is "
                                           "used (`verify --repair` writes the control page again)", fix="control"))
        elif c.state != STATE_SEALED and name in live:
            n = min(live[name], h.usable_records)
            out.append(Problem(name, None, f"its control page says open with {c.committed:,} rows, the catalog "
                                           f"records it sealed with {n:,} (a damaged control slot: `verify --repair` "
                                           "writes it again)", fix="control"))
        else:
            n = min(c.committed, h.usable_records)
            if c.state != STATE_SEALED:
                lock = store.lock(writer_lock_name(h.writer_id))
                if writable and lock.acquire(exclusive=True):
                    lock.release()
                    return [Problem(name, None, "open segment of a dead writer: needs recovery (the next writable "
                                                "open does it)")]
            if damaged_control_slots(seg.view[CONTROL_OFFSET:]):
                notes.append(Problem(name, None, "one control slot is damaged; the other holds the current count "
                                                 "(nothing lost; `verify --repair` writes it again)", fix="control"))
        if fast and c.version and c.state == STATE_SEALED and not out:
            if seg.stamps_crc(n) == c.seal_crc:
                return []  # the stamps are as sealed (the payload was not read: fast mode)
            notes.append(Problem(name, None, "its stamp column differs from its seal: checked in full"))
        os.posix_fadvise(seg.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)  # the whole file read ahead at once
        bad, stamp_bad = scan_rows(h, store.layout, seg.stamps, seg.view, 0, n)[:2]
        bad_slots = np.setdiff1d(np.flatnonzero(bad), _acknowledged(checks.get(name), identity(os.fstat(seg.fileno()))))
        out += [Problem(name, a, f"rows {a}-{b - 1} fail their stamp or crc32c check ({b - a} of {n} "
                                 "committed rows; masked: left out of every batch with every window that "
                                 "needs them)", ((a, b),), fix="mask")
                for a, b in to_ranges(bad_slots)]
        stamped = to_ranges(np.flatnonzero(stamp_bad))
        if stamped:
            out.append(Problem(name, None, f"the stamps of rows {_ranges_text(stamped)} are damaged; their records "
                                           "verify by their commit group's crc32c and are served (nothing lost; "
                                           "`verify --repair` writes the stamps again)", stamped, fix="stamps"))
        return out
    finally:
        seg.close()


def repair_store(store: StoreFiles, *, recovered: RecoveryReport | None = None,
                 restored: list[str] = ()) -> RepairReport:
    """Recover, write back stamps and control slots, mask and quarantine (see the module
    docstring); needs no live writer. ``recovered`` / ``restored``: what the writable open the
    repair runs in recovered, and the manifest files it wrote back (reported too)."""
    from .recovery import recover_abandoned

    admin = store.lock(ADMIN)
    if not admin.acquire(exclusive=True):
        raise StoreLockedError(f"{store.path} has active writers; close them before repairing")
    try:
        out = RepairReport()
        # what the writable open that this repair runs in recovered, and anything left since
        for report in (recovered, recover_abandoned(store)):
            if report:
                out.actions += report.lines()
                out.rows_lost += report.rows_lost  # (rows it masked are masked again below, and counted there)
                out.rows_torn += sum(report.torn.values())
        for name, rows in sorted(store.lost_segments().items()):  # nothing brings them back: acknowledge
            store.catalog.departed(name, "removed", "lost")
            out.actions.append(f"acknowledged the loss of {name} ({rows:,} rows): its file is gone")
            out.rows_lost += rows
        manifest, damaged = load_manifest(store.path)
        if damaged:
            restore_manifest(store.path, manifest, damaged)
        out.actions += [f"wrote back {name} from the manifest's other copy"
                        for name in sorted({*damaged, *restored})]  # (here, or by the open)
        notes: list[Problem] = []
        found = verify_store(store, notes=notes)
        for problem in found + notes:  # what is written back first: it changes the files' identities
            if problem.fix in ("stamps", "control") and parse_segment_name(problem.file):
                out.actions.append(_write_back(store, problem))
        live = store.catalog.read().live if store.catalog.path.exists() else {}
        masked: dict[str, list[tuple[int, int]]] = {}
        for problem in verify_store(store):
            src = store.segments_dir / problem.file
            if problem.fix == "catalog" and store.catalog.path.exists():
                store.catalog.rewrite(set(os.listdir(store.segments_dir)))
                out.actions.append(f"rewrote {CATALOG} with what its readable lines say ({problem.reason})")
                continue
            if problem.fix == "gap":
                w, ep, ci, rows = _gap_of(problem.reason)
                store.catalog.gap(w, ep, ci)
                out.rows_lost += rows
                out.actions.append(f"acknowledged the loss of writer {w}'s session {ep:016x} chain position {ci} "
                                   f"({rows:,} rows): no file holds it")
                continue
            if not (src.exists() and parse_segment_name(problem.file)):
                continue
            if problem.fix == "mask":
                masked.setdefault(problem.file, []).extend(problem.rows)
            elif problem.fix == "quarantine":
                rows = 0 if "another store" in problem.reason else _rows_of(store, problem.file, live)
                store.catalog.departed(problem.file, "quarantined")  # before the file goes
                fs.rename(src, src.with_name(src.name + ".corrupt"))
                fs.fsync_dir(src.parent)
                out.rows_quarantined += rows or 0
                if rows is None:
                    out.unknown.append(problem.file)
                out.actions.append(f"quarantined {problem.file} as {problem.file}.corrupt ({problem.reason}); "
                                   + (f"{rows:,} rows no longer served" if rows is not None else
                                      "its rows are no longer served (how many is unknown: neither the catalog nor "
                                      "its control page says)"))
        masks = _records(store)  # one read of the catalog for every segment masked below
        for name, ranges in masked.items():
            old = masks.get(name)
            ident = identity(os.stat(store.segments_dir / name))
            same = old is not None and tuple(old.identity) == ident
            keep = old.bad if same and old.masked else ()
            slots = np.union1d(from_ranges(tuple(ranges)), from_ranges(keep))
            store.catalog.checked(name, ident, to_ranges(slots), masked=True, torn=old.torn if same else ())
            out.rows_masked += len(slots) - len(from_ranges(keep))
            out.actions.append(f"masked {len(slots)} damaged row(s) of {name} (slots "
                               f"{_ranges_text(to_ranges(slots))}); its other rows are kept")
        out.problems = verify_store(store)
        out.actions = list(dict.fromkeys(out.actions))  # (the open's recovery and this one may say the same)
        return out
    finally:
        admin.release()


def _rows_of(store: StoreFiles, name: str, live: dict[str, int]) -> int | None:
    """Rows of segment ``name``: the catalog's count, else its control page's (read without its
    header; an open segment's published count too), else None."""
    if name in live:
        return live[name]
    path = store.segments_dir / name
    try:
        if os.stat(path).st_size < CONTROL_OFFSET + 2 * CONTROL_SLOT_SIZE:
            return None
    except FileNotFoundError:
        return None
    with open(path, "rb") as fh:
        control, _ = read_control(os.pread(fh.fileno(), 2 * CONTROL_SLOT_SIZE, CONTROL_OFFSET))
    return control.committed if control is not None else None  # (a valid control slot's count, sealed or not)


def _write_back(store: StoreFiles, problem: Problem) -> str:
    """Write back a segment's damaged stamps (of rows whose records verify) or control slot."""
    from .recovery import seal_checked

    path = store.segments_dir / problem.file
    before = _records(store).get(problem.file)
    if before is not None and tuple(before.identity) != identity(os.stat(path)):
        before = None
    seg = Segment.open_rw(path, store.layout, store.store_uuid, store.schema.hash)
    try:
        c, n = seg.control, 0
        if problem.fix == "stamps":
            n = min(c.committed, seg.header.usable_records)
            _, stamp_bad, fixes = scan_rows(seg.header, store.layout, seg.stamps, seg.view, 0, n, fix=True)
            assert fixes is not None
            slots = np.flatnonzero(stamp_bad)
            seg.stamp_words[slots] = fixes[slots]
            seg.sync_rows(0, n)
            what = f"wrote back the damaged stamps of {len(slots)} row(s) of {problem.file} (their records verify)"
        elif c.version and c.state == STATE_SEALED:  # one slot damaged: publish the current count into it
            seg.publish(c.committed, c.synced, c.state, c.seal_crc)
            what = f"wrote back the damaged control slot of {problem.file}"
        else:  # the catalog's count of a sealed segment
            live = store.catalog.read().live
            n, bad = seal_checked(seg, live[problem.file])
            what = f"wrote back the control page of {problem.file} ({n:,} rows, as the catalog records it sealed)"
        seg.sync_control()
    finally:
        seg.close(fdatasync=True)
    try:
        ident = identity(os.stat(path))
        n = n or min(seg.control.committed, seg.header.usable_records)
        check = Segment.open_rw(path, store.layout, store.store_uuid, store.schema.hash, writable=False)
        try:
            bad = np.flatnonzero(scan_rows(check.header, store.layout, check.stamps, check.view, 0, n)[0])
        finally:
            check.close()
        _record_again(store, problem.file, ident, bad, before)
    except (OSError, CorruptSegmentError):
        pass
    return what


def _record_again(store: StoreFiles, name: str, ident: tuple[int, ...], bad: np.ndarray,
                  before: SegmentRecord | None) -> None:
    """Record a check of a file a repair wrote to (its identity changed): what its previous record
    of the same rows acknowledged (torn rows, rows a repair masked) stays acknowledged."""
    torn = np.intersect1d(bad, from_ranges(before.torn)) if before is not None else np.zeros(0, np.int64)
    rest = np.setdiff1d(bad, torn)
    masked = before is not None and before.masked and bool(np.isin(rest, from_ranges(before.bad)).all())
    store.catalog.checked(name, ident, to_ranges(rest), masked=masked and len(rest) > 0, torn=to_ranges(torn))
