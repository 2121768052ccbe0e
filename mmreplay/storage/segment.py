"""Segment: one fixed-size, preallocated, memory-mapped file written by exactly one writer session.

Invariants kept here:

* a segment file is created as a hidden ``.tmp``, ``posix_fallocate``d to its full size, given
  its header and first control slot, fsynced, then renamed into place (and the directory
  fsynced): a reader never sees a half-made segment, and a full disk is a ``DiskFullError``;
* a file is never truncated nor reused: eviction renames it to ``.deleted`` and unlinks it, so a
  reader still mapping it keeps reading valid bytes;
* ``open_segment_file`` checks magic, version, header crc, store uuid, schema hash and the file
  size **before** mapping, so a short or foreign file is an error, never a SIGBUS;
* publishing writes the control slot not written last, so a torn control write leaves the
  previous, valid one;
* a segment handle (writer, recovery, verify) maps its file ``MADV_SEQUENTIAL``: rows are
  written and scanned in order, read-ahead is welcome, and pages referenced only through
  this mapping are reclaimed early once written back (the learner's reader maps the same file
  with its own hints, ``reader.py``).
"""

from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass
import re
import time
from typing import TYPE_CHECKING

import numpy as np

from .format import (
    CONTROL_CRC_STRUCT,
    CONTROL_OFFSET,
    CONTROL_SLOT_SIZE,
    CONTROL_STRUCT,
    DATA_OFFSET as DATA_OFFSET_PAGE,
    IS_LAST,
    PAGE_SIZE,
    STAMPS,
    STAMP_DTYPE,
    STATE_OPEN,
    STATE_SEALED,
    Control,
    Header,
    Layout,
    crc32c,
    digest_multipliers,
    group_seed,
    SEQ_MASK,
    kernel,
    damaged_control_slots,
    read_control,
    row_digests,
)
from ..core import failpoint as _failpoint
from ..core import fs
from ..core.fs import fallocate, fsync_dir, msync, populate_write
from ..core.errors import CorruptSegmentError

if TYPE_CHECKING:
    from pathlib import Path

_NAME = re.compile(r"^(\d{13})-w(\d{3,})\.seg$")


def segment_name(segment_id: int, writer_id: int) -> str:
    return f"{segment_id:013d}-w{writer_id:03d}.seg"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    """``(segment id, writer id)`` of a segment file's name (``NNNNNNNNNNNNN-wWWW.seg``), else None."""
    m = _NAME.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment of a store as its header and control page say."""

    name: str
    """The file name in ``segments/`` (``parse_segment_name`` reads the ids back)."""
    segment_id: int
    """The segment's id in the store."""
    writer_id: int
    """The id of the writer session that made it."""
    lanes: int
    """The lanes of that session, interleaved row by row (1 for a lane segment)."""
    session_epoch: int
    """The random number naming the writer session the segment belongs to."""
    chain_index: int
    """The segment's place in its session: 0 for the first."""
    first_seq: int
    """The writer-session row number of the segment's slot 0."""
    usable_records: int
    """Rows the segment can hold."""
    committed: int
    """Rows committed (published) in it."""
    sealed: bool
    """Whether it is sealed (immutable); otherwise a writer may still append."""
    created_ns: int
    """When it was made (ns since the epoch)."""


def segment_info(name: str, header: Header, committed: int, sealed: bool) -> SegmentInfo:
    h = header
    return SegmentInfo(name, h.segment_id, h.writer_id, h.lanes, h.session_epoch, h.chain_index, h.first_seq,
                       h.usable_records, int(committed), bool(sealed), h.created_ns)


def segment_state(path: Path) -> tuple[int, int, int]:
    """``(state, committed, synced)`` from a segment's control page (0s if it is gone)."""
    try:
        with open(path, "rb") as fh:
            buf = os.pread(fh.fileno(), 2 * CONTROL_SLOT_SIZE, CONTROL_OFFSET)
    except (FileNotFoundError, IsADirectoryError):
        return 0, 0, 0
    control, _ = read_control(buf)
    return (control.state, control.committed, control.synced) if control else (STATE_OPEN, 0, 0)


def read_segment_meta(fd: int, path: object, layout: Layout, store_uuid: bytes, schema_hash: int) -> tuple[Header, Control | None]:
    """Read and check a segment's header and control page through ``fd`` (no mapping)."""
    size = os.fstat(fd).st_size
    buf = os.pread(fd, 2 * PAGE_SIZE, 0)
    header = Header.unpack(buf, path)
    if header.store_uuid != store_uuid:
        raise CorruptSegmentError(f"{path}: store_uuid mismatch (segment of another store)", kind="foreign")
    if header.schema_hash != schema_hash:
        raise CorruptSegmentError(f"{path}: schema hash mismatch (segment of another schema)", kind="schema")
    if header.segment_records != layout.segment_records or header.file_size != layout.file_size:
        raise CorruptSegmentError(
            f"{path}: layout mismatch: {header.segment_records} records / {header.file_size} bytes, "
            f"store expects {layout.segment_records} / {layout.file_size}", kind="layout"
        )
    if size < header.file_size:
        raise CorruptSegmentError(f"{path}: file is {size} bytes, header says {header.file_size} (truncated)",
                                  kind="short")
    if not 0 < header.lanes <= header.usable_records <= header.segment_records:
        raise CorruptSegmentError(f"{path}: header has lanes={header.lanes}, usable={header.usable_records}",
                                  kind="counts")
    control, _ = read_control(buf[CONTROL_OFFSET : CONTROL_OFFSET + 2 * CONTROL_SLOT_SIZE])
    return header, control


def stamp_column(path: os.PathLike[str] | str, layout: Layout) -> np.ndarray:
    """The stamps a file holds (as many as its size allows; empty if it is gone)."""
    try:
        with open(path, "rb") as fh:
            raw = os.pread(fh.fileno(), 16 * layout.segment_records, layout.stamps_offset)
    except (FileNotFoundError, IsADirectoryError):
        return np.zeros(0, STAMP_DTYPE)
    return np.frombuffer(raw[: len(raw) // 16 * 16], STAMP_DTYPE)


def shows_rows(path: os.PathLike[str] | str, layout: Layout) -> bool:
    """Whether a file's control page (a valid slot with rows, or a damaged slot) or stamps (any row
    number) show a row, read without its header."""
    try:
        with open(path, "rb") as fh:
            page = os.pread(fh.fileno(), 2 * CONTROL_SLOT_SIZE, CONTROL_OFFSET)
    except (FileNotFoundError, IsADirectoryError):
        return False
    if len(page) == 2 * CONTROL_SLOT_SIZE:
        control, _ = read_control(page)
        if (control is not None and control.committed) or damaged_control_slots(page):
            return True  # (a damaged slot held a count: the file was written to)
    return bool(np.any(stamp_column(path, layout)["seq"]))


def never_held_rows(path: os.PathLike[str] | str, layout: Layout) -> bool:
    """Whether a segment file shows no sign of ever holding a row: neither its control page nor its
    stamps show one (``shows_rows``), and its size is one a crash leaves of a creation (empty, or
    the full size), or what it holds is zeros. A file cut short with data left in it is damage:
    not this."""
    try:
        size = os.stat(path).st_size
    except (FileNotFoundError, IsADirectoryError):
        return False
    if shows_rows(path, layout):
        return False
    if size == 0 or size >= layout.file_size:
        return True
    with open(path, "rb") as fh:
        return not any(fh.read(2 * PAGE_SIZE))


class Segment:
    """A mapped segment: the writer's or recovery's read-write handle, or verify's read-only one."""

    def __init__(self, path: Path, fd: int, header: Header, layout: Layout, control: Control, slot: int,
                 *, writable: bool = True) -> None:
        self.path = path
        self.header = header
        self.layout = layout
        self._fd = fd
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        self.mm = mmap.mmap(fd, layout.file_size, mmap.MAP_SHARED, prot)
        self.mm.madvise(mmap.MADV_SEQUENTIAL)
        self.control = control
        self._slot = slot  # index of the control slot holding ``control``
        self.columns: dict[str, np.ndarray] = {
            c.name: np.ndarray((layout.segment_records, *c.shape), c.dtype, buffer=self.mm, offset=c.offset,
                               strides=c.strides())
            for c in layout.columns
        }
        self.stamps = self.columns.pop(STAMPS)
        self.is_last = self.columns.pop(IS_LAST)
        self.records = np.ndarray((layout.segment_records,), layout.record_dtype, buffer=self.mm,
                                  offset=layout.records_offset)
        self._mults = digest_multipliers(-(-layout.record_bytes // 8))
        # the whole file as bytes and as 64-bit words, and the stamps as (rows, 2) words: what the
        # compiled stamping reads and writes (``stamp``)
        self.bytes = np.ndarray((layout.file_size,), np.uint8, buffer=self.mm)
        self.words = np.ndarray((layout.file_size // 8,), np.dtype("<u8"), buffer=self.mm)
        self.stamp_words = np.ndarray((layout.segment_records, 2), np.dtype("<u8"), buffer=self.mm,
                                      offset=layout.stamps_offset)
        # one 2D view per contiguous run of float fields, for finiteness checks of written rows
        self.float_runs = [
            np.ndarray((layout.segment_records, n), dt, buffer=self.mm, offset=layout.records_offset + off,
                       strides=(layout.record_bytes, dt.itemsize))
            for dt, off, n in layout.float_runs
        ]
        self.view = memoryview(self.mm)
        self.dir_synced = False  # the directory entry is known to be on disk

    def stamp(self, start: int, stop: int, tail: int) -> None:
        """Write the stamps of rows ``[start, stop)`` as format 2 has them (their records written
        first): each row's number (low 32 bits) and digest (``format.row_digests``) in word 0,
        ``tail`` (the commit group's crc and length) in word 1. Each word is stored once, whole: a
        reader's visibility probe reads it. One compiled call (``check_kernel.stamp_rows``) once
        numba is loaded in this process (a writer of several lanes loads it when it opens), else
        numpy (~20 ns a row: a single-lane writer's groups are small or rare)."""
        lay, k = self.layout, kernel(load=False)
        if k is not None:
            k.stamp_rows(self.stamp_words, self.bytes, self.words, lay.records_offset, lay.record_bytes,
                         self._mults, self.header.first_seq, start, stop, np.uint64(tail))
            return
        first = self.header.first_seq
        word = np.arange(first + start + 1, first + stop + 1, dtype=np.uint64)
        np.bitwise_and(word, np.uint64(SEQ_MASK), out=word)
        np.bitwise_or(word, row_digests(self.view, lay, start, stop) << np.uint64(32), out=word)
        self.stamp_words[start:stop, 0] = word
        self.stamp_words[start:stop, 1] = tail

    def rows_finite(self, start: int, stop: int) -> bool:
        """Whether rows ``[start, stop)`` hold only finite floats (every float run checked; compiled
        once numba is loaded in this process, as ``stamp``)."""
        k = kernel(load=False)
        for run in self.float_runs:
            if k is not None and run.dtype.itemsize >= 4:
                if not k.rows_finite(run, start, stop):
                    return False
            elif not math.isfinite(float(np.add.reduce(run[start:stop], axis=None, dtype=np.float64).real)):
                return False  # (a finite sum that overflowed sends the step to the full validation)
        return True

    # -- creation -------------------------------------------------------------------------
    @classmethod
    def create(cls, directory: Path, header: Header, layout: Layout, *, durable: bool = False,
               prefault: bool = True) -> Segment:
        """Create, preallocate, stamp and publish a new empty OPEN segment file.

        Without ``durable`` the file and directory are not fsynced here (that would queue behind
        other segments' writeback on the append path); ``make_durable`` does it before any row
        of the segment is counted as synced, and after a crash a segment whose header never
        reached the disk reads as zeros and is removed by recovery as an unfinished creation.
        """
        name = segment_name(header.segment_id, header.writer_id)
        tmp = directory / f".{name}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fallocate(fd, layout.file_size, directory / name)
            if _failpoint.ACTIVE:
                _failpoint.hit("after_fallocate")
            fs.pwrite(fd, header.pack(), 0)
            fs.pwrite(fd, Control(1, 0, 0, STATE_OPEN).pack(), CONTROL_OFFSET)
            if durable:
                fs.fsync(fd)
            if _failpoint.ACTIVE:
                _failpoint.hit("before_rename")
            fs.rename(tmp, directory / name)
        except BaseException:
            os.close(fd)
            fs.unlink(tmp)
            raise
        if durable:
            fsync_dir(directory)
        seg = cls(directory / name, fd, header, layout, Control(1, 0, 0, STATE_OPEN), 0)
        seg.dir_synced = durable
        if prefault:
            seg.prefault()
        return seg

    def prefault(self) -> None:
        """Pre-fault the data pages writable (one call, the GIL released): appends then take no
        page fault per new page. A writer runs it in a background thread for the segment it makes
        ahead of need (``segment_supply.py``), beside the append path, and before it writes the segment."""
        populate_write(self.mm, DATA_OFFSET_PAGE)

    @classmethod
    def open_rw(cls, path: Path, layout: Layout, store_uuid: bytes, schema_hash: int, *, writable: bool = True) -> Segment:
        """Map an existing segment after checking its header and size (never past EOF)."""
        fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
        try:
            header, control = read_segment_meta(fd, path, layout, store_uuid, schema_hash)
            buf = os.pread(fd, 2 * CONTROL_SLOT_SIZE, CONTROL_OFFSET)
            _, slot = read_control(buf)
            return cls(path, fd, header, layout, control or Control(0, 0, 0, STATE_OPEN), slot, writable=writable)
        except BaseException:
            os.close(fd)
            raise

    # -- control --------------------------------------------------------------------------
    def publish(self, committed: int, synced: int | None = None, state: int | None = None, seal_crc: int | None = None) -> None:
        """Write the next control slot: makes rows ``< committed`` visible to readers."""
        c = self.control
        synced = c.synced if synced is None else synced
        state = c.state if state is None else state
        seal_crc = c.seal_crc if seal_crc is None else seal_crc
        slot = 1 - self._slot
        off = CONTROL_OFFSET + slot * CONTROL_SLOT_SIZE
        mm = self.mm
        CONTROL_STRUCT.pack_into(mm, off, c.version + 1, committed, synced, state, seal_crc)
        CONTROL_CRC_STRUCT.pack_into(mm, off + CONTROL_STRUCT.size, crc32c(self.view[off : off + CONTROL_STRUCT.size]))
        self.control, self._slot = Control(c.version + 1, committed, synced, state, seal_crc), slot
        fs.mapped()

    def commit(self, start: int, stop: int, *, durable: bool) -> None:
        """Stamp rows ``[start, stop)`` (their records written) as one commit group and publish
        them: the group's crc over its records, the stamps, then the control slot; ``durable``
        (``durability="batch"``): msynced and published as synced before this returns."""
        k = stop - start
        crc = group_seed(self.header, start, self.header.first_seq + start + 1, k)
        lo, hi = self.layout.records_span(start, stop)
        self.stamp(start, stop, crc32c(self.view[lo:hi], crc) | (k << 32))
        fs.mapped()
        if _failpoint.ACTIVE:
            _failpoint.hit("after_stamps")
        if durable:
            self.publish_durable(start, stop)
        else:
            self.publish(stop)
        if _failpoint.ACTIVE:
            _failpoint.hit("after_publish")

    def seal(self, n: int) -> None:
        """Publish ``n`` rows as the segment's last and mark it SEALED (immutable from now on,
        evictable; catalogued when the writer retires it), with the crc of its stamps."""
        seal_crc = self.stamps_crc(n)
        if _failpoint.ACTIVE:
            _failpoint.hit("mid_seal")
        self.publish(n, state=STATE_SEALED, seal_crc=seal_crc)

    def stamps_crc(self, n: int) -> int:
        """crc32c of the stamps of rows ``[0, n)``: a sealed segment's ``seal_crc``."""
        return crc32c(self.view[self.layout.stamps_offset :][: n * 16])

    def publish_durable(self, start: int, stop: int) -> None:
        """Make rows ``[start, stop)`` durable (``make_durable``), then publish ``stop`` rows as
        committed and synced and msync the control page."""
        self.make_durable(start, stop)
        self.publish(stop, synced=stop)
        self.sync_control()

    def sync_rows(self, start: int, stop: int) -> None:
        """msync the payload, flags and stamps of rows ``[start, stop)`` (before publishing them as synced)."""
        if stop <= start:
            return
        lay = self.layout
        for lo, hi in (lay.records_span(start, stop), (lay.stamps_offset + 16 * start, lay.stamps_offset + 16 * stop)):
            lo = lo // PAGE_SIZE * PAGE_SIZE
            msync(self.mm, lo, hi - lo, self._fd)

    def make_durable(self, start: int, stop: int) -> None:
        """msync rows ``[start, stop)``, fdatasync, and fsync the directory once: after this the
        rows, and the file holding them, survive a power loss (then publish them as synced)."""
        self.sync_rows(start, stop)
        if not self.dir_synced:
            fs.fdatasync(self._fd)
            fsync_dir(self.path.parent)
            self.dir_synced = True

    def sync_control(self) -> None:
        msync(self.mm, CONTROL_OFFSET, PAGE_SIZE, self._fd)

    def fileno(self) -> int:
        return self._fd

    def close_durable(self, n: int) -> None:
        """Close a sealed segment so that its ``n`` rows survive a power loss, then record them
        as synced. The mapping is dropped *before* ``fdatasync`` (here, or earlier by
        :meth:`unmap` on the writer's thread): writing back pages that are still mapped makes the
        kernel write-protect them one by one (TLB shootdowns that stall the appending thread);
        unmapped, the page cache is simply written out."""
        fd = self._fd
        self.unmap()
        fs.fdatasync(fd)
        if not self.dir_synced:
            fsync_dir(self.path.parent)
        c = self.control
        new = Control(c.version + 1, c.committed, n, c.state, c.seal_crc)
        fs.pwrite(fd, new.pack(), CONTROL_OFFSET + (1 - self._slot) * CONTROL_SLOT_SIZE)
        os.close(fd)
        self._fd = -1

    @staticmethod
    def sync_closed(path: Path, n: int) -> bool:
        """Make a sealed segment closed without a sync durable (``fdatasync``), then record its
        ``n`` rows as synced in its control page; False if the file is gone (evicted). The caller
        fsyncs the directory."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fs.fdatasync(fd)
            control, slot = read_control(os.pread(fd, 2 * CONTROL_SLOT_SIZE, CONTROL_OFFSET))
            if control is not None and control.synced < n:
                c = control
                fs.pwrite(fd, Control(c.version + 1, c.committed, n, c.state, c.seal_crc).pack(),
                          CONTROL_OFFSET + (1 - slot) * CONTROL_SLOT_SIZE)
        finally:
            os.close(fd)
        return True

    def unmap(self) -> None:
        """Drop the mapping and its views (the file stays open for ``close_durable``); idempotent."""
        if self.mm.closed or getattr(self, "_unmapped", False):
            return
        self.columns.clear()
        del self.stamps, self.is_last, self.records, self.bytes, self.words, self.stamp_words
        self.float_runs.clear()
        self.view.release()
        self._unmapped = True
        try:
            self.mm.close()
        except BufferError:  # a view is still held elsewhere (the traceback of an exception raised while the
            pass  # rows were read, e.g. Ctrl-C in an export): the mapping goes with the last view

    def close(self, *, fdatasync: bool = False) -> None:
        if self._fd < 0:
            return
        if fdatasync and not self.mm.closed:
            msync(self.mm, 0, self.layout.file_size, self._fd)
        self.unmap()
        if fdatasync:
            fs.fdatasync(self._fd)
        os.close(self._fd)
        self._fd = -1


def now_ns() -> int:
    return time.time_ns()
