"""agent: Q networks, policy files, environments and evaluation.

Modules: ``policy`` (QNetwork, FrameStack, save_policy / load_policy: weights-only torch
files), ``continuous`` (the actor, critics and value network for Box actions, ContinuousPolicy), ``envs`` (EnvSpec: the one description of an env, its wrappers
and autoreset mode; ``check_env_id``: an unknown id fails with gymnasium's "did you mean" before
anything is made; gymnasium env and vector-env construction, Atari preprocessing, obs
flattening; no torch), ``evaluation`` (greedy evaluation episodes).

Torch loads only when a name of ``policy`` is first used: ``mmreplay.agent.envs`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_POLICY = ("FrameStack", "Policy", "QNetwork", "epsilon_greedy", "load_policy", "network_spec", "save_policy")
_CONTINUOUS = ("Actor", "ContinuousPolicy", "TwinCritic", "ValueNetwork", "actor_spec", "is_continuous")
_ENVS = ("EnvSpec", "check_env_id")
__all__ = sorted(_POLICY + _CONTINUOUS + _ENVS)


def __getattr__(name: str) -> Any:
    if name in _POLICY:
        return getattr(importlib.import_module(".policy", __name__), name)
    if name in _ENVS:
        return getattr(importlib.import_module(".envs", __name__), name)
    if name in _CONTINUOUS:
        return getattr(importlib.import_module(".continuous", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
