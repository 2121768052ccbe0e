"""n-step returns and frame stacks against a plain-Python reference (Hypothesis), across
segment boundaries, episode ends of both kinds, and eviction."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmreplay

SCHEMA = mmreplay.Schema.transition(obs_shape=(2,), obs_dtype=np.float32)


def reference(rows, n, gamma, k, first_present=None):
    """{(lane, t): (return, discount, next t, terminated, truncated, stack ts, next stack ts)}.

    ``first_present[lane]``: the lane's oldest row still stored (older ones were evicted);
    windows never start before it, and a stack that would have to look before it is left out."""
    out = {}
    for lane, rs in rows.items():
        first = (first_present or {}).get(lane, 0)
        start = 0
        starts = []  # first row of each row's episode
        for t, r in enumerate(rs):
            starts.append(start)
            if r["is_last"]:
                start = t + 1
        for t, r in enumerate(rs):
            if r["is_last"] or t < first:
                continue
            g, disc, m, u = 0.0, 1.0, 0, t
            result = None
            while True:
                g += disc * rs[u]["reward"]
                if u + 1 >= len(rs):
                    break  # lookahead not written
                if rs[u]["terminated"]:
                    result = (g, 0.0, u + 1, True, False)
                    break
                disc *= gamma
                m += 1
                if rs[u + 1]["is_last"]:
                    result = (g, disc, u + 1, False, bool(rs[u]["truncated"]))
                    break
                if m == n:
                    result = (g, disc, u + 1, False, False)
                    break
                u += 1
            if result is None:
                continue

            def stack(x, rs=rs, first=first):
                """Steps back from x, clamped at the episode start; None where a step back would
                have to look at an evicted row (whether the episode went on there is unknown)."""
                cur, ts = x, [x]
                for _ in range(k - 1):
                    p = cur - 1
                    if 0 <= p < first:
                        return None
                    if p >= 0 and not rs[p]["is_last"]:
                        cur = p
                    ts.insert(0, cur)
                return ts

            s0, s1 = stack(t), stack(result[2])
            if s0 is None or s1 is None:
                continue  # left out, never clamped at an evicted segment
            out[(lane, t)] = (*result, s0, s1)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lanes=st.integers(1, 3), steps=st.integers(1, 40), n=st.integers(1, 4), k=st.integers(1, 4),
       gamma=st.sampled_from([0.0, 0.5, 0.99, 1.0]), final=st.booleans(), seed=st.integers(0, 2**16),
       per=st.booleans(), capacity=st.sampled_from([10_000, 12]), lane_segments=st.booleans())
def test_windows_match_the_reference(tmp_path_factory, lanes, steps, n, k, gamma, final, seed, per, capacity,
                                     lane_segments):
    rng = np.random.default_rng(seed)
    store = mmreplay.create_store(tmp_path_factory.mktemp("w") / "s", SCHEMA, segment_records=6, capacity=capacity)
    rows = {lane: [] for lane in range(lanes)}
    prev = np.zeros(lanes, bool)
    with store.writer(lanes=lanes, lane_segments=lane_segments) as w:
        for t in range(steps):
            kind = rng.choice([0, 0, 0, 1, 2], size=lanes)
            term, trunc = kind == 1, kind == 2
            reward = rng.integers(-3, 4, lanes).astype(np.float32)
            obs = np.stack([np.arange(lanes, dtype=np.float32), np.full(lanes, t, np.float32)], 1)
            w.add(obs=obs, action=np.zeros(lanes, np.int64), reward=reward, terminated=term, truncated=trunc)
            for lane in range(lanes):
                rows[lane].append({"reward": float(reward[lane]), "terminated": bool(term[lane]),
                                   "truncated": bool(trunc[lane]), "is_last": bool(prev[lane])})
            prev = term | trunc
        if final:
            w.close(last_obs=np.stack([np.arange(lanes, dtype=np.float32), np.full(lanes, steps, np.float32)], 1))
            for lane in range(lanes):
                rows[lane].append({"reward": 0.0, "terminated": False, "truncated": False, "is_last": True})
    store.refresh()
    snap = store.reader.snapshot
    present = np.concatenate([store.reader.columns["obs"][int(snap.windows[i]), : int(snap.committed[i])]
                              for i in range(len(snap.segment_ids))]) if len(snap.segment_ids) else np.zeros((0, 2))
    first_present = {lane: int(present[present[:, 0] == lane, 1].min()) for lane in range(lanes)
                     if (present[:, 0] == lane).any()}
    first_present.update({lane: len(rows[lane]) for lane in range(lanes) if lane not in first_present})
    ref = reference(rows, n, gamma, k, first_present)
    cls = mmreplay.PrioritizedSampler if per else mmreplay.UniformSampler
    sampler = cls(store, n_step=n, gamma=gamma, frame_stack=k, seed=0)
    ids = sampler.valid_ids()
    assert len(ids) == len(ref)
    if len(ids) == 0:
        store.close()
        return
    b = sampler.view(ids)
    obs = b.obs if k > 1 else b.obs[:, None]
    nobs = b.next_obs if k > 1 else b.next_obs[:, None]
    for i in range(len(ids)):
        lane, t = int(obs[i, -1, 0]), int(obs[i, -1, 1])
        g, disc, nt, te, tr, stack, nstack = ref[(lane, t)]
        assert b.reward[i] == np.float32(g)
        assert np.isclose(b.discount[i], disc)
        assert (bool(b.terminated[i]), bool(b.truncated[i])) == (te, tr)
        assert (obs[i, :, 0] == lane).all() and (nobs[i, :, 0] == lane).all()
        assert obs[i, :, 1].astype(int).tolist() == stack
        assert nobs[i, :, 1].astype(int).tolist() == nstack
    drawn = sampler.sample(64)
    assert set(drawn.ids.tolist()) <= set(ids.tolist())
    store.close()


def test_frame_stacks_never_reach_into_an_evicted_segment(tmp_path):
    s = mmreplay.create_store(tmp_path / "s", SCHEMA, capacity=12, segment_records=6)
    with s.writer(lanes=1) as w:
        for t in range(40):
            w.add(obs=np.array([[0, t]], np.float32), action=np.zeros(1, np.int64), reward=np.ones(1, np.float32),
                  terminated=np.zeros(1, bool), truncated=np.zeros(1, bool))
    u = mmreplay.UniformSampler(s, frame_stack=4, seed=0)
    b = u.view(u.valid_ids())
    oldest = int(s.rows("obs", s.transition_ids()[:1])[0, 1])  # the oldest row still stored
    assert oldest > 0  # rows were evicted
    # one episode: every stack is four consecutive frames (none clamped at the evicted segment),
    # and the first three starts of the oldest segment, whose stacks would reach before it, are left out
    assert (np.diff(b.obs[:, :, 1], axis=1) == 1).all()
    assert int(b.obs[:, -1, 1].min()) == oldest + 3
    assert u.tier_stats()["windows_left_out"] == 3
    s.close()


def test_bad_view_arguments(store):
    import pytest

    with pytest.raises(ValueError, match="n_step"):
        mmreplay.UniformSampler(store, n_step=0)
    with pytest.raises(ValueError, match="frame_stack"):
        mmreplay.UniformSampler(store, frame_stack=0)
    with pytest.raises(ValueError, match="gamma"):
        mmreplay.UniformSampler(store, gamma=1.5)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lanes=st.integers(1, 3), steps=st.integers(1, 30), length=st.integers(1, 5), burn_in=st.integers(0, 2),
       stride=st.integers(1, 3), final=st.booleans(), seed=st.integers(0, 2**16), lane_segments=st.booleans())
def test_sequences_match_the_reference(tmp_path_factory, lanes, steps, length, burn_in, stride, final, seed,
                                       lane_segments):
    rng = np.random.default_rng(seed)
    store = mmreplay.create_store(tmp_path_factory.mktemp("q") / "s", SCHEMA, segment_records=6)
    last = {lane: [] for lane in range(lanes)}
    prev = np.zeros(lanes, bool)
    with store.writer(lanes=lanes, lane_segments=lane_segments) as w:
        for t in range(steps):
            kind = rng.choice([0, 0, 0, 1, 2], size=lanes)
            obs = np.stack([np.arange(lanes, dtype=np.float32), np.full(lanes, t, np.float32)], 1)
            w.add(obs=obs, action=np.zeros(lanes, np.int64), reward=np.zeros(lanes, np.float32),
                  terminated=kind == 1, truncated=kind == 2)
            for lane in range(lanes):
                last[lane].append(bool(prev[lane]))
            prev = (kind == 1) | (kind == 2)
        if final:
            w.close(last_obs=np.stack([np.arange(lanes, dtype=np.float32), np.full(lanes, steps, np.float32)], 1))
            for lane in range(lanes):
                last[lane].append(True)
    total = length + burn_in
    q = mmreplay.SequenceSampler(store, length, burn_in=burn_in, stride=stride, seed=0)
    snap = store.reader.snapshot
    all_ids = np.concatenate([snap.segment_ids[k] * store.segment_records + np.arange(snap.committed[k])
                              for k in range(len(snap.segment_ids))]) if len(snap.segment_ids) else np.zeros(0, int)
    seen = 0
    for rid in all_ids:
        b = q.windows(np.array([rid]))
        lane, t = (int(v) for v in store.rows("obs", np.array([rid]))[0])
        rows = last[lane]
        # reference: a step row, on the stride, whose episode end (or the window) is written
        ep_end = next((u for u in range(t + 1, len(rows)) if rows[u]), None)
        complete = t + total <= len(rows) or ep_end is not None
        expect = (not rows[t]) and t % stride == 0 and complete
        assert (b is not None) == expect, (lane, t)
        if b is None:
            continue
        seen += 1
        n = min(total, len(rows) - t)
        assert b.fields["obs"][0, :n, 1].astype(int).tolist() == list(range(t, t + n))
        assert (b.fields["obs"][0, :n, 0] == lane).all() and not b.mask[0, n:].any()
        want_mask = [u < (ep_end if ep_end is not None else len(rows)) for u in range(t, t + n)]
        assert b.mask[0, :n].tolist() == want_mask
        assert b.is_last[0, :n].tolist() == rows[t : t + n]
    if seen:
        drawn = q.sample(16)
        assert (drawn.fields["obs"][:, 0, 1].astype(int) % stride == 0).all()
    store.close()


def test_view_locates_ids_as_the_reader_does(tmp_path):
    """``view`` locates ids in one compiled call: every visible transition start comes back as
    ``store.transitions`` gives it, in the order asked (repeats too); an id of an evicted segment,
    past the committed rows, of a segment never made or negative raises ``KeyError``."""
    s = mmreplay.create_store(tmp_path / "s", SCHEMA, capacity=40, segment_records=8)
    rng = np.random.default_rng(0)
    with s.writer(lanes=2) as w:
        for t in range(60):
            w.add(obs=np.array([[0, t], [1, t]], np.float32), action=np.zeros(2, np.int64),
                  reward=np.ones(2, np.float32), terminated=rng.random(2) < 0.1, truncated=np.zeros(2, bool))
    s.refresh()
    u = mmreplay.UniformSampler(s, seed=0)
    ids = s.transition_ids()
    assert ids.min() >= 8 * 4  # the oldest segments were evicted
    pick = rng.choice(ids, 200)
    got, want = u.view(pick), s.transitions(pick)
    np.testing.assert_array_equal(got.ids, pick)
    for name in ("obs", "next_obs", "action", "reward", "terminated", "truncated"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    snap = s.reader.snapshot
    past = int(snap.segment_ids[-1]) * 8 + int(snap.committed[-1])  # the newest segment's first unwritten slot
    for bad in (0, int(ids.min()) - 8, past, (int(snap.segment_ids[-1]) + 5) * 8, -3):
        with pytest.raises(KeyError, match="not visible"):
            u.view(np.array([int(ids[0]), bad]))
    ends = [int(i) for i in ids if s.rows("terminated", [i])[0]]  # a done row's next row is its episode's final one
    with pytest.raises(KeyError, match="complete window"):
        u.view(np.array([int(ids[0]), ends[0] + 2]))
    with pytest.raises(ValueError, match="1-D"):
        u.view(pick.reshape(2, 100))
    assert len(u.view(np.zeros(0, np.int64))) == 0
    s.close()
