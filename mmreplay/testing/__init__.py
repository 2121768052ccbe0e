"""testing: a reusable contract suite for stores and samplers (in the style of zarr's
``zarr.testing.store.StoreTests``).

The job: one place that states what every store and every sampler must do, checked against
simple plain-Python references, so that each way of making a store (created directly, rebuilt
from a zarr archive, imported from Minari, ...) and each sampler (uniform, prioritized,
sequences; exact, prefetch or windowed tiers) is held to the same tests, written once.

How a backend uses it: subclass a contract class in a test module under a ``Test`` name and
fill in the one hook that makes the object under test; pytest then runs every inherited test::

    from mmreplay.testing import SamplerContract, StoreContract, write_episodes

    class TestCreatedStore(StoreContract):
        def make_store(self, tmp_path, episodes):
            store = mmreplay.create_store(tmp_path / "s", SCHEMA, segment_records=16)
            write_episodes(store, episodes)
            return store

    class TestUniformPrefetch(SamplerContract):
        kind, mode = "uniform", "prefetch"

        def make_sampler(self, store, seed, **views):
            return mmreplay.UniformSampler(store, seed=seed, prefetch_batches=2, **views)

* ``StoreContract``, hook ``make_store(tmp_path, episodes) -> store``: transition ids round-trip
  through ``store.transitions``; no transition crosses an episode or lane; the transition count
  equals the reference's; n-step and frame-stack views of the store equal the reference; an
  empty store raises ``EmptyStoreError`` when sampled.
* ``SamplerContract``, hook ``make_sampler(store, seed, **views)``, attributes ``kind`` and
  ``mode``: same seed, same batches (another seed, others); every id starts a transition and
  reads the store's rows, at any batch size; the empty-store error; a chi-square test of the
  draw distribution (uniform, or ``p^alpha`` after setting known priorities; a windowed
  sampler must hold the whole store); prioritized importance weights; n-step returns
  (n = 3), frame stacks (k = 4, clamped at the episode start) and both, against the reference.
* ``SequenceSamplerContract``, hook ``make_sampler(store, seed)``: the same draw tests, and
  windows equal to the reference inside their starting episode.

Modules: ``contract`` (the three contract classes and the view assertions), ``reference`` (the
episodes and the plain-Python references), ``damage`` (the damage suite: random damage to a store's
files and what the store must keep; ``benchmarks/damage.py`` runs many cases), ``crash`` (the
crash-state explorer: every state a crash may leave a recorded writer session in, and the
invariants each keeps; ``benchmarks/crash_states.py`` checks them all).

``reference`` holds the episodes (``make_episodes``: a few lanes of complete episodes whose
observations name their episode and step; ``write_episodes``) and the references. This room
sits at the top of the package's import order and is imported by no other module; it needs
pytest, a test dependency.
"""

from .contract import (
    SamplerContract,
    SequenceSamplerContract,
    StoreContract,
    assert_sequence_views,
    assert_transition_views,
)
from .reference import SCHEMA, Episode, make_episodes, write_episodes

__all__ = ["SCHEMA", "Episode", "SamplerContract", "SequenceSamplerContract", "StoreContract",
           "assert_sequence_views", "assert_transition_views", "make_episodes", "write_episodes"]
