"""DQN (Mnih et al. 2015) with double-DQN targets (van Hasselt et al. 2016) by default: online in an
env (synchronous or with actor processes) or offline from a store; discrete actions.

Read top to bottom: the Q-learning config every Q algorithm shares (:class:`QLearningConfig`, with
its presets), DQN's own config (:class:`DQNConfig`: exploration and training rounds, the online
settings), the algorithm (``# ALGO LOGIC``: the Q values of the data's actions, the TD target and
loss), and its registry entry. The network is ``mmreplay.agent.QNetwork`` (an MLP, the Nature CNN
for Atari frames, the MinAtar network), trained by ``mmreplay.train.q_learner.QLearner``; the
evaluation policy is greedy in Q.

Presets (a config's defaults per env family): ``classic`` is RL-zoo's CartPole DQN, ``atari``
Nature DQN's, ``minatar`` the MinAtar paper's reference implementation (``examples/dqn.py`` of
github.com/kenjyoung/MinAtar: centered RMSprop lr 2.5e-4, batch 32, one update per env step, the
target copied every 1,000 updates, its max rather than double DQN, no gradient clipping, epsilon
from 1 to 0.1 over the first 100,000 steps; the paper decays it over the 100,000 steps after the
first 5,000), ``offline`` copies the target every 1,000 updates (a faster target made CQL's return
on random data swing instead of rise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from .base import AlgoConfig, Algorithm

if TYPE_CHECKING:
    import torch

    from ..settings import LearnerSetup

    from ..q_learner import QLearner



@dataclass(frozen=True, slots=True)
class QNetworkConfig(AlgoConfig):
    """The settings of a Q network's optimizer (DQN, CQL, and discrete behaviour cloning's logits),
    with the Atari and MinAtar step presets they share."""

    PRESETS: ClassVar = {
        "atari": dict(learning_rate=1e-4, batch_size=32),
        "minatar": dict(optimizer="rmsprop", learning_rate=2.5e-4, batch_size=32, max_grad_norm=0.0),
    }

    optimizer: Literal["adam", "rmsprop"] = "adam"
    """``adam``, or ``rmsprop``: centered RMSprop with squared-gradient decay 0.95, momentum 0.95 and
    eps 0.01 (the MinAtar paper's DQN)."""

    def validate(self) -> None:
        AlgoConfig.validate(self)
        if self.optimizer not in ("adam", "rmsprop"):
            raise ValueError(f"`optimizer` must be 'adam' or 'rmsprop', got {self.optimizer!r}")


@dataclass(frozen=True, slots=True)
class QLearningConfig(QNetworkConfig):
    """The settings of a Q network trained on TD targets (DQN, CQL)."""

    PRESETS: ClassVar = {
        "offline": dict(target_update_interval=1000),
        "atari": dict(target_update_interval=1000),
        "minatar": dict(target_update_interval=1000, double=False, loss="huber", gamma=0.99),
    }

    target_update_interval: int = 128
    """Updates between target updates (RL-zoo's CartPole setting; 1000 offline, for Atari and MinAtar)."""
    tau: float = 1.0
    """Target update: 1 copies the weights; below 1, Polyak averaging target += tau (q - target)."""
    double: bool = True
    """Double DQN targets (the online net picks the next action, the target net values it)."""
    dueling: bool = False
    """Dueling head V(s) + A(s, a) - mean A."""
    loss: Literal["huber", "mse"] = "huber"
    """TD loss: Huber (smooth L1, as SB3 and the Nature paper) or squared error."""

    def validate(self) -> None:
        QNetworkConfig.validate(self)
        if self.target_update_interval < 1:
            raise ValueError(f"`target_update_interval` must be >= 1, got {self.target_update_interval}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"`tau` must lie in (0, 1], got {self.tau}")
        if self.loss not in ("huber", "mse"):
            raise ValueError(f"`loss` must be 'huber' or 'mse', got {self.loss!r}")


def _minatar_decay(run: dict[str, Any]) -> float:
    """MinAtar's epsilon decays over 100,000 env steps: that share of the run's ``steps``."""
    return min(1.0, 100_000 / max(1, int(run.get("steps") or 1)))


@dataclass(frozen=True, slots=True)
class DQNConfig(QLearningConfig):
    """DQN's settings: the Q-learning ones and, online, exploration and training rounds."""

    name: ClassVar[str] = "dqn"
    PRESETS: ClassVar = {  # (over QLearningConfig's)
        "atari": dict(train_freq=4, gradient_steps=1, learning_starts=80_000, end_e=0.01, exploration_fraction=0.10),
        "minatar": dict(train_freq=1, gradient_steps=1, learning_starts=5000, start_e=1.0, end_e=0.1,
                        exploration_fraction=_minatar_decay),
    }

    train_freq: int = 256
    """Online: env steps between training rounds (at most one round per vector step: below
    ``num_envs``, a round every ``num_envs`` env steps). Env steps count transitions, not the
    steps that only reset a lane, so the updates per env step do not depend on episode lengths."""
    gradient_steps: int = 128
    """Online: updates per training round."""
    learning_starts: int = 1000
    """Online: env steps before the first update (the first rows are random-ish anyway)."""
    start_e: float = 1.0
    """Online: exploration epsilon at the start."""
    end_e: float = 0.04
    """Online: exploration epsilon after the decay."""
    exploration_fraction: float = 0.16
    """Online: fraction of ``steps`` over which epsilon decays linearly."""

    def validate(self) -> None:
        QLearningConfig.validate(self)
        for name in ("train_freq", "gradient_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be >= 1, got {getattr(self, name)}")
        if self.learning_starts < 0:
            raise ValueError(f"`learning_starts` must be >= 0, got {self.learning_starts}")
        for name in ("start_e", "end_e", "exploration_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"`{name}` must lie in [0, 1], got {getattr(self, name)}")


# -- ALGO LOGIC -----------------------------------------------------------------------------------
def q_values(ln: QLearner, b: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Q(s, .) of the batch's observations and Q(s, a) of the data's actions."""
    q_all = ln.q_fwd(b.obs).float()
    return q_all, q_all.gather(1, b.action.long().view(-1, 1)).squeeze(1)


def td_loss(ln: QLearner, b: Any, q_sa: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The TD loss of ``q_sa`` against ``r + gamma * Q_target(s', a*)`` (``a*`` the online net's pick
    with ``double``, the target's otherwise), weighted by the importance weights of prioritized
    replay; returns it and the TD errors when priorities need them (else ``None``)."""
    import torch
    from torch.nn import functional as F

    algo = ln.algo
    with torch.no_grad():
        q_next_target = ln.target_fwd(b.next_obs).float()
        if algo.double:
            best = ln.q_fwd(b.next_obs).argmax(dim=1, keepdim=True)
            q_next = q_next_target.gather(1, best).squeeze(1)
        else:
            q_next = q_next_target.max(dim=1).values
        if b.discount is not None:  # n-step / frame-stack views: gamma^m, 0 after termination
            y = b.reward.float() + b.discount.float() * q_next
        else:  # r + gamma * (1 - terminated) * q_next, as two ops
            y = b.reward.float().add(q_next.masked_fill_(b.terminated.bool(), 0.0), alpha=algo.gamma)
    if ln.cfg.replay.prioritized or b.weights is not None:  # TD errors for the priorities, importance weights
        td = q_sa - y
        per_sample = F.smooth_l1_loss(q_sa, y, reduction="none") if algo.loss == "huber" else td.pow(2)
        if b.weights is not None:
            per_sample = per_sample * b.weights.float()
        return per_sample.mean(), td
    # one fused op (each small op costs a few us on the CPU)
    return (F.smooth_l1_loss(q_sa, y) if algo.loss == "huber" else F.mse_loss(q_sa, y)), None


def dqn_loss(ln: QLearner, b: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """DQN's loss on a batch: the TD loss of the data's actions."""
    _, q_sa = q_values(ln, b)
    loss, td = td_loss(ln, b, q_sa)
    return loss, q_sa, td


def _learner(setup: LearnerSetup) -> QLearner:
    from ..q_learner import QLearner

    return QLearner.for_setup(setup, dqn_loss)


ALGORITHM = Algorithm("dqn", DQNConfig, {"discrete": _learner}, online=True,
                      summary="double DQN, online or offline (discrete actions)")
