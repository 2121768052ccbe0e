"""Samplers choose row ids; they never copy payload (views do, see ``transitions.py``).

``UniformSampler`` draws transition starts uniformly over every sampleable transition of the
store's current snapshot: it draws uniformly over committed rows (a binary search over the
per-segment cumulative counts, so the cost does not grow with the number of segments) and redraws
the few rows that do not start a transition (episode ends, a lane's newest row). Rejection keeps
the draw exactly uniform over the valid set. Draws come from the sampler's seeded numpy
generator; locating, validating and gathering run in one compiled pass (``transition_kernels.py``).

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
from .gather import (
    Source,
    TransitionPlan,
    TransitionView,
    WindowPlan,
    assemble,
    check_batch_size,
    draw_window_starts,
    gather_starts,
    gather_transitions,
    gather_windowed,
    kernel_state,
    transition_plan,
    window_consts,
    window_plan,
)
from .gather import kernels as _kernels

if TYPE_CHECKING:
    from ..storage import ReplayStore
    from ..storage import TransitionBatch

_WINDOWED_MAPPED_BYTES = 64 << 20  # file pages a windowed sampler may keep mapped beyond its budget
Mode = Literal["exact", "windowed"]


class TransitionSampler:
    """What every transition sampler shares: the refresh policy, the gather plan, the storage
    tier options (``mode``, see the module docstring), and turning the gathered bytes into a
    ``TransitionBatch``. Subclasses choose the rows."""

    n_step: int
    """Rows a transition spans for its return: ``reward`` is the discounted return over up to this many."""
    gamma: float
    """The discount of the n-step return (and of ``discount``)."""
    frame_stack: int
    """Frames per observation (1: single frames)."""
    mode: Mode
    """The storage tier: ``"exact"`` or ``"windowed"`` (see the module docstring)."""
    cache_bytes: int | None
    """The RAM bound of the storage tier (see ``UniformSampler``), or ``None``."""
    prefetch_batches: int
    """``"exact"``: batches drawn ahead and fetched in the background (0: none)."""

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
        self._span = TransitionView(self.n_step, self.gamma, self.frame_stack)
        self.windowed = self._span.windowed
        """Whether a transition spans several rows (``n_step`` > 1 or ``frame_stack`` > 1): gathered by the
        window kernels (``mmreplay.sampling.window_kernels``). Not ``mode="windowed"``."""
        if self.windowed and store.schema["reward"].dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise SchemaError(f"n-step returns need a float32 or float64 `reward`, got {store.schema['reward'].dtype}")
        self.store = store
        """The store sampled."""
        self.rng = np.random.default_rng(seed)
        """The sampler's generator (seeded with ``seed``): it seeds the compiled kernels' own, so a seed
        fixes the batches; ``random_state()`` / ``set_random_state()`` save and restore both."""
        self.refresh_interval_s = refresh_interval_s
        """How often ``sample`` looks for rows other processes published (``None``: never by itself)."""
        self._plans: dict[Any, Any] = {}
        self._out: np.ndarray | None = None  # set by fill(): gather into the caller's buffer
        self._state = kernel_state(self.rng)  # the compiled kernels' generator, seeded from ``rng``
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
            if cache_bytes is None:  # a store that fits in RAM is mapped ahead: its first batches take no faults
                self.store.map_pages(background=True)
            if prefetch_batches:
                self._fetcher = PageFetcher(self.store, self.frame_stack - 1, self.n_step)
                self._ahead = DrawAhead(self.store, self._state, self._span, prefetch_batches, self._fetcher)
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

    def finish_swap(self) -> bool:
        """``mode="windowed"``: block until the segment load in flight (if any) is committed to
        the resident set; True if one was. Lets a test or tool rotate the set without timing."""
        if self._resident is None:
            raise ValueError("finish_swap() needs mode='windowed'")
        return self._resident.wait()

    def tier_stats(self) -> dict[str, Any]:
        """Where this sampler's rows come from: the resident set (windowed), the prefetch
        counters (exact), the store pages this process keeps mapped, and the checks
        (``damaged_rows`` left out, ``unchecked_segments``/``unchecked_rows`` not served yet)."""
        out: dict[str, Any] = (self._resident.stats() if self._resident is not None
                               else {"mode": "exact", "prefetch_batches": self.prefetch_batches})
        if self._fetcher is not None:
            out["prefetched_rows"] = self._fetcher.rows
            out["prefetch_calls"] = self._fetcher.calls
        if self._guard is not None:
            out["mapped_file_bytes"] = self._guard.mapped_file_bytes()
            out["unmap_drops"] = self._guard.drops
        out.update(self.store.check_counts())  # damaged rows left out, segments not checked yet
        out["windows_left_out"] = self.windows_left_out()
        return out

    def windows_left_out(self) -> int:
        """Starts left out because their window (under this sampler's ``n_step`` and
        ``frame_stack``) needs a masked row, or a stack would look into a segment of the session
        no longer in the store: never shortened or clamped instead. A stack stepping back to a
        masked row known to be an episode's final observation (the step before it ended the
        episode) is clamped there as at any episode start, and served (``window_kernels``). Only
        the rows within reach of such places are walked (cached per snapshot)."""
        from ..storage import PRED_GONE

        self.store.sync_local()
        reader = self.store.reader
        snap = reader.snapshot
        cached = self._plans.get("left_out")
        if cached is not None and cached[0] is snap:
            return cached[1]
        n, f = self.n_step, self.frame_stack
        back, fwd = n, max(f, 1)  # a masked row may block the n starts before it and the f-1 stacks after it
        picks: dict[int, list[np.ndarray]] = {}

        def take(k: int, lo: int, hi: int) -> None:
            lo, hi = max(lo, 0), min(hi, int(snap.committed[k]))
            if hi > lo:
                picks.setdefault(k, []).append(np.arange(lo, hi))

        for k, sid in enumerate(snap.segment_ids.tolist()):
            m = reader.segments.get(sid)
            L, usable = int(snap.lanes[k]), int(snap.usable[k])
            if snap.pred[k] == PRED_GONE and f > 1:
                take(k, 0, (f - 1) * L)
            if m is None or m.patch is None:
                continue
            for slot in m.patch.zero.tolist():
                take(k, slot - back * L, slot + fwd * L + 1)
                if slot < back * L and snap.pred[k] >= 0:
                    take(int(snap.pred[k]), usable - back * L + slot, usable)
                if slot >= usable - fwd * L and snap.succ[k] >= 0:
                    take(int(snap.succ[k]), 0, slot + fwd * L - usable + 1)
        total = 0
        flags, rew = self._window_consts()
        codes = _kernels().window_codes
        for k, parts in picks.items():
            slots = np.unique(np.concatenate(parts))
            c = codes(reader.segment_table(), reader.bytes, self.store.layout.record_bytes, flags, rew, n, self.gamma,
                      f, np.full(len(slots), k), slots)
            total += int((c == -1).sum())
        self._plans["left_out"] = (snap, total)
        return total

    def close(self) -> None:
        """Stop background threads and give back the resident set's RAM (idempotent). The
        sampler should not be used afterwards."""
        if self._finalizer is not None:
            self._finalizer()

    def random_state(self) -> dict[str, Any]:
        """The sampler's random state as plain JSON-able values (what a training checkpoint keeps):
        the numpy generator's state (``rng``), the compiled kernels' generator words (``kernel``) and
        the draws made so far (``steps``: a prioritized sampler's β annealing; 0 for the others).
        :meth:`set_random_state` puts it back, and the next batches are the same as after the capture."""
        return {"rng": self.rng.bit_generator.state, "kernel": [int(x) for x in self._state],
                "steps": int(getattr(self, "steps", 0))}

    def set_random_state(self, state: dict[str, Any]) -> None:
        """Put back a :meth:`random_state` (``kernel``: as many words as this sampler's generator)."""
        kernel = np.asarray(state["kernel"], dtype=np.uint64)
        if kernel.shape != self._state.shape:
            raise ValueError(f"`kernel` must hold {self._state.size} generator words, got {kernel.size}")
        self.rng.bit_generator.state = state["rng"]
        self._state[:] = kernel
        if hasattr(self, "steps"):
            self.steps = int(state["steps"])

    def __enter__(self) -> TransitionSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def batch_nbytes(self, batch_size: int) -> int:
        """Bytes of the gathered block behind a batch of ``batch_size`` (for preallocated, e.g.
        pinned, buffers: see ``fill``)."""
        return self._plan_for(batch_size).nbytes

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
        """A batch of ``batch_size`` transitions (``TransitionBatch``: numpy arrays and row ids);
        each sampler says how it draws them."""
        raise NotImplementedError

    def _maybe_refresh(self) -> None:
        if self.refresh_interval_s is not None:
            self.store.refresh_if_stale(self.refresh_interval_s)
        if self.store.reader.snapshot.total_rows == 0:
            self.store.wait_for_rows()  # a copied store being checked: its first rows, not an empty store

    def _plan(self, batch_size: int) -> TransitionPlan:
        """The one-step gather plan for ``batch_size`` (cached)."""
        plan = self._plans.get(batch_size)
        if plan is None:
            plan = self._plans[batch_size] = transition_plan(self.store, batch_size)
        return plan

    # -- windowed views (n-step returns, frame stacks) ----------------------------------------
    def _wplan(self, batch_size: int) -> WindowPlan:
        """The windowed gather plan for ``batch_size`` (cached; see ``gather.window_plan``)."""
        key = -batch_size
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = window_plan(self.store, self._span, batch_size)
        return plan

    def _plan_for(self, batch_size: int) -> TransitionPlan | WindowPlan:
        return self._wplan(batch_size) if self.windowed else self._plan(batch_size)

    def _window_consts(self) -> tuple[np.ndarray, np.ndarray]:
        consts = self._plans.get("consts")
        if consts is None:
            consts = self._plans["consts"] = window_consts(self.store)
        return consts

    def _gather_windowed(self, batch_size: int, source: np.ndarray | Source, weights: np.ndarray | None = None,
                         table: np.ndarray | None = None) -> TransitionBatch:
        """Fill a batch from ``source`` (a generator state or a ``gather.Source``), skipping
        starts whose window is incomplete; the views' values come back in ``reward``,
        ``discount`` and the flags."""
        plan = self._wplan(batch_size)
        out = self._buffer(plan.nbytes)
        seg = self.store.reader.segment_table() if table is None else table
        filled, ids, window = gather_windowed(self.store, self._span, plan, out, source, batch_size, seg)
        if filled < batch_size:
            raise EmptyStoreError(f"{self.store.path} has too few complete {self.n_step}-step windows to sample from")
        return assemble(plan, out, ids, weights, window)

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
                              self.n_step, self.gamma, self.frame_stack, np.full(len(slots), k), slots)
            out.append(snap.segment_ids[k] * self.store.segment_records + slots[ok])
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def view(self, ids: np.ndarray) -> TransitionBatch:
        """The batch for given transition starts under this sampler's view (``KeyError`` if one
        is not visible or does not start a complete window)."""
        starts = np.ascontiguousarray(ids, np.int64)
        if starts.ndim != 1:
            raise ValueError(f"`ids` must be 1-D, got shape {starts.shape}")
        plan = self._wplan(len(starts))
        filled, got, window = gather_starts(self.store, self._span, plan, out := self._buffer(plan.nbytes), starts,
                                            self.store.reader.segment_table())
        if filled < len(starts):  # a start was skipped: it does not begin a complete window
            raise KeyError("some ids do not start a complete window (episode end or lookahead not written)")
        return assemble(plan, out, got, None, window)


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
        n-step returns (see ``mmreplay.sampling.window_kernels``): ``reward`` is the discounted return over up to
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
        (``TransitionSampler.load_resident()`` does it earlier). Views (n-step, frame stacks) are exact in both
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

    Call ``TransitionSampler.close()`` (or use ``with``) to stop the background threads and free the resident
    set's RAM before the store is closed; ``TransitionSampler.tier_stats()`` reports what the tiers hold.

    Example
    -------
    >>> import tempfile
    >>> import numpy as np
    >>> import mmreplay
    >>> store = mmreplay.create_store(tempfile.mkdtemp() + "/replay", mmreplay.Schema.transition(obs_shape=(4,)),
    ...                               capacity=10_000)
    >>> with store.writer(lanes=1) as w:  # 100 steps of one lane at once: leading shape (T, lanes)
    ...     w.add_batch(obs=np.arange(400, dtype=np.float32).reshape(100, 1, 4), action=np.zeros((100, 1), np.int64),
    ...                 reward=np.ones((100, 1), np.float32), terminated=np.zeros((100, 1), bool),
    ...                 truncated=np.zeros((100, 1), bool))
    >>> batch = mmreplay.UniformSampler(store, seed=0).sample(32)  # numpy arrays
    >>> batch.obs.shape, batch.action.shape, batch.next_obs.shape, batch.weights
    ((32, 4), (32,), (32, 4), None)
    >>> bool((batch.next_obs == batch.obs + 4).all())  # next_obs: the lane's next row
    True
    >>> batch = mmreplay.UniformSampler(store, seed=0, n_step=3, gamma=0.9).sample(32)
    >>> bool(np.allclose(batch.reward, 1 + 0.9 + 0.81)), bool(np.allclose(batch.discount, 0.9 ** 3))
    (True, True)
    >>> store.close()
    """

    def _sample_raw(self, batch_size: int) -> tuple[TransitionPlan, np.ndarray, np.ndarray]:
        self._prepare()
        total = self.store.reader.snapshot.total_rows
        if total == 0:
            raise EmptyStoreError(f"{self.store.path} has no committed rows to sample from")
        plan = self._plan(batch_size)
        out = self._buffer(plan.nbytes)
        filled, ids = gather_transitions(self.store, plan, out, self._state, batch_size, self._draw_table())
        if filled == batch_size:
            return plan, out, ids
        if len(self.store.transition_ids()) == 0:
            raise EmptyStoreError(
                f"{self.store.path} has {total} rows but no sampleable transition yet "
                "(a transition needs the next row of its lane)"
            )
        raise RuntimeError("too few sampleable transitions among committed rows")  # pragma: no cover

    def sample_ids(self, batch_size: int) -> np.ndarray:
        """Global row ids of ``batch_size`` transition starts, drawn with replacement."""
        batch_size = check_batch_size(batch_size)
        if self._fetcher is not None:
            return self.sample(batch_size).ids
        ids = self._sample_raw(batch_size)[2]
        self._after_batch()
        return ids

    def draw_starts(self, batch_size: int) -> np.ndarray:
        """The global row ids ``sample(batch_size)`` would return next, drawn and checked the same
        way (the generator advanced as ``sample`` advances it), without gathering any payload: for
        gathers done elsewhere (``mmreplay.loader.device_tier``). Needs a windowed view
        (``frame_stack > 1`` or ``n_step > 1``), ``mode="exact"`` and no ``prefetch_batches``."""
        batch_size = check_batch_size(batch_size)
        if not self.windowed or self.mode != "exact" or self._fetcher is not None:
            raise ValueError("draw_starts() needs frame_stack > 1 or n_step > 1, mode='exact' and no "
                             f"prefetch_batches, got frame_stack={self.frame_stack}, n_step={self.n_step}, "
                             f"mode={self.mode!r}, prefetch_batches={self.prefetch_batches}")
        self._prepare()
        if self.store.reader.snapshot.total_rows == 0:
            raise EmptyStoreError(f"{self.store.path} has no committed rows to sample from")
        filled, ids = draw_window_starts(self.store, self._span, self._state, batch_size, self._draw_table())
        if filled < batch_size:
            raise EmptyStoreError(f"{self.store.path} has too few complete {self.n_step}-step windows to sample from")
        self._after_batch()
        return ids

    def sample(self, batch_size: int) -> TransitionBatch:
        """A batch of ``batch_size`` transitions drawn uniformly with replacement (over every
        committed row, or over the resident set in ``mode="windowed"``): the same transition can
        appear twice in a batch, and ``batch_size`` may exceed the number of transitions."""
        batch_size = check_batch_size(batch_size)
        if self._fetcher is not None:
            self._maybe_refresh()
            if self.store.reader.snapshot.total_rows == 0:
                raise EmptyStoreError(f"{self.store.path} has no committed rows to sample from")
            assert self._ahead is not None
            plan = self._plan_for(batch_size)
            out = self._buffer(plan.nbytes)
            ids, window = self._ahead.gather(batch_size, plan, out)
            batch = assemble(plan, out, ids, None, window)
        elif self.windowed:
            self._prepare()
            if self.store.reader.snapshot.total_rows == 0:
                raise EmptyStoreError(f"{self.store.path} has no committed rows to sample from")
            batch = self._gather_windowed(batch_size, self._state, table=self._draw_table())
        else:
            plan, out, ids = self._sample_raw(batch_size)
            batch = assemble(plan, out, ids)
        self._after_batch()
        return batch


def _close_parts(parts: list[Any]) -> None:
    for p in parts:
        p.close()
