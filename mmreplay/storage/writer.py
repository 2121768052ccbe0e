"""Writer: one writer session appending a vector env's steps into its own segments.

A writer owns ``lanes`` lanes (one per environment of a vector env) and the segments it
allocates; rows are laid out ``(time, lane)``, so one vector-env step is one contiguous write,
and the next row of a lane is ``lanes`` rows further on (possibly in the session's next
segment). With ``lane_segments`` (the default for frame-sized rows, ``segment_supply.use_lane_segments``)
each lane has a chain of single-lane segments of its own instead, written in step: a lane's
consecutive steps are then consecutive records, so a frame stack is one contiguous read.
``is_last`` is derived: the row after a ``terminated``/``truncated`` row of a lane is
that episode's final observation, which is what gymnasium's default next-step autoreset
returns, so the plain vector-env loop stores episodes RLDS/Minari style (T+1 observations).

Append protocol: validate the whole batch (nothing written on error); allocate every segment
the batch will need (a full disk fails here, before any write); copy the payload into the
records; then, per commit group, write the stamps (one compiled call: row numbers, row digests,
group crc and length) and only then publish the new committed count in the control slot. One
crc32c call and one stamping call per commit group, no Python loop per row or lane.

Group commit. Rows are stamped and published in groups: at once when ``publish_rows`` (default
1,024) rows are waiting or the segment is full, otherwise by a background publisher thread at
most ``publish_interval_s`` (default 5 ms) after they were added, and always by ``publish()``,
``flush()``, ``close()`` and by a ``refresh()`` of the writer's own store handle (so a learner
sampling through the same handle sees every row it added). A single-row ``add`` of a step as it
usually comes is one generated check and one copy of the record's bytes (``step_spec.py``).

Durability (``durability=``), what each level guarantees:

=============  ===================================  =======================  =============================
level          visible to other processes           lost to ``kill -9``      lost to power loss / kernel
                                                                             crash
=============  ===================================  =======================  =============================
``process``    within ``publish_interval_s``        rows not yet published   anything not yet written back
                                                    (≤ 5 ms of adds)         by the kernel; recovery drops
                                                                             invalid rows
``segment``    within ``publish_interval_s``        same                     rows after the last sealed
(default)                                                                    segment's background sync, or
                                                                             the last ``flush()``
``batch``      when ``add`` returns                 nothing acknowledged     nothing acknowledged
=============  ===================================  =======================  =============================

``flush()`` publishes and msyncs everything written so far, and waits for sealed segments'
syncs; ``close()`` does the same, then releases the writer id. Readers never see a row before
it is published, and recovery keeps every published row after a ``kill -9``.

A writer must be used in the process that opened it (not after ``fork()``); one writer id has
at most one live session (``WriterBusyError`` otherwise), and a killed writer's id is free at
once (the kernel drops its ``flock``).
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..core import failpoint as _failpoint
from .format import kernel
from .segment_supply import SegmentSupply, use_lane_segments
from ..core.errors import SchemaError, StoreClosedError, WriterFailedError
from .claims import MAX_WRITERS, claim_writer_id
from .step_spec import StepSpec
from .segment import Segment
from .locks import ADMIN

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .files import StoreFiles

Durability = Literal["process", "segment", "batch"]
"""The writer's ``durability=`` levels (see the module docstring)."""
_DONE, _NOT_DONE = np.ones(1, np.bool_), np.zeros(1, np.bool_)  # a single lane's last step done or not
_DONE.flags.writeable = _NOT_DONE.flags.writeable = False
_PID = [os.getpid()]  # this process's pid, kept current by an at-fork hook (no syscall per add)
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))
__all__ = ["MAX_WRITERS", "Durability", "Writer", "WriterHooks"]


def _nothing(*args: Any) -> None:
    return None


@dataclass(frozen=True, slots=True)
class WriterHooks:
    """What a writer tells the store handle that opened it (``ReplayStore.writer``): rows were
    published (its readers see them at their next refresh), a segment was taken (a directory scan
    is due), a segment was sealed (its rows need no check by this handle), the writer closed, a
    sealed segment's check found rows changed in the file (its reader masks them)."""

    published: Callable[[], None] = _nothing
    rolled: Callable[[], None] = _nothing
    sealed: Callable[[str], None] | None = None
    closed: Callable[[Writer], None] = _nothing
    damaged: Callable[[str, Any], None] | None = None
    """A sealed segment's check found rows changed since this writer wrote them: its name and slots."""


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

    writer_id: int
    """The writer id this session holds (no other live session of the store has it); segment files
    carry it in their names."""

    def __init__(
        self,
        store: StoreFiles,
        *,
        lanes: int,
        writer_id: int | None,
        durability: Durability,
        cast: Literal["no", "safe", "same_kind"],
        nonfinite: Literal["error", "warn", "allow"],
        publish_rows: int = 1024,
        publish_interval_s: float = 0.005,
        lane_segments: bool | None = None,
        hooks: WriterHooks | None = None,
    ) -> None:
        if lane_segments not in (None, True, False):
            raise ValueError(f"`lane_segments` must be True, False or None (the default's choice), got {lane_segments!r}")
        self._files = store
        self._hooks = hooks or WriterHooks()
        self.lanes = int(lanes)
        """Parallel environments: every field of an ``add`` has leading dimension ``lanes``."""
        self.durability = durability
        """What survives a crash, and when rows are synced (see the module docstring)."""
        self.cast = cast
        """How field dtypes are cast to the schema's (``"no"``, ``"safe"``, ``"same_kind"``)."""
        self.nonfinite = nonfinite
        """What a NaN or infinity in a float field does: ``"error"``, ``"warn"`` or ``"allow"``."""
        self.schema = store.schema
        """The store's schema: the fields an ``add`` takes."""
        self._layout = store.layout
        self.lane_segments = self.lanes > 1 and (use_lane_segments(store, self.lanes) if lane_segments is None
                                                 else bool(lane_segments))
        """Whether each lane writes segments of its own (``ReplayStore.writer(lane_segments=)``)."""
        # segments written at once, and lanes in each: (1, lanes), or (lanes, 1) with lane segments
        self._chains, seg_lanes = (self.lanes, 1) if self.lane_segments else (1, self.lanes)
        self._usable = store.segment_records // seg_lanes * seg_lanes  # rows a segment takes
        self._pid = os.getpid()
        self._admin = store.lock(ADMIN)
        if not self._admin.acquire(exclusive=False):
            from ..core.errors import StoreLockedError

            raise StoreLockedError(f"{store.path} is locked for admin work (recover/compact)")
        self._lock = None
        try:
            self.writer_id, self._lock = claim_writer_id(store, writer_id)
            from .recovery import recover_writer

            recover_writer(store, self.writer_id)
        except BaseException:
            self._release_locks()
            raise
        self._epoch = secrets.randbits(63) | 1
        self.rows_written = 0
        """Rows this session has published so far (every lane; final observations included)."""
        # each chain is a session of its own to readers and recovery (its own epoch)
        epochs = [self._epoch, *(secrets.randbits(63) | 1 for _ in range(self._chains - 1))]
        self._supply = SegmentSupply(store, self.writer_id, seg_lanes, self._usable, epochs, durability,
                                     self._hooks.sealed, self._hooks.damaged)
        self._segs: tuple[Segment, ...] = ()  # the open segment of each chain (none before the first roll)
        self._n = 0  # rows written to each open segment (the chains move in step)
        self._synced = 0
        self._prev_done = np.zeros(self.lanes, np.bool_)
        self._failed: BaseException | None = None
        self._closed = False
        self._has_done = "terminated" in self.schema and "truncated" in self.schema
        # group commit: rows are stamped and published together (see the module docstring)
        self._mutex = threading.RLock()
        self._pub = 0  # published rows of the current segment
        self._staged_at = 0.0  # when the oldest unpublished row was written; 0.0: none
        self._pub_rows = 1 if durability == "batch" else int(publish_rows)
        self._publish_interval_s = float(publish_interval_s)
        self._stop = threading.Event()
        self._wake = threading.Event()  # set while rows wait for the publisher (under the mutex)
        self._publisher: threading.Thread | None = None
        if self._pub_rows > 1:
            self._publisher = threading.Thread(target=self._publisher_loop, daemon=True,
                                               name=f"mmreplay-publish-w{self.writer_id}")
            self._publisher.start()
        # a step as it usually comes (exact dtypes, shapes, finite floats) is checked without copies
        self._steps = StepSpec(self.schema, self._layout, self.lanes, nonfinite)
        self._row_bytes = self._steps.row_bytes if self._has_done else None  # single-lane rows: _add_row
        self._term_at, self._trunc_at = self._steps.row_done if self._row_bytes else (0, 0)
        self._rec0, self._rec_bytes = self._layout.records_offset, self._layout.record_bytes
        self._zero_record = np.zeros((), self._layout.record_dtype)
        atexit.register(self._atexit)
        try:  # the first segment is made now, the next ones as the previous is taken (segment_supply.py)
            with self._mutex:  # once this one is half full (a short session never makes a spare)
                self._roll()
                # the compiled stamping and float checks are loaded now, not in an add: a writer of several lanes
                # loads numba (~0.5 s); any writer warms the kernels when numba is already loaded (loading them
                # from numba's cache took 0.5-1 s in the first publish of a training loop)
                if kernel(load=self.lanes > 1):
                    self._segs[0].stamp(0, 0, 0)
                    self._segs[0].rows_finite(0, 0)
        except BaseException:
            self.close()
            raise

    def _release_locks(self) -> None:
        if self._lock is not None:
            self._lock.release()
        self._admin.release()

    def add(self, batch: Mapping[str, Any] | None = None, /, **fields: Any) -> None:
        """Append one vector-env step: every field has leading dimension ``lanes``.

        ``obs`` is the observation the action was taken in (not ``next_obs``): pass the
        arrays ``envs.step`` returned, with the previous observation. Raises ``SchemaError``
        or ``InvalidValueError`` before writing anything if a field is wrong.
        """
        data = fields if batch is None else ({**batch, **fields} if fields else batch)
        if self._row_bytes is None or not self._add_row(data):
            self._append(data, True)

    def add_batch(self, batch: Mapping[str, Any] | None = None, /, **fields: Any) -> None:
        """Append ``T`` vector-env steps at once: every field has leading shape ``(T, lanes)``."""
        self._append(fields if batch is None else ({**batch, **fields} if fields else batch), False)

    def publish(self) -> None:
        """Make every row added so far visible to readers in other processes now."""
        with self._mutex:
            if self._segs and self._failed is None and not self._closed:
                self._publish()

    def flush(self) -> None:
        """Publish, and make every published row durable (msync), whatever the durability level."""
        self._check()
        with self._mutex:
            if not self._segs:
                return
            self._publish()
            self._wait_syncs()
            if self.durability == "process":
                try:
                    self._supply.sync_closed()
                except BaseException as exc:
                    self._failed = exc
                    raise
            if self._synced < self._n:
                for seg in self._segs:
                    seg.publish_durable(self._synced, self._n)
                self._synced = self._n

    def end_episodes(self, last_obs: Any) -> None:
        """Write ``last_obs`` (leading dimension ``lanes``) as every lane's final row and go on: the last
        steps become transitions to it (``next_obs``); the episodes end unflagged (``info``: incomplete)."""
        self._check()
        self._append_last(last_obs)

    def close(self, last_obs: Any = None) -> None:
        """Publish and seal the open segment, make it durable and release the writer id; ``last_obs``
        (optional) is first written as every lane's final row (see ``end_episodes``)."""
        if self._closed:
            return
        if self._pid != os.getpid():
            self._closed = True
            return
        self._stop.set()
        self._wake.set()
        if self._publisher is not None and self._publisher is not threading.current_thread():
            self._publisher.join()
        try:
            if last_obs is not None and self._failed is None:
                self._append_last(last_obs)
            with self._mutex:
                if self._segs and self._failed is None:
                    self._publish()
                    if self._n == 0:
                        self._supply.discard(self._segs)  # never written: leave no empty segment
                    else:
                        if self._n < self._usable:
                            for seg in self._segs:
                                seg.seal(self._n)
                        self._supply.retire(self._segs)
                    self._segs = ()
                try:
                    self._supply.close()
                except BaseException as exc:
                    self._failed = exc
                    raise
        finally:
            self._closed = True
            atexit.unregister(self._atexit)
            self._release_locks()
            self._hooks.closed(self)

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _atexit(self) -> None:
        try:
            self.close()
        except Exception:  # pragma: no cover - best effort at interpreter exit
            pass

    @property
    def last_row_id(self) -> int:
        """Global row id of the newest row written (the last lane's row of the newest step); -1 if none."""
        return -1 if not self._segs or self._n == 0 else self._segs[-1].header.segment_id * self._layout.segment_records + self._n - 1

    @property
    def last_step_ids(self) -> np.ndarray:
        """Global row ids of each lane's newest row (int64, ``(lanes,)``; -1 before the first step)."""
        out = np.full(self.lanes, -1, np.int64)
        if not self._segs or self._n == 0:
            return out
        R = self._layout.segment_records
        if self._chains == 1:
            seg = self._segs[0]
            return seg.header.segment_id * R + self._n - self.lanes + np.arange(self.lanes, dtype=np.int64)
        return np.array([seg.header.segment_id * R + self._n - 1 for seg in self._segs], np.int64)

    def stats(self) -> dict[str, Any]:
        """This session as tools and tests see it: the open segment (chain index, rows), rows not
        yet published, whether the next segment is ordered, and the publisher thread's state."""
        with self._mutex:
            seg = self._segs[0] if self._segs else None
            return {"writer_id": self.writer_id, "lanes": self.lanes, "lane_segments": self.lane_segments,
                    "rows_written": self.rows_written,
                    "segment_chain_index": None if seg is None else seg.header.chain_index,
                    "segment_rows": self._n, "unpublished_rows": self._n - self._pub if seg else 0,
                    "next_segment_ordered": not self._supply.idle, "publisher_waiting": self._wake.is_set(),
                    "publisher_alive": self._publisher is not None and self._publisher.is_alive()}

    def release_spares(self) -> None:
        """Give back the segments made ahead of need now (the next roll makes its segment itself)."""
        with self._mutex:
            self._supply.drop_spares()

    # -- internals ------------------------------------------------------------------------
    def _check(self) -> None:
        if self._pid != os.getpid():
            raise StoreClosedError("writer used after fork(); open a writer in the child process")
        if self._closed:
            raise StoreClosedError("writer is closed: no row can be added to it",
                                   hint="open a new writer session with store.writer(...)")
        if self._failed is not None:
            raise WriterFailedError(f"writer {self.writer_id} failed earlier: {self._failed!r}")

    def _add_row(self, data: Mapping[str, Any]) -> bool:
        """Append one single-lane step as it usually comes (every field, exact dtypes and shapes,
        finite floats) into the open segment: its record's bytes copied in at once, then the same
        ``_after_write`` as every append. False (nothing written): the general path handles it."""
        if self._pid != _PID[0] or self._closed or self._failed is not None:
            return False
        with self._mutex:
            seg, n, pd = self._segs[0] if self._segs else None, self._n, self._prev_done  # pd: _DONE / _NOT_DONE, an array after the general path
            if (seg is None or n >= self._usable  # (a roll first: the general path)
                    or (rec := self._row_bytes(data, b"\x00" if pd is _NOT_DONE or (pd is not _DONE and not pd[0])
                                               else b"\x01")) is None):
                return False
            try:
                seg.mm[(lo := self._rec0 + n * self._rec_bytes) : lo + self._rec_bytes] = rec
                self._n = n + 1
                self._prev_done = _DONE if rec[self._term_at] or rec[self._trunc_at] else _NOT_DONE
                if _failpoint.ACTIVE:
                    _failpoint.hit("after_payload")
                self._after_write()  # the one publish / seal / next-segment policy
            except BaseException as exc:
                self._failed = exc
                raise
        return True

    def _append(self, data: Mapping[str, Any], step: bool) -> None:
        """The one append path: validate everything (nothing is written if a field is wrong),
        then derive ``is_last`` and write (payload, stamps, publish per the durability level)."""
        if self._pid != _PID[0] or self._closed or self._failed is not None:
            self._check()
        L = self.lanes
        # a step that fits the open segment is copied first and its float runs checked in place
        # (one reduction per run; unpublished and zeroed if one fails); others are checked first
        post = (step and L > 1 and self._chains == 1 and bool(self._steps.float_checks) and self._segs
                and self._n + L <= self._usable)
        arrays = self._steps.exact(data, not post) if step else None
        if post and arrays is not None:
            with self._mutex:
                try:
                    self._write(arrays, self._prev_done, L, post=True)
                    if self._has_done:
                        self._prev_done = arrays["terminated"] | arrays["truncated"]
                    return
                except _NonFinite:
                    arrays = None  # the full validation explains it (error), or warns / lets it pass
        T = 1
        if arrays is None:
            arrays, got = self.schema.validate_batch(data, (L,) if step else None, cast=self.cast,
                                                     nonfinite=self.nonfinite)
            if not step:
                if len(got) != 2 or got[1] != L:
                    raise SchemaError(f"add_batch expects leading shape (T, lanes={L}), got {got}")
                T = got[0]
                if T == 0:
                    return
                arrays = {name: a.reshape(T * L, *a.shape[2:]) for name, a in arrays.items()}
        rows = T * L
        with self._mutex:
            if not self._has_done:
                self._write(arrays, np.zeros(rows, np.bool_), rows)
                return
            if T == 1:
                is_last = self._prev_done
            else:
                done = np.logical_or(arrays["terminated"], arrays["truncated"]).reshape(T, L)
                is_last = np.empty((T, L), np.bool_)
                is_last[0] = self._prev_done
                is_last[1:] = done[:-1]
                is_last = is_last.reshape(rows)
            self._write(arrays, is_last, rows)
            if T == 1:
                self._prev_done = arrays["terminated"] | arrays["truncated"]
            else:
                self._prev_done = np.logical_or(arrays["terminated"][rows - L :], arrays["truncated"][rows - L :])

    def _append_last(self, last_obs: Any) -> None:
        obs_names = self.schema.obs_names
        if not isinstance(last_obs, dict):
            if len(obs_names) != 1:
                raise SchemaError(f"`last_obs` must be a dict with keys {list(obs_names)}")
            last_obs = {obs_names[0]: last_obs}
        data = {f.name: (last_obs[f.name.removeprefix("obs/")] if f.name not in last_obs else last_obs[f.name])
                if f.name in obs_names else np.zeros((self.lanes, *f.shape), f.dtype) for f in self.schema.fields}
        arrays, _ = self.schema.validate_batch(data, (self.lanes,), cast=self.cast, nonfinite=self.nonfinite)
        with self._mutex:
            self._write(arrays, np.ones(self.lanes, np.bool_), self.lanes)
            self._prev_done = np.zeros(self.lanes, np.bool_)

    def _write(self, flat: Mapping[str, np.ndarray], is_last: np.ndarray, rows: int, post: bool = False) -> None:
        """Write ``rows`` rows (every array has leading dimension ``rows``, in ``(time, lane)``
        order); caller holds the mutex. With lane segments, lane ``c``'s rows (``x[c::lanes]``)
        go to chain ``c``. ``post``: rows that fit the open segment whose floats are checked once
        copied (``_NonFinite`` leaves them uncounted and zeroed)."""
        C = self._chains
        per = rows // C  # rows each chain takes
        # allocate every segment this batch needs, in every chain, before writing a byte of it
        free = self._usable - self._n if self._segs else 0
        if per > free:
            self._supply.ensure(-(-(per - free) // self._usable))
        pos = 0
        # what each chain takes: all of it, or with lane segments lane c's rows (strided views)
        parts = ((flat, is_last),) if C == 1 else tuple(({name: x[c::C] for name, x in flat.items()}, is_last[c::C])
                                                        for c in range(C))
        try:
            while pos < per:
                n = self._n
                if not self._segs or n == self._usable:
                    self._roll()
                    n = 0
                k = per - pos if per - pos <= self._usable - n else self._usable - n
                whole = pos == 0 and k == per
                for seg, (src, last) in zip(self._segs, parts):
                    cols = seg.columns  # (a single exact row took _add_row's one-copy path instead)
                    for name, x in src.items():
                        cols[name][n : n + k] = x if whole else x[pos : pos + k]
                    seg.is_last[n : n + k] = last if whole else last[pos : pos + k]
                    if post and not seg.rows_finite(n, n + k):
                        seg.records[n : n + k] = self._zero_record  # never counted, never published
                        raise _NonFinite
                self._n = n + k
                pos += k
                if _failpoint.ACTIVE:
                    _failpoint.hit("after_payload")
                self._after_write()
        except BaseException as exc:
            if not isinstance(exc, (KeyboardInterrupt, SchemaError, _NonFinite)):
                self._failed = exc
            raise

    def _after_write(self) -> None:
        """Publish when the policy says so; seal full segments. Caller holds the mutex."""
        n = self._n
        now = time.monotonic()
        if self._staged_at == 0.0:
            self._staged_at = now  # the oldest unpublished row's time
        # the next segment is ordered (``_order_at``) from half of the first one (a short session makes no
        # spare), then as soon as a segment is taken (a whole segment's time to make it); rows are
        # published first, so the eviction it runs counts every row written
        order_next = n >= self._order_at and self._supply.idle
        if (order_next or n == self._usable or (n - self._pub) * self._chains >= self._pub_rows
                or now - self._staged_at >= self._publish_interval_s):  # rows waited long enough
            self._publish()
            if n == self._usable:  # full: sealed now, so eviction and readers see it as immutable
                for seg in self._segs:
                    seg.seal(n)
        elif not self._wake.is_set():
            self._wake.set()  # the publisher publishes these rows if no add comes within the interval
        if order_next:
            self._supply.prefetch()
            self._order_at = self._usable + 1  # ordered: the supply is busy until the next roll
        self._hooks.published()

    def _publish(self) -> None:
        """Stamp rows ``[pub, n)`` of each open segment as one commit group and publish them
        (``Segment.commit``). Caller holds the mutex."""
        n, p = self._n, self._pub
        if not self._segs or n == p:
            return
        batch = self.durability == "batch"
        for seg in self._segs:
            seg.commit(p, n, durable=batch)
        if batch:
            self._synced = n
        self._pub = n
        self._staged_at = 0.0  # nothing unpublished
        self.rows_written = (self._segs[0].header.first_seq + n) * self._chains

    def _roll(self) -> None:
        nxt = self._supply.next()
        if self._segs:  # full, hence already published and sealed
            self._supply.retire(self._segs)
        self._segs = nxt
        self._n = self._synced = self._pub = 0
        self._order_at = 0 if nxt[0].header.chain_index > 0 else -(-self._usable // 2)
        self._hooks.rolled()

    def _publisher_loop(self) -> None:
        """The publisher thread: publish rows left unpublished for ``publish_interval_s``, only ever
        under the mutex, ending at ``close()`` (which sets ``_stop`` before ``_wake``, so a clear of
        ``_wake`` here cannot lose the signal). The thread sleeps until rows are
        staged (``_wake``), never on a timer: waking every few ms cost a CPU-bound actor loop ~10%
        (GIL handoffs; CartPole, ``python benchmarks/collect.py`` when this was written)."""
        interval = self._publish_interval_s
        while not self._stop.is_set():  # close() sets _stop, then _wake: a clear below cannot lose it
            self._wake.wait()
            if self._stop.is_set():
                return
            delay = self._staged_at + interval - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                return
            with self._mutex:
                if self._closed or self._failed is not None:
                    return
                if not self._segs or self._n == self._pub:
                    self._wake.clear()  # published by an add meanwhile: sleep until rows are staged again
                elif time.monotonic() - self._staged_at >= interval:
                    try:
                        self._publish()
                    except BaseException as exc:  # pragma: no cover - I/O failure
                        self._failed = exc
                        return
                    self._wake.clear()

    def _wait_syncs(self) -> None:
        try:
            self._supply.wait()
        except BaseException as exc:
            self._failed = exc
            raise


class _NonFinite(Exception):
    """A copied step holds a non-finite float: it goes through the full validation instead."""
