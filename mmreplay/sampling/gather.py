"""The gather loop every transition sampler shares, and the plans it follows.

Below ``uniform``, ``prioritized``, ``sequence`` and ``_prefetch`` (it imports none of them):

* ``kernels()``: the compiled kernels, imported on first use (numba is not loaded by ``import
  mmreplay``); ``kernel_state(rng)``: a sampler's seeded xoshiro256** state for them.
* Plans: where each field of a batch is read from (offset in a record, row bytes, start or next
  row) and where it lands in the one output buffer, per batch size. ``TransitionPlan`` for
  one-step transitions, ``WindowPlan`` for n-step returns and frame stacks; each field's block
  is a ``FieldBlock`` whose ``role`` says which row it holds (``Role``).
* ``gather_transitions`` / ``gather_windowed``: fill a batch from a source of candidate starts,
  redrawing the ones that start no transition (no complete window) for up to ``MAX_ROUNDS``
  rounds. The source is either a generator state (the kernel draws uniform rows itself) or an
  object with ``take(remaining)`` / ``consumed(used)`` (``Once``: given rows; ``DrawAhead``: a
  stream drawn ahead). They return how many rows they filled; callers raise their own error.
  ``draw_window_starts``: the starts ``gather_windowed`` would gather from a generator state, and
  nothing else (for gathers done elsewhere, e.g. on a device).
* ``assemble``: views of the gathered blocks as a ``TransitionBatch`` (no copy).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..storage import TransitionBatch

if TYPE_CHECKING:
    from ..storage import ReplayStore

MAX_ROUNDS = 64
"""Rounds of candidates a batch may take before the store counts as having too few."""
_KERNELS: Any = None


def kernels() -> Any:
    """The compiled kernels, imported once on first use (a function-level import on every batch
    costs about a microsecond)."""
    global _KERNELS
    if _KERNELS is None:
        from types import SimpleNamespace

        from . import io_kernels as io
        from . import transition_kernels as k
        from . import _sumtree as t
        from . import window_kernels as w

        _KERNELS = SimpleNamespace(
            sample_transitions=k.sample_transitions, gather_at=k.gather_at, draw_rows=k.draw_rows,
            draw_and_gather=w.draw_and_gather, gather_windows=w.gather_windows, valid_starts=w.valid_starts,
            window_codes=w.window_codes, draw_starts=w.draw_starts,
            locate_and_gather=w.locate_and_gather, gather_sequences=w.gather_sequences, sample_rows=t.sample_rows,
            update_rows=t.update_rows,
            SumTree=t.SumTree, advise_windows=io.advise_windows, pread_at=io.pread_at,
        )
    return _KERNELS


def check_batch_size(batch_size: object) -> int:
    """``batch_size`` as an int >= 1, or a one-line ``TypeError`` / ``ValueError`` naming it."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
        raise TypeError(f"`batch_size` must be an integer, got {batch_size!r} ({type(batch_size).__name__})")
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be >= 1, got {batch_size}")
    return int(batch_size)


def kernel_state(rng: np.random.Generator) -> np.ndarray:
    """The compiled kernels' own generator state (xoshiro256**, 4 words advanced in place),
    seeded from a sampler's numpy generator: same seed, same draws."""
    return rng.integers(1, 2**63, size=4, dtype=np.int64).view(np.uint64)


@dataclass(frozen=True, slots=True)
class TransitionView:
    """What a transition spans beyond its start row."""

    n_step: int
    """Rows of the n-step return (1: one-step transitions)."""
    gamma: float
    """Discount of the n-step return."""
    frame_stack: int
    """Observations come back as stacks of this many frames (1: single frames)."""

    @property
    def windowed(self) -> bool:
        """Gathered by the window kernels (n-step returns or frame stacks)."""
        return self.n_step > 1 or self.frame_stack > 1


class Role(enum.Enum):
    """Which row a field's block holds."""

    CURRENT = "current"
    """The start row's value (``obs``, ``action``, extra fields...)."""
    NEXT = "next"
    """The next row's (or the n-step window's bootstrap row's) value: ``next_obs``."""
    SHARED = "shared"
    """``(B, frame_stack + 1, ...)`` frames: ``obs`` and ``next_obs`` are overlapping views."""


@dataclass(frozen=True, slots=True)
class FieldBlock:
    """Where one field of a batch lands in the output buffer."""

    name: str
    """Schema field name."""
    role: Role
    """Which row it holds."""
    offset: int
    """Byte offset of the block in the output buffer (8-aligned)."""
    dtype: np.dtype
    """The field's dtype."""
    shape: tuple[int, ...]
    """The block's shape: ``(B, *field shape)``, or ``(B, frames, *field shape)`` for stacks."""


@dataclass(frozen=True, slots=True)
class TransitionPlan:
    """How one-step transitions of a batch size are gathered (``transition_kernels``)."""

    table: np.ndarray
    """(F, 4) int64 kernel table: offset in the record, row bytes, output offset, next row (0/1)."""
    blocks: tuple[FieldBlock, ...]
    """Every gathered block (the schema's fields, then the next observations)."""
    big: bool
    """Some field is frame-sized (>= 128 bytes a row): the kernel prefetches before copying."""
    nbytes: int
    """Bytes of the output buffer."""
    obs_names: tuple[str, ...]
    """The schema's observation fields (``("obs",)`` or ``obs/<key>`` names)."""
    is_last_offset: int
    """Offset of the ``is_last`` flag in a record."""


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """How n-step / frame-stacked transitions of a batch size are gathered (``window_kernels``)."""

    once: np.ndarray
    """(F, 4) int64 kernel table of fields copied once: record offset, row bytes, output offset,
    ``ROW_START`` / ``ROW_NEXT``."""
    stacked: np.ndarray
    """The same for observation fields stacked ``frame_stack`` times (``ROW_SHARED``: the
    start's stack and the next frame, one block)."""
    blocks: tuple[FieldBlock, ...]
    """Every gathered block (reward and flags are computed: not among them)."""
    nbytes: int
    """Bytes of the output buffer."""
    obs_names: tuple[str, ...]
    """The schema's observation fields."""
    flags: np.ndarray
    """Record offsets of ``is_last``, ``terminated``, ``truncated``."""
    reward: np.ndarray
    """Record offset and item size of ``reward``."""


def _aligned(n: int) -> int:
    return -(-n // 8) * 8  # 8-aligned blocks: the kernels copy words


def transition_plan(store: ReplayStore, batch_size: int) -> TransitionPlan:
    """The one-step plan of ``store`` for batches of ``batch_size``."""
    lay, schema = store.layout, store.schema
    items = [(f.name, Role.CURRENT) for f in schema.fields] + [(n, Role.NEXT) for n in schema.obs_names]
    rows, blocks, off = [], [], 0
    for name, role in items:
        f = schema[name]
        rows.append((lay.column(name).offset - lay.records_offset, f.row_bytes, off, int(role is Role.NEXT)))
        blocks.append(FieldBlock(name, role, off, f.dtype, (batch_size, *f.shape)))
        off += _aligned(f.row_bytes * batch_size)
    table = np.array(rows, np.int64).reshape(-1, 4)
    return TransitionPlan(table, tuple(blocks), bool((table[:, 1] >= 128).any()), off, schema.obs_names,
                          lay.column("is_last").offset - lay.records_offset)


def window_consts(store: ReplayStore) -> tuple[np.ndarray, np.ndarray]:
    """``(flags, reward)`` record offsets the window kernels read (see ``WindowPlan``)."""
    lay = store.layout
    r = lay.records_offset
    flags = np.array([lay.column(n).offset - r for n in ("is_last", "terminated", "truncated")], np.int64)
    rew = np.array([lay.column("reward").offset - r, store.schema["reward"].dtype.itemsize], np.int64)
    return flags, rew


def window_plan(store: ReplayStore, view: TransitionView, batch_size: int) -> WindowPlan:
    """The windowed plan of ``store`` for ``view`` and batches of ``batch_size``.

    With one-step transitions the next stack is the current one shifted by a frame (within an
    episode, clamping included), so each observation field is gathered once as ``(B,
    frame_stack + 1, ...)`` and ``obs``/``next_obs`` are overlapping views of it: 5 frames
    copied per transition instead of 8 for Atari stacks of 4.
    """
    from .window_kernels import ROW_NEXT, ROW_SHARED, ROW_START

    lay, schema = store.layout, store.schema
    obs = set(schema.obs_names)
    fs = view.frame_stack
    shared = fs > 1 and view.n_step == 1
    once, stacked, blocks, off = [], [], [], 0
    items = [(f.name, False) for f in schema.fields if f.name not in ("reward", "terminated", "truncated")]
    items += [(n, True) for n in schema.obs_names]
    for name, is_next in items:
        f = schema[name]
        rec_off = lay.column(name).offset - lay.records_offset
        if name in obs and fs > 1:
            if shared and is_next:
                continue  # a view of the shared block
            kind = ROW_SHARED if shared else (ROW_NEXT if is_next else ROW_START)
            frames = fs + 1 if shared else fs
            stacked.append((rec_off, f.row_bytes, off, kind))
            role = Role.SHARED if shared else (Role.NEXT if is_next else Role.CURRENT)
            blocks.append(FieldBlock(name, role, off, f.dtype, (batch_size, frames, *f.shape)))
            off += _aligned(f.row_bytes * frames * batch_size)
        else:
            once.append((rec_off, f.row_bytes, off, ROW_NEXT if is_next else ROW_START))
            blocks.append(FieldBlock(name, Role.NEXT if is_next else Role.CURRENT, off, f.dtype,
                                     (batch_size, *f.shape)))
            off += _aligned(f.row_bytes * batch_size)
    flags, rew = window_consts(store)
    return WindowPlan(np.array(once, np.int64).reshape(-1, 4), np.array(stacked, np.int64).reshape(-1, 4),
                      tuple(blocks), off, schema.obs_names, flags, rew)


class Source(Protocol):
    """Candidate starts for a gather loop: ``take(remaining)`` returns ``(ks, slots)`` (snapshot
    segment indices and rows, in order) or ``None`` when it has no more; ``consumed(used)``
    then says how many of them the loop used (the rest are offered again, or dropped)."""

    def take(self, remaining: int) -> tuple[np.ndarray, np.ndarray] | None: ...

    def consumed(self, used: int) -> None: ...


class Once:
    """Candidates given once (explicit ids, prioritized draws): a second ``take`` has none."""

    def __init__(self, ks: np.ndarray, slots: np.ndarray) -> None:
        self.ks: np.ndarray | None = ks
        self.slots = slots

    def take(self, remaining: int) -> tuple[np.ndarray, np.ndarray] | None:
        ks, self.ks = self.ks, None
        return None if ks is None else (ks, self.slots)

    def consumed(self, used: int) -> None:
        pass


def gather_transitions(store: ReplayStore, plan: TransitionPlan, out: np.ndarray, source: np.ndarray | Source,
                       batch_size: int, seg: np.ndarray) -> tuple[int, np.ndarray]:
    """Fill ``out`` with one-step transitions from ``source`` (a generator state: uniform rows
    drawn by the kernel over segment table ``seg``; or a ``Source``), redrawing rows that start
    no transition. Returns ``(filled, ids)``; the batch is complete when ``filled ==
    batch_size``."""
    k_ = kernels()
    reader = store.reader
    rec_bytes, seg_records = store.layout.record_bytes, store.segment_records
    ids = np.empty(batch_size, np.int64)
    filled = 0
    if isinstance(source, np.ndarray):
        sample_transitions = k_.sample_transitions
        for _ in range(MAX_ROUNDS):
            nrand = batch_size - filled + 8 + (batch_size - filled) // 4
            filled, _, _ = sample_transitions(source, nrand, filled, seg, reader.bytes, rec_bytes,
                                              plan.is_last_offset, seg_records, plan.table, out, ids, plan.big)
            if filled == batch_size:
                break
        return filled, ids
    picked_k: list[np.ndarray] = []
    picked_s: list[np.ndarray] = []
    for _ in range(MAX_ROUNDS):
        got = source.take(batch_size - filled)
        if got is None:
            break
        ks, slots = got
        valid, _, _ = store.reader.transition_starts(ks, slots)
        good = np.flatnonzero(valid)[: batch_size - filled]
        picked_k.append(ks[good])
        picked_s.append(slots[good])
        filled += len(good)
        source.consumed(int(good[-1]) + 1 if filled == batch_size else len(ks))
        if filled == batch_size:
            break
    if filled == batch_size:
        ks, slots = np.concatenate(picked_k), np.concatenate(picked_s)
        ids[:] = reader.snapshot.segment_ids[ks] * seg_records + slots
        k_.gather_at(seg, reader.bytes, rec_bytes, ks, slots, plan.table, out, plan.big)
    return filled, ids


def gather_windowed(store: ReplayStore, view: TransitionView, plan: WindowPlan, out: np.ndarray,
                    source: np.ndarray | Source, batch_size: int,
                    seg: np.ndarray) -> tuple[int, np.ndarray, tuple[np.ndarray, ...]]:
    """``gather_transitions`` for n-step / frame-stacked views, skipping starts whose window is
    incomplete. Returns ``(filled, ids, window)``, ``window`` being the views' computed
    ``(reward, discount, terminated, truncated)``."""
    k_ = kernels()
    reader = store.reader
    rec_bytes, seg_records = store.layout.record_bytes, store.segment_records
    n_step, gamma, frames = view.n_step, view.gamma, view.frame_stack
    flags, rew, once, stacked = plan.flags, plan.reward, plan.once, plan.stacked
    ids = np.empty(batch_size, np.int64)
    window = (np.empty(batch_size, np.float32), np.empty(batch_size, np.float32), np.empty(batch_size, np.bool_),
              np.empty(batch_size, np.bool_))
    filled = 0
    for _ in range(MAX_ROUNDS):
        if isinstance(source, np.ndarray):  # a generator state: the kernel draws rows itself
            want = batch_size - filled + 4 + (batch_size - filled) // 16  # few starts are rejected
            filled, _, _ = k_.draw_and_gather(source, want, seg, reader.bytes, rec_bytes, flags, rew, n_step, gamma,
                                              frames, filled, once, stacked, out, ids, reader.snapshot.segment_ids,
                                              seg_records, *window)
        else:
            got = source.take(batch_size - filled)
            if got is None:
                break
            filled, used, _ = k_.gather_windows(seg, reader.bytes, rec_bytes, flags, rew, n_step, gamma, frames,
                                                got[0], got[1], filled, once, stacked, out, ids,
                                                reader.snapshot.segment_ids, seg_records, *window)
            source.consumed(used)
        if filled == batch_size:
            break
    return filled, ids, window


def draw_window_starts(store: ReplayStore, view: TransitionView, state: np.ndarray, batch_size: int,
                       seg: np.ndarray) -> tuple[int, np.ndarray]:
    """The starts ``gather_windowed`` would gather from generator state ``state`` (drawn and
    checked in the same rounds, the state advanced the same way), without gathering anything:
    ``(filled, ids)``, the batch complete when ``filled == batch_size``."""
    reader = store.reader
    flags, rew = window_consts(store)
    ids = np.empty(batch_size, np.int64)
    filled = 0
    draw = kernels().draw_starts
    for _ in range(MAX_ROUNDS):
        want = batch_size - filled + 4 + (batch_size - filled) // 16  # as gather_windowed draws
        filled = draw(state, want, seg, reader.bytes, store.layout.record_bytes, flags, rew, view.n_step, view.gamma,
                      view.frame_stack, filled, ids, reader.snapshot.segment_ids, store.segment_records)
        if filled == batch_size:
            break
    return filled, ids


def gather_starts(store: ReplayStore, view: TransitionView, plan: WindowPlan, out: np.ndarray, starts: np.ndarray,
                  seg: np.ndarray) -> tuple[int, np.ndarray, tuple[np.ndarray, ...]]:
    """``gather_windowed`` for explicit transition starts (global row ids, int64, contiguous), located
    and gathered in one compiled call: ``(filled, ids, window)``, ``filled < len(starts)`` when a start
    begins no complete window; ``KeyError`` when one is not visible in the snapshot."""
    reader = store.reader
    b = len(starts)
    ids = np.empty(b, np.int64)
    window = (np.empty(b, np.float32), np.empty(b, np.float32), np.empty(b, np.bool_), np.empty(b, np.bool_))
    filled, _, _ = kernels().locate_and_gather(starts, seg, reader.bytes, store.layout.record_bytes, plan.flags,
                                               plan.reward, view.n_step, view.gamma, view.frame_stack, plan.once,
                                               plan.stacked, out, ids, reader.snapshot.segment_ids,
                                               store.segment_records, *window)
    if filled < 0:
        raise KeyError("some row ids are not visible in this snapshot (evicted, unpublished or invalid)")
    return filled, ids, window


def assemble(plan: TransitionPlan | WindowPlan, out: np.ndarray, ids: np.ndarray, weights: np.ndarray | None = None,
             window: tuple[np.ndarray, ...] | None = None) -> TransitionBatch:
    """Views of the gathered blocks as a batch (no copy); ``window``: the computed n-step
    ``(reward, discount, terminated, truncated)``."""
    cur: dict[str, np.ndarray] = {}
    nxt: dict[str, np.ndarray] = {}
    for b in plan.blocks:
        arr = np.ndarray(b.shape, b.dtype, buffer=out, offset=b.offset)
        if b.role is Role.CURRENT:
            cur[b.name] = arr
        elif b.role is Role.NEXT:
            nxt[b.name] = arr
        else:  # (B, k+1, ...) frames: obs and next_obs overlap by k-1
            cur[b.name], nxt[b.name] = arr[:, :-1], arr[:, 1:]
    obs_names = plan.obs_names
    if obs_names == ("obs",):
        obs, next_obs = cur.pop("obs"), nxt["obs"]
    else:
        obs = {n.removeprefix("obs/"): cur.pop(n) for n in obs_names}
        next_obs = {n.removeprefix("obs/"): nxt[n] for n in obs_names}
    if window is not None:  # n-step return, discount and the window's own end flags
        ret, disc, term, trunc = window
        return TransitionBatch(obs, cur.pop("action"), ret, next_obs, term, trunc, ids, cur, weights, disc)
    return TransitionBatch(obs, cur.pop("action"), cur.pop("reward"), next_obs, cur.pop("terminated"),
                           cur.pop("truncated"), ids, cur, weights)
