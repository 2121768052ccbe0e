"""train: the DQN / offline-RL trainer — config, algorithms, learners, loops, run directory,
checkpoints, metrics.

Modules: ``settings`` (TrainConfig and its groups, LearnerSetup: plain dataclasses), ``config``
(the presets per env family with ``config_for``, the flat and nested layouts, validation, run-dir
naming, ``box_actions``: whether an offline store or archive holds Box actions; no torch, so the CLI
checks a config before torch loads), ``algos`` (one module per algorithm: its
config, presets, loss or step, action kinds; and the registry), ``q_learner`` (QLearner: the Q
network, its target and one step of a discrete algorithm's loss), ``box_learner`` (BoxLearner: the
actor, the networks a Box algorithm adds, observation and action scaling, one step of its update),
``loops`` (``train`` and the synchronous, actor and offline loops), ``run`` (Run: the run
directory, counters, sampler, evaluation, checkpoints on schedule; TrainResult), ``batches``
(Batches: the learner's batch source; ``pick_device``, ``to_tensors``), ``stores`` (the run's store:
opening or creating it, its provenance record, the eval env's fit), ``checkpoint``
(weights-only checkpoint files), ``runlog`` (metrics CSV / TensorBoard, ``plot_run``), ``graphs``
(GraphedUpdate: a learner's update captured as a CUDA graph and replayed, ``--cuda-graphs``),
``stats`` (UpdateStats: the learners' loss and Q accumulators, read without a sync per update).

Floors, lowest first (no import circle, type-only imports counted): algos.base < settings <
q_learner, box_learner < the algorithms' modules < algos (the registry) < config < checkpoint,
runlog, batches, stores < run < loops; graphs (no import of this room) < stats < q_learner,
box_learner.

The config names load eagerly; the torch-backed ones (``train``, ``QLearner``, ...) on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .algos import FAMILIES
from .algos import get as get_algorithm
from .algos import names as algorithm_names
from .algos import register as register_algorithm
from .config import (
    DEFAULT_ALGO,
    GROUPS as SETTING_GROUPS,
    TrainConfig,
    atari_config,
    box_actions,
    config_for,
    continuous_config,
    default_run_dir,
    field_help,
    from_dict,
    from_flat,
    linear_schedule,
    minatar_config,
    resume_config,
    validate_config,
    with_settings,
)

_LAZY = {"BoxLearner": "box_learner", "QLearner": "q_learner", "train": "loops", "train_online": "loops",
         "train_actors": "loops", "train_offline": "loops", "Run": "run", "TrainResult": "run",
         "Batches": "batches", "to_tensors": "batches", "pick_device": "batches",
         "replay_segment_records": "stores", "read_metrics": "runlog", "plot_run": "runlog",
         "save_checkpoint": "checkpoint", "load_checkpoint": "checkpoint"}
__all__ = [  # noqa: PLE0604
    "DEFAULT_ALGO", "FAMILIES", "SETTING_GROUPS", "Batches", "BoxLearner", "QLearner", "Run", "TrainConfig",
    "TrainResult", "algorithm_names", "atari_config", "field_help",
    "box_actions", "config_for", "continuous_config", "default_run_dir", "from_dict", "from_flat",
    "get_algorithm", "linear_schedule", "load_checkpoint", "minatar_config", "pick_device", "plot_run",
    "read_metrics", "register_algorithm", "replay_segment_records", "resume_config", "save_checkpoint",
    "to_tensors", "train", "train_actors", "train_offline", "train_online", "validate_config", "with_settings",
]


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{mod}", __name__), name)
