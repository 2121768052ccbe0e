"""Writer: one writer session appending a vector env's steps into its own segments.

A writer owns ``lanes`` lanes (one per environment of a vector env) and the segments it
allocates; rows are laid out ``(time, lane)``, so one vector-env step is one contiguous write,
and the next row of a lane is ``lanes`` rows further on (possibly in the session's next
segment). ``is_last`` is derived: the row after a ``terminated``/``truncated`` row of a lane is
that episode's final observation, which is what gymnasium's default next-step autoreset
returns, so the plain vector-env loop stores episodes RLDS/Minari style (T+1 observations).

Append protocol (RELIABILITY.md §2.3): validate the whole batch (nothing written on error);
allocate every segment the batch will need (a full disk fails here, before any write); copy
payload; write stamps (seq, group crc, group length); then publish the new committed count in
the control slot. One crc32c call per column per commit group, no Python loop per row or lane.

Durability (``durability=``), what each level guarantees once ``add`` returns:

=============  =====================  =======================  ==================================
level          visible to readers     lost to ``kill -9``      lost to power loss / kernel crash
=============  =====================  =======================  ==================================
``process``    yes (after refresh)    nothing published        anything not sealed or flushed;
                                                               recovery drops invalid rows
``segment``    yes                    nothing published        rows after the last seal or
(default)                                                      ``flush()``
``batch``      yes                    nothing published        nothing acknowledged
=============  =====================  =======================  ==================================

A writer must be used in the process that opened it (not after ``fork()``); one writer id has
at most one live session (``WriterBusyError`` otherwise), and a killed writer's id is free at
once (the kernel drops its ``flock``).
"""

from __future__ import annotations

import atexit
import os
import secrets
import socket
from typing import TYPE_CHECKING, Any, Literal

import crc32c as _crc32c
import numpy as np

from ._format import STATE_SEALED, Header, group_seed
from ._fs import fsync_dir
from .errors import DiskFullError, SchemaError, StoreClosedError, WriterBusyError, WriterFailedError
from .segment import Segment, now_ns

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .store import ReplayStore

Durability = Literal["process", "segment", "batch"]
MAX_WRITERS = 1000
_extend = _crc32c.crc32c


class Writer:
    """Appends vector-env steps to a store. Get one with ``store.writer(lanes=...)``.

    The ten lines of a collection loop::

        envs = gymnasium.make_vec("CartPole-v1", num_envs=8)
        store = mmreplay.create_store(path, mmreplay.Schema.from_spaces(
            envs.single_observation_space, envs.single_action_space))
        obs, _ = envs.reset(seed=0)
        with store.writer(lanes=envs.num_envs, cast="safe") as w:
            for _ in range(1000):
                action = envs.action_space.sample()
                next_obs, reward, terminated, truncated, _ = envs.step(action)
                w.add(obs=obs, action=action, reward=reward, terminated=terminated, truncated=truncated)
                obs = next_obs
            w.close(last_obs=obs)
    """

    def __init__(
        self,
        store: ReplayStore,
        *,
        lanes: int,
        writer_id: int | None,
        durability: Durability,
        cast: Literal["no", "safe", "same_kind"],
        nonfinite: Literal["error", "warn", "allow"],
    ) -> None:
        if not isinstance(lanes, (int, np.integer)) or lanes < 1:
            raise ValueError(f"`lanes` must be a positive int, got {lanes!r}")
        if lanes > store.segment_records:
            raise ValueError(f"`lanes`={lanes} is more than the store's segment_records={store.segment_records}")
        if durability not in ("process", "segment", "batch"):
            raise ValueError(f"`durability` must be 'process', 'segment' or 'batch', got {durability!r}")
        if cast not in ("no", "safe", "same_kind"):
            raise ValueError(f"`cast` must be 'no', 'safe' or 'same_kind', got {cast!r}")
        if nonfinite not in ("error", "warn", "allow"):
            raise ValueError(f"`nonfinite` must be 'error', 'warn' or 'allow', got {nonfinite!r}")
        self.store = store
        self.lanes = int(lanes)
        self.durability = durability
        self.cast = cast
        self.nonfinite = nonfinite
        self.schema = store.schema
        self.layout = store.layout
        self.usable = store.segment_records // self.lanes * self.lanes
        self._pid = os.getpid()
        self._admin = store._lock("admin.lock")
        if not self._admin.acquire(exclusive=False):
            from .errors import StoreLockedError

            raise StoreLockedError(f"{store.path} is locked for admin work (recover/compact)")
        self._lock = None
        try:
            self.writer_id = self._claim(writer_id)
            from .recovery import recover_writer

            recover_writer(store, self.writer_id)
        except BaseException:
            self._release_locks()
            raise
        self.epoch = secrets.randbits(63) | 1
        self.rows_written = 0
        self._chain = 0
        self._seg: Segment | None = None
        self._n = 0  # committed rows of the current segment
        self._synced = 0
        self._spare: list[Segment] = []
        self._prev_done = np.zeros(self.lanes, np.bool_)
        self._failed: BaseException | None = None
        self._closed = False
        self._has_done = "terminated" in self.schema and "truncated" in self.schema
        atexit.register(self._atexit)

    # -- locking --------------------------------------------------------------------------
    def _claim(self, writer_id: int | None) -> int:
        ids = range(MAX_WRITERS) if writer_id is None else [int(writer_id)]
        if writer_id is not None and not 0 <= writer_id < MAX_WRITERS:
            raise ValueError(f"`writer_id` must be in [0, {MAX_WRITERS}), got {writer_id}")
        for wid in ids:
            lock = self.store._lock(f"writer-{wid:03d}.lock")
            if lock.acquire(exclusive=True):
                lock.write_owner(f"pid={os.getpid()} host={socket.gethostname()} start_ns={now_ns()}\n")
                self._lock = lock
                return wid
        if writer_id is not None:
            raise WriterBusyError(f"writer id {writer_id} of {self.store.path} is held by a live writer session")
        raise WriterBusyError(f"all {MAX_WRITERS} writer ids of {self.store.path} are busy")

    def _release_locks(self) -> None:
        if self._lock is not None:
            self._lock.release()
        self._admin.release()

    # -- public API -----------------------------------------------------------------------
    def add(self, batch: Mapping[str, Any] | None = None, /, **fields: Any) -> None:
        """Append one vector-env step: every field has leading dimension ``lanes``.

        ``obs`` is the observation the action was taken in (not ``next_obs``): pass the
        arrays ``envs.step`` returned, with the previous observation. Raises ``SchemaError``
        or ``InvalidValueError`` before writing anything if a field is wrong.
        """
        self._append(batch, fields, (self.lanes,))

    def add_batch(self, batch: Mapping[str, Any] | None = None, /, **fields: Any) -> None:
        """Append ``T`` vector-env steps at once: every field has leading shape ``(T, lanes)``."""
        self._append(batch, fields, None)

    def flush(self) -> None:
        """Make every published row durable (msync), whatever the durability level."""
        self._check()
        seg = self._seg
        if seg is not None and self._synced < self._n:
            seg.sync_rows(self._synced, self._n)
            seg.publish(self._n, synced=self._n)
            seg.sync_control()
            self._synced = self._n

    def close(self, last_obs: Any = None) -> None:
        """Seal the open segment, make it durable and release the writer id.

        ``last_obs`` (optional, leading dimension ``lanes``) is written as a final row of every
        lane so the last steps become sampleable transitions (their ``next_obs``).
        """
        if self._closed:
            return
        if self._pid != os.getpid():
            self._closed = True
            return
        try:
            if last_obs is not None and self._failed is None:
                self._append_last(last_obs)
            if self._seg is not None and self._failed is None:
                if self._n < self.usable:
                    self._seal(self._seg)
                self._seg.close(fdatasync=self.durability != "process")
                self._seg = None
            for spare in self._spare:
                self._discard(spare)
            self._spare.clear()
        finally:
            self._closed = True
            atexit.unregister(self._atexit)
            self._release_locks()
            if self in self.store._writers:
                self.store._writers.remove(self)

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _atexit(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - best effort at interpreter exit
            pass

    # -- internals ------------------------------------------------------------------------
    def _check(self) -> None:
        if self._pid != os.getpid():
            raise StoreClosedError("writer used after fork(); open a writer in the child process")
        if self._closed:
            raise StoreClosedError("writer is closed")
        if self._failed is not None:
            raise WriterFailedError(f"writer {self.writer_id} failed earlier: {self._failed!r}")

    def _append(self, batch: Mapping[str, Any] | None, fields: dict[str, Any], lead: tuple[int, ...] | None) -> None:
        self._check()
        data = fields if batch is None else ({**batch, **fields} if fields else batch)
        arrays, got = self.schema.validate_batch(data, lead, cast=self.cast, nonfinite=self.nonfinite)
        if lead is None and (len(got) != 2 or got[1] != self.lanes):
            raise SchemaError(f"add_batch expects leading shape (T, lanes={self.lanes}), got {got}")
        T = 1 if lead is not None else got[0]
        rows = T * self.lanes
        if rows == 0:
            return
        if not self._has_done:
            is_last = np.zeros(rows, np.bool_)
        elif T == 1:
            is_last = self._prev_done
            self._prev_done = np.logical_or(arrays["terminated"], arrays["truncated"]).reshape(self.lanes)
        else:
            done = np.logical_or(arrays["terminated"], arrays["truncated"]).reshape(T, self.lanes)
            is_last = np.empty((T, self.lanes), np.bool_)
            is_last[0] = self._prev_done
            is_last[1:] = done[:-1]
            self._prev_done = done[-1].copy()
            is_last = is_last.reshape(rows)
        if lead is None:
            arrays = {name: a.reshape(rows, *a.shape[2:]) for name, a in arrays.items()}
        self._write(arrays, is_last, rows)

    def _append_last(self, last_obs: Any) -> None:
        obs_names = self.schema.obs_names
        if not isinstance(last_obs, dict):
            if len(obs_names) != 1:
                raise SchemaError(f"`last_obs` must be a dict with keys {list(obs_names)}")
            last_obs = {obs_names[0]: last_obs}
        data: dict[str, Any] = {}
        for f in self.schema.fields:
            if f.name in obs_names:
                data[f.name] = last_obs[f.name.removeprefix("obs/")] if f.name not in last_obs else last_obs[f.name]
            else:
                data[f.name] = np.zeros((self.lanes, *f.shape), f.dtype)
        arrays, _ = self.schema.validate_batch(data, (self.lanes,), cast=self.cast, nonfinite=self.nonfinite)
        self._write(arrays, np.ones(self.lanes, np.bool_), self.lanes)
        self._prev_done[:] = False

    def _write(self, flat: dict[str, np.ndarray], is_last: np.ndarray, rows: int) -> None:
        """Write ``rows`` rows (every array has leading dimension ``rows``) and publish them."""
        # allocate every segment this batch needs before writing a byte of it
        free = self.usable - self._n if self._seg is not None else 0
        need = 0 if rows <= free else -(-(rows - free) // self.usable)
        first_chain = self._chain + 1 if self._seg is not None else self._chain
        while len(self._spare) < need:
            self._spare.append(self._new_segment(first_chain + len(self._spare)))
        pos = 0
        try:
            while pos < rows:
                if self._seg is None or self._n == self.usable:
                    self._roll()
                k = min(rows - pos, self.usable - self._n)
                self._write_group(flat, is_last, pos, k)
                pos += k
        except BaseException as exc:
            if not isinstance(exc, (KeyboardInterrupt, SchemaError)):
                self._failed = exc
            raise

    def _write_group(self, flat: dict[str, np.ndarray], is_last: np.ndarray, pos: int, k: int) -> None:
        seg = self._seg
        assert seg is not None
        n = self._n
        cols = seg.columns
        if pos == 0 and k == len(is_last):
            for name, x in flat.items():
                cols[name][n : n + k] = x
            seg.is_last[n : n + k] = is_last
        else:
            for name, x in flat.items():
                cols[name][n : n + k] = x[pos : pos + k]
            seg.is_last[n : n + k] = is_last[pos : pos + k]
        seq0 = self.rows_written
        crc = group_seed(seg.header, n, seq0 + 1, k)
        lo, hi = self.layout.records_span(n, n + k)
        crc = _extend(seg.view[lo:hi], crc)
        if k == 1:
            seg.stamp_seq[n] = seq0 + 1
            seg.stamp_crc[n] = crc
            seg.stamp_glen[n] = 1
        else:
            seg.stamp_seq[n : n + k] = np.arange(seq0 + 1, seq0 + k + 1, dtype=np.uint64)
            seg.stamp_crc[n : n + k] = crc
            seg.stamp_glen[n : n + k] = k
        self.rows_written = seq0 + k
        self._n = n + k
        if self.durability == "batch":
            seg.sync_rows(n, n + k)
            seg.publish(n + k, synced=n + k)
            seg.sync_control()
            self._synced = n + k
        else:
            seg.publish(n + k)
        if self._n == self.usable:
            self._seal(seg)  # full: sealed now, so eviction and readers see it as immutable
        self.store._dirty = True

    def _roll(self) -> None:
        if self._seg is not None:  # full, hence already sealed
            self._seg.close(fdatasync=self.durability != "process")
        self._chain = self._chain + 1 if self._seg is not None else self._chain
        self._seg = self._spare.pop(0) if self._spare else self._new_segment(self._chain)
        self._n = self._synced = 0
        self.store._need_scan = True

    def _seal(self, seg: Segment) -> None:
        n = self._n
        if self.durability != "process":
            seg.sync_rows(self._synced, n)
        seal_crc = _crc32c.crc32c(seg.view[self.layout.stamps_offset :][: n * 16])
        if self.durability != "process":
            self._synced = n
        seg.publish(n, synced=self._synced, state=STATE_SEALED, seal_crc=seal_crc)
        if self.durability != "process":
            seg.sync_control()

    def _new_segment(self, chain_index: int) -> Segment:
        store = self.store
        alloc = store._lock("alloc.lock")
        alloc.acquire(exclusive=True, blocking=True)
        try:
            store.evict_for_new_segment()
            sid = store.allocate_segment_id()
            header = Header(
                store_uuid=store.store_uuid, segment_id=sid, writer_id=self.writer_id, lanes=self.lanes,
                session_epoch=self.epoch, chain_index=chain_index,
                first_seq=chain_index * self.usable,
                schema_hash=self.schema.hash, segment_records=store.segment_records, usable_records=self.usable,
                file_size=self.layout.file_size, created_ns=now_ns(),
            )
            try:
                return Segment.create(store.segments_dir, header, self.layout)
            except DiskFullError:
                if store.on_full != "evict" or not self._evict_one():
                    raise
                return Segment.create(store.segments_dir, header, self.layout)
        finally:
            alloc.release()

    def _evict_one(self) -> bool:
        """On a full disk, delete the oldest sealed segment whatever the capacity (alloc.lock held)."""
        return bool(self.store.evict_for_new_segment(force_one=True))

    def _discard(self, seg: Segment) -> None:
        path = seg.path
        seg.close()
        doomed = path.with_name(path.name + ".deleted")
        os.rename(path, doomed)
        doomed.unlink()
        fsync_dir(path.parent)
