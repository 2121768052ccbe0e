"""Offline learners for continuous (Box) actions: TD3+BC, IQL and behaviour cloning.

:class:`ContinuousLearner` holds the networks, their optimizers and one gradient step
(``# ALGO LOGIC``), with the hyperparameters of CORL's single-file implementations as defaults
(:func:`mmreplay.train.continuous_config`):

* ``td3bc`` (Fujimoto & Gu 2021): twin critics and a deterministic ``tanh`` actor, target policy
  smoothing (noise 0.2 clipped at 0.5), the actor and the targets updated every ``policy_freq`` = 2
  critic updates, Polyak ``tau`` = 0.005, actor loss ``-lambda * Q1(s, pi(s)) + (pi(s) - a)^2`` with
  ``lambda = alpha / mean|Q1|`` (``alpha`` = 2.5);
* ``iql`` (Kostrikov et al. 2021): twin critics, a value network fitted by expectile regression
  (``iql_expectile`` = 0.7) to the target critics' minimum, critics regressed on ``r + gamma V(s')``,
  target critics Polyak-averaged (``tau`` = 0.005) every update, and advantage-weighted regression of
  a Gaussian actor (state-independent log std; weights ``exp(beta * A)`` clipped at 100,
  ``beta`` = 3) whose learning rate follows a cosine schedule from lr to 0 over the run's ``steps``
  (CORL's ``CosineAnnealingLR``, in its closed form: a resumed run with more ``steps`` stretches
  what is left of it);
* ``bc``: the deterministic actor regressed on the data's actions (mean squared error).

Every network has ``hidden`` = (256, 256) ReLU layers and one Adam optimizer (lr 3e-4), batches of 256.

Invariants:

* actions are learned in ``[-1, 1]`` (``mmreplay.agent.continuous``): data actions are mapped from
  the scale the store records (``metadata["action_scale"]``: ``"unit"`` or ``"env"`` with
  ``metadata["action_space"]`` bounds; a Minari import's ``minari_action_space`` counts as
  ``"env"`` with its Box) and the saved actor maps back onto the eval env's bounds;
  an unknown scale and a mismatch are each said in one line (:func:`action_bounds`);
* observations are normalized with the dataset's mean and std (plus 1e-3, as CORL) from
  :func:`mmreplay.field_stats` (cached; computed once per store), once per batch for every
  network; the actor carries them, so its policy file takes raw observations;
* the learner's whole state (networks, targets, optimizers; the schedule follows the update
  count) goes into the checkpoint and comes back on ``resume``, so with the run's sampler and torch
  generator restored a resumed run makes the same next update as an uninterrupted one.
"""

from __future__ import annotations

import copy
import logging
import math
import time
import sys
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from ..agent.continuous import Actor, TwinCritic, ValueNetwork, actor_spec, is_continuous
from .stats import UpdateStats

if TYPE_CHECKING:
    from ..storage import ReplayStore
    from .config import TrainConfig

log = logging.getLogger(__name__)

CONTINUOUS_ALGOS = ("td3bc", "iql")
"""Algorithms for Box actions only; ``bc`` works for both kinds."""
DISCRETE_ALGOS = ("dqn", "cql")
OBS_STD_EPS = 1e-3
"""Added to the observations' standard deviation (CORL's ``compute_mean_std(..., eps=1e-3)``)."""
EXP_ADV_MAX = 100.0
"""IQL: the advantage weights ``exp(beta * A)`` are clipped at this."""


def check_algo_fits(algo: str, schema: Any, where: str) -> None:
    """One clear ``ValueError`` when the algorithm cannot learn from the store's action field."""
    f = schema["action"] if "action" in schema else None
    kind = "none" if f is None else f"{f.dtype} {tuple(f.shape)}"
    if algo in CONTINUOUS_ALGOS and not is_continuous(schema):
        raise ValueError(f"--algo {algo} needs continuous (Box) actions, but the `action` field of {where} is {kind} "
                         f"(discrete): use --algo bc, dqn or cql")
    if algo in DISCRETE_ALGOS and is_continuous(schema):
        raise ValueError(f"--algo {algo} needs discrete actions, but the `action` field of {where} is {kind} "
                         f"(continuous, a Box): use --algo td3bc, iql or bc")


def _box(space: Any) -> tuple[np.ndarray, np.ndarray] | None:
    low, high = getattr(space, "low", None), getattr(space, "high", None)
    if low is None or high is None or getattr(space, "n", None) is not None:
        return None
    low, high = np.asarray(low, np.float64).ravel(), np.asarray(high, np.float64).ravel()
    return (low, high) if np.all(np.isfinite(low)) and np.all(np.isfinite(high)) else None


def _minari_box(text: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """The bounds of a Box in Minari's serialized-space JSON (``import_minari`` keeps the dataset's
    action space as ``metadata["minari_action_space"]``), else ``None``."""
    import json

    try:
        d = json.loads(text) if isinstance(text, str) else None
        if not isinstance(d, dict) or d.get("type") != "Box":
            return None
        shape = tuple(d.get("shape") or ())
        low = np.broadcast_to(np.asarray(d["low"], np.float64), shape).ravel()
        high = np.broadcast_to(np.asarray(d["high"], np.float64), shape).ravel()
    except (ValueError, KeyError, TypeError):
        return None
    return (low, high) if np.all(np.isfinite(low)) and np.all(np.isfinite(high)) else None


def _fmt(b: tuple[np.ndarray, np.ndarray]) -> str:
    lo, hi = b
    if np.all(lo == lo[0]) and np.all(hi == hi[0]):
        return f"[{lo[0]:g}, {hi[0]:g}]"
    return f"[{np.array2string(lo, precision=3)}, {np.array2string(hi, precision=3)}]"


def action_bounds(store: ReplayStore, eval_space: Any, eval_env: str | None, dim: int
                  ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], bool]:
    """``(data bounds, policy bounds, clip)``: the Box the store's actions span (mapped to [-1, 1]
    for learning), the Box the saved actor's actions are mapped onto (the eval env's), and whether
    data actions fall outside their bounds (then they are clipped). Logs one line for an unknown
    scale and one for each mismatch."""
    unit = (-np.ones(dim), np.ones(dim))
    meta = store.metadata
    scale = meta.get("action_scale")
    env = _box(eval_space) if eval_space is not None else None
    if env is not None and len(env[0]) != dim:
        raise ValueError(f"--eval-env {eval_env} has {len(env[0])} action dimensions, the store's actions {dim}")
    recorded = None
    space = meta.get("action_space")
    if isinstance(space, dict) and "low" in space and "high" in space:
        recorded = (np.asarray(space["low"], np.float64).ravel(), np.asarray(space["high"], np.float64).ravel())
    elif scale is None and (minari := _minari_box(meta.get("minari_action_space"))) is not None:
        scale, recorded = "env", minari  # a Minari dataset (import_minari): actions as its env took them
    if scale == "unit":
        data = unit
    elif scale == "env":
        data = recorded or env or unit
        if recorded is None:
            log.warning("the store records env-scale actions but not their bounds (`action_space` metadata): taking "
                        "them as %s", _fmt(data) + (f" ({eval_env}'s)" if env is not None else ""))
    else:
        data = env or unit
        log.warning("action scale unknown: the store does not record it (no `action_scale` metadata, an older "
                    "store); its actions are taken to be at %s", f"{eval_env}'s scale {_fmt(data)}" if env is not None
                    else f"the unit scale {_fmt(data)}")
    policy = env or (data if scale == "env" else unit)
    if scale == "env" and recorded is not None and env is not None and not (
            np.allclose(recorded[0], env[0]) and np.allclose(recorded[1], env[1])):
        log.warning("action scale mismatch: the store's actions are at its env's bounds %s, --eval-env %s has %s; "
                    "the policy's actions are mapped onto %s's", _fmt(recorded), eval_env, _fmt(env), eval_env)
    from ..stats import field_stats

    a = field_stats(store, "action")
    lo, hi = a.min.ravel(), a.max.ravel()
    span = (data[1] - data[0]) * 1e-3
    clip = bool(np.any(lo < data[0] - span) or np.any(hi > data[1] + span))
    if clip:
        log.warning("action scale mismatch: the store's actions reach %s, outside %s that their %s scale gives; "
                    "they are clipped to it", _fmt((lo, hi)), _fmt(data), scale or "assumed")
    return data, policy, clip


class ContinuousLearner(UpdateStats):
    """The networks of TD3+BC, IQL or BC, their optimizers and one gradient step (see the module
    docstring). ``actor`` is what is saved and evaluated (:attr:`policy_net`). Its statistics: the
    critics' loss for TD3+BC and IQL, the actor's for BC; Q(s, a) of the first critic."""

    def __init__(self, cfg: TrainConfig, schema: Any, device: torch.device, *, obs_mean: np.ndarray,
                 obs_std: np.ndarray, data_bounds: tuple[np.ndarray, np.ndarray],
                 policy_bounds: tuple[np.ndarray, np.ndarray], clip_actions: bool = False) -> None:
        self.cfg = cfg
        self.device = device
        self.algo = cfg.algo
        gaussian = cfg.algo == "iql" and not cfg.iql_deterministic
        spec = actor_spec(schema, hidden=cfg.hidden, gaussian=gaussian, action_low=policy_bounds[0],
                          action_high=policy_bounds[1])
        self.actor = Actor(spec).to(device)
        self.actor.set_normalization(obs_mean, obs_std)
        obs_dim = int(self.actor.obs_mean.numel())
        act_dim = int(spec["action_dim"])
        self.act_dim = act_dim
        # per batch: x = obs * inv_std + shift (one op), the data's actions likewise onto [-1, 1]
        self._inv = (1.0 / self.actor.obs_std).clone()
        self._shift = (-self.actor.obs_mean * self._inv).clone()
        lo, hi = (torch.as_tensor(np.asarray(b, np.float32), device=device) for b in data_bounds)
        self._a_identity = bool(torch.all(lo == -1) and torch.all(hi == 1))
        self._a_inv = 2.0 / (hi - lo)
        self._a_shift = -(hi + lo) / (hi - lo)
        self._clip = clip_actions
        adam = dict(lr=cfg.learning_rate, fused=True)
        self.critic = self.critic_target = self.actor_target = self.value = None
        self.critic_opt = self.value_opt = None
        if cfg.algo in ("td3bc", "iql"):
            self.critic = TwinCritic(obs_dim, act_dim, cfg.hidden).to(device)
            self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
            self.critic_opt = torch.optim.Adam(self.critic.parameters(), **adam)
        if cfg.algo == "td3bc":
            self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        if cfg.algo == "iql":
            self.value = ValueNetwork(obs_dim, cfg.hidden).to(device)
            self.value_opt = torch.optim.Adam(self.value.parameters(), **adam)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), **adam)
        self._actor_params = list(self.actor.parameters())
        self._targets: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
        for target, net in ((self.critic_target, self.critic), (self.actor_target, self.actor)):
            if target is not None:
                self._targets.append((list(target.parameters()), list(net.parameters())))
        self.updates = 0
        self._init_stats(cfg, device)  # the loss and Q(s, a) accumulators; --cuda-graphs

    @property
    def policy_net(self) -> Actor:
        """The network a policy file holds and evaluation runs: the actor."""
        return self.actor

    # -- ALGO LOGIC -----------------------------------------------------------------------------
    def _inputs(self, b: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normalized observations and next observations, unit actions, rewards and bootstrap factors."""
        names = self.actor.names

        def flat(o: Any) -> torch.Tensor:  # dict observations: the actor's field order
            return o if not isinstance(o, dict) else torch.cat(
                [(o[n] if n in o else o[n.removeprefix("obs/")]).flatten(1) for n in names], 1)

        obs, nxt = flat(b.obs), flat(b.next_obs)
        x = torch.addcmul(self._shift, obs.flatten(1).float(), self._inv)
        x2 = torch.addcmul(self._shift, nxt.flatten(1).float(), self._inv)
        a = b.action.flatten(1).float()
        if not self._a_identity:
            a = torch.addcmul(self._a_shift, a, self._a_inv)
        if self._clip:
            a = a.clamp(-1.0, 1.0)
        r = b.reward.float()
        if b.discount is not None:  # n-step views: gamma^m, 0 after termination
            disc = b.discount.float()
        else:
            disc = (~b.terminated.bool()).float().mul_(self.cfg.gamma)
        return x, x2, a, r, disc

    def update(self, b: Any) -> None:
        """One gradient step on a batch of tensors (``TensorBatch``)."""
        cfg = self.cfg
        x, x2, a, r, disc = self._inputs(b)
        q_data = None
        if self.algo == "td3bc":
            assert self.critic is not None and self.critic_target is not None and self.actor_target is not None
            with torch.no_grad():  # target policy smoothing (unit actions: max_action = 1)
                noise = (torch.randn_like(a) * cfg.policy_noise).clamp_(-cfg.noise_clip, cfg.noise_clip)
                next_a = (self.actor_target.forward_normalized(x2) + noise).clamp_(-1.0, 1.0)
                y = torch.addcmul(r, disc, self.critic_target(x2, next_a).min(0).values)
            q = self.critic(x, a)
            loss = F.mse_loss(q, y.expand(2, -1)) * 2  # the sum of both critics' MSE
            self._step(self.critic_opt, loss, self.critic)
            if (self.updates + 1) % cfg.policy_freq == 0:
                pi = self.actor.forward_normalized(x)
                q_pi = self.critic.q1(x, pi)
                lmbda = cfg.td3bc_alpha / q_pi.abs().mean().detach()
                actor_loss = -lmbda * q_pi.mean() + F.mse_loss(pi, a)
                self._step(self.actor_opt, actor_loss, self.actor, inputs=self._actor_params)
                self._soft_update()
            q_data = q[0]
        elif self.algo == "iql":
            assert self.critic is not None and self.critic_target is not None and self.value is not None
            with torch.no_grad():
                next_v = self.value(x2)
                target_q = self.critic_target(x, a).min(0).values
            adv = target_q - self.value(x)
            v_loss = (torch.abs(cfg.iql_expectile - (adv < 0).float()) * adv.pow(2)).mean()
            self._step(self.value_opt, v_loss, self.value)
            y = torch.addcmul(r, disc, next_v)
            q = self.critic(x, a)
            loss = F.mse_loss(q, y.expand(2, -1))  # the mean of both critics' MSE
            self._step(self.critic_opt, loss, self.critic)
            self._soft_update()
            exp_adv = torch.exp(cfg.iql_beta * adv.detach()).clamp_(max=EXP_ADV_MAX)
            if self.actor.log_std is not None:
                bc = -self.actor.log_prob(x, a)
            else:
                bc = (self.actor.forward_normalized(x) - a).pow(2).sum(1)
            self._step(self.actor_opt, (exp_adv * bc).mean(), self.actor)
            self._schedule_actor_lr(self.updates + 1)
            q_data = q[0]
        else:  # bc
            loss = F.mse_loss(self.actor.forward_normalized(x), a)
            self._step(self.actor_opt, loss, self.actor)
        self.updates += 1
        self._record(loss, q_data)

    def _schedule_actor_lr(self, updates: int) -> None:
        """IQL: CORL steps CosineAnnealingLR(T_max=steps) after each actor step; its closed form,
        from the update count (stateless: a resumed run continues the same curve)."""
        cfg = self.cfg
        self.actor_opt.param_groups[0]["lr"] = cfg.learning_rate * 0.5 * (
            1 + math.cos(math.pi * min(updates, cfg.steps) / max(1, cfg.steps)))

    def after_graphed_update(self) -> None:
        """Host-side work of an update replayed as a graph (``graphs.GraphedUpdate``)."""
        if self.algo == "iql":
            self._schedule_actor_lr(self.updates)

    def _step(self, opt: Any, loss: torch.Tensor, net: torch.nn.Module, inputs: list[torch.Tensor] | None = None) -> None:
        opt.zero_grad(set_to_none=True)
        loss.backward(inputs=inputs)  # the actor's loss: gradients of the actor only (not the critic's weights)
        if self.cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(net.parameters(), self.cfg.max_grad_norm)
        opt.step()

    @torch.no_grad()
    def _soft_update(self) -> None:
        for target, online in self._targets:  # target += tau (online - target), one fused op per network
            torch._foreach_lerp_(target, online, self.cfg.tau)

    # -- checkpoints ----------------------------------------------------------------------------
    def checkpoint_parts(self) -> dict[str, Any]:
        """What ``Run.maybe_checkpoint`` writes: the actor as the policy, the rest as ``learner``."""
        extra: dict[str, Any] = {"actor_opt": self.actor_opt.state_dict()}
        for name in ("critic", "critic_target", "actor_target", "value"):
            net = getattr(self, name)
            if net is not None:
                extra[name] = {k: v.detach().cpu() for k, v in net.state_dict().items()}
        for name in ("critic_opt", "value_opt"):
            obj = getattr(self, name)
            if obj is not None:
                extra[name] = obj.state_dict()
        return {"q": self.actor, "target": None, "optimizer": self.actor_opt, "extra": extra}

    def load(self, payload: dict[str, Any]) -> None:
        """Restore the state :meth:`checkpoint_parts` saved."""
        self.actor.load_state_dict(payload["state_dict"])
        extra = payload.get("learner") or {}
        for name in ("critic", "critic_target", "actor_target", "value"):
            net = getattr(self, name)
            if net is not None:
                net.load_state_dict(extra[name])
        self.actor_opt.load_state_dict(extra["actor_opt"])
        for name in ("critic_opt", "value_opt"):
            obj = getattr(self, name)
            if obj is not None:
                obj.load_state_dict(extra[name])
        self._inv = (1.0 / self.actor.obs_std).clone()
        self._shift = (-self.actor.obs_mean * self._inv).clone()
        self.updates = int(payload["counters"]["updates"])


def make_learner(cfg: TrainConfig, store: ReplayStore, eval_env: str | None, device: torch.device) -> ContinuousLearner:
    """A :class:`ContinuousLearner` for ``store``: observation statistics (``field_stats``, cached),
    the action scale (:func:`action_bounds`) and the eval env's Box."""
    from ..stats import field_stats

    schema = store.schema
    eval_space = None
    if eval_env:
        from ..agent.envs import make_env

        env = make_env(eval_env, max_episode_steps=cfg.max_episode_steps)
        try:
            eval_space = env.action_space
        finally:
            env.close()
        if _box(eval_space) is None:
            raise ValueError(f"--eval-env {eval_env} has action space {eval_space!r}: continuous training needs a Box "
                             "with finite bounds")
    dim = int(math.prod(schema["action"].shape))
    data, policy, clip = action_bounds(store, eval_space, eval_env, dim)
    means, stds = [], []
    show = cfg.progress if cfg.progress is not None else sys.stderr.isatty()
    for name in schema.obs_names:
        if cfg.normalize_obs:
            bar: Any = None
            told = False

            def progress(done: int, total: int, name: str = name) -> None:  # a bar while a large store is read
                nonlocal bar, told
                if not told:  # called only when computed, not when cached
                    told = True
                    log.info("computing the statistics of %s (mean, std) over the store's transitions: one pass "
                             "over its %d segment(s), cached for later runs", name, total)
                if bar is None and show:
                    from tqdm import tqdm

                    bar = tqdm(total=total, unit="segment", desc=f"statistics of {name}", file=sys.stderr, leave=False)
                if bar is not None:
                    bar.update(done - bar.n)

            t0 = time.perf_counter()
            st = field_stats(store, name, progress=progress)
            if bar is not None:
                bar.close()
            if time.perf_counter() - t0 > 1.0:  # computed (a cached result takes milliseconds): say what took the time
                log.info("statistics of %s over %d transitions computed in %.1f s (cached for later runs: "
                         "mmreplay.field_stats)", name, st.count, time.perf_counter() - t0)
            means.append(st.mean.ravel())
            stds.append(st.std.ravel() + OBS_STD_EPS)
        else:
            n = int(math.prod(schema[name].shape))
            means.append(np.zeros(n))
            stds.append(np.ones(n))
    if cfg.normalize_obs:
        log.info("observations normalized with the mean and std of %d transitions (mmreplay.field_stats)", st.count)
    return ContinuousLearner(cfg, schema, device, obs_mean=np.concatenate(means), obs_std=np.concatenate(stds),
                             data_bounds=data, policy_bounds=policy, clip_actions=clip)
