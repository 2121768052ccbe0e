"""The reader's snapshot (``Snapshot``) and the segment table, one int64 array: the compiled kernels' view of it.

One row per snapshot segment (``SEG_*`` columns: cumulative end of its committed rows in the
draw order, committed and usable rows, lanes, successor/predecessor rows in the lane chain, byte
base in the reader's region, segment id, first sequence number), plus the draw index
(:func:`index_draws`) that maps a drawn row to its segment in O(1).

Invariant: the draw index always matches ``SEG_CUM_END``; whoever rewrites that column (a
restricted table for windowed draws) calls :func:`index_draws` again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

# columns of the segment table (``StoreReader.segment_table()``: one int64 row per snapshot segment, in
# the snapshot's order), the compiled kernels' view of a snapshot
SEG_CUM_END = 0
"""Segment-table column: committed rows of this segment and every earlier one (``Snapshot.cum_end``)."""
SEG_COMMITTED = 1
"""Segment-table column: the segment's committed rows (``Snapshot.committed``)."""
SEG_USABLE = 2
"""Segment-table column: the rows the segment can hold (``Snapshot.usable``)."""
SEG_LANES = 3
"""Segment-table column: the lanes of the segment's writer session (``Snapshot.lanes``)."""
SEG_SUCC = 4
"""Segment-table column: the index of the session's next segment, or -1 (``Snapshot.succ``)."""
SEG_BASE = 5
"""Segment-table column: the byte offset of the segment's first record in the reader's mapped region."""
SEG_ID = 6
"""Segment-table column: the segment id (``Snapshot.segment_ids``)."""
SEG_PRED = 7
"""Segment-table column: the index of the session's previous segment, -1 or ``PRED_GONE`` (``Snapshot.pred``)."""
SEG_FIRST = 8
"""Segment-table column: the writer-session row number of the segment's slot 0 (``Snapshot.first_seq``)."""
# the draw index: bucket b (rows [b << shift, (b + 1) << shift) of the cumulative order) starts in
# the segment at row b // SEG_NBUCKETS, column SEG_BUCKET + b % SEG_NBUCKETS; every row holds shift
SEG_SHIFT = 9
"""Segment-table column of the draw index (``index_draws``): log2 of the rows per bucket (the same in every row)."""
SEG_BUCKET = 10
"""Segment-table column of the draw index: the first of ``SEG_NBUCKETS`` columns, each the index of the
segment a bucket of rows starts in."""
SEG_NBUCKETS = 4
"""Draw-index buckets per segment-table row."""
PRED_GONE = -2
"""``SEG_PRED`` (and ``Snapshot.pred``) of a segment whose session had an earlier segment that is
not in the snapshot (evicted, quarantined, not checked yet); -1 means the session starts here."""
SEG_COLS = SEG_BUCKET + SEG_NBUCKETS
"""Columns of the segment table."""


def index_draws(t: np.ndarray) -> np.ndarray:
    """Fill ``t``'s draw index from its ``SEG_CUM_END`` column (in place; returns ``t``).

    A draw ``u`` lands in the first segment whose cumulative end exceeds it. A binary search over
    the segments costs one unpredictable branch per level (320 draws on 1M rows took 2.7, 8.4 and
    15.2 us with 1, 16 and 245 segments in an ad-hoc timing when this was written; about 3 us at
    every count with the index); with ``SEG_NBUCKETS`` buckets per segment, a draw reads its
    bucket's first segment and steps past the (on average at most 1/``SEG_NBUCKETS``) segment
    ends inside the bucket.
    """
    n = len(t)
    if n == 0:
        return t
    cum = t[:, SEG_CUM_END]
    # the smallest shift that puts the last row in one of the n * SEG_NBUCKETS buckets
    last = max(int(cum[-1]) - 1, 0)
    shift = max(0, last.bit_length() - (n * SEG_NBUCKETS - 1).bit_length())
    shift += (last >> shift) >= n * SEG_NBUCKETS
    first = cum[:-1].searchsorted(_bucket_starts(n, shift), side="right")  # (at most n - 1: a bucket past the end)
    t[:, SEG_SHIFT] = shift
    t[:, SEG_BUCKET:SEG_BUCKET + SEG_NBUCKETS] = first.reshape(n, SEG_NBUCKETS)
    return t


@lru_cache(maxsize=256)
def _bucket_starts(n: int, shift: int) -> np.ndarray:
    """The first row of each of ``n * SEG_NBUCKETS`` buckets of ``1 << shift`` rows (read-only)."""
    starts = np.arange(n * SEG_NBUCKETS, dtype=np.int64) << shift
    starts.flags.writeable = False
    return starts


def recount(t: np.ndarray, s: Snapshot) -> np.ndarray:
    """A copy of segment table ``t`` with the counts of snapshot ``s`` (same segments, more rows)."""
    t = t.copy()
    t[:, SEG_COMMITTED] = s.committed
    t[:, SEG_CUM_END] = s.cum_end
    return index_draws(t)


@dataclass(slots=True)
class Snapshot:
    """Arrays describing the live segments in segment-id order (index ``k``)."""

    segment_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Segment id of each segment (ascending)."""
    windows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """The window (slot of the reader's mapped address region) each segment is mapped at."""
    committed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Committed (published) rows of each segment."""
    usable: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Rows each segment can hold."""
    lanes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Lanes of each segment's writer session: a lane's next row is ``lanes`` rows further on."""
    succ: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Index of the next segment of the same writer session, or -1."""
    pred: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Index of the previous segment of the same writer session (-1 if none: the session starts
    here; ``PRED_GONE`` if it had one that is not in the snapshot)."""
    first_seq: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Writer-session row number of each segment's slot 0."""
    cum_end: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Cumulative committed rows: segment ``k`` holds rows ``[cum_end[k] - committed[k], cum_end[k])``
    of the snapshot's order (what a uniform draw indexes)."""
    sealed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.bool_))
    """Whether each segment is sealed (immutable); the others are open (being written)."""

    index: dict[int, int] = field(default_factory=dict)
    """Segment id -> index ``k``."""

    @property
    def total_rows(self) -> int:
        """Committed rows over every segment of the snapshot (the end of the cumulative row count)."""
        return int(self.cum_end[-1]) if len(self.cum_end) else 0

    def with_counts(self, counts: dict[int, int]) -> Snapshot:
        """This snapshot with new committed counts for some segments (by segment id): rows appended
        to open segments change nothing else, so a refresh that saw only that needs no rebuild."""
        committed = self.committed.copy()
        for sid, n in counts.items():
            k = self.index.get(sid)
            if k is not None:
                committed[k] = n
        # every other field shared (``dataclasses.replace`` took ~3 us of a ~20 us refresh)
        return Snapshot(self.segment_ids, self.windows, committed, self.usable, self.lanes, self.succ, self.pred,
                        self.first_seq, committed.cumsum(), self.sealed, self.index)
