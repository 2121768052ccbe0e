"""actors: env stepping in actor processes that write a store — one actor's loop (``worker``),
local processes, ``collect()`` and the ``ActorPool`` of online training (``pool``).

Invariants: each actor owns its writer and its lanes (no lock on the append path); a dead
actor loses only rows it had not published; gymnasium and torch load in the actors, not at
import.
"""

from .pool import ActorPool, CollectResult, PolicySpec, collect, open_or_create
from .worker import Policy, WorkerConfig, run_worker

__all__ = ["ActorPool", "CollectResult", "Policy", "PolicySpec", "WorkerConfig", "collect", "open_or_create",
           "run_worker"]
