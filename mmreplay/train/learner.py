"""The DQN learner: the Q network, its target, the optimizer, and one gradient step of DQN, CQL or
BC (:class:`Learner`), and the Q network a run trains (:func:`qnet_spec`).

Invariants: no host sync per update (losses and Q values are kept as tensors and summed a block at
a time, read by ``read_stats``); the target network is updated every ``target_update_interval``
updates (copied, or Polyak-averaged below ``tau`` 1).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from typing import Any

import torch
import torch.nn.functional as F

from ..agent.policy import QNetwork, network_spec
from .config import TrainConfig, target_update_interval_of
from .stats import UpdateStats

log = logging.getLogger(__name__)


# -- ALGO LOGIC ---------------------------------------------------------------------------------------
def qnet_spec(cfg: TrainConfig, schema: Any, n_actions: int) -> dict[str, Any]:
    """The Q network a run trains for ``schema``'s observations (``network_spec`` of its config)."""
    return network_spec(schema, n_actions, frame_stack=cfg.frame_stack, hidden=cfg.hidden, dueling=cfg.dueling,
                        minatar=cfg.minatar)


class Learner(UpdateStats):
    """The Q network, its target, the optimizer, and one gradient step of DQN, CQL or BC
    (its statistics: the mean loss and the mean Q(s, a) of the data's actions)."""

    def __init__(self, cfg: TrainConfig, spec: dict[str, Any], device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.q = QNetwork(spec).to(device)
        self.target = copy.deepcopy(self.q).requires_grad_(False) if cfg.algo != "bc" else None
        # fused Adam: one kernel for every parameter (faster than the per-tensor loop for small nets; an ad-hoc
        # timing, not re-measured by benchmarks/)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=cfg.learning_rate, fused=True) if cfg.optimizer == "adam" \
            else torch.optim.RMSprop(self.q.parameters(), lr=cfg.learning_rate, alpha=0.95, eps=0.01, momentum=0.95,
                                     centered=True)  # the MinAtar paper's DQN (config.minatar_config)
        self.q_fwd = torch.compile(self.q) if cfg.compile else self.q
        self.target_fwd = torch.compile(self.target) if cfg.compile and self.target is not None else self.target
        self.amp = cfg.amp and device.type == "cuda"
        if cfg.amp and not self.amp:
            log.warning("--amp is for CUDA (bf16 autocast); training in float32 on %s", device)
        self.updates = 0
        # (target, online) pairs of parameters, then of buffers (update_target)
        self._pairs: tuple[list[tuple[torch.Tensor, torch.Tensor]], list[tuple[torch.Tensor, torch.Tensor]]] | None = None
        self.target_every = target_update_interval_of(cfg)
        self._init_stats(cfg, device)  # the loss and Q(s, a) accumulators; --cuda-graphs

    @property
    def policy_net(self) -> QNetwork:
        """The network a policy file holds and evaluation runs: the Q network."""
        return self.q

    def checkpoint_parts(self) -> dict[str, Any]:
        """What ``Run.maybe_checkpoint`` writes: the Q network, its target and the optimizer."""
        return {"q": self.q, "target": self.target, "optimizer": self.optimizer, "extra": None}

    def autocast(self) -> Any:
        """The context the forward passes run in: bf16 autocast when ``amp`` is on (CUDA only), else a
        no-op."""
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.amp else contextlib.nullcontext()

    def update(self, b: Any) -> torch.Tensor | None:
        """One gradient step on a batch of tensors; returns the TD errors (``None`` for BC)."""
        cfg = self.cfg
        action = b.action.long().view(-1, 1)
        td = None
        with self.autocast():
            q_all = self.q_fwd(b.obs).float()
            q_sa = q_all.gather(1, action).squeeze(1)
            if cfg.algo == "bc":
                loss = F.cross_entropy(q_all, action.squeeze(1))
            else:
                with torch.no_grad():
                    q_next_target = self.target_fwd(b.next_obs).float()
                    if cfg.double:
                        best = self.q_fwd(b.next_obs).argmax(dim=1, keepdim=True)
                        q_next = q_next_target.gather(1, best).squeeze(1)
                    else:
                        q_next = q_next_target.max(dim=1).values
                    if b.discount is not None:  # n-step / frame-stack views: gamma^m, 0 after termination
                        y = b.reward.float() + b.discount.float() * q_next
                    else:  # r + gamma * (1 - terminated) * q_next, as two ops
                        y = b.reward.float().add(q_next.masked_fill_(b.terminated.bool(), 0.0), alpha=cfg.gamma)
                if cfg.prioritized or b.weights is not None:  # TD errors for the priorities, importance weights
                    td = q_sa - y
                    per_sample = F.smooth_l1_loss(q_sa, y, reduction="none") if cfg.loss == "huber" else td.pow(2)
                    if b.weights is not None:
                        per_sample = per_sample * b.weights.float()
                    loss = per_sample.mean()
                else:  # one fused op (each small op costs a few us on the CPU)
                    loss = F.smooth_l1_loss(q_sa, y) if cfg.loss == "huber" else F.mse_loss(q_sa, y)
                if cfg.algo == "cql":  # push down Q of unseen actions, up Q of the data's
                    loss = loss + cfg.cql_alpha * (torch.logsumexp(q_all, dim=1) - q_sa).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.q.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        self.updates += 1
        if self.target is not None and self.updates % self.target_every == 0:
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
        if self.cfg.tau >= 1.0:
            for t, p in (*params, *buffers):
                t.copy_(p)
        else:
            for t, p in params:
                t.lerp_(p, self.cfg.tau)

    def load(self, payload: dict[str, Any]) -> None:
        """Restore the Q network, its target (when ``payload`` holds one), the optimizer and the update
        count from a checkpoint read by ``load_checkpoint``."""
        self.q.load_state_dict(payload["state_dict"])
        if self.target is not None and payload.get("target") is not None:
            self.target.load_state_dict(payload["target"])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.updates = int(payload["counters"]["updates"])
