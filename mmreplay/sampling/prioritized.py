"""PrioritizedSampler: proportional prioritized replay (Schaul et al. 2016) over a store.

A sum tree (and a min tree) over the rows of the live segments: each segment owns ``R`` leaves,
and a leaf holds ``p^alpha`` for a row that starts a sampleable transition, 0 otherwise. So:

* P(i) = p_i^alpha / sum_k p_k^alpha; drawing is stratified (one draw per equal slice of the
  mass); the importance weight is w_i = (N * P(i))^-beta / max_j w_j = (p_i^alpha / min_j
  p_j^alpha)^-beta, with N the number of sampleable rows and beta annealed linearly from
  ``beta`` to ``beta_final`` over ``beta_steps`` batches;
* ``update_priorities(ids, td_errors)`` stores (|td| + eps)^alpha exactly once; when an id
  appears twice in one call the last one wins (a sequential loop: deterministic);
* rows published since the last refresh enter at the current maximum priority; a row whose
  next row only now arrived becomes sampleable then; rows of evicted segments leave the tree
  (their window's leaves are cleared) before a new segment can reuse the window;
* ``save()`` writes the priorities next to the store (``priorities/<name>.npz``, atomically) and
  a sampler built with the same ``name`` reloads them, so a resumed run samples as before.

Every operation on the tree is one compiled call (``_sumtree.py``, an 8-ary tree walked level by
level); the gather is the same compiled pass as uniform sampling.

Storage tiers (``tiers.py``, options as for ``UniformSampler``):

* ``mode="exact", prefetch_batches=P``: the next ``P`` batches are drawn ahead (stratified, with
  their weights) and their pages fetched in the background. A batch therefore reflects the
  priorities as they were ``P`` batches earlier (like any asynchronous loader); an id evicted
  meanwhile makes its batch be drawn again.
* ``mode="windowed"``: priorities are **restricted to the resident set** (the open segments and
  the sealed segments held in RAM): P(i) = p_i^alpha / sum over sampleable *resident* rows, the
  importance weight uses that P(i) and the number of resident rows, and max w is taken over
  them. The priorities of a segment leaving the set are parked (kept, and updated if its ids
  come back in ``update_priorities``) and re-enter with it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.fs import atomic_write
from ..core.errors import EmptyStoreError
from .gather import Once, assemble, check_batch_size, kernels
from .uniform import Mode, TransitionSampler

_SCAN_ROWS = 4096
"""Rows entering at once from which ``_enter`` reads their segment in order (read-ahead)."""

if TYPE_CHECKING:
    from pathlib import Path

    from ..storage import ReplayStore
    from ..storage import TransitionBatch


class PrioritizedSampler(TransitionSampler):
    """Prioritized one-step transitions. See the module docstring for the formulas.

    Parameters
    ----------
    alpha, beta, beta_final, beta_steps, eps
        Priority exponent; importance-weight exponent annealed linearly to ``beta_final`` over
        ``beta_steps`` calls of ``sample``; the constant added to ``|td|``.
    name
        Name of the saved priorities (``<store>/priorities/<name>.npz``); loaded if present.
    mode, cache_bytes, prefetch_batches, swap_segments_per_s
        Storage tiers, as for ``UniformSampler`` (windowed: priorities restricted to the
        resident set, see the module docstring).

    Example
    -------
    >>> import tempfile
    >>> import numpy as np
    >>> import mmreplay
    >>> store = mmreplay.create_store(tempfile.mkdtemp() + "/replay", mmreplay.Schema.transition(obs_shape=(4,)),
    ...                               capacity=10_000)
    >>> with store.writer(lanes=1) as w:
    ...     w.add_batch(obs=np.zeros((100, 1, 4), np.float32), action=np.zeros((100, 1), np.int64),
    ...                 reward=np.ones((100, 1), np.float32), terminated=np.zeros((100, 1), bool),
    ...                 truncated=np.zeros((100, 1), bool))
    >>> sampler = mmreplay.PrioritizedSampler(store, alpha=0.6, beta=0.4, seed=0)
    >>> batch = sampler.sample(32)  # new rows enter at the largest priority: equal weights
    >>> batch.weights.shape, bool(np.allclose(batch.weights, 1.0))
    ((32,), True)
    >>> td = np.full(32, 2.0)  # the learner's TD errors for batch.ids
    >>> sampler.update_priorities(batch.ids, td)  # each row's priority: (|td| + eps)^alpha
    >>> bool(np.allclose(sampler.priorities(batch.ids), (2.0 + sampler.eps) ** 0.6))
    True
    >>> batch = sampler.sample(32)  # those rows are now drawn more often, with smaller weights
    >>> sampler.save()  # <store>/priorities/default.npz: a sampler named "default" reloads it
    >>> store.close()
    """

    def __init__(self, store: ReplayStore, *, alpha: float = 0.6, beta: float = 0.4, beta_final: float = 1.0,
                 beta_steps: int = 100_000, eps: float = 1e-6, seed: int | None = None,
                 refresh_interval_s: float | None = 1.0, name: str = "default", n_step: int = 1,
                 gamma: float = 0.99, frame_stack: int = 1, mode: Mode = "exact", cache_bytes: int | None = None,
                 prefetch_batches: int = 0, swap_segments_per_s: float = 1.0) -> None:
        if not 0 <= alpha <= 1 or not 0 <= beta <= 1 or not 0 <= beta_final <= 1:
            raise ValueError("`alpha`, `beta` and `beta_final` must lie in [0, 1]")
        if eps <= 0 or beta_steps < 1:
            raise ValueError("`eps` must be > 0 and `beta_steps` >= 1")
        super().__init__(store, seed=seed, refresh_interval_s=refresh_interval_s, n_step=n_step, gamma=gamma,
                         frame_stack=frame_stack, mode=mode, cache_bytes=cache_bytes,
                         prefetch_batches=prefetch_batches, swap_segments_per_s=swap_segments_per_s)
        self._k = kernels()
        SumTree = self._k.SumTree
        self.alpha = alpha
        """The priority exponent: a row is drawn with probability ``p^alpha / sum p^alpha``."""
        self._beta0 = beta
        self.beta_final = beta_final
        """The importance-weight exponent ``beta`` reaches after ``beta_steps`` draws."""
        self.beta_steps = beta_steps
        """Calls of ``sample`` over which ``beta`` is annealed from its start to ``beta_final``."""
        self.eps = eps
        """Added to ``|td|``: a row's priority is ``(|td| + eps)^alpha``."""
        self.name = name
        """Name of the saved priorities: ``<store>/priorities/<name>.npz``."""
        self.steps = 0
        """Batches drawn so far (saved and reloaded with the priorities): how far ``beta`` is annealed."""
        self.max_priority = 1.0
        """The largest ``p^alpha`` seen: rows published since the last refresh enter with it."""
        self._R = store.segment_records
        self._tree = SumTree(1)
        self._known: dict[int, tuple[int, int, int]] = {}  # segment id -> (tree slot, committed, succ id)
        self._free: list[int] = []
        self._slots = 0
        self._base = np.zeros(0, np.int64)  # first leaf of each snapshot segment
        self._slot_to_k = np.zeros(1, np.int64)
        self._version = None
        self._parked: dict[int, np.ndarray] = {}  # windowed: leaves of segments outside the set
        self._res_key: tuple[object, int] | None = None
        self._drawn: list[tuple[int, np.ndarray, np.ndarray, int]] = []  # prefetch: (B, ids, weights, ticket)
        store.sync_local()
        self._sync()
        self._apply_residency()
        self._load()

    # -- keeping the tree in step with the store --------------------------------------------
    @property
    def beta0(self) -> float:
        """The importance-sampling exponent at the start (the ``beta`` argument)."""
        return self._beta0

    @property
    def tree(self) -> Any:
        """The sum tree over the rows' priorities ``p^alpha``, one leaf per slot of each segment the
        sampler holds (``leaves()``, ``total``): to read; priorities change through
        ``update_priorities``."""
        return self._tree

    @property
    def beta(self) -> float:
        """The importance-sampling exponent now: ``beta`` annealed linearly to ``beta_final`` over
        ``beta_steps`` draws (then held)."""
        f = min(self.steps / self.beta_steps, 1.0)
        return self._beta0 + f * (self.beta_final - self._beta0)

    def _sync(self) -> None:
        """Bring the tree up to the reader's snapshot (new rows, new successors, evictions).

        Each live segment owns ``R`` consecutive leaves at a compact slot of the tree (slots of
        evicted segments are cleared, then reused), so the tree is sized by the live data.
        """
        snap = self.store.reader.snapshot
        if self._version is snap:
            return
        self._version = snap
        sids = snap.segment_ids
        live = set(sids.tolist())
        for sid in [s for s in self._known if s not in live]:  # evicted: leave the tree first
            t = self._known.pop(sid)[0]
            self._tree.fill(t * self._R, (t + 1) * self._R, 0.0)
            self._parked.pop(sid, None)
            self._free.append(t)
        self._tree.grow((len(self._known) + len(live - self._known.keys()) + len(self._free) + 1) * self._R)
        self._base = np.empty(len(sids), np.int64)
        for k, sid in enumerate(sids.tolist()):
            n = int(snap.committed[k])
            succ = int(sids[snap.succ[k]]) if snap.succ[k] >= 0 else -1
            old = self._known.get(sid)
            if old is None:
                t = self._free.pop() if self._free else self._slots
                self._slots = max(self._slots, t + 1)
                self._tree.fill(t * self._R, (t + 1) * self._R, 0.0)
                lo = 0
            else:
                t = old[0]
                lo = -1
                if old[1:] != (n, succ):
                    reach = int(snap.lanes[k]) * self.n_step  # rows whose lookahead may just be complete
                    lo = max(0, old[1] - reach)
                    if succ != old[2]:
                        lo = min(lo, max(0, int(snap.usable[k]) - reach))
            self._base[k] = t * self._R
            self._known[sid] = (t, n, succ)
            if lo >= 0:
                self._enter(k, t, lo, n)
        self._slot_to_k = np.full(max(self._slots, 1), -1, np.int64)
        self._slot_to_k[self._base // self._R] = np.arange(len(sids))

    def _enter(self, k: int, t: int, lo: int, hi: int) -> None:
        """Rows ``[lo, hi)`` of segment ``k`` that now start a transition and have no priority
        yet enter at the maximum priority."""
        if hi <= lo:
            return
        slot = np.arange(lo, hi)
        reader = self.store.reader
        # a whole segment (a new sampler, a segment sealed or seen for the first time) is read in order, with
        # read-ahead, not a page fault per 4 KiB of flags (~90 MB/s from a cold cache); a few new rows are not
        with reader.scanning(k, ahead=k + 1) if hi - lo >= _SCAN_ROWS else contextlib.nullcontext():
            if self.windowed:
                flags, rew = self._window_consts()
                ok = self._k.valid_starts(reader.segment_table(), reader.bytes, self.store.layout.record_bytes, flags,
                                          rew, self.n_step, self.gamma, self.frame_stack, np.full(len(slot), k), slot)
            elif lo == 0 and hi == int(reader.snapshot.committed[k]):
                ok = reader.segment_starts(k)[0]  # slices of the flag bytes, no gather
            else:
                ok, _, _ = reader.transition_starts(np.full(len(slot), k), slot)
        parked = self._parked.get(int(self.store.reader.snapshot.segment_ids[k]))
        if parked is not None:  # windowed, outside the resident set: its parked leaves
            s = slot[ok]
            parked[s[parked[s] == 0]] = self.max_priority
            return
        leaves = t * self._R + slot[ok]
        leaves = leaves[self._tree.get(leaves) == 0]
        if len(leaves):
            self._tree.set(leaves, np.full(len(leaves), self.max_priority))

    def _apply_residency(self) -> None:
        """Windowed mode: keep in the tree only the segments draws may come from (open or
        resident); park the leaves of the others and bring back those that returned."""
        res = self._resident
        if res is None:
            return
        snap = self.store.reader.snapshot
        key = (snap, res.version)
        if self._res_key is not None and self._res_key[0] is snap and self._res_key[1] == res.version:
            return
        self._res_key = key
        include = res.include()
        parked = np.isin(snap.segment_ids, np.fromiter(self._parked, np.int64))
        R = self._R
        for k in np.flatnonzero(include == parked).tolist():  # only the segments that changed side
            sid, b = int(snap.segment_ids[k]), int(self._base[k])
            if include[k]:
                self._tree.set(np.arange(b, b + R), self._parked.pop(sid))
            else:
                self._parked[sid] = self._tree.leaves()[b : b + R].copy()
                self._tree.fill(b, b + R, 0.0)

    def _update_parked(self, ids: np.ndarray, td: np.ndarray) -> np.ndarray:
        """Store the priorities of parked rows; returns the mask of ids that were not parked."""
        sid = ids // self._R
        parked = np.isin(sid, np.fromiter(self._parked, np.int64))
        if not parked.any():
            return ~parked
        snap = self.store.reader.snapshot
        pid, ptd = ids[parked][::-1], td[parked][::-1]
        pid, first = np.unique(pid, return_index=True)  # the last occurrence of each id wins
        values = (np.abs(ptd[first]) + self.eps) ** self.alpha
        for s in np.unique(pid // self._R).tolist():
            sel = pid // self._R == s
            slot = pid[sel] - s * self._R
            k = int(np.searchsorted(snap.segment_ids, s))
            keep = slot < snap.committed[k]
            self._parked[s][slot[keep]] = values[sel][keep]
            if keep.any():
                self.max_priority = max(self.max_priority, float(values[sel][keep].max()))
        return ~parked

    def _leaves(self, k: np.ndarray, slot: np.ndarray) -> np.ndarray:
        """Stored ``p^alpha`` of rows at snapshot locations (parked or in the tree)."""
        out = self._tree.get(self._base[k] + slot)
        if self._parked:
            sids = self.store.reader.snapshot.segment_ids[k]
            for j in np.flatnonzero(np.isin(sids, np.fromiter(self._parked, np.int64))):
                out[j] = self._parked[int(sids[j])][slot[j]]
        return out

    # -- sampling ---------------------------------------------------------------------------
    def sample(self, batch_size: int) -> TransitionBatch:
        """``batch_size`` transitions drawn in proportion to their priority, with replacement
        (a transition can appear twice; ``batch_size`` may exceed the store), with their
        importance weights (``batch.weights``, max 1) and ids for ``update_priorities``."""
        batch_size = check_batch_size(batch_size)
        self._prepare()
        self._sync()
        self._apply_residency()
        if self._tree.total <= 0:
            raise EmptyStoreError(f"{self.store.path} has no sampleable transition yet")
        reader = self.store.reader
        if self._fetcher is not None:
            k, slot, ids, weights = self._next_drawn(batch_size)
        else:
            k, slot, ids, weights = self._draw(batch_size)
        if self.windowed:
            self.steps += 1
            b = self._gather_windowed(batch_size, Once(k, slot), weights)
            if len(b.ids) != batch_size:  # pragma: no cover - the tree holds only complete windows
                raise RuntimeError("prioritized draw hit an incomplete window")
            self._after_batch()
            return b
        plan = self._plan(batch_size)
        out = self._buffer(plan.nbytes)
        self._k.gather_at(reader.segment_table(), reader.bytes, self.store.layout.record_bytes, k, slot, plan.table,
                          out, plan.big)
        self.steps += 1
        self._after_batch()
        return assemble(plan, out, ids, weights)

    def _draw(self, batch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Stratified draws from the tree: snapshot locations, ids and importance weights."""
        tr = self._tree
        k = np.empty(batch_size, np.int64)
        slot = np.empty(batch_size, np.int64)
        ids = np.empty(batch_size, np.int64)
        weights = np.empty(batch_size, np.float32)
        self._k.sample_rows(tr.sums, tr.mins, tr.offs, tr.depth, self._state, self._R, self._slot_to_k,
                            self.store.reader.snapshot.segment_ids, self.beta, k, slot, ids, weights)
        return k, slot, ids, weights

    def _next_drawn(self, batch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Exact mode with prefetch: the oldest batch drawn ahead (drawn again if one of its
        rows was evicted since), then the next batches are drawn and their pages fetched."""
        from ._prefetch import relocate

        assert self._fetcher is not None
        seg = self.store.reader.segment_table()
        self._drawn = [d for d in self._drawn if d[0] == batch_size]
        if not self._drawn:
            self._draw_ahead(batch_size, seg)
        _, ids, weights, ticket = self._drawn.pop(0)
        self._fetcher.wait(ticket)
        ok, k, slot = relocate(self.store, ids)
        if not ok.all():
            k, slot, ids, weights = self._draw(batch_size)
        while len(self._drawn) < self.prefetch_batches:
            self._draw_ahead(batch_size, seg)
        return k, slot, ids, weights

    def _draw_ahead(self, batch_size: int, seg: np.ndarray) -> None:
        assert self._fetcher is not None
        k, slot, ids, weights = self._draw(batch_size)
        self._drawn.append((batch_size, ids, weights, self._fetcher.fetch(seg, k, slot)))

    def update_priorities(self, ids: np.ndarray, td_errors: np.ndarray) -> None:
        """Set the priorities of sampled rows from their TD errors: (|td| + eps)^alpha.

        Ids of rows evicted since they were sampled are ignored.
        """
        ids = np.ascontiguousarray(ids, np.int64).ravel()
        td = np.ascontiguousarray(td_errors, np.float64).ravel()
        if ids.shape != td.shape:
            raise ValueError(f"`ids` and `td_errors` must have the same length, got {ids.shape} and {td.shape}")
        self._sync()
        self._apply_residency()
        if self._parked:
            keep = self._update_parked(ids, td) if np.isfinite(td).all() else np.ones(len(ids), np.bool_)
            ids, td = ids[keep], td[keep]
        snap = self.store.reader.snapshot
        tr = self._tree
        top = self._k.update_rows(tr.sums, tr.mins, tr.offs, tr.depth, ids, td, snap.segment_ids, self._base, snap.committed,
                          self._R, self.eps, self.alpha)
        if top < 0:
            raise ValueError("`td_errors` must be finite (nothing was updated)")
        self.max_priority = max(self.max_priority, top)

    def priorities(self, ids: np.ndarray) -> np.ndarray:
        """The stored ``p^alpha`` of rows (0 for rows that cannot be sampled)."""
        self._sync()
        self._apply_residency()
        k, slot = self.store.reader.locate(ids)
        return self._leaves(k, slot)

    # -- persistence ------------------------------------------------------------------------
    def _path(self) -> Path:
        return self.store.path / "priorities" / f"{self.name}.npz"

    def save(self) -> None:
        """Write every live row's priority next to the store (atomic); loaded by a sampler of
        the same ``name``."""
        snap = self.store.reader.snapshot
        arrays = {"_meta": np.array([self.max_priority, self.steps, self.alpha])}
        for k, sid in enumerate(snap.segment_ids.tolist()):
            b, n = int(self._base[k]), int(snap.committed[k])
            parked = self._parked.get(sid)
            arrays[str(sid)] = parked[:n] if parked is not None else self._tree.leaves()[b : b + n]
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        try:
            os.makedirs(self._path().parent, exist_ok=True)
            atomic_write(self._path(), buf.getvalue())
        except OSError as exc:  # a read-only store directory (a shared dataset), a full disk
            from ..core.errors import DiskFullError, ReadOnlyStoreError

            if exc.errno == errno.ENOSPC:
                raise DiskFullError(f"cannot save the priorities to {self._path()}: the disk is full") from exc
            raise ReadOnlyStoreError(
                f"cannot save the priorities to {self._path()}: {exc.strerror or exc}",
                hint="priorities are saved beside the store: make its directory writable, or keep them in memory "
                     "(a sampler without save() loses them when it goes)") from exc

    def _load(self) -> None:
        path = self._path()
        if not path.exists():
            return
        with np.load(path) as data:
            meta = data["_meta"]
            self.max_priority, self.steps = float(meta[0]), int(meta[1])
            snap = self.store.reader.snapshot
            for k, sid in enumerate(snap.segment_ids.tolist()):
                if str(sid) not in data:
                    continue
                saved = data[str(sid)]
                n = min(len(saved), int(snap.committed[k]))
                parked = self._parked.get(sid)
                if parked is not None:
                    keep = parked[:n] > 0
                    parked[:n][keep] = saved[:n][keep]
                    continue
                leaves = self._base[k] + np.arange(n)
                keep = self._tree.get(leaves) > 0  # only rows that can be sampled now
                self._tree.set(leaves[keep], saved[:n][keep])
