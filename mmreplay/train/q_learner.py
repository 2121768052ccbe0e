"""The Q-network learner of the discrete-action algorithms (:class:`QLearner`): the Q network, its
target, the optimizer and one gradient step around an algorithm's loss (``algos/dqn.py``,
``algos/cql.py``, ``algos/bc.py`` write theirs).

Invariants: no host sync per update (losses and Q values are kept as tensors and summed a block at
a time, read by ``read_stats``); the target network is updated every ``target_update_interval``
updates (copied, or Polyak-averaged below ``tau`` 1); the learner asks nothing of the algorithm but
its config and its loss function.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..agent.policy import QNetwork, network_spec
from .stats import UpdateStats

if TYPE_CHECKING:
    from .settings import LearnerSetup, TrainConfig

log = logging.getLogger(__name__)

Loss = Callable[["QLearner", Any], "tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]"]
"""An algorithm's loss: ``(learner, batch) -> (loss, Q(s, a) of the data's actions, TD errors or None)``."""


def qnet_spec(cfg: TrainConfig, schema: Any, n_actions: int) -> dict[str, Any]:
    """The Q network a run trains for ``schema``'s observations (``network_spec`` of its config)."""
    return network_spec(schema, n_actions, frame_stack=cfg.frame_stack, hidden=cfg.algo.hidden,
                        dueling=bool(getattr(cfg.algo, "dueling", False)), minatar=cfg.minatar)


class QLearner(UpdateStats):
    """The Q network, its target (``target=True``), the optimizer, and one gradient step of the
    algorithm's ``loss`` (its statistics: the mean loss and the mean Q(s, a) of the data's actions).

    ``cfg`` is the run's config, ``algo`` the algorithm's (``cfg.algo``)."""

    algo: Any
    """The algorithm's config (``cfg.algo``): its learning rate, ``gamma``, target settings, ..."""
    optimizer: torch.optim.Optimizer
    """The Q network's optimizer: fused Adam, or RMSprop where the algorithm's config says so (the MinAtar preset)."""

    def __init__(self, cfg: TrainConfig, spec: dict[str, Any], device: torch.device, loss: Loss,
                 target: bool = True) -> None:
        self.cfg = cfg
        """The run's config."""
        self.algo = algo = cfg.algo
        self.device = device
        """The device the networks are on."""
        self._loss = loss
        self.q = QNetwork(spec).to(device)
        """The Q network (what the policy files hold: :attr:`policy_net`)."""
        self.target = copy.deepcopy(self.q).requires_grad_(False) if target else None
        """The target network, a frozen copy of ``q`` that :meth:`update_target` moves to it; ``None``
        when made with ``target=False``."""
        # fused Adam: one kernel for every parameter (faster than the per-tensor loop for small nets; an ad-hoc
        # timing, not re-measured by benchmarks/)
        if getattr(algo, "optimizer", "adam") == "adam":
            self.optimizer: torch.optim.Optimizer = torch.optim.Adam(self.q.parameters(), lr=algo.learning_rate,
                                                                     fused=True)
        else:  # the MinAtar paper's DQN (algos/dqn.py's minatar preset)
            self.optimizer = torch.optim.RMSprop(self.q.parameters(), lr=algo.learning_rate, alpha=0.95, eps=0.01,
                                                 momentum=0.95, centered=True)
        hw = cfg.hardware
        self.q_fwd = torch.compile(self.q) if hw.compile else self.q
        """What a loss calls for Q-values: ``q``, or ``torch.compile`` of it with ``--compile``."""
        self.target_fwd = torch.compile(self.target) if hw.compile and self.target is not None else self.target
        """What a loss calls for target Q-values: ``target``, or ``torch.compile`` of it with ``--compile``."""
        self.amp = hw.amp and device.type == "cuda"
        """Whether the forward passes run in bf16 autocast (``--amp``, on CUDA only; :meth:`autocast`)."""
        if hw.amp and not self.amp:
            log.warning("--amp is for CUDA (bf16 autocast); training in float32 on %s", device)
        self.updates = 0
        """Updates made (restored by :meth:`load`)."""
        # (target, online) pairs of parameters, then of buffers (update_target)
        self._pairs: tuple[list[tuple[torch.Tensor, torch.Tensor]], list[tuple[torch.Tensor, torch.Tensor]]] | None = None
        self._target_every = int(getattr(algo, "target_update_interval", 0) or 0) if target else 0
        self._tau = float(getattr(algo, "tau", 1.0))
        self._max_norm = float(algo.max_grad_norm)
        self._params = list(self.q.parameters())
        self._init_stats(cfg.hardware, device)  # the loss and Q(s, a) accumulators; --cuda-graphs

    @classmethod
    def for_setup(cls, setup: LearnerSetup, loss: Loss, target: bool = True) -> QLearner:
        """A learner of ``loss`` for the store of ``setup`` (its observations, ``setup.n_actions``)."""
        assert setup.n_actions is not None, "discrete actions: the number of actions is known"
        return cls(setup.cfg, qnet_spec(setup.cfg, setup.store.schema, setup.n_actions), setup.device, loss, target)

    @property
    def policy_net(self) -> QNetwork:
        """The network a policy file holds, evaluation runs and the online loops act with: the Q network."""
        return self.q

    def checkpoint_parts(self) -> dict[str, Any]:
        """What ``Run.maybe_checkpoint`` writes: the Q network, its target and the optimizer."""
        return {"q": self.q, "target": self.target, "optimizer": self.optimizer, "extra": None}

    def autocast(self) -> Any:
        """The context the forward passes run in: bf16 autocast when ``amp`` is on (CUDA only), else a
        no-op."""
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.amp else contextlib.nullcontext()

    def phase(self) -> bool | None:
        """The host-side branch the next update takes (``graphs.GraphedUpdate`` captures one graph per
        phase): whether it copies the target."""
        return None if not self._target_every else (self.updates + 1) % self._target_every == 0

    def after_graphed_update(self) -> None:
        """Host-side work of an update replayed as a graph: none."""

    def update(self, b: Any) -> torch.Tensor | None:
        """One gradient step of the algorithm's loss on a batch of tensors; returns the TD errors
        (``None`` when the loss has none)."""
        with self.autocast():
            loss, q_sa, td = self._loss(self, b)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self._max_norm > 0:
            torch.nn.utils.clip_grad_norm_(self._params, self._max_norm)
        self.optimizer.step()
        self.updates += 1
        if self._target_every and self.updates % self._target_every == 0:
            self.update_target()
        self._record(loss, q_sa)  # summed in blocks (no op per update beyond the detaches)
        return None if td is None else td.detach()

    @torch.no_grad()
    def update_target(self) -> None:
        """Copy the Q network into its target (parameters and buffers), or with ``tau`` below 1 move
        each target parameter ``tau`` of the way to the online one (buffers left as they are)."""
        assert self.target is not None
        if self._pairs is None:  # the tensors, gathered once (a state_dict walk per copy cost ~1 ms here)
            self._pairs = ([*zip(self.target.parameters(), self.q.parameters())],
                           [*zip(self.target.buffers(), self.q.buffers())])
        params, buffers = self._pairs
        if self._tau >= 1.0:
            for t, p in (*params, *buffers):
                t.copy_(p)
        else:
            for t, p in params:
                t.lerp_(p, self._tau)

    def load(self, payload: dict[str, Any]) -> None:
        """Restore the Q network, its target (when ``payload`` holds one), the optimizer and the update
        count from a checkpoint read by ``load_checkpoint``."""
        self.q.load_state_dict(payload["state_dict"])
        if self.target is not None and payload.get("target") is not None:
            self.target.load_state_dict(payload["target"])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.updates = int(payload["counters"]["updates"])
