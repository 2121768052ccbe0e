"""TD3+BC (Fujimoto & Gu 2021, "A Minimalist Approach to Offline Reinforcement Learning"), offline,
Box actions, with CORL's ``td3_bc.py`` settings (:class:`mmreplay.train.algos.base.BoxConfig`).

Twin critics and a deterministic ``tanh`` actor; target policy smoothing (noise 0.2 clipped at 0.5);
the actor and the targets updated every ``policy_freq`` = 2 critic updates, Polyak ``tau`` = 0.005;
actor loss ``-lambda * Q1(s, pi(s)) + (pi(s) - a)^2`` with ``lambda = alpha / mean|Q1|``
(``td3bc_alpha`` = 2.5). The networks are ``mmreplay.agent.continuous``'s, trained by
``mmreplay.train.box_learner.BoxLearner``; the evaluation policy is the actor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .base import Algorithm, BoxConfig

if TYPE_CHECKING:
    import torch

    from ..settings import LearnerSetup

    from ..box_learner import BoxAlgorithm, BoxLearner


@dataclass(frozen=True, slots=True)
class TD3BCConfig(BoxConfig):
    """TD3+BC's settings: CORL's (:class:`BoxConfig`) and its own."""

    name: ClassVar[str] = "td3bc"

    policy_noise: float = 0.2
    """Standard deviation of the target policy's smoothing noise (unit actions in [-1, 1])."""
    noise_clip: float = 0.5
    """The smoothing noise is clipped to [-noise_clip, noise_clip]."""
    policy_freq: int = 2
    """Critic updates per actor (and target) update."""
    td3bc_alpha: float = 2.5
    """The actor loss is ``-lambda Q + (pi - a)^2`` with ``lambda = td3bc_alpha / mean|Q|``."""

    def validate(self) -> None:
        BoxConfig.validate(self)
        if self.policy_freq < 1:
            raise ValueError(f"`policy_freq` must be >= 1, got {self.policy_freq}")
        for name in ("policy_noise", "noise_clip", "td3bc_alpha"):
            if getattr(self, name) < 0:
                raise ValueError(f"`{name}` must be >= 0, got {getattr(self, name)}")


def build(ln: BoxLearner) -> None:
    """Twin critics with a target, and a target actor."""
    from ...agent.continuous import TwinCritic

    ln.add_network("critic", TwinCritic(ln.obs_dim, ln.act_dim, ln.algo.hidden))
    ln.add_target("critic")
    ln.add_target("actor")


# -- ALGO LOGIC -----------------------------------------------------------------------------------
def step(ln: BoxLearner, x: Any, x2: Any, a: Any, r: Any, disc: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A critic step every update; the actor and the targets every ``policy_freq`` updates."""
    import torch
    from torch.nn import functional as F

    algo = ln.algo
    with torch.no_grad():  # target policy smoothing (unit actions: max_action = 1)
        noise = (torch.randn_like(a) * algo.policy_noise).clamp_(-algo.noise_clip, algo.noise_clip)
        next_a = (ln.actor_target.forward_normalized(x2) + noise).clamp_(-1.0, 1.0)
        y = torch.addcmul(r, disc, ln.critic_target(x2, next_a).min(0).values)
    q = ln.critic(x, a)
    loss = F.mse_loss(q, y.expand(2, -1)) * 2  # the sum of both critics' MSE
    ln.optimize(ln.critic_opt, loss, ln.critic)
    if (ln.updates + 1) % algo.policy_freq == 0:
        pi = ln.actor.forward_normalized(x)
        q_pi = ln.critic.q1(x, pi)
        lmbda = algo.td3bc_alpha / q_pi.abs().mean().detach()
        actor_loss = -lmbda * q_pi.mean() + F.mse_loss(pi, a)
        ln.optimize(ln.actor_opt, actor_loss, ln.actor, inputs=ln.actor_params)
        ln.soft_update()
    return loss, q[0]


def phase(ln: BoxLearner) -> bool:
    """Whether the next update steps the actor (one captured graph each way)."""
    return (ln.updates + 1) % ln.algo.policy_freq == 0


def box_algorithm(algo: TD3BCConfig) -> BoxAlgorithm:
    """What :class:`mmreplay.train.box_learner.BoxLearner` runs for TD3+BC."""
    from ..box_learner import BoxAlgorithm

    return BoxAlgorithm(step, build=build, phase=phase)


def _learner(setup: LearnerSetup) -> BoxLearner:
    from ..box_learner import box_learner

    return box_learner(setup, box_algorithm(setup.cfg.algo))


ALGORITHM = Algorithm("td3bc", TD3BCConfig, {"box": _learner}, summary="TD3+BC, offline (Box actions)")
