"""PyTorch data pipeline: ``TransitionDataset``, an ``IterableDataset`` of batches from a store or
an archive, for ``torch.utils.data.DataLoader`` with any ``num_workers``::

    from mmreplay.integrations.torch_data import TransitionDataset
    data = TransitionDataset("/data/cartpole", batch_size=256, num_batches=10_000, n_step=3)
    for batch in DataLoader(data, batch_size=None, num_workers=2):   # mmreplay.TensorBatch
        loss = update(batch.obs, batch.action, batch.reward, batch.next_obs, batch.discount)

What it keeps:

* Each worker opens the store itself, read-only, in the worker process (a store is never used
  after ``fork()``), with its own ``UniformSampler`` (n-step, frame stacks, tiers: every view
  works); the workers' generators are seeded apart (``seed`` and the worker's id, or the seed
  torch gives each worker when ``seed=None``, so ``torch.manual_seed`` makes runs repeat).
* No torn rows: samplers read only published rows, so a store a writer is filling can be read
  while it grows (new rows are seen within ``refresh_interval_s``).
* Batches are built by ``mmreplay.loader.tensor_batch`` (the one tensor-batch builder). In a
  worker the sampler gathers each batch straight into one new shared-memory block and every
  field is a view of it, so a batch crosses to the main process as one block (one per field
  costs ~5x more); ``pin_memory=True`` pins them there. Without workers: views of the batch.
* An archive (a zarr URL, ``mmreplay export``) is materialised once into a local cache store
  (``open_archive``) when the dataset is made; the workers read that store.

``num_batches`` batches per pass in all, split between the workers (``None``: endless).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..core.errors import EmptyStoreError, StoreNotFoundError
from ..loader import tensor_batch
from ..sampling.uniform import UniformSampler
from ..storage import open_store

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ..loader import TensorBatch

__all__ = ["TransitionDataset"]


class TransitionDataset(IterableDataset):
    """Batches of transitions from the store at ``path`` (or the archive at ``archive``).

    Parameters
    ----------
    path
        A store directory. Give ``archive=`` instead for a zarr archive.
    batch_size
        Transitions per batch (use ``DataLoader(..., batch_size=None)``: batches come ready).
    num_batches
        Batches per pass over the dataset, all workers together; ``None`` never ends.
    seed
        Base seed; worker ``k`` draws with ``SeedSequence([seed, k])``. ``None``: the seed torch
        gives the worker (``torch.initial_seed()`` in it).
    archive, cache_dir
        A zarr archive URL (or path) and where to materialise it (a temporary store if ``None``).
    float_dtype
        Cast float and uint8 fields to this torch dtype (``None``: stored dtypes).
    sampler_kwargs
        ``mmreplay.UniformSampler`` options: ``n_step``, ``gamma``, ``frame_stack``, ``mode``,
        ``cache_bytes``, ``prefetch_batches``, ``refresh_interval_s``.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, batch_size: int = 256, *,
                 num_batches: int | None = None, seed: int | None = None,
                 archive: str | os.PathLike[str] | None = None, cache_dir: str | os.PathLike[str] | None = None,
                 float_dtype: Any = None, **sampler_kwargs: Any) -> None:
        super().__init__()
        if (path is None) == (archive is None):
            raise ValueError("give either `path` (a store) or `archive` (a zarr archive)")
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"`batch_size` must be a positive int, got {batch_size!r}")
        if num_batches is not None and num_batches < 0:
            raise ValueError(f"`num_batches` must be >= 0 or None, got {num_batches!r}")
        self._archive_store = None
        if archive is not None:
            from ..archive import open_archive

            self._archive_store = open_archive(archive, cache_dir)  # kept open: it holds a temporary cache
            path = self._archive_store.path
        self.path = str(path)
        """The store directory read (an archive's materialised store with ``archive=``)."""
        if not Path(self.path).is_dir():
            raise StoreNotFoundError(f"{self.path}: no store there")
        self.batch_size = int(batch_size)
        """Transitions per batch."""
        self.num_batches = num_batches
        """Batches per pass over the dataset, all workers together; ``None`` never ends."""
        self.seed = seed
        """The base seed (``None``: the seed torch gives each worker)."""
        self.float_dtype = float_dtype
        """The torch dtype float and uint8 fields are cast to, or ``None``."""
        self.sampler_kwargs = sampler_kwargs
        """The ``mmreplay.UniformSampler`` options each worker's sampler is made with."""
        # fail here, in the main process, on a bad store or option; and load the compiled sampling
        # kernels here, so forked workers start with them (each would load them again: ~1 s)
        with open_store(self.path) as store, UniformSampler(store, **sampler_kwargs) as sampler:
            try:
                sampler.sample(1)
            except EmptyStoreError:
                pass

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_archive_store"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _archive_store=None)

    def _share(self, worker: int, workers: int) -> int | None:
        if self.num_batches is None:
            return None
        return self.num_batches // workers + (worker < self.num_batches % workers)

    def __iter__(self) -> Iterator[TensorBatch]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        if self.seed is None:
            seed: Any = np.random.SeedSequence([torch.initial_seed() % 2**63, worker])
        else:
            seed = np.random.SeedSequence([self.seed, worker])
        count = self._share(worker, workers)
        store = open_store(self.path)  # in this process: each worker maps the store itself
        sampler = UniformSampler(store, seed=np.random.default_rng(seed).integers(2**63), **self.sampler_kwargs)
        B, nbytes = self.batch_size, sampler.batch_nbytes(self.batch_size)
        try:
            k = 0
            while count is None or k < count:
                if info is None:
                    yield tensor_batch(sampler.sample(B), "cpu", self.float_dtype)
                else:  # gathered into one shared-memory block: one transfer to the main process, no copy
                    base = torch.empty(nbytes, dtype=torch.uint8).share_memory_()
                    yield tensor_batch(sampler.fill(base.numpy(), B), "cpu", self.float_dtype, base=base)
                k += 1
        finally:
            sampler.close()
            store.close()

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("an endless TransitionDataset (num_batches=None) has no length")
        return self.num_batches
