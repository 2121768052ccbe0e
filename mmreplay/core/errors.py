"""The typed error hierarchy of mmreplay.

Every error derives from :class:`MMReplayError` and, where one fits, from the builtin it
refines (``StoreNotFoundError`` is a ``FileNotFoundError``, ``DiskFullError`` an ``OSError``),
so callers can catch either. Each error carries a ``hint``: what to do next.

Every error pickles whole (its type, message, hint, ``kind``, ``errno`` and other attributes; not
its traceback or cause): a collect worker's error reaches the parent as the exception it raised
(``CollectResult.exceptions``).
"""

from __future__ import annotations

import errno as _errno
from typing import Any

__all__ = [
    "ArchiveError",
    "CorruptArchiveError",
    "CorruptSegmentError",
    "CorruptStoreError",
    "DiskFullError",
    "EmptyStoreError",
    "FormatVersionError",
    "InvalidValueError",
    "MMReplayError",
    "ObjectStoreError",
    "RayNotLoopbackError",
    "ReadOnlyStoreError",
    "SchemaError",
    "StoreClosedError",
    "StoreExistsError",
    "StoreFullError",
    "StoreLockedError",
    "StoreNotFoundError",
    "WriterBusyError",
    "WriterFailedError",
]


class MMReplayError(Exception):
    """Base class of every mmreplay error. ``hint`` says what to do next."""

    hint: str = ""
    """What to do next, in one line (each subclass has its own; ``hint=`` replaces it); ``str(error)``
    ends with it."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        if hint is not None:
            self.hint = hint
        super().__init__(message)

    def __str__(self) -> str:
        msg = super().__str__()
        return f"{msg} (hint: {self.hint})" if self.hint else msg

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt from its message, then every attribute set again: a hint given, a subclass's own
        # fields, and an OSError's errno / strerror / filename (slots, which the default leaves out)
        state = dict(self.__dict__)
        if isinstance(self, OSError):
            state.update({k: getattr(self, k) for k in ("errno", "strerror", "filename", "filename2")
                          if getattr(self, k) is not None})
        return type(self), self.args, state


class SchemaError(MMReplayError, ValueError):
    """A batch or a schema does not match: names the field, what was expected and what came."""

    hint = "check the field's dtype and shape against store.schema"


class InvalidValueError(MMReplayError, ValueError):
    """A value is not allowed (NaN or Inf under ``nonfinite='error'``); nothing was written."""

    hint = "fix the value, or open the writer with nonfinite='warn' or 'allow'"


class StoreNotFoundError(MMReplayError, FileNotFoundError):
    """No store at that path."""

    hint = "create one with mmreplay.create_store(path, schema)"


class StoreExistsError(MMReplayError, FileExistsError):
    """``create_store`` on a path that already exists."""

    hint = "open it with mmreplay.open_store(path, mode='a'), or choose a new path"


class CorruptStoreError(MMReplayError):
    """The store manifest (STORE.json) or counters are damaged."""

    hint = "restore STORE.json from a copy; segment files carry their own checksums"


class CorruptSegmentError(MMReplayError):
    """A segment file is damaged: bad header, wrong size, foreign store or failed checksum.

    ``kind`` says which, for recovery's triage: ``"header"`` (magic, checksum), ``"foreign"``
    (a segment of another store), ``"schema"``, ``"layout"``, ``"short"`` (the file is shorter
    than its header says), ``"counts"`` (header fields out of range), ``"rows"`` (a row fails its
    check), or ``""``."""

    hint = "run `mmreplay verify PATH --repair` to quarantine damaged segments"
    kind: str = ""
    """Which damage (see the class docstring): ``"header"``, ``"foreign"``, ``"schema"``, ``"layout"``,
    ``"short"``, ``"counts"``, ``"rows"`` or ``""``."""

    def __init__(self, message: str, *, hint: str | None = None, kind: str = "") -> None:
        super().__init__(message, hint=hint)
        self.kind = kind


class FormatVersionError(CorruptSegmentError):
    """The file was written by an incompatible format version."""

    hint = "open it with the mmreplay version that wrote it, or export and re-import"


class WriterBusyError(MMReplayError, BlockingIOError):
    """Another live writer session holds this writer id."""

    hint = "pass another writer_id=, or leave writer_id=None to take the lowest free one"


class WriterFailedError(MMReplayError):
    """An I/O error of unknown extent stopped this writer; it refuses further appends."""

    hint = "close the writer and open a new one: opening runs recovery"


class StoreLockedError(MMReplayError, BlockingIOError):
    """An admin operation needs the store to itself while writers are active."""

    hint = "close every writer of this store first"


class StoreClosedError(MMReplayError):
    """The store or writer was closed, or is used after fork()."""

    hint = "open the store again in this process (use the 'spawn' start method)"


class ReadOnlyStoreError(MMReplayError, PermissionError):
    """A write was asked of a store opened read-only or on a read-only filesystem."""

    hint = "open the store with mode='a' on a writable filesystem"


class EmptyStoreError(MMReplayError):
    """Sampling asked of a store that has no sampleable transition yet."""

    hint = "write at least two consecutive steps of one lane first, or call refresh()"


class StoreFullError(MMReplayError):
    """The store is at capacity and was created with ``on_full='error'``."""

    hint = "pass a larger capacity= at creation, or on_full='evict'"


class DiskFullError(MMReplayError, OSError):
    """Allocating a segment failed for lack of space (ENOSPC) or a file-size limit (EFBIG)."""

    hint = "free disk space, lower capacity=, or use on_full='evict'"

    def __init__(self, message: str, *, err: int = _errno.ENOSPC, hint: str | None = None) -> None:
        MMReplayError.__init__(self, message, hint=hint)
        self.errno = err
        self.strerror = message


class RayNotLoopbackError(MMReplayError, RuntimeError):
    """A local Ray instance would listen on (or came up on) a non-loopback address; none is left running."""

    hint = "set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before starting Python, or call ray.init() yourself"


class ArchiveError(MMReplayError):
    """An archive cannot be used for this: missing, of another store or format, or conflicting."""

    hint = "check the archive URL; export a store into a new URL"


class ObjectStoreError(ArchiveError):
    """The object store behind an archive's URL refused the credentials, has no such bucket, or
    cannot be reached (``mmreplay.archive.remote``); the message names the archive."""

    hint = "check the URL, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and AWS_ENDPOINT_URL_S3 (or storage_options)"


class CorruptArchiveError(ArchiveError):
    """An archive chunk or its metadata failed its check (crc32c mismatch, inconsistent table)."""

    hint = "export the store again into a new archive, or restore the damaged chunk from a copy"
