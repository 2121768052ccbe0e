"""train: the DQN / offline-RL trainer — config, learner, loops, run directory, checkpoints, metrics.

Modules: ``config`` (TrainConfig, presets, validation, run-dir naming; no torch, so the CLI
checks a config before torch loads), ``loops`` (Learner and the synchronous, actor and
offline loops), ``continuous`` (TD3+BC, IQL and BC for Box actions: ContinuousLearner), ``_run`` (what the loops share: the run directory, batches, evaluation,
checkpoints on schedule), ``checkpoint`` (weights-only checkpoint files), ``runlog``
(metrics CSV / TensorBoard, ``plot_run``).

The config names load eagerly; the torch-backed ones (``train``, ``Learner``, ...) on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .config import (
    TrainConfig,
    atari_config,
    continuous_config,
    minatar_config,
    default_run_dir,
    linear_schedule,
    resume_config,
    target_update_interval_of,
    validate_config,
)

_LAZY = {"ContinuousLearner": "continuous", "Learner": "loops", "train": "loops", "train_online": "loops", "train_actors": "loops",
         "train_offline": "loops", "TrainResult": "_run", "to_tensors": "_run", "pick_device": "_run",
         "replay_segment_records": "_run",
         "read_metrics": "runlog", "plot_run": "runlog", "save_checkpoint": "checkpoint",
         "load_checkpoint": "checkpoint"}
__all__ = [  # noqa: PLE0604
    "ContinuousLearner", "Learner", "continuous_config", "TrainConfig", "TrainResult", "atari_config", "default_run_dir", "minatar_config", "linear_schedule", "load_checkpoint",
    "pick_device", "plot_run", "read_metrics", "replay_segment_records", "resume_config", "save_checkpoint", "target_update_interval_of",
    "to_tensors", "train", "train_actors", "train_offline", "train_online", "validate_config",
]


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{mod}", __name__), name)
