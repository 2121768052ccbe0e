"""actors: env stepping in actor processes that write a store.

Modules: ``specs`` (the typed description of a collect run: PolicySpec, WriterSpec, CollectSpec,
``split_steps``), ``worker`` (one actor's loop: ``run_worker``, WorkerConfig, the policies it acts
with), ``pool`` (local processes: ``run_collect`` / ``collect``, the ``ActorPool`` of online
training, ``Interrupts``, the store a run opens or creates), ``progress`` (a collect run's progress
bar).

Invariants: each actor owns its writer and its lanes (no lock on the append path); a dead
actor loses only rows it had not published; gymnasium and torch load in the actors, not at
import.
"""

from ..agent.envs import EnvSpec
from .pool import (
    ActorPool,
    CollectResult,
    Interrupts,
    action_scale_metadata,
    collect,
    env_metadata,
    open_store_for_spaces,
    run_collect,
)
from .progress import CollectProgress
from .specs import CollectSpec, PolicyFn, PolicySpec, WriterSpec, split_steps
from .worker import WorkerConfig, check_policy, run_worker

__all__ = ["ActorPool", "CollectProgress", "CollectResult", "CollectSpec", "EnvSpec", "Interrupts", "PolicyFn",
           "PolicySpec", "WorkerConfig", "WriterSpec", "action_scale_metadata", "check_policy", "collect",
           "env_metadata", "open_store_for_spaces", "run_collect", "run_worker", "split_steps"]
