"""IQL (Kostrikov et al. 2021, "Offline Reinforcement Learning with Implicit Q-Learning"), offline,
Box actions, with CORL's ``iql.py`` settings (:class:`mmreplay.train.algos.base.BoxConfig`).

Twin critics; a value network fitted by expectile regression (``iql_expectile`` = 0.7) to the
target critics' minimum; critics regressed on ``r + gamma V(s')``; target critics Polyak-averaged
(``tau`` = 0.005) every update; advantage-weighted regression of a Gaussian actor
(state-independent log std; weights ``exp(beta * A)`` clipped at :data:`EXP_ADV_MAX`,
``iql_beta`` = 3) whose learning rate follows a cosine schedule from lr to 0 over the run's
``steps`` (CORL's ``CosineAnnealingLR``, in its closed form: a resumed run with more ``steps``
stretches what is left of it). The networks are ``mmreplay.agent.continuous``'s, trained by
``mmreplay.train.box_learner.BoxLearner``; the evaluation policy is the actor's mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .base import Algorithm, BoxConfig

if TYPE_CHECKING:
    import torch

    from ..settings import LearnerSetup

    from ..box_learner import BoxAlgorithm, BoxLearner

EXP_ADV_MAX = 100.0
"""The advantage weights ``exp(beta * A)`` are clipped at this."""


@dataclass(frozen=True, slots=True)
class IQLConfig(BoxConfig):
    """IQL's settings: CORL's (:class:`BoxConfig`) and its own."""

    name: ClassVar[str] = "iql"

    iql_expectile: float = 0.7
    """The expectile the value network fits to the critics (CORL's ``iql_tau``)."""
    iql_beta: float = 3.0
    """Inverse temperature of the advantage weights ``exp(beta * A)``."""
    iql_deterministic: bool = False
    """A deterministic actor (squared error weighted by ``exp(beta * A)``) instead of the Gaussian."""

    def validate(self) -> None:
        BoxConfig.validate(self)
        if not 0.0 < self.iql_expectile < 1.0:
            raise ValueError(f"`iql_expectile` must lie in (0, 1), got {self.iql_expectile}")
        if self.iql_beta <= 0:
            raise ValueError(f"`iql_beta` must be > 0, got {self.iql_beta}")


def build(ln: BoxLearner) -> None:
    """Twin critics with a target, and a value network."""
    from ...agent.continuous import TwinCritic, ValueNetwork

    ln.add_network("critic", TwinCritic(ln.obs_dim, ln.act_dim, ln.algo.hidden))
    ln.add_target("critic")
    ln.add_network("value", ValueNetwork(ln.obs_dim, ln.algo.hidden))


# -- ALGO LOGIC -----------------------------------------------------------------------------------
def step(ln: BoxLearner, x: Any, x2: Any, a: Any, r: Any, disc: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The value, critic and actor steps of one update, then the target critics and the actor's schedule."""
    import torch
    from torch.nn import functional as F

    algo = ln.algo
    with torch.no_grad():
        next_v = ln.value(x2)
        target_q = ln.critic_target(x, a).min(0).values
    adv = target_q - ln.value(x)
    v_loss = (torch.abs(algo.iql_expectile - (adv < 0).float()) * adv.pow(2)).mean()
    ln.optimize(ln.value_opt, v_loss, ln.value)
    y = torch.addcmul(r, disc, next_v)
    q = ln.critic(x, a)
    loss = F.mse_loss(q, y.expand(2, -1))  # the mean of both critics' MSE
    ln.optimize(ln.critic_opt, loss, ln.critic)
    ln.soft_update()
    exp_adv = torch.exp(algo.iql_beta * adv.detach()).clamp_(max=EXP_ADV_MAX)
    if ln.actor.log_std is not None:
        bc = -ln.actor.log_prob(x, a)
    else:
        bc = (ln.actor.forward_normalized(x) - a).pow(2).sum(1)
    ln.optimize(ln.actor_opt, (exp_adv * bc).mean(), ln.actor)
    schedule_actor_lr(ln, ln.updates + 1)
    return loss, q[0]


def schedule_actor_lr(ln: BoxLearner, updates: int) -> None:
    """CORL steps CosineAnnealingLR(T_max=steps) after each actor step; its closed form, from the
    update count (stateless: a resumed run continues the same curve)."""
    steps = ln.cfg.steps
    ln.actor_opt.param_groups[0]["lr"] = ln.algo.learning_rate * 0.5 * (
        1 + math.cos(math.pi * min(updates, steps) / max(1, steps)))


def _after_graphed_update(ln: BoxLearner) -> None:
    schedule_actor_lr(ln, ln.updates)


def box_algorithm(algo: IQLConfig) -> BoxAlgorithm:
    """What :class:`mmreplay.train.box_learner.BoxLearner` runs for IQL with ``algo``'s settings."""
    from ..box_learner import BoxAlgorithm

    return BoxAlgorithm(step, build=build, gaussian=not algo.iql_deterministic,
                        after_graphed_update=_after_graphed_update)


def _learner(setup: LearnerSetup) -> BoxLearner:
    from ..box_learner import box_learner

    return box_learner(setup, box_algorithm(setup.cfg.algo))


ALGORITHM = Algorithm("iql", IQLConfig, {"box": _learner}, summary="implicit Q-learning, offline (Box actions)")
