"""The learner's side of the storage tiers, and the RAM tier itself: a resident set of whole
segments copied into RAM (``mode="windowed"``).

Tiers (README "Beyond RAM"): **hot** = the open segments being written and the learner's
resident set of sealed segments held in RAM; **warm** = every sealed segment, mapped with
``MADV_RANDOM`` (random rows come through the page cache; ``reader.py`` sets the hints);
**cold** = archives (elsewhere). Exact mode's prefetch and the bound on mapped pages live in
``_prefetch.py``; ``storage.info.tier_summary`` is what ``mmreplay info`` shows.

``ResidentSet``: a uniform random subset of the sealed segments, as many as fit in
``cache_bytes`` after the open segments holding rows (which are always sampleable: they are in
the page cache while written), each copied into anonymous memory with one sequential read in a
background thread (``load_segment``) and moved into its own window of the reader's address
range (``StoreReader.pin``: the compiled kernels keep one base pointer and read the copy in
place of the file mapping). Once full, it swaps one random resident segment for one random
non-resident one every ``1 / swap_segments_per_s`` seconds. Invariants:

* draws land only in the open and resident segments (``restricted_table``); a view that reaches
  into a non-resident neighbour (a frame stack or an n-step lookahead across a segment
  boundary) reads it through the mapping, so every view is exact, and those edge rows are
  hinted (``MADV_WILLNEED``) whenever the set changes, so they are rarely cold;
* the copies plus the open segments never exceed ``cache_bytes``; a load in flight adds one
  segment; a set that no longer fits (more open segments) sheds random members first;
* only the sampling thread changes the set; the loader thread only reads files into new
  mappings (at a lower CPU priority).

The first draw waits until the set is full, so batches never come from a partial set.
"""

from __future__ import annotations

import errno
import math
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.fs import HUGE_PAGE, MADV_WILLNEED, map_anonymous, protect_read, unmap

if TYPE_CHECKING:
    from ..storage import ReplayStore

_CHUNK = 8 << 20  # bytes per read call when loading a segment


def restricted_table(table: np.ndarray, include: np.ndarray) -> np.ndarray:
    """A copy of a segment table whose draws (``SEG_CUM_END``) only land in segments where
    ``include`` is True; every other column is unchanged, so views still walk into the
    excluded segments."""
    from ..storage import SEG_COMMITTED, SEG_CUM_END, index_draws

    t = table.copy()
    t[:, SEG_CUM_END] = np.cumsum(t[:, SEG_COMMITTED] * include)
    return index_draws(t)


def load_segment(path: os.PathLike[str] | str, size: int, length: int | None = None) -> tuple[int, int, float]:
    """Copy a segment file (``size`` bytes) into a new anonymous mapping of ``length`` bytes
    (default ``size``; a multiple of ``HUGE_PAGE`` gets huge pages, see ``map_anonymous``) with
    one sequential read, and make the copy read-only. Returns ``(address, open fd, seconds)``.

    The read is ``O_DIRECT`` where the filesystem allows it: the disk writes straight into the
    copy, so the file's pages neither pass through nor stay in the page cache (an ad-hoc timing
    when it was written: 0.58 against 0.50 GB/s from a cold cache, and half the CPU, 13 against
    24 ms a 29 MB segment; ``python benchmarks/beyond_ram.py`` reports load rates). Otherwise a buffered read with ``POSIX_FADV_SEQUENTIAL`` (large
    read-ahead), whose pages are then dropped (``POSIX_FADV_DONTNEED``): the copy replaces them.
    """
    t0 = time.perf_counter()
    length = size if length is None else length
    addr = map_anonymous(length, huge=length % HUGE_PAGE == 0)
    try:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECT)
            try:
                _read_into(fd, addr, size, path)
            except OSError:
                os.close(fd)
                raise
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # not "O_DIRECT unsupported here"
                raise
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.posix_fadvise(fd, 0, size, os.POSIX_FADV_SEQUENTIAL)
                _read_into(fd, addr, size, path)
                os.posix_fadvise(fd, 0, size, os.POSIX_FADV_DONTNEED)
            except BaseException:
                os.close(fd)
                raise
        protect_read(addr, length)
    except BaseException:
        unmap(addr, length)
        raise
    return addr, fd, time.perf_counter() - t0


def _read_into(fd: int, addr: int, size: int, path: object) -> None:
    import ctypes

    view = memoryview((ctypes.c_char * size).from_address(addr)).cast("B")
    try:
        off = 0
        while off < size:
            n = os.preadv(fd, [view[off : off + _CHUNK]], off)
            if n <= 0:
                raise OSError(errno.EIO, f"{path}: short read at byte {off} of {size}")
            off += n
    finally:
        view.release()


def _background_priority() -> None:
    """Loader threads run at a lower CPU priority than the learner (Linux: per-thread nice)."""
    import contextlib
    import threading

    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


class ResidentSet:
    """The RAM tier of one windowed sampler (see the module docstring).

    Parameters
    ----------
    store
        The store handle; one resident set per handle (open the store again for another).
    cache_bytes
        RAM for the open segments plus the resident copies: ``cache_bytes // segment_bytes``
        segments in all. At least one segment.
    swap_segments_per_s
        Rate at which one resident segment is replaced by a non-resident one once the set is
        full (``math.inf``: as fast as the disk loads them; 0: never, a fixed subset).
    rng
        Chooses which segments come and go (the sampler's generator).
    """

    def __init__(self, store: ReplayStore, cache_bytes: int | None, swap_segments_per_s: float,
                 rng: np.random.Generator) -> None:
        size = store.reader.copy_bytes
        if cache_bytes is None or cache_bytes < size:
            raise ValueError(f"`cache_bytes` must hold at least one segment ({size:,} bytes) in mode='windowed', "
                             f"got {cache_bytes!r}")
        if not swap_segments_per_s >= 0:
            raise ValueError(f"`swap_segments_per_s` must be >= 0, got {swap_segments_per_s!r}")
        reader = store.reader
        if reader.pin_owner is not None:
            raise ValueError("this store handle already has a windowed sampler (its resident set owns the RAM "
                             "copies); close it, or open the store again for another")
        reader.pin_owner = self
        self.store = store
        self.cache_bytes = int(cache_bytes)
        self.segment_bytes = reader.copy_bytes  # RAM a resident segment takes (file, to whole huge pages)
        self.rate = float(swap_segments_per_s)
        self.rng = rng
        self.version = 0
        """Bumped whenever the set of sampleable segments changes by a load or a swap."""
        self._loader: ThreadPoolExecutor | None = None
        self._pending: tuple[int, Future[tuple[int, int, float]]] | None = None
        self._credit = 0.0
        self._clock = time.monotonic()
        self._key: tuple[Any, int] | None = None
        self._cache: tuple[np.ndarray, np.ndarray, int, int, int, np.ndarray]
        self.edge_rows = (0, 1)
        """Rows a view reads before / after its start along a lane (the sampler sets them)."""
        self.loads = self.swaps = self.bytes_loaded = self.failed = 0
        self.load_s = 0.0

    # -- the set --------------------------------------------------------------------------
    def _view(self) -> tuple[np.ndarray, np.ndarray, int, int, int, np.ndarray]:
        """``(include, table, rows, open segments, capacity, candidates)`` for the current
        snapshot and resident set, computed once per change (draws call this every batch)."""
        reader = self.store.reader
        full = reader.segment_table()
        if self._key is None or self._key[0] is not full or self._key[1] != self.version:
            from .transition_kernels import SEG_CUM_END

            snap = reader.snapshot
            pinned = np.isin(snap.segment_ids, np.fromiter(reader.pinned, np.int64))
            include = ~snap.sealed | pinned
            table = restricted_table(full, include)
            rows = int(table[-1, SEG_CUM_END]) if len(table) else 0
            n_open = int(((~snap.sealed) & (snap.committed > 0)).sum())  # an empty spare costs nothing
            cap = max(0, (self.cache_bytes - n_open * self.segment_bytes) // self.segment_bytes)
            self._cache = (include, table, rows, n_open, cap, snap.segment_ids[snap.sealed & ~pinned])
            self._key = (full, self.version)
        return self._cache

    def open_segments(self) -> int:
        """Open segments holding rows (counted against ``cache_bytes``)."""
        return self._view()[3]

    def capacity(self) -> int:
        """Resident sealed segments that fit beside the open ones."""
        return self._view()[4]

    def resident_ids(self) -> list[int]:
        return sorted(self.store.reader.pinned)

    def update(self) -> None:
        """Called before each draw: commit a finished load, keep within the budget, and start
        the next load (filling up, or a swap when one is due)."""
        pinned = self.store.reader.pinned
        if self._pending is not None:
            self._commit(block=False)
        cap = self._view()[4]
        while len(pinned) > cap:  # more open segments than before: make room
            self._drop_one()
        if len(pinned) < cap:
            if self._pending is None:
                self._start()
            self._clock = time.monotonic()  # swaps are due from when the set is full
            return
        now = time.monotonic()
        if math.isinf(self.rate):
            self._credit = 1.0
        else:
            self._credit = min(self._credit + (now - self._clock) * self.rate, 2.0)
        self._clock = now
        if self._pending is None and self._credit >= 1.0 and cap > 0 and self._start():
            self._credit -= 1.0

    def _candidates(self) -> np.ndarray:
        return self._view()[5]

    def _start(self) -> bool:
        cand = self._candidates()
        if len(cand) == 0:
            return False
        sid = int(cand[self.rng.integers(len(cand))])
        reader = self.store.reader
        if self._loader is None:
            self._loader = ThreadPoolExecutor(1, thread_name_prefix="mmreplay-tier", initializer=_background_priority)
        path = reader.dir / reader.segments[sid].name
        self._pending = (sid, self._loader.submit(load_segment, path, self.store.layout.file_size,
                                                  self.segment_bytes))
        return True

    def _drop_one(self) -> None:
        reader = self.store.reader
        ids = sorted(reader.pinned)
        sid = ids[int(self.rng.integers(len(ids)))]
        reader.unpin(sid)
        self.version += 1
        self._hint_edges(sid)

    def _hint_edges(self, sid: int) -> None:
        """``MADV_WILLNEED`` the rows that views starting in sampleable segments read from a
        neighbour that is not (the last ``back`` rows of a predecessor, the first ``fwd`` rows of
        a successor, per lane), after ``sid`` joined or left the set: a window that crosses
        into a segment on disk then rarely waits for it (the copies never pass through the
        page cache, so those rows would be cold)."""
        back, fwd = self.edge_rows
        reader = self.store.reader
        snap = reader.snapshot
        k = int(np.searchsorted(snap.segment_ids, sid))
        if k >= len(snap.segment_ids) or snap.segment_ids[k] != sid:
            return
        inc = self._view()[0]
        rec = self.store.layout.record_bytes
        off0 = self.store.layout.records_offset

        def advise(j: int, lo: int, hi: int) -> None:
            hi = min(hi, int(snap.committed[j]))
            if hi > lo >= 0:
                reader.region.advise(int(snap.windows[j]), (hi - lo) * rec, MADV_WILLNEED, offset=off0 + lo * rec)

        def tail(j: int) -> None:
            advise(j, max(0, int(snap.usable[j]) - back * int(snap.lanes[j])), int(snap.usable[j]))

        def head(j: int) -> None:
            advise(j, 0, fwd * int(snap.lanes[j]))

        p, q = int(snap.pred[k]), int(snap.succ[k])
        if inc[k]:  # joined: the neighbours on disk
            if back and p >= 0 and not inc[p]:
                tail(p)
            if fwd and q >= 0 and not inc[q]:
                head(q)
        else:  # left: its own edges next to sampleable neighbours
            if back and q >= 0 and inc[q]:
                tail(k)
            if fwd and p >= 0 and inc[p]:
                head(k)

    def _commit(self, *, block: bool) -> bool:
        """Move a finished load into the region (replacing a random resident segment when the
        set is full); returns whether one was committed."""
        if self._pending is None:
            return False
        sid, fut = self._pending
        if not block and not fut.done():
            return False
        self._pending = None
        try:
            addr, fd, secs = fut.result()
        except OSError:  # evicted (deleted) before it could be read
            self.failed += 1
            return False
        reader = self.store.reader
        if reader is None:
            unmap(addr, self.segment_bytes)
            os.close(fd)
            return False
        cap = self.capacity()
        if cap == 0:  # the open segments use the whole budget now
            unmap(addr, self.segment_bytes)
            os.close(fd)
            return False
        if len(reader.pinned) >= cap:
            self._drop_one()
            self.swaps += 1
        if reader.pin(sid, addr, fd):
            self.loads += 1
            self.bytes_loaded += self.segment_bytes
            self.load_s += secs
            self.version += 1
            self._hint_edges(sid)
            return True
        self.failed += 1
        return False

    def fill(self, timeout_s: float | None = None) -> None:
        """Load segments until the set is full (or every sealed segment is resident)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            self.update()
            if self._pending is None or len(self.store.reader.pinned) >= self.capacity():
                return  # full (a swap may be in flight), or nothing left to load
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"resident set not full after {timeout_s} s")
            self._commit(block=True)

    def wait(self) -> bool:
        """Block until the load in flight (if any) is committed; returns whether one was."""
        return self._commit(block=True)

    # -- drawing --------------------------------------------------------------------------
    def include(self) -> np.ndarray:
        """Per snapshot segment: whether it is sampleable now (open, or resident)."""
        return self._view()[0]

    def table(self) -> np.ndarray:
        """The reader's segment table with draws restricted to open and resident segments."""
        return self._view()[1]

    def rows(self) -> int:
        """Rows draws may land on (committed rows of the open and resident segments)."""
        return self._view()[2]

    def ensure_rows(self) -> None:
        """Block until some rows are sampleable (a static store starts with nothing resident)."""
        while self.rows() == 0:
            self.update()
            if self._pending is None:
                return  # nothing to load: the caller reports an empty store
            self._commit(block=True)

    # -- reporting, closing ---------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        reader = self.store.reader
        snap = reader.snapshot
        n_open = self.open_segments()
        return {
            "mode": "windowed",
            "cache_bytes": self.cache_bytes,
            "segment_bytes": self.segment_bytes,
            "open_segments": n_open,
            "resident_segments": len(reader.pinned),
            "resident_ids": self.resident_ids(),
            "resident_bytes": len(reader.pinned) * self.segment_bytes,
            "capacity_segments": self.capacity(),
            "sealed_segments": int(snap.sealed.sum()),
            "sampleable_rows": self.rows(),
            "total_rows": snap.total_rows,
            "loads": self.loads,
            "swaps": self.swaps,
            "failed_loads": self.failed,
            "load_bytes_per_s": self.bytes_loaded / self.load_s if self.load_s else None,
            "loading": self._pending is not None,
        }

    def close(self) -> None:
        """Stop loading and map every resident segment's file back (frees the copies)."""
        reader = self.store.reader
        if self._pending is not None:
            _, fut = self._pending
            self._pending = None
            try:
                addr, fd, _ = fut.result()
                unmap(addr, self.segment_bytes)
                os.close(fd)
            except OSError:
                pass
        if self._loader is not None:
            self._loader.shutdown(wait=True)
            self._loader = None
        if reader is not None and reader.pin_owner is self:
            for sid in list(reader.pinned):
                reader.unpin(sid)
            reader.pin_owner = None
