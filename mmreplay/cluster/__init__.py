"""cluster: actors as Ray actors on any node, shipping sealed segments to the learner.

Modules: ``driver`` (run_ray_collect / ray_collect, RayActorPool; the design and its invariants
are in its docstring), ``specs`` (ShipSpec: the archive, the cluster, the actors' local stores,
restarts, ingestion), ``_fleet`` (the driver's actor bookkeeping), ``_ray_actor`` (one actor:
ActorSpec, ClusterActor), ``local_ray`` (the one place a local Ray instance is started: loopback
only).

It uses the ``actors`` room through its public names only (``mmreplay.actors``): the same specs,
worker loop, progress bar and store opening as a local collect.

``ray`` is imported inside functions: importing this package never loads it.
"""

from .driver import (
    IngestReport,
    RayActorPool,
    RayCollectResult,
    archive_urls,
    cluster_segment_records,
    ingest_archives,
    ray_collect,
    read_ledger,
    run_ray_collect,
)
from .local_ray import start_local_ray
from .specs import ShipSpec

__all__ = ["IngestReport", "RayActorPool", "RayCollectResult", "ShipSpec", "archive_urls", "cluster_segment_records",
           "ingest_archives", "ray_collect", "read_ledger", "run_ray_collect", "start_local_ray"]
