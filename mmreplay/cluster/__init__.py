"""cluster: actors as Ray actors on any node, shipping sealed segments to the learner.

Modules: ``driver`` (ray_collect, RayActorPool; the design and its invariants are in its
docstring), ``_fleet`` (the driver's actor bookkeeping), ``_ray_actor`` (one actor),
``local_ray`` (the one place a local Ray instance is started: loopback only).

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
)
from .local_ray import start_local_ray

__all__ = ["IngestReport", "RayActorPool", "RayCollectResult", "archive_urls", "cluster_segment_records",
           "ingest_archives", "ray_collect", "read_ledger", "start_local_ray"]
