"""Reading one segment's rows for export, damaged rows left out (``storage.checks``).

``read_segment`` gives a segment's rows as the archive stores them, with every damaged row
(found by this read, or already known to the store's checks) zeroed, flagged ``is_last`` and
patched out as a reader patches it; ``cut_predecessor`` cuts an archived chain link whose next
row is damaged, so no archived transition reaches a damaged row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.episodes import LaneCarry
from .layout import COL

if TYPE_CHECKING:
    from ..storage.store import ReplayStore


def read_segment(store: ReplayStore, sid: int, name: str, rows: int, verify: bool) -> tuple[dict[str, np.ndarray], np.ndarray, Any] | None:
    """The job's rows as padded ``R``-row arrays per field, plus ``is_last`` and the damage patch
    (``None`` if no row is damaged); None if evicted. Damaged rows (found by this read with
    ``verify``, or known to the store's checks) are zeroed and flagged ``is_last``, as readers
    see them (``mmreplay.storage.checks``)."""
    import mmap

    from ..storage.checks import damage_patch, scan
    from ..storage.segment import Segment

    R = store.segment_records
    try:
        seg = Segment.open_rw(store.segments_dir / name, store.layout, store.store_uuid, store.schema.hash,
                              writable=False)
    except FileNotFoundError:
        return None
    try:
        seg.mm.madvise(mmap.MADV_SEQUENTIAL)
        n = rows
        m = store.reader.segments.get(sid)
        bad = m.patch.zero if m is not None and m.patch is not None else np.zeros(0, np.int64)
        if verify or (m is not None and m.pending):
            bad = np.union1d(bad, np.flatnonzero(scan(seg.header, store.layout, seg.stamps, seg.view, 0, n)))
        out = {}
        for f in store.schema.fields:
            buf = np.zeros((R, *f.shape), f.dtype)
            buf[:n] = seg.columns[f.name][:n]
            out[f.name] = buf
        last = np.zeros(R, np.bool_)
        last[:n] = seg.is_last[:n]
        patch = damage_patch(bad, seg.header.lanes) if len(bad) else None
        if patch is not None:
            for buf in out.values():
                buf[patch.zero] = 0
            last[patch.last] = True
        return out, last, patch
    finally:
        seg.close()


def cut_predecessor(is_last: Any, table: np.ndarray, h: Any, patch: Any, R: int) -> LaneCarry | None:
    """Flag ``is_last`` on the archived predecessor rows whose next row is damaged (the link is
    cut as a reader cuts it); returns no carry: the damaged segment's rows start fresh."""
    hit = np.flatnonzero((table[:, COL["writer_id"]] == h.writer_id) & (table[:, COL["session_epoch"]] == h.session_epoch)
                         & (table[:, COL["chain_index"]] == h.chain_index - 1))
    if len(hit):
        o = int(hit[0])
        usable = int(table[o, COL["usable_records"]])
        for b in patch.zero[patch.zero < h.lanes]:
            if usable - h.lanes + b < int(table[o, COL["committed"]]):
                is_last[o * R + usable - h.lanes + int(b)] = True
    return None
