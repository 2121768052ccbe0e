"""Small picklable envs for collect tests (spawned workers import them from this module)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

EMITTED: list[tuple] = []  # (obs, action, reward, next_obs, terminated, truncated) of every step, in-process runs
LAST: dict[int, int] = {}  # recorder -> index in EMITTED of its last step


def emitted_as_stored() -> list[tuple]:
    """EMITTED as a collect stores it: the last step of each env, if its episode was still running
    when the run ended, is marked truncated (the run cut it)."""
    out = list(EMITTED)
    for i in LAST.values():
        o, a, r, n, term, trunc = out[i]
        out[i] = (o, a, r, n, term, trunc or not term)
    return out


def _key(x):
    if isinstance(x, dict):
        return tuple((k, _key(v)) for k, v in sorted(x.items()))
    return np.asarray(x).tobytes()


class Recorder(gym.Wrapper):
    """Records every transition the wrapped env emits into ``EMITTED``."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._obs = obs
        return obs, info

    def step(self, action):
        obs, reward, term, trunc, info = self.env.step(action)
        EMITTED.append((_key(self._obs), int(action), float(reward), _key(obs), bool(term), bool(trunc)))
        LAST[id(self)] = len(EMITTED) - 1
        self._obs = obs
        return obs, reward, term, trunc, info


def recorded_cartpole():
    return Recorder(gym.make("CartPole-v1", max_episode_steps=15))


class DictEnv(gym.Env):
    """A Dict-observation env: a position (Box) and a step counter (Discrete); ends at 0 or 9."""

    observation_space = spaces.Dict({"pos": spaces.Box(-10, 10, (2,), np.float32), "t": spaces.Discrete(100)})
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = int(self.np_random.integers(3, 7))
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return {"pos": np.array([self.x, -self.x], np.float32), "t": self.t}

    def step(self, action):
        self.x += 1 if action else -1
        self.t += 1
        term = self.x in (0, 9)
        return self._obs(), float(self.x), term, self.t >= 12 and not term, {}


def recorded_dict_env():
    return Recorder(DictEnv())


class CrashingEnv(gym.Env):
    """CartPole-like toy that raises after 300 steps when it was seeded with an odd seed."""

    observation_space = spaces.Box(-1, 1, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.odd = seed % 2 == 1
            self.n = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.n += 1
        if self.odd and self.n > 300:
            raise RuntimeError("simulated env crash")
        return np.full(3, (self.n % 10) / 10, np.float32), 1.0, self.n % 25 == 0, False, {}


def thread_probe_cartpole():
    """CartPole that writes the torch intra-op thread count of the process making it to the file
    named by ``MMREPLAY_TEST_THREADS_FILE``."""
    import os

    import torch

    with open(os.environ["MMREPLAY_TEST_THREADS_FILE"], "w") as f:
        f.write(str(torch.get_num_threads()))
    return gym.make("CartPole-v1")


class NaNEnv(gym.Env):
    """A toy whose observations turn NaN after 20 steps: the store refuses them in the worker
    (``InvalidValueError``)."""

    observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.n += 1
        return np.full(3, np.nan if self.n > 20 else 0.5, np.float32), 1.0, False, False, {}
