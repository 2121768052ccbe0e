"""Prioritized replay: formulas, statistics, updates, new rows, eviction, persistence."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import step

import mmreplay
from mmreplay import PrioritizedSampler


def fill(store, steps=60, lanes=2):
    with store.writer(lanes=lanes) as w:
        for t in range(steps):
            w.add(**step(lanes, t, term=[t % 9 == 8] + [False] * (lanes - 1)))


def test_priorities_stored_once_and_duplicates_last_wins(store):
    fill(store)
    ps = PrioritizedSampler(store, alpha=0.6, seed=0)
    ids = store.transition_ids()[:3]
    ps.update_priorities(np.array([ids[0], ids[1], ids[0]]), np.array([1.0, -2.0, 3.0]))
    np.testing.assert_allclose(ps.priorities(ids[:2]), [(3.0 + ps.eps) ** 0.6, (2.0 + ps.eps) ** 0.6])
    assert ps.priorities(ids[2:3])[0] == 1.0  # untouched: entered at the initial max priority
    with pytest.raises(ValueError, match="finite"):
        ps.update_priorities(ids[:1], np.array([np.nan]))
    with pytest.raises(ValueError, match="same length"):
        ps.update_priorities(ids[:2], np.array([1.0]))


def test_beta_anneals_linearly(store):
    fill(store)
    ps = PrioritizedSampler(store, beta=0.4, beta_final=1.0, beta_steps=10, seed=0)
    betas = []
    for _ in range(12):
        betas.append(ps.beta)
        ps.sample(4)
    np.testing.assert_allclose(betas[:11], np.linspace(0.4, 1.0, 11))
    assert betas[11] == 1.0


def test_new_rows_enter_at_max_priority_and_become_sampleable(store):
    w = store.writer(lanes=1)
    for t in range(5):
        w.add(**step(1, t))
    ps = PrioritizedSampler(store, seed=0)
    ids = store.transition_ids()
    ps.update_priorities(ids, np.full(len(ids), 10.0))
    top = ps.max_priority
    w.add(**step(1, 5))  # row 4 now has its next row: it enters, at the max priority
    store.refresh()
    b = ps.sample(32)
    assert 4 in set(b.obs[:, 0].astype(int).tolist())
    new = store.transition_ids()
    assert ps.priorities(new[-1:])[0] == pytest.approx(top)
    w.close()


def test_rows_from_another_process_enter_on_refresh(store):
    fill(store, steps=5)
    reader = mmreplay.open_store(store.path)
    ps = PrioritizedSampler(reader, seed=0, refresh_interval_s=0.0)
    n0 = (ps.tree.leaves() > 0).sum()
    with store.writer(lanes=2) as w:
        for t in range(5, 10):
            w.add(**step(2, t))
    ps.sample(8)
    assert (ps.tree.leaves() > 0).sum() == len(reader.transition_ids()) > n0
    reader.close()


def test_evicted_rows_leave_the_tree(tmp_path, schema):
    s = mmreplay.create_store(tmp_path / "s", schema, capacity=64, segment_records=16)
    ps = None
    with s.writer(lanes=2) as w:
        for t in range(200):
            w.add(**step(2, t))
            if t == 50:
                s.refresh()
                ps = PrioritizedSampler(s, seed=0, refresh_interval_s=0.0)
                ps.sample(8)
    b = ps.sample(2000)
    live = set(s.transition_ids().tolist())
    assert set(b.ids.tolist()) <= live
    assert (ps.tree.leaves() > 0).sum() == len(live)
    np.testing.assert_allclose(ps.tree.total, ps.tree.leaves().sum())
    s.close()


def test_priorities_persist_with_the_store(tmp_path, schema):
    s = mmreplay.create_store(tmp_path / "s", schema, segment_records=32)
    fill(s)
    ps = PrioritizedSampler(s, seed=3, name="run1")
    ids = s.transition_ids()
    ps.update_priorities(ids, np.random.default_rng(1).exponential(1.0, len(ids)))
    ps.save()
    before = ps.priorities(ids)
    s.close()
    r = mmreplay.open_store(tmp_path / "s")
    again = PrioritizedSampler(r, seed=3, name="run1")
    np.testing.assert_allclose(again.priorities(ids), before)
    assert again.max_priority == ps.max_priority
    other = PrioritizedSampler(r, seed=3, name="run2")  # another name starts fresh
    assert (other.priorities(ids) == 1.0).all()
    r.close()


def test_sample_rejects_a_non_integer_batch_size_in_one_line(tmp_path):
    st = mmreplay.create_store(tmp_path / "s", mmreplay.Schema.transition(obs_shape=(3,)), capacity=1000)
    with st.writer() as w:
        for t in range(10):
            w.add(step(1, t, term=[t == 9]))
    samplers = [mmreplay.UniformSampler(st, seed=0), mmreplay.PrioritizedSampler(st, seed=0),
                mmreplay.SequenceSampler(st, 2, seed=0)]
    for s in samplers:
        for bad in (2.5, "8", None, True):
            with pytest.raises(TypeError, match=r"^`batch_size` must be an integer, got") as e:
                s.sample(bad)
            assert "\n" not in str(e.value)
        with pytest.raises(ValueError, match="`batch_size` must be >= 1"):
            s.sample(0)
        assert len(s.sample(np.int64(3)).ids) == 3
    with pytest.raises(TypeError, match="`batch_size`"):
        samplers[0].sample_ids(1.0)
    st.close()


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_random_state_puts_back_the_same_next_batches(store, kind):
    """What a training checkpoint keeps of a sampler: after ``set_random_state`` a fresh sampler draws
    the batches the captured one drew next (and a prioritized one anneals β from the same step)."""
    import json

    fill(store)
    make = (lambda: PrioritizedSampler(store, seed=1)) if kind == "prioritized" else \
        (lambda: mmreplay.UniformSampler(store, seed=1))
    a = make()
    for _ in range(3):
        a.sample(8)
    state = json.loads(json.dumps(a.random_state()))  # plain JSON values, as in the checkpoint
    want = [a.sample(8).obs.copy() for _ in range(2)]
    b = make()
    b.set_random_state(state)
    got = [b.sample(8).obs for _ in range(2)]
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)
    assert state["steps"] == (3 if kind == "prioritized" else 0)
    with pytest.raises(ValueError, match="kernel"):
        b.set_random_state({**state, "kernel": state["kernel"][:1]})
