"""Ingest: write rows into new, sealed segments of a store directly, without a ``Writer``.

Two users need what a ``Writer`` does not offer:

* rebuilding an archived store bit-exactly (``archive.import_archive``): every segment is made
  again with its original segment id, writer id, lanes, session epoch, chain index, first
  sequence number, usable rows and creation time (:func:`build_segment`), so global row ids,
  lanes, chains and therefore ``transition_ids()`` / ``transitions()`` come out identical;
* importers whose rows carry their own episode ends (:class:`SessionIngest`): a Minari episode
  whose last step is neither terminated nor truncated still ends in a final-observation row,
  which a ``Writer`` only writes at ``close(last_obs=...)``.

Invariants kept here:

* a segment is built whole in ``<store>/ingest.tmp/`` (same filesystem), stamped as one commit
  group (``seq``, crc32c and length exactly as a writer stamps them, so ``verify`` and recovery
  accept it), sealed with ``synced == committed``, fdatasynced, and only then renamed into
  ``segments/`` (replacing a file of the same name atomically) and the directory fsynced:
  readers never see a half-made segment, and a crash leaves at most a stale file in the staging
  directory, which the next ingest removes;
* every batch is validated against the schema (names, dtypes, shapes) before a byte is written;
* :class:`SessionIngest` is a writer session like any other: it holds the admin lock shared and
  its own writer-id lock, allocates ids under ``alloc.lock`` and evicts like a writer.
"""

from __future__ import annotations

import os
import secrets
import shutil
from typing import TYPE_CHECKING, Any

import crc32c as _crc32c
import numpy as np

from .checks import identity, to_ranges
from .format import STATE_SEALED, Header, group_seed
from ..core.fs import fsync_dir
from ..core.errors import SchemaError, StoreLockedError
from .segment import Segment, now_ns, segment_name
from . import claims
from .claims import allocating
from .locks import ADMIN

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from .locks import FileLock
    from .store import ReplayStore

STAGING = "ingest.tmp"


def staging_dir(store: ReplayStore) -> Path:
    """The store's staging directory for segments being built (made on first use)."""
    d = store.path / STAGING
    d.mkdir(exist_ok=True)
    return d


def clear_staging(store: ReplayStore) -> None:
    """Remove what an interrupted ingest left in the staging directory."""
    shutil.rmtree(store.path / STAGING, ignore_errors=True)


def make_header(store: ReplayStore, *, segment_id: int, writer_id: int, lanes: int, session_epoch: int,
                chain_index: int, first_seq: int, usable_records: int, created_ns: int | None = None) -> Header:
    """A segment header for ``store`` (its uuid, schema hash and layout) with the given identity."""
    return Header(
        store_uuid=store.store_uuid, segment_id=int(segment_id), writer_id=int(writer_id), lanes=int(lanes),
        session_epoch=int(session_epoch), chain_index=int(chain_index), first_seq=int(first_seq),
        schema_hash=store.schema.hash, segment_records=store.segment_records, usable_records=int(usable_records),
        file_size=store.layout.file_size, created_ns=now_ns() if created_ns is None else int(created_ns),
    )


def build_segment(store: ReplayStore, header: Header, fields: Mapping[str, np.ndarray], is_last: np.ndarray,
                  masked: np.ndarray | None = None) -> Path:
    """Write ``len(is_last)`` rows as a new sealed, durable segment with ``header``; returns its path.

    ``fields`` holds every schema field with leading dimension ``n`` (rows in the segment's
    ``(time, lane)`` order). An existing segment file of the same name is replaced atomically.
    ``masked``: rows that were damaged in the source (bool, ``n``): they are written zeroed and
    **unstamped**, so every check of this file, in any copy of it, fails them (masked again),
    and recorded in the catalog as masked (acknowledged where they were found). The other rows
    are stamped as commit groups, one per run between masked rows.
    """
    n = len(is_last)
    if not 0 < n <= header.usable_records:
        raise ValueError(f"a segment holds 1..{header.usable_records} rows, got {n}")
    arrays, _ = store.schema.validate_batch(fields, (n,), cast="no", nonfinite="allow")
    stage = staging_dir(store)
    name = segment_name(header.segment_id, header.writer_id)
    (stage / name).unlink(missing_ok=True)
    seg = Segment.create(stage, header, store.layout, durable=False)
    try:
        for key, x in arrays.items():
            seg.columns[key][:n] = x
        seg.is_last[:n] = is_last
        bad = np.flatnonzero(masked) if masked is not None else np.zeros(0, np.int64)
        if len(bad):
            seg.records[bad] = np.zeros(1, seg.records.dtype)
        edges = np.concatenate([[-1], bad, [n]])
        for a, b in zip(edges[:-1] + 1, edges[1:]):  # each run of rows between masked ones: one group
            a, b = int(a), int(b)
            if b > a:
                crc = group_seed(header, a, header.first_seq + a + 1, b - a)
                lo, hi = store.layout.records_span(a, b)
                crc = _crc32c.crc32c(seg.view[lo:hi], crc)
                seg.stamp(a, b, crc | ((b - a) << 32))
        off = store.layout.stamps_offset
        seal_crc = _crc32c.crc32c(seg.view[off : off + 16 * n])
        seg.publish(n, synced=n, state=STATE_SEALED, seal_crc=seal_crc)
    except BaseException:
        seg.close()
        (stage / name).unlink(missing_ok=True)
        raise
    seg.close(fdatasync=True)
    os.rename(stage / name, store.segments_dir / name)
    fsync_dir(store.segments_dir)
    try:  # stamped and checksummed here from the rows given: checked (``checks.py``), masked rows masked
        store.files.catalog.checked(name, identity(os.stat(store.segments_dir / name)), to_ranges(bad), masked=bool(len(bad)))
    except OSError:
        pass  # the first reader checks it
    return store.segments_dir / name


def admin_lock(store: ReplayStore, *, exclusive: bool) -> FileLock:
    """Take the store's admin lock (exclusive: no writer may be active) or raise."""
    lock = store.files.lock(ADMIN)
    if not lock.acquire(exclusive=exclusive):
        what = "has active writers" if exclusive else "is locked for admin work"
        raise StoreLockedError(f"{store.path} {what}")
    return lock


def allocate_segment(store: ReplayStore) -> int:
    """A new segment id, after evicting what capacity requires, under the store-wide allocation lock."""
    with allocating(store.files) as sid:
        return sid


def claim_writer_id(store: ReplayStore, role: str = "ingest") -> tuple[int, FileLock]:
    """Take the lowest free writer id of ``store`` (its lock, held until released) or raise
    ``WriterBusyError``; ``role`` goes into the lock file's owner line."""
    return claims.claim_writer_id(store.files, None, role)


class SessionIngest:
    """A writer session that takes rows with their ``is_last`` flags as given.

    Rows are appended in ``(time, lane)`` order (a multiple of ``lanes`` rows per call) and
    written a whole segment at a time, so a segment becomes visible (sealed) once full, and
    the last partial one at :meth:`close`. A ``kill -9`` loses the rows not yet in a written
    segment; rows already written are durable.
    """

    def __init__(self, store: ReplayStore, lanes: int = 1) -> None:
        if lanes < 1 or lanes > store.segment_records:
            raise ValueError(f"`lanes` must be in [1, {store.segment_records}], got {lanes}")
        self.store = store
        self.lanes = int(lanes)
        self.usable = store.segment_records // self.lanes * self.lanes
        self.epoch = secrets.randbits(63) | 1
        self.rows_written = 0
        self.segments_written = 0
        self._chain = 0
        self._parts: list[tuple[dict[str, np.ndarray], np.ndarray]] = []
        self._pending = 0
        self._admin = admin_lock(store, exclusive=False)
        self._lock: FileLock | None = None
        try:
            self.writer_id = self._claim()
        except BaseException:
            self._admin.release()
            raise
        self._closed = False

    def _claim(self) -> int:
        wid, self._lock = claim_writer_id(self.store, "ingest")
        return wid

    def append(self, fields: Mapping[str, Any], is_last: np.ndarray) -> None:
        """Queue rows (every field with leading dimension ``n``, ``n`` a multiple of ``lanes``)."""
        if self._closed:
            raise ValueError("this ingest session is closed")
        is_last = np.asarray(is_last, np.bool_).reshape(-1)
        n = len(is_last)
        if n % self.lanes:
            raise SchemaError(f"rows come in whole steps of lanes={self.lanes}; got {n} rows")
        arrays, _ = self.store.schema.validate_batch(fields, (n,), cast="no", nonfinite="allow")
        if n == 0:
            return
        self._parts.append((arrays, is_last))
        self._pending += n
        while self._pending >= self.usable:
            self._flush(self.usable)

    def _take(self, k: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The first ``k`` queued rows, concatenated (the rest stay queued)."""
        out: list[tuple[dict[str, np.ndarray], np.ndarray]] = []
        need = k
        while need:
            arrays, last = self._parts[0]
            m = len(last)
            if m <= need:
                out.append(self._parts.pop(0))
                need -= m
            else:
                out.append(({key: a[:need] for key, a in arrays.items()}, last[:need]))
                self._parts[0] = ({key: a[need:] for key, a in arrays.items()}, last[need:])
                need = 0
        self._pending -= k
        if len(out) == 1:
            return out[0]
        names = out[0][0].keys()
        return ({key: np.concatenate([o[0][key] for o in out]) for key in names},
                np.concatenate([o[1] for o in out]))

    def _flush(self, k: int) -> None:
        fields, is_last = self._take(k)
        store = self.store
        sid = allocate_segment(store)
        header = make_header(store, segment_id=sid, writer_id=self.writer_id, lanes=self.lanes,
                             session_epoch=self.epoch, chain_index=self._chain, first_seq=self._chain * self.usable,
                             usable_records=self.usable)
        build_segment(store, header, fields, is_last)
        self._chain += 1
        self.rows_written += k
        self.segments_written += 1

    def close(self) -> None:
        """Write the queued rows as the session's last segment and release the writer id."""
        if self._closed:
            return
        try:
            if self._pending:
                self._flush(self._pending)
        finally:
            self._closed = True
            if self._lock is not None:
                self._lock.release()
            self._admin.release()
            self.store.refresh()

    def __enter__(self) -> SessionIngest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
