"""Behaviour cloning, offline: learn to take the data's actions. One name, two implementations,
picked by the store's actions:

* discrete actions: cross-entropy of the Q network's logits against the data's actions (DQN's
  network and ``mmreplay.train.q_learner.QLearner``, no target network); the evaluation policy is
  greedy in the logits;
* Box actions: the deterministic actor regressed on the data's actions (mean squared error, unit
  actions), with CORL's ``any_percent_bc.py`` settings (the ``box`` preset: batch 256, lr 3e-4, no
  gradient clipping); ``mmreplay.train.box_learner.BoxLearner``, the actor is the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .base import Algorithm
from .dqn import QNetworkConfig

if TYPE_CHECKING:
    import torch

    from ..settings import LearnerSetup

    from ..box_learner import BoxAlgorithm, BoxLearner
    from ..q_learner import QLearner


@dataclass(frozen=True, slots=True)
class BCConfig(QNetworkConfig):
    """Behaviour cloning's settings (discrete actions: a Q network's, whose logits are trained)."""

    name: ClassVar[str] = "bc"
    PRESETS: ClassVar = {"box": dict(learning_rate=3e-4, batch_size=256, max_grad_norm=0.0)}

    normalize_obs: bool = True
    """Box actions: normalize observations with the dataset's mean and std (``mmreplay.field_stats``,
    over the transitions' observations, plus 1e-3)."""


# -- ALGO LOGIC -----------------------------------------------------------------------------------
def discrete_loss(ln: QLearner, b: Any) -> tuple[torch.Tensor, torch.Tensor, None]:
    """Cross-entropy of the logits (the Q network's outputs) against the data's actions."""
    from torch.nn import functional as F

    action = b.action.long().view(-1, 1)
    logits = ln.q_fwd(b.obs).float()
    return F.cross_entropy(logits, action.squeeze(1)), logits.gather(1, action).squeeze(1), None


def box_step(ln: BoxLearner, x: Any, x2: Any, a: Any, r: Any, disc: Any) -> tuple[torch.Tensor, None]:
    """The actor regressed on the data's unit actions."""
    from torch.nn import functional as F

    loss = F.mse_loss(ln.actor.forward_normalized(x), a)
    ln.optimize(ln.actor_opt, loss, ln.actor)
    return loss, None


def _discrete(setup: LearnerSetup) -> QLearner:
    from ..q_learner import QLearner

    return QLearner.for_setup(setup, discrete_loss, target=False)


def box_algorithm(algo: BCConfig) -> BoxAlgorithm:
    """What :class:`mmreplay.train.box_learner.BoxLearner` runs for behaviour cloning of Box actions."""
    from ..box_learner import BoxAlgorithm

    return BoxAlgorithm(box_step)


def _box(setup: LearnerSetup) -> BoxLearner:
    from ..box_learner import box_learner

    return box_learner(setup, box_algorithm(setup.cfg.algo))


ALGORITHM = Algorithm("bc", BCConfig, {"discrete": _discrete, "box": _box},
                      summary="behaviour cloning, offline (discrete or Box actions)")
