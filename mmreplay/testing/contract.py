"""The contract classes: pytest base classes whose tests every store and sampler must pass.

No class here starts with ``Test``, so pytest collects none of them; a backend's test module
subclasses one as ``TestSomething`` and fills in the hook that makes the object under test.
Fixtures are methods, so a subclass may override them too (``episodes``, ``store``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ..core.errors import EmptyStoreError
from ..sampling.uniform import UniformSampler
from ..storage import create_store
from . import reference as ref


def assert_transition_views(batch: Any, episodes: list[ref.Episode], *, n_step: int = 1, gamma: float = 0.99,
                            frame_stack: int = 1) -> None:
    """Every element of a ``TransitionBatch`` equals the plain-Python reference: the frame
    stacks of obs and next_obs (clamped at the episode start), the action, the n-step return,
    discount and end flags."""
    by_index = {e.index: e for e in episodes}
    k = frame_stack
    obs = batch.obs if k > 1 else batch.obs[:, None]
    nobs = batch.next_obs if k > 1 else batch.next_obs[:, None]
    assert obs.shape[1] == k and nobs.shape[1] == k
    for i in range(len(batch.ids)):
        index, t = ref.key_of(obs[i, -1])
        e = by_index[index]
        assert t < e.T, f"episode {index}: its final observation (t={t}) starts a transition"
        g, disc, nt, term, trunc = ref.n_step(e, t, n_step, gamma)
        where = f"episode {index}, t={t}"
        np.testing.assert_array_equal(obs[i], e.obs[ref.stack(t, k)], err_msg=f"obs stack, {where}")
        np.testing.assert_array_equal(nobs[i], e.obs[ref.stack(nt, k)], err_msg=f"next_obs stack, {where}")
        assert batch.action[i] == e.action[t], where
        assert np.isclose(batch.reward[i], g, rtol=1e-5, atol=1e-5), (where, batch.reward[i], g)
        if batch.discount is not None:
            assert np.isclose(batch.discount[i], disc, rtol=1e-5, atol=1e-7), (where, batch.discount[i], disc)
        else:
            assert n_step == 1
        assert (bool(batch.terminated[i]), bool(batch.truncated[i])) == (term, trunc), where


def assert_sequence_views(batch: Any, episodes: list[ref.Episode]) -> None:
    """Every window of a ``SequenceBatch`` equals the reference inside its starting episode
    (rows, mask, ``is_last``) and is masked after it."""
    by_index = {e.index: e for e in episodes}
    total = batch.mask.shape[1]
    for i in range(len(batch.ids)):
        index, t = ref.key_of(batch.fields["obs"][i, 0])
        e = by_index[index]
        want = ref.sequence(e, t, total)
        n = len(want["t"])
        where = f"episode {index}, t={t}"
        np.testing.assert_array_equal(batch.fields["obs"][i, :n], e.obs[want["t"]], err_msg=where)
        assert batch.mask[i, :n].tolist() == want["mask"], where
        assert batch.is_last[i, :n].tolist() == want["is_last"], where
        assert not batch.mask[i, n:].any(), where
        steps = [u for u in want["t"] if u < e.T]
        np.testing.assert_array_equal(batch.fields["action"][i, : len(steps)], e.action[steps], err_msg=where)
        np.testing.assert_array_equal(batch.fields["reward"][i, : len(steps)], e.reward[steps], err_msg=where)


class _Fixtures:
    """The episodes and the store every contract test starts from."""

    lanes = 3
    """Lanes of the episodes the suite writes."""
    rows_per_lane = 40
    """Rows each lane writes (``make_episodes(lanes, rows_per_lane)``)."""
    episode_seed = 0
    """Seed of ``make_episodes``."""
    segment_records = 16
    """Rows per segment of the stores the suite creates: episodes cross segment boundaries."""

    def make_store(self, tmp_path, episodes: list[ref.Episode]) -> Any:
        """A store holding the episodes given (possibly none). The sampler contracts create one;
        ``StoreContract`` leaves it to the backend."""
        store = create_store(tmp_path / "store", ref.SCHEMA, segment_records=self.segment_records)
        ref.write_episodes(store, episodes)
        return store

    @pytest.fixture
    def episodes(self) -> list[ref.Episode]:
        return ref.make_episodes(self.lanes, self.rows_per_lane, seed=self.episode_seed)

    @pytest.fixture
    def store(self, tmp_path, episodes):
        (tmp_path / "full").mkdir()
        s = self.make_store(tmp_path / "full", episodes)
        yield s
        s.close()


class StoreContract(_Fixtures):
    """What every store must do, however it was made.

    Subclass it as ``TestMyStore`` and implement ``make_store(tmp_path, episodes)``: return an
    open store holding exactly the episodes given (``mmreplay.testing.write_episodes`` writes them
    into a writable store). Override ``make_empty_store`` if the backend makes empty stores
    another way, or skip there if it cannot hold one.
    """

    def make_store(self, tmp_path, episodes: list[ref.Episode]) -> Any:
        """The hook: a store of the backend under test holding the episodes given (possibly none)."""
        raise NotImplementedError("a StoreContract subclass says how to make its store")

    def make_empty_store(self, tmp_path) -> Any:
        """A store with no rows: ``make_store`` with no episodes, unless a backend makes empty stores another way."""
        return self.make_store(tmp_path, [])

    def test_transition_count_equals_the_reference(self, store, episodes):
        """The store counts as many transitions as the episodes hold actions."""
        assert len(store.transition_ids()) == len(ref.transitions(episodes)) == sum(e.T for e in episodes)

    def test_ids_round_trip_through_transitions(self, store, episodes):
        """``store.transitions(ids)`` returns those ids, in order, each the reference's transition."""
        want = ref.transitions(episodes)
        ids = store.transition_ids()
        assert len(np.unique(ids)) == len(ids) and (np.diff(ids) > 0).all()
        b = store.transitions(ids)
        np.testing.assert_array_equal(b.ids, ids)
        keys = [ref.key_of(o) for o in b.obs]
        assert sorted(keys) == sorted(want), "the store's transitions are not the episodes' steps"
        for i, key in enumerate(keys):
            w = want[key]
            np.testing.assert_array_equal(b.obs[i], w["obs"], err_msg=str(key))
            np.testing.assert_array_equal(b.next_obs[i], w["next_obs"], err_msg=str(key))
            assert (b.action[i], b.reward[i], bool(b.terminated[i]), bool(b.truncated[i])) == (
                w["action"], w["reward"], bool(w["terminated"]), bool(w["truncated"])), key
        perm = np.random.default_rng(0).permutation(len(ids))[: max(1, len(ids) // 2)]
        again = store.transitions(ids[perm])  # any subset, in any order, reads the same rows
        np.testing.assert_array_equal(again.ids, ids[perm])
        np.testing.assert_array_equal(again.obs, b.obs[perm])
        np.testing.assert_array_equal(again.next_obs, b.next_obs[perm])
        np.testing.assert_array_equal(store.rows("obs", ids[perm]), b.obs[perm])

    def test_no_transition_crosses_an_episode_or_lane(self, store, episodes):
        """A transition's next observation is the next step of its own episode; no final observation starts one."""
        length = {e.index: e.T for e in episodes}
        ids = store.transition_ids()
        b = store.transitions(ids)
        assert not store.rows("is_last", ids).any(), "a final observation starts a transition"
        for o, no in zip(b.obs, b.next_obs):
            (index, t), (n_index, n_t) = ref.key_of(o), ref.key_of(no)
            assert t < length[index], f"episode {index}: its final observation starts a transition"
            assert (n_index, n_t, no[2]) == (index, t + 1, o[2]), f"({index}, {t}) -> ({n_index}, {n_t})"

    def test_sampled_views_match_the_reference(self, store, episodes):
        """3-step returns and stacks of 4 over the store, viewed and sampled, equal the reference's."""
        u = UniformSampler(store, n_step=3, gamma=0.9, frame_stack=4, seed=0)
        try:
            assert_transition_views(u.view(store.transition_ids()), episodes, n_step=3, gamma=0.9, frame_stack=4)
            assert_transition_views(u.sample(64), episodes, n_step=3, gamma=0.9, frame_stack=4)
        finally:
            u.close()

    def test_empty_store_raises_when_sampled(self, tmp_path):
        """Sampling a store with no transitions raises ``EmptyStoreError``."""
        (tmp_path / "empty").mkdir()
        s = self.make_empty_store(tmp_path / "empty")
        try:
            assert len(s.transition_ids()) == 0
            u = UniformSampler(s, seed=0)
            with pytest.raises(EmptyStoreError):
                u.sample(4)
            u.close()
        finally:
            s.close()


class _DrawContract(_Fixtures):
    """Tests every sampler shares: reproducible draws, valid starts, the empty store, and the
    draw distribution (uniform unless ``expected_p`` says otherwise)."""

    batches = 200
    """Batches the distribution test draws."""
    batch_size = 1000
    """The distribution test draws ``batches * batch_size`` ids (about 2,000 per transition)."""

    def make_sampler(self, store, seed: int, **options: Any) -> Any:
        raise NotImplementedError("a sampler contract subclass says how to make its sampler")

    @pytest.fixture
    def new_sampler(self):
        """``new_sampler(store, seed, **options)``: a sampler closed after the test."""
        made: list[Any] = []

        def make(store, seed, **options):
            s = self.make_sampler(store, seed, **options)
            made.append(s)
            return s

        yield make
        for s in made:
            if hasattr(s, "close"):
                s.close()

    def set_up_draws(self, sampler, store, ids: np.ndarray) -> np.ndarray:
        """Prepare ``sampler`` for the distribution test; return each id's expected weight."""
        return np.ones(len(ids))

    def test_same_seed_gives_the_same_batches(self, store, new_sampler):
        def draws(seed):  # one sampler at a time (a store handle holds one windowed sampler)
            s = new_sampler(store, seed)
            out = [s.sample(64) for _ in range(5)]
            if hasattr(s, "close"):
                s.close()
            return out

        a, b, c = draws(7), draws(7), draws(8)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x.ids, y.ids)
            if getattr(x, "weights", None) is not None:
                np.testing.assert_array_equal(x.weights, y.weights)
        assert any(not np.array_equal(x.ids, z.ids) for x, z in zip(a, c)), "another seed, the same batches"

    def test_every_sampled_id_starts_a_transition(self, store, new_sampler):
        valid = store.transition_ids()
        s = new_sampler(store, 1)
        for _ in range(10):
            b = s.sample(64)
            assert np.isin(b.ids, valid).all(), np.setdiff1d(b.ids, valid)
            self.check_batch(store, b)

    def check_batch(self, store, batch) -> None:
        """The batch's rows are the store's rows at its ids."""

    def test_any_batch_size(self, store, new_sampler):
        s = new_sampler(store, 4)
        for size in (1, 3, 97):
            b = s.sample(size)
            assert len(b.ids) == size
            self.check_batch(store, b)

    def test_empty_store_raises_when_sampled(self, tmp_path, new_sampler):
        (tmp_path / "empty").mkdir()
        empty = self.make_store(tmp_path / "empty", [])
        try:
            s = new_sampler(empty, 0)
            with pytest.raises(EmptyStoreError):
                s.sample(8)
        finally:
            empty.close()

    def test_draws_follow_the_stated_distribution(self, store, new_sampler):
        ids = store.transition_ids()
        s = new_sampler(store, 3)
        p = self.set_up_draws(s, store, ids)
        draws = np.concatenate([s.sample(self.batch_size).ids for _ in range(self.batches)])
        self.check_draw_set(s, store)
        assert np.isin(draws, ids).all()
        chi2, limit = ref.chi_square(np.bincount(np.searchsorted(ids, draws), minlength=len(ids)), p)
        assert chi2 < limit, f"chi-square {chi2:.1f} over {len(ids) - 1} degrees of freedom (limit {limit:.1f})"

    def check_draw_set(self, sampler, store) -> None:
        """Windowed samplers draw from their resident set: the distribution test needs all of
        the store in it."""
        stats = sampler.tier_stats() if hasattr(sampler, "tier_stats") else {}
        if stats.get("mode") == "windowed":
            held = stats["resident_segments"] + stats.get("open_segments", 0)
            assert held >= store.info()["segments"], f"only {held} segments resident: {stats}"


class SamplerContract(_DrawContract):
    """What every transition sampler must do (uniform or prioritized, any tier mode).

    Subclass it as ``TestMySampler``, set ``kind`` (``"uniform"`` or ``"prioritized"``) and
    ``mode`` (informative: ``"exact"``, ``"prefetch"``, ``"windowed"``), and implement
    ``make_sampler(store, seed, **views)``, passing ``views`` (``n_step``, ``gamma``,
    ``frame_stack``) on to the sampler. A windowed sampler's cache must hold the whole store
    (a few small segments here) so that its draws are those of the whole store.
    """

    kind = "uniform"
    """``"uniform"`` or ``"prioritized"``: which draw distribution the suite expects."""
    mode = "exact"
    """The tier mode tested (informative: ``"exact"``, ``"prefetch"``, ``"windowed"``)."""
    alpha = 0.7
    """``"prioritized"``: the ``alpha`` for ``make_sampler`` to make the sampler with (the suite checks
    priorities against the sampler's own ``alpha``)."""

    def set_up_draws(self, sampler, store, ids):
        if self.kind == "uniform":
            return np.ones(len(ids))
        td = np.random.default_rng(0).exponential(1.0, len(ids))
        sampler.update_priorities(ids, td)  # before the first draw: nothing is drawn ahead yet
        np.testing.assert_allclose(sampler.priorities(ids), (td + sampler.eps) ** sampler.alpha, rtol=1e-6)
        return (np.abs(td) + sampler.eps) ** sampler.alpha

    def check_batch(self, store, batch):
        direct = store.transitions(batch.ids)
        for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated"):
            np.testing.assert_array_equal(getattr(batch, name), getattr(direct, name), err_msg=name)
        if self.kind == "prioritized":
            assert batch.weights is not None and (batch.weights > 0).all() and batch.weights.max() <= 1 + 1e-6

    def test_prioritized_weights_follow_the_formula(self, store, new_sampler):
        """Importance weights are ``(N P(i)) ** -beta`` over the largest, for priorities set by hand."""
        if self.kind != "prioritized":
            pytest.skip("importance weights belong to prioritized samplers")
        ids = store.transition_ids()
        s = new_sampler(store, 2)
        p = self.set_up_draws(s, store, ids)
        beta = s.beta
        b = s.sample(64)  # w_i = (N P(i))^-beta / max_j w_j = (p_i / min_j p_j)^-beta
        got = dict(zip(ids.tolist(), (p / p.min()) ** -beta))
        np.testing.assert_allclose(b.weights, [got[i] for i in b.ids.tolist()], rtol=1e-4)

    @pytest.mark.parametrize(("n_step", "frame_stack"), [(3, 1), (1, 4), (3, 4)])
    def test_views_match_the_reference(self, store, episodes, new_sampler, n_step, frame_stack):
        """Sampled n-step returns and frame stacks (with and without each other) equal the reference's."""
        s = new_sampler(store, 1, n_step=n_step, gamma=0.9, frame_stack=frame_stack)
        for _ in range(3):
            assert_transition_views(s.sample(128), episodes, n_step=n_step, gamma=0.9, frame_stack=frame_stack)


class SequenceSamplerContract(_DrawContract):
    """What a sequence sampler must do: windows of ``burn_in + length`` rows of one lane, drawn
    uniformly over the rows that start one (every step row here: every episode is complete and
    the stride is 1).

    Subclass it as ``TestMySequences`` and implement ``make_sampler(store, seed)`` returning a
    sampler of windows of ``length`` rows after ``burn_in`` rows, stride 1.
    """

    length = 3
    """Rows of a window after its burn-in (the sampler must be made with it)."""
    burn_in = 2
    """Burn-in rows of a window (the sampler must be made with it)."""

    def check_batch(self, store, batch):
        np.testing.assert_array_equal(batch.fields["obs"][:, 0], store.rows("obs", batch.ids))
        assert batch.mask.shape == (len(batch.ids), self.length + self.burn_in)

    def test_windows_match_the_reference(self, store, episodes, new_sampler):
        """Sampled windows equal the reference's inside their starting episode, and every start can be viewed."""
        s = new_sampler(store, 1)
        for _ in range(3):
            assert_sequence_views(s.sample(128), episodes)
        if hasattr(s, "windows"):  # every start, 8 at a time (test_any_batch_size covers other sizes)
            ids = store.transition_ids()
            for i in range(0, len(ids), 8):
                chunk = ids[i : i + 8] if i + 8 <= len(ids) else ids[-8:]
                every = s.windows(chunk)
                assert every is not None, chunk
                assert_sequence_views(every, episodes)
