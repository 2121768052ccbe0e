"""The sampler contracts (``mmreplay.testing``) applied to uniform and prioritized sampling in
each storage-tier mode (exact, exact with prefetch, windowed) and to sequence sampling.

Windowed mode draws only from its resident set: the suite's store is 8 segments of 16 rows
(16 KiB files), and ``CACHE`` holds 512 such segments, so the whole store is resident (the
contract checks it with ``tier_stats()``) and the distribution test is that of the whole store;
no swaps (``swap_segments_per_s=0``) keep the draws reproducible.
"""

from __future__ import annotations


import mmreplay
from mmreplay.testing import SamplerContract, SequenceSamplerContract

CACHE = 8 << 20
MODES = {"exact": {}, "prefetch": {"prefetch_batches": 2},
         "windowed": {"mode": "windowed", "cache_bytes": CACHE, "swap_segments_per_s": 0}}


class _Uniform(SamplerContract):
    kind = "uniform"

    def make_sampler(self, store, seed, **views):
        return mmreplay.UniformSampler(store, seed=seed, **MODES[self.mode], **views)


class _Prioritized(SamplerContract):
    kind = "prioritized"

    def make_sampler(self, store, seed, **views):
        return mmreplay.PrioritizedSampler(store, alpha=self.alpha, beta=0.5, seed=seed, **MODES[self.mode], **views)


class TestUniformExact(_Uniform):
    mode = "exact"


class TestUniformPrefetch(_Uniform):
    mode = "prefetch"


class TestUniformWindowed(_Uniform):
    mode = "windowed"


class TestPrioritizedExact(_Prioritized):
    mode = "exact"


class TestPrioritizedPrefetch(_Prioritized):
    mode = "prefetch"


class TestPrioritizedWindowed(_Prioritized):
    mode = "windowed"


class TestSequences(SequenceSamplerContract):
    def make_sampler(self, store, seed):
        return mmreplay.SequenceSampler(store, self.length, burn_in=self.burn_in, seed=seed)

