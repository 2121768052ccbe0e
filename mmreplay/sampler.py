"""Samplers choose row ids; they never copy payload (views do, see ``view.py``).

``UniformSampler`` draws transition starts uniformly over every sampleable transition of the
store's current snapshot: it draws uniformly over committed rows (a binary search over the
per-segment cumulative counts, so the cost does not grow with the number of segments) and redraws
the few rows that do not start a transition (episode ends, a lane's newest row). Rejection keeps
the draw exactly uniform over the valid set. Draws come from the sampler's seeded numpy
generator; locating, validating and gathering run in one compiled pass (``_kernels.py``).

Refresh policy: before each draw the sampler refreshes the snapshot if a writer of the same
store handle published since (cheap: reread open segments' counts), and rescans the directory
for other processes' new segments every ``refresh_interval_s`` seconds.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import EmptyStoreError
from .view import TransitionBatch

if TYPE_CHECKING:
    from .store import ReplayStore

_MAX_ROUNDS = 64


class TransitionSampler:
    """What every transition sampler shares: the refresh policy, the gather plan, and turning
    the gathered bytes into a ``TransitionBatch``. Subclasses choose the rows."""

    def __init__(self, store: ReplayStore, *, seed: int | None = None, refresh_interval_s: float | None = 1.0) -> None:
        store.schema.require_transition_fields()
        self.store = store
        self.rng = np.random.default_rng(seed)
        self.refresh_interval_s = refresh_interval_s
        self._plans: dict[int, tuple[np.ndarray, list[tuple[Any, ...]], int]] = {}
        self._single_obs = store.schema.obs_names == ("obs",)
        # the compiled kernel's own generator state, seeded from ``rng`` (xoshiro256**)
        self._state = self.rng.integers(1, 2**63, size=4, dtype=np.int64).view(np.uint64)

    def _maybe_refresh(self) -> None:
        st = self.store
        if self.refresh_interval_s is None:
            return
        if time.monotonic() - st.reader.last_scan > self.refresh_interval_s or st._need_scan:
            st.refresh()
        elif st._dirty:
            st.refresh(scan=False)

    def _plan(self, batch_size: int) -> tuple[np.ndarray, list[tuple[Any, ...]], int]:
        """Field table for the kernel and where each field lands in the output buffer."""
        plan = self._plans.get(batch_size)
        if plan is None:
            lay = self.store.layout
            schema = self.store.schema
            items = [(f.name, False) for f in schema.fields] + [(n, True) for n in schema.obs_names]
            rows, where, off = [], [], 0
            for name, is_next in items:
                c = lay.column(name)
                n = schema[name].row_bytes
                rows.append((c.offset - lay.records_offset, n, off, int(is_next)))
                where.append((name, is_next, off, schema[name].dtype, (batch_size, *schema[name].shape)))
                off += -(-n * batch_size // 8) * 8  # 8-aligned blocks: the kernel copies words
            plan = (np.array(rows, np.int64).reshape(-1, 4), where, off)
            self._plans[batch_size] = plan
        return plan

    def _assemble(self, out: np.ndarray, ids: np.ndarray, where: list[tuple[Any, ...]],
                  weights: np.ndarray | None = None) -> TransitionBatch:
        """Views of the gathered blocks as a batch (no copy)."""
        cur: dict[str, np.ndarray] = {}
        nxt: dict[str, np.ndarray] = {}
        for name, is_next, off, dtype, shape in where:
            (nxt if is_next else cur)[name] = np.ndarray(shape, dtype, buffer=out, offset=off)
        if self._single_obs:
            obs, next_obs = cur.pop("obs"), nxt["obs"]
        else:
            obs_names = self.store.schema.obs_names
            obs = {n.removeprefix("obs/"): cur.pop(n) for n in obs_names}
            next_obs = {n.removeprefix("obs/"): nxt[n] for n in obs_names}
        return TransitionBatch(obs, cur.pop("action"), cur.pop("reward"), next_obs, cur.pop("terminated"),
                               cur.pop("truncated"), ids, cur, weights)


class UniformSampler(TransitionSampler):
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

    def _sample_raw(self, batch_size: int) -> tuple[np.ndarray, np.ndarray, list[tuple[Any, ...]]]:
        from ._kernels import sample_transitions

        self._maybe_refresh()
        reader = self.store.reader
        total = reader.snapshot.total_rows
        if total == 0:
            raise EmptyStoreError(f"{self.store.path} has no committed rows to sample from")
        table, where, nbytes = self._plan(batch_size)
        seg = reader.segment_table()
        out = np.empty(nbytes, np.uint8)
        ids = np.empty(batch_size, np.int64)
        lay = self.store.layout
        is_last_off = lay.column("is_last").offset - lay.records_offset
        filled = 0
        for _ in range(_MAX_ROUNDS):
            nrand = batch_size - filled + 8 + (batch_size - filled) // 4
            filled, _used, _ = sample_transitions(self._state, nrand, filled, seg, reader.bytes, lay.record_bytes, is_last_off,
                                                  self.store.segment_records, table, out, ids)
            if filled == batch_size:
                return out, ids, where
        if len(self.store.transition_ids()) == 0:
            raise EmptyStoreError(
                f"{self.store.path} has {total} rows but no sampleable transition yet "
                "(a transition needs the next row of its lane)"
            )
        raise RuntimeError("too few sampleable transitions among committed rows")  # pragma: no cover

    def sample_ids(self, batch_size: int) -> np.ndarray:
        """Global row ids of ``batch_size`` transition starts, drawn with replacement."""
        return self._sample_raw(batch_size)[1]

    def sample(self, batch_size: int) -> TransitionBatch:
        """A batch of ``batch_size`` transitions drawn uniformly with replacement."""
        if batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, got {batch_size}")
        out, ids, where = self._sample_raw(batch_size)
        return self._assemble(out, ids, where)
