"""Cluster: actors as Ray actors on any node, shipping sealed segments to the learner through archives.

Past one machine, mmreplay leaves scheduling, placement, restarts and the object store to Ray
and keeps only its own data path::

    Ray actor (any node): env -> Writer -> local store -> export_archive every export_s
                                                                 |  <root>/actor-NNN-<store uuid>
    learner:  ingest_archives(<root>) every ingest_s  <----------+  (shared path or fsspec URL)
              -> its own local store (tiers, samplers, loader as usual)
    weights:  policy file bytes -> ray.put -> every actor writes them to a local policy file

:func:`run_ray_collect` is the library form of ``mmreplay collect --ray`` (:func:`ray_collect` its
keyword form); :class:`RayActorPool` has
the interface of :class:`mmreplay.ActorPool` for ``mmreplay train --ray``.

Invariants kept here (the actor side is ``_ray_actor.py``, the driver side ``_fleet.py``, the
learner's ingestion ``mmreplay.archive.shipping``):

* An actor is :func:`mmreplay.actors.run_worker` (the same stepping loop as local collection)
  in a threaded Ray actor, writing a local store on its node (``<local_dir>/<run id>/actor-NNN``)
  that it exports into its own archive ``<root>/actor-NNN-<store uuid>``. An actor Ray restarts
  on the same node reopens its store: recovery seals what the dead incarnation published, and
  the next export ships it.
* Only sealed segments travel, so a row reaches the learner once its segment is full (or its
  actor stops): local stores use small segments (:func:`cluster_segment_records`), and the
  learner's store must have the same ``segment_records`` (segments are copied whole).
* Ingestion is exactly once: a segment exported twice, an export rerun or an actor restarted by
  Ray never duplicates a row in the learner's store, and a crash of the learner mid-ingest
  neither loses nor duplicates one.
* Samples-per-insert limit: :meth:`RayActorPool.allow` bounds the rows actors store. Each actor
  gets an equal share of the allowed total plus one segment, so every actor can seal the
  segment the learner waits for (a limit below that would deadlock: rows stuck in open
  segments). Shares are fixed rather than borrowed, which keeps the bound exact whatever the
  timing of progress reports; the price is that a slow actor (or one Ray is restarting) holds
  the learner back until it catches up. An actor restarted on another node starts a fresh
  share (its predecessor's shipped rows still count for the learner).
* ``ray`` is imported inside functions: ``import mmreplay`` (and this module) never loads it.
  Without an address a local Ray instance is started (and shut down again), so the whole path
  runs and is tested on one machine. It listens on loopback only, with the dashboard off
  (:func:`start_local_ray`, whose docstring says what happens when Ray was imported first).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..actors import (
    CollectProgress,
    CollectResult,
    CollectSpec,
    EnvSpec,
    PolicyFn,
    PolicySpec,
    WriterSpec,
    action_scale_metadata,
    env_metadata,
    open_store_for_spaces,
    split_steps,
)
from ..agent.envs import AutoresetName
from ..archive.shipping import IngestReport, archive_urls, ingest_archives, read_ledger
from ..core.errors import MMReplayError
from ._fleet import Fleet
from ._ray_actor import ActorSpec
from .local_ray import start_local_ray
from .specs import ShipSpec

if TYPE_CHECKING:
    from ..core.schema import Schema
    from ..storage import ReplayStore

log = logging.getLogger(__name__)

__all__ = [
    "IngestReport",
    "RayActorPool",
    "RayCollectResult",
    "archive_urls",
    "cluster_segment_records",
    "ingest_archives",
    "ray_collect",
    "read_ledger",
    "run_ray_collect",
    "ShipSpec",
    "start_local_ray",
]


def cluster_segment_records(schema: Schema, lanes: int = 1) -> int:
    """Rows per segment for stores that ship to a learner: storage's sizing rule for shipping
    (``mmreplay.storage.segment_records_for(use="shipping")``: at most 4,096 rows, a multiple of ``lanes``)."""
    from ..storage import segment_records_for

    return segment_records_for(schema, use="shipping", lanes=lanes)


def _policy_payload(policy: PolicySpec | PolicyFn) -> str | None:
    """The file whose bytes ship to the actors (eps-greedy checkpoints), if any."""
    if isinstance(policy, PolicySpec) and policy.kind == "eps-greedy":
        if policy.path is None or not Path(policy.path).is_file():
            raise FileNotFoundError(f"policy checkpoint {policy.path!r} not found")
        return policy.path
    return None


def actor_specs(n: int, env: EnvSpec, envs: int, *, schema: Schema, segment_records: int, archive_root: str,
                ship: ShipSpec, policy: PolicySpec | PolicyFn, durability: str, metadata: dict[str, Any]) -> list[ActorSpec]:
    """The specs of ``n`` actors of one run (a fresh run id), checked: ``envs`` copies each, at most
    ``segment_records``."""
    if n < 1 or envs < 1:
        raise ValueError(f"need actors >= 1 and envs_per_actor >= 1, got {n} and {envs}")
    if envs > segment_records:
        raise ValueError(f"`envs_per_actor`={envs} is more than segment_records={segment_records}")
    run_id = uuid.uuid4().hex[:12]
    return [ActorSpec(i, env, envs, schema.to_json(), segment_records, archive_root, ship, policy, durability,
                      metadata, run_id) for i in range(n)]


def _warn_big_segments(path: str, R: int, schema: Schema, envs: int) -> None:
    if R > 4 * cluster_segment_records(schema, envs):
        log.warning("%s has segment_records=%d: rows reach the learner one sealed segment at a time; a store made "
                    "with segment_records=%d ships them sooner", path, R, cluster_segment_records(schema, envs))


def _check_archive_root(url: str, address: str | None) -> str:
    text = str(url)
    if address not in (None, "", "local") and "://" not in text:
        log.warning("archive %s is a local path: every node and the learner must see it (a shared filesystem)", text)
    if "://" not in text:
        Path(text).mkdir(parents=True, exist_ok=True)
    return text


# -- collect ------------------------------------------------------------------------------------
@dataclasses.dataclass
class RayCollectResult(CollectResult):
    """A :class:`~mmreplay.actors.CollectResult` plus what shipping did."""

    archive: str = ""
    """The archive root the actors exported into."""
    rows_ingested: int = 0
    """Rows added to the learner's store (env steps plus each actor session's final-observation rows)."""
    restarts: dict[int, int] = dataclasses.field(default_factory=dict)
    """Actor index -> times Ray restarted it."""


def ray_collect(
    env: str | Callable[[], Any],
    archive_url: str | os.PathLike[str],
    steps: int,
    *,
    actors: int = 1,
    envs_per_actor: int = 1,
    address: str | None = None,
    store: str | os.PathLike[str] | None = None,
    policy: str | PolicySpec | PolicyFn = "random",
    seed: int | None = None,
    atari: bool | None = None,
    capacity: int = 1_000_000,
    segment_records: int | None = None,
    durability: Literal["process", "segment", "batch"] = "segment",
    max_episode_steps: int | None = None,
    autoreset_mode: AutoresetName = "next_step",
    terminal_on_life_loss: bool = False,
    sticky_actions: float | None = None,
    export_s: float = 1.0,
    ingest_s: float = 0.5,
    local_dir: str | None = None,
    local_capacity: int | None = None,
    keep_local: bool = False,
    max_restarts: int = 3,
    actor_cpus: float = 1.0,
    storage_options: dict[str, Any] | None = None,
    progress: bool | None = None,
    metadata: dict[str, Any] | None = None,
) -> RayCollectResult:
    """Collect ``steps`` env steps with ``actors`` Ray actors; ship them through ``archive_url``: the
    keyword form of :func:`run_ray_collect` (the keywords are the fields of its specs).

    Each actor steps a vector env of ``envs_per_actor`` copies into a local store on its node
    (``<local_dir>/<run id>/actor-NNN``; ``local_dir`` defaults to ``<temp dir>/mmreplay-ray``
    on each node, and ``local_capacity`` to 64 segments) and exports sealed segments every
    ``export_s`` seconds into ``<archive_url>/actor-NNN-<store uuid>``. With ``store``, this
    process ingests them into that local store every ``ingest_s`` seconds (created from the env's
    spaces with ``segment_records``, default :func:`cluster_segment_records`, if missing) and
    once more at the end, exactly once.

    Parameters
    ----------
    address
        A Ray cluster (``"auto"``, ``"ray://head:10001"``); ``None`` starts a local Ray instance
        for this call. ``archive_url`` must then be reachable from every node (a shared
        filesystem path, or an fsspec URL such as ``s3://bucket/run`` with ``storage_options``).
    max_restarts
        Times Ray restarts a dead actor; the restarted actor reopens its local store when it
        lands on the same node, and takes what is left of its share of ``steps``.
    keep_local
        Keep each actor's local store after its last export (default: removed, the archive
        holds every row).

    Returns a :class:`RayCollectResult`; actors that failed are in ``errors``. Ctrl-C stops the
    actors, which close their writers and export what they wrote (``interrupted=True``).
    """
    return run_ray_collect(
        EnvSpec(env, atari=atari, max_episode_steps=max_episode_steps, autoreset_mode=autoreset_mode,
                terminal_on_life_loss=terminal_on_life_loss, sticky_actions=sticky_actions),
        WriterSpec(None if store is None else os.fspath(store), capacity=capacity, segment_records=segment_records,
                   durability=durability, metadata=metadata),
        CollectSpec(steps, workers=actors, envs_per_worker=envs_per_actor, policy=policy, seed=seed, progress=progress),
        ShipSpec(os.fspath(archive_url), address=address, export_s=export_s, ingest_s=ingest_s, local_dir=local_dir,
                 local_capacity=local_capacity, keep_local=keep_local, max_restarts=max_restarts,
                 actor_cpus=actor_cpus, storage_options=storage_options))


def run_ray_collect(env: EnvSpec, writer: WriterSpec, run: CollectSpec, ship: ShipSpec) -> RayCollectResult:
    """Collect ``run.steps`` env steps of ``env`` with ``run.workers`` Ray actors (at least one) of
    ``run.envs_per_worker`` copies each, shipped as ``ship`` says; with ``writer.store``, ingested into
    that store (created from the env's spaces if missing). See :func:`ray_collect`."""
    from ..core.schema import Schema

    run = run.seeded()
    actors = max(run.workers, 1)
    policy_file = _policy_payload(run.policy)
    obs_space, act_space, extra = env.spaces()
    schema = Schema.from_spaces(obs_space, act_space)
    base = {**env_metadata(env, obs_space, act_space, extra), **action_scale_metadata(act_space),
            **(writer.metadata or {})}
    root = _check_archive_root(ship.archive_for(writer.store), ship.address)
    learner = None
    R = writer.segment_records
    if writer.store is not None:
        R = R or cluster_segment_records(schema, run.envs_per_worker)
        learner = open_store_for_spaces(dataclasses.replace(writer, segment_records=R), obs_space, act_space,
                                        metadata=base)
        R = learner.segment_records
    R = R or cluster_segment_records(schema, run.envs_per_worker)
    _warn_big_segments(str(writer.store or "the actors' stores"), R, schema, run.envs_per_worker)
    specs = actor_specs(actors, env, run.envs_per_worker, schema=schema, segment_records=R, archive_root=root,
                        ship=ship, policy=run.policy, durability=writer.durability, metadata=base)
    budgets: list[int | None] = list(split_steps(run.steps, actors))
    fleet = Fleet(specs, budgets, ship, seed=run.seed, store=learner, archive_root=root,  # type: ignore[arg-type]
                  policy_path=policy_file, keep_returns=None)
    record = {**base, "kind": "ray-collect", "status": "running", "actors": actors,
              "envs_per_actor": run.envs_per_worker,
              "policy": str(run.policy) if isinstance(run.policy, PolicySpec) else "callable", "seed": run.seed,
              "archive": root, "ray_address": ship.address or "local", "steps_requested": run.steps,
              "segment_records": R, "host": socket.gethostname(),
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    name = learner.record_provenance(record) if learner is not None else None
    result = RayCollectResult(0, 0, 0, [], 0.0, 0, run.seed, provenance=name, archive=root)  # type: ignore[arg-type]
    bar = CollectProgress(sum(run.rounded(b) for b in split_steps(run.steps, actors)), run.progress)
    t0 = time.perf_counter()
    try:
        _watch(fleet, result, bar)
    finally:
        result.seconds = time.perf_counter() - t0
        bar.close()
        _fold(fleet, result)
        if learner is not None:
            _close_learner(learner, record, name, result)
    return result


def _watch(fleet: Fleet, result: RayCollectResult, bar: CollectProgress) -> None:
    """Start the fleet and show its progress until it finishes (or Ctrl-C), then stop it."""
    shown = 0
    fleet.start()
    try:
        while not fleet.finished:
            time.sleep(0.1)
            tot = fleet.totals()
            result.episodes, result.bytes_written = tot["episodes"], tot["bytes"]
            result.episode_returns = list(fleet.returns)
            bar.update(tot["steps"] - shown, result)
            shown = tot["steps"]
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        fleet.stop()


def _fold(fleet: Fleet, result: RayCollectResult) -> None:
    """The fleet's final counts into ``result``."""
    tot = fleet.totals()
    result.steps, result.transitions, result.episodes = tot["steps"], tot["transitions"], tot["episodes"]
    result.bytes_written = tot["bytes"]
    result.episode_returns = list(fleet.returns)
    result.errors = fleet.errors()
    result.exceptions = fleet.exceptions()
    result.rows_ingested = fleet.rows_ingested
    result.restarts = {i: s.restarts for i, s in enumerate(fleet.slots) if s.restarts}
    result.loop_seconds = max((float(s.base["loop_s"]) for s in fleet.slots), default=0.0)


def _close_learner(learner: ReplayStore, record: dict[str, Any], name: str | None, result: RayCollectResult) -> None:
    """Finish the run's provenance record in the learner's store and close it."""
    record.update(status="interrupted" if result.interrupted else ("failed" if result.errors else "done"),
                  steps_stored=result.steps, rows_ingested=result.rows_ingested, restarts=result.restarts,
                  seconds=round(result.seconds, 3), errors={str(k): v.strip().splitlines()[-1] if v.strip()
                                                            else "" for k, v in result.errors.items()},
                  finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    with contextlib.suppress(Exception):
        learner.record_provenance(record, name)
    learner.close()


# -- actors for a trainer ---------------------------------------------------------------------------
class RayActorPool:
    """Ray actors that fill a learner's store through archives; the interface of
    :class:`mmreplay.ActorPool` (``start``, ``allow``, ``env_steps``, ``episode_returns``,
    ``episodes``, ``check``, ``stop``) plus :meth:`publish_weights` and :meth:`ingest`. ``env``: an
    :class:`~mmreplay.agent.envs.EnvSpec` (or a gymnasium id or env callable), ``ship``: how rows
    ship (:class:`ShipSpec`; its ``archive_url`` defaults to ``<store_path>.archive`` without a
    cluster address).

    The learner's store at ``store_path`` must exist (its schema and ``segment_records`` are the
    actors'; create it with ``segment_records=cluster_segment_records(schema, envs_per_actor)``:
    rows ship a sealed segment at a time). A background thread ingests new segments every
    ``ingest_s`` seconds and sends the policy file at ``policy_path`` through Ray's object store
    whenever it changes (so a trainer that rewrites the file needs no other call); ``env_steps``
    counts the rows ingested, i.e. rows the learner can sample after its next ``refresh()``.

    >>> pool = RayActorPool("CartPole-v1", "run/store", actors=4, policy_path="run/policy.pt",
    ...                     ship=ShipSpec(address="auto", archive_url="s3://bucket/run"))  # doctest: +SKIP
    >>> pool.start(); pool.allow(10_000)  # doctest: +SKIP
    """

    def __init__(self, env: EnvSpec | str | Callable[[], Any], store_path: str | os.PathLike[str], *, actors: int,
                 envs_per_actor: int = 1, policy_path: str | os.PathLike[str], seed: int = 0,
                 durability: Literal["process", "segment", "batch"] = "segment", ship: ShipSpec | None = None) -> None:
        if actors < 1:
            raise ValueError(f"`actors` must be >= 1, got {actors}")
        ship = ship if ship is not None else ShipSpec()
        self._env = env if isinstance(env, EnvSpec) else EnvSpec(env)
        self._store_path, self._actors, self._envs_per_actor = str(store_path), actors, envs_per_actor
        self._policy_path, self._seed, self._durability, self._ship = str(policy_path), seed, durability, ship
        self.archive_url = ship.archive_for(self._store_path)
        """Where the actors export their segments and the learner ingests them from (``ShipSpec.archive_for``)."""
        self._fleet: Fleet | None = None
        self._store: ReplayStore | None = None
        self._stopped = False

    def start(self) -> RayActorPool:
        """Start the actors (each loads the policy file's current bytes first: write it before)."""
        from ..storage import open_store

        if self._fleet is not None:
            raise RuntimeError("this pool was started already")
        self._store = open_store(self._store_path, mode="a")
        try:
            R = self._store.segment_records
            _warn_big_segments(self._store_path, R, self._store.schema, self._envs_per_actor)
            root = _check_archive_root(self.archive_url, self._ship.address)
            specs = actor_specs(self._actors, self._env, self._envs_per_actor, schema=self._store.schema,
                                segment_records=R, archive_root=root, ship=self._ship,
                                policy=PolicySpec("eps-greedy", self._policy_path, None, reload_s=0.2),
                                durability=self._durability, metadata=dict(self._store.metadata))
            self._fleet = Fleet(specs, [None] * self._actors, self._ship, seed=self._seed, store=self._store,
                                archive_root=root, policy_path=self._policy_path)
            self._fleet.allowed = 0
            self._fleet.start()
        except BaseException:
            self._fleet = None
            self._store.close()
            raise
        return self

    def _need(self) -> Fleet:
        if self._fleet is None:
            raise RuntimeError("the pool is not running: call start() first")
        return self._fleet

    def allow(self, total_env_steps: int) -> None:
        """Let the actors take up to ``total_env_steps`` env steps in all (a negative value: no limit).

        Each actor may run one segment past its share, so the segments the learner waits for
        can always be sealed and shipped."""
        self._need().allowed = int(total_env_steps)

    @property
    def env_steps(self) -> int:
        """Rows ingested into the learner's store by this pool (what the learner can sample)."""
        return self._fleet.rows_ingested if self._fleet is not None else 0

    @property
    def episodes(self) -> int:
        """Episodes the actors completed so far, restarted actors' earlier incarnations included (0
        before :meth:`start`)."""
        return self._fleet.episodes if self._fleet is not None else 0

    def episode_returns(self, last: int = 100) -> list[float]:
        """Returns of the last ``last`` completed episodes (any actor)."""
        return list(self._fleet.returns)[-last:] if self._fleet is not None else []

    @property
    def handles(self) -> list[Any]:
        """The Ray actor handles (for monitoring, or a fault test that kills one)."""
        return [s.handle for s in self._need().slots]

    @property
    def restarts(self) -> dict[int, int]:
        """Actor index -> times Ray restarted it (actors never restarted are left out)."""
        return {i: s.restarts for i, s in enumerate(self._need().slots) if s.restarts}

    def check(self) -> None:
        """Raise ``RuntimeError`` if an actor failed for good (an error in it, or out of restarts),
        or ingestion failed on an archive it cannot use (another schema, a corrupt chunk)."""
        f = self._need()
        errs = f.errors()
        if errs:
            i, tb = next(iter(errs.items()))
            raise RuntimeError(f"actor {i} failed:\n{tb}") from f.exceptions().get(i)
        if f.monitor_error is not None:
            raise RuntimeError(f"the actor monitor failed:\n{f.monitor_error}")
        if isinstance(f.ingest_error, MMReplayError):  # OSErrors (a storage hiccup) are retried instead
            raise RuntimeError(f"ingest failed: {f.ingest_error}") from f.ingest_error

    def publish_weights(self, path: str | os.PathLike[str] | None = None) -> None:
        """Put the policy file's bytes (default: ``policy_path``) into Ray's object store and send
        them to every actor; actors switch to them within ~0.2 s. Called automatically when the
        file at ``policy_path`` changes."""
        self._need().publish(path if path is not None else self._policy_path)

    def ingest(self, store: ReplayStore | str | os.PathLike[str] | None = None) -> int:
        """Pull new sealed segments into ``store`` (default: the pool's handle of the learner's
        store) now; returns the rows added (counted in ``env_steps`` when ``store`` is the
        learner's store). Safe to call while the background thread runs; the learner sees the
        rows after its next ``refresh()``."""
        return self._need().ingest(store)

    def stop(self, timeout: float = 120.0) -> None:
        """Stop every actor (each closes its writer and exports its last rows), ingest what is
        left, and release Ray (shut down if the pool started it)."""
        if self._fleet is None or self._stopped:
            return
        self._stopped = True  # counts (env_steps, episodes) stay readable
        try:
            self._fleet.stop(timeout)
        finally:
            if self._store is not None:
                self._fleet.store = None
                self._store.close()
                self._store = None

    def __enter__(self) -> RayActorPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
