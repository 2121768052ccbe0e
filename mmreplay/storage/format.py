"""On-disk constants and layouts: the segment header, the two control slots, column offsets.

A segment file is fixed-size and fully preallocated:

* page 0: immutable header (magic, format version, store uuid, segment id, writer id, lanes,
  session epoch, chain index, first sequence number, schema hash, sizes) with its own crc32c;
* page 1: two 64-byte control slots (LMDB's double meta page): ``version``, ``committed``,
  ``synced``, ``state``, ``seal_crc`` and a crc32c. A writer always writes the slot it did not
  write last, with ``version + 1``; readers take the valid slot with the higher version, so a
  torn control write falls back to the previous one;
* then the rows, as fixed-size records holding every field and the derived ``is_last`` flag
  (see ``Layout``), and, 4096-aligned after them, the stamp column: per row ``seq: u64, crc: u32,
  glen: u32``. ``crc`` is the crc32c of the row's *commit group* (the rows published together:
  one append, or up to ``publish_rows`` single adds), seeded with store uuid, segment id, first
  slot, first seq, session epoch and group length, so torn, stale or misplaced rows fail
  validation; ``glen`` is the group's length. ``seq`` holds the writer-session row number + 1
  (0 = never written): all 64 bits in format 1; in format 2 its low 32 bits, and in the high 32
  bits the row's own digest (``row_digests``).

Why a crc per commit group: one crc32c call per group keeps a batched append vectorized (a
per-row crc32c costs a Python call per row), and a group is all-or-nothing after a crash
(recovery keeps whole groups). Why a row digest too (format 2): a group can be large (an
``add_batch`` of 256 vector steps, an ingested segment), and damage found by the group crc is
then located row by row: only rows whose digest no longer matches are left out (``checks.py``).
The digest is the high half of a multiply-sum of the record's little-endian 64-bit words with
fixed odd multipliers (mod 2**64): one ``numpy.dot`` per group; a change to any one word always
changes the sum (an odd multiplier is invertible), and its high half but for a ~2**-32 chance.
The check computes it in the same pass as the crc32c (``check_kernel``). Format 1 segments
(written before it) are read as they are: damage there is located per commit group.

The layout depends only on the schema and ``segment_records``, so every segment of a
store has the same layout and a reader can view a field across all segments with one strided
array (see ``reader.py``).
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

import crc32c as _crc32c
import numpy as np

from ..core.errors import CorruptSegmentError, FormatVersionError

if TYPE_CHECKING:
    from ..core.schema import Schema

MAGIC = b"MMRSEG\x00\x01"
FORMAT_VERSION = 2  # what new segments are written as
READ_VERSIONS = (1, 2)  # what this mmreplay reads
SEQ_MASK = 0xFFFFFFFF  # format 2: the seq bits of a stamp's ``seq`` field (the digest is above them)
PAGE_SIZE = 4096
"""Bytes of a page: the header fills page 0, the control slots page 1; the stamp column is aligned to it."""
CONTROL_OFFSET = PAGE_SIZE
"""File offset of the two control slots (page 1)."""
CONTROL_SLOT_SIZE = 64
"""Bytes of one control slot."""
DATA_OFFSET = 2 * PAGE_SIZE

STATE_OPEN = 1
STATE_SEALED = 2
STATE_NAMES = {STATE_OPEN: "open", STATE_SEALED: "sealed"}

IS_LAST = "is_last"
MASKED = 2
"""The ``is_last`` byte of a masked row in a reader's patched view (``checks.DamagePatch``): the
row's bytes are present but excluded. Files only ever hold 0 or 1 there; every reader of the
flag tests it as a byte (``== 0``: an ordinary row, ``== 1``: an episode's final observation)."""
STAMPS = "_stamps"
STAMP_DTYPE = np.dtype([("seq", "<u8"), ("crc", "<u4"), ("glen", "<u4")])

_HEADER = struct.Struct("<8sII16sQIIQQQQIIQQ")
_HEADER_CRC = struct.Struct("<I")
HEADER_SIZE = _HEADER.size + _HEADER_CRC.size
"""Bytes of the header at the start of page 0, its crc32c included."""
_CONTROL = struct.Struct("<QQQII24x")
_CONTROL_CRC = struct.Struct("<I4x")
_SEED = struct.Struct("<16sQQQQQ")

assert _CONTROL.size + _CONTROL_CRC.size == CONTROL_SLOT_SIZE


def crc32c(data: bytes | memoryview, crc: int = 0) -> int:
    """crc32c of ``data``, continuing from ``crc``."""
    return _crc32c.crc32c(data, crc)


def align(n: int, to: int = PAGE_SIZE) -> int:
    return -(-n // to) * to


@dataclass(frozen=True, slots=True)
class Column:
    """Where one field lives: row ``i`` starts at ``offset + i * stride``."""

    name: str
    offset: int
    stride: int
    dtype: np.dtype
    shape: tuple[int, ...]

    def strides(self, leading: tuple[int, ...] = ()) -> tuple[int, ...]:
        inner = []
        step = self.dtype.itemsize
        for s in reversed(self.shape):
            inner.insert(0, step)
            step *= s
        return (*leading, self.stride, *inner)


@dataclass(frozen=True, slots=True)
class Layout:
    """Byte layout of a segment file for one schema and ``segment_records``.

    Rows are *records*: every field of a row, plus its ``is_last`` flag, lies in one
    contiguous record (each field aligned to its item size), and records follow each other. A
    random row's fields then share one or two cache lines, which is what bounds random
    sampling from a store larger than the CPU caches (a columnar layout costs one cache miss
    per field per row). One crc32c call covers a commit group's records. The stamps are a
    separate column (16 bytes a row) that only recovery and verification read.
    """

    segment_records: int
    record_bytes: int
    columns: tuple[Column, ...]
    """Every field, then ``is_last``, then ``_stamps``."""
    records_offset: int
    stamps_offset: int
    file_size: int

    @classmethod
    def of(cls, schema: Schema, segment_records: int) -> Layout:
        specs = [(f.name, f.dtype, f.shape) for f in schema.fields]
        # small fields first, widest first (no padding between them), and within one width the
        # floats first, grouped by dtype (each float dtype is one contiguous run: one finiteness
        # check per dtype covers a row); then is_last; then large fields (frames), 8-aligned so
        # they copy in whole words. The flags sit in a record's first cache line, next to the
        # start of its frame: checking a row and copying its frame touch the same page.
        def big(spec: tuple[str, np.dtype, tuple[int, ...]]) -> bool:
            nbytes = spec[1].itemsize * int(np.prod(spec[2], dtype=np.int64))
            return nbytes >= 64 and nbytes % 8 == 0

        small = sorted((sp for sp in specs if not big(sp)), key=lambda sp: (-sp[1].itemsize, sp[1].kind not in "fc", sp[1].str))
        large = sorted((sp for sp in specs if big(sp)), key=lambda sp: -sp[1].itemsize)
        fields = []
        off = 0
        max_align = 1
        for name, dtype, shape in [*small, (IS_LAST, np.dtype(np.bool_), ()), *large]:
            a = min(np.dtype(dtype).itemsize, 8) or 1
            if (name, dtype, shape) in large:
                a = 8
            max_align = max(max_align, a)
            off = -(-off // a) * a
            fields.append((name, off, np.dtype(dtype), tuple(shape)))
            off += int(np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64)))
        rec = max(-(-off // max_align) * max_align, 1)
        cols = [Column(name, DATA_OFFSET + o, rec, dt, shp) for name, o, dt, shp in fields]
        stamps_offset = align(DATA_OFFSET + rec * segment_records)
        cols.append(Column(STAMPS, stamps_offset, STAMP_DTYPE.itemsize, STAMP_DTYPE, ()))
        file_size = align(stamps_offset + STAMP_DTYPE.itemsize * segment_records)
        return cls(segment_records, rec, tuple(cols), DATA_OFFSET, stamps_offset, file_size)

    @property
    def record_dtype(self) -> np.dtype:
        """A numpy structured dtype matching one record (fields and ``is_last``)."""
        cols = self.columns[:-1]
        return np.dtype({
            "names": [c.name for c in cols],
            "formats": [(c.dtype, c.shape) if c.shape else c.dtype for c in cols],
            "offsets": [c.offset - self.records_offset for c in cols],
            "itemsize": self.record_bytes,
        })

    @property
    def float_runs(self) -> tuple[tuple[np.dtype, int, int], ...]:
        """``(dtype, offset in record, element count)`` of each contiguous run of float fields."""
        runs: list[list] = []
        for c in self.columns:
            if c.dtype.kind not in "fc" or c.name in (IS_LAST, STAMPS):
                continue
            n = int(np.prod(c.shape, dtype=np.int64))
            off = c.offset - self.records_offset
            if runs and runs[-1][0] == c.dtype and runs[-1][1] + runs[-1][2] * c.dtype.itemsize == off:
                runs[-1][2] += n
            else:
                runs.append([c.dtype, off, n])
        return tuple((d, o, n) for d, o, n in runs if n)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    def records_span(self, start: int, stop: int) -> tuple[int, int]:
        """Byte range of the records of rows ``[start, stop)``: what a group crc covers."""
        return self.records_offset + start * self.record_bytes, self.records_offset + stop * self.record_bytes


@dataclass(frozen=True, slots=True)
class Header:
    """A segment file's header (page 0), its identity: the store, segment id, writer id, lanes, the
    writer session's epoch and the segment's place in it (chain index, first row number), the
    schema hash, sizes and creation time; its crc32c guards it."""

    store_uuid: bytes
    """The 16 bytes of the store's uuid: a segment of another store is foreign."""
    segment_id: int
    """The segment's id in the store (ids grow as segments are made)."""
    writer_id: int
    """The id of the writer session that made it."""
    lanes: int
    """The lanes of that session, interleaved row by row (1 for a lane segment)."""
    session_epoch: int
    """The random number naming the writer session (a chain of segments) the segment belongs to."""
    chain_index: int
    """The segment's place in its session: 0 for the first."""
    first_seq: int
    """The writer-session row number of the segment's slot 0."""
    schema_hash: int
    """``Schema.hash`` of the store's schema."""
    segment_records: int
    """Rows the file's layout has room for (the store's ``segment_records``)."""
    usable_records: int
    """Rows the segment takes, at most ``segment_records`` (a writer's segments: ``segment_records``
    rounded down to a multiple of ``lanes``)."""
    file_size: int
    """The file's size in bytes (``Layout.file_size``)."""
    created_ns: int
    """When the segment was made (ns since the epoch)."""
    format_version: int = FORMAT_VERSION
    """The segment format it is written in (``FORMAT_VERSION``; ``READ_VERSIONS`` are read)."""

    def pack(self) -> bytes:
        """The header's bytes, its crc32c last."""
        body = _HEADER.pack(
            MAGIC, self.format_version, HEADER_SIZE, self.store_uuid, self.segment_id, self.writer_id,
            self.lanes, self.session_epoch, self.chain_index, self.first_seq, self.schema_hash,
            self.segment_records, self.usable_records, self.file_size, self.created_ns,
        )
        return body + _HEADER_CRC.pack(crc32c(body))

    @classmethod
    def unpack(cls, buf: bytes, path: object) -> Header:
        """The header in ``buf`` (a file's first bytes); ``CorruptSegmentError`` (naming ``path``) if it
        is short, not a segment's, or fails its crc32c; ``FormatVersionError`` for a version this
        mmreplay cannot read."""
        if len(buf) < HEADER_SIZE:
            raise CorruptSegmentError(f"{path}: header truncated ({len(buf)} of {HEADER_SIZE} bytes)", kind="short")
        body = bytes(buf[: _HEADER.size])
        (magic, version, hsize, uuid, sid, wid, lanes, epoch, chain, first, shash, srec, urec, fsize, ctime) = (
            _HEADER.unpack(body)
        )
        if magic != MAGIC:
            raise CorruptSegmentError(f"{path}: bad magic {magic!r}, not an mmreplay segment", kind="header")
        (crc,) = _HEADER_CRC.unpack_from(buf, _HEADER.size)
        if crc != crc32c(body) or hsize != HEADER_SIZE:  # checked first: a flipped bit in the version is damage
            newer = "" if version in READ_VERSIONS else f" (or format version {version}, which this mmreplay cannot read)"
            raise CorruptSegmentError(f"{path}: header checksum mismatch{newer}", kind="header")
        if version not in READ_VERSIONS:
            raise FormatVersionError(f"{path}: format version {version}, this mmreplay reads versions "
                                     f"{', '.join(map(str, READ_VERSIONS))}")
        return cls(uuid, sid, wid, lanes, epoch, chain, first, shash, srec, urec, fsize, ctime, version)


CONTROL_STRUCT = _CONTROL
CONTROL_CRC_STRUCT = _CONTROL_CRC


class Control(NamedTuple):
    """One control slot: the version, the committed and synced row counts, the state and the seal crc
    (a tuple: one is made per publish, three times faster than a frozen dataclass)."""

    version: int
    committed: int
    synced: int
    state: int
    seal_crc: int = 0

    def pack(self) -> bytes:
        body = _CONTROL.pack(self.version, self.committed, self.synced, self.state, self.seal_crc)
        return body + _CONTROL_CRC.pack(crc32c(body))


def unpack_control_slot(buf: bytes | memoryview) -> Control | None:
    """One control slot, or ``None`` if its checksum fails (torn or never written: a buffer short of
    a slot is a file that ends before it, e.g. one created whose size a power loss never saved)."""
    if len(buf) < CONTROL_SLOT_SIZE:
        return None
    body = bytes(buf[: _CONTROL.size])
    (crc,) = _CONTROL_CRC.unpack_from(buf, _CONTROL.size)
    if crc != crc32c(body):
        return None
    version, committed, synced, state, seal_crc = _CONTROL.unpack(body)
    if version == 0:
        return None
    return Control(version, committed, synced, state, seal_crc)


def read_control(buf: bytes | memoryview) -> tuple[Control | None, int]:
    """The current control (valid slot with the higher version) and the index of that slot.

    ``buf`` is the control page. Returns ``(None, 1)`` if neither slot is valid.
    """
    a = unpack_control_slot(buf[:CONTROL_SLOT_SIZE])
    b = unpack_control_slot(buf[CONTROL_SLOT_SIZE : 2 * CONTROL_SLOT_SIZE])
    if a is None and b is None:
        return None, 1
    if b is None or (a is not None and a.version >= b.version):
        return a, 0
    return b, 1


def damaged_control_slots(buf: bytes | memoryview) -> list[int]:
    """Control slots of the control page ``buf`` that hold bytes but fail their crc (an all-zero
    slot was never written: not damage)."""
    raw = bytes(buf[: 2 * CONTROL_SLOT_SIZE])
    return [i for i in (0, 1) if any(raw[i * CONTROL_SLOT_SIZE : (i + 1) * CONTROL_SLOT_SIZE])
            and unpack_control_slot(raw[i * CONTROL_SLOT_SIZE : (i + 1) * CONTROL_SLOT_SIZE]) is None]


def group_seed(header: Header, start: int, seq0: int, k: int) -> int:
    """The crc seed binding a commit group to its store, segment, slot, sequence and session."""
    return crc32c(_SEED.pack(header.store_uuid, header.segment_id, start, seq0, header.session_epoch, k))


def seq_field(header: Header, seq: int) -> int:
    """What a stamp's ``seq`` field holds for row number ``seq`` (digest bits aside): the number
    itself in format 1, its low 32 bits in format 2."""
    return seq if header.format_version < 2 else seq & SEQ_MASK


def seq_matches(header: Header, field: int, seq: int) -> bool:
    """A stamp's ``seq`` field is row number ``seq``'s (ignoring format 2's digest bits)."""
    return (int(field) if header.format_version < 2 else int(field) & SEQ_MASK) == seq_field(header, seq)


@lru_cache(maxsize=64)
def digest_multipliers(words: int) -> np.ndarray:
    """The row digest's fixed odd multipliers, one per 64-bit word (splitmix64 of the index)."""
    z = np.arange(1, words + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    z |= np.uint64(1)
    z.setflags(write=False)
    return z


def row_digests(view: Any, layout: Layout, start: int, stop: int) -> np.ndarray:
    """The digests (uint64, < 2**32) of rows ``[start, stop)``: the high 32 bits of each record's
    little-endian 64-bit words (zero-padded to a whole word) dotted with ``digest_multipliers``
    (mod 2**64). ``view``: a buffer of the whole segment file."""
    lo, hi = layout.records_span(start, stop)
    n, rec = stop - start, layout.record_bytes
    raw = np.frombuffer(view, np.uint8, hi - lo, lo).reshape(n, rec)
    words = -(-rec // 8)
    if rec % 8:
        padded = np.zeros((n, words * 8), np.uint8)
        padded[:, :rec] = raw
        raw = padded
    return np.dot(raw.view("<u8"), digest_multipliers(words)) >> np.uint64(32)


_K: Any = None


def kernel(load: bool = True) -> Any:
    """The compiled check and stamping kernels (``check_kernel``), loaded on first use: ``import
    mmreplay`` does not load numba. ``load=False``: ``None`` unless numba is already loaded in this
    process (then loading the kernels costs little; loading numba itself costs ~0.5 s)."""
    global _K
    if _K is None:
        if not load and "numba" not in sys.modules:
            return None
        from . import check_kernel

        _K = check_kernel
    return _K
