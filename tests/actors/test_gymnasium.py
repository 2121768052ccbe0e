"""The plain gymnasium vector-env loop (next-step autoreset) stores exactly what the env emitted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

import mmreplay

ROOT = Path(__file__).resolve().parents[2]


def test_vector_env_loop_stores_every_emitted_transition(tmp_path):
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=15)] * 3,
                                    autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    schema = mmreplay.Schema.from_spaces(envs.single_observation_space, envs.single_action_space)
    store = mmreplay.create_store(tmp_path / "s", schema, segment_records=64)
    obs, _ = envs.reset(seed=3)
    envs.action_space.seed(3)  # reproducible: this seed's episodes end both ways
    expected = set()  # (obs bytes, action, next_obs bytes, terminated, truncated) the env emitted
    prev_done = np.zeros(3, bool)
    with store.writer(lanes=3, cast="safe") as w:
        for _ in range(120):
            action = envs.action_space.sample()
            next_obs, reward, term, trunc, _ = envs.step(action)
            w.add(obs=obs, action=action, reward=reward, terminated=term, truncated=trunc)
            for lane in range(3):
                if not prev_done[lane]:  # the step after a done is the autoreset step: no transition
                    expected.add((obs[lane].tobytes(), int(action[lane]), next_obs[lane].tobytes(),
                                  bool(term[lane]), bool(trunc[lane])))
            prev_done = term | trunc
            obs = next_obs
        w.close(last_obs=obs)
    b = store.transitions(store.transition_ids())
    got = {(o.tobytes(), int(a), n.tobytes(), bool(t), bool(u))
           for o, a, n, t, u in zip(b.obs, b.action, b.next_obs, b.terminated, b.truncated)}
    assert got == expected
    assert b.truncated.any() and b.terminated.any()  # both kinds of episode end were exercised
    store.close()


def test_extra_fields_come_back_in_batches(tmp_path):
    schema = mmreplay.Schema.transition((2,), extra=[mmreplay.Field("info/lives", np.int8)])
    store = mmreplay.create_store(tmp_path / "s", schema)
    with store.writer(lanes=2) as w:
        for t in range(4):
            w.add(obs=np.full((2, 2), t, np.float32), action=np.zeros(2, np.int64), reward=np.zeros(2, np.float32),
                  terminated=np.zeros(2, bool), truncated=np.zeros(2, bool), **{"info/lives": np.array([t, -t], np.int8)})
    b = mmreplay.UniformSampler(store, seed=0).sample(32)
    assert set(b.extra) == {"info/lives"}
    lane = b.ids % 2  # rows are laid out (time, lane)
    np.testing.assert_array_equal(np.where(lane == 0, 1, -1) * b.obs[:, 0].astype(np.int8), b.extra["info/lives"])
    store.close()


def test_quickstart_example_runs(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py"), str(tmp_path / "qs"), "--steps", "300"],
                         capture_output=True, text=True, check=True)
    assert "sampled 256 transitions" in out.stdout and "reopened in a new process" in out.stdout
