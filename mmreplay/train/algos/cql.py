"""Discrete CQL (Kumar et al. 2020, "Conservative Q-Learning for Offline Reinforcement Learning"),
offline: DQN's TD loss plus ``cql_alpha * (logsumexp_a Q(s, a) - Q(s, a_data))``, which pushes Q
down on actions the data did not take and up on those it did. Discrete actions; DQN's network,
learner and greedy evaluation policy (``algos/dqn.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .base import Algorithm
from .dqn import QLearningConfig, q_values, td_loss

if TYPE_CHECKING:
    import torch

    from ..settings import LearnerSetup

    from ..q_learner import QLearner


@dataclass(frozen=True, slots=True)
class CQLConfig(QLearningConfig):
    """CQL's settings: the Q-learning ones (the target copied every 1,000 updates offline) and the
    regulariser's weight."""

    name: ClassVar[str] = "cql"

    cql_alpha: float = 1.0
    """Weight of the CQL regulariser."""

    def validate(self) -> None:
        QLearningConfig.validate(self)
        if self.cql_alpha < 0:
            raise ValueError(f"`cql_alpha` must be >= 0, got {self.cql_alpha}")


# -- ALGO LOGIC -----------------------------------------------------------------------------------
def cql_loss(ln: QLearner, b: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The TD loss plus the conservative regulariser."""
    import torch

    q_all, q_sa = q_values(ln, b)
    loss, td = td_loss(ln, b, q_sa)
    return loss + ln.algo.cql_alpha * (torch.logsumexp(q_all, dim=1) - q_sa).mean(), q_sa, td


def _learner(setup: LearnerSetup) -> QLearner:
    from ..q_learner import QLearner

    return QLearner.for_setup(setup, cql_loss)


ALGORITHM = Algorithm("cql", CQLConfig, {"discrete": _learner}, summary="discrete CQL, offline")
