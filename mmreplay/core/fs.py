"""Filesystem primitives: every persisting call of the store, preallocation, fsync of
directories, atomic file replacement, and a reserved virtual address range into which segment
files are mapped side by side.

Every call that changes what a store's files hold or name goes through this module: ``pwrite``,
``write`` (appends), ``fallocate``, ``fsync`` / ``fdatasync`` / ``msync``, ``fsync_dir``,
``rename`` / ``replace`` / ``unlink`` / ``mkdir``, ``atomic_write``, and ``mapped`` after writes
through a mapping. Each tells ``RECORDER`` when one is set (tests only:
``mmreplay.testing.crash`` rebuilds from them every state a power loss may leave); with none set
(always, outside the crash-state tests) the cost is one global lookup per call.

Invariants kept here:

* files that will be mapped are allocated with ``posix_fallocate`` (never sparse), so a full disk
  is a catchable ``DiskFullError`` at allocation time and never a SIGBUS on a later write;
* ``atomic_write`` goes temp → fsync → rename → fsync(dir) and unlinks the temp file on any error;
* ``AddressRegion`` only ever maps over its own reservation (``MAP_FIXED`` inside a range it
  reserved with ``PROT_NONE``, aligned to ``HUGE_PAGE``), and puts the reservation back when a
  slot is released; ``move_into`` replaces a slot's mapping by a RAM copy in one ``mremap``, so
  no reader ever sees the slot unmapped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import uuid
from typing import TYPE_CHECKING, Any
from collections.abc import Callable

from .errors import DiskFullError, ReadOnlyStoreError

if TYPE_CHECKING:
    from pathlib import Path

RECORDER: Any = None
"""A crash-state recorder (``mmreplay.testing.crash.Recorder``), set by tests only: its ``point(kind,
target, offset, length)`` is called after every persisting call (``kind``: ``"write"``, ``"sync"``
(``target`` a file descriptor; ``length`` None for the whole file), ``"dirsync"`` (a directory
path) or ``"dir"``), and it may ask for background work to run inline (``inline``)."""


def _tell(kind: str, target: object = None, offset: int = 0, length: int | None = None) -> None:
    r = RECORDER
    if r is not None:
        r.point(kind, target, offset, length)


def recording() -> bool:
    """A crash-state recorder is listening (tests): background file work runs inline, in order."""
    return RECORDER is not None


def pwrite(fd: int, data: bytes, offset: int) -> int:
    n = os.pwrite(fd, data, offset)
    _tell("write")
    return n


def write(fd: int, data: bytes) -> int:
    """One ``write`` (an append on an ``O_APPEND`` descriptor)."""
    n = os.write(fd, data)
    _tell("write")
    return n


def mapped() -> None:
    """Writes through a shared mapping were made (a recorder reads what changed)."""
    _tell("write")


def fsync(fd: int) -> None:
    os.fsync(fd)
    _tell("sync", fd)


def fdatasync(fd: int) -> None:
    os.fdatasync(fd)
    _tell("sync", fd)


def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    os.rename(src, dst)
    _tell("dir")


def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    os.replace(src, dst)
    _tell("dir")


def unlink(path: str | os.PathLike[str], *, missing_ok: bool = True) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        if not missing_ok:
            raise
        return
    _tell("dir")


def mkdir(path: str | os.PathLike[str], *, exist_ok: bool = False) -> None:
    try:
        os.mkdir(path)
    except FileExistsError:
        if not exist_ok:
            raise
        return
    _tell("dir")


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    _tell("dirsync", path)


def fallocate(fd: int, size: int, path: object) -> None:
    """Reserve ``size`` bytes for ``fd`` on disk; ENOSPC/EFBIG become ``DiskFullError``."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise DiskFullError(
                f"cannot allocate {size} bytes for {path}: {os.strerror(exc.errno)}", err=exc.errno
            ) from exc
        raise
    _tell("write")


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, fsync of the directory."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            _tell("write")
            fsync(fd)
        finally:
            os.close(fd)
        replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def writable_error(exc: OSError, what: object) -> Exception:
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return ReadOnlyStoreError(f"cannot write {what}: {os.strerror(exc.errno or 0)}")
    return exc


# -- a reserved address range for side-by-side segment mappings ---------------------------------
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.restype = ctypes.c_int
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value
_MAP_FIXED = 0x10
_PROT_NONE = 0
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
_MAP_ANON = getattr(mmap, "MAP_ANONYMOUS", 0x20)


_MADV_POPULATE_WRITE = 23  # Linux >= 5.14


def populate_write(mm: mmap.mmap, offset: int = 0, length: int | None = None) -> bool:
    """Pre-fault ``mm`` writable (``MADV_POPULATE_WRITE``) so appends do not take a page fault
    per new page; returns False where the kernel lacks it. An ad-hoc timing when it was written
    (no benchmark reproduces it): 32 MiB of first-touch writes took 68 ms through faults, 19 ms
    populate + 2 ms writes; ``python benchmarks/writers.py`` measures appends with it. ctypes releases
    the GIL for the call."""
    import numpy as np

    arr = np.frombuffer(mm, np.uint8)
    try:
        addr = arr.ctypes.data + offset
        n = (len(arr) - offset) if length is None else length
        return _libc.madvise(addr, n, _MADV_POPULATE_WRITE) == 0
    finally:
        del arr


_libc.msync.restype = ctypes.c_int
_libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MS_SYNC = 4


def msync(mm: mmap.mmap, offset: int, length: int, fd: int | None = None) -> None:
    """``msync(MS_SYNC)`` a page-aligned range of ``mm``, releasing the GIL while the disk works
    (``mmap.flush`` holds it, which would stall every other thread of the process). ``fd``: the
    mapped file's descriptor (a recorder marks that range of it durable)."""
    import numpy as np

    arr = np.frombuffer(mm, np.uint8)
    try:
        if _libc.msync(arr.ctypes.data + offset, length, _MS_SYNC) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"msync: {os.strerror(err)}")
    finally:
        del arr
    _tell("sync", fd, offset, length)


# madvise(2) advice values (Linux)
MADV_NORMAL, MADV_RANDOM, MADV_SEQUENTIAL, MADV_WILLNEED, MADV_DONTNEED = 0, 1, 2, 3, 4
MADV_POPULATE_READ = 22  # Linux >= 5.14 (an older kernel refuses it: nothing is mapped ahead)
MADV_HUGEPAGE = 14
HUGE_PAGE = 2 << 20  # x86-64 / arm64 (4 KB pages) PMD size: a transparent huge page
_libc.mremap.restype = ctypes.c_void_p
_libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
_libc.mprotect.restype = ctypes.c_int
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mincore.restype = ctypes.c_int
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_MREMAP_MAYMOVE, _MREMAP_FIXED = 1, 2
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0x8000)


def map_anonymous(length: int, *, huge: bool = False) -> int:
    """A private, read-write anonymous mapping of ``length`` bytes (RAM that the page cache
    cannot take back); its address. Free it with ``unmap`` or move it with
    ``AddressRegion.move_into``.

    ``huge``: aligned to ``HUGE_PAGE`` and ``MADV_HUGEPAGE`` (faulted in as 2 MB pages where
    the kernel allows, which a ``move_into`` to an aligned slot keeps: random reads over many
    GB then miss the TLB far less; an ad-hoc timing when it was written: random 7 KB-record
    gathers over 4 GB ran 1.35x faster; ``python benchmarks/beyond_ram.py`` covers windowed mode). Otherwise pre-faulted (``MAP_POPULATE``)."""
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    if not huge:
        return _check_map(_libc.mmap(None, length, prot, mmap.MAP_PRIVATE | _MAP_ANON | _MAP_POPULATE, -1, 0),
                          "allocating an anonymous mapping")
    raw = _check_map(_libc.mmap(None, length + HUGE_PAGE, prot, mmap.MAP_PRIVATE | _MAP_ANON, -1, 0),
                     "allocating an anonymous mapping")
    addr = -(-raw // HUGE_PAGE) * HUGE_PAGE
    if addr > raw:
        _libc.munmap(raw, addr - raw)
    if raw + HUGE_PAGE > addr:
        _libc.munmap(addr + length, raw + HUGE_PAGE - addr)
    _libc.madvise(addr, length, MADV_HUGEPAGE)
    return addr


def map_private(fd: int, length: int) -> int:
    """A read-only copy-on-write mapping of ``fd``'s first ``length`` bytes, anywhere (for
    ``write_private`` then ``AddressRegion.move_into``)."""
    return _check_map(_libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0), "mapping segment")


def unmap(addr: int, length: int) -> None:
    _libc.munmap(addr, length)


def protect_read(addr: int, length: int) -> None:
    """Make a mapping read-only (a stray write then faults instead of changing a copy)."""
    _libc.mprotect(addr, length, mmap.PROT_READ)


def write_private(addr: int, length: int, fill: Callable[[Any], None]) -> None:
    """Let ``fill`` write into this process's own read-only mapping ``[addr, addr + length)`` (a
    private file mapping or an anonymous copy; never a shared one): ``fill`` gets a writable
    ``uint8`` numpy array over it. The pages are made writable for the call (a private file page
    becomes this process's copy only if written) and read-only again."""
    import numpy as np

    if _libc.mprotect(addr, length, mmap.PROT_READ | mmap.PROT_WRITE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"making a private mapping writable: {os.strerror(err)}")
    try:
        fill(np.frombuffer((ctypes.c_char * length).from_address(addr), np.uint8))
    finally:
        _libc.mprotect(addr, length, mmap.PROT_READ)


def _check_map(addr: int | None, what: str) -> int:
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return addr


class AddressRegion:
    """``slots`` equal-sized windows of virtual memory, each of which can map one file.

    All windows lie back to back, so a numpy array with strides ``(slot_bytes, ...)`` over the
    region addresses a column in every mapped segment at once: one fancy index gathers rows from
    any number of segments. Unmapped windows are ``PROT_NONE`` and must not be read.
    """

    def __init__(self, slots: int, slot_bytes: int) -> None:
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.size = slots * slot_bytes
        # the base is HUGE_PAGE-aligned, so slots whose size is a multiple of it can hold
        # huge-page RAM copies (``move_into`` then moves whole page-table levels)
        raw = _check_map(
            _libc.mmap(None, self.size + HUGE_PAGE, _PROT_NONE, mmap.MAP_PRIVATE | _MAP_ANON | _MAP_NORESERVE, -1, 0),
            "reserving address space",
        )
        self.base = -(-raw // HUGE_PAGE) * HUGE_PAGE
        if self.base > raw:
            _libc.munmap(raw, self.base - raw)
        if raw + HUGE_PAGE > self.base:
            _libc.munmap(self.base + self.size, raw + HUGE_PAGE - self.base)
        self.buffer = (ctypes.c_char * self.size).from_address(self.base)
        self._closed = False

    @property
    def closed(self) -> bool:
        """The region was released (``close``)."""
        return self._closed

    def map_file(self, slot: int, fd: int, length: int, *, writable: bool = False, private: bool = False) -> None:
        """Map the first ``length`` bytes of ``fd`` (shared, read-only unless asked) into ``slot``.
        ``private``: a copy-on-write mapping this process may write to without changing the file
        (pages it writes become its own copies; the others stay shared with the page cache)."""
        if not 0 <= slot < self.slots or length > self.slot_bytes:
            raise ValueError(f"slot {slot} / length {length} outside the region")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable or private else 0)
        flags = (mmap.MAP_PRIVATE if private else mmap.MAP_SHARED) | _MAP_FIXED
        addr = self.base + slot * self.slot_bytes
        got = _check_map(_libc.mmap(addr, length, prot, flags, fd, 0), "mapping segment")
        if got != addr:  # pragma: no cover - MAP_FIXED either lands or fails
            raise OSError(errno.EFAULT, "MAP_FIXED mapped elsewhere")

    def release(self, slot: int, offset: int = 0) -> None:
        """Unmap whatever ``slot`` holds from ``offset`` on and put the PROT_NONE reservation
        back."""
        addr = self.base + slot * self.slot_bytes + offset
        _check_map(
            _libc.mmap(addr, self.slot_bytes - offset, _PROT_NONE,
                       mmap.MAP_PRIVATE | _MAP_ANON | _MAP_NORESERVE | _MAP_FIXED, -1, 0),
            "releasing segment mapping",
        )

    def address(self, slot: int) -> int:
        return self.base + slot * self.slot_bytes

    def advise(self, slot: int, length: int, advice: int, offset: int = 0) -> None:
        """``madvise`` bytes ``[offset, offset + length)`` of ``slot`` (page-aligned outward)."""
        lo = (self.base + slot * self.slot_bytes + offset) // mmap.PAGESIZE * mmap.PAGESIZE
        hi = self.base + slot * self.slot_bytes + offset + length
        _libc.madvise(lo, hi - lo, advice)

    def move_into(self, slot: int, addr: int, length: int) -> None:
        """Move the mapping at ``addr`` (``length`` bytes, e.g. from ``map_anonymous``) into
        ``slot``, atomically replacing what was mapped there (``mremap``): a thread reading the
        slot sees the old pages or the new ones, never a hole."""
        if not 0 <= slot < self.slots or length > self.slot_bytes:
            raise ValueError(f"slot {slot} / length {length} outside the region")
        dst = self.base + slot * self.slot_bytes
        got = _libc.mremap(addr, length, length, _MREMAP_MAYMOVE | _MREMAP_FIXED, dst)
        if got != dst:
            err = ctypes.get_errno()
            raise OSError(err, f"moving a mapping into the region: {os.strerror(err)}")

    def cached_bytes(self, slot: int, length: int) -> int:
        """Bytes of ``slot``'s first ``length`` bytes held in RAM (``mincore``: the page cache
        for a mapped file, the process's memory for an anonymous copy)."""
        import numpy as np

        pages = -(-length // mmap.PAGESIZE)
        vec = np.zeros(pages, np.uint8)
        if _libc.mincore(self.base + slot * self.slot_bytes, length, vec.ctypes.data) != 0:
            return 0
        return int(np.count_nonzero(vec & 1)) * mmap.PAGESIZE

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            _libc.munmap(self.base, self.size)
