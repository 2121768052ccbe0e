"""The store's two small metadata files: the manifest (``STORE.json``) and the segment-id counter.

* ``STORE.json`` is immutable once written: format, store uuid, schema, segment size, capacity,
  with a crc32c of its canonical JSON; :func:`read_manifest` refuses a damaged or foreign one.
* ``counters.bin`` holds the next segment id in two checksummed slots (LMDB's double meta): a
  new value goes to the slot not holding the newest valid one, so a torn write leaves the other.
"""

from __future__ import annotations

import json
import os
import struct
from typing import TYPE_CHECKING, Any

from ..core.errors import CorruptStoreError, FormatVersionError, StoreNotFoundError
from ..core.fs import atomic_write
from .format import Layout, crc32c

if TYPE_CHECKING:
    from pathlib import Path

    from ..core.schema import Schema

MANIFEST = "STORE.json"
COUNTERS = "counters.bin"
STORE_MAGIC = "mmreplay-store"
STORE_FORMAT = 1
_COUNTER = struct.Struct("<QQ")
_COUNTER_SLOT = 32


def default_segment_records(schema: Schema, capacity: int | None = None, writers: int = 1,
                            target_bytes: int = 32 << 20) -> int:
    """Rows per segment: about ``target_bytes`` per segment (a multiple of 1024), and, given a
    ``capacity``, at most ``capacity // (4 * (writers + 1)) + 1024``.

    A full store holds at most ``capacity + (writers + 1) * segment_records`` rows (eviction
    keeps at least ``capacity``; see ``eviction.py``), so with ``writers`` writers appending at
    once the default keeps it under ``1.25 * capacity + (writers + 1) * 1024``, with segments as
    large as that allows (each segment made and evicted costs ~2 ms of CPU).
    """
    per_row = Layout.of(schema, 1).record_bytes + 16
    rows = int(min(1 << 20, max(1024, target_bytes // per_row // 1024 * 1024)))
    if capacity is None:
        return rows
    return min(rows, int(capacity) // (4 * (max(1, int(writers)) + 1)) + 1024)


def manifest_bytes(body: dict[str, Any]) -> bytes:
    """The manifest file's bytes: ``body`` plus the crc32c of its canonical JSON."""
    canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps({**body, "crc32c": crc32c(canon)}, indent=2, sort_keys=True).encode() + b"\n"


def read_manifest(p: Path) -> dict[str, Any]:
    """The checked manifest of the store at ``p`` (without its crc)."""
    try:
        raw = (p / MANIFEST).read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        if not p.exists():
            raise StoreNotFoundError(f"no store at {p}") from None
        if not p.is_dir():
            raise StoreNotFoundError(f"{p} is a file, not an mmreplay store (a store is a directory)") from None
        raise StoreNotFoundError(f"{p} is not an mmreplay store (no {MANIFEST})") from None
    try:
        data = json.loads(raw)
        crc = data.pop("crc32c")
    except (ValueError, KeyError, AttributeError) as exc:
        raise CorruptStoreError(f"{p / MANIFEST}: not a valid manifest ({exc})") from None
    canon = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    if crc != crc32c(canon):
        raise CorruptStoreError(f"{p / MANIFEST}: checksum mismatch")
    if data.get("magic") != STORE_MAGIC:
        raise CorruptStoreError(f"{p / MANIFEST}: bad magic {data.get('magic')!r}")
    if data.get("format_version") != STORE_FORMAT:
        raise FormatVersionError(f"{p}: store format {data.get('format_version')}, this mmreplay reads {STORE_FORMAT}")
    return data


def write_counter(path: Path, value: int, version: int, slot: int | None = None, *, fsync: bool = True) -> None:
    """Write ``value`` with ``version`` into counter ``slot`` (``None``: a new file, slot 0)."""
    body = _COUNTER.pack(version, value)
    rec = body + struct.pack("<I", crc32c(body))
    rec += b"\0" * (_COUNTER_SLOT - len(rec))
    if slot is None:
        atomic_write(path, rec + b"\0" * _COUNTER_SLOT)
        return
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        os.pwrite(fd, rec, slot * _COUNTER_SLOT)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_counter(path: Path) -> tuple[int, int, int]:
    """``(value, version, slot)`` of the valid counter slot with the higher version."""
    raw = path.read_bytes()
    best: tuple[int, int, int] | None = None
    for slot in (0, 1):
        rec = raw[slot * _COUNTER_SLOT : (slot + 1) * _COUNTER_SLOT]
        if len(rec) < _COUNTER.size + 4:
            continue
        body = rec[: _COUNTER.size]
        (crc,) = struct.unpack_from("<I", rec, _COUNTER.size)
        version, value = _COUNTER.unpack(body)
        if crc == crc32c(body) and version > 0 and (best is None or version > best[1]):
            best = (value, version, slot)
    if best is None:
        raise CorruptStoreError(f"{path}: both counter slots are damaged", hint="run `mmreplay verify --repair`")
    return best

