"""The tensor-batch builder: a sampler's numpy batch as torch tensors on a device
(:func:`tensor_batch`, :class:`TensorBatch`).

The one builder behind ``BatchLoader``, ``DeviceTier``'s batch type, the synchronous training
loop and the integrations.

Invariants: on the CPU the tensors are views of the batch's arrays (no copy); with ``base`` (the
uint8 block a batch was gathered into) they are views of that one block, or of its device copy
(``device_base``) at the same offsets, so a batch is one storage; only an array outside the block
(n-step returns, weights) or not aligned for its dtype is a tensor of its own. torch is imported
when a batch is built, not when this module is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..storage import TransitionBatch


@dataclass
class TensorBatch:
    """A batch as torch tensors on the loader's device."""

    obs: Any
    """Observation tensor (a dict ``{key: tensor}`` for a Dict observation space); floats and uint8
    frames in the loader's ``float_dtype`` when one is set."""
    action: Any
    """Action tensor."""
    reward: Any
    """Reward tensor (with ``n_step`` > 1: the discounted m-step return)."""
    next_obs: Any
    """Observation of the lane's next row, as ``obs``."""
    terminated: Any
    """Bool tensor: the episode ended by termination (do not bootstrap)."""
    truncated: Any
    """Bool tensor: the episode was cut (time limit)."""
    ids: np.ndarray
    """Global row ids (numpy, on the host): pass them back to ``update_priorities``."""
    weights: Any = None
    """Importance-sampling weights (prioritized replay), ``None`` for uniform sampling."""
    discount: Any = None
    """The bootstrap factor ``gamma^m`` of ``n_step``/``frame_stack`` views, ``None`` otherwise (see
    ``TransitionBatch.discount``)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Any other schema field, as tensors."""
    buffer: Any = None
    """From a ``BatchLoader``: the buffer (on the batch's device) the tensors are views of, one of
    the few the loader reuses, so a consumer may key work prepared for fixed addresses on it
    (``mmreplay.train.graphs``). ``None`` otherwise."""


def tensor_batch(b: TransitionBatch, device: Any, float_dtype: Any = None, base: Any = None,
                 device_base: Any = None, cache: dict[Any, Any] | None = None) -> TensorBatch:
    """A numpy batch as a ``TensorBatch`` on ``device``: every field, ``extra`` fields included
    (dict observations stay dicts). On the CPU the tensors are views of the batch's arrays (no
    copy); elsewhere they are copied with ``non_blocking=True`` on the current stream. Float
    fields and uint8 ones (frames) are cast to ``float_dtype`` on the device if it is set. The
    one builder behind ``BatchLoader``, the synchronous training loop and the integrations.

    ``base``: a 1-D uint8 CPU tensor the batch was gathered into (``sampler.fill(base.numpy(), B)``);
    the tensors are then views of ``base`` itself, one storage, which a process hands to another
    (a DataLoader worker to the main process) as one shared-memory block instead of one per field.
    ``device_base``: a uint8 tensor on ``device`` holding a copy of ``base`` (``BatchLoader``'s one
    copy per batch): the tensors are views of it at the same offsets, and only arrays that lie
    outside ``base`` (n-step returns, weights) are copied on their own; ``cache`` (a dict kept
    per ``device_base``) keeps those views, which are the same for every batch of one plan."""
    import torch

    device = torch.device(device)
    move = device.type != "cpu"
    lo = 0 if base is None else base.numpy().__array_interface__["data"][0]
    views = {} if cache is None else cache

    def conv(a: Any) -> Any:
        if a is None:
            return None
        a = np.asarray(a)
        if device_base is not None:
            key = (a.__array_interface__["data"][0] - lo, a.shape, a.strides, a.dtype.str)
            t = views.get(key)
            if t is None:
                t = _view_of(device_base, lo, a, torch)
                if t is not None:
                    views[key] = t
            if t is None:
                t = torch.from_numpy(a).to(device, non_blocking=True)
        else:
            t = _view_of(base, lo, a, torch) if base is not None else None
            t = torch.from_numpy(a) if t is None else t
            if move:
                t = t.to(device, non_blocking=True)
        if float_dtype is not None and (t.is_floating_point() or t.dtype == torch.uint8):
            t = t.to(float_dtype)
        return t

    def obs(o: Any) -> Any:
        return {k: conv(v) for k, v in o.items()} if isinstance(o, dict) else conv(o)

    return TensorBatch(obs(b.obs), conv(b.action), conv(b.reward), obs(b.next_obs), conv(b.terminated),
                       conv(b.truncated), np.array(b.ids), conv(b.weights), conv(b.discount),
                       {k: conv(v) for k, v in b.extra.items()})


def _view_of(base: Any, lo: int, a: np.ndarray, torch: Any) -> Any:
    """``a`` as a view of the uint8 tensor ``base`` whose memory starts at address ``lo``, or ``None``
    when it lies elsewhere or is not aligned for its dtype."""
    off, size = a.__array_interface__["data"][0] - lo, a.itemsize
    if a.size == 0 or off < 0 or off % size or any(st % size for st in a.strides) or a.dtype.kind not in "biuf":
        return None
    span = off + sum((n - 1) * st for n, st in zip(a.shape, a.strides)) + size
    if span > base.numel() or min(a.strides, default=0) < 0:
        return None
    typed = base[: base.numel() // size * size].view(torch.from_numpy(a[:0].reshape(0)).dtype)
    return typed.as_strided(a.shape, [st // size for st in a.strides], off // size)
