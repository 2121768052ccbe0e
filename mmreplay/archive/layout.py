"""The archive's zarr v3 layout: array names, attributes, codecs and the segment table.

``archive.py`` (export, import, open) is written against this module; the layout itself is
described in ``archive.py``'s docstring and, for readers without mmreplay, in the group's
``description`` attribute (``DESCRIPTION`` here). zarr is imported inside the functions.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.errors import ArchiveError, CorruptArchiveError
from ..core.version import __version__

if TYPE_CHECKING:
    from ..core.schema import Schema
    from ..storage import ReplayStore

FORMAT = "mmreplay-archive"
FORMAT_VERSION = 1
TABLE_COLUMNS = ("segment_id", "writer_id", "lanes", "session_epoch", "chain_index", "first_seq",
                 "usable_records", "committed", "state", "created_ns")
COL = {name: i for i, name in enumerate(TABLE_COLUMNS)}  # column index of each name
SEALED, OPEN = 2, 1  # the segment table's ``state`` column
_TABLE_CHUNK = 1024
MASKED_TEXT = ("row failed its checksums in the store (damaged): its fields are zeros, not data; leave out the "
               "episode that holds it")
MARKER = "ARCHIVE.json"  # in an imported store: which archive it came from

_MEANING = {
    "obs": "observation seen at this step; an episode of T actions has T+1 rows, the last one is_last",
    "action": "action taken at this step (zero on an is_last row, which only holds the final observation)",
    "reward": "reward received for this step's action",
    "terminated": "the episode ended after this step by termination (do not bootstrap)",
    "truncated": "the episode was cut after this step (time limit; bootstrap from the next observation)",
}

DESCRIPTION = """\
mmreplay archive (zarr v3). One row per environment step of one lane (one env of a vector env).
Arrays: fields/<name> (one per field, see the 'fields' attribute), is_last, is_first, episode,
masked, segment_table, chunk_crc32c. Only the first committed.segments rows of segment_table and the first
committed.segments * segment_records rows of the other arrays are valid; rows with episode == -1
are padding. A masked row failed its checksums in the store: its fields are zeros, never data;
leave out every episode that holds one (its is_last flag was worked out from the row before it). Episode e is the rows with episode == e, in time order as stored; it holds T+1
observations (its last row is_last, holding the final observation) and T actions, rewards,
terminated and truncated flags (those of its first T rows). Next observation of a row = obs of
the next row of the same episode. An episode whose first row is not is_first began before the
oldest exported row; one whose last row is not is_last was still running. An episode whose last
step (row T-1) is neither terminated nor truncated was cut without a mark (a writer stopped
mid-episode): treat it as truncated. mmreplay collect and train mark the step where a run
ends an episode as truncated themselves. The 'episodes' attribute counts the episodes by how they
ended (terminated, truncated by the env, cut by the end of a run, incomplete: its writer stopped
mid-episode), as 'mmreplay info' counted them in the store; 'episode_ends' per segment id.
chunk_crc32c row i holds, per array named in its 'columns' attribute, the crc32c of the bytes of
segment i's chunk as written (C order, decoded), and of its segment_table row (int64 bytes); a
chunk an object store lost reads as the fill value and does not match: its segment's rows are not
data (-1: not recorded, for segments before the attribute 'first')."""


# -- opening -----------------------------------------------------------------------------------
def open_group(url: str | os.PathLike[str], mode: str, storage_options: dict[str, Any] | None) -> Any:
    import zarr

    from ..core.errors import ObjectStoreError
    from .remote import object_store_error

    kw: dict[str, Any] = {"storage_options": storage_options} if storage_options else {}
    try:
        return zarr.open_group(store=str(url), mode=mode, zarr_format=3, **kw)  # type: ignore[arg-type]
    except FileNotFoundError as exc:
        found = object_store_error(exc)  # (no such bucket: said so, not "no archive")
        if found is None and "://" in str(url):
            found = _missing_bucket(str(url), storage_options)
        if found is not None:
            raise ObjectStoreError(f"{url}: {found[0]}", hint=found[1]) from exc
        raise ArchiveError(f"no archive at {url}") from None


def _missing_bucket(url: str, storage_options: dict[str, Any] | None) -> tuple[str, str] | None:
    """``(message, hint)`` when the bucket (the URL's first path part) of an object-store URL does
    not exist, else None (asked only once an archive was not found)."""
    import fsspec

    try:
        fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        if getattr(fs, "root_marker", "") != "" or fs.exists(root.split("/")[0]):
            return None
    except Exception:  # noqa: BLE001 - the first error (no archive) is the one said
        return None
    return "no such bucket", "create the bucket, or check the URL and AWS_ENDPOINT_URL_S3 (or storage_options)"


def read_meta(g: Any, url: object) -> dict[str, Any]:
    meta = g.attrs.get("mmreplay")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ArchiveError(f"{url} is not an mmreplay archive (no 'mmreplay' attribute)")
    if meta.get("format_version") != FORMAT_VERSION:
        raise ArchiveError(f"{url}: archive format {meta.get('format_version')}, this mmreplay reads {FORMAT_VERSION}",
                           hint="use the mmreplay version that wrote it")
    return meta


def committed_extent(g: Any) -> tuple[int, int]:
    c = g.attrs.get("committed") or {}
    return int(c.get("segments", 0)), int(c.get("rows", 0))


def read_table(g: Any, count: int) -> np.ndarray:
    if count == 0:
        return np.zeros((0, len(TABLE_COLUMNS)), np.int64)
    t = np.asarray(read_rows(g, "segment_table", slice(0, count)), np.int64)
    if t.shape != (count, len(TABLE_COLUMNS)):
        raise CorruptArchiveError(f"segment_table has shape {t.shape}, expected ({count}, {len(TABLE_COLUMNS)})")
    return t


def read_rows(g: Any, name: str, sel: slice) -> np.ndarray:
    try:
        return g[name][sel]
    except ValueError as exc:
        if "checksum" in str(exc):
            raise CorruptArchiveError(f"array {name!r}, rows {sel.start}..{sel.stop}: {exc}") from None
        raise


# -- creating ----------------------------------------------------------------------------------
def _codecs(dtype: np.dtype[Any], clevel: int) -> list[Any]:
    from zarr.codecs import BloscCodec, Crc32cCodec

    blocksize = 0  # blosc's choice
    if dtype == np.bool_:
        shuffle = "bitshuffle"
    elif dtype.itemsize == 1:
        # frames: not shuffled (2-4x smaller than bit-shuffled), and 4 MiB blocks, so that zstd sees
        # ~600 consecutive 84x84 frames at once: on ALE frames 1.5-2.5x smaller *and* faster than
        # blosc's default block size (benchmarks/archive.py)
        shuffle, blocksize = "noshuffle", 4 << 20
    else:
        shuffle = "shuffle"
    return [BloscCodec(typesize=dtype.itemsize, cname="zstd", clevel=clevel, shuffle=shuffle, blocksize=blocksize),
            Crc32cCodec()]


def _field_attrs(schema: Schema) -> dict[str, Any]:
    out = {}
    for f in schema.fields:
        base = "obs" if f.name in schema.obs_names else f.name
        out[f.name] = {"array": f"fields/{f.name}", "dtype": f.dtype.str, "shape": list(f.shape),
                       **({"meaning": _MEANING[base]} if base in _MEANING else {})}
    return out


def create_layout(g: Any, store: ReplayStore, clevel: int) -> None:
    """Make the arrays of a new archive, then its attributes (``committed`` = nothing yet)."""
    R = store.segment_records
    names = set(store.schema.names)
    for f in store.schema.fields:
        if any(n.startswith(f.name + "/") for n in names):
            raise ArchiveError(f"field {f.name!r} is also a prefix of another field; zarr cannot hold both as arrays")
        dims = ["row", *(f"{f.name}_{i}" for i in range(len(f.shape)))]
        g.create_array(f"fields/{f.name}", shape=(0, *f.shape), chunks=(R, *f.shape), dtype=f.dtype,
                       compressors=_codecs(f.dtype, clevel), fill_value=0, dimension_names=dims, overwrite=True,
                       attributes={"field": f.name})
    for name, dt, text in (("is_last", np.dtype(np.bool_), "row is its episode's final observation"),
                           ("is_first", np.dtype(np.bool_), "row starts an episode"),
                           ("episode", np.dtype(np.int64), "episode id (store row id of its first row); -1 = padding"),
                           ("masked", np.dtype(np.bool_), MASKED_TEXT)):
        g.create_array(name, shape=(0,), chunks=(R,), dtype=dt, compressors=_codecs(dt, clevel),
                       fill_value=-1 if name == "episode" else 0, dimension_names=["row"], overwrite=True,
                       attributes={"description": text})
    g.create_array("segment_table", shape=(0, len(TABLE_COLUMNS)), chunks=(_TABLE_CHUNK, len(TABLE_COLUMNS)),
                   dtype=np.int64, compressors=_codecs(np.dtype(np.int64), clevel), fill_value=0,
                   dimension_names=["segment", "column"], overwrite=True,
                   attributes={"columns": list(TABLE_COLUMNS),
                               "description": "one row per archived segment; archive rows [i*R, i*R+committed) are "
                                              "segment i's slots, R = segment_records; state 2 = sealed, 1 = open"})
    add_chunk_manifest(g, store.schema, 0, clevel)
    provenance = store.provenance() if hasattr(store, "provenance") else []
    meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "archive_uuid": uuid.uuid4().hex,
        "source_store_uuid": store.store_uuid.hex(), "schema": store.schema.to_json(),
        "schema_hash": f"{store.schema.hash:016x}", "segment_records": R, "capacity": store.capacity,
        "on_full": store.on_full, "metadata": store.metadata, "provenance": provenance,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "mmreplay_version": __version__,
    }
    g.attrs.update({"mmreplay": json.loads(json.dumps(meta, default=str)), "description": DESCRIPTION,
                    "fields": _field_attrs(store.schema), "segment_records": R,
                    "env": {k: store.metadata[k] for k in ("env_id", "env_spec", "observation_space", "action_space")
                            if k in store.metadata},
                    "committed": {"segments": 0, "rows": 0}})

def add_masked(g: Any, R: int, clevel: int) -> None:
    """Give an archive written before the ``masked`` array one (its damaged rows were archived
    with ``episode == -1``: ``read_masked`` reads them so)."""
    dt = np.dtype(np.bool_)
    a = g.create_array("masked", shape=(0,), chunks=(R,), dtype=dt, compressors=_codecs(dt, clevel), fill_value=0,
                       dimension_names=["row"], attributes={"description": MASKED_TEXT})
    n = g["is_last"].shape[0]
    if n:
        a.resize((n,))
        for lo in range(0, n, R):
            ep = np.asarray(g["episode"][lo : lo + R])
            a[lo : lo + R] = ep == -1  # (padding rows too: beyond committed, never read)


def read_masked(g: Any, sel: slice) -> np.ndarray:
    """The ``masked`` flags of rows ``sel`` (an archive written before that array: rows archived
    with ``episode == -1``, which it gave damaged rows)."""
    if "masked" in g:
        return np.asarray(read_rows(g, "masked", sel), np.bool_)
    return np.asarray(read_rows(g, "episode", sel), np.int64) == -1


# -- the chunk manifest: what each segment wrote ---------------------------------------------------
CHUNKS = "chunk_crc32c"
"""The chunk manifest: one row per archived segment (ordinal), one column per row-chunked array
plus one for the segment's table row, each the crc32c of that chunk's decoded bytes (its table
row's int64 bytes) as the export wrote it; -1: not recorded."""
_ROW_ARRAYS = ("is_last", "is_first", "episode", "masked")
_log_legacy: set[str] = set()


def chunk_columns(schema: Schema) -> list[str]:
    """The manifest's columns: every field's array, ``is_last``, ``is_first``, ``episode``,
    ``masked``, and ``segment_table`` (the segment's table row)."""
    return [*(f"fields/{n}" for n in schema.names), *_ROW_ARRAYS, "segment_table"]


def chunk_crc(a: Any) -> int:
    """crc32c of an array's bytes (C order), as decoded from a chunk."""
    from crc32c import crc32c

    return int(crc32c(memoryview(np.ascontiguousarray(a)).cast("B")))


def add_chunk_manifest(g: Any, schema: Schema, first: int, clevel: int) -> None:
    """Give the archive a chunk manifest recording segments from ordinal ``first`` on (an archive
    written before the manifest records only what is exported into it from now)."""
    cols = chunk_columns(schema)
    dt = np.dtype(np.int64)
    g.create_array(CHUNKS, shape=(0, len(cols)), chunks=(_TABLE_CHUNK, len(cols)), dtype=dt,
                   compressors=_codecs(dt, clevel), fill_value=-1, dimension_names=["segment", "array"], overwrite=True,
                   attributes={"columns": cols, "first": int(first),
                               "description": "crc32c of each array's chunk (decoded) and of the segment table row, "
                                              "per archived segment, as written; -1 = not recorded. A chunk whose "
                                              "data does not match is missing or damaged: its segment's rows are "
                                              "not data"})


class Verifier:
    """Reads an archive's committed segments chunk by chunk, each checked against the chunk
    manifest: a chunk that fails its codec's crc32c (damaged), or whose data does not match what
    the export recorded (missing: zarr returns the fill value; or damaged otherwise), is reported,
    never served. An archive without a manifest (written before it) is read as it is: a missing
    chunk there cannot be told from zeros, which one line says once per archive."""

    def __init__(self, g: Any, url: object, schema: Schema, R: int, count: int, start: int = 0) -> None:
        self.g, self.url, self.R, self.count, self.start = g, str(url), R, count, start
        self.columns = {c: i for i, c in enumerate(chunk_columns(schema))}
        self.first = count  # segments before this ordinal have no manifest row (written before it)
        self.manifest = np.full((max(count - start, 0), len(self.columns)), -1, np.int64)  # ordinals start..count
        self.bad_manifest: set[int] = set()
        if CHUNKS in g:
            a = g[CHUNKS]
            cols = list(a.attrs.get("columns") or [])
            self.first = int(a.attrs.get("first", 0))
            top = min(count, a.shape[0])
            for lo in range(start // _TABLE_CHUNK * _TABLE_CHUNK, top, _TABLE_CHUNK):
                lo, hi = max(lo, start), min(lo + _TABLE_CHUNK, top)
                try:
                    rows = np.asarray(read_rows(g, CHUNKS, slice(lo, hi)), np.int64)
                except CorruptArchiveError:
                    self.bad_manifest.update(range(lo, hi))
                    continue
                for c, i in self.columns.items():
                    if c in cols:
                        self.manifest[lo - start : hi - start, i] = rows[:, cols.index(c)]
        if self.first > 0 and self.url not in _log_legacy:
            _log_legacy.add(self.url)
            import logging

            logging.getLogger(__name__).warning(
                "%s: its first %d segment(s) were archived before chunk checksums: a missing chunk there reads as "
                "zeros and cannot be told from data (export the store again into a new URL to get them)",
                url, min(self.first, count))

    def checked(self, o: int) -> bool:
        """Segment ``o`` has a manifest row to check against."""
        return o >= self.first

    def unverifiable(self, o: int) -> str:
        """Why segment ``o`` cannot be checked though it should be ("" if it can, or predates the manifest)."""
        if not self.checked(o):
            return ""
        if o in self.bad_manifest:
            return f"its chunk manifest row (array {CHUNKS}) fails its crc32c"
        if (self.manifest[o - self.start] < 0).any():
            return f"its chunk manifest row (array {CHUNKS}) is missing"
        return ""

    def table(self) -> tuple[np.ndarray, dict[int, str]]:
        """The segment table's rows ``start..count`` (row ``o - start`` is ordinal ``o``'s) and the
        ordinals whose row cannot be trusted (why)."""
        t = np.zeros((max(self.count - self.start, 0), len(TABLE_COLUMNS)), np.int64)
        bad: dict[int, str] = {}
        for lo in range(self.start // _TABLE_CHUNK * _TABLE_CHUNK, self.count, _TABLE_CHUNK):
            lo, hi = max(lo, self.start), min(lo + _TABLE_CHUNK, self.count)
            try:
                rows = np.asarray(read_rows(self.g, "segment_table", slice(lo, hi)), np.int64)
            except CorruptArchiveError:
                bad.update({o: "its segment table chunk fails its crc32c (damaged)" for o in range(lo, hi)})
                continue
            if rows.shape != (hi - lo, len(TABLE_COLUMNS)):
                bad.update({o: f"its segment table rows have shape {rows.shape}" for o in range(lo, hi)})
                continue
            t[lo - self.start : hi - self.start] = rows
        for o in range(self.start, self.count):
            if o in bad:
                continue
            why = self.unverifiable(o)
            if why:
                bad[o] = why
            elif self.checked(o) and chunk_crc(t[o - self.start]) != self.manifest[o - self.start,
                                                                                  self.columns["segment_table"]]:
                bad[o] = "its segment table row does not match what the export wrote (missing or damaged)"
        return t, bad

    def chunk(self, name: str, o: int) -> tuple[np.ndarray | None, str]:
        """Segment ``o``'s whole chunk of array ``name`` (``R`` rows), or ``(None, why)``."""
        try:
            a = np.asarray(read_rows(self.g, name, slice(o * self.R, (o + 1) * self.R)))
        except CorruptArchiveError:
            return None, f"its chunk of {name} fails its crc32c (damaged)"
        if self.checked(o):
            why = self.unverifiable(o)
            if why:
                return None, why
            want = self.manifest[o - self.start, self.columns[name]]
            if chunk_crc(a) != want:
                return None, f"its chunk of {name} does not match what the export wrote (missing or damaged)"
        return a, ""

    def segment(self, o: int, names: list[str], pool: Any = None) -> tuple[dict[str, np.ndarray], str]:
        """Every array of ``names`` for segment ``o`` (whole chunks), or ``({}, why)`` at the first bad one
        (in ``names`` order). ``pool``: an executor that reads and decodes the chunks at once (blosc and
        the reads run without the GIL)."""
        got = pool.map(lambda name: self.chunk(name, o), names) if pool is not None else (
            self.chunk(name, o) for name in names)
        out = {}
        for name, (a, why) in zip(names, got):
            if a is None:
                return {}, why
            out[name] = a
        return out, ""


def resize_layout(g: Any, schema: Schema, segments: int, R: int) -> None:
    for f in schema.fields:
        a = g[f"fields/{f.name}"]
        if a.shape[0] != segments * R:
            a.resize((segments * R, *f.shape))
    for name in ("is_last", "is_first", "episode", "masked"):
        if g[name].shape[0] != segments * R:
            g[name].resize((segments * R,))
    if g["segment_table"].shape[0] != segments:
        g["segment_table"].resize((segments, len(TABLE_COLUMNS)))
    if CHUNKS in g and g[CHUNKS].shape[0] != segments:
        g[CHUNKS].resize((segments, g[CHUNKS].shape[1]))
