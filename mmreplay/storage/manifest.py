"""The store's two small metadata files: the manifest (``STORE.json``) and the segment-id counter.

* ``STORE.json`` is immutable once written: format, store uuid, schema, segment size, capacity,
  with a crc32c of its canonical JSON; :func:`read_manifest` refuses a damaged or foreign one.
  ``STORE.copy.json`` holds the same bytes (written first at creation, or by the first writable
  open of a store made before copies): one damaged file costs nothing, the other is read
  (:func:`load_manifest`), and a writable open or ``verify --repair`` writes it back.
* ``counters.bin`` holds the next segment id in two checksummed slots (LMDB's double meta): a
  new value goes to the slot not holding the newest valid one, so a torn write leaves the other.
"""

from __future__ import annotations

import json
import os
import struct
from typing import TYPE_CHECKING, Any, Literal

from ..core.errors import CorruptStoreError, FormatVersionError, StoreNotFoundError
from ..core import fs
from ..core.fs import atomic_write
from .format import Layout, crc32c

if TYPE_CHECKING:
    from pathlib import Path

    from ..core.schema import Schema

MANIFEST = "STORE.json"
"""The manifest's file name in a store's directory (its copy: ``STORE.copy.json``)."""
MANIFEST_COPY = "STORE.copy.json"
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
    keeps at least ``capacity``; see ``files.evict_for_new_segment``), so with ``writers`` writers appending at
    once the default keeps it under ``1.25 * capacity + (writers + 1) * 1024``, with segments as
    large as that allows (each segment made and evicted costs ~2 ms of CPU).
    """
    per_row = Layout.of(schema, 1).record_bytes + 16
    rows = int(min(1 << 20, max(1024, target_bytes // per_row // 1024 * 1024)))
    if capacity is None:
        return rows
    return min(rows, int(capacity) // (4 * (max(1, int(writers)) + 1)) + 1024)


REPLAY_SEGMENTS = 64
"""A training run's store: at least this many segments per ``capacity`` (``segment_records_for``)."""
SHIPPING_ROWS = 4096
"""A store that ships its segments to a learner: at most this many rows a segment."""


def segment_records_for(schema: Schema, capacity: int | None = None, writers: int = 1, *,
                        use: Literal["store", "replay", "shipping"] = "store", lanes: int = 1) -> int:
    """Rows per segment: the one sizing rule, with its cases.

    * ``"store"`` (``create_store``'s default): about 32 MiB a segment and, given a ``capacity``,
      at most ``capacity // (4 * (writers + 1)) + 1024`` (``default_segment_records``);
    * ``"replay"`` (a store a training run creates): the store default, but at most
      ``capacity // 64`` rows (1,024 at least), so the replay memory stays within ~3% of the
      ``capacity`` the run names (a full store keeps up to (writers + 1) segments beyond it; the
      store default let MinAtar's 100,000 replay up to 119,636 rows);
    * ``"shipping"`` (stores whose sealed segments ship to a learner): at most 4,096 rows (a
      segment, and so the lag of its first row, fills in well under a second at thousands of
      steps/s) and the usual ~32 MiB, a multiple of ``lanes``.

    A segment made and evicted costs ~2 ms of CPU."""
    if use == "store":
        return default_segment_records(schema, capacity, writers)
    if use == "replay":
        if capacity is None:
            raise ValueError("segment_records_for(use='replay') needs the run's capacity")
        return min(default_segment_records(schema, capacity, writers), max(1024, int(capacity) // REPLAY_SEGMENTS))
    if use == "shipping":
        r = min(SHIPPING_ROWS, default_segment_records(schema))
        return max(lanes, r // lanes * lanes)
    raise ValueError(f"`use` must be 'store', 'replay' or 'shipping', got {use!r}")


def manifest_bytes(body: dict[str, Any]) -> bytes:
    """The manifest file's bytes: ``body`` plus the crc32c of its canonical JSON."""
    canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps({**body, "crc32c": crc32c(canon)}, indent=2, sort_keys=True).encode() + b"\n"


def read_manifest(p: Path) -> dict[str, Any]:
    """The checked manifest of the store at ``p`` (without its crc): ``STORE.json``, or its copy
    when it is damaged (see :func:`load_manifest`)."""
    return load_manifest(p)[0]


def load_manifest(p: Path) -> tuple[dict[str, Any], list[str]]:
    """``(manifest, damaged)``: the checked manifest of the store at ``p`` and the names of its
    two files (``STORE.json``, ``STORE.copy.json``) that are damaged or missing. Raises
    ``CorruptStoreError`` only when neither holds a valid manifest."""
    try:
        raw = (p / MANIFEST).read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        if not p.exists():
            raise StoreNotFoundError(f"no store at {p}") from None
        if not p.is_dir():
            raise StoreNotFoundError(f"{p} is a file, not an mmreplay store (a store is a directory)") from None
        if not (p / MANIFEST_COPY).exists():
            raise StoreNotFoundError(f"{p} is not an mmreplay store (no {MANIFEST})") from None
        raw = b""
    try:
        data = _parse(raw, p / MANIFEST, p)
    except CorruptStoreError as exc:
        try:
            data = _parse((p / MANIFEST_COPY).read_bytes(), p / MANIFEST_COPY, p)
        except (OSError, CorruptStoreError):
            raise exc from None
        if data.get("format_version") != STORE_FORMAT:
            raise FormatVersionError(f"{p}: store format {data.get('format_version')}, this mmreplay reads "
                                     f"{STORE_FORMAT}") from None
        return data, [MANIFEST]
    try:
        copy_ok = _parse((p / MANIFEST_COPY).read_bytes(), p / MANIFEST_COPY, p) == data
    except (OSError, CorruptStoreError, FormatVersionError):
        copy_ok = False
    return data, [] if copy_ok else [MANIFEST_COPY]


def _parse(raw: bytes, where: Path, p: Path) -> dict[str, Any]:
    try:
        data = json.loads(raw)
        crc = data.pop("crc32c")
    except (ValueError, KeyError, AttributeError) as exc:
        raise CorruptStoreError(f"{where}: not a valid manifest ({exc})") from None
    canon = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    if crc != crc32c(canon):
        raise CorruptStoreError(f"{where}: checksum mismatch")
    if data.get("magic") != STORE_MAGIC:
        raise CorruptStoreError(f"{where}: bad magic {data.get('magic')!r}")
    if data.get("format_version") != STORE_FORMAT:
        raise FormatVersionError(f"{p}: store format {data.get('format_version')}, this mmreplay reads {STORE_FORMAT}")
    return data


def restore_manifest(p: Path, data: dict[str, Any], names: list[str]) -> None:
    """Write the manifest files ``names`` of the store at ``p`` again from the valid ``data``."""
    for name in names:
        atomic_write(p / name, manifest_bytes(data))


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
        fs.pwrite(fd, rec, slot * _COUNTER_SLOT)
        if fsync:
            fs.fsync(fd)
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

