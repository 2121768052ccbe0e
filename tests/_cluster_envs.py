"""Envs for the Ray tests (Ray workers import this module: the tests put tests/ on their path)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class CounterEnv(gym.Env):
    """obs = (id of this env object, its step count, never reset): every row an env emits is
    unique, and a transition's next observation is (same id, count + 1). Episodes end (terminated)
    every 23 steps."""

    observation_space = spaces.Box(0.0, 2.0**50, (2,), np.float64)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.uid = float(np.random.default_rng().integers(1, 2**40))
        self.k = -1
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self) -> np.ndarray:
        self.k += 1
        return np.array([self.uid, self.k], np.float64)

    def step(self, action):
        self.t += 1
        return self._obs(), float(action), self.t >= 23, False, {}


def counter_env() -> CounterEnv:
    return CounterEnv()
