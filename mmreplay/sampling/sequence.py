"""SequenceSampler: fixed-length windows of a lane's consecutive rows, for recurrent agents and
sequence models.

A window starts at a row that is a step (not an episode's final observation) and takes the
next ``burn_in + length`` rows of the same lane, following the writer session across segment
boundaries. Windows may run past the end of the starting episode: ``mask`` is True for the
rows that are steps of the starting episode (its final-observation row and anything after are
False), and rows past the last one written are zero-filled with ``mask`` False. A window whose
starting episode is not yet written to its end within the window (lookahead missing) is not
sampled. ``stride`` keeps only starts whose position in the lane is a multiple of ``stride``
(R2D2-style overlapping sequences: ``stride = length // 2``).

One compiled call draws, checks and gathers a batch (``_kernels.draw_rows`` and
``_windows.gather_sequences``; imported lazily, like every numba module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.errors import EmptyStoreError

if TYPE_CHECKING:
    from ..storage.store import ReplayStore

_MAX_ROUNDS = 64


@dataclass(frozen=True, slots=True)
class SequenceBatch:
    """``B`` windows of ``T = burn_in + length`` rows; every field has shape ``(B, T, ...)``."""

    fields: dict[str, np.ndarray]
    """Every schema field (observations included), row by row."""
    is_last: np.ndarray
    """(B, T): the row is an episode's final observation."""
    mask: np.ndarray
    """(B, T): the row is a step of the window's starting episode."""
    ids: np.ndarray
    """(B,): global id of each window's first row."""
    burn_in: int
    """Leading rows meant only to warm up a recurrent state."""

    def __len__(self) -> int:
        return len(self.ids)


class SequenceSampler:
    """Uniform windows of ``burn_in + length`` consecutive rows of one lane (see module doc)."""

    def __init__(self, store: ReplayStore, length: int, *, burn_in: int = 0, stride: int = 1,
                 seed: int | None = None, refresh_interval_s: float | None = 1.0) -> None:
        if length < 1 or burn_in < 0 or stride < 1:
            raise ValueError("`length` and `stride` must be >= 1 and `burn_in` >= 0")
        from .uniform import UniformSampler

        self._u = UniformSampler(store, seed=seed, refresh_interval_s=refresh_interval_s)  # refresh + rng
        self.store = store
        self.length, self.burn_in, self.stride = int(length), int(burn_in), int(stride)
        self.total = self.length + self.burn_in
        lay = store.layout
        rows, self._where, off = [], [], 0
        for f in store.schema.fields:
            rows.append((lay.column(f.name).offset - lay.records_offset, f.row_bytes, off))
            self._where.append((f.name, off))
            off += f.row_bytes * self.total  # per batch row; scaled by B below
        self._fields1 = np.array(rows, np.int64).reshape(-1, 3)
        self._row_bytes = off
        self._is_last_off = lay.column("is_last").offset - lay.records_offset

    def _gather(self, batch_size: int, candidates: Any) -> SequenceBatch:
        from .uniform import _kernels

        gather_sequences = _kernels().gather_sequences
        reader = self.store.reader
        fields = self._fields1.copy()
        fields[:, 2] *= batch_size  # block f starts after the previous fields' B*T rows
        out = np.empty(self._row_bytes * batch_size, np.uint8)
        is_last = np.empty((batch_size, self.total), np.bool_)
        mask = np.empty((batch_size, self.total), np.bool_)
        ids = np.empty(batch_size, np.int64)
        filled = 0
        for _ in range(_MAX_ROUNDS):
            need = batch_size - filled  # only 1 in `stride` rows can start a window: draw that many more
            ks, slots = candidates((need + 8 + need // 2) * self.stride)
            if len(ks) == 0:
                break
            filled, _ = gather_sequences(reader.segment_table(), reader.bytes, self.store.layout.record_bytes,
                                         self._is_last_off, self.total, self.stride, ks, slots, filled, fields, out,
                                         is_last, mask, ids, self.store.segment_records)
            if filled == batch_size:
                break
        if filled < batch_size:
            raise EmptyStoreError(f"{self.store.path} has too few complete windows of {self.total} rows")
        schema = self.store.schema
        arrays = {name: np.ndarray((batch_size, self.total, *schema[name].shape), schema[name].dtype, buffer=out,
                                   offset=off * batch_size) for name, off in self._where}
        return SequenceBatch(arrays, is_last, mask, ids, self.burn_in)

    def windows(self, ids: np.ndarray) -> SequenceBatch | None:
        """The windows starting at given rows, or ``None`` if one of them starts no complete
        window (for tests and tools)."""
        from .uniform import _once

        ids = np.asarray(ids, np.int64)
        k, slot = self.store.reader.locate(ids)
        try:
            b = self._gather(len(ids), _once(k, slot))
        except EmptyStoreError:
            return None
        return b if np.array_equal(b.ids, ids) else None

    def sample(self, batch_size: int) -> SequenceBatch:
        """``batch_size`` windows drawn uniformly over valid starts, with replacement."""
        from .uniform import _kernels

        draw_rows = _kernels().draw_rows

        if batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, got {batch_size}")
        self._u._maybe_refresh()
        if self.store.reader.snapshot.total_rows == 0:
            raise EmptyStoreError(f"{self.store.path} has no committed rows to sample from")
        seg = self.store.reader.segment_table()
        return self._gather(batch_size, lambda n: draw_rows(self._u._state, n, seg))
