"""train: the DQN / offline-RL trainer — config, learner, loops, run directory, checkpoints, metrics.

Modules: ``config`` (TrainConfig, presets, validation, run-dir naming, ``box_actions``: whether an
offline store or archive holds Box actions, so CORL's preset fits it; no torch, so the CLI checks a
config before torch loads), ``learner`` (Learner: the Q network, its target, one step
of DQN / CQL / BC), ``continuous`` (TD3+BC, IQL and BC for Box actions: ContinuousLearner),
``loops`` (``train`` and the synchronous, actor and offline loops), ``run`` (Run: the run
directory, counters, sampler, evaluation, checkpoints on schedule; TrainResult), ``batches``
(Batches: the learner's batch source; ``pick_device``, ``to_tensors``), ``stores`` (the run's store:
opening or creating it, its provenance record, the eval env's fit), ``checkpoint``
(weights-only checkpoint files), ``runlog`` (metrics CSV / TensorBoard, ``plot_run``), ``graphs``
(GraphedUpdate: a learner's update captured as a CUDA graph and replayed, ``--cuda-graphs``),
``stats`` (UpdateStats: the learners' loss and Q accumulators, read without a sync per update).

Floors, lowest first (no import circle, type-only imports counted): config < checkpoint, runlog,
batches, stores, learner, continuous < run < loops; graphs (no import of this room) < stats <
learner, continuous.

The config names load eagerly; the torch-backed ones (``train``, ``Learner``, ...) on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .config import (
    TrainConfig,
    atari_config,
    box_actions,
    config_for,
    continuous_config,
    default_run_dir,
    linear_schedule,
    minatar_config,
    resume_config,
    target_update_interval_of,
    validate_config,
)

_LAZY = {"ContinuousLearner": "continuous", "Learner": "learner", "train": "loops", "train_online": "loops",
         "train_actors": "loops", "train_offline": "loops", "Run": "run", "TrainResult": "run",
         "Batches": "batches", "to_tensors": "batches", "pick_device": "batches",
         "replay_segment_records": "stores", "read_metrics": "runlog", "plot_run": "runlog",
         "save_checkpoint": "checkpoint", "load_checkpoint": "checkpoint"}
__all__ = [  # noqa: PLE0604
    "Batches", "ContinuousLearner", "Learner", "Run", "TrainConfig", "TrainResult", "atari_config", "box_actions",
    "config_for", "continuous_config", "default_run_dir", "linear_schedule", "load_checkpoint", "minatar_config",
    "pick_device",
    "plot_run", "read_metrics", "replay_segment_records", "resume_config", "save_checkpoint",
    "target_update_interval_of", "to_tensors", "train", "train_actors", "train_offline", "train_online",
    "validate_config",
]


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{mod}", __name__), name)
