"""loader: a sampler's batches as torch tensors on the device, ready before the learner asks.

Modules: ``batch_loader`` (``BatchLoader``: background threads gather batches into a few reused,
pinned host buffers and copy each to the device in one transfer), ``tensors`` (``TensorBatch``,
``tensor_batch``: a numpy batch as tensors, the one builder the loader, the training loop and the
integrations share), ``device_tier`` (``DeviceTier``: a store that fits on the card mirrored
there as it is written; indices drawn on the host with the sampler's own stream, stacks, n-step
windows and the gather on the device).

Invariants: the tensors of a batch stay valid at least until the next batch is asked for (a
loader refills a buffer only after the consumer moved on); a seed fixes the sequence of batches
(with one worker, and in a tier, they are the transitions the sampler's own ``sample`` gives);
torch is imported when a loader, a tier or a tensor batch is made, not by ``import mmreplay``.
"""

from .batch_loader import BatchLoader
from .tensors import TensorBatch, tensor_batch

__all__ = ["BatchLoader", "TensorBatch", "tensor_batch"]
