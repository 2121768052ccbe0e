"""SegmentSupply: makes a writer session's segments ahead of need and retires full ones.

Making a segment (the store-wide allocation lock, eviction, ``posix_fallocate``, the header,
pre-faulting its pages) costs milliseconds; making a sealed one durable costs a disk write.
Neither may stall the append path, and neither may take the GIL back and forth while it runs:

* the writer makes its first segment when it opens (pre-faulted: its appends then cost no
  page-cache allocation, like a buffer allocated up front), the second once the first is half
  full, and each later one as soon as it takes the previous (a whole segment's time to make it),
  so a writer holds at most one spare segment of disk beyond the one it writes, and a short
  session makes no spare at all;
* ``prefetch()`` makes the session's next segment on the writer's thread, and pre-faults its
  pages in a background thread (one call without the GIL). Why not all of it in the background:
  a Python thread takes the GIL back after each of its system calls (a segment's making is ~40
  of them), and each time it does the appending thread is stopped for a thread switch; on a
  2-core VM that cost the appending thread ~30 ms per segment, while making a segment on the
  spot costs it ~2 ms (ad-hoc timings behind ``python benchmarks/collect.py``'s storing
  overhead). Pre-faulting is dominated by the kernel (~7 ms for 6 MiB) and is one call;
* ``next()`` hands out segments in chain order, without waiting for a segment's pre-faulting (a
  page it has not reached yet faults on first write); ``ensure(count)`` makes sure ``count`` segments are ready, so a batch that spans
  segments fails on a full disk *before* any of it is written;
* ``retire(seg)`` closes a sealed segment: every row of it is checked through the writer's own
  mapping (one compiled call, the rows hot), its mapping is dropped on the writer's thread, then
  for ``segment`` durability the file is made durable in a background thread (a few system calls;
  ``wait()`` collects those syncs and raises their errors), at once otherwise; the writer's thread
  then catalogues it as sealed (at its next ``prefetch()`` or ``wait()``, a batch in one catalog
  line), its file identity recorded as checked when the check found every row intact
  (``checks.py``), else the rows it found changed.

A writer with lane segments writes one chain per lane, in step: the supply then hands out *sets*
of segments, one per chain (each chain its own session epoch, same chain index), made and
retired together; a set is made whole or not at all. Every segment of a session is written by
that session only; the chain index and first sequence number in its header let readers follow
a lane from segment to segment.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from .format import Header, kernel
from .checks import identity
from ..core import fs
from ..core.fs import fsync_dir
from ..core.errors import DiskFullError
from .segment import Segment, now_ns
from .claims import allocating

if TYPE_CHECKING:
    from collections.abc import Callable

    from .files import StoreFiles

log = logging.getLogger(__name__)


LANE_SEGMENT_BYTES = 4096
"""Rows at least this large (a frame) give each lane segments of its own by default."""


def use_lane_segments(store: StoreFiles, lanes: int) -> bool:
    """Whether a writer of ``lanes`` lanes gives each lane a chain of segments of its own by default:
    for rows of at least ``LANE_SEGMENT_BYTES`` (frames: a frame stack is then one contiguous read
    rather than ``frames`` records ``lanes`` rows apart, which cost 1.4-1.6x the time per batch in
    ``python benchmarks/atari.py --lanes 1 8 --interleaved``), in a store with ``on_full="evict"`` whose
    capacity is at least 4 segments per lane (its ``lanes`` open segments then add at most a
    quarter of the capacity to the store's size)."""
    return (lanes > 1 and store.layout.record_bytes >= LANE_SEGMENT_BYTES and store.on_full == "evict"
            and 4 * lanes * store.segment_records <= store.capacity)


Segments = tuple[Segment, ...]  # one per chain, in chain order


class SegmentSupply:
    """Segment sets (one segment per chain: ``len(epochs)`` chains) for one writer session (used
    under the writer's mutex)."""

    def __init__(self, files: StoreFiles, writer_id: int, lanes: int, usable: int, epochs: list[int],
                 durability: str, written_here: Callable[[str], None] | None = None,
                 damaged_here: Callable[[str, Any], None] | None = None) -> None:
        self.files = files
        self.written_here = written_here
        """Told the name of each segment this session seals (its rows need no check by the handle)."""
        self.damaged_here = damaged_here
        """Told a sealed segment's name and slots when its check at seal finds rows changed since written."""
        self._bad: dict[str, Any] = {}  # the check at seal of each segment closed and not catalogued yet
        self._volatile: list[tuple[Any, int]] = []  # (path, rows) of sealed segments closed without a sync
        self._unchecked: list[tuple[Any, int]] = []  # (path, rows) of segments catalogued without a check at seal
        self.writer_id = writer_id
        self.lanes = lanes  # lanes of each segment
        self.usable = usable
        self.epochs = epochs
        self.durability = durability
        self._next_chain = 0
        self._ready: deque[Segments] = deque()
        self._pending: Future[Segments] | None = None
        self._faulter: ThreadPoolExecutor | None = None
        self._syncer: ThreadPoolExecutor | None = None
        self._syncs: list[Future[None]] = []
        self._closed: deque[Segment] = deque()  # closed durably in the background, not catalogued yet
        self._faults: dict[str, Future[None]] = {}  # segments being pre-faulted in the background

    # -- making ---------------------------------------------------------------------------
    def _make(self, chain_index: int, prefault: bool = True) -> Segments:
        """One segment per chain at ``chain_index``; on an error, the ones made are deleted."""
        made: list[Segment] = []
        try:
            for epoch in self.epochs:
                made.append(self._make_one(chain_index, epoch, prefault))
        except BaseException:
            for seg in made:
                self.discard((seg,))
            raise
        return tuple(made)

    def _make_one(self, chain_index: int, epoch: int, prefault: bool) -> Segment:
        store = self.files
        durable = self.durability == "batch"
        # segment sets ready but not written yet were made for this batch: they count as held (the
        # other chains' segments of the set being made do not: each lane's open segment is like a
        # writer's, beyond the capacity kept)
        held = len(self._ready) * len(self.epochs) * self.usable
        with allocating(store, pending_rows=held, durable=durable, defer=True) as sid:
            header = Header(
                store_uuid=store.store_uuid, segment_id=sid,
                writer_id=self.writer_id, lanes=self.lanes, session_epoch=epoch, chain_index=chain_index,
                first_seq=chain_index * self.usable, schema_hash=store.schema.hash,
                segment_records=store.segment_records, usable_records=self.usable,
                file_size=store.layout.file_size, created_ns=now_ns(),
            )
            try:
                return Segment.create(store.segments_dir, header, store.layout, durable=durable, prefault=prefault)
            except DiskFullError:
                # on_full="evict": free one sealed segment whatever the capacity, then retry once
                if store.on_full != "evict" or not store.evict_for_new_segment(force_one=True):
                    raise
                return Segment.create(store.segments_dir, header, store.layout, durable=durable, prefault=prefault)

    def _collect(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            try:
                self._ready.append(pending.result())
            except DiskFullError:
                # made ahead of need on a full disk: not an error yet. ``ensure`` makes it again when
                # the current segment is actually full (space may have been freed meanwhile), and
                # raises only then; its chain index is reused, so the session's chain has no gap
                self._next_chain -= 1

    @property
    def idle(self) -> bool:
        """No segment is ready or being made (``prefetch()`` would start one)."""
        return not self._ready and self._pending is None and self.usable > 1

    def prefetch(self) -> None:
        """Make the next segment now (pre-faulted in the background), unless one is ready or coming."""
        if not self.idle:
            return
        self._catalogue_closed()
        # made here, on the writer's thread, after its rows were published: the allocation's
        # eviction pass (``claims.allocating``) counts every row written. Its errors (a full store
        # with on_full="error", a full disk) are raised by ``ensure`` before the next write
        pending: Future[Segments] = Future()
        try:
            segs = self._make(self._next_chain, prefault=False)
        except Exception as exc:
            pending.set_exception(exc)
        else:
            pending.set_result(segs)
            if self._faulter is None:
                self._faulter = ThreadPoolExecutor(1, thread_name_prefix=f"mmreplay-fault-w{self.writer_id}")
            for seg in segs:
                self._faults[seg.path.name] = self._faulter.submit(seg.prefault)
        self._pending = pending
        if len(self.files.doomed):  # what the evictions above renamed away: unlinked in the background
            self._background(self._reap)
        self._next_chain += 1  # given back by _collect if that segment cannot be made

    def ensure(self, count: int) -> None:
        """Have ``count`` segment sets ready (raises ``DiskFullError`` before anything is written)."""
        if len(self._ready) < count:
            self._collect()
        while len(self._ready) < count:
            self._ready.append(self._make(self._next_chain))
            self._next_chain += 1

    def next(self) -> Segments:
        """The session's next segment set, in chain order. Its pre-faulting may still be running: the
        writer does not wait for it (a page not reached yet faults on first write, as without it;
        a fast writer fills a segment in about the time a background thread takes to get the GIL,
        pre-fault and get the GIL back), and ``retire`` waits for it before the mapping goes."""
        self.ensure(1)
        return self._ready.popleft()

    def _faulted(self, seg: Segment) -> Segment:
        """``seg`` once its background pre-faulting is over (it usually is, long before)."""
        f = self._faults.pop(seg.path.name, None)
        if f is not None:
            f.result()
        return seg

    # -- retiring -------------------------------------------------------------------------
    def retire(self, segs: Segments) -> None:
        """Close sealed segments, durably unless ``durability="process"``, then catalogue them."""
        for seg in segs:
            self._retire(seg)

    def _retire(self, seg: Segment) -> None:
        self._faulted(seg)  # (its mapping is dropped below)
        if self.written_here is not None:
            self.written_here(seg.path.name)  # the store handle's samplers need not check it
        self._syncs = [f for f in self._syncs if not f.done() or f.exception() is not None]
        self._bad[seg.path.name] = self._seal_check(seg)
        if self.durability == "process":
            seg.close()
            self._volatile.append((seg.path, seg.control.committed))  # a flush() makes it durable
            self._catalogue(seg)
        elif self.durability == "batch":
            seg.close(fdatasync=True)
            self._catalogue(seg)
        else:
            seg.unmap()  # here: the background thread then makes only the few calls of the sync
            self._background(self._close_durable, seg)

    @staticmethod
    def _seal_check(seg: Segment) -> Any:
        """Every row of a sealed segment checked, on the writer's thread, through its own mapping (the
        rows are in the page cache; one compiled call: ~0.15 ms for a 7,000-row CartPole segment, ~20 ms
        for 32 MiB of frames): a row changed in the file while the segment was open (by anything but
        this writer) is found before any reader trusts the seal. Its damaged slots, or None where numba
        is not loaded in this process (a single-lane writer does not load it for this: ~0.5 s): the
        segment is then catalogued unchecked, and its first reader checks it. (A background thread
        would cost the appending thread more: each of its Python steps takes the GIL back.)"""
        if kernel(load=False) is None:
            return None
        from .checks import scan

        n = seg.control.committed
        return np.flatnonzero(scan(seg.header, seg.layout, seg.stamps, seg.view, 0, n))

    def _close_durable(self, seg: Segment) -> None:
        seg.close_durable(seg.control.committed)
        self._closed.append(seg)  # catalogued by the writer's thread (list.append: no system call)

    def _background(self, job: Any, *args: Any) -> None:
        if fs.recording():  # a crash-state recorder (tests) sees the file work in one order
            job(*args)
            return
        if self._syncer is None:
            self._syncer = ThreadPoolExecutor(1, thread_name_prefix=f"mmreplay-sync-w{self.writer_id}")
        try:
            self._syncs.append(self._syncer.submit(job, *args))
        except RuntimeError:  # interpreter shutdown (a writer closed at exit): no new threads
            job(*args)

    def _reap(self) -> None:
        try:
            self.files.doomed.reap()
        except OSError as exc:  # the .deleted files stay; recovery removes them at the next open
            log.warning("%s: could not remove evicted segment files: %s", self.files.path, exc)

    def _catalogue_closed(self) -> None:
        done = []
        while self._closed:  # (popleft and the background thread's append are atomic)
            done.append(self._closed.popleft())
        if done:
            self._catalogue(*done)

    def _catalogue(self, *segs: Segment) -> None:
        """Catalogue closed segments as sealed (from then on a file missing is a loss), with their
        file identities as checked where the check at seal found every row intact (``checks.py``),
        after the last write to each file: one catalog line. A segment whose check found changed
        rows gets a ``checked`` line naming them instead (every reader masks them), a warning, and
        the store handle is told (its reader masks them too)."""
        from .checks import to_ranges

        rows, idents, damaged = {}, {}, {}
        for seg in segs:
            name = seg.path.name
            bad = self._bad.pop(name, None)
            try:
                ident = identity(os.stat(seg.path))
            except OSError:  # evicted already: nothing to catalogue
                continue
            rows[name] = seg.control.committed
            if bad is None:
                self._unchecked.append((seg.path, seg.control.committed))
            elif len(bad):
                damaged[name] = (ident, bad)
            elif bad is not None:
                idents[name] = ident
        try:
            if rows:
                self.files.catalog_sealed(rows, idents)
            for name, (ident, bad) in damaged.items():
                self.files.catalog.checked(name, ident, to_ranges(bad))
        except OSError:  # the catalog cannot be written: readers check these segments themselves
            pass
        for name, (_, bad) in damaged.items():
            log.warning("%s: %d row(s) changed in the file after this writer wrote them (they fail their "
                        "checksums at seal); masked: left out of every batch (`mmreplay verify` lists them)",
                        self.files.segments_dir / name, len(bad))
            if self.damaged_here is not None:
                self.damaged_here(name, bad)

    def wait(self) -> None:
        """Wait for background syncs and catalogue what they closed; re-raise the first error one
        of them hit."""
        syncs, self._syncs = self._syncs, []
        try:
            for f in syncs:
                exc = f.exception()
                if exc is not None:
                    raise exc
        finally:
            self._catalogue_closed()

    def sync_closed(self) -> None:
        """Make the sealed segments this session closed without a sync (``durability="process"``)
        durable, and their directory entries (``flush()``: every row written so far survives a power
        loss, the sealed segments' as well as the open one's)."""
        self.wait()
        done, self._volatile = self._volatile, []
        if any([Segment.sync_closed(path, n) for path, n in done]):
            fsync_dir(self.files.segments_dir)

    def discard(self, segs: Segments) -> None:
        """Delete segments that never held a row (``.deleted`` rename first, like eviction)."""
        for seg in segs:
            path = self._faulted(seg).path
            seg.close()
            doomed = path.with_name(path.name + ".deleted")
            fs.rename(path, doomed)
            fs.unlink(doomed)  # another process opening the store may finish a .deleted first
        if segs:
            fsync_dir(segs[0].path.parent)

    def close(self) -> None:
        """Wait for syncs, delete unused spare segments, stop the threads."""
        try:
            if self._syncer is not None:
                self._syncer.shutdown(wait=True)
            self.wait()
            self.files.doomed.reap()
            self._check_unchecked()
        finally:
            self.drop_spares()
            if self._faulter is not None:
                self._faulter.shutdown(wait=True)

    def _check_unchecked(self) -> None:
        """At close: the segments this writer catalogued without a check at seal (numba was not loaded
        in its process), when they hold more than ``SYNC_CHECK_BYTES``, are checked now, one per core,
        while their pages are still cached, and the checks are catalogued: else every read-only open
        (which records nothing) checks them again, and a big store's ``open_store(mode="r")`` spends
        its first seconds or minutes reading the whole store. Fewer rows are left to the first reader
        (milliseconds)."""
        from .checks import SYNC_CHECK_BYTES, Checker, CheckJob

        todo, self._unchecked = self._unchecked, []
        if sum(rows for _, rows in todo) * self.files.layout.record_bytes <= SYNC_CHECK_BYTES:
            return
        f = self.files  # the readers' checker, recording in the catalog: evicted or unreadable files are left out
        checker = Checker(f.segments_dir, f.layout, f.store_uuid, f.schema.hash, f.catalog, writable=True)
        try:
            checker.submit([CheckJob(path.name, rows) for path, rows in todo])
            checker.wait()
            for name, (ident, bad) in checker.take_done().items():
                if ident is not None and len(bad):
                    log.warning("%s: %d row(s) changed in the file after this writer wrote them (they fail their "
                                "checksums); masked: left out of every batch (`mmreplay verify` lists them)",
                                f.segment_path(name), len(bad))
        finally:
            checker.close()

    def drop_spares(self) -> None:
        """Delete the segments made ahead of need (the next roll then makes one on the spot)."""
        try:
            self._collect()
        except Exception:  # noqa: S110 - a spare that failed to be made holds no data
            pass
        while self._ready:
            self.discard(self._ready.popleft())
