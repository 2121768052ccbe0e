"""sampling: choose row ids and turn them into batches.

Modules: ``uniform`` (TransitionSampler, UniformSampler), ``prioritized`` (PrioritizedSampler
over the vectorized ``_sumtree``), ``sequence`` (fixed-length windows), ``gather`` (the gather
loop shared by every sampler, its typed plans, and the lazily imported kernels), ``tiers`` (the
RAM resident set and windowed mode), ``_prefetch`` (batches drawn ahead, pages read in the
background), and the compiled kernels: ``transition_kernels`` (draw, validate and gather one-step
transitions), ``window_kernels`` (n-step returns, frame stacks, sequences), ``io_kernels``
(page reads and access hints for rows about to be gathered). The kernels read the store through
storage's read contract (the segment table and row flags ``mmreplay.storage`` exports).

Invariants: samplers never copy payload they do not return; no transition, n-step window,
stack or sequence crosses an episode boundary, needs a masked (damaged) row, or reaches a
segment no longer in the store: such a window is left out, never shortened or clamped; the same
seed on the same store gives the same batches.
"""

from .prioritized import PrioritizedSampler
from .sequence import SequenceBatch, SequenceSampler
from .uniform import TransitionSampler, UniformSampler


def load_kernels() -> None:
    """Import the compiled sampling kernels now (numba and its on-disk cache: about a second
    here), rather than in the first ``sample()``: a trainer does it before its clock starts."""
    from .gather import kernels

    kernels()


__all__ = ["PrioritizedSampler", "SequenceBatch", "SequenceSampler", "TransitionSampler", "UniformSampler",
           "load_kernels"]
