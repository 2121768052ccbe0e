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

Beyond RAM (``tiers.py``): ``mode="exact"`` (the default) draws over every committed row and
reads through the page cache; with ``prefetch_batches=P`` it draws the next ``P`` batches'
rows ahead (the same uniform stream, consumed in order) and a background thread issues
``MADV_WILLNEED`` for the records their views read, so the disk fetches them while the learner
computes. ``mode="windowed"`` draws only from the open segments and a resident set of whole
sealed segments copied into RAM (``cache_bytes``), which a background thread rotates
(``swap_segments_per_s``): near RAM speed whatever the store's size, at the cost of a bias
(README "Beyond RAM"). ``cache_bytes`` in exact mode bounds the store pages kept mapped.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..core.errors import EmptyStoreError, SchemaError
from ..storage.view import TransitionBatch

if TYPE_CHECKING:
    from ..storage.store import ReplayStore

_MAX_ROUNDS = 64
_KERNELS: Any = None
_WINDOWED_MAPPED_BYTES = 64 << 20  # file pages a windowed sampler may keep mapped beyond its budget
Mode = Literal["exact", "windowed"]


def _kernels() -> Any:
    """The compiled kernels, imported once on first use (numba is not loaded by ``import
    mmreplay``; a function-level import on every batch costs about a microsecond)."""
    global _KERNELS
    if _KERNELS is None:
        from types import SimpleNamespace

        from . import _iokernels as io
        from . import _kernels as k
        from . import _sumtree as t
        from . import _windows as w

        _KERNELS = SimpleNamespace(
            sample_transitions=k.sample_transitions, gather_at=k.gather_at, draw_rows=k.draw_rows,
            draw_and_gather=w.draw_and_gather, gather_windows=w.gather_windows, valid_starts=w.valid_starts,
            gather_sequences=w.gather_sequences, sample_rows=t.sample_rows, update_rows=t.update_rows,
            SumTree=t.SumTree, advise_windows=io.advise_windows, pread_at=io.pread_at,
        )
    return _KERNELS


class TransitionSampler:
    """What every transition sampler shares: the refresh policy, the gather plan, the storage
    tier options (``mode``, see the module docstring), and turning the gathered bytes into a
    ``TransitionBatch``. Subclasses choose the rows."""

    def __init__(self, store: ReplayStore, *, seed: int | None = None, refresh_interval_s: float | None = 1.0,
                 n_step: int = 1, gamma: float = 0.99, frame_stack: int = 1, mode: Mode = "exact",
                 cache_bytes: int | None = None, prefetch_batches: int = 0,
                 swap_segments_per_s: float = 1.0) -> None:
        store.schema.require_transition_fields()
        if mode not in ("exact", "windowed"):
            raise ValueError(f"`mode` must be 'exact' or 'windowed', got {mode!r}")
        if not isinstance(prefetch_batches, (int, np.integer)) or prefetch_batches < 0:
            raise ValueError(f"`prefetch_batches` must be an int >= 0, got {prefetch_batches!r}")
        if mode == "windowed" and prefetch_batches:
            raise ValueError("`prefetch_batches` applies to mode='exact' (windowed mode samples from RAM)")
        if cache_bytes is not None and cache_bytes < 1:
            raise ValueError(f"`cache_bytes` must be a positive number of bytes, got {cache_bytes!r}")
        if not isinstance(n_step, (int, np.integer)) or n_step < 1:
            raise ValueError(f"`n_step` must be an int >= 1, got {n_step!r}")
        if not isinstance(frame_stack, (int, np.integer)) or frame_stack < 1:
            raise ValueError(f"`frame_stack` must be an int >= 1, got {frame_stack!r}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"`gamma` must lie in [0, 1], got {gamma!r}")
        self.n_step, self.gamma, self.frame_stack = int(n_step), float(gamma), int(frame_stack)
        self.windowed = self.n_step > 1 or self.frame_stack > 1
        if self.windowed and store.schema["reward"].dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise SchemaError(f"n-step returns need a float32 or float64 `reward`, got {store.schema['reward'].dtype}")
        self.store = store
        self.rng = np.random.default_rng(seed)
        self.refresh_interval_s = refresh_interval_s
        self._plans: dict[Any, Any] = {}
        self._single_obs = store.schema.obs_names == ("obs",)
        self._out: np.ndarray | None = None  # set by fill(): gather into the caller's buffer
        # the compiled kernel's own generator state, seeded from ``rng`` (xoshiro256**)
        self._state = self.rng.integers(1, 2**63, size=4, dtype=np.int64).view(np.uint64)
        self._setup_tiers(mode, cache_bytes, int(prefetch_batches), swap_segments_per_s)

    # -- storage tiers (tiers.py) ---------------------------------------------------------------
    def _setup_tiers(self, mode: Mode, cache_bytes: int | None, prefetch_batches: int,
                     swap_segments_per_s: float) -> None:
        from ._prefetch import DrawAhead, PageFetcher, RssGuard
        from .tiers import ResidentSet

        self.mode: Mode = mode
        self.cache_bytes = cache_bytes
        self.prefetch_batches = prefetch_batches
        self._resident: ResidentSet | None = None
        self._fetcher: PageFetcher | None = None
        self._ahead: DrawAhead | None = None  # uniform sampling, exact mode with prefetch
        self._guard: RssGuard | None = None
        self._filled = False  # windowed: the resident set was filled once
        if mode == "windowed":
            self._resident = ResidentSet(self.store, cache_bytes, swap_segments_per_s,
                                         np.random.default_rng(self.rng.integers(2**63)))
            self._resident.edge_rows = (self.frame_stack - 1, self.n_step)
            self._guard = RssGuard(self.store, _WINDOWED_MAPPED_BYTES, every=16)  # few pages a batch
        else:
            if prefetch_batches:
                self._fetcher = PageFetcher(self.store, self.frame_stack - 1, self.n_step)
                self._ahead = DrawAhead(self, prefetch_batches, self._fetcher)
            if cache_bytes is not None:
                self._guard = RssGuard(self.store, cache_bytes)
        parts = [p for p in (self._resident, self._fetcher, self._guard) if p is not None]
        self._finalizer = weakref.finalize(self, _close_parts, parts) if parts else None

    def _prepare(self) -> None:
        """Before a draw: refresh, and in windowed mode bring the resident set up to date."""
        self._maybe_refresh()
        if self._resident is not None:
            if not self._filled:  # the first draw waits for a full set: no start-up bias
                self._resident.fill()
                self._filled = True
            self._resident.update()
            self._resident.ensure_rows()
            if self._resident.rows() == 0:
                raise EmptyStoreError(f"{self.store.path} has no committed rows to sample from")

    def _draw_table(self) -> np.ndarray:
        """The segment table draws use: every segment, or the resident ones (windowed)."""
        if self._resident is not None:
            return self._resident.table()
        return self.store.reader.segment_table()

    def _after_batch(self) -> None:
        guard = self._guard
        if guard is not None:
            if self._resident is not None:  # file pages beside the copies: up to the rest of the budget
                guard.limit = max(_WINDOWED_MAPPED_BYTES, self._resident.cache_bytes
                                  - len(self.store.reader.pinned) * self._resident.segment_bytes)
            guard.check()

    def load_resident(self, timeout_s: float | None = None) -> None:
        """``mode="windowed"``: fill the resident set now (blocking; the first draw does it
        otherwise), e.g. before timing or before starting a ``BatchLoader``."""
        if self._resident is None:
            raise ValueError("load_resident() needs mode='windowed'")
        self._maybe_refresh()
        self._resident.fill(timeout_s)
        self._filled = True

    def tier_stats(self) -> dict[str, Any]:
        """Where this sampler's rows come from: the resident set (windowed), the prefetch
        counters (exact), and the store pages this process keeps mapped."""
        out: dict[str, Any] = (self._resident.stats() if self._resident is not None
                               else {"mode": "exact", "prefetch_batches": self.prefetch_batches})
        if self._fetcher is not None:
            out["prefetched_rows"] = self._fetcher.rows
            out["prefetch_calls"] = self._fetcher.calls
        if self._guard is not None:
            out["mapped_file_bytes"] = self._guard.mapped_file_bytes()
            out["unmap_drops"] = self._guard.drops
        return out

    def close(self) -> None:
        """Stop background threads and give back the resident set's RAM (idempotent). The
        sampler should not be used afterwards."""
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> TransitionSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def batch_nbytes(self, batch_size: int) -> int:
        """Bytes of the gathered block behind a batch of ``batch_size`` (for preallocated, e.g.
        pinned, buffers: see ``fill``)."""
        return int((self._wplan(batch_size) if self.windowed else self._plan(batch_size))[-1])

    def fill(self, out: np.ndarray, batch_size: int) -> TransitionBatch:
        """``sample`` gathering straight into ``out`` (a uint8 buffer of at least
        ``batch_nbytes(batch_size)`` bytes, e.g. a view of pinned memory): the batch's large
        arrays are views of ``out``, so it is valid until ``out`` is reused."""
        if out.dtype != np.uint8 or out.ndim != 1 or len(out) < self.batch_nbytes(batch_size):
            raise ValueError(f"`out` must be a 1-D uint8 buffer of >= {self.batch_nbytes(batch_size)} bytes")
        self._out = out
        try:
            return self.sample(batch_size)
        finally:
            self._out = None

    def _buffer(self, nbytes: int) -> np.ndarray:
        out = self._out
        return out[:nbytes] if out is not None else np.empty(nbytes, np.uint8)

    def sample(self, batch_size: int) -> TransitionBatch:  # pragma: no cover - overridden
        raise NotImplementedError

    def _maybe_refresh(self) -> None:
        if self.refresh_interval_s is not None:
            self.store.refresh_if_stale(self.refresh_interval_s)

    def _plan(self, batch_size: int) -> tuple[np.ndarray, list[tuple[Any, ...]], bool, int]:
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
            table = np.array(rows, np.int64).reshape(-1, 4)
            plan = (table, where, bool((table[:, 1] >= 128).any()), off)  # big: frame-sized fields
            self._plans[batch_size] = plan
        return plan

    # -- windowed views (n-step returns, frame stacks) ----------------------------------------
    def _wplan(self, batch_size: int) -> tuple[np.ndarray, np.ndarray, list[tuple[Any, ...]], int]:
        """Kernel tables for fields copied once and observation fields stacked ``frame_stack``
        times, and where each lands in the output buffer.

        With one-step transitions the next stack is the current one shifted by a frame (within
        an episode, clamping included), so each observation field is gathered once as
        ``(B, frame_stack + 1, ...)`` and ``obs``/``next_obs`` are overlapping views of it: 5
        frames copied per transition instead of 8 for Atari stacks of 4.
        """
        from ._windows import ROW_NEXT, ROW_SHARED, ROW_START

        key = -batch_size
        plan = self._plans.get(key)
        if plan is None:
            lay = self.store.layout
            schema = self.store.schema
            obs = set(schema.obs_names)
            fs = self.frame_stack
            shared = fs > 1 and self.n_step == 1
            once, stacked, where, off = [], [], [], 0
            items = [(f.name, False) for f in schema.fields if f.name not in ("reward", "terminated", "truncated")]
            items += [(n, True) for n in schema.obs_names]
            for name, is_next in items:
                f = schema[name]
                rec_off = lay.column(name).offset - lay.records_offset
                if name in obs and fs > 1:
                    if shared and is_next:
                        continue  # a view of the shared block
                    role = ROW_SHARED if shared else (ROW_NEXT if is_next else ROW_START)
                    frames = fs + 1 if shared else fs
                    stacked.append((rec_off, f.row_bytes, off, role))
                    where.append((name, "shared" if shared else is_next, off, f.dtype, (batch_size, frames, *f.shape)))
                    off += -(-f.row_bytes * frames * batch_size // 8) * 8
                else:
                    once.append((rec_off, f.row_bytes, off, ROW_NEXT if is_next else ROW_START))
                    where.append((name, is_next, off, f.dtype, (batch_size, *f.shape)))
                    off += -(-f.row_bytes * batch_size // 8) * 8
            plan = (np.array(once, np.int64).reshape(-1, 4), np.array(stacked, np.int64).reshape(-1, 4), where, off)
            self._plans[key] = plan
        return plan

    def _window_consts(self) -> tuple[np.ndarray, np.ndarray]:
        consts = self._plans.get("consts")
        if consts is None:
            lay = self.store.layout
            r = lay.records_offset
            flags = np.array([lay.column(n).offset - r for n in ("is_last", "terminated", "truncated")], np.int64)
            rew = np.array([lay.column("reward").offset - r, self.store.schema["reward"].dtype.itemsize], np.int64)
            consts = self._plans["consts"] = (flags, rew)
        return consts

    def _gather_windowed(self, batch_size: int, candidates: Any, weights: np.ndarray | None = None,
                         table: np.ndarray | None = None) -> TransitionBatch:
        """Fill a batch from ``candidates(n) -> (ks, slots)``, skipping starts whose window is
        incomplete; the views' values come back in ``reward``, ``discount`` and the flags."""
        k = _kernels()
        draw_and_gather, gather_windows = k.draw_and_gather, k.gather_windows
        reader = self.store.reader
        once, stacked, where, nbytes = self._wplan(batch_size)
        flags, rew = self._window_consts()
        out = self._buffer(nbytes)
        ids = np.empty(batch_size, np.int64)
        ret = np.empty(batch_size, np.float32)
        disc = np.empty(batch_size, np.float32)
        term = np.empty(batch_size, np.bool_)
        trunc = np.empty(batch_size, np.bool_)
        filled = 0
        seg = reader.segment_table() if table is None else table
        rec_bytes = self.store.layout.record_bytes
        for _ in range(_MAX_ROUNDS):
            want = batch_size - filled + 4 + (batch_size - filled) // 16  # few starts are rejected
            if isinstance(candidates, np.ndarray):  # a generator state: the kernel draws rows itself
                filled, _, _ = draw_and_gather(candidates, want, seg, reader.bytes, rec_bytes, flags, rew, self.n_step,
                                               self.gamma, self.frame_stack, filled, once, stacked, out, ids,
                                               reader.snapshot.segment_ids, self.store.segment_records,
                                               ret, disc, term, trunc)
            else:
                ks, slots = candidates(want)
                if len(ks) == 0:
                    break
                filled, _, _ = gather_windows(seg, reader.bytes, rec_bytes, flags, rew,
                                              self.n_step, self.gamma, self.frame_stack, ks, slots, filled, once,
                                              stacked, out, ids, reader.snapshot.segment_ids,
                                              self.store.segment_records, ret, disc, term, trunc)
            if filled == batch_size:
                break
        if filled < batch_size:
            raise EmptyStoreError(f"{self.store.path} has too few complete {self.n_step}-step windows to sample from")
        return self._assemble(out, ids, where, weights, (ret, disc, term, trunc))

    def valid_ids(self) -> np.ndarray:
        """Ids of every row that starts a complete transition under this sampler's view
        (``n_step``, ``frame_stack``), in id order. O(rows): for tests and tools."""
        valid_starts = _kernels().valid_starts
        self.store.sync_local()
        reader = self.store.reader
        snap = reader.snapshot
        flags, rew = self._window_consts()
        out = []
        for k in range(len(snap.segment_ids)):
            slots = np.arange(int(snap.committed[k]))
            ok = valid_starts(reader.segment_table(), reader.bytes, self.store.layout.record_bytes, flags, rew,
                              self.n_step, self.gamma, np.full(len(slots), k), slots)
            out.append(snap.segment_ids[k] * self.store.segment_records + slots[ok])
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def view(self, ids: np.ndarray) -> TransitionBatch:
        """The batch for given transition starts under this sampler's view (``KeyError`` if one
        is not visible or does not start a complete window)."""
        ids = np.asarray(ids, np.int64)
        k, slot = self.store.reader.locate(ids)
        try:
            return self._gather_windowed(len(ids), _once(k, slot))
        except EmptyStoreError:  # a start was skipped: it does not begin a complete window
            raise KeyError("some ids do not start a complete window (episode end or lookahead not written)") from None

    def _assemble(self, out: np.ndarray, ids: np.ndarray, where: list[tuple[Any, ...]],
                  weights: np.ndarray | None = None, window: tuple[np.ndarray, ...] | None = None) -> TransitionBatch:
        """Views of the gathered blocks as a batch (no copy)."""
        cur: dict[str, np.ndarray] = {}
        nxt: dict[str, np.ndarray] = {}
        for name, is_next, off, dtype, shape in where:
            arr = np.ndarray(shape, dtype, buffer=out, offset=off)
            if is_next == "shared":  # (B, k+1, ...) frames: obs and next_obs overlap by k-1
                cur[name], nxt[name] = arr[:, :-1], arr[:, 1:]
            else:
                (nxt if is_next else cur)[name] = arr
        if self._single_obs:
            obs, next_obs = cur.pop("obs"), nxt["obs"]
        else:
            obs_names = self.store.schema.obs_names
            obs = {n.removeprefix("obs/"): cur.pop(n) for n in obs_names}
            next_obs = {n.removeprefix("obs/"): nxt[n] for n in obs_names}
        if window is not None:  # n-step return, discount and the window's own end flags
            ret, disc, term, trunc = window
            return TransitionBatch(obs, cur.pop("action"), ret, next_obs, term, trunc, ids, cur, weights, disc)
        return TransitionBatch(obs, cur.pop("action"), cur.pop("reward"), next_obs, cur.pop("terminated"),
                               cur.pop("truncated"), ids, cur, weights)


class UniformSampler(TransitionSampler):
    """Uniform transitions from a store.

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
    n_step, gamma
        n-step returns (see ``_windows.py``): ``reward`` is the discounted return over up to
        ``n_step`` rows, ``next_obs`` the observation to bootstrap from and ``discount`` its
        factor. Starts whose lookahead is not written yet are not drawn.
    frame_stack
        Observations come back as stacks of the last ``frame_stack`` frames of the episode
        (clamped at its start), shape ``(B, frame_stack, *obs_shape)``, for obs and next_obs.
    mode
        ``"exact"`` (default): uniform over every committed row. ``"windowed"``: uniform over
        the rows of the open segments and of a resident set of sealed segments held in RAM
        (``cache_bytes``), rotated in the background; for stores larger than RAM (biased: see
        README "Beyond RAM"). The first draw waits until the resident set is full
        (``load_resident()`` does it earlier). Views (n-step, frame stacks) are exact in both
        modes.
    cache_bytes
        ``"windowed"``: RAM for the open segments plus the resident copies (at least one
        segment file). ``"exact"``: optional bound on the store pages this process keeps mapped
        (they are unmapped, not evicted, each time that many more are mapped), so the learner's
        resident memory stays bounded however large the store.
    prefetch_batches
        ``"exact"``: draw this many batches ahead and fetch their rows' pages in a background
        thread (``MADV_WILLNEED``) while the learner works; batches are the same uniform stream
        (drawn from a snapshot up to ``prefetch_batches`` batches old). 0 (default): read on
        demand through the page cache, best when the store fits in RAM.
    swap_segments_per_s
        ``"windowed"``: once the resident set is full, replace one random resident segment by
        one random other sealed segment this often (one sequential read of a segment file
        each, in a background thread); ``math.inf``: back to back; 0: a fixed subset.

    Call ``close()`` (or use ``with``) to stop the background threads and free the resident
    set's RAM before the store is closed; ``tier_stats()`` reports what the tiers hold.
    """

    def _sample_raw(self, batch_size: int) -> tuple[np.ndarray, np.ndarray, list[tuple[Any, ...]]]:
        sample_transitions = _kernels().sample_transitions
        self._prepare()
        reader = self.store.reader
        total = reader.snapshot.total_rows
        if total == 0:
            raise EmptyStoreError(f"{self.store.path} has no committed rows to sample from")
        table, where, big, nbytes = self._plan(batch_size)
        seg = self._draw_table()
        out = self._buffer(nbytes)
        ids = np.empty(batch_size, np.int64)
        lay = self.store.layout
        is_last_off = lay.column("is_last").offset - lay.records_offset
        filled = 0
        for _ in range(_MAX_ROUNDS):
            nrand = batch_size - filled + 8 + (batch_size - filled) // 4
            filled, _used, _ = sample_transitions(self._state, nrand, filled, seg, reader.bytes, lay.record_bytes, is_last_off,
                                                  self.store.segment_records, table, out, ids, big)
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
        if self._fetcher is not None:
            return self.sample(batch_size).ids
        ids = self._sample_raw(batch_size)[1]
        self._after_batch()
        return ids

    def sample(self, batch_size: int) -> TransitionBatch:
        """A batch of ``batch_size`` transitions drawn uniformly with replacement (over every
        committed row, or over the resident set in ``mode="windowed"``)."""
        if batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, got {batch_size}")
        if self._fetcher is not None:
            self._maybe_refresh()
            if self.store.reader.snapshot.total_rows == 0:
                raise EmptyStoreError(f"{self.store.path} has no committed rows to sample from")
            assert self._ahead is not None
            out, ids, where, window = self._ahead.gather(batch_size)
            batch = self._assemble(out, ids, where, None, window)
        elif self.windowed:
            self._prepare()
            if self.store.reader.snapshot.total_rows == 0:
                raise EmptyStoreError(f"{self.store.path} has no committed rows to sample from")
            batch = self._gather_windowed(batch_size, self._state, table=self._draw_table())
        else:
            out, ids, where = self._sample_raw(batch_size)
            batch = self._assemble(out, ids, where)
        self._after_batch()
        return batch


def _close_parts(parts: list[Any]) -> None:
    for p in parts:
        p.close()


class _once:
    """Candidates given once (explicit ids, prioritized draws): a second call has none."""

    def __init__(self, ks: np.ndarray, slots: np.ndarray) -> None:
        self.ks, self.slots = ks, slots

    def __call__(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        ks, slots = self.ks, self.slots
        self.ks = self.slots = np.zeros(0, np.int64)
        return ks, slots
