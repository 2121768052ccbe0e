"""stats: statistics of the transitions a store holds, computed over the store or over its zarr
archive (the observation mean and std a learner normalizes with).

Modules: ``fields`` (``field_stats``, ``FieldStats``: streaming mean, std, min and max of a field
over the transitions' first rows, cached beside the store or in the user's cache directory),
``moments_kernel`` (its compiled inner loop: a block of rows' count, mean, M2, min and max).

The room sits right above ``archive``: it reads an archive's chunks through
``mmreplay.archive.layout`` (checked against the chunk manifest) as it reads a store through
``mmreplay.storage``; ``train`` and the facade use it.

Invariants: the rows counted are the transitions' first rows (never an episode's final
observation, never a damaged row); memory is bounded whatever the size of the source, and nothing
loops in Python per row; a cached result is used only while the rows it was computed over are
unchanged. zarr and numba are imported on first use; ``import mmreplay`` does not load this room.
"""

from .fields import FieldStats, field_stats

__all__ = ["FieldStats", "field_stats"]
