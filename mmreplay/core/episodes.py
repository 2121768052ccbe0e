"""Episode structure of a segment's rows, derived from ``is_last`` and the writer session's chain.

Used by the archive (its ``episode`` / ``is_first`` arrays) and by the Minari exporter. Rows of a
segment are laid out ``(time, lane)`` with ``lanes`` lanes; the next row of a lane is ``lanes``
rows on, possibly in the session's next segment (the chain). An episode of a lane starts at the
lane's first row in its writer session, or at the row after an ``is_last`` row, and ends at its
``is_last`` row (its final observation).

Invariants kept here:

* an episode's id is the global row id (``segment_id * segment_records + slot``) of its first
  row, so ids are unique, stable, and never need renumbering when more rows are exported later;
  an episode whose first rows were evicted before the export gets the id of its first row still
  present, and its rows are not ``is_first``;
* the computation is vectorized per segment (no Python loop per row or lane) and needs only the
  state of the chain predecessor's last row per lane (``LaneCarry``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class LaneCarry:
    """The last row of each lane of a segment: what the chain successor continues from."""

    episode: np.ndarray
    """Episode id of each lane's last row (int64, ``(lanes,)``)."""
    is_last: np.ndarray
    """Whether each lane's last row ended its episode (bool, ``(lanes,)``)."""
    done: np.ndarray | None = None
    """Whether each lane's last row is a step that ended its episode (terminated or truncated):
    then the next row is its final observation (``masked_last``)."""


def row_flags(x: np.ndarray) -> np.ndarray:
    """A flag field's rows as one bool per row (a field of shape ``(n, ...)``: any of a row's values)."""
    x = np.asarray(x, np.bool_)
    return x.reshape(x.shape[0], -1).any(axis=1) if x.ndim > 1 else x


def masked_last(is_last: np.ndarray, masked: np.ndarray, done: np.ndarray, *, lanes: int,
                carry: LaneCarry | None) -> np.ndarray:
    """``is_last`` with the flag of every **masked** row (damaged: its own bytes unknown) worked
    out from the row before it in its lane, as a writer derives it: a row is its episode's final
    observation when that row is an ordinary step (neither final nor masked) that ended the
    episode (``done``: terminated or truncated). Where the row before is masked too, or lies in a
    predecessor segment not known (``carry`` None), the flag stays False: the episode is taken
    to go on (it holds a masked row either way, so an export leaves it out; no boundary is made
    up). All arrays are per row of one segment, ``(time, lane)`` order."""
    out = np.asarray(is_last, np.bool_).copy()
    masked = np.asarray(masked, np.bool_)
    if not masked.any():
        return out
    n, L = len(out), int(lanes)
    before_done = np.zeros(n, np.bool_)
    ordinary = ~out & ~masked
    before_done[L:] = np.asarray(done, np.bool_)[: n - L] & ordinary[: n - L]
    if carry is not None and carry.done is not None:
        head = min(L, n)
        before_done[:head] = (carry.done & ~carry.is_last)[:head]
    out[masked] = before_done[masked]
    return out


def segment_episodes(
    is_last: np.ndarray, *, segment_id: int, segment_records: int, lanes: int, chain_index: int,
    carry: LaneCarry | None, done: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, LaneCarry]:
    """Episode id and ``is_first`` of each of a segment's ``n = len(is_last)`` rows.

    ``carry`` is the chain predecessor's :class:`LaneCarry` (``None`` when the segment starts its
    writer session, ``chain_index == 0``, or when the predecessor is gone); ``done``: the rows'
    terminated-or-truncated flags, carried to the successor for ``masked_last``. Returns
    ``(episode int64 (n,), is_first bool (n,), carry for the successor)``; the carry is only
    meaningful when the segment is full (every lane has the same number of rows).
    """
    n = len(is_last)
    L = int(lanes)
    T = -(-n // L) if n else 0
    last = np.zeros(T * L, np.bool_)
    last[:n] = is_last
    last = last.reshape(T, L)
    start = np.empty((T, L), np.bool_)
    if T:
        start[1:] = last[:-1]
        start[0] = True if carry is None else carry.is_last
    first = start.copy()
    if T and carry is None and chain_index > 0:
        first[0] = False  # the predecessor was evicted: these rows continue an episode we cannot see
    gid = np.int64(segment_id) * segment_records + np.arange(T * L, dtype=np.int64).reshape(T, L)
    ep = np.where(start, gid, np.int64(-1))
    if T and carry is not None:
        ep[0] = np.where(start[0], gid[0], carry.episode)
    # ids only grow along a lane (a start's gid exceeds every earlier id), so a running maximum
    # forward-fills each lane's current episode id
    np.maximum.accumulate(ep, axis=0, out=ep)
    tail_done = None
    if done is not None and T:
        d = np.zeros(T * L, np.bool_)
        d[:n] = done
        tail_done = d.reshape(T, L)[-1].copy()
    out_carry = LaneCarry(ep[-1].copy() if T else np.full(L, -1, np.int64),
                          last[-1].copy() if T else np.zeros(L, np.bool_), tail_done)
    return ep.reshape(-1)[:n], first.reshape(-1)[:n], out_carry
