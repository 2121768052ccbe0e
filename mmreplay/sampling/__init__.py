"""sampling: choose row ids and turn them into batches.

Modules: ``uniform`` (TransitionSampler, UniformSampler), ``prioritized`` (PrioritizedSampler
over the vectorized ``_sumtree``), ``sequence`` (fixed-length windows), ``_gather`` (the gather
loop shared by every sampler, its typed plans, and the lazily imported kernels), ``tiers`` (the
RAM resident set and windowed mode), ``_prefetch`` (batches drawn ahead, pages read in the
background), ``_windows`` (n-step returns and frame stacks), ``_kernels`` and ``_iokernels``
(compiled locate/validate/gather kernels).

Invariants: samplers never copy payload they do not return; no transition, n-step window,
stack or sequence crosses an episode boundary or reaches a deleted segment; the same seed on
the same store gives the same batches.
"""

from .prioritized import PrioritizedSampler
from .sequence import SequenceBatch, SequenceSampler
from .uniform import TransitionSampler, UniformSampler

__all__ = ["PrioritizedSampler", "SequenceBatch", "SequenceSampler", "TransitionSampler", "UniformSampler"]
