"""StoreReader: a process's read-only view of every segment of a store, and row gathers.

The reader maps every live segment file read-only into one reserved address range
(``_fs.AddressRegion``), one equal-sized window per segment. Because every segment of a store
has the same layout, a field is one strided numpy array of shape
``(windows, segment_records, *field_shape)`` over that range, and a batch gather is **one fancy
index per field whatever the number of segments** (``column[window_ids, slots]``).

Invariants kept here:

* a reader takes no locks and writes nothing, so a store on a read-only mount can be read;
* rows at or beyond a segment's ``committed`` count as of the last ``refresh()`` are never read
  (SQLite's ``mxFrame`` snapshot); ``refresh()`` also checks the stamp of the last committed row
  and keeps the older count if it is not there yet;
* a segment deleted by eviction stays mapped, and readable, until the next ``refresh()``;
* a file is checked (header, store uuid, schema, size) before it is mapped: never a SIGBUS.

Global row ids are ``segment_id * segment_records + slot``: stable for the life of a row.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ._format import CONTROL_OFFSET, CONTROL_SLOT_SIZE, IS_LAST, STAMPS, STATE_SEALED, Header, Layout, read_control
from ._fs import AddressRegion
from .errors import CorruptSegmentError
from .segment import parse_segment_name, read_segment_meta

if TYPE_CHECKING:
    from pathlib import Path

_MADV_RANDOM = 1
log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Mapped:
    """One segment as this reader knows it."""

    name: str
    header: Header
    window: int
    committed: int
    state: int
    version: int = 0


@dataclass(slots=True)
class Snapshot:
    """Arrays describing the live segments in segment-id order (index ``k``)."""

    segment_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    windows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    committed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    usable: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    lanes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    succ: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    pred: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    first_seq: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Writer-session row number of each segment's slot 0."""
    """Index of the previous segment of the same writer session (-1 if none or evicted)."""
    """Index of the next segment of the same writer session, or -1."""
    cum_end: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def total_rows(self) -> int:
        return int(self.cum_end[-1]) if len(self.cum_end) else 0


class StoreReader:
    """Maps a store's segments and gathers rows by id. Owned by ``ReplayStore``."""

    def __init__(self, segments_dir: Path, layout: Layout, store_uuid: bytes, schema_hash: int, *,
                 initial_windows: int = 16, on_corrupt: str = "raise", verify: str = "off") -> None:
        self.on_corrupt = on_corrupt
        self.verify = verify
        self.dir = segments_dir
        self.layout = layout
        self.store_uuid = store_uuid
        self.schema_hash = schema_hash
        self.R = layout.segment_records
        self.segments: dict[int, _Mapped] = {}
        self.region = AddressRegion(max(initial_windows, 4), layout.file_size)
        self._free = list(range(self.region.slots - 1, -1, -1))
        self.columns: dict[str, np.ndarray] = {}
        self.is_last: np.ndarray
        self.stamps: np.ndarray
        self._build_views()
        self.snapshot = Snapshot()
        self._table: np.ndarray | None = None
        self.skipped: dict[str, str] = {}
        self.last_scan = 0.0

    # -- mapping --------------------------------------------------------------------------
    def _build_views(self) -> None:
        buf = self.region.buffer
        cols = {}
        for c in self.layout.columns:
            cols[c.name] = np.ndarray((self.region.slots, self.R, *c.shape), c.dtype, buffer=buf, offset=c.offset,
                                      strides=c.strides((self.region.slot_bytes,)))
        self.stamps = cols.pop(STAMPS)
        self.is_last = cols.pop(IS_LAST)
        self.columns = cols
        self.bytes = np.ndarray((self.region.size,), np.uint8, buffer=buf)  # the whole region, for kernels
        self._control = np.ndarray((self.region.slots, 2 * CONTROL_SLOT_SIZE), np.uint8, buffer=buf,
                                   offset=CONTROL_OFFSET, strides=(self.region.slot_bytes, 1))

    def _grow(self) -> None:
        """Move every mapping into a region twice the size (rare: more live segments than windows)."""
        old = self.region
        self.region = AddressRegion(old.slots * 2, old.slot_bytes)
        remap = {}
        for sid, m in self.segments.items():
            fd = os.open(self.dir / m.name, os.O_RDONLY | os.O_CLOEXEC)
            try:
                self.region.map_file(m.window, fd, self.layout.file_size)
            finally:
                os.close(fd)
            remap[sid] = m.window
        self._free = sorted(set(range(self.region.slots)) - set(remap.values()), reverse=True)
        self._build_views()
        old.close()

    def _map(self, name: str, path: Path) -> _Mapped:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            header, control = read_segment_meta(fd, path, self.layout, self.store_uuid, self.schema_hash)
            if not self._free:
                self._grow()
            window = self._free.pop()
            try:
                self.region.map_file(window, fd, self.layout.file_size)
            except BaseException:
                self._free.append(window)
                raise
        finally:
            os.close(fd)
        self.region.advise(window, self.layout.file_size, _MADV_RANDOM)
        m = _Mapped(name, header, window, 0, 0)
        self._read_control(m)
        return m

    # -- refresh --------------------------------------------------------------------------
    def refresh(self, *, scan: bool = True) -> None:
        """Pick up new segments (``scan``), new rows and evicted segments."""
        if scan:
            self._scan()
        for m in self.segments.values():
            if m.state != STATE_SEALED:
                self._read_control(m)  # sealed segments are immutable
        self._rebuild()

    def _scan(self) -> None:
        seen: dict[int, str] = {}
        with os.scandir(self.dir) as it:
            for e in it:
                parsed = parse_segment_name(e.name)
                if parsed is not None:
                    seen[parsed[0]] = e.name
        for sid in [s for s in self.segments if s not in seen]:
            self._free.append(self.segments.pop(sid).window)
            self.region.release(self._free[-1])
        for sid, name in seen.items():
            if sid in self.segments or name in self.skipped:
                continue
            try:
                self.segments[sid] = self._map(name, self.dir / name)
            except FileNotFoundError:
                continue  # evicted between listing and opening
            except CorruptSegmentError as exc:
                if self.on_corrupt == "raise":
                    raise
                self.skipped[name] = str(exc)
                log.warning("skipping %s", exc)
        self.last_scan = time.monotonic()

    def _read_control(self, m: _Mapped) -> None:
        control, _ = read_control(self._control[m.window].tobytes())
        if control is None or control.version == m.version:
            return
        n = min(control.committed, m.header.usable_records)
        # stamps are written before the count that points at them; if the last one is not
        # visible yet (weakly ordered CPU), keep the previous count
        if n > m.committed and self.stamps[m.window, n - 1]["seq"] != m.header.first_seq + n:
            return
        if self.verify != "off" and n > m.committed:
            n = self._verified(m, n)
        m.committed, m.state, m.version = n, control.state, control.version

    def _verified(self, m: _Mapped, n: int) -> int:
        """Check the new rows' stamps and checksums before they become visible (``verify=``)."""
        from .recovery import check_groups

        w = m.window
        base = w * self.region.slot_bytes
        view = self.bytes[base : base + self.layout.file_size]
        good = check_groups(m.header, self.layout, self.stamps[w], view, m.committed, n)
        if good >= n:
            return n
        msg = f"{self.dir / m.name}: row {good} fails its stamp or crc32c check"
        if self.verify == "strict":
            raise CorruptSegmentError(msg, hint="run `mmreplay verify --repair`, or open with verify='salvage'")
        log.warning("%s; rows from there on are left out (verify='salvage')", msg)
        self.skipped[m.name] = msg
        return good

    def _rebuild(self) -> None:
        ms = sorted(self.segments.values(), key=lambda m: m.header.segment_id)
        s = Snapshot()
        s.segment_ids = np.array([m.header.segment_id for m in ms], np.int64)
        s.windows = np.array([m.window for m in ms], np.int64)
        s.committed = np.array([m.committed for m in ms], np.int64)
        s.usable = np.array([m.header.usable_records for m in ms], np.int64)
        s.lanes = np.array([m.header.lanes for m in ms], np.int64)
        s.cum_end = np.cumsum(s.committed)
        chain = {(m.header.writer_id, m.header.session_epoch, m.header.chain_index): k for k, m in enumerate(ms)}
        s.succ = np.array(
            [chain.get((m.header.writer_id, m.header.session_epoch, m.header.chain_index + 1), -1) for m in ms],
            np.int64,
        )
        s.first_seq = np.array([m.header.first_seq for m in ms], np.int64)
        s.pred = np.array(
            [chain.get((m.header.writer_id, m.header.session_epoch, m.header.chain_index - 1), -1) for m in ms],
            np.int64,
        )
        self.snapshot = s
        self._table = None

    def segment_table(self) -> np.ndarray:
        """The snapshot as one int64 table for the compiled kernels (built once per refresh)."""
        if self._table is None:
            from ._kernels import segment_table

            s = self.snapshot
            self._table = segment_table(s.cum_end, s.committed, s.usable, s.lanes, s.succ, s.windows,
                                        self.region.slot_bytes, self.layout.records_offset, s.segment_ids, s.pred,
                                        s.first_seq)
        return self._table

    def close(self) -> None:
        self.columns = {}
        self.segments.clear()
        self.region.close()

    # -- row addressing -------------------------------------------------------------------
    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Snapshot indices ``k`` and slots of global row ids; raises on ids not visible."""
        s = self.snapshot
        ids = np.asarray(ids, np.int64)
        sid, slot = np.divmod(ids, self.R)
        k = np.searchsorted(s.segment_ids, sid)
        kc = np.minimum(k, max(len(s.segment_ids) - 1, 0))
        if len(s.segment_ids) == 0 or not (
            (s.segment_ids[kc] == sid).all() and (slot < s.committed[kc]).all() and (ids >= 0).all()
        ):
            raise KeyError("some row ids are not visible in this snapshot (evicted, unpublished or invalid)")
        return kc, slot

    def successors(self, k: np.ndarray, slot: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where the next row of the same lane is: ``(ok, k_next, slot_next)``."""
        s = self.snapshot
        nxt = slot + s.lanes[k]
        in_seg = nxt < s.committed[k]
        succ = s.succ[k]
        nslot = nxt - s.usable[k]
        cross = (nxt >= s.usable[k]) & (succ >= 0)
        cross &= nslot < s.committed[np.maximum(succ, 0)]
        ok = in_seg | cross
        return ok, np.where(in_seg, k, np.maximum(succ, 0)), np.where(in_seg, nxt, np.maximum(nslot, 0))

    def gather(self, name: str, k: np.ndarray, slot: np.ndarray) -> np.ndarray:
        """Rows ``slot`` of segments ``k`` of field ``name`` (a copy)."""
        return self.columns[name][self.snapshot.windows[k], slot]
