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

One compiled call draws, checks and gathers a batch (``transition_kernels.draw_rows`` and
``window_kernels.gather_sequences``; imported lazily, like every numba module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..core.errors import EmptyStoreError
from .gather import MAX_ROUNDS, Once, check_batch_size, kernel_state, kernels

if TYPE_CHECKING:
    from ..storage import ReplayStore
    from .gather import Source


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

    length: int
    """Rows of a window after its burn-in."""
    burn_in: int
    """Leading rows of a window meant only to warm up a recurrent state."""
    stride: int
    """Windows start only at rows whose position in their lane is a multiple of ``stride``."""

    def __init__(self, store: ReplayStore, length: int, *, burn_in: int = 0, stride: int = 1,
                 seed: int | None = None, refresh_interval_s: float | None = 1.0) -> None:
        if length < 1 or burn_in < 0 or stride < 1:
            raise ValueError("`length` and `stride` must be >= 1 and `burn_in` >= 0")
        store.schema.require_transition_fields()  # as before: windows hold whole steps
        self.store = store
        """The store sampled."""
        self.refresh_interval_s = refresh_interval_s
        """How often ``sample`` looks for rows other processes published (``None``: never by itself)."""
        self.rng = np.random.default_rng(seed)
        """The sampler's generator (seeded with ``seed``): it seeds the compiled kernels' own."""
        self._state = kernel_state(self.rng)  # the compiled kernels' generator, seeded from ``rng``
        self.length, self.burn_in, self.stride = int(length), int(burn_in), int(stride)
        self.total = self.length + self.burn_in
        """Rows of a window: ``burn_in + length`` (``T`` of a ``SequenceBatch``)."""
        lay = store.layout
        rows, self._where, off = [], [], 0
        for f in store.schema.fields:
            rows.append((lay.column(f.name).offset - lay.records_offset, f.row_bytes, off))
            self._where.append((f.name, off))
            off += f.row_bytes * self.total  # per batch row; scaled by B below
        self._fields1 = np.array(rows, np.int64).reshape(-1, 3)
        self._row_bytes = off
        self._is_last_off = lay.column("is_last").offset - lay.records_offset
        store.map_pages(background=True)  # a store that fits in RAM: its first batches take no page faults

    def _gather(self, batch_size: int, candidates: Source) -> SequenceBatch:
        gather_sequences = kernels().gather_sequences
        reader = self.store.reader
        fields = self._fields1.copy()
        fields[:, 2] *= batch_size  # block f starts after the previous fields' B*T rows
        out = np.empty(-(-self._row_bytes * batch_size // 8) * 8, np.uint8)  # the kernel views it as uint64
        is_last = np.empty((batch_size, self.total), np.bool_)
        mask = np.empty((batch_size, self.total), np.bool_)
        ids = np.empty(batch_size, np.int64)
        filled = 0
        for _ in range(MAX_ROUNDS):
            need = batch_size - filled  # only 1 in `stride` rows can start a window: draw that many more
            got = candidates.take((need + 8 + need // 2) * self.stride)
            if got is None or len(got[0]) == 0:
                break
            ks, slots = got
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
        ids = np.asarray(ids, np.int64)
        k, slot = self.store.reader.locate(ids)
        try:
            b = self._gather(len(ids), Once(k, slot))
        except EmptyStoreError:
            return None
        return b if np.array_equal(b.ids, ids) else None

    def sample(self, batch_size: int) -> SequenceBatch:
        """``batch_size`` windows drawn uniformly over valid starts, with replacement."""
        batch_size = check_batch_size(batch_size)
        if self.refresh_interval_s is not None:
            self.store.refresh_if_stale(self.refresh_interval_s)
        if self.store.reader.snapshot.total_rows == 0 and not self.store.wait_for_rows():  # (a copy being checked)
            raise EmptyStoreError(f"{self.store.path} has no committed rows to sample from")
        return self._gather(batch_size, _Drawn(self._state, self.store.reader.segment_table()))


class _Drawn:
    """Uniform rows drawn by the kernel from ``state`` over segment table ``seg`` (a
    ``gather.Source`` that never runs out)."""

    def __init__(self, state: np.ndarray, seg: np.ndarray) -> None:
        self.state, self.seg = state, seg

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        return kernels().draw_rows(self.state, n, self.seg)

    def consumed(self, used: int) -> None:
        pass
