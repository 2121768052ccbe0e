"""The driver side of ``cluster.py``: actors' runs, restarts, progress, limits, weights and ingestion.

One monitor thread polls every ``poll_s`` seconds. Invariants kept here:

* An actor's run ends in success (finished), an error raised in it (an env or store error: not
  retried), or a failed call (the process died, or the connection was cut). After a failed call
  the next progress answer decides: a new incarnation means Ray restarted the actor (counted,
  and the run launched again with what is left of its budget and the latest weights); the same
  incarnation still running means the run goes on (``join`` waits for it again). Ray's
  ``ActorDiedError`` means no restart is left: the actor failed.
* Counts (steps, episodes, bytes) are kept per incarnation and folded when it ends; episode
  returns are drained by the actor, so each arrives once.
* Step limits: an equal share of the allowed total plus one segment per actor, in actor-total
  rows (see ``_limit_for``); updates carry a sequence number, as a threaded actor may run calls
  out of order.
* Ingestion runs in the monitor thread (and in :meth:`Fleet.ingest` calls from the learner),
  serialised by a lock; ``_shipping.ingest_archives`` makes it exactly once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..archive.shipping import ingest_archives
from ._ray_actor import actor_class, ensure_ray

if TYPE_CHECKING:
    from ..storage import ReplayStore
    from ._ray_actor import ActorSpec
    from .specs import ShipSpec

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Slot:
    """Driver-side state of one actor across its incarnations."""

    handle: Any
    budget: int | None  # env steps for collect; None: until stopped (trainer)
    run_ref: Any = None
    progress_ref: Any = None
    incarnation: str | None = None
    cur: dict[str, Any] = dataclasses.field(default_factory=dict)
    base: dict[str, float] = dataclasses.field(default_factory=lambda: {"steps": 0, "transitions": 0, "episodes": 0,
                                                                        "bytes": 0, "loop_s": 0.0})
    restarts: int = 0
    finished: bool = False
    error: str | None = None
    exception: BaseException | None = None
    """The exception the actor's run raised (Ray's ``RayTaskError.cause``), beside ``error``'s text."""
    limit_sent: int | None = None
    archive: str | None = None
    dead: set[str] = dataclasses.field(default_factory=set)
    """Incarnations that died or finished."""
    lost: str | None = None
    """Why the run's call failed, until a progress answer says what became of the actor."""
    lost_since: float = 0.0


class Fleet:
    """Actors, their restarts, progress, limits, weights, and the learner's ingestion (one thread)."""

    def __init__(self, specs: list[ActorSpec], budgets: list[int | None], ship: ShipSpec, *, seed: int,
                 store: ReplayStore | None, archive_root: str, policy_path: str | None = None,
                 poll_s: float = 0.05, keep_returns: int | None = 1000) -> None:
        self.specs, self.budgets, self.ship = specs, budgets, ship
        self.address, self.actor_cpus, self.max_restarts, self.seed = ship.address, ship.actor_cpus, ship.max_restarts, seed
        self.store, self.archive_root, self.storage_options = store, archive_root, ship.options
        self.ingest_s, self.policy_path, self.poll_s = ship.ingest_s, policy_path, poll_s
        self.slots: list[Slot] = []
        self.returns: deque[float] = deque(maxlen=keep_returns)
        self.episodes = 0
        self.rows_ingested = 0
        self.allowed = -1
        self.ingest_error: BaseException | None = None
        """The last ingest's error (cleared by a successful one)."""
        self.monitor_error: str | None = None
        self._lock = threading.RLock()  # the store handle and the slots
        self._ingest_lock = threading.Lock()
        self._weights: Any = None
        self._policy_stamp: tuple[int, int] | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._owns_ray = False
        self._stopping = False
        self._last_ingest = 0.0
        self._seq = 0  # orders limit updates
        self.lost_timeout_s = 300.0

    # lifecycle
    def start(self) -> None:
        need = math.ceil(len(self.specs) * self.actor_cpus)
        self._owns_ray = ensure_ray(self.address, max(os.cpu_count() or 1, need))
        try:
            cls = actor_class(self.actor_cpus, self.max_restarts)
            if self.policy_path is not None:
                self.publish(self.policy_path, send=False)
            for spec, budget in zip(self.specs, self.budgets):
                slot = Slot(cls.remote(spec), budget)
                self.slots.append(slot)
                self._launch(slot, spec)
        except BaseException:
            self.shutdown()
            raise
        self._thread = threading.Thread(target=self._loop, name="mmreplay-ray-fleet", daemon=True)
        self._thread.start()

    def _launch(self, slot: Slot, spec: ActorSpec) -> None:
        """Start (or restart) the actor's run with what is left of its budget and the latest weights."""
        steps = None
        if slot.budget is not None:
            left = slot.budget - int(slot.base["steps"])
            if left <= 0:
                slot.finished = True
                return
            steps = -(-left // spec.envs) * spec.envs
        seed = self.seed + 100_003 * slot.restarts  # a restarted actor does not replay its episodes
        limit = self._limit_for(slot, spec) if slot.budget is None else None
        self._seq += 1
        slot.run_ref = slot.handle.run.remote(steps, seed, self._weights, limit, self._seq)
        slot.limit_sent = limit
        if self._stopping:
            slot.handle.stop.remote()

    def stop(self, timeout: float = 120.0) -> None:
        """Ask every actor to stop, wait for their last exports, ingest what is left, release Ray."""
        import ray

        with self._lock:
            self._stopping = True
            for s in self.slots:
                with contextlib.suppress(Exception):
                    s.handle.stop.remote()
        deadline = time.monotonic() + timeout
        while any(not s.finished and s.error is None for s in self.slots) and time.monotonic() < deadline:
            time.sleep(self.poll_s)
            if self._thread is None or not self._thread.is_alive():
                self._step()  # the monitor thread is gone (stopped, or never started)
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        self.ingest()
        for s in self.slots:
            with contextlib.suppress(Exception):
                ray.kill(s.handle, no_restart=True)
        self.shutdown()

    def shutdown(self) -> None:
        if self._owns_ray:
            import ray

            ray.shutdown()
            self._owns_ray = False

    # the monitor
    def _loop(self) -> None:
        while not self._done.wait(self.poll_s):
            try:
                self._step()
            except Exception:  # pragma: no cover - a bug: surface it through check()
                self.monitor_error = traceback.format_exc()
                log.exception("cluster monitor failed")

    def _step(self) -> None:
        with self._lock:
            self._poll_runs()
            self._poll_progress()
            self._send_limits()
            self._watch_policy()
        if self.store is not None and time.monotonic() - self._last_ingest >= self.ingest_s:
            try:
                self.ingest()
            except Exception as exc:  # an unusable archive, or a storage hiccup (retried next time)
                self.ingest_error = exc
                log.warning("ingest failed: %s", exc)

    def _poll_runs(self) -> None:
        import ray

        for s in self.slots:
            if s.run_ref is None or s.finished or s.error is not None:
                continue
            ready, _ = ray.wait([s.run_ref], timeout=0)
            if not ready:
                continue
            ref, s.run_ref = s.run_ref, None
            try:
                final = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                # the process died (Ray restarts it) or the call was cut off: the next progress
                # answer tells which (a new incarnation, or the same one still running)
                s.lost, s.lost_since = f"{type(exc).__name__}: {exc}", time.monotonic()
                continue
            except Exception as exc:  # an error inside the actor (env, store): not retried
                s.error = str(exc)
                cause = getattr(exc, "cause", None)  # (what the actor raised; ``exc`` is Ray's wrapper)
                s.exception = cause if isinstance(cause, BaseException) else exc
                continue
            self._absorb(s, final)
            self._fold(s)
            s.finished = True

    def _fold(self, s: Slot) -> None:
        """Close an incarnation's books: its counts move to the actor's base."""
        for k in s.base:
            s.base[k] += s.cur.get(k, 0)
        s.cur = {}
        if s.incarnation is not None:
            s.dead.add(s.incarnation)
        s.incarnation = None

    def _absorb(self, s: Slot, p: dict[str, Any]) -> None:
        self.returns.extend(p["returns"])  # drained by the actor: each return arrives once
        self.episodes += len(p["returns"])
        if p["incarnation"] in s.dead:
            return  # a late report of a closed incarnation: its counts are folded already
        s.incarnation = p["incarnation"]
        s.cur = p
        s.archive = p["archive"]

    def _restarted(self, i: int, s: Slot, why: str) -> None:
        """Ray restarted actor ``i`` (a new process): close the old incarnation, run again."""
        self._fold(s)
        s.restarts += 1
        s.run_ref, s.lost = None, None
        log.warning("actor %d was restarted by Ray (%d so far): %s", i, s.restarts, why)
        self._launch(s, self.specs[i])

    def _on_progress(self, i: int, s: Slot, p: dict[str, Any]) -> None:
        if p["incarnation"] in s.dead:
            self._absorb(s, p)
            return
        if s.incarnation is not None and p["incarnation"] != s.incarnation:
            self._restarted(i, s, s.lost or "a new incarnation answered")
            self._absorb(s, p)
            return
        if s.lost is not None:  # the run's call failed, and this process answers
            if p["running"]:
                s.run_ref, s.lost = s.handle.join.remote(), None  # the same run goes on: wait for it again
            elif p["runs"] == 0:  # a fresh incarnation that never ran: the one we launched on died
                self._restarted(i, s, s.lost)
            else:  # the run ended while its result was lost: this is its final report
                self._absorb(s, p)
                self._fold(s)
                s.finished, s.lost = True, None
                return
        if s.run_ref is not None or s.lost is not None:
            self._absorb(s, p)

    def _poll_progress(self) -> None:
        import ray

        live = [(i, s) for i, s in enumerate(self.slots) if not s.finished and s.error is None]
        for _, s in live:
            if s.progress_ref is None:
                s.progress_ref = s.handle.progress.remote()
        refs = [s.progress_ref for _, s in live]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
        done = set(ready)
        for i, s in live:
            if s.progress_ref not in done:
                continue
            ref, s.progress_ref = s.progress_ref, None
            try:
                p = ray.get(ref)
            except ray.exceptions.ActorDiedError as exc:  # Ray will not restart it (again)
                if s.lost is not None or s.run_ref is None:
                    s.error = (f"actor {i} died ({s.restarts} restarts of {self.max_restarts} allowed): "
                               f"{s.lost or exc}")
                continue
            except ray.exceptions.RayError:
                if s.lost is not None and time.monotonic() - s.lost_since > self.lost_timeout_s:
                    s.error = f"actor {i} unreachable for {self.lost_timeout_s:.0f} s: {s.lost}"
                continue  # restarting, or a cut connection: asked again next round
            self._on_progress(i, s, p)

    def _limit_for(self, s: Slot, spec: ActorSpec) -> int:
        """The rows an actor may hold in its local store: an equal share of the allowed total plus
        one segment, so it can always seal the segment the learner waits for. The actor counts
        the rows an earlier incarnation left in the store against it (they are shipped after
        recovery). Shares are fixed, not borrowed, so the bound holds whatever the timing of
        progress reports."""
        if self.allowed < 0:
            return -1
        share = -(-self.allowed // len(self.slots))
        return share + spec.segment_records // spec.envs * spec.envs

    def _send_limits(self) -> None:
        for i, s in enumerate(self.slots):
            if s.budget is not None or s.run_ref is None:
                continue
            limit = self._limit_for(s, self.specs[i])
            if limit != s.limit_sent:
                self._seq += 1
                s.handle.allow.remote(limit, self._seq)
                s.limit_sent = limit

    def _watch_policy(self) -> None:
        if self.policy_path is None:
            return
        try:
            st = os.stat(self.policy_path)
        except FileNotFoundError:
            return
        if (st.st_ino, st.st_mtime_ns) != self._policy_stamp:
            self.publish(self.policy_path)

    # weights and data
    def publish(self, path: str | os.PathLike[str], *, send: bool = True) -> None:
        """Put the policy file's bytes into Ray's object store and send them to every actor."""
        import ray

        with self._lock:
            st = os.stat(path)
            data = Path(path).read_bytes()
            self._weights = ray.put(data)
            self._policy_stamp = (st.st_ino, st.st_mtime_ns)
            if send:
                for s in self.slots:
                    if not s.finished and s.error is None:
                        s.handle.set_weights.remote(self._weights)

    def ingest(self, store: ReplayStore | str | os.PathLike[str] | None = None) -> int:
        """Pull new sealed segments from the archives into ``store`` (default: the fleet's); rows added.
        Rows added to the fleet's store (through any handle or path) count in ``rows_ingested``."""
        target = store if store is not None else self.store
        if target is None:
            return 0
        with self._ingest_lock:
            self._last_ingest = time.monotonic()
            rep = ingest_archives(target, self.archive_root, storage_options=self.storage_options)
            ours = self.store is not None and Path(getattr(target, "path", target)).resolve() == \
                self.store.path.resolve()
            if ours:
                self.rows_ingested += rep.rows
                self.ingest_error = None
        return rep.rows

    # summaries
    def totals(self) -> dict[str, int]:
        with self._lock:
            out = {k: 0 for k in ("steps", "transitions", "episodes", "bytes")}
            for s in self.slots:
                for k in out:
                    out[k] += int(s.base[k] + s.cur.get(k, 0))
            return out

    def errors(self) -> dict[int, str]:
        with self._lock:
            return {i: s.error for i, s in enumerate(self.slots) if s.error is not None}

    def exceptions(self) -> dict[int, BaseException]:
        with self._lock:
            return {i: s.exception for i, s in enumerate(self.slots) if s.exception is not None}

    @property
    def finished(self) -> bool:
        return all(s.finished or s.error is not None for s in self.slots)


