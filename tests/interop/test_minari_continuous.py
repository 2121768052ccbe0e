"""Minari import of a continuous-action (MuJoCo-shaped) dataset: the Box keeps its bounds, the
store's actions are the dataset's, and offline TD3+BC reads the bounds from the import's metadata."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import mmreplay


@pytest.fixture
def minari_home(tmp_path, monkeypatch):
    pytest.importorskip("minari")
    pytest.importorskip("h5py")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    return tmp_path / "minari"


@pytest.mark.filterwarnings("ignore::UserWarning")  # the source dataset has no env
def test_minari_box_dataset_keeps_its_bounds_and_trains(tmp_path, minari_home, caplog):
    import gymnasium as gym
    import minari
    from minari.data_collector import EpisodeBuffer

    from mmreplay.interop.minari import import_minari

    rng = np.random.default_rng(0)
    obs_space = gym.spaces.Box(-np.inf, np.inf, (11,), np.float64)  # Hopper's shapes, actions in [-0.5, 2]
    act_space = gym.spaces.Box(np.array([-0.5, -0.5, -0.5], np.float32), np.array([2, 2, 2], np.float32))
    bufs = [EpisodeBuffer(observations=rng.standard_normal((T + 1, 11)),
                          actions=rng.uniform(-0.5, 2, (T, 3)).astype(np.float32), rewards=rng.standard_normal(T),
                          terminations=np.eye(T, dtype=bool)[-1] if i % 2 else np.zeros(T, bool),
                          truncations=np.zeros(T, bool) if i % 2 else np.eye(T, dtype=bool)[-1])
            for i, T in enumerate((40, 25, 60))]
    minari.create_dataset_from_buffers("mmreplay/hopperish/box-v0", bufs, observation_space=obs_space,
                                       action_space=act_space, algorithm_name="test", author="t", author_email="t",
                                       code_permalink="t", description="t")
    rep = import_minari("mmreplay/hopperish/box-v0", tmp_path / "s")
    assert (rep.episodes, rep.steps) == (3, 125)
    with mmreplay.open_store(tmp_path / "s") as st:
        assert st.schema["action"].dtype == np.float32 and st.schema["action"].shape == (3,)
        assert st.schema["obs"].dtype == np.float64 and st.schema["obs"].shape == (11,)
        space = json.loads(st.metadata["minari_action_space"])
        assert space["type"] == "Box" and space["low"] == [-0.5] * 3 and space["high"] == [2.0] * 3
        ids = st.transition_ids()
        np.testing.assert_array_equal(np.sort(st.rows("action", ids), 0),
                                      np.sort(np.concatenate([b.actions for b in bufs]), 0))

    pytest.importorskip("torch")
    from mmreplay.agent import load_policy
    from mmreplay.train import continuous_config, train

    cfg = continuous_config(algo="td3bc", store=str(tmp_path / "s"), run_dir=str(tmp_path / "run"), steps=20,
                            hidden=(16,), batch_size=16, eval_episodes=0, tensorboard=False)
    with caplog.at_level(logging.INFO, logger="mmreplay"):
        res = train(cfg)
    assert not [r for r in caplog.records if "action scale" in r.getMessage()]  # the bounds are known
    pol = load_policy(res.policy_path)
    assert pol.low.tolist() == [-0.5] * 3 and pol.high.tolist() == [2.0] * 3
    a = pol.act(rng.standard_normal((64, 11)) * 100)
    assert a.min() >= -0.5 and a.max() <= 2.0
