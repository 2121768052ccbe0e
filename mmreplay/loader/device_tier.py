"""DeviceTier: a store's rows mirrored in device memory, batches gathered there.

For stores that fit on the card (uint8 frames: a million Atari frames is about 7 GB). Every row
the batches read (each schema field and the ``is_last`` flag) is copied to the device once, as
its writer commits it; after that a batch crosses PCIe as ``B`` row numbers, not ``B`` stacks of
frames:

* **Indices are drawn on the host**, by the wrapped ``UniformSampler`` itself
  (``UniformSampler.draw_starts``): the same generator, the same rounds, the same checks as its
  ``sample``, so with the same seed a tier returns the same transitions as the host path, batch
  for batch. Which starts are valid (episode ends, lookahead written, damaged rows, evicted
  segments) is decided there, never on the device.
* **Stacks, n-step windows and the gather run on the device** with torch ops over the mirror:
  frame stacks step back along the lane and are clamped at the episode's first row; n-step
  returns are summed in float64 in the host kernels' order (``sampling.window_kernels``) and
  handed out as float32, with ``discount = gamma^M`` (0 when terminated).
* **Incremental**: each ``sample`` (or ``refresh()``) first copies the rows committed since the
  last one, and sets each new row's stack link (the row its frame stack steps back to: the
  previous row of its lane, or itself at the episode's first row), so a stack is ``frame_stack
  - 1`` lookups. The mirror holds one block of ``segment_records`` rows per live segment; a segment
  that left the store gives its block to the next new one.
* **Refused** (one-line ``ValueError``): samplers other than ``UniformSampler`` (prioritized,
  sequences), ``mode="windowed"``, ``prefetch_batches``, one-step views (``frame_stack == 1`` and
  ``n_step == 1``: use ``BatchLoader``), and mirrors that would outgrow ``budget_bytes``.

The batch is a ``TensorBatch`` with the fields ``tensor_batch(sampler.sample(B), device)`` has;
its tensors are the tier's own (fresh each batch), valid until the caller drops them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..sampling import TransitionSampler, UniformSampler
from ..storage import SEG_BASE, SEG_COMMITTED, SEG_ID, SEG_LANES, SEG_PRED, SEG_SUCC, SEG_USABLE
from .tensors import TensorBatch

if TYPE_CHECKING:
    from ..storage import ReplayStore

_FLAGS = ("reward", "terminated", "truncated")  # computed over the window, not gathered at the start


class DeviceTier:
    """A ``UniformSampler``'s store mirrored on ``device``; ``sample(B)`` draws on the host and
    gathers on the device.

    Parameters
    ----------
    sampler
        The host sampler whose configuration (``frame_stack``, ``n_step``, ``gamma``) and random
        stream the tier uses; a ``UniformSampler`` in ``mode="exact"`` without
        ``prefetch_batches``. The tier draws from it: do not draw from it elsewhere meanwhile.
    device
        Where the mirror lives and batches are built (``"cuda"``, ``torch.device("cpu")``).
    budget_bytes
        Device memory the mirror may take; ``None``: on CUDA 90% of the memory free when the tier
        is made, elsewhere no bound. Growing past it raises ``ValueError``. With a budget the
        first ``refresh`` allocates blocks for the store's whole ``capacity`` (as many as the
        budget allows), so the mirror rarely grows: growing copies it, old and new held at once.
    float_dtype
        If set, float and uint8 fields (frames) are cast to it on the device, as ``tensor_batch``.
    """

    def __init__(self, sampler: TransitionSampler, device: Any = "cuda", *, budget_bytes: int | None = None,
                 float_dtype: Any = None) -> None:
        import torch

        if type(sampler) is not UniformSampler:
            raise ValueError(f"DeviceTier needs a UniformSampler, got {type(sampler).__name__} "
                             "(prioritized and sequence sampling stay on the host)")
        if sampler.mode != "exact":
            raise ValueError(f"DeviceTier needs a sampler with mode='exact', got mode={sampler.mode!r}")
        if sampler.prefetch_batches:
            raise ValueError(f"DeviceTier needs a sampler without prefetch_batches, got {sampler.prefetch_batches}")
        if not sampler.windowed:
            raise ValueError("DeviceTier needs frame_stack > 1 or n_step > 1, got frame_stack=1, n_step=1 "
                             "(one-step batches: use BatchLoader)")
        self.sampler = sampler
        self.store: ReplayStore = sampler.store
        self.device = torch.device(device)
        self.float_dtype = float_dtype
        if budget_bytes is None and self.device.type == "cuda":
            budget_bytes = int(torch.cuda.mem_get_info(self.device)[0] * 0.9)
        if budget_bytes is not None and budget_bytes < 1:
            raise ValueError(f"`budget_bytes` must be a positive number of bytes, got {budget_bytes!r}")
        self.budget_bytes = budget_bytes
        self._torch = torch
        schema, lay = self.store.schema, self.store.layout
        self._R = int(self.store.segment_records)
        # (name, offset in a record, row bytes, dtype, shape) of every mirrored column
        cols = [(f.name, lay.column(f.name).offset - lay.records_offset, f.row_bytes, f.dtype, f.shape)
                for f in schema.fields]
        cols.append(("is_last", lay.column("is_last").offset - lay.records_offset, 1, np.dtype(np.uint8), ()))
        self._cols = cols
        self.row_bytes = sum(c[2] for c in cols) + 8
        """Device bytes one mirrored row takes (its fields, ``is_last`` and its stack link)."""
        self._obs_names = tuple(schema.obs_names)
        self._cols_t: dict[str, Any] = {}
        self._blocks = 0  # blocks allocated (segment_records rows each)
        self._block_of: dict[int, int] = {}  # segment id -> block
        self._count = np.zeros(0, np.int64)  # rows mirrored, per block
        self._free: list[int] = []
        self._lut = np.full(0, -1, np.int64)  # segment id -> block, for row ids
        self._snap: Any = None
        self._meta: Any = None  # (lanes, usable, succ block, pred block) per block, on the device
        self._back: Any = None  # per mirrored row: the row its frame stack steps back to
        self.rows_copied = 0
        """Rows copied to the device so far (each once)."""
        live = len(self.store.reader.segment_table())
        if budget_bytes is not None and live * self._R * self.row_bytes > budget_bytes:
            raise ValueError(f"the store's {live} live segments need {live * self._R * self.row_bytes} bytes on "
                             f"{self.device}, over `budget_bytes`={budget_bytes}: the device tier is for stores "
                             "that fit")

    # -- the mirror --------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Device bytes the mirror holds (allocated blocks, mirrored or not)."""
        return self._blocks * self._R * self.row_bytes

    def _grow(self, need: int) -> None:
        torch = self._torch
        block_bytes = self._R * self.row_bytes
        if self.budget_bytes is not None and need * block_bytes > self.budget_bytes:
            raise ValueError(f"the store's live segments need {need * block_bytes} bytes on {self.device}, over "
                             f"`budget_bytes`={self.budget_bytes}: the device tier is for stores that fit")
        n = max(need, 2 * self._blocks)
        if self.budget_bytes is not None:
            if self._blocks == 0:  # the store's capacity at once, if it fits: growing holds two copies
                n = max(n, -(-self.store.capacity // self._R) + 4)  # + open and not yet evicted ones
            n = max(need, min(n, self.budget_bytes // block_bytes))
        for name, _, _, dtype, shape in self._cols:
            t = torch.empty((n * self._R, *shape), dtype=_torch_dtype(torch, dtype), device=self.device)
            old = self._cols_t.get(name)
            if old is not None:
                t[: len(old)] = old
            self._cols_t[name] = t
        back = torch.empty(n * self._R, dtype=torch.int64, device=self.device)
        if self._blocks:
            back[: self._blocks * self._R] = self._back
        self._back = back
        self._count = np.concatenate([self._count, np.zeros(n - self._blocks, np.int64)])
        self._free.extend(range(n - 1, self._blocks - 1, -1))  # popped lowest first
        self._blocks = n

    def _restructure(self, seg: np.ndarray) -> None:
        """A new snapshot: blocks for new segments, freed ones for segments gone, per-block links."""
        sids = seg[:, SEG_ID]
        live = set(sids.tolist())
        for sid in [s for s in self._block_of if s not in live]:
            b = self._block_of.pop(sid)
            self._count[b] = 0
            self._free.append(b)
        new = [int(s) for s in sids.tolist() if s not in self._block_of]
        if len(new) > len(self._free):
            self._grow(self._blocks + len(new) - len(self._free))
        self._free.sort(reverse=True)
        for sid in new:
            self._block_of[sid] = self._free.pop()
        top = int(sids.max()) + 1 if len(sids) else 0
        self._lut = np.full(max(top, len(self._lut)), -1, np.int64)
        for sid, b in self._block_of.items():
            self._lut[sid] = b
        blocks = self._lut[sids]
        lanes = np.ones(self._blocks, np.int64)
        usable = np.full(self._blocks, self._R, np.int64)
        succ = np.full(self._blocks, -1, np.int64)
        pred = np.full(self._blocks, -1, np.int64)
        lanes[blocks] = seg[:, SEG_LANES]
        usable[blocks] = seg[:, SEG_USABLE]
        s, p = seg[:, SEG_SUCC], seg[:, SEG_PRED]
        succ[blocks] = np.where(s >= 0, blocks[np.maximum(s, 0)], s)
        pred[blocks] = np.where(p >= 0, blocks[np.maximum(p, 0)], p)
        self._meta = tuple(self._torch.from_numpy(a).to(self.device) for a in (lanes, usable, succ, pred))

    def refresh(self) -> int:
        """Copy to the device the rows committed since the last call (for the sampler's current
        snapshot; ``sample`` calls it). Returns the rows copied."""
        reader = self.store.reader
        seg = reader.segment_table()
        if reader.snapshot is not self._snap:
            if self._snap is None or not np.array_equal(seg[:, SEG_ID], self._seg_ids) \
                    or not np.array_equal(seg[:, [SEG_SUCC, SEG_PRED, SEG_USABLE]], self._links):
                self._restructure(seg)
                self._seg_ids = seg[:, SEG_ID].copy()
                self._links = seg[:, [SEG_SUCC, SEG_PRED, SEG_USABLE]].copy()
            self._snap = reader.snapshot
        blocks = self._lut[seg[:, SEG_ID]]
        committed = seg[:, SEG_COMMITTED]
        copied = 0
        appended: list[tuple[int, int]] = []
        region, rec = reader.bytes, self.store.layout.record_bytes
        for k in np.flatnonzero(committed > self._count[blocks]).tolist():
            b, lo, hi = int(blocks[k]), int(self._count[blocks[k]]), int(committed[k])
            base = int(seg[k, SEG_BASE])
            recs = region[base + lo * rec: base + hi * rec].reshape(hi - lo, rec)
            for name, off, nb, dtype, shape in self._cols:
                a = np.ascontiguousarray(recs[:, off: off + nb]).view(dtype).reshape(hi - lo, *shape)
                self._cols_t[name][b * self._R + lo: b * self._R + hi].copy_(self._torch.from_numpy(a))
            self._count[b] = hi
            copied += hi - lo
            appended.append((b * self._R + lo, b * self._R + hi))
        for lo, hi in appended:  # after every copy: a row's link reads its predecessor's flag
            m = self._torch.arange(lo, hi, device=self.device)
            p = self._prev(m)
            step = (p >= 0) & (self._cols_t["is_last"][p.clamp(min=0)] == 0)
            self._back[lo:hi] = self._torch.where(step, p, m)
        self.rows_copied += copied
        return copied

    def close(self) -> None:
        """Free the mirror's device memory (idempotent); the tier can refill it with ``refresh``
        (every row copied again). The sampler is the caller's: it is not closed."""
        self._cols_t, self._back, self._meta, self._snap = {}, None, None, None
        self._blocks, self._block_of, self._free = 0, {}, []
        self._count, self._lut = np.zeros(0, np.int64), np.full(0, -1, np.int64)

    def __enter__(self) -> DeviceTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- lanes on the device ------------------------------------------------------------------------
    def _prev(self, m: Any) -> Any:
        """The previous row of each row's lane; -1 at the start of its session (or gone)."""
        torch = self._torch
        lanes, usable, _, pred = self._meta
        b, s = m // self._R, m % self._R
        ps = s - lanes[b]
        pb = pred[b]
        other = pb.clamp(min=0) * self._R + usable[pb.clamp(min=0)] + ps
        return torch.where(ps >= 0, m - lanes[b], torch.where(pb >= 0, other, torch.full_like(m, -1)))

    def _next(self, m: Any) -> Any:
        """The next row of each row's lane (valid where the host found the window complete)."""
        lanes, usable, succ, _ = self._meta
        b, s = m // self._R, m % self._R
        ns = s + lanes[b]
        return self._torch.where(ns < usable[b], m + lanes[b], succ[b].clamp(min=0) * self._R + ns - usable[b])

    def _stack(self, m: Any, frames: int) -> Any:
        """(B, frames) rows of the observations ending at ``m``, clamped at the episode start:
        each row's stack link (set when it was mirrored) is the row a stack steps back to, the
        previous row of its lane within the episode or itself at the episode's first row. A link
        into a segment that left the store is never followed: the host rejects such stacks. Nor is
        one to a masked row (its ``is_last`` byte is not 0): the host serves a stack stepping back
        to one only where it was the previous episode's final observation, clamped there
        (``sampling.window_kernels.stack_rows``), which is what the link gives."""
        out = [m]
        for _ in range(frames - 1):
            out.append(self._back[out[-1]])
        return self._torch.stack(out[::-1], 1)

    def _window(self, m: Any) -> tuple[Any, Any, Any, Any, Any]:
        """The n-step window from ``m``: (bootstrap row, return, discount, terminated, truncated)."""
        torch = self._torch
        n, gamma = self.sampler.n_step, self.sampler.gamma
        c = self._cols_t
        top = len(c["is_last"]) - 1
        g = torch.zeros(len(m), dtype=torch.float64, device=self.device)
        disc = torch.ones_like(g)
        active = torch.ones(len(m), dtype=torch.bool, device=self.device)
        term = torch.zeros_like(active)
        trunc = torch.zeros_like(active)
        cur = boot = m
        for i in range(n):
            g = torch.where(active, g + disc * c["reward"][cur].to(torch.float64), g)
            nx = self._next(cur).clamp(0, top)
            te = active & c["terminated"][cur]
            last = c["is_last"][nx] != 0
            term = term | te
            boot = torch.where(active, nx, boot)
            disc = torch.where(te, torch.zeros_like(disc), torch.where(active, disc * gamma, disc))
            trunc = trunc | (active & ~te & last & c["truncated"][cur])
            active = active & ~te & ~last
            if i == n - 1:
                break
            cur = torch.where(active, nx, cur)
        return boot, g.to(torch.float32), disc.to(torch.float32), term, trunc

    # -- batches ------------------------------------------------------------------------------------
    def sample(self, batch_size: int) -> TensorBatch:
        """``batch_size`` transitions: starts drawn on the host (the sampler's stream), stacks,
        n-step windows and the gather on the device. Same fields and values as
        ``tensor_batch(sampler.sample(batch_size), device)`` would give with the same seed."""
        torch = self._torch
        ids = self.sampler.draw_starts(batch_size)
        self.refresh()
        R = self.store.segment_records
        rows = self._lut[ids // R] * self._R + ids % R
        if self.device.type == "cuda":  # a pinned block from torch's caching host allocator, which
            # reuses it only after this copy finished: the draw of the next batch overlaps this one
            staged = torch.empty(len(rows), dtype=torch.int64, pin_memory=True)
            staged.numpy()[:] = rows
            m = staged.to(self.device, non_blocking=True)
        else:
            m = torch.from_numpy(rows).to(self.device)
        boot, ret, disc, term, trunc = self._window(m)
        frames = self.sampler.frame_stack
        c = self._cols_t
        if frames > 1:
            cur_rows, next_rows = self._stack(m, frames), self._stack(boot, frames)
        else:
            cur_rows, next_rows = m, boot

        def conv(t: Any) -> Any:
            if self.float_dtype is not None and (t.is_floating_point() or t.dtype == torch.uint8):
                return t.to(self.float_dtype)
            return t

        def obs(rows_: Any) -> Any:  # index_select of flat rows: a row copy per frame (plain indexing is slower)
            got = {n.removeprefix("obs/"): conv(c[n].index_select(0, rows_.reshape(-1))
                                                .view(*rows_.shape, *c[n].shape[1:])) for n in self._obs_names}
            return got["obs"] if self._obs_names == ("obs",) else got

        extra = {name: conv(c[name][m]) for name, *_ in self._cols
                 if name not in (*_FLAGS, "action", "is_last", *self._obs_names)}
        return TensorBatch(obs(cur_rows), conv(c["action"][m]), conv(ret), obs(next_rows), term, trunc, ids, None,
                           conv(disc), extra)


def _torch_dtype(torch: Any, dtype: np.dtype) -> Any:
    return torch.from_numpy(np.zeros(0, dtype)).dtype
