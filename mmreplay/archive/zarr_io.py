"""Archive: a store's segments as a zarr v3 group (the cold tier), and back.

``export_archive(store, url)`` copies segments into a zarr v3 group at any fsspec URL (a local
path, ``memory://``, ``s3://`` with s3fs installed, ...); ``import_archive(url, path)`` rebuilds
the store; ``open_archive(url)`` gives a read-only ``ReplayStore`` over it for offline training.

Layout of the group (readable with plain ``zarr.open_group``, see the ``description`` attribute)::

    fields/<name>   one array per schema field, shape (rows, *field_shape)
    is_last         bool: the row is its episode's final observation (T+1 rows per episode)
    is_first        bool: the row starts an episode (False where its start was evicted first)
    episode         int64: id of the row's episode (its first row's store row id); -1 = padding
    masked          bool: the row failed its checksums in the store (damaged): its fields are
                    zeros, never data; an import and ``open_archive`` mask it again
    segment_table   int64 (segments, len(TABLE_COLUMNS)): one row per archived segment
    chunk_crc32c    int64 (segments, arrays + 1): the chunk manifest (crc32c of each chunk's decoded
                    data, and of the segment's table row, as written; -1 = not recorded)

Archive row ``r`` is slot ``r % R`` of the segment in ``segment_table`` row ``r // R``
(``R = segment_records``): every array is chunked ``R`` rows at a time, so **one chunk is one
segment** (blosc zstd, byte- or bit-shuffled for multi-byte and bool fields, not shuffled for
frames, then a crc32c of each chunk). A segment's rows past its ``committed`` count are padding
(``episode == -1``). Rows are in ``(time, lane)`` order within a segment, as in the store.

Invariants kept here:

* **Incremental and resumable.** An export writes only segments the archive lacks (or open
  segments that grew); each segment's chunks and table row are written before the root
  attribute ``committed`` (``{"segments", "rows"}``) that counts it, and readers look at
  ``segment_table[:committed.segments]`` only. New segments are numbered in segment-id order
  from ``committed.segments``, so an interrupted export, run again, writes the same chunks to
  the same places and leaves exactly what an uninterrupted export gives.
* **One source store per archive** (its uuid is recorded): exporting another store into it is
  an ``ArchiveError``. One export at a time per archive: nothing locks an object store, so two
  concurrent exports into one URL are the caller's to prevent.
* **Bit-exact round trip.** ``import_archive`` recreates every archived segment with its
  original segment id, writer id, lanes, session epoch, chain index, first sequence number,
  usable rows, creation time and every field and ``is_last`` byte (and every masked row masked
  again: it is written unstamped, so every check of the new store fails it), in a store with the same
  schema, ``segment_records``, capacity, ``on_full`` and metadata (provenance records too). Row
  ids, lanes, episodes, ``transition_ids()`` and ``transitions()`` are therefore identical.
  Not preserved: the store uuid (a new store gets its own), the commit groups of the row stamps
  (each imported segment is stamped as one group; per-row sequence numbers are kept), and the
  open state (an archived open segment is imported sealed, with the rows it had). Segments
  evicted from the source before they were exported are not in the archive.
* **Read-only training.** ``open_archive`` materialises whole chunks (= whole segments; all of
  them, or the newest ``max_rows``) into a local cache store and opens it ``mode="r"``: the
  samplers (uniform, prioritized, n-step, frame stacks, sequences, windowed mode) run on it
  unchanged and at local-disk speed, and a later call with the same ``cache_dir`` fetches only
  what the archive gained.
* **An archive knows what it holds.** The export records, per segment, the crc32c of each chunk's
  decoded data and of its segment-table row (the ``chunk_crc32c`` array, the chunk manifest;
  ``layout.Verifier``). zarr reads a missing chunk as its array's fill value: every reader
  (import, ``open_archive``, ``field_stats``, ``ingest_archives``, ``verify_archive``) checks each
  chunk against the manifest as well as against its codec's crc32c. A missing or damaged chunk of
  a field, ``is_last``, ``episode`` or ``masked`` costs its segment's rows: imported masked and
  reported by segment and count (``ImportReport.masked``), never zeros served; a segment-table row
  that cannot be trusted costs its segment: skipped and reported (``ImportReport.skipped``). The
  import goes on past them, and a rerun completes what it can. An archive written before the
  manifest is read as it is (one line says a missing chunk cannot be told from zeros there); an
  export into it records the segments it adds.

zarr (and fsspec for URLs) are imported inside the functions: ``import mmreplay`` loads numpy only.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.episodes import LaneCarry, masked_last, row_flags, segment_episodes
from ..core.fs import atomic_write
from ..core.schema import Schema
from ..storage import segment_rows
from .remote import naming
from .layout import (CHUNKS, COL, MARKER, OPEN, SEALED, ArchiveError, CorruptArchiveError, Verifier, add_chunk_manifest,
                     add_masked, chunk_crc, committed_extent, create_layout, open_group, read_meta,
                     read_table, resize_layout)

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..storage import ReplayStore

log = logging.getLogger(__name__)

__all__ = [
    "ArchiveError",
    "ArchiveCheck",
    "ArchiveReport",
    "CorruptArchiveError",
    "ImportReport",
    "export_archive",
    "import_archive",
    "open_archive",
    "verify_archive",
]


@dataclass(frozen=True, slots=True)
class ArchiveReport:
    """What an export did."""

    url: str
    """The archive's URL (or path)."""
    segments_written: int
    """Segments whose chunks this export wrote (new ones and open ones that grew)."""
    rows_written: int
    """Rows this export wrote."""
    segments: int
    """Segments in the archive after the export."""
    rows: int
    """Valid rows in the archive after the export."""
    bytes_raw: int
    """Uncompressed bytes of the chunks this export wrote (padding included)."""
    damaged_rows: int = 0
    """Rows that failed their checksums: archived masked (zeroed, flagged in ``masked``)."""
    episodes_masked: int = 0
    """Episodes holding a masked row (the archive keeps them, marked; episode exports leave them out)."""
    episodes: dict[str, int] | None = None
    """The archive's episodes by how they ended (``terminated``, ``truncated`` by the env, ``cut`` by
    the end of a run, ``incomplete``), as ``mmreplay info`` counts them over the same segments
    (the root attribute ``episodes``; ``None`` without ``terminated`` / ``truncated`` fields)."""


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What an import did."""

    path: str
    """The store's path."""
    segments_written: int
    """Segments this import wrote into the store."""
    rows_written: int
    """Rows this import wrote."""
    segments: int
    """Archived segments now present in the store (written now or earlier)."""
    rows: int
    """Committed rows of the archived segments selected (``max_rows``), imported now or earlier."""
    masked: dict[int, tuple[int, str]] | None = None
    """Segment id -> (rows, why): segments written with every row masked because a chunk of theirs is
    missing or damaged in the archive (their rows are not data; never served)."""
    skipped: dict[int, str] | None = None
    """Archive ordinal -> why: segments not imported because their segment table row cannot be
    trusted (a rerun tries them again)."""

    @property
    def rows_masked(self) -> int:
        """Rows written masked (see ``masked``)."""
        return sum(n for n, _ in (self.masked or {}).values())

    def lines(self) -> list[str]:
        """One line per segment that a missing or damaged chunk cost."""
        out = [f"segment {sid}: {n:,} rows masked: {why}" for sid, (n, why) in sorted((self.masked or {}).items())]
        out += [f"archived segment #{o}: not imported: {why}" for o, why in sorted((self.skipped or {}).items())]
        return out


@dataclass(slots=True)
class _Job:
    sid: int
    name: str
    rows: int
    state: int
    header: Any
    ordinal: int  # -1: a new segment (numbered when written)


def _plan(store: ReplayStore, table: np.ndarray, include_open: bool) -> list[_Job]:
    where = {int(sid): i for i, sid in enumerate(table[:, COL["segment_id"]])}
    jobs = []
    for m in store.segments(unchecked=True):
        if m.committed == 0 or (not m.sealed and not include_open):
            continue
        state = SEALED if m.sealed else OPEN
        o = where.get(m.segment_id, -1)
        if o >= 0 and table[o, COL["committed"]] == m.committed and table[o, COL["state"]] == state:
            continue
        jobs.append(_Job(m.segment_id, m.name, int(m.committed), state, m, o))
    return jobs


def _carry(v: Verifier, table: np.ndarray, cache: dict[tuple[int, int, int], LaneCarry], h: Any,
           R: int) -> LaneCarry | None:
    """The chain predecessor's last row per lane: from this export, else from the archive (its
    chunks checked: a missing or damaged one gives none, as if the chain started here)."""
    if h.chain_index == 0:
        return None
    key = (h.writer_id, h.session_epoch, h.chain_index - 1)
    if key in cache:
        return cache[key]
    t = table
    hit = np.flatnonzero((t[:, COL["writer_id"]] == key[0]) & (t[:, COL["session_epoch"]] == key[1])
                         & (t[:, COL["chain_index"]] == key[2]))
    if len(hit) == 0:
        return None
    o = int(hit[0])
    n, L = int(t[o, COL["committed"]]), int(t[o, COL["lanes"]])
    if n != int(t[o, COL["usable_records"]]) or L != h.lanes:
        return None
    names = ["episode", "is_last", *(f"fields/{f}" for f in ("terminated", "truncated") if f"fields/{f}" in v.g),
             *(["masked"] if "masked" in v.g else [])]
    data, why = v.segment(o, names)
    if why:
        return None
    sel = slice(n - L, n)
    done = np.zeros(L, np.bool_)
    for flag in ("terminated", "truncated"):
        if f"fields/{flag}" in data:
            done |= row_flags(data[f"fields/{flag}"][sel])
    masked = data["masked"][sel] if "masked" in data else np.asarray(data["episode"][sel], np.int64) == -1
    return LaneCarry(np.asarray(data["episode"][sel], np.int64), np.asarray(data["is_last"][sel], np.bool_),
                     done & ~np.asarray(masked, np.bool_))


def export_archive(
    store: ReplayStore | str | os.PathLike[str],
    url: str | os.PathLike[str],
    *,
    include_open: bool = False,
    clevel: int = 3,
    verify: bool = True,
    storage_options: dict[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ArchiveReport:
    """Copy the store's sealed segments (and with ``include_open`` its open ones) into a zarr v3 group.

    Parameters
    ----------
    store
        An open store or a store path (opened read-only). Export takes no lock and writes
        nothing to the store; writers may keep appending.
    url
        Local path or fsspec URL of the archive (created if missing). A second export into the
        same URL appends only what is new; an interrupted one resumes.
    include_open
        Also export the rows published so far in open segments; a later export rewrites them
        when they have grown.
    clevel
        zstd level of the blosc codec (1-9; 3 is the measured sweet spot for Atari frames).
    verify
        Check every row's stamp and crc32c before archiving it. A damaged row (or one the store's
        checks already found) is never archived as it is: it is archived masked (zeroed, flagged
        in ``masked``; no episode boundary is made up around it), and the report counts it and
        the episodes holding one.
    storage_options
        Passed to fsspec for URLs (credentials, endpoints).
    progress
        Called as ``progress(rows_done, rows_total)`` after each segment.

    Raises
    ------
    ArchiveError
        ``url`` holds something else: another store's archive, another format.
    """
    from ..storage import ReplayStore, open_store

    own = not isinstance(store, ReplayStore)
    st = open_store(store, mode="r") if own else store
    try:
        with naming(url):
            return _export(st, url, include_open=include_open, clevel=clevel, verify=verify,
                           storage_options=storage_options, progress=progress)
    finally:
        if own:
            st.close()


def _open_for_export(store: ReplayStore, url: str | os.PathLike[str], storage_options: dict[str, Any] | None,
                     clevel: int) -> Any:
    """The archive group for ``store`` at ``url``: created if new, checked if not."""
    g = open_group(url, "a", storage_options)
    if not isinstance(g.attrs.get("mmreplay"), dict):
        foreign = set(g.keys()) - {"fields", "is_last", "is_first", "episode", "masked", "segment_table"}
        if foreign:  # not an archive whose creation was interrupted: someone else's group
            raise ArchiveError(f"{url} holds a zarr group that is not an mmreplay archive ({sorted(foreign)[:5]})",
                               hint="export into a new URL")
        create_layout(g, store, clevel)
    meta = read_meta(g, url)
    if meta["source_store_uuid"] != store.store_uuid.hex():
        raise ArchiveError(f"{url} archives store {meta['source_store_uuid']}, not {store.store_uuid.hex()} "
                           f"({store.path})", hint="export each store into its own URL")
    if meta["schema_hash"] != f"{store.schema.hash:016x}" or meta["segment_records"] != store.segment_records:
        raise ArchiveError(f"{url}: schema or segment_records differ from {store.path}")
    return g


def _table_row(job: _Job) -> np.ndarray:
    """A segment's row of the segment table."""
    h = job.header
    return np.array([job.sid, h.writer_id, h.lanes, h.session_epoch, h.chain_index, h.first_seq, h.usable_records,
                     job.rows, job.state, h.created_ns], np.int64)


def _write(arrays: dict[str, Any], o: int, R: int, job: _Job, fields: dict[str, np.ndarray], last: np.ndarray,
           ep: np.ndarray, first: np.ndarray, masked: np.ndarray, pool: ThreadPoolExecutor) -> dict[str, int]:
    """Write one segment's chunks at ordinal ``o`` (compressed and written at once, on ``pool``'s
    threads); returns their crc32c by array name (``_write_table_row`` records them)."""
    sel = slice(o * R, (o + 1) * R)
    chunks = {f"fields/{name}": np.asarray(buf, arrays[f"fields/{name}"].dtype) for name, buf in fields.items()}
    chunks.update({"is_last": np.asarray(last, np.bool_), "masked": np.asarray(masked, np.bool_),
                   "is_first": np.pad(np.asarray(first, np.bool_), (0, R - job.rows)),
                   "episode": np.pad(np.asarray(ep, np.int64), (0, R - job.rows), constant_values=-1)})

    def put(name: str) -> int:
        arrays[name][sel] = chunks[name]
        return chunk_crc(chunks[name])

    order = sorted(chunks, key=lambda name: -chunks[name].nbytes)  # the largest first: the others wait for it
    return dict(zip(order, pool.map(put, order)))


def _write_table_row(arrays: dict[str, Any], o: int, trow: np.ndarray, crcs: dict[str, int]) -> None:
    """Write a segment's table row and its chunk manifest row at ordinal ``o``: one segment at a
    time (a chunk of these arrays holds many segments' rows: concurrent writes would lose one)."""
    arrays["segment_table"][o] = trow
    if CHUNKS in arrays:  # what this segment wrote: its readers tell a missing chunk from data by it
        cols = arrays[CHUNKS].attrs["columns"]
        crcs = {**crcs, "segment_table": chunk_crc(trow)}
        arrays[CHUNKS][o] = np.array([crcs[c] for c in cols], np.int64)


def _export(store: ReplayStore, url: str | os.PathLike[str], *, include_open: bool, clevel: int, verify: bool,
            storage_options: dict[str, Any] | None, progress: Callable[[int, int], None] | None) -> ArchiveReport:
    import zarr

    from ..core import failpoint as _failpoint

    if not 1 <= clevel <= 9:
        raise ValueError(f"`clevel` must be in 1..9, got {clevel}")
    store.refresh()
    g = _open_for_export(store, url, storage_options, clevel)
    R = store.segment_records
    if "masked" not in g:  # an archive written before the masked array
        add_masked(g, R, clevel)
    count, rows = committed_extent(g)
    if CHUNKS not in g:  # an archive written before the chunk manifest: it records what is exported from now
        add_chunk_manifest(g, store.schema, count, clevel)
    v = Verifier(g, url, store.schema, R, count)
    table = read_table(g, count)
    jobs = _plan(store, table, include_open)
    resize_layout(g, store.schema, count + sum(1 for j in jobs if j.ordinal < 0), R)
    # every chunk is written whole: skip zarr's scan for all-fill chunks (it cost 3-7x the write)
    with zarr.config.set({"array.write_empty_chunks": True}):
        arrays = {name: g[name] for name in (*(f"fields/{n}" for n in store.schema.names), "is_last", "is_first",
                                              "episode", "masked", "segment_table", CHUNKS)}
    total = sum(j.rows for j in jobs)
    done = written = nbytes = damaged = episodes_masked = 0
    cache: dict[tuple[int, int, int], LaneCarry] = {}
    # a pipeline: this thread reads, checks and splits segment i + 2 into episodes while `commit` compresses and
    # writes segments i and i + 1 (one thread per array: blosc and the file writes run without the GIL); each
    # segment is counted after its own chunks and after the segment before it, as a loop writing one at a time
    # counts them
    depth = 2
    with ThreadPoolExecutor(depth, thread_name_prefix="mmreplay-export") as committer, \
            ThreadPoolExecutor(len(arrays), thread_name_prefix="mmreplay-export-chunk") as chunk_pool:
        inflight: deque[tuple[Any, int]] = deque()

        def commit(o: int, job: _Job, args: tuple[Any, ...], trow: np.ndarray, extent: dict[str, int],
                   before: Any) -> None:
            crcs = _write(arrays, o, R, job, *args, chunk_pool)
            if before is not None:
                before.result()  # the segment before this one is counted first (its error stops this one)
            _write_table_row(arrays, o, trow, crcs)
            if _failpoint.ACTIVE:
                _failpoint.hit("archive_before_commit")
            g.attrs["committed"] = extent  # last: this segment now counts

        def finish() -> None:
            nonlocal written, done
            fut, rows_done = inflight.popleft()
            fut.result()
            written += 1
            done += rows_done
            if progress is not None:
                progress(done, total)

        try:
            for job in jobs:
                data = segment_rows(store, job.header, rows=job.rows, verify=verify)
                if data is None:
                    continue  # evicted since the plan: it was never archived, so nothing refers to it
                h, n = job.header, job.rows
                carry = _carry(v, table, cache, h, R)
                masked = data.masked[:n]
                last = data.is_last.copy()
                last[:n] = masked_last(data.is_last[:n], masked, data.done, lanes=h.lanes, carry=carry)
                ep, first, cache[(h.writer_id, h.session_epoch, h.chain_index)] = segment_episodes(
                    last[:n], segment_id=job.sid, segment_records=R, lanes=h.lanes, chain_index=h.chain_index,
                    carry=carry, done=data.done & ~masked)
                if masked.any():
                    damaged += int(masked.sum())
                    episodes_masked += len(np.unique(ep[masked]))
                fields = data.fields
                o = job.ordinal if job.ordinal >= 0 else count
                trow = _table_row(job)
                nbytes += sum(b.nbytes for b in fields.values())
                if job.ordinal < 0:
                    count, rows, table = count + 1, rows + job.rows, np.concatenate([table, trow[None]])
                else:
                    rows += job.rows - int(table[o, COL["committed"]])
                    table[o] = trow
                while len(inflight) >= depth:
                    finish()
                before = inflight[-1][0] if inflight else None
                inflight.append((committer.submit(commit, o, job, (fields, last, ep, first, data.masked), trow,
                                                  {"segments": count, "rows": rows}, before), job.rows))
            while inflight:
                finish()
        finally:
            for fut, _ in inflight:  # an error above: the segments being written are finished (or fail) first
                fut.exception()
    resize_layout(g, store.schema, count, R)  # drop room reserved for segments evicted meanwhile
    episodes = _record_episode_ends(g, store, table[:count], {j.sid for j in jobs})
    return ArchiveReport(str(url), written, done, count, rows, nbytes, damaged, episodes_masked, episodes)


def _record_episode_ends(g: Any, store: ReplayStore, table: np.ndarray, exported: set[int]) -> dict[str, int] | None:
    """Count the archive's episodes by how they ended, per archived segment as ``info`` counts them
    in the store (``ReplayStore.episode_ends``), into the root attributes ``episode_ends`` (segment
    id -> counts) and ``episodes`` (their sums); returns the sums (``None`` for a schema without
    episode flags). The segments this export wrote are counted again; segments archived earlier keep
    their counts (one the store evicted before it was counted has none: ``episodes_uncounted``)."""
    ends: dict[str, dict[str, int]] = dict(g.attrs.get("episode_ends") or {})
    archived = {int(sid) for sid in table[:, COL["segment_id"]]}
    todo = {sid for sid in archived if sid in exported or str(sid) not in ends}
    fresh = store.episode_ends(todo) if todo else {}
    if not fresh and not ends:
        return None
    before = len(ends)
    ends.update({str(sid): c for sid, c in fresh.items()})
    ends = {k: v for k, v in ends.items() if int(k) in archived}
    total = {"terminated": 0, "truncated": 0, "cut": 0, "incomplete": 0}
    for c in ends.values():
        for k in total:
            total[k] += int(c.get(k, 0))
    if fresh or len(ends) != before:  # an export that wrote nothing writes no attribute either
        g.attrs.update({"episode_ends": ends, "episodes": total,
                        "episodes_uncounted": sorted(archived - {int(k) for k in ends})})
    return total


# -- import ------------------------------------------------------------------------------------
def import_archive(
    url: str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    max_rows: int | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ImportReport:
    """Rebuild the archived store at ``path`` (see the module docstring for what is preserved).

    ``path`` must not exist, or be a store an earlier import of the same archive made: then only
    segments it lacks (or that grew in the archive) are written, so an interrupted import
    resumes. ``max_rows`` imports only the newest segments (by segment id) holding at least that
    many rows. Needs the store to itself (``StoreLockedError`` while a writer is active). Every
    chunk is checked (see the module docstring): a segment a missing or damaged chunk costs is
    written masked (``ImportReport.masked``) or, its table row untrusted, skipped
    (``ImportReport.skipped``), and the import goes on. An object store's error is an
    ``ObjectStoreError`` naming ``url``.
    """
    with naming(url):
        return _import(url, path, max_rows=max_rows, storage_options=storage_options, progress=progress)


def _import(url: str | os.PathLike[str], path: str | os.PathLike[str], *, max_rows: int | None,
            storage_options: dict[str, Any] | None, progress: Callable[[int, int], None] | None) -> ImportReport:
    from ..core import failpoint as _failpoint
    from ..storage import Ingest

    g = open_group(url, "r", storage_options)
    meta = read_meta(g, url)
    count, _ = committed_extent(g)
    R = int(meta["segment_records"])
    v = Verifier(g, url, Schema.from_json(meta["schema"]), R, count)
    table, skipped = v.table()
    for o in range(count):  # a table row that verifies but cannot be a segment's (an archive written before checks)
        n, usable = int(table[o, COL["committed"]]), int(table[o, COL["usable_records"]])
        if o not in skipped and not 0 < n <= usable <= R:
            skipped[o] = f"its segment table row has committed={n}, usable={usable}, segment_records={R}"
    good = [o for o in range(count) if o not in skipped]
    store = _target_store(Path(path), meta, url)
    masked: dict[int, tuple[int, str]] = {}
    # the next two segments' chunks are read, decoded and checked (each array on its own thread: blosc and the
    # reads run without the GIL) while this thread writes one into the store
    chunk_pool = ThreadPoolExecutor(8, thread_name_prefix="mmreplay-import-chunk")
    ahead_pool = ThreadPoolExecutor(2, thread_name_prefix="mmreplay-import")
    try:
        with Ingest(store, exclusive=True, claim=False) as ing:
            todo, have = _import_plan(ing, store, table, max_rows, good)
            total = int(sum(table[o, COL["committed"]] for o in todo))
            done = 0
            names = [*(f"fields/{f.name}" for f in store.schema.fields), "is_last", "episode",
                     *(["masked"] if "masked" in g else [])]  # (before that array: masked rows had episode -1)
            ahead: deque[Any] = deque(ahead_pool.submit(v.segment, o, names, chunk_pool) for o in todo[:2])
            for i, o in enumerate(todo):
                row = table[o]
                n = int(row[COL["committed"]])
                data, why = ahead.popleft().result()
                if i + 2 < len(todo):
                    ahead.append(ahead_pool.submit(v.segment, todo[i + 2], names, chunk_pool))
                if not why and "masked" not in data:
                    data["masked"] = np.asarray(data["episode"], np.int64) == -1
                if why:  # a missing or damaged chunk: the segment's rows are not data; all masked, the rest goes on
                    data = {name: np.zeros((R, *store.schema[name[7:]].shape), store.schema[name[7:]].dtype)
                            for name in names if name.startswith("fields/")}
                    data.update({"is_last": np.zeros(R, np.bool_), "masked": np.ones(R, np.bool_)})
                    masked[int(row[COL["segment_id"]])] = (n, why)
                    log.warning("%s: segment %d: %d rows masked: %s", url, int(row[COL["segment_id"]]), n, why)
                ing.build(segment_id=row[COL["segment_id"]], writer_id=row[COL["writer_id"]], lanes=row[COL["lanes"]],
                          session_epoch=row[COL["session_epoch"]], chain_index=row[COL["chain_index"]],
                          first_seq=row[COL["first_seq"]], usable_records=int(row[COL["usable_records"]]),
                          created_ns=row[COL["created_ns"]],
                          fields={f.name: data[f"fields/{f.name}"][:n] for f in store.schema.fields},
                          is_last=np.asarray(data["is_last"][:n], np.bool_),
                          masked=np.asarray(data["masked"][:n], np.bool_))
                done += n
                if progress is not None:
                    progress(done, total)
                if _failpoint.ACTIVE:
                    _failpoint.hit("import_after_build")
        for o, why in sorted(skipped.items()):
            log.warning("%s: archived segment #%d not imported: %s", url, o, why)
        return ImportReport(str(path), len(todo), done, len(todo) + have,
                            int(sum(table[o, COL["committed"]] for o in _selected(table, max_rows, good))),
                            masked, skipped)
    finally:
        ahead_pool.shutdown(wait=True, cancel_futures=True)
        chunk_pool.shutdown(wait=True, cancel_futures=True)
        store.close()


def _target_store(p: Path, meta: dict[str, Any], url: object) -> ReplayStore:
    """A new store made like the archived one, or an earlier import of this archive."""
    from ..storage import create_store, open_store

    schema = Schema.from_json(meta["schema"])
    if not p.exists():
        store = create_store(p, schema, int(meta["capacity"]), segment_records=int(meta["segment_records"]),
                             on_full=meta.get("on_full", "evict"), metadata=meta.get("metadata") or {})
        atomic_write(p / MARKER, json.dumps({"archive_uuid": meta["archive_uuid"], "url": str(url),
                                             "source_store_uuid": meta["source_store_uuid"]}).encode())
        if hasattr(store, "record_provenance"):
            for rec in meta.get("provenance") or []:
                rec = dict(rec)
                store.record_provenance(rec, rec.pop("name", None))
        return store
    try:
        marker = json.loads((p / MARKER).read_text())
    except (OSError, ValueError):
        marker = {}
    if marker.get("archive_uuid") != meta["archive_uuid"]:
        from ..core.errors import StoreExistsError

        raise StoreExistsError(f"{p} exists and is not an import of {url}",
                               hint="import into a new path (or the path of an earlier import of this archive)")
    return open_store(p, mode="a")


def _selected(table: np.ndarray, max_rows: int | None, good: list[int] | None = None) -> list[int]:
    """Archive ordinals to import (of ``good``, default all): all, or the newest segments holding at
    least ``max_rows`` rows."""
    among = np.arange(len(table)) if good is None else np.asarray(good, np.int64)
    order = [int(among[i]) for i in np.argsort(table[among, COL["segment_id"]], kind="stable")]
    if max_rows is None:
        return [int(o) for o in order]
    out: list[int] = []
    held = 0
    for o in reversed(order):
        if held >= max_rows:
            break
        out.append(int(o))
        held += int(table[o, COL["committed"]])
    return sorted(out, key=lambda o: int(table[o, COL["segment_id"]]))


def _import_plan(ing: Any, store: ReplayStore, table: np.ndarray, max_rows: int | None,
                 good: list[int]) -> tuple[list[int], int]:
    """Ordinals (of ``good``) whose segment the store lacks or holds fewer rows of; and how many are
    there already."""
    todo, have = [], 0
    for o in _selected(table, max_rows, good):
        row = table[o]
        m = ing.segment(int(row[COL["segment_id"]]), int(row[COL["writer_id"]]))
        if m is None:
            todo.append(o)
            continue
        ident = (m.lanes, m.session_epoch, m.chain_index, m.first_seq, m.usable_records)
        want = tuple(int(row[COL[c]]) for c in ("lanes", "session_epoch", "chain_index", "first_seq", "usable_records"))
        if ident != want:
            raise ArchiveError(f"{store.path}: segment {m.name} exists but is not the archived one "
                               "(written after the import?)", hint="import into a new path")
        if m.sealed and m.committed == int(row[COL["committed"]]):
            have += 1
        else:
            todo.append(o)
    return todo, have


@dataclass(frozen=True, slots=True)
class ArchiveCheck:
    """What :func:`verify_archive` found."""

    url: str
    """The archive's URL (or path)."""
    segments: int
    """Committed segments checked."""
    rows: int
    """Committed rows of those segments."""
    problems: list[str]
    """One line per segment a missing or damaged chunk costs (or whose table row cannot be trusted)."""
    notes: list[str]
    """Findings that cost nothing (e.g. segments archived before chunk checksums)."""


def verify_archive(url: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None,
                   progress: Callable[[int, int], None] | None = None) -> ArchiveCheck:
    """Check every chunk of every committed segment of the archive at ``url`` the way readers do
    (its codec's crc32c, and its data against the chunk manifest the export wrote: a missing chunk
    reads as its array's fill value and does not match); reads everything, writes nothing."""
    with naming(url):
        return _verify(url, storage_options, progress)


def _verify(url: str | os.PathLike[str], storage_options: dict[str, Any] | None,
            progress: Callable[[int, int], None] | None) -> ArchiveCheck:
    g = open_group(url, "r", storage_options)
    meta = read_meta(g, url)
    schema = Schema.from_json(meta["schema"])
    count, rows = committed_extent(g)
    R = int(meta["segment_records"])
    v = Verifier(g, url, schema, R, count)
    table, bad = v.table()
    problems = [f"archived segment #{o}: {why}" for o, why in sorted(bad.items())]
    names = [*(f"fields/{f.name}" for f in schema.fields), "is_last", "is_first", "episode",
             *(["masked"] if "masked" in g else [])]
    for o in range(count):
        if o not in bad:
            whys = [why for name in names if (why := v.chunk(name, o)[1])]
            n = int(table[o, COL["committed"]])
            problems += [f"segment {int(table[o, COL['segment_id']])} (#{o}, {n:,} rows): {why}" for why in whys]
        if progress is not None:
            progress(o + 1, count)
    notes = ([f"{min(v.first, count)} segment(s) were archived before chunk checksums: a missing chunk there "
              "reads as zeros and cannot be told from data"] if v.first and count else [])
    return ArchiveCheck(str(url), count, rows, problems, notes)


def open_archive(
    url: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    max_rows: int | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayStore:
    """The archive as a read-only ``ReplayStore`` for offline training with the usual samplers.

    Whole chunks (= whole segments) are materialised into a local store at ``cache_dir`` (a
    temporary directory removed when the returned store is garbage collected or the process
    exits, if ``None``); a later call with the same ``cache_dir`` fetches only segments the
    archive gained. ``max_rows`` keeps only the newest segments holding at least that many rows
    (a window of the archive that fits the local disk).
    """
    from ..storage import open_store

    tmp = None
    if cache_dir is None:
        tmp = tempfile.mkdtemp(prefix="mmreplay-archive-")
        path = Path(tmp) / "store"
    else:
        path = Path(cache_dir)
    try:
        import_archive(url, path, max_rows=max_rows, storage_options=storage_options, progress=progress)
        store = open_store(path, mode="r")
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if tmp is not None:
        weakref.finalize(store, shutil.rmtree, tmp, True)
    return store
