"""mmreplay: a memory-mapped, persistent, crash-safe replay store for reinforcement learning.

``import mmreplay`` loads numpy only; zarr, torch, gymnasium and click are imported lazily by
the modules that need them.
"""

from __future__ import annotations

from .core.version import __version__

from .actors.pool import ActorPool, CollectResult, PolicySpec, collect  # noqa: E402  (gymnasium loads in the workers)
from .core.errors import (  # noqa: E402
    ArchiveError,
    CorruptArchiveError,
    CorruptSegmentError,
    CorruptStoreError,
    DiskFullError,
    EmptyStoreError,
    FormatVersionError,
    InvalidValueError,
    MMReplayError,
    ReadOnlyStoreError,
    SchemaError,
    StoreClosedError,
    StoreExistsError,
    StoreFullError,
    StoreLockedError,
    StoreNotFoundError,
    WriterBusyError,
    WriterFailedError,
)
from .loader import BatchLoader, TensorBatch  # noqa: E402  (torch is imported when a loader is made)
from .sampling.prioritized import PrioritizedSampler  # noqa: E402
from .sampling.uniform import TransitionSampler, UniformSampler  # noqa: E402
from .core.schema import Field, Schema  # noqa: E402
from .sampling.sequence import SequenceBatch, SequenceSampler  # noqa: E402
from .storage import ReplayStore, create_store, open_store  # noqa: E402
from .storage import TransitionBatch  # noqa: E402
from .storage import Writer  # noqa: E402

__all__ = [
    "ActorPool",
    "ArchiveError",
    "BatchLoader",
    "CollectResult",
    "CorruptArchiveError",
    "CorruptSegmentError",
    "CorruptStoreError",
    "DiskFullError",
    "EmptyStoreError",
    "Field",
    "FormatVersionError",
    "InvalidValueError",
    "MMReplayError",
    "PolicySpec",
    "PrioritizedSampler",
    "ReadOnlyStoreError",
    "ReplayStore",
    "Schema",
    "SchemaError",
    "SequenceBatch",
    "SequenceSampler",
    "StoreClosedError",
    "StoreExistsError",
    "StoreFullError",
    "StoreLockedError",
    "StoreNotFoundError",
    "TensorBatch",
    "TransitionBatch",
    "TransitionSampler",
    "UniformSampler",
    "Writer",
    "WriterBusyError",
    "WriterFailedError",
    "__version__",
    "collect",
    "create_store",
    "open_store",
]

# Archive and interop functions load on first use (they import zarr / minari lazily as well).
_LAZY = {"export_archive": "archive", "import_archive": "archive", "open_archive": "archive",
         "verify_archive": "archive",
         "export_minari": "interop.minari", "import_minari": "interop.minari", "import_dopamine": "interop.dopamine",
         "field_stats": "stats", "FieldStats": "stats",
         "ray_collect": "cluster", "RayActorPool": "cluster", "ingest_archives": "cluster"}
__all__ += sorted(_LAZY)


def __getattr__(name: str) -> object:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'mmreplay' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{mod}", __name__), name)
