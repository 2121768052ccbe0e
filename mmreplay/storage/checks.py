"""Checks of sealed segments: find damaged rows once per file, remember them, keep them out.

A sealed segment never changes, so it is checked once: every commit group's stamps and crc32c
(``check_kernel``), one sequential read of its records. The result is remembered for the file's
**identity** (inode, size, mtime and ctime in ns: any write to the file or a copy of it changes
it): in the catalog (``catalog.py``) when the process may write there, else in memory. A
writer's own segments count as checked while their identity is the one recorded when the writer
closed them (it checksummed every row it wrote); a copied, moved or modified file, a segment
sealed by recovery or ingested, or one written before checks existed is checked by the first
reader that maps it.

Invariants:

* a reader never serves a row of a sealed segment it has not checked: until then the segment is
  left out of its snapshot (checked at once when the pending bytes are few, else by
  ``Checker``'s background thread; ``ReplayStore.wait_checked`` waits for it). Rows of a live
  writer's open segment are served as their writer published them (the writer computed their
  checksums from the bytes it wrote, and they are in the page cache); an open segment whose writer
  is dead when a reader first maps it (no process holds its writer lock: killed, or gone with a
  power loss that may have torn what it published) is checked like a sealed one before any of
  its rows is served, and its check is not remembered (recovery seals it);
* damaged rows are **masked** one by one (format 2 segments: a failed commit group crc is located
  by the row digests, ``format.py``; format 1 segments: a whole commit group, the rows one
  append published): their bytes stay in the file, excluded from every view, and every
  transition or window that needs one is left out, never shortened or clamped (``damage_patch``);
* the check never changes the file: exclusion is a patch of the reader's private copy-on-write
  view of it.

What a check does not catch: a file damaged after it was checked without a write through the
filesystem (media decay under an unchanged identity). ``mmreplay verify`` reads everything again.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .format import IS_LAST, MASKED, STAMP_DTYPE, Header, Layout, digest_multipliers, kernel

if TYPE_CHECKING:
    from .catalog import Catalog

log = logging.getLogger(__name__)

SYNC_CHECK_BYTES = 64 << 20
"""Pending checks up to this many bytes run in the refreshing thread (about 0.1 s from a cold
disk of this machine kind); more go to the background thread."""

def identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """The identity a check is remembered for: inode, size, mtime and ctime (ns)."""
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _seed(h: Header) -> np.ndarray:
    s = np.zeros(56, np.uint8)
    s[:16] = np.frombuffer(h.store_uuid, np.uint8)
    s[16:24] = np.frombuffer(np.uint64(h.segment_id).tobytes(), np.uint8)
    s[40:48] = np.frombuffer(np.uint64(h.session_epoch).tobytes(), np.uint8)
    return s


def scan(h: Header, layout: Layout, stamps: np.ndarray, data: Any, start: int, stop: int, *,
         first_only: bool = False) -> np.ndarray | int:
    """Damaged rows of ``[start, stop)`` as a bool mask over the segment's slots, or with
    ``first_only`` the first slot of the first group not proven intact (``stop`` if none).
    ``stamps``: the segment's stamp column; ``data``: a buffer of the whole file."""
    if first_only:
        return int(_scan(h, layout, stamps, data, start, stop, True)[0])
    return scan_rows(h, layout, stamps, data, start, stop)[0]


def scan_rows(h: Header, layout: Layout, stamps: np.ndarray, data: Any, start: int, stop: int, *,
              fix: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(damaged, stamp_damaged, fixes)``: bool masks over the slots of the rows of ``[start,
    stop)`` whose records cannot be trusted (left out), and of the other rows whose own stamp is
    damaged although their commit group's crc32c proves their records intact (kept; ``verify``
    reports them); with ``fix``, the stamps those rows should hold (uint64 ``(slots, 2)``, as
    the writer stamped them: ``verify --repair`` writes them back)."""
    fixes = np.zeros((layout.segment_records if fix else 0, 2), np.uint64)
    _, bad = _scan(h, layout, stamps, data, start, stop, False, fixes)
    return bad == 1, bad == 2, fixes if fix else None


def _scan(h: Header, layout: Layout, stamps: np.ndarray, data: Any, start: int, stop: int,
          first_only: bool, fix: np.ndarray | None = None) -> tuple[int, np.ndarray]:
    k = kernel()
    buf = np.frombuffer(data, np.uint8)
    bad = np.zeros(layout.segment_records, np.uint8)
    mults = digest_multipliers(-(-layout.record_bytes // 8))
    words = buf[: len(buf) // 8 * 8].view("<u8")
    out = k.scan_groups(stamps["seq"], stamps["crc"], stamps["glen"], buf, words, layout.records_offset, layout.record_bytes,
                        h.first_seq, h.usable_records, start, stop, _seed(h), k.TABLE, bad, first_only,
                        h.format_version >= 2, mults, np.zeros((0, 2), np.uint64) if fix is None else fix)
    return int(out), bad


def to_ranges(slots: np.ndarray) -> tuple[tuple[int, int], ...]:
    """Sorted slots as ``[start, stop)`` runs."""
    if len(slots) == 0:
        return ()
    cut = np.flatnonzero(np.diff(slots) != 1) + 1
    starts = np.concatenate([slots[:1], slots[cut]])
    stops = np.concatenate([slots[cut - 1] + 1, slots[-1:] + 1])
    return tuple((int(a), int(b)) for a, b in zip(starts, stops))


def from_ranges(ranges: tuple[tuple[int, int], ...]) -> np.ndarray:
    """``[start, stop)`` runs as sorted slots."""
    if not ranges:
        return np.zeros(0, np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in ranges])


@dataclass(frozen=True, slots=True)
class DamagePatch:
    """How damaged rows are kept out of every view of a segment: they are **masked**."""

    zero: np.ndarray
    """The masked slots (sorted): in the reader's copy-on-write view their records are zeroed
    and their ``is_last`` byte is ``format.MASKED``. Nothing else changes: no episode boundary is
    made up around them. A masked row starts nothing, and every window that needs it (the next
    row of a transition, an n-step window, a frame stack, a sequence) is left out by the view
    kernels, which test that byte; the rows around it keep their own flags."""


def damage_patch(bad: np.ndarray, lanes: int = 1) -> DamagePatch:
    """The patch for damaged ``bad`` slots of a segment (``lanes``: kept for callers that pass
    it; the patch no longer depends on the layout of lanes)."""
    return DamagePatch(np.unique(np.asarray(bad, np.int64)))


def apply_patch(p: DamagePatch, layout: Layout, buf: np.ndarray) -> None:
    """Zero the masked records of a segment file's bytes ``buf`` and set their ``is_last`` byte to
    ``MASKED``."""
    recs = buf[layout.records_offset : layout.records_offset + layout.segment_records * layout.record_bytes]
    recs.reshape(layout.segment_records, layout.record_bytes)[p.zero] = 0
    buf[layout.column(IS_LAST).offset + p.zero * layout.record_bytes] = MASKED


def check_file(path: Path, layout: Layout, store_uuid: bytes, schema_hash: int,
               committed: int) -> tuple[tuple[int, int, int, int], np.ndarray]:
    """Check the first ``committed`` rows of segment file ``path``: ``(identity, damaged slots)``.
    Raises ``CorruptSegmentError`` for a damaged header or size, ``FileNotFoundError`` if gone."""
    from .segment import Segment

    seg = Segment.open_rw(path, layout, store_uuid, schema_hash, writable=False)
    try:
        os.posix_fadvise(seg.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)  # the whole file read ahead at once
        ident = identity(os.fstat(seg.fileno()))
        return ident, check_view(seg.header, layout, seg.bytes, committed)
    finally:
        seg.close()


def check_view(h: Header, layout: Layout, view: np.ndarray, committed: int) -> np.ndarray:
    """Damaged slots of the first ``committed`` rows of a segment whose whole file is mapped at
    ``view`` (uint8; its header ``h`` read and checked already): ``check_file`` on a mapping the
    caller holds."""
    stamps = np.ndarray((layout.segment_records,), STAMP_DTYPE, buffer=view, offset=layout.stamps_offset)
    n = min(committed, h.usable_records)
    return np.flatnonzero(scan(h, layout, stamps, view, 0, n)).astype(np.int64)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity): the threads a whole-store pass uses."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


CHECK_THREADS = max(1, min(usable_cores(), 8))
"""Threads of a handle's background checker (one per core, at most 8)."""


@dataclass(slots=True)
class CheckJob:
    name: str
    committed: int
    sealed: bool = True
    """A sealed segment (its check is remembered in the catalog); else a dead writer's open one."""
    mapped: tuple[Header, np.ndarray, tuple[int, ...]] | None = None
    """``(header, bytes, identity when mapped)`` of the caller's own shared mapping of the whole
    file, held for the check (``run_all`` only): checked in place while the file at that name is
    still that inode at that size (else read from the file), with no second mapping, and the pages
    the check reads are then mapped for the caller's next reads. The identity recorded is the
    file's at the check, taken before its bytes are read."""


class Checker:
    """A store handle's checks: what the catalog remembers, what this process found, and the
    background thread that checks large backlogs."""

    def __init__(self, segments_dir: Path, layout: Layout, store_uuid: bytes, schema_hash: int,
                 catalog: Catalog, *, writable: bool) -> None:
        self.dir = segments_dir
        self.layout = layout
        self.store_uuid = store_uuid
        self.schema_hash = schema_hash
        self.catalog = catalog
        self.writable = writable
        """Results are recorded in the catalog (else only in this process's memory)."""
        self._records: dict[str, Any] = {}
        self._live: dict[str, int] = {}
        self._catalog_size: tuple[int, int] = (-1, -1)  # (inode, size) of the catalog when last read
        self._running = 0  # jobs being checked now
        self._cv = threading.Condition()
        self._queue: list[CheckJob] = []
        self._done: dict[str, tuple[tuple[int, ...] | None, np.ndarray | str]] = {}
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.checked = 0
        """Segments this handle checked by reading them."""
        self.written: set[str] = set()
        """Segments a writer of this handle sealed (``written_here``)."""
        self._seal_damage: dict[str, np.ndarray] = {}

    def written_here(self, name: str) -> None:
        """Segment ``name`` was sealed by a writer of this store handle, which checksummed every
        row as it wrote it: this handle serves it without reading it again, also before the
        writer's durable close has catalogued it as checked (a trainer's first sample after its
        learning-starts steps would otherwise check the last few segments)."""
        self.written.add(name)

    def written_damaged(self, name: str, bad: np.ndarray) -> None:
        """A writer of this handle found rows of segment ``name`` changed in the file when it sealed
        it (``segment_supply.py``): this handle's reader masks them at its next refresh."""
        with self._cv:
            self.written.discard(name)
            self._seal_damage[name] = np.asarray(bad, np.int64)

    def take_seal_damage(self) -> dict[str, np.ndarray]:
        """What ``written_damaged`` was told since the last call."""
        with self._cv:
            out, self._seal_damage = self._seal_damage, {}
        return out

    def known(self, name: str, ident: tuple[int, ...]) -> np.ndarray | None:
        """Damaged slots of segment ``name`` if a check of this very file is remembered, else None."""
        if name in self.written:
            return from_ranges(())
        if name not in self._records:
            self._reread()
        rec = self._records.get(name)
        if rec is None or tuple(rec.identity) != tuple(ident):
            return None
        return np.union1d(from_ranges(rec.bad), from_ranges(rec.torn))  # torn rows (recovery's) are left out too

    def _reread(self) -> None:
        """Read the catalog again if someone appended to it or compacted it since."""
        try:
            st = os.stat(self.catalog.path)
            size = (st.st_ino, st.st_size)  # a compaction makes a new file (catalog.py)
        except FileNotFoundError:
            size = (0, 0)
        if size != self._catalog_size:
            state = self.catalog.read() if size[1] else None
            self._records = state.checks if state is not None else {}
            self._live = state.live if state is not None else {}
            self._catalog_size = size

    def catalogued_rows(self, name: str) -> int | None:
        """The rows the catalog records segment ``name`` sealed with (None if it has no record):
        the count of a sealed segment whose control page is damaged."""
        self._reread()
        return self._live.get(name)

    def acknowledged(self, name: str, ident: tuple[int, ...]) -> bool:
        """A repair masked the damaged rows of this very file (``known`` read the catalog)."""
        rec = self._records.get(name)
        return rec is not None and rec.masked and tuple(rec.identity) == tuple(ident)

    def run(self, job: CheckJob) -> tuple[tuple[int, ...] | None, np.ndarray | str]:
        """Check one segment now: ``(identity, damaged slots)``, or ``(None, why)`` if it cannot be read."""
        return self.run_all([job])[0]

    def run_all(self, jobs: list[CheckJob]) -> list[tuple[tuple[int, ...] | None, np.ndarray | str]]:
        """Check these segments now, one per core (the kernel runs without the GIL), and record the
        results from the calling thread, in the jobs' order: what :meth:`run` returns, for each."""
        if len(jobs) > 1 and CHECK_THREADS > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(CHECK_THREADS, len(jobs)), thread_name_prefix="mmreplay-check") as pool:
                found = list(pool.map(self._check, jobs))
        else:
            found = [self._check(job) for job in jobs]
        for job, (ident, bad) in zip(jobs, found):
            if ident is not None:
                self.checked += 1
                if job.sealed:
                    self.record(job.name, ident, bad)  # type: ignore[arg-type]
        return found

    def _check(self, job: CheckJob) -> tuple[tuple[int, ...] | None, np.ndarray | str]:
        from ..core.errors import CorruptSegmentError

        try:
            if job.mapped is not None:
                header, view, mapped_ident = job.mapped
                st = os.stat(self.dir / job.name)  # the identity first, then the bytes (as check_file)
                if (st.st_ino, st.st_size) == tuple(mapped_ident[:2]):  # the file mapped (maybe written since)
                    return identity(st), check_view(header, self.layout, view, job.committed)
            return check_file(self.dir / job.name, self.layout, self.store_uuid, self.schema_hash, job.committed)
        except CorruptSegmentError as exc:
            return None, str(exc)
        except FileNotFoundError:
            return None, "gone"

    def record(self, name: str, ident: tuple[int, ...], bad: np.ndarray) -> None:
        """Remember a check (in the catalog when writable; a reader that cannot write re-checks
        in each process)."""
        if self.writable:
            try:
                self.catalog.checked(name, ident, to_ranges(bad))
            except OSError as exc:  # a full disk or a read-only remount: the result stays in memory
                log.debug("could not record the check of %s: %s", name, exc)

    # -- the background thread ------------------------------------------------------------
    def submit(self, jobs: list[CheckJob]) -> None:
        if any(job.mapped is not None for job in jobs):
            raise ValueError("a background check reads the file itself: a caller's mapping may move meanwhile")
        with self._cv:
            self._queue.extend(jobs)
            self._cv.notify()
            # one thread per core, up to the jobs waiting: the kernel runs without the GIL, so the
            # crc32c of a 2-core machine's two segments at once keeps up with the disk
            while len(self._threads) < min(len(self._queue), CHECK_THREADS):
                t = threading.Thread(target=self._loop, name=f"mmreplay-checker-{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()

    def take_done(self) -> dict[str, tuple[tuple[int, ...] | None, np.ndarray | str]]:
        with self._cv:
            done, self._done = self._done, {}
        return done

    def busy(self) -> bool:
        with self._cv:
            return bool(self._queue) or self._running > 0

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the background queue is empty; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._queue and not self._running, timeout)

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._closed)
                if self._closed:
                    return
                job = self._queue.pop(0)
                nxt = self._queue[0].name if self._queue else None
                self._running += 1
            if nxt is not None:
                self._read_ahead(nxt)  # the disk reads the next file while this one's crcs are computed
            result = self.run(job)
            with self._cv:
                self._done[job.name] = result
                self._running -= 1
                self._cv.notify_all()

    def _read_ahead(self, name: str) -> None:
        try:
            fd = os.open(self.dir / name, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._queue.clear()
            self._cv.notify_all()
        for t in self._threads:
            t.join()
        self._threads = []
