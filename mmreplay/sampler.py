"""Samplers choose row ids; they never copy payload (views do, see ``view.py``).

``UniformSampler`` draws transition starts uniformly over every sampleable transition of the
store's current snapshot: it draws uniformly over committed rows (a ``searchsorted`` over the
per-segment cumulative counts, so the cost does not grow with the number of segments) and redraws
the few rows that do not start a transition (episode ends, a lane's newest row). Rejection keeps
the draw exactly uniform over the valid set, and it is vectorized: a loop over redraw rounds,
never over items.

Refresh policy: before each draw the sampler refreshes the snapshot if a writer of the same
store handle published since (cheap: reread open segments' counts), and rescans the directory
for other processes' new segments every ``refresh_interval_s`` seconds.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from .errors import EmptyStoreError
from .view import TransitionBatch, locate_transitions, transitions

if TYPE_CHECKING:
    from .store import ReplayStore

_MAX_ROUNDS = 64


class UniformSampler:
    """Uniform one-step transitions from a store.

    Parameters
    ----------
    store
        An open store (``mode="r"`` or ``"a"``).
    seed
        Seed of the sampler's own ``numpy.random.Generator``: same store contents and seed,
        same batches.
    refresh_interval_s
        How often to look for segments written by other processes; ``None`` never refreshes
        automatically (call ``store.refresh()`` yourself).
    """

    def __init__(self, store: ReplayStore, *, seed: int | None = None, refresh_interval_s: float | None = 1.0) -> None:
        store.schema.require_transition_fields()
        self.store = store
        self.rng = np.random.default_rng(seed)
        self.refresh_interval_s = refresh_interval_s

    def _maybe_refresh(self) -> None:
        st = self.store
        if self.refresh_interval_s is None:
            return
        if time.monotonic() - st.reader.last_scan > self.refresh_interval_s or st._need_scan:
            st.refresh()
        elif st._dirty:
            st.refresh(scan=False)

    def _draw(self, batch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        self._maybe_refresh()
        s = self.store.reader.snapshot
        total = s.total_rows
        if total == 0:
            raise EmptyStoreError(f"{self.store.path} has no committed rows to sample from")
        k = np.empty(batch_size, np.int64)
        slot = np.empty(batch_size, np.int64)
        nk = np.empty(batch_size, np.int64)
        ns = np.empty(batch_size, np.int64)
        todo = np.arange(batch_size)
        for _ in range(_MAX_ROUNDS):
            u = self.rng.integers(0, total, len(todo))
            kk = np.searchsorted(s.cum_end, u, side="right")
            ss = u - (s.cum_end[kk] - s.committed[kk])
            ok, a, b = locate_transitions(self.store, kk, ss)
            done = todo[ok]
            k[done], slot[done], nk[done], ns[done] = kk[ok], ss[ok], a[ok], b[ok]
            todo = todo[~ok]
            if len(todo) == 0:
                return k, slot, nk, ns
        if len(self.store.transition_ids()) == 0:
            raise EmptyStoreError(
                f"{self.store.path} has {total} rows but no sampleable transition yet "
                "(a transition needs the next row of its lane)"
            )
        raise RuntimeError("too few sampleable transitions among committed rows")  # pragma: no cover

    def sample_ids(self, batch_size: int) -> np.ndarray:
        """Global row ids of ``batch_size`` transition starts, drawn with replacement."""
        k, slot, _, _ = self._draw(batch_size)
        return self.store.reader.snapshot.segment_ids[k] * self.store.segment_records + slot

    def sample(self, batch_size: int) -> TransitionBatch:
        """A batch of ``batch_size`` transitions drawn uniformly with replacement."""
        if batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, got {batch_size}")
        k, slot, nk, ns = self._draw(batch_size)
        ids = self.store.reader.snapshot.segment_ids[k] * self.store.segment_records + slot
        return transitions(self.store, k, slot, ids, (nk, ns))
