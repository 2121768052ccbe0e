"""verify: check a store's files without changing them, and repair what recovery can.

Checks, per segment file: header (magic, version, crc, store uuid, schema hash, size before
mapping), the name against the header, the control slots, and the rows: every commit group's
stamps and crc32c up to the committed count, all of them (each damaged run of rows is one
problem; ``fast=True`` checks only the crc over the stamp column recorded at seal). An OPEN
segment whose writer is alive is checked up to its committed count; one whose writer is dead is
reported as needing recovery. Leftover ``.tmp`` and ``.deleted`` files are reported, and so is
every segment the catalog (``catalog.py``) lists as sealed and never evicted whose file is gone.
Damaged rows that a repair masked (below) are not problems while the file is unchanged:
``masked_rows`` counts them. Verification takes no locks and writes nothing.

``repair`` takes the admin lock (no writer may be active), runs recovery (dead writers' open
segments are cut back to their valid prefix and sealed, leftovers removed), **masks** damaged
rows of segments whose header and control page are sound (a ``masked`` catalog line: every good
row stays, row ids and saved priorities stay valid, readers leave the masked rows out), and
quarantines a segment whose header or control page is damaged by renaming it to ``.corrupt``
(never deleting it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .catalog import SegmentRecord
from .checks import from_ranges, identity, scan, to_ranges
from .format import STATE_SEALED
from ..core.errors import CorruptSegmentError, StoreLockedError
from .segment import Segment, parse_segment_name
from .locks import ADMIN, writer_lock_name

if TYPE_CHECKING:
    from .store import ReplayStore


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding: which file, which row (if any), and what is wrong."""

    file: str
    slot: int | None
    reason: str
    rows: tuple[tuple[int, int], ...] = ()
    """Damaged rows as ``[start, stop)`` slot ranges (a row-level problem a repair can mask)."""

    def __str__(self) -> str:
        where = f"{self.file}" + (f" slot {self.slot}" if self.slot is not None else "")
        return f"{where}: {self.reason}"


def verify_store(store: ReplayStore, *, fast: bool = False) -> list[Problem]:
    """Every problem found in ``store``'s segment files (an empty list means clean)."""
    problems: list[Problem] = []
    masks = _masks(store)
    for name in sorted(os.listdir(store.segments_dir)):
        if name.endswith((".tmp", ".deleted")):
            problems.append(Problem(name, None, "leftover of an interrupted creation or eviction"))
            continue
        if name.endswith(".corrupt"):
            continue  # already quarantined
        parsed = parse_segment_name(name)
        if parsed is None:
            problems.append(Problem(name, None, "not a segment file name"))
            continue
        problems.extend(_verify_segment(store, store.segments_dir / name, parsed, fast=fast, masks=masks))
    for name, rows in sorted(store.lost_segments().items()):
        problems.append(Problem(name, None, f"lost: the catalog lists it sealed with {rows} rows, and its file is "
                                            "gone (it was not evicted)"))
    return problems


def _masks(store: ReplayStore) -> dict[str, SegmentRecord]:
    """Masks (``verify --repair``) recorded in the catalog, by segment name."""
    if not store.catalog.path.exists():
        return {}
    return {n: r for n, r in store.catalog.read().checks.items() if r.masked}


def masked_rows(store: ReplayStore) -> int:
    """Rows masked by a repair in segment files still unchanged since (left out of every batch)."""
    total = 0
    for name, rec in _masks(store).items():
        try:
            if identity(os.stat(store.segments_dir / name)) == tuple(rec.identity):
                total += sum(b - a for a, b in rec.bad)
        except FileNotFoundError:
            pass
    return total


def _verify_segment(store: ReplayStore, path: Path, parsed: tuple[int, int], *, fast: bool,
                    masks: dict[str, SegmentRecord]) -> list[Problem]:
    name = path.name
    try:
        seg = Segment.open_rw(path, store.layout, store.store_uuid, store.schema.hash, writable=False)
    except CorruptSegmentError as exc:
        return [Problem(name, None, str(exc).removeprefix(f"{path}: "))]
    except FileNotFoundError:
        return []  # evicted meanwhile
    try:
        h = seg.header
        if (h.segment_id, h.writer_id) != parsed:
            return [Problem(name, None, f"header says segment {h.segment_id} of writer {h.writer_id}")]
        c = seg.control
        if c.version == 0:
            return [Problem(name, None, "both control slots are damaged (recovery rebuilds the count from stamps)")]
        if c.state != STATE_SEALED:
            lock = store.lock(writer_lock_name(h.writer_id))
            if store.mode == "a" and lock.acquire(exclusive=True):
                lock.release()
                return [Problem(name, None, "open segment of a dead writer: needs recovery")]
        n = min(c.committed, h.usable_records)
        if fast and c.state == STATE_SEALED:
            crc = seg.stamps_crc(n)
            return [] if crc == c.seal_crc else [Problem(name, None, "crc of the stamp column does not match the seal")]
        bad = np.flatnonzero(scan(h, store.layout, seg.stamps, seg.view, 0, n))
        if not len(bad):
            return []
        mask = masks.get(name)
        if mask is not None and tuple(mask.identity) == identity(os.fstat(seg.fileno())) \
                and np.isin(bad, from_ranges(mask.bad)).all():
            return []  # acknowledged by a repair, and left out by every reader
        return [Problem(name, a, f"rows {a}-{b - 1} fail their stamp or crc32c check ({b - a} of {n} committed rows; "
                                 "left out of every batch)", ((a, b),))
                for a, b in to_ranges(bad)]
    finally:
        seg.close()


def repair_store(store: ReplayStore) -> tuple[list[str], list[Problem]]:
    """Recover, mask and quarantine. Returns ``(actions taken, problems left)``; needs no live writer."""
    from .recovery import recover_abandoned

    admin = store.lock(ADMIN)
    if not admin.acquire(exclusive=True):
        raise StoreLockedError(f"{store.path} has active writers; close them before repairing")
    try:
        actions = []
        report = recover_abandoned(store)
        actions += [f"removed {n}" for n in report.cleaned]
        actions += [f"recovered {n}: kept {k} rows" + (f", dropped {report.dropped[n]}" if n in report.dropped else "")
                    for n, k in report.recovered.items()]
        for name, rows in sorted(store.lost_segments().items()):  # nothing brings them back: acknowledge
            store.catalog.departed(name, "removed")
            actions.append(f"acknowledged the loss of {name} ({rows} rows): its file is gone")
        masked: dict[str, list[tuple[int, int]]] = {}
        for problem in verify_store(store):
            src = store.segments_dir / problem.file
            if not (src.exists() and parse_segment_name(problem.file)):
                continue
            if problem.rows:
                masked.setdefault(problem.file, []).extend(problem.rows)
                continue
            store.catalog.departed(problem.file, "quarantined")  # before the file goes
            src.rename(src.with_name(src.name + ".corrupt"))
            actions.append(f"quarantined {problem.file} as {problem.file}.corrupt ({problem.reason})")
        masks = _masks(store)  # one read of the catalog for every segment masked below
        for name, ranges in masked.items():
            old = masks.get(name)
            ident = identity(os.stat(store.segments_dir / name))
            keep = old.bad if old is not None and tuple(old.identity) == ident else ()
            slots = np.union1d(from_ranges(tuple(ranges)), from_ranges(keep))
            store.catalog.checked(name, ident, to_ranges(slots), masked=True)
            actions.append(f"masked {len(slots)} damaged row(s) of {name} (slots "
                           f"{', '.join(f'{a}-{b - 1}' for a, b in to_ranges(slots)[:5])}); its other rows are kept")
        return actions, verify_store(store)
    finally:
        admin.release()
