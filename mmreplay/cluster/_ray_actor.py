"""The actor side of ``cluster.py``: one Ray actor = ``collect.run_worker`` + a local store + an exporter.

Runs inside a Ray worker process on any node. Invariants kept here:

* the local store lives in ``<local_dir>/<run id>/actor-NNN`` on the actor's node, so an actor
  Ray restarts on the same node reopens it: recovery seals the rows the dead incarnation
  published, and the next export ships them; the rows found there count against the actor's
  step limit (they reach the learner too);
* each local store exports into its own archive ``<root>/actor-NNN-<store uuid>`` (one source
  store per archive), every ``export_s`` seconds and once more after the writer closed, sealed
  segments only; a failed export is retried at the next tick;
* the actor is threaded (``max_concurrency``): ``run`` holds one thread while ``progress``,
  ``allow`` (ordered by a sequence number), ``set_weights`` and ``stop`` answer on others; ``run``
  runs once per incarnation, and ``join`` waits for it;
* weights arrive as bytes (from Ray's object store) and are written atomically to a local policy
  file, which the eps-greedy policy of ``collect.py`` reloads when it changes.

``ray`` is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..actors import EnvSpec, PolicyFn, PolicySpec, WorkerConfig, run_worker
from .local_ray import start_local_ray
from .specs import ShipSpec

if TYPE_CHECKING:
    from ..core.schema import Schema

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ActorSpec:
    """One Ray actor's part of a run: its index, env and env copies, the schema and segment size of its
    local store, its archive root, how it ships (``ship``), its policy, the writers' durability, the
    metadata of its local store and the run's id."""

    index: int
    env: EnvSpec
    envs: int
    schema: dict[str, Any]
    segment_records: int
    archive_root: str
    ship: ShipSpec
    policy: PolicySpec | PolicyFn
    durability: str
    metadata: dict[str, Any]
    run_id: str

    @property
    def name(self) -> str:
        return f"actor-{self.index:03d}"

    @property
    def local_capacity(self) -> int:
        return self.ship.local_capacity if self.ship.local_capacity is not None else 64 * self.segment_records

    @property
    def local_dir(self) -> str:
        return self.ship.local_dir or str(Path(tempfile.gettempdir()) / "mmreplay-ray")


def _open_local_store(path: Path, schema: Schema, capacity: int, segment_records: int, metadata: dict[str, Any]) -> Any:
    """:func:`mmreplay.storage.open_or_create` (it also remakes a store whose creation died)."""
    from ..storage import open_or_create

    return open_or_create(path, schema, capacity, segment_records=segment_records, metadata=metadata,
                          what="this run")


class ClusterActor:
    """One actor; wrapped by ``ray.remote`` in :func:`actor_class` (threaded: ``run`` occupies one
    thread while ``progress``, ``allow``, ``set_weights`` and ``stop`` answer on others)."""

    def __init__(self, spec: ActorSpec) -> None:
        from ..core.schema import Schema

        self.spec = spec
        self.incarnation = uuid.uuid4().hex
        self.dir = Path(spec.local_dir) / spec.run_id / spec.name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.store_path = self.dir / "store"
        self.policy_path = self.dir / "policy.pt"
        st = _open_local_store(self.store_path, Schema.from_json(spec.schema), spec.local_capacity,
                             spec.segment_records, spec.metadata)  # recovers what a dead incarnation published
        self.store_uuid = st.store_uuid.hex()
        self._prior = st.num_rows  # rows earlier incarnations stored here: shipped too, and within the limit
        st.close()
        self.archive_url = f"{spec.archive_root.rstrip('/')}/{spec.name}-{self.store_uuid[:16]}"
        self._mu = threading.Lock()
        self._stop = threading.Event()
        self._limit = -1
        self._limit_seq = -1
        self._taken = 0
        self._stats = {"steps": 0, "transitions": 0, "episodes": 0, "bytes": 0, "loop_s": 0.0}
        self._returns: list[float] = []
        self._exported = 0
        self._export_error: str | None = None
        self._running = False
        self._runs = 0
        self._run_done = threading.Event()

    # control, from the driver
    def allow(self, limit: int, seq: int) -> None:
        """Set the step limit; ``seq`` orders updates (a threaded actor may run calls out of order)."""
        with self._mu:
            if seq > self._limit_seq:
                self._limit, self._limit_seq = int(limit), seq

    def stop(self) -> None:
        self._stop.set()

    def set_weights(self, data: bytes) -> None:
        from ..core.fs import atomic_write

        atomic_write(self.policy_path, data)  # the eps-greedy policy reloads a changed file

    def pid(self) -> int:
        return os.getpid()

    def progress(self) -> dict[str, Any]:
        with self._mu:
            out = {**self._stats, "returns": self._returns, "incarnation": self.incarnation, "taken": self._taken,
                   "exported_rows": self._exported, "export_error": self._export_error, "archive": self.archive_url,
                   "running": self._running, "runs": self._runs, "node": socket.gethostname(),
                   "pid": os.getpid()}
            self._returns = []
        return out

    # the work
    def _report(self, kind: str, payload: dict[str, Any]) -> None:
        with self._mu:
            for k in ("steps", "transitions", "episodes", "bytes"):
                self._stats[k] += payload[k]
            self._stats["loop_s"] = payload["loop_s"]
            self._returns.extend(payload["returns"])

    def _may_step(self, n: int) -> bool:
        if self._limit >= 0 and self._prior + self._taken + n > self._limit:
            return False
        self._taken += n
        return True

    def _export(self) -> None:
        from ..archive.zarr_io import export_archive

        rep = export_archive(self.store_path, self.archive_url, storage_options=self.spec.ship.options)
        with self._mu:
            self._exported, self._export_error = rep.rows, None

    def _export_loop(self, done: threading.Event) -> None:
        while not done.wait(self.spec.ship.export_s):
            try:
                self._export()
            except Exception as exc:  # a transient storage error: retried at the next tick
                log.warning("%s: export to %s failed: %s", self.spec.name, self.archive_url, exc)
                with self._mu:
                    self._export_error = f"{type(exc).__name__}: {exc}"

    def run(self, steps: int | None, seed: int, weights: bytes | None, limit: int | None,
            seq: int = 0) -> dict[str, Any]:
        """Step until ``steps`` env steps (None: until stopped) within ``limit`` (None: no limit;
        :meth:`allow` moves it), then close, export, return the totals."""
        with self._mu:
            if self._runs:
                raise RuntimeError(f"{self.spec.name} runs once per incarnation")
            self._runs, self._running = 1, True
        if weights is not None:
            self.set_weights(weights)
        if limit is not None:
            self.allow(limit, seq)
        policy = self.spec.policy
        if isinstance(policy, PolicySpec) and policy.kind == "eps-greedy":
            policy = PolicySpec("eps-greedy", str(self.policy_path), policy.epsilon, reload_s=0.2)
        cfg = WorkerConfig(self.spec.index, self.spec.env, str(self.store_path), steps, self.spec.envs, seed, policy,
                           self.spec.durability)
        done = threading.Event()
        exporter = threading.Thread(target=self._export_loop, args=(done,), name="mmreplay-export", daemon=True)
        exporter.start()
        try:
            try:
                run_worker(cfg, self._report, self._stop.is_set, self._may_step if limit is not None else None)
            finally:
                done.set()
                exporter.join()
                self._export()  # the last segment, sealed when the writer closed
            if not self.spec.ship.keep_local:
                shutil.rmtree(self.dir, ignore_errors=True)  # everything is in the archive now
                with contextlib.suppress(OSError):
                    self.dir.parent.rmdir()  # the run's directory, once its last actor is done
        finally:
            self._running = False
            self._run_done.set()
        return self.progress()

    def join(self) -> dict[str, Any]:
        """Wait for the run to end; its final report (for a driver whose ``run`` call was cut off)."""
        self._run_done.wait()
        return self.progress()


def actor_class(num_cpus: float, max_restarts: int) -> Any:
    import ray

    return ray.remote(ClusterActor).options(num_cpus=num_cpus, max_restarts=max_restarts, max_task_retries=0,
                                             max_concurrency=8, scheduling_strategy="SPREAD")


def ensure_ray(address: str | None, num_cpus: int) -> bool:
    """Connect to ``address`` ("auto", "ray://host:10001", ...) or start a local instance that
    listens on loopback only (:func:`mmreplay.cluster.start_local_ray`); True if this call
    started Ray (the caller shuts it down). An instance the caller already started is used as is."""
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return False
    if address in (None, "", "local"):
        start_local_ray(num_cpus)
    else:
        import ray

        ray.init(address=address, configure_logging=False)
    return True


