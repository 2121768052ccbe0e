"""``UniformSampler.draw_starts``: the starts ``sample`` would return, drawn without gathering."""

from __future__ import annotations

import numpy as np
import pytest

import mmreplay


def _store(tmp_path):
    schema = mmreplay.Schema.transition(obs_shape=(4, 4), obs_dtype=np.uint8)
    s = mmreplay.create_store(tmp_path / "s", schema, segment_records=16, capacity=100_000)
    rng = np.random.default_rng(0)
    with s.writer(lanes=3) as w:
        for t in range(200):
            kind = rng.choice([0] * 8 + [1, 2], size=3)
            w.add(obs=np.full((3, 4, 4), t % 256, np.uint8), action=np.zeros(3, np.int64),
                  reward=rng.normal(size=3).astype(np.float32), terminated=kind == 1, truncated=kind == 2)
    return s


@pytest.mark.parametrize("n_step,frame_stack", [(1, 4), (3, 4), (3, 1)])
def test_draw_starts_are_the_ids_sample_returns_with_the_same_seed(tmp_path, n_step, frame_stack):
    s = _store(tmp_path)
    a = mmreplay.UniformSampler(s, frame_stack=frame_stack, n_step=n_step, seed=5)
    b = mmreplay.UniformSampler(s, frame_stack=frame_stack, n_step=n_step, seed=5)
    for size in (1, 7, 64, 300):  # the streams stay together batch after batch
        np.testing.assert_array_equal(a.sample(size).ids, b.draw_starts(size))
    s.close()


def test_draw_starts_refuses_one_step_views_and_windowed_mode(tmp_path):
    s = _store(tmp_path)
    with pytest.raises(ValueError, match="frame_stack > 1 or n_step > 1"):
        mmreplay.UniformSampler(s, seed=0).draw_starts(4)
    with pytest.raises(ValueError, match="mode='exact'"):
        mmreplay.UniformSampler(s, frame_stack=4, mode="windowed", cache_bytes=1 << 20, seed=0).draw_starts(4)
    s.close()
