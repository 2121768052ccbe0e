"""How a Ray run ships its rows (:class:`ShipSpec`): the archive the actors export sealed segments
into, the cluster, the actors' local stores on their nodes, restarts and the learner's ingestion.

With :class:`mmreplay.agent.envs.EnvSpec` (the env), :class:`mmreplay.actors.WriterSpec` (the
learner's store, the writers' durability) and :class:`mmreplay.actors.CollectSpec` (steps, actors,
envs per actor, policy, seed) it is all :func:`mmreplay.cluster.run_ray_collect` and
:class:`mmreplay.cluster.RayActorPool` need. Frozen and picklable, checked when it is made.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class ShipSpec:
    """``archive_url``: where actors export sealed segments, a path or fsspec URL every node and the
    learner reach (``None``: ``<store>.archive``, only without a cluster ``address``).
    ``address``: a Ray cluster (``"auto"``, ``"ray://head:10001"``); ``None``: a local Ray instance
    for the run. ``export_s`` / ``ingest_s``: seconds between an actor's exports / the learner's
    ingests. ``local_dir``: the actors' local stores on each node (``None``: ``<temp
    dir>/mmreplay-ray``), of ``local_capacity`` rows (``None``: 64 segments), removed after the last
    export unless ``keep_local``. ``max_restarts``: times Ray restarts a dead actor;
    ``actor_cpus``: CPUs each actor reserves; ``storage_options``: fsspec options of the archive."""

    archive_url: str | None = None
    """Where actors export sealed segments (``None``: ``<store>.archive``, only without ``address``)."""
    address: str | None = None
    """The Ray cluster to join (``None``: a local Ray instance for the run)."""
    export_s: float = 1.0
    """Seconds between an actor's exports."""
    ingest_s: float = 0.5
    """Seconds between the learner's ingests."""
    local_dir: str | None = None
    """Where the actors' local stores go on each node (``None``: ``<temp dir>/mmreplay-ray``)."""
    local_capacity: int | None = None
    """Rows of each actor's local store (``None``: 64 segments)."""
    keep_local: bool = False
    """Keep the local stores after the last export."""
    max_restarts: int = 3
    """Times Ray restarts a dead actor."""
    actor_cpus: float = 1.0
    """CPUs each actor reserves."""
    storage_options: Mapping[str, Any] | None = None
    """fsspec options of the archive (credentials, endpoint)."""

    def __post_init__(self) -> None:
        if self.archive_url is not None and not isinstance(self.archive_url, str):
            object.__setattr__(self, "archive_url", os.fspath(self.archive_url))
        if self.export_s <= 0:
            raise ValueError(f"`export_s` must be > 0, got {self.export_s}")
        if self.ingest_s <= 0:
            raise ValueError(f"`ingest_s` must be > 0, got {self.ingest_s}")
        if self.local_capacity is not None and self.local_capacity < 1:
            raise ValueError(f"`local_capacity` must be >= 1 or None, got {self.local_capacity}")
        if self.max_restarts < 0 or self.actor_cpus <= 0:
            raise ValueError(f"need max_restarts >= 0 and actor_cpus > 0, got {self.max_restarts} and {self.actor_cpus}")

    @property
    def on_cluster(self) -> bool:
        """A cluster address was given (not a local Ray instance)."""
        return self.address not in (None, "", "local")

    def archive_for(self, store: str | os.PathLike[str] | None) -> str:
        """The archive root: ``archive_url``, else ``<store>.archive`` (not on a cluster: every node
        must reach the archive)."""
        if self.archive_url is not None:
            return self.archive_url
        if self.on_cluster or store is None:
            raise ValueError("on a Ray cluster `archive_url` must be given: a shared path or URL every node "
                             "and the learner reach")
        return f"{str(store).rstrip('/')}.archive"

    @property
    def options(self) -> dict[str, Any] | None:
        """``storage_options`` as a plain dict (what fsspec takes)."""
        return None if self.storage_options is None else dict(self.storage_options)
