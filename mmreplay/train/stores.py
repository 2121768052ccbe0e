"""The store an online run writes and an offline run reads, from the trainer's side: opening or
creating it from the env's spaces, the run's provenance record in it (and the one-trainer-per-store
rule), and the checks of an eval env and of the actions against it before anything starts.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..storage import ReplayStore
    from .settings import TrainConfig


def open_store_for_env(cfg: TrainConfig, envs: Any) -> ReplayStore:
    """Open the run's store for appending, creating it from the env's spaces if missing
    (:func:`mmreplay.storage.open_or_create` and its one compatibility rule)."""
    from ..agent.envs import spaces_to_json
    from ..core.schema import Schema
    from ..storage import open_or_create

    schema = Schema.from_spaces(envs.single_observation_space, envs.single_action_space)
    meta = {"env_id": cfg.env_id, "atari": cfg.atari, "source": "mmreplay train",
            **spaces_to_json(envs.single_observation_space, envs.single_action_space)}
    writers = max(cfg.actors, 1)
    return open_or_create(cfg.store, schema, cfg.capacity, segment_records=cfg.segment_records, metadata=meta,
                          new_segment_records=replay_segment_records(schema, cfg.capacity, writers),
                          what=str(cfg.env_id), writers=writers)


def record_training(store: ReplayStore, cfg: TrainConfig, run_dir: Path, *, shared: bool = False) -> str:
    """Record this online run in the store's provenance (``kind: "train"``, running), after making
    sure no other online trainer is training from the store (``TrainingBusyError``-like
    ``ValueError`` naming it, unless ``shared``: two trainers writing into and sampling from one
    store is a mistake unless meant). Returns the record's name (``finish_training`` updates it)."""
    import os
    import socket

    others = [r for r in store.provenance() if r.get("kind") == "train" and r.get("status") == "running"]
    if others and not shared:
        o = others[-1]
        raise ValueError(f"{store.path} is being trained from by another run ({o.get('run_dir', o['name'])}, pid "
                         f"{o.get('pid')}); two online trainers on one store both write and sample it "
                         "(pass --shared-store if that is meant, or use another --store)")
    return store.record_provenance({"kind": "train", "status": "running", "env_id": cfg.env_id, "seed": cfg.seed,
                                    "policy": cfg.algo.name, "run_dir": str(run_dir), "pid": os.getpid(),
                                    "host": socket.gethostname(), "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                              time.gmtime())})


def finish_training(store: ReplayStore, name: str, status: str, steps: int, cut_rows: list[int]) -> None:
    """How an online run ended, in its provenance record (``record_training``)."""
    import contextlib

    recs = {r["name"]: r for r in store.provenance()}
    rec = {k: v for k, v in recs.get(name, {}).items() if k not in ("name", "workers")}
    rec.update(status=status, steps_stored=int(steps), cut_rows=[int(i) for i in cut_rows if i >= 0],
               finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    with contextlib.suppress(Exception):  # a record, never a reason to fail a run
        store.record_provenance(rec, name)


def replay_segment_records(schema: Any, capacity: int, writers: int) -> int:
    """Rows per segment of a store a training run creates (no ``segment_records`` given): storage's
    sizing rule for a replay memory (``mmreplay.storage.segment_records_for(use="replay")``)."""
    from ..storage import segment_records_for

    return segment_records_for(schema, capacity, writers, use="replay")


def count_actions(space: Any) -> int:
    n = getattr(space, "n", None)
    if n is None:
        raise ValueError(f"DQN needs a Discrete action space, got {space!r}")
    return int(n)


def check_eval_env(store: ReplayStore, eval_env: str | None, cfg: TrainConfig) -> None:
    """A ``ValueError`` (one line) when the eval env's observations or actions do not fit the store's:
    found before anything starts (else a shape error deep in the first evaluation)."""
    if not eval_env:
        return
    from ..agent.envs import make_env
    from ..core.schema import Schema

    env = make_env(eval_env, atari=cfg.atari or None, max_episode_steps=cfg.max_episode_steps)
    try:
        want = Schema.from_spaces(env.observation_space, env.action_space)
    finally:
        env.close()
    have = store.schema
    bad = []
    for f in want.fields:
        if f.name in ("reward", "terminated", "truncated"):
            continue
        if f.name not in have:
            bad.append(f"{f.name} is not in the store (its fields: {', '.join(have.names)})")
        elif tuple(have[f.name].shape) != tuple(f.shape) or have[f.name].dtype.kind != f.dtype.kind:
            bad.append(f"{f.name}: the env gives {f.dtype}{tuple(f.shape)}, the store holds "
                       f"{have[f.name].dtype}{tuple(have[f.name].shape)}")
    extra = [n for n in have.obs_names if n not in want.obs_names]
    if extra:
        bad.append(f"the store's {', '.join(extra)} are not the env's observations")
    if bad:
        raise ValueError(f"--eval-env {eval_env} does not fit the store {store.path}: {'; '.join(bad)}")


def offline_n_actions(store: ReplayStore, eval_env: str | None, cfg: TrainConfig) -> int:
    """From the eval env's action space, else the largest action in the store plus one."""
    if eval_env:
        from ..agent.envs import make_env

        env = make_env(eval_env, atari=cfg.atari or None)
        try:
            return count_actions(env.action_space)
        finally:
            env.close()
    store.refresh()
    ids = store.transition_ids()
    if len(ids) == 0:
        from ..core.errors import EmptyStoreError

        raise EmptyStoreError(f"{store.path} has no transitions to train from")
    return int(store.rows("action", ids).max()) + 1
