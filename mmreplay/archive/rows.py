"""Reading one segment's rows for export, damaged rows masked (``storage.checks``).

``read_segment`` gives a segment's rows as the archive stores them: every damaged row (found by
this read, or already known to the store's checks) is **masked**: its fields zeroed, never
data, and flagged in the archive's ``masked`` array. No episode boundary is made up around it:
its ``is_last`` flag is worked out from the row before it (``core.episodes.masked_last``), the
rows around it keep their own, and readers of the archive (an import, ``open_archive``) mask it
again, so every window that needs it is left out there too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..storage.store import ReplayStore


@dataclass(frozen=True, slots=True)
class SegmentRows:
    """One segment's rows, padded to ``R`` rows per field."""

    fields: dict[str, np.ndarray]
    """Every schema field, masked rows zeroed."""
    is_last: np.ndarray
    """The file's ``is_last`` flags (bool, ``R``); a masked row's is not to be trusted."""
    masked: np.ndarray
    """Damaged rows (bool, ``R``)."""
    done: np.ndarray
    """Each committed row's terminated-or-truncated flag (bool, ``rows``; False where the schema
    has neither field, and on masked rows)."""


def read_segment(store: ReplayStore, sid: int, name: str, rows: int, verify: bool) -> SegmentRows | None:
    """Segment ``name``'s first ``rows`` rows; None if evicted. Damaged rows (found by this read
    with ``verify``, or known to the store's checks) are masked."""
    import mmap

    from ..storage.checks import scan
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
            buf[bad] = 0
            out[f.name] = buf
        last = np.zeros(R, np.bool_)
        last[:n] = seg.is_last[:n]
        masked = np.zeros(R, np.bool_)
        masked[bad] = True
        done = np.zeros(n, np.bool_)
        for flag in ("terminated", "truncated"):
            if flag in store.schema:
                done |= out[flag][:n].astype(np.bool_).reshape(n, -1).any(axis=1)
        return SegmentRows(out, last, masked, done)
    finally:
        seg.close()
