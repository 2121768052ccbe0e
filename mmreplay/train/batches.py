"""The learner's batch source (:class:`Batches`): from a ``BatchLoader`` thread, or drawn in the
calling thread; the device a run trains on (:func:`pick_device`) and numpy batches as tensors
(:func:`to_tensors`).

Invariants: ``update_priorities`` reaches the sampler before its next draw (through the loader's
queue when there is one); the synchronous loop draws in its own thread (no loader), so a seeded
run is reproducible; the wait fractions count only the time spent getting batches.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from ..sampling.uniform import TransitionSampler
    from ..storage import TransitionBatch
    from .settings import TrainConfig


def pick_device(name: str) -> torch.device:
    """The device a run trains on: ``"auto"`` is CUDA when available, else the CPU; any other name
    as ``torch.device`` reads it (``"cpu"``, ``"cuda:1"``)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def to_tensors(b: TransitionBatch, device: torch.device) -> Any:
    """A numpy batch as a ``TensorBatch`` on ``device`` (no copy on the CPU), ``extra`` fields
    included: ``mmreplay.loader.tensor_batch``, the builder ``BatchLoader`` uses too."""
    from ..loader import tensor_batch

    return tensor_batch(b, device)


class Batches:
    """The learner's batches: from a ``BatchLoader`` thread, or drawn in the calling thread.

    Either way ``update_priorities`` reaches the sampler before its next draw (through the
    loader's queue), and ``wait_fraction`` is the share of the learner's time spent getting
    batches since the last call."""

    sampler: TransitionSampler
    """The sampler the batches are drawn from."""
    batch_size: int
    """Transitions per batch (``cfg.algo.batch_size``)."""
    device: torch.device
    """The device the batches' tensors are on."""
    wait_s: float
    """Seconds spent getting batches so far (in :meth:`next`)."""
    busy_s: float
    """Seconds between handing out a batch and the next call of :meth:`next` so far: the learner's own time."""

    def __init__(self, sampler: TransitionSampler, cfg: TrainConfig, device: torch.device) -> None:
        from ..loader import BatchLoader

        use = cfg.replay.loader if cfg.replay.loader is not None else device.type == "cuda"
        self.sampler, self.batch_size, self.device = sampler, cfg.algo.batch_size, device
        self.loader = BatchLoader(sampler, cfg.algo.batch_size, device=device, prefetch=cfg.replay.prefetch,
                                  profile=True) if use else None
        """The ``BatchLoader`` thread the batches come from (``cfg.replay.loader``; by default on CUDA), or
        ``None``: they are drawn in the calling thread."""
        self._it = iter(self.loader) if self.loader is not None else None
        self.wait_s = self.busy_s = 0.0
        self._handed: float | None = None
        self._seen = (0.0, 0.0)

    def next(self) -> Any:
        """The next batch, as tensors on ``device``; the time spent getting it adds to ``wait_s``, the
        time since the previous batch was handed out to ``busy_s``."""
        t0 = time.perf_counter()
        if self._handed is not None:
            self.busy_s += t0 - self._handed
        b = next(self._it) if self._it is not None else to_tensors(self.sampler.sample(self.batch_size), self.device)
        self._handed = time.perf_counter()
        self.wait_s += self._handed - t0
        return b

    def update_priorities(self, ids: np.ndarray, td: torch.Tensor) -> None:
        """Set the priorities of the sampled rows ``ids`` from their TD errors ``td`` (prioritized
        replay); the sampler has them before its next draw."""
        if self.loader is not None:
            self.loader.update_priorities(ids, td)
        else:
            self.sampler.update_priorities(ids, td.cpu().numpy())  # type: ignore[attr-defined]

    def wait_fraction(self) -> float:
        """Share (0 to 1) of the learner's time since the last call spent getting batches; 0.0 when
        no time was counted."""
        w, b = self.wait_s - self._seen[0], self.busy_s - self._seen[1]
        self._seen = (self.wait_s, self.busy_s)
        return w / (w + b) if w + b > 0 else 0.0

    def total_wait_fraction(self) -> float:
        """Share (0 to 1) of the learner's time spent getting batches since this source was made."""
        t = self.wait_s + self.busy_s
        return self.wait_s / t if t > 0 else 0.0

    def close(self) -> None:
        """Stop the loader thread, if there is one."""
        if self.loader is not None:
            self.loader.close()
