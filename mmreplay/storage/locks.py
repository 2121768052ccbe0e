"""flock-based role locks on small lock files, and the names of the store's locks (the one list).

Locks of a store (``<store>/locks/``): ``ADMIN`` (shared by every writer session, exclusive
for whole-store work: verify --repair, recovery, import), ``ALLOC`` (segment ids, eviction and
allocation), ``INGEST`` (one ingestion of archives at a time), and one ``writer-NNN.lock`` per
writer id (:func:`writer_lock_name`).

``flock`` (not POSIX ``lockf``) is used because it detects a second open in the same process,
survives an unrelated ``close()`` of the same file, and is released by the kernel when the
holding process dies, so a ``kill -9`` never leaves a stale lock. Readers take no locks.
"""

from __future__ import annotations

import fcntl
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path


ADMIN = "admin.lock"
ALLOC = "alloc.lock"
INGEST = "ingest.lock"
LOCK_NAMES = (ADMIN, ALLOC, INGEST)


def writer_lock_name(writer_id: int) -> str:
    """The lock file a writer session holds for its writer id."""
    return f"writer-{writer_id:03d}.lock"


def held_elsewhere(path: Path) -> bool:
    """Whether a live process holds the lock file at ``path`` (a read-only probe: nothing is
    created or written, and the probe's own shared lock is dropped at once). A missing file is
    held by nobody."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class FileLock:
    """One flock on one lock file. ``acquire`` never blocks unless ``blocking=True``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def acquire(self, *, exclusive: bool = True, blocking: bool = False) -> bool:
        """Take the lock; return False (without waiting) if another holder has it."""
        if self.fd is not None:
            raise RuntimeError(f"{self.path} is already held by this object")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if blocking else fcntl.LOCK_NB)
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return True

    def write_owner(self, text: str) -> None:
        """Record diagnostics (pid, start time) in the lock file; never used for locking."""
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, text.encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)  # closing the only fd drops the flock

    @property
    def held(self) -> bool:
        return self.fd is not None

    def __enter__(self) -> FileLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
