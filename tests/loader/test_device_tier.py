"""DeviceTier on the CPU: batch for batch the host path's batches with the same seed (the CUDA
run is benchmarks/gpu_check.py's "device tier" row)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmreplay
from mmreplay.loader import tensor_batch
from mmreplay.loader.device_tier import DeviceTier

LANES = 3


def _steps(w, rng, t0, steps):
    for t in range(t0, t0 + steps):
        kind = rng.choice([0] * 10 + [1, 2], size=LANES)  # episodes of different lengths, both endings
        obs = rng.integers(0, 256, (LANES, 6, 6), dtype=np.uint8)
        obs[:, 0, 0], obs[:, 0, 1] = np.arange(LANES), t % 256
        w.add(obs=obs, action=rng.integers(0, 6, LANES), reward=rng.normal(size=LANES).astype(np.float32),
              terminated=kind == 1, truncated=kind == 2)


def _filled(path, seed, steps):
    """A store of 6x6 uint8 frames with ``steps`` steps of LANES lanes (closed, no final observations)."""
    s = mmreplay.create_store(path, mmreplay.Schema.transition(obs_shape=(6, 6), obs_dtype=np.uint8),
                              segment_records=16)
    with s.writer(lanes=LANES) as w:
        _steps(w, np.random.default_rng(seed), 0, steps)
    return s


def _same(got, want):
    for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "discount"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), name
    np.testing.assert_array_equal(got.ids, want.ids)
    assert got.weights is None and set(got.extra) == set(want.extra)


@pytest.mark.parametrize("n_step,lane_segments", [(1, False), (3, False), (3, True)])
def test_batches_equal_the_host_path_with_the_same_seed_as_rows_arrive(tmp_path, n_step, lane_segments):
    schema = mmreplay.Schema.transition(obs_shape=(6, 6), obs_dtype=np.uint8)
    s = mmreplay.create_store(tmp_path / "s", schema, segment_records=16, capacity=100_000)
    rng = np.random.default_rng(1)
    host = mmreplay.UniformSampler(s, frame_stack=4, n_step=n_step, gamma=0.9, seed=3)
    tier = DeviceTier(mmreplay.UniformSampler(s, frame_stack=4, n_step=n_step, gamma=0.9, seed=3), "cpu")
    with s.writer(lanes=LANES, lane_segments=lane_segments) as first:  # an earlier session: stacks never reach it
        _steps(first, rng, 0, 12)
    w = s.writer(lanes=LANES, lane_segments=lane_segments)
    t = 0
    for grow in (60, 40, 25):  # rows committed between batches: the mirror appends them
        _steps(w, rng, t, grow)
        t += grow
        w.flush()
        for size in (1, 32, 257):
            _same(tier.sample(size), tensor_batch(host.sample(size), "cpu"))
        assert tier.rows_copied == s.reader.snapshot.total_rows  # each committed row copied once
    w.close(last_obs=np.zeros((LANES, 6, 6), np.uint8))  # the episodes' final observations
    for _ in range(3):
        _same(tier.sample(64), tensor_batch(host.sample(64), "cpu"))
    clamped = tier.sample(512).obs  # some stacks are clamped at an episode start (a frame repeated)
    assert (clamped[:, 0] == clamped[:, 1]).flatten(1).all(1).any()
    s.close()


def test_frame_stack_one_and_float_dtype(tmp_path):
    s = _filled(tmp_path / "s", 2, 80)
    host = mmreplay.UniformSampler(s, n_step=4, seed=0)
    tier = DeviceTier(mmreplay.UniformSampler(s, n_step=4, seed=0), "cpu", float_dtype=torch.float16)
    got, want = tier.sample(50), tensor_batch(host.sample(50), "cpu", float_dtype=torch.float16)
    assert got.obs.shape == (50, 6, 6)
    _same(got, want)
    s.close()


def test_refusals(tmp_path):
    s = _filled(tmp_path / "s", 0, 40)
    with pytest.raises(ValueError, match="UniformSampler, got PrioritizedSampler"):
        DeviceTier(mmreplay.PrioritizedSampler(s, frame_stack=4, seed=0), "cpu")
    with pytest.raises(ValueError, match="UniformSampler, got SequenceSampler"):
        DeviceTier(mmreplay.SequenceSampler(s, 4, seed=0), "cpu")
    with pytest.raises(ValueError, match="mode='exact'"):
        DeviceTier(mmreplay.UniformSampler(s, frame_stack=4, mode="windowed", cache_bytes=1 << 20), "cpu")
    with pytest.raises(ValueError, match="prefetch_batches"):
        DeviceTier(mmreplay.UniformSampler(s, frame_stack=4, prefetch_batches=2), "cpu")
    with pytest.raises(ValueError, match="frame_stack > 1 or n_step > 1"):
        DeviceTier(mmreplay.UniformSampler(s), "cpu")
    with pytest.raises(ValueError, match="over `budget_bytes`=640"):  # the store does not fit: refused at once
        DeviceTier(mmreplay.UniformSampler(s, frame_stack=4, seed=0), "cpu", budget_bytes=640)
    row_bytes = DeviceTier(mmreplay.UniformSampler(s, frame_stack=4), "cpu").row_bytes
    fits = len(s.reader.segment_table()) * 16 * row_bytes  # a block for each segment now, no more
    tier = DeviceTier(mmreplay.UniformSampler(s, frame_stack=4, seed=0), "cpu", budget_bytes=fits)
    tier.sample(8)
    with s.writer(lanes=LANES) as w:  # the store outgrows the budget as it is written
        _steps(w, np.random.default_rng(0), 0, 40)
    with pytest.raises(ValueError, match="budget_bytes"):
        tier.sample(8)
    s.close()


def test_segments_evicted_meanwhile_give_their_blocks_to_new_ones(tmp_path):
    schema = mmreplay.Schema.transition(obs_shape=(6, 6), obs_dtype=np.uint8)
    s = mmreplay.create_store(tmp_path / "s", schema, segment_records=16, capacity=96)
    rng = np.random.default_rng(4)
    host = mmreplay.UniformSampler(s, frame_stack=4, n_step=3, seed=7)
    tier = DeviceTier(mmreplay.UniformSampler(s, frame_stack=4, n_step=3, seed=7), "cpu", budget_bytes=1 << 30)
    w = s.writer(lanes=LANES)
    for i in range(8):  # 8 x 30 rows through a store of 96: the oldest segments leave
        _steps(w, rng, 10 * i, 10)
        w.flush()
        _same(tier.sample(64), tensor_batch(host.sample(64), "cpu"))
    assert tier.rows_copied > s.reader.snapshot.total_rows  # rows of evicted segments were mirrored too
    assert tier.nbytes == (96 // 16 + 4) * 16 * tier.row_bytes  # allocated for the capacity once, blocks reused
    w.close()
    s.close()


def test_dict_observations_and_extra_fields(tmp_path):
    import gymnasium as gym

    space = gym.spaces.Dict({"img": gym.spaces.Box(0, 255, (5, 5), np.uint8), "pos": gym.spaces.Box(-1, 1, (2,))})
    schema = mmreplay.Schema.from_spaces(space, gym.spaces.Discrete(3), extra=[mmreplay.Field("q", np.float32, (2,))])
    s = mmreplay.create_store(tmp_path / "s", schema, segment_records=16)
    rng = np.random.default_rng(5)
    with s.writer(lanes=2) as w:
        for t in range(60):
            end = rng.random(2) < 0.1
            w.add(**{"obs/img": rng.integers(0, 256, (2, 5, 5), dtype=np.uint8),
                     "obs/pos": rng.random((2, 2), np.float32), "action": rng.integers(0, 3, 2),
                     "reward": rng.random(2), "terminated": end, "truncated": np.zeros(2, bool),
                     "q": rng.random((2, 2), np.float32)})
    host = mmreplay.UniformSampler(s, frame_stack=2, n_step=2, seed=1)
    with DeviceTier(mmreplay.UniformSampler(s, frame_stack=2, n_step=2, seed=1), "cpu") as tier:
        for _ in range(3):
            got, want = tier.sample(40), tensor_batch(host.sample(40), "cpu")
            assert set(got.obs) == {"img", "pos"} and set(got.extra) == {"q"}
            for k in ("img", "pos"):
                assert torch.equal(got.obs[k], want.obs[k]) and torch.equal(got.next_obs[k], want.next_obs[k])
            assert torch.equal(got.extra["q"], want.extra["q"])
            assert torch.equal(got.reward, want.reward) and torch.equal(got.discount, want.discount)
    assert tier.nbytes == 0  # closed: the mirror is freed
    s.close()


@pytest.mark.parametrize("n_step", [1, 3])
def test_a_masked_final_observation_batches_equal_the_host_path(tmp_path, n_step):
    """A damaged (masked) final observation after a terminated or truncated step: the host serves the next
    episode's stacks (``sampling.window_kernels.stack_rows``), and the tier's stack links clamp at the masked
    row as at any final observation: the same batches, none holding its zeroed frame."""
    from mmreplay.testing.damage import served_ids

    path = tmp_path / "s"
    _filled(path, 6, 80).close()
    s = mmreplay.open_store(path)
    ids = served_ids(s)
    obs = s.rows("obs", ids)
    done = s.rows("terminated", ids) | s.rows("truncated", ids)
    row = {(int(o[0, 0]), int(o[0, 1])): (int(i), bool(d)) for i, o, d in zip(ids, obs, done)}
    lane, t = next((ln, t) for (ln, t) in sorted(row) if 10 <= t < 70 and row[ln, t - 1][1]
                   and not row[ln, t - 2][1] and not row[ln, t][1])  # a final observation after an ordinary step
    victim, first = row[lane, t][0], row[lane, t + 1][0]
    R, off, rec = s.segment_records, s.layout.column("obs").offset, s.layout.record_bytes
    s.close()
    seg = next(p for p in (path / "segments").glob("*.seg") if int(p.name[:13]) == victim // R)
    with open(seg, "r+b") as fh:
        fh.seek(off + victim % R * rec)
        fh.write(b"\xff" * 4)
    s = mmreplay.open_store(path)
    assert s.check_counts()["damaged_rows"] == 1
    host = mmreplay.UniformSampler(s, frame_stack=4, n_step=n_step, gamma=0.9, seed=3)
    tier = DeviceTier(mmreplay.UniformSampler(s, frame_stack=4, n_step=n_step, gamma=0.9, seed=3), "cpu")
    assert first in host.valid_ids()  # the next episode's first stack: clamped at its own first row
    seen = set()
    for size in (1, 64, 512, 512):
        got = tier.sample(size)
        _same(got, tensor_batch(host.sample(size), "cpu"))
        assert (got.obs.flatten(2) != 0).any(-1).all() and (got.next_obs.flatten(2) != 0).any(-1).all()
        seen.update(got.ids.tolist())
    assert first in seen and victim not in seen
    s.close()
