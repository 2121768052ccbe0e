"""Training checkpoints: everything a killed run needs to continue, in one atomically written file.

A checkpoint (``<run_dir>/checkpoint.pt``) is a policy file (``mmreplay.agent``: ``load_policy``
opens it and gets the online network) plus the training state:

* ``target`` and ``optimizer`` state dicts (tensors); ``learner``: the rest of a continuous
  learner's state (critics, targets, their optimizers, the actor's schedule), ``None`` for DQN;
* ``config_json``: the run's :class:`mmreplay.train.TrainConfig` as JSON;
* ``counters_json``: env steps, learner updates, episodes, wall time, best evaluation;
* ``rng_json`` / ``rng_torch``: the numpy generator of the acting loop and torch's CPU (and CUDA)
  generators;
* ``sampler_json``: the sampler's numpy generator, its compiled kernel's generator words and the
  prioritized sampler's step count (β annealing). Priorities themselves persist in the store
  (``PrioritizedSampler.save``), written just before the checkpoint.

Only tensors, strings and plain numbers are stored, so ``torch.load(weights_only=True)`` reads it.
The file is written temp → fsync → rename → fsync(dir): a ``kill -9`` at any moment leaves the
previous checkpoint or the new one, never a torn file. The replay data is not in it: the store is
the replay memory, and it keeps every published transition across the kill.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..agent.policy import policy_payload, read_payload, save_torch_atomic

if TYPE_CHECKING:
    from ..sampling.uniform import TransitionSampler

CHECKPOINT_NAME = "checkpoint.pt"


def save_checkpoint(
    path: str | os.PathLike[str],
    *,
    q: torch.nn.Module,
    target: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    config: dict[str, Any],
    counters: dict[str, Any],
    rng: np.random.Generator | None,
    sampler: TransitionSampler | None,
    meta: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> None:
    """Write a checkpoint atomically (see the module docstring). ``meta``: the policy file's metadata
    (``epsilon``: the acting loop's current ε, if any). ``extra``: more learner state (the continuous
    learners' critics, targets, optimizers and schedule), stored as ``learner``."""
    payload = policy_payload(q, step=int(counters.get("env_steps") or counters["updates"]), **meta)
    payload.update({
        "kind": "checkpoint",
        "target": None if target is None else {k: v.detach().cpu() for k, v in target.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "config_json": json.dumps(config),
        "counters_json": json.dumps(counters),
        "rng_json": json.dumps(None if rng is None else rng.bit_generator.state),
        "rng_torch": torch.get_rng_state(),
        "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "sampler_json": json.dumps(None if sampler is None else sampler.random_state()),
        "learner": extra,
    })
    save_torch_atomic(path, payload)


def load_checkpoint(path: str | os.PathLike[str], device: Any = "cpu") -> dict[str, Any]:
    """Read a checkpoint; JSON parts come back decoded (``config``, ``counters``, ``rng``,
    ``sampler``, ``meta``, ``spec``)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no checkpoint at {p} (nothing to resume)")
    payload = read_payload(p, device)
    if payload.get("kind") != "checkpoint":
        raise ValueError(f"{p} is a policy file, not a training checkpoint")
    for key in ("config", "counters", "rng", "sampler", "meta", "spec"):
        payload[key] = json.loads(payload.pop(f"{key}_json"))
    return payload


def restore_torch_rng(payload: dict[str, Any]) -> None:
    torch.set_rng_state(payload["rng_torch"].cpu())
    if payload.get("rng_cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in payload["rng_cuda"]])
