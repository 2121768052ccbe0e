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


def load_kernels() -> None:
    """Import the compiled sampling kernels now (numba and its on-disk cache: about a second
    here), rather than in the first ``sample()``: a trainer does it before its clock starts."""
    from ._gather import kernels

    kernels()


__all__ = ["PrioritizedSampler", "SequenceBatch", "SequenceSampler", "TransitionSampler", "UniformSampler",
           "load_kernels"]
