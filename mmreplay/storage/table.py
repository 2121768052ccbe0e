"""The segment table: a reader snapshot as one int64 array, the compiled kernels' view of it.

One row per snapshot segment (``SEG_*`` columns: cumulative end of its committed rows in the
draw order, committed and usable rows, lanes, successor/predecessor rows in the lane chain, byte
base in the reader's region, segment id, first sequence number), plus the draw index
(:func:`index_draws`) that maps a drawn row to its segment in O(1).

Invariant: the draw index always matches ``SEG_CUM_END``; whoever rewrites that column (a
restricted table for windowed draws) calls :func:`index_draws` again.
"""

from __future__ import annotations

import numpy as np

# columns of the segment table (one row per snapshot segment), the compiled kernels' view of a snapshot
SEG_CUM_END, SEG_COMMITTED, SEG_USABLE, SEG_LANES, SEG_SUCC, SEG_BASE, SEG_ID, SEG_PRED, SEG_FIRST = range(9)
# the draw index: bucket b (rows [b << shift, (b + 1) << shift) of the cumulative order) starts in
# the segment at row b // SEG_NBUCKETS, column SEG_BUCKET + b % SEG_NBUCKETS; every row holds shift
SEG_SHIFT, SEG_BUCKET, SEG_NBUCKETS = 9, 10, 4
SEG_COLS = SEG_BUCKET + SEG_NBUCKETS


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
    total = int(cum[-1])
    shift = 0
    while (max(total - 1, 0) >> shift) >= n * SEG_NBUCKETS:
        shift += 1
    starts = np.arange(n * SEG_NBUCKETS, dtype=np.int64) << shift
    first = np.minimum(np.searchsorted(cum, starts, side="right"), n - 1)
    t[:, SEG_SHIFT] = shift
    t[:, SEG_BUCKET:SEG_BUCKET + SEG_NBUCKETS] = first.reshape(n, SEG_NBUCKETS)
    return t
