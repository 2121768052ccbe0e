"""SumTree: a sum tree and a min tree over priorities, 8-ary, with batched compiled operations.

Why 8-ary: a node's 8 children (float64) fill one cache line, so a draw costs one cache miss per
level and the tree is a third as deep as a binary one (8 levels for 16M leaves, not 24). Why
level by level: every batched operation walks all its draws (or updates) through one level
before the next, so the cache misses of different draws overlap instead of queueing.

* ``set(leaves, values)``: leaves first (when one appears twice the last value wins: a
  sequential loop, deterministic by construction), then each touched ancestor is recomputed from
  its children (exact sums: no drift however many updates);
* ``fill(lo, hi, value)``: a contiguous leaf range, then its ancestors (``O(range)``);
* ``sample(u)``: stratified, draw ``j`` in the slice ``[j, j+1) * total / B`` (Schaul et al.).

The min tree holds ``inf`` for empty leaves, so its root is the smallest priority of a
sampleable row. Imported lazily (``import mmreplay`` does not load numba).
"""

from __future__ import annotations

import numba
import numpy as np

from .transition_kernels import _next_u64

K = 8


@numba.njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _recompute(sums, mins, b, c, p):  # pragma: no cover - compiled
    """Node ``p`` (level base ``b``) := sum and min of its K children (level base ``c``)."""
    s = 0.0
    m = np.inf
    for q in range(p * K, p * K + K):
        s += sums[c + q]
        m = min(m, mins[c + q])
    sums[b + p] = s
    mins[b + p] = m


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _set(sums, mins, offs, depth, leaves, values):  # pragma: no cover - compiled
    base = offs[depth]
    n = leaves.shape[0]
    idx = np.empty(n, np.int64)
    for j in range(n):
        i = leaves[j]
        v = values[j]
        sums[base + i] = v
        mins[base + i] = v if v > 0 else np.inf
        idx[j] = i
    touched = 0.0
    for d in range(depth - 1, -1, -1):
        for j in range(n):
            idx[j] //= K
        b = offs[d]
        c = offs[d + 1]
        for j in range(n):  # independent loads first, as in _sample
            touched += sums[b + idx[j]]
        for j in range(n):
            _recompute(sums, mins, b, c, idx[j])
    return touched


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _fill(sums, mins, offs, depth, lo, hi, value):  # pragma: no cover - compiled
    if hi <= lo:
        return
    base = offs[depth]
    for i in range(lo, hi):
        sums[base + i] = value
        mins[base + i] = value if value > 0 else np.inf
    a, b = lo, hi - 1
    for d in range(depth - 1, -1, -1):
        a //= K
        b //= K
        nb = offs[d]
        c = offs[d + 1]
        for p in range(a, b + 1):
            _recompute(sums, mins, nb, c, p)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _sample(sums, offs, depth, u, out):  # pragma: no cover - compiled
    b = out.shape[0]
    total = sums[0]
    x = np.empty(b, np.float64)
    node = np.zeros(b, np.int64)
    for j in range(b):
        x[j] = (j + u[j]) * total / b
    touched = 0.0
    for d in range(depth):
        c = offs[d + 1]
        for j in range(b):  # independent loads first: the cache misses of all draws overlap
            touched += sums[c + node[j] * K]
        for j in range(b):
            first = node[j] * K
            xj = x[j]
            pick = -1
            last = -1
            for q in range(first, first + K):
                s = sums[c + q]
                if s > 0.0:
                    last = q
                    if xj < s:
                        pick = q
                        break
                    xj -= s
            if pick < 0:  # float rounding ran past the last child with mass
                pick = last
                xj = 0.0
            node[j] = pick
            x[j] = xj
    for j in range(b):
        out[j] = node[j]
    return out, touched


@numba.njit(nogil=True, cache=True, boundscheck=False)
def sample_rows(sums, mins, offs, depth, state, R, slot_to_k, seg_ids, beta, ks, slots, ids, weights):  # pragma: no cover
    """Stratified draws, then for each: its segment index, row, global id and importance weight
    ``(p / p_min)^-beta`` (one compiled call for what would be a dozen numpy calls). Uniforms
    come from the xoshiro256** ``state`` (advanced in place)."""
    b = ids.shape[0]
    u = np.empty(b, np.float64)
    for j in range(b):
        u[j] = (_next_u64(state) >> np.uint64(11)) * (1.0 / 9007199254740992.0)
    leaves, touched = _sample(sums, offs, depth, u, np.empty(b, np.int64))
    base = offs[depth]
    pmin = mins[0]
    for j in range(leaves.shape[0]):
        leaf = leaves[j]
        t = leaf // R
        slot = leaf - t * R
        k = slot_to_k[t]
        ks[j] = k
        slots[j] = slot
        ids[j] = seg_ids[k] * R + slot
        weights[j] = (sums[base + leaf] / pmin) ** (-beta)
    return touched


@numba.njit(nogil=True, cache=True, boundscheck=False)
def update_rows(sums, mins, offs, depth, ids, td, seg_ids, base, committed, R, eps, alpha):  # pragma: no cover
    """Priorities ``(|td| + eps)^alpha`` for rows given by global id; ids not in the snapshot
    (evicted meanwhile) are skipped. Returns the largest value set (0 if none), or -1 without
    changing anything if a TD error is not finite."""
    n = ids.shape[0]
    for j in range(n):
        if not np.isfinite(td[j]):
            return -1.0
    leaves = np.empty(n, np.int64)
    values = np.empty(n, np.float64)
    m = 0
    top = 0.0
    nseg = seg_ids.shape[0]
    for j in range(n):
        sid = ids[j] // R
        slot = ids[j] - sid * R
        lo, hi = 0, nseg
        while lo < hi:
            mid = (lo + hi) >> 1
            if seg_ids[mid] < sid:
                lo = mid + 1
            else:
                hi = mid
        if lo == nseg or seg_ids[lo] != sid or slot >= committed[lo] or ids[j] < 0:
            continue
        v = (abs(td[j]) + eps) ** alpha
        leaves[m] = base[lo] + slot
        values[m] = v
        top = max(top, v)
        m += 1
    _set(sums, mins, offs, depth, leaves[:m], values[:m])
    return top


class SumTree:
    """Sum and min trees over ``n`` leaves (grown on demand)."""

    def __init__(self, n: int = 1) -> None:
        self._alloc(max(n, 1))

    def _alloc(self, n: int) -> None:
        # level sizes from the leaves up, each padded to whole groups of K: about n * 8/7 nodes
        sizes = [-(-n // K) * K]
        while sizes[-1] > K:
            sizes.append(-(-(sizes[-1] // K) // K) * K)
        sizes.append(1)
        sizes.reverse()
        self.depth = len(sizes) - 1
        self.capacity = sizes[-1]
        self.offs = np.cumsum([0, *sizes[:-1]]).astype(np.int64)
        size = int(self.offs[-1] + self.capacity)
        self.sums = np.zeros(size, np.float64)
        self.mins = np.full(size, np.inf)

    def grow(self, n: int) -> None:
        """Hold at least ``n`` leaves, keeping the current leaf values."""
        if n <= self.capacity:
            return
        old = self.leaves().copy()
        self._alloc(n)
        if old.any():
            nz = np.flatnonzero(old)
            self.set(nz, old[nz])

    def leaves(self) -> np.ndarray:
        """The leaf values (a view)."""
        b = int(self.offs[self.depth])
        return self.sums[b : b + self.capacity]

    @property
    def total(self) -> float:
        return float(self.sums[0])

    @property
    def min(self) -> float:
        return float(self.mins[0])

    def get(self, leaves: np.ndarray) -> np.ndarray:
        return self.sums[self.offs[self.depth] + leaves]

    def set(self, leaves: np.ndarray, values: np.ndarray) -> None:
        _set(self.sums, self.mins, self.offs, self.depth, np.asarray(leaves, np.int64),
             np.asarray(values, np.float64))

    def fill(self, lo: int, hi: int, value: float) -> None:
        _fill(self.sums, self.mins, self.offs, self.depth, lo, min(hi, self.capacity), float(value))

    def sample(self, u: np.ndarray) -> np.ndarray:
        return _sample(self.sums, self.offs, self.depth, u, np.empty(len(u), np.int64))[0]
