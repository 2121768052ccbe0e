"""Exchange: the one public way rows cross a store's boundary as whole segments.

**In** (:class:`Ingest`): finished rows brought into a store as new, sealed segments, without a
``Writer``. Its users, which translate their rows and call it (importing only public names):

* rebuilding an archived store bit-exactly (``archive.import_archive``): every segment is made
  again with its original segment id, writer id, lanes, session epoch, chain index, first
  sequence number, usable rows and creation time (:meth:`Ingest.build`), so global row ids,
  lanes, chains and therefore ``transition_ids()`` / ``transitions()`` come out identical;
* shipping segments from remote actors into a learner's store (``archive.ingest_archives``):
  new segment ids (:meth:`Ingest.new_segment_id`), the ingest's own writer id, its lock gate;
* importers whose rows carry their own episode ends (:class:`SessionIngest`): a Minari episode
  whose last step is neither terminated nor truncated still ends in a final-observation row,
  which a ``Writer`` only writes at ``close(last_obs=...)``.

**Out** (:func:`segment_rows`): one segment's rows as they are stored, damaged rows masked
(found by this read, or known to the store's checks), for exports (``archive.export_archive``).

Invariants kept here:

* a segment is built whole in ``<store>/ingest.tmp/`` (same filesystem), stamped as commit
  groups (``seq``, digests, crc32c and length exactly as a writer stamps them, so ``verify`` and
  recovery accept it), sealed with ``synced == committed``, fdatasynced, and only then renamed into
  ``segments/`` (replacing a file of the same name atomically) and the directory fsynced:
  readers never see a half-made segment, and a crash leaves at most a stale file in the staging
  directory, which the next ingest removes;
* rows that were masked where they came from are written zeroed and unstamped, so every check
  of the new file (in any copy of it) masks them again;
* every batch is validated against the schema (names, dtypes, shapes) before a byte is written;
* an ingest is a writer session like any other: it holds the admin lock (shared, or exclusive
  to rebuild a store), its own writer-id lock, allocates ids under ``alloc.lock`` and evicts
  like a writer.
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import crc32c as _crc32c
import numpy as np

from .checks import identity, to_ranges
from .format import STATE_SEALED, Header, group_seed
from ..core import fs
from ..core.fs import fsync_dir
from ..core.episodes import row_flags
from ..core.errors import SchemaError, StoreLockedError
from .segment import Segment, SegmentInfo, now_ns, segment_info, segment_name
from . import claims
from .claims import allocating
from .locks import ADMIN, INGEST

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

    from .files import StoreFiles
    from .locks import FileLock
    from .store import ReplayStore

STAGING = "ingest.tmp"


class Ingest:
    """A session that brings finished rows into ``store`` (opened ``mode="a"``) as sealed segments.

    ``exclusive``: hold the admin lock exclusively (no writer may be active: rebuilding a store);
    else shared, beside live writers. ``gate``: also hold the store's ingest lock (one shipping
    ingest at a time). ``claim``: take a writer id of its own (:attr:`writer_id`) for the new
    sessions it builds. Staging leftovers of an interrupted ingest are cleared at start and end;
    the store handle is refreshed at :meth:`close`. Use it as a context manager::

        with Ingest(store) as ing:
            sid = ing.new_segment_id()
            ing.build(segment_id=sid, writer_id=ing.writer_id, lanes=1, session_epoch=epoch,
                      chain_index=0, first_seq=0, usable_records=n, fields=fields, is_last=is_last)
    """

    def __init__(self, store: ReplayStore, *, exclusive: bool = False, gate: bool = False, claim: bool = True,
                 role: str = "ingest") -> None:
        from ..core.errors import ReadOnlyStoreError

        if store.mode != "a":
            raise ReadOnlyStoreError(f"{store.path} was opened with mode='r'; bringing rows in needs mode='a'")
        self.store = store
        """The store the rows go into."""
        self.files = store.files
        """The store's files and the protocol over them (``ReplayStore.files``)."""
        self.writer_id = -1
        """The writer id claimed for the sessions it builds (``claim=True``), else -1."""
        self._locks: list[FileLock] = []
        try:
            if gate:
                g = self.files.lock(INGEST)
                g.acquire(exclusive=True, blocking=True)
                self._locks.append(g)
            admin = self.files.lock(ADMIN)
            if not admin.acquire(exclusive=exclusive):
                what = "has active writers" if exclusive else "is locked for admin work"
                raise StoreLockedError(f"{store.path} {what}")
            self._locks.append(admin)
            if claim:
                self.writer_id, lock = claims.claim_writer_id(self.files, None, role)
                self._locks.append(lock)
            shutil.rmtree(store.path / STAGING, ignore_errors=True)
        except BaseException:
            self._release()
            raise
        self._closed = False

    def _release(self) -> None:
        while self._locks:
            self._locks.pop().release()

    def new_segment_id(self) -> int:
        """A new segment id, after evicting what capacity requires (under the store-wide allocation lock)."""
        with allocating(self.files) as sid:
            return sid

    def segment(self, segment_id: int, writer_id: int) -> SegmentInfo | None:
        """The segment the store holds under that id and writer, or None (``CorruptSegmentError``
        if its header is damaged)."""
        from .segment import read_segment_meta

        name = segment_name(int(segment_id), int(writer_id))
        f = self.files
        try:
            fd = os.open(f.segment_path(name), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            header, control = read_segment_meta(fd, name, f.layout, f.store_uuid, f.schema.hash)
        finally:
            os.close(fd)
        return segment_info(name, header, control.committed if control else 0,
                            control is not None and control.state == STATE_SEALED)

    def build(self, *, segment_id: int, writer_id: int, lanes: int, session_epoch: int, chain_index: int,
              first_seq: int, usable_records: int, fields: Mapping[str, np.ndarray], is_last: np.ndarray,
              masked: np.ndarray | None = None, created_ns: int | None = None) -> Path:
        """Write ``len(is_last)`` rows as a sealed, durable segment with this identity (replacing a
        file of the same name atomically); ``masked``: rows damaged where they came from (written
        zeroed and unstamped: masked again). Returns the segment file's path."""
        f = self.files
        header = Header(
            store_uuid=f.store_uuid, segment_id=int(segment_id), writer_id=int(writer_id), lanes=int(lanes),
            session_epoch=int(session_epoch), chain_index=int(chain_index), first_seq=int(first_seq),
            schema_hash=f.schema.hash, segment_records=f.segment_records, usable_records=int(usable_records),
            file_size=f.layout.file_size, created_ns=now_ns() if created_ns is None else int(created_ns),
        )
        return _build_segment(f, self.store.path / STAGING, header, fields, is_last, masked)

    def close(self) -> None:
        """Clear the staging directory, release the locks and refresh the store handle."""
        if self._closed:
            return
        self._closed = True
        try:
            shutil.rmtree(self.store.path / STAGING, ignore_errors=True)
        finally:
            self._release()
            self.store.refresh()

    def __enter__(self) -> Ingest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _build_segment(f: StoreFiles, stage: Path, header: Header, fields: Mapping[str, np.ndarray],
                   is_last: np.ndarray, masked: np.ndarray | None) -> Path:
    """``Ingest.build`` (see the module docstring for the protocol)."""
    n = len(is_last)
    if not 0 < n <= header.usable_records:
        raise ValueError(f"a segment holds 1..{header.usable_records} rows, got {n}")
    arrays, _ = f.schema.validate_batch(fields, (n,), cast="no", nonfinite="allow")
    fs.mkdir(stage, exist_ok=True)
    name = segment_name(header.segment_id, header.writer_id)
    fs.unlink(stage / name)
    seg = Segment.create(stage, header, f.layout, durable=False)
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
                lo, hi = f.layout.records_span(a, b)
                crc = _crc32c.crc32c(seg.view[lo:hi], crc)
                seg.stamp(a, b, crc | ((b - a) << 32))
        seg.publish(n, synced=n, state=STATE_SEALED, seal_crc=seg.stamps_crc(n))
    except BaseException:
        seg.close()
        fs.unlink(stage / name)
        raise
    seg.close(fdatasync=True)
    fs.rename(stage / name, f.segment_path(name))
    fsync_dir(f.segments_dir)
    try:  # stamped and checksummed here from the rows given: checked (``checks.py``), masked rows masked
        f.catalog.checked(name, identity(os.stat(f.segment_path(name))), to_ranges(bad), masked=bool(len(bad)))
    except OSError:
        pass  # the first reader checks it
    return f.segment_path(name)


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
        """The store the rows go into."""
        self.lanes = int(lanes)
        """Lanes of the session: rows come ``lanes`` at a time, interleaved."""
        self._usable = store.segment_records // self.lanes * self.lanes
        self._epoch = secrets.randbits(63) | 1
        self.rows_written = 0
        """Rows written into sealed segments so far."""
        self.segments_written = 0
        """Segments written so far."""
        self._chain = 0
        self._parts: list[tuple[dict[str, np.ndarray], np.ndarray]] = []
        self._pending = 0
        self._ingest = Ingest(store)
        self.writer_id = self._ingest.writer_id
        """The writer id the session's segments carry (claimed by its ``Ingest``)."""
        self._closed = False

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
        while self._pending >= self._usable:
            self._flush(self._usable)

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
        ing = self._ingest
        ing.build(segment_id=ing.new_segment_id(), writer_id=self.writer_id, lanes=self.lanes,
                  session_epoch=self._epoch, chain_index=self._chain, first_seq=self._chain * self._usable,
                  usable_records=self._usable, fields=fields, is_last=is_last)
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
            self._ingest.close()

    def __enter__(self) -> SessionIngest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class SegmentRows:
    """One segment's rows as stored, padded to ``segment_records`` rows per field."""

    fields: dict[str, np.ndarray]
    """Every schema field, masked rows zeroed."""
    is_last: np.ndarray
    """The file's ``is_last`` flags (bool, ``segment_records``); a masked row's is not to be trusted."""
    masked: np.ndarray
    """Damaged rows (bool, ``segment_records``)."""
    done: np.ndarray
    """Each committed row's terminated-or-truncated flag (bool, ``rows``; False where the schema
    has neither field, and on masked rows)."""


def segment_rows(store: ReplayStore, segment: SegmentInfo, *, rows: int | None = None,
                 verify: bool = True) -> SegmentRows | None:
    """The first ``rows`` (default: its committed count) rows of ``segment`` (from
    ``store.segments()``), or None if it was evicted meanwhile. Damaged rows (found by this read
    with ``verify``, or known to the store's checks) are masked: zeroed and flagged."""
    import mmap

    from .checks import scan

    f = store.files
    R = f.segment_records
    try:
        seg = Segment.open_rw(f.segment_path(segment.name), f.layout, f.store_uuid, f.schema.hash, writable=False)
    except FileNotFoundError:
        return None
    try:
        seg.mm.madvise(mmap.MADV_SEQUENTIAL)
        n = segment.committed if rows is None else int(rows)
        bad, pending = store.reader.damaged_slots(segment.segment_id)
        if verify or pending:
            bad = np.union1d(bad, np.flatnonzero(scan(seg.header, f.layout, seg.stamps, seg.view, 0, n)))
        out = {}
        for fld in f.schema.fields:
            buf = np.zeros((R, *fld.shape), fld.dtype)
            buf[:n] = seg.columns[fld.name][:n]
            buf[bad] = 0
            out[fld.name] = buf
        last = np.zeros(R, np.bool_)
        last[:n] = seg.is_last[:n]
        masked = np.zeros(R, np.bool_)
        masked[bad] = True
        done = np.zeros(n, np.bool_)
        for flag in ("terminated", "truncated"):
            if flag in f.schema:
                done |= row_flags(out[flag][:n])
        return SegmentRows(out, last, masked, done)
    finally:
        seg.close()
