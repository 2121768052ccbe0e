"""Exact mode beyond RAM: rows drawn ahead, their pages fetched in the background, and a bound
on the store pages the learner keeps mapped (see ``tiers.py`` for the tiers as a whole).

* ``DrawAhead``: a uniform sampler's stream of drawn rows, kept ``prefetch_batches`` batches
  ahead of use. Rows are drawn exactly as on demand (uniform over committed rows, rejection of
  those that start no transition, in draw order), only earlier: a batch comes from a snapshot
  up to ``prefetch_batches`` batches old, and rows evicted since they were drawn are skipped
  like rejected ones. Same seed and same store, same batches.
* ``PageFetcher``: one background thread that issues ``MADV_WILLNEED`` for the records the views
  of drawn rows will read (``io_kernels.advise_windows``: one compiled call per batch, the GIL
  released), so the disk reads them, many at a time, while the learner computes; the gather
  then finds them in the page cache. Measured on the dev machine: a cold batch of 256 Atari
  transitions (stacks of 4) read on demand through ``MADV_RANDOM`` runs at ~1,500
  transitions/s (one 4 KB read per fault), with the hints at the disk's random-read rate.
* ``RssGuard``: drops this process's page-table entries for the file-mapped windows
  (``StoreReader.unmap_pages``) whenever the store pages it maps grew by more than a limit: the
  learner's RSS stays bounded however large the store (the pages stay in the page cache, which
  the kernel can reclaim; RAM copies of the resident set are not touched).
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from ..core.fs import MADV_WILLNEED
from ..core.errors import EmptyStoreError
from .gather import TransitionPlan, TransitionView, WindowPlan, gather_transitions, gather_windowed, kernels

if TYPE_CHECKING:
    from ..storage import ReplayStore


class PageFetcher:
    """Background ``MADV_WILLNEED`` for the rows of batches drawn ahead.

    ``fetch(table, ks, slots)`` queues the hints for the views starting at those rows (``back``
    rows before, ``fwd`` after, along each lane) and returns a ticket; ``wait(ticket)`` blocks
    until the hints up to that ticket are issued (the reads carry on in the kernel; a page
    still in flight when the gather touches it is waited for, not read twice).
    """

    def __init__(self, store: ReplayStore, back: int, fwd: int) -> None:
        self.store = store
        self.back, self.fwd = int(back), int(fwd)
        self._pool: ThreadPoolExecutor | None = None
        self._queue: deque[tuple[int, Future[int]]] = deque()
        self._tickets = 0
        self.calls = 0
        self.rows = 0

    def fetch(self, table: np.ndarray, ks: np.ndarray, slots: np.ndarray) -> int:
        advise_windows = kernels().advise_windows
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="mmreplay-prefetch")
        reader = self.store.reader
        self._tickets += 1
        fut = self._pool.submit(advise_windows, table, reader.region.base, self.store.layout.record_bytes,
                                self.back, self.fwd, np.ascontiguousarray(ks, np.int64),
                                np.ascontiguousarray(slots, np.int64), MADV_WILLNEED)
        self._queue.append((self._tickets, fut))
        self.rows += len(ks)
        return self._tickets

    def wait(self, ticket: int) -> None:
        while self._queue and self._queue[0][0] <= ticket:
            self.calls += self._queue.popleft()[1].result()

    def close(self) -> None:
        self.wait(self._tickets)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class DrawAhead:
    """The drawn-ahead row stream of one uniform sampler in exact mode (module docstring).

    ``state`` is the sampler's kernel generator state (shared, advanced in place), ``view``
    what its transitions span. ``gather`` is a ``gather.Source`` for the shared gather loop:
    ``take`` offers the next rows of the stream still visible, ``consumed`` drops the used ones
    (rejected ones included) from it."""

    def __init__(self, store: ReplayStore, state: np.ndarray, view: TransitionView, batches: int,
                 fetcher: PageFetcher) -> None:
        self.store = store
        self.state = state
        self.view = view
        self.batches = batches
        self.fetcher = fetcher
        self._ids = np.zeros(0, np.int64)  # drawn, not used yet, in draw order
        self._end = 0  # rows drawn so far: the stream position of ``_ids[-1] + 1``
        self._tickets: list[tuple[int, int]] = []  # (stream position covered, fetch ticket)
        self._margin = 8  # extra rows offered per round (set per batch)
        self._offered = (0, np.zeros(0, np.int64))  # last ``take``: (rows taken, positions offered)

    def _draw(self, want: int) -> None:
        """Draw uniform rows until ``want`` are waiting, and queue their pages' prefetch."""
        n = want - len(self._ids)
        if n <= 0:
            return
        reader = self.store.reader
        seg = reader.segment_table()
        ks, slots = kernels().draw_rows(self.state, n, seg)
        ids = reader.snapshot.segment_ids[ks] * self.store.segment_records + slots
        ticket = self.fetcher.fetch(seg, ks, slots)
        self._ids = np.concatenate([self._ids, ids])
        self._end += n
        self._tickets.append((self._end, ticket))

    def _next(self, n: int) -> np.ndarray:
        """The next ``n`` drawn rows (drawing more if needed), once their hints are issued."""
        self._draw(n)
        upto = self._end - len(self._ids) + n  # stream position after these rows
        target = None
        for end, ticket in self._tickets:
            target = ticket
            if end >= upto:
                break
        if target is not None:
            self.fetcher.wait(target)
        self._tickets = [(e, t) for e, t in self._tickets if e > upto]
        return self._ids[:n]

    def take(self, remaining: int) -> tuple[np.ndarray, np.ndarray]:
        """``Source.take``: the next ``remaining`` (plus a margin) rows of the stream, those
        still visible, as snapshot locations."""
        n = remaining + self._margin
        ok, k, slot = relocate(self.store, self._next(n))
        pos = np.flatnonzero(ok)
        self._offered = (n, pos)
        return k[pos], slot[pos]

    def consumed(self, used: int) -> None:
        """``Source.consumed``: drop the rows up to the ``used``-th offered one (all taken rows
        if every offered one was used)."""
        n, pos = self._offered
        self._ids = self._ids[n if used >= len(pos) else int(pos[used]) :]  # consumed, rejects included

    def gather(self, batch_size: int, plan: TransitionPlan | WindowPlan, out: np.ndarray,
               ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """The next rows of the stream that start a transition, gathered into ``out`` following
        ``plan``; then the next ``batches`` batches are drawn and their pages fetched. Returns
        ``(ids, window)`` (``window``: the computed n-step values, or ``None`` for one-step
        transitions), what ``gather.assemble`` takes with the plan and ``out``."""
        store = self.store
        self._margin = margin = 8 + batch_size // 16
        seg = store.reader.segment_table()
        window = None
        if isinstance(plan, WindowPlan):
            filled, ids, window = gather_windowed(store, self.view, plan, out, self, batch_size, seg)
        else:
            filled, ids = gather_transitions(store, plan, out, self, batch_size, seg)
        if filled < batch_size:
            raise EmptyStoreError(f"{store.path} has too few sampleable transitions (n_step={self.view.n_step})")
        self._draw(self.batches * (batch_size + margin))
        return ids, window


class RssGuard:
    """Unmaps the store's file pages from this process when they grew by ``limit_bytes``."""

    def __init__(self, store: ReplayStore, limit_bytes: int, every: int = 1) -> None:
        self.store = store
        self.limit = int(limit_bytes)
        self.every = every  # check once per this many batches (reading statm costs a few us, timed ad hoc)
        self._n = 0
        self._fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        self._page = os.sysconf("SC_PAGE_SIZE")
        self.base = self.mapped_file_bytes()
        self.drops = 0

    def mapped_file_bytes(self) -> int:
        """File-backed (and shared) resident bytes of this process (``statm`` field 3)."""
        return int(os.pread(self._fd, 256, 0).split()[2]) * self._page

    def check(self) -> None:
        self._n += 1
        if self._n % self.every:
            return
        if self.mapped_file_bytes() - self.base > self.limit:
            self.store.reader.unmap_pages()
            self.drops += 1
            self.base = self.mapped_file_bytes()  # what is left (e.g. a writer's own mappings)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def relocate(store: ReplayStore, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ok, k, slot)`` of global row ids in the current snapshot; ``ok`` is False for rows no
    longer visible (their segment was evicted since they were drawn)."""
    snap = store.reader.snapshot
    sid, slot = np.divmod(ids, store.segment_records)
    if len(snap.segment_ids) == 0:
        z = np.zeros(len(ids), np.int64)
        return np.zeros(len(ids), np.bool_), z, z
    k = np.minimum(np.searchsorted(snap.segment_ids, sid), len(snap.segment_ids) - 1)
    ok = (snap.segment_ids[k] == sid) & (slot < snap.committed[k])
    return ok, k, slot
