"""Store statistics for ``ReplayStore.info()`` and ``mmreplay info`` (plain data, no printing),
including the storage tiers as this process sees them (:func:`tier_summary`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .catalog import Catalog
from .format import STAMP_DTYPE, STATE_NAMES, STATE_SEALED
from .locks import held_elsewhere, writer_lock_name
from .provenance import cut_rows, read_provenance
from .verify import masked_rows

if TYPE_CHECKING:
    from .files import StoreFiles
    from .format import Layout
    from .reader import StoreReader


def store_info(store: StoreFiles, r: StoreReader) -> dict[str, Any]:
    """``ReplayStore.info()`` of a store whose files and reader these are (the caller waited for
    every sealed segment's check: every row is counted)."""
    s = r.snapshot
    segs = [r.segments[int(sid)] for sid in s.segment_ids]  # in id order; unreadable ones left out
    transitions = left_out = 0
    ends = {"terminated": 0, "truncated": 0, "cut": 0, "incomplete": 0}
    flags = "terminated" in store.schema and "truncated" in store.schema
    runs = read_provenance(store.path)
    cuts = np.fromiter(cut_rows(runs), np.int64)
    for k in range(len(segs)):
        with r.scanning(k, ahead=k + 1):  # every record's flags, in order: read ahead, no page left mapped
            seg = r.segment_flags(k)  # (read once for both counts)
            valid, blocked = r.segment_starts(k, seg)
            transitions += int(valid.sum())
            left_out += int(blocked.sum())
            if flags:
                _count_episode_ends(r, k, ends, cuts, bool(s.committed[k]) and _finished(store, r, k), seg)
    disk, files = disk_usage(store.path)
    catalog = store.catalog.read()  # read once: evictions by reason and lost segments
    writers = sorted({m.header.writer_id for m in segs})
    try:
        stats = json.loads((store.path / "stats.json").read_text())
    except (FileNotFoundError, ValueError):
        stats = {}
    return {
        "path": str(store.path),
        "store_uuid": store.store_uuid.hex(),
        "schema": [{"name": f.name, "dtype": str(f.dtype), "shape": list(f.shape)} for f in store.schema.fields],
        "rows": int(s.total_rows),
        "transitions": transitions,
        "transitions_left_out": left_out,  # one-step transitions whose next row is masked (damaged)
        "episodes": ends["terminated"] + ends["truncated"] + ends["cut"],  # ended (a cut one is stored truncated)
        "episodes_terminated": ends["terminated"],
        "episodes_truncated": ends["truncated"],  # by the env (time limits)
        "episodes_cut": ends["cut"],  # by the end of a run (stored truncated; the runs' records name them)
        "episodes_incomplete": ends["incomplete"],  # open when its writer stopped (died, or closed unmarked)
        "capacity": store.capacity,
        "segment_records": store.segment_records,
        "segments": len(segs),
        "segments_open": sum(1 for m in segs if STATE_NAMES.get(m.state) == "open"),
        "segment_bytes": store.layout.file_size,
        "bytes_on_disk": disk,
        "segment_files": files,
        "bytes_used": int(s.total_rows) * (store.layout.record_bytes + STAMP_DTYPE.itemsize),
        "writers": writers,
        # the catalog counts evictions; stats.json (written before it did) is read as a floor
        "evicted_segments": max(int(stats.get("evicted_segments", 0)), sum(catalog.evicted.values())),
        "evictions": catalog.evicted,  # by reason: capacity, disk (since the catalog existed)
        "lost_segments": store.lost_segments(),  # lists, then reads the catalog: no eviction reads as a loss
        "unreadable_segments": {**{n: why for n, why in r.skipped.items() if why},
                                **{m.name: m.failed for m in r.segments.values() if m.failed}},
        "damaged_rows": r.check_counts()["damaged_rows"],  # left out of every batch
        "masked_rows": masked_rows(store),  # of those, acknowledged by a repair
        "metadata": store.metadata,
        "provenance": runs,
        "created_at": store.manifest.get("created_at"),
        "rows_per_writer": {str(w): int(np.sum([m.committed for m in segs if m.header.writer_id == w])) for w in writers},
        "tiers": tier_summary(r, store.layout),
    }


def episode_ends(store: StoreFiles, r: StoreReader, segment_ids: set[int] | None = None) -> dict[int, dict[str, int]]:
    """Episode endings by the segment that holds their last step: ``{segment id: {"terminated",
    "truncated" (by the env), "cut" (by the end of a run), "incomplete"}}``, counted as
    :func:`store_info` counts them (its totals are these summed), for ``segment_ids`` (default:
    every segment of the snapshot). Exports record them per archived segment."""
    s = r.snapshot
    out: dict[int, dict[str, int]] = {}
    if "terminated" not in store.schema or "truncated" not in store.schema:
        return out
    cuts = np.fromiter(cut_rows(read_provenance(store.path)), np.int64)
    for k, sid in enumerate(s.segment_ids.tolist()):
        if segment_ids is not None and sid not in segment_ids:
            continue
        ends = {"terminated": 0, "truncated": 0, "cut": 0, "incomplete": 0}
        with r.scanning(k, ahead=k + 1):  # every record's flags: read in order, not a fault per page
            _count_episode_ends(r, k, ends, cuts, bool(s.committed[k]) and _finished(store, r, k))
        out[int(sid)] = ends
    return out


def _finished(store: StoreFiles, r: StoreReader, k: int) -> bool:
    """Snapshot segment ``k`` is the last with rows its session will write: its successors (a
    segment made ahead of need) hold no row, and its writer is gone (the segment sealed, or its
    writer's lock free: a killed writer's open segment)."""
    snap = r.snapshot
    chain, j = [k], int(snap.succ[k])
    while j >= 0:
        if snap.committed[j]:
            return False
        chain.append(j)
        j = int(snap.succ[j])
    if snap.sealed[chain].any():
        return True
    m = r.segments[int(snap.segment_ids[k])]
    return not held_elsewhere(store.locks_dir / writer_lock_name(m.header.writer_id))


def _count_episode_ends(r: StoreReader, k: int, ends: dict[str, int], cuts: np.ndarray, finished: bool,
                        seg_flags: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
    """Add the episodes whose last step lies in snapshot segment ``k``: terminated, truncated by
    the env, cut by the end of a run (stored truncated: ``cuts`` holds their rows' global ids, as
    the runs recorded them), and incomplete: the next row of the lane is the final observation but
    the step is neither (a writer closed mid-episode without a mark), or, in a session's last
    segment once its writer is gone (``finished``), a lane's last row is a step: of a running
    episode, or an ending one whose final observation was never stored (its writer died, or
    closed, mid-episode). An episode counts as ended only with its final observation, as every
    export keeps it."""
    snap = r.snapshot
    w, n = int(snap.windows[k]), int(snap.committed[k])
    flags, _, nxt = seg_flags if seg_flags is not None else r.segment_flags(k)
    here_last = flags != 0  # final observations, and masked rows (zeroed: no flag of theirs counts)
    term = r.columns["terminated"][w, :n] & ~here_last
    trunc = r.columns["truncated"][w, :n] & ~here_last & ~term
    open_tail = np.zeros(n, np.bool_)
    if finished and n:
        tail = np.arange(max(n - int(snap.lanes[k]), 0), n)  # each lane's last row
        open_tail[tail] = ~here_last[tail]  # a step with no row after it: its episode is incomplete
        term, trunc = term & ~open_tail, trunc & ~open_tail
    ends["terminated"] += int(term.sum())
    base = int(snap.segment_ids[k]) * r.R
    here = cuts[(cuts >= base) & (cuts < base + n)] - base  # the cut steps of this segment (a few per run)
    cut = np.zeros(n, np.bool_)
    cut[here] = trunc[here]
    ends["cut"] += int(cut.sum())
    ends["truncated"] += int((trunc & ~cut).sum())
    ends["incomplete"] += int(((nxt == 1) & ~here_last & ~term & ~trunc).sum()) + int(open_tail.sum())


def disk_usage(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(bytes allocated on disk, segment files)`` of the store at ``path``: every segment file,
    spare (made ahead of need, still empty) and open ones included, as the filesystem counts
    them (allocated blocks, so preallocated space counts in full). Lists one directory; reads
    no row."""
    disk = files = 0
    with os.scandir(os.path.join(os.fspath(path), "segments")) as it:
        for e in it:
            try:
                disk += e.stat().st_blocks * 512
            except FileNotFoundError:  # evicted (renamed .deleted, then unlinked) while we listed it
                continue
            files += 1
    return disk, files


@dataclass(frozen=True)
class DiskFootprint:
    """What a store's directory holds on disk and what it gave up, read without opening the store
    (:func:`disk_footprint`): for a summary line after a run, beside a writer still at work."""

    bytes_on_disk: int = 0
    """Bytes allocated to its segment files, spares and open ones included (preallocated space counts
    in full), as ``info()["bytes_on_disk"]``."""
    segment_files: int = 0
    """Segment files in its ``segments`` directory, as ``info()["segment_files"]``."""
    evictions: dict[str, int] = field(default_factory=dict)
    """Segments evicted so far, by reason (``capacity``; ``disk``: a full disk made the store evict
    below its capacity), as ``info()["evictions"]``."""


def disk_footprint(path: str | os.PathLike[str]) -> DiskFootprint:
    """The :class:`DiskFootprint` of the store at ``path``: lists its segment directory and reads its
    catalog; takes no lock, runs no recovery and reads no row (``ReplayStore.info()`` counts rows and
    episodes too). A path that holds no store (not yet, or not any more) has a footprint of zero."""
    try:
        disk, files = disk_usage(path)
    except (FileNotFoundError, NotADirectoryError):
        disk = files = 0
    return DiskFootprint(disk, files, dict(Catalog(Path(path)).read().evicted))


def tier_summary(reader: StoreReader, layout: Layout) -> dict[str, Any]:
    """The store's tiers as seen from this process: open segments (hot), sealed segments on
    disk and how much of them the page cache holds (warm, ``mincore``), and the machine's RAM;
    ``suggested_mode`` is ``"exact"`` when the whole store fits in the RAM available, else
    ``"windowed"``."""
    size = layout.file_size
    hot = warm = cached_hot = cached_warm = 0
    for m in reader.segments.values():
        cached = reader.region.cached_bytes(m.window, size)
        if m.state == STATE_SEALED:
            warm += 1
            cached_warm += cached
        else:
            hot += 1
            cached_hot += cached
    mem = _meminfo()
    total = (hot + warm) * size
    avail = mem.get("MemAvailable", 0)
    return {
        "hot": {"open_segments": hot, "bytes": hot * size, "in_ram_bytes": cached_hot},
        "warm": {"sealed_segments": warm, "bytes": warm * size, "page_cache_bytes": cached_warm},
        "ram": {"total_bytes": mem.get("MemTotal", 0), "available_bytes": avail},
        "store_to_ram": total / mem["MemTotal"] if mem.get("MemTotal") else None,
        "suggested_mode": "exact" if total <= 0.8 * avail else "windowed",
    }


def mem_available() -> int:
    """The RAM available to new work (``MemAvailable``; 0 where /proc/meminfo says nothing)."""
    return _meminfo().get("MemAvailable", 0)


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                if name in ("MemTotal", "MemAvailable"):
                    out[name] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out
