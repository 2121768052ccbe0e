"""The learner of the Box-action algorithms (:class:`BoxLearner`): observation normalization, the
data's actions mapped onto [-1, 1], the actor, the networks an algorithm adds (critics, values,
targets) with their optimizers, and one gradient step around the algorithm's ``step``
(``algos/td3bc.py``, ``algos/iql.py``, ``algos/bc.py`` write theirs).

Invariants:

* actions are learned in ``[-1, 1]`` (``mmreplay.agent.continuous``): data actions are mapped from
  the scale the store records (``metadata["action_scale"]``: ``"unit"`` or ``"env"`` with
  ``metadata["action_space"]`` bounds; a Minari import's ``minari_action_space`` counts as
  ``"env"`` with its Box) and the saved actor maps back onto the eval env's bounds;
  an unknown scale and a mismatch are each said in one line (:func:`action_bounds`);
* observations are normalized with the dataset's mean and std (plus 1e-3, as CORL) from
  :func:`mmreplay.field_stats` (cached; computed once per store), once per batch for every
  network; the actor carries them, so its policy file takes raw observations;
* the learner's whole state (networks, targets, optimizers; a schedule follows the update count)
  goes into the checkpoint under the names the algorithm gave them and comes back on ``resume``,
  so with the run's sampler and torch generator restored a resumed run makes the same next update
  as an uninterrupted one.
"""

from __future__ import annotations

import copy
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..agent.continuous import Actor, actor_spec
from .stats import UpdateStats

if TYPE_CHECKING:
    from ..storage import ReplayStore
    from .settings import LearnerSetup, TrainConfig

log = logging.getLogger(__name__)

OBS_STD_EPS = 1e-3
"""Added to the observations' standard deviation (CORL's ``compute_mean_std(..., eps=1e-3)``)."""


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


Step = Callable[["BoxLearner", Any, Any, Any, Any, Any], "tuple[torch.Tensor, torch.Tensor | None]"]
"""An algorithm's step: ``(learner, x, x2, a, r, disc) -> (loss, Q(s, a) of the data's actions or None)`` on
normalized observations ``x`` and next observations ``x2``, unit actions ``a``, rewards ``r`` and bootstrap
factors ``disc``; it runs its optimizers itself (:meth:`BoxLearner.optimize`)."""


@dataclass(frozen=True)
class BoxAlgorithm:
    """What a Box algorithm gives :class:`BoxLearner`: its ``step``; ``build`` (adds its networks with
    :meth:`BoxLearner.add_network` and :meth:`BoxLearner.add_target`); whether its actor is Gaussian;
    ``phase`` (the host-side branch of the next update, for graph capture) and ``after_graphed_update``
    (host-side work of a replayed update)."""

    step: Step
    build: Callable[[BoxLearner], None] | None = None
    gaussian: bool = False
    phase: Callable[[BoxLearner], Any] | None = None
    after_graphed_update: Callable[[BoxLearner], None] | None = None


class BoxLearner(UpdateStats):
    """The actor, the networks an algorithm adds, their optimizers and one gradient step (see the
    module docstring). ``actor`` is what is saved and evaluated (:attr:`policy_net`). Its statistics:
    the loss and Q(s, a) the algorithm's step returns."""

    algo: Any
    """The algorithm's config (``cfg.algo``): its learning rate, ``gamma``, ``tau``, ..."""

    def __init__(self, cfg: TrainConfig, schema: Any, device: torch.device, algorithm: BoxAlgorithm, *,
                 obs_mean: np.ndarray, obs_std: np.ndarray, data_bounds: tuple[np.ndarray, np.ndarray],
                 policy_bounds: tuple[np.ndarray, np.ndarray], clip_actions: bool = False) -> None:
        self.cfg = cfg
        """The run's config."""
        self.algo = algo = cfg.algo
        self.device = device
        """The device the networks are on."""
        self._algorithm = algorithm
        spec = actor_spec(schema, hidden=algo.hidden, gaussian=algorithm.gaussian, action_low=policy_bounds[0],
                          action_high=policy_bounds[1])
        self.actor = Actor(spec).to(device)
        """The actor: what the policy files hold (:attr:`policy_net`), with the observation statistics."""
        self.actor.set_normalization(obs_mean, obs_std)
        self.obs_dim = int(self.actor.obs_mean.numel())
        """Features of a flattened observation (all fields): the input width of the networks."""
        self.act_dim = int(spec["action_dim"])
        """Dimensions of an action."""
        # per batch: x = obs * inv_std + shift (one op), the data's actions likewise onto [-1, 1]
        self._inv = (1.0 / self.actor.obs_std).clone()
        self._shift = (-self.actor.obs_mean * self._inv).clone()
        lo, hi = (torch.as_tensor(np.asarray(b, np.float32), device=device) for b in data_bounds)
        self._a_identity = bool(torch.all(lo == -1) and torch.all(hi == 1))
        self._a_inv = 2.0 / (hi - lo)
        self._a_shift = -(hi + lo) / (hi - lo)
        self._clip = clip_actions
        self._max_norm = float(algo.max_grad_norm)
        self._networks: dict[str, torch.nn.Module] = {}
        self._optimizers: dict[str, torch.optim.Optimizer] = {}
        self.actor_opt = self._optimizer("actor_opt", self.actor)
        """The actor's Adam optimizer."""
        self.actor_params = list(self.actor.parameters())
        """The actor's parameters, as a list (the gradients an actor loss takes: :meth:`optimize`'s ``inputs``)."""
        self._targets: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
        self.updates = 0
        """Updates made (restored by :meth:`load`)."""
        if algorithm.build is not None:
            algorithm.build(self)
        self._init_stats(cfg.hardware, device)  # the loss and Q(s, a) accumulators; --cuda-graphs

    # -- what an algorithm builds -----------------------------------------------------------------
    def _optimizer(self, name: str, net: torch.nn.Module) -> torch.optim.Optimizer:
        opt = torch.optim.Adam(net.parameters(), lr=self.algo.learning_rate, fused=True)
        self._optimizers[name] = opt
        return opt

    def add_network(self, name: str, net: torch.nn.Module) -> torch.nn.Module:
        """Add ``net`` (moved to the device) as attribute ``name`` with an Adam optimizer
        ``<name>_opt``; both are checkpointed under these names."""
        net = net.to(self.device)
        self._networks[name] = net
        setattr(self, name, net)
        setattr(self, f"{name}_opt", self._optimizer(f"{name}_opt", net))
        return net

    def add_target(self, name: str) -> torch.nn.Module:
        """Add ``<name>_target``, a frozen copy of network ``name`` (or the actor) that
        :meth:`soft_update` Polyak-averages towards it; checkpointed under that name."""
        net = self.actor if name == "actor" else self._networks[name]
        target = copy.deepcopy(net).requires_grad_(False)
        self._networks[f"{name}_target"] = target
        setattr(self, f"{name}_target", target)
        self._targets.append((list(target.parameters()), list(net.parameters())))
        return target

    @property
    def policy_net(self) -> Actor:
        """The network a policy file holds and evaluation runs: the actor."""
        return self.actor

    # -- one update -------------------------------------------------------------------------------
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
            disc = (~b.terminated.bool()).float().mul_(self.algo.gamma)
        return x, x2, a, r, disc

    def update(self, b: Any) -> None:
        """One gradient step of the algorithm on a batch of tensors (``TensorBatch``)."""
        loss, q_data = self._algorithm.step(self, *self._inputs(b))
        self.updates += 1
        self._record(loss, q_data)

    def phase(self) -> Any:
        """The host-side branch the next update takes (``graphs.GraphedUpdate`` captures one graph per
        phase), as the algorithm says; ``None`` when it always takes the same."""
        return None if self._algorithm.phase is None else self._algorithm.phase(self)

    def after_graphed_update(self) -> None:
        """Host-side work of an update replayed as a graph (``graphs.GraphedUpdate``), as the algorithm says."""
        if self._algorithm.after_graphed_update is not None:
            self._algorithm.after_graphed_update(self)

    def optimize(self, opt: Any, loss: torch.Tensor, net: torch.nn.Module,
                 inputs: list[torch.Tensor] | None = None) -> None:
        """A gradient step of ``opt`` on ``loss`` (gradients of ``inputs`` only when given: the actor's
        loss steps the actor, not the critic), clipped to ``max_grad_norm`` when it is set."""
        opt.zero_grad(set_to_none=True)
        loss.backward(inputs=inputs)
        if self._max_norm > 0:
            torch.nn.utils.clip_grad_norm_(net.parameters(), self._max_norm)
        opt.step()

    @torch.no_grad()
    def soft_update(self) -> None:
        """Every target += tau (online - target), one fused op per network."""
        for target, online in self._targets:
            torch._foreach_lerp_(target, online, self.algo.tau)

    # -- checkpoints ----------------------------------------------------------------------------
    def checkpoint_parts(self) -> dict[str, Any]:
        """What ``Run.maybe_checkpoint`` writes: the actor as the policy, the rest as ``learner``."""
        extra: dict[str, Any] = {}  # (the optimizers include actor_opt)
        for name, net in self._networks.items():
            extra[name] = {k: v.detach().cpu() for k, v in net.state_dict().items()}
        for name, opt in self._optimizers.items():
            extra[name] = opt.state_dict()
        return {"q": self.actor, "target": None, "optimizer": self.actor_opt, "extra": extra}

    def load(self, payload: dict[str, Any]) -> None:
        """Restore the state :meth:`checkpoint_parts` saved."""
        self.actor.load_state_dict(payload["state_dict"])
        extra = payload.get("learner") or {}
        for name, net in self._networks.items():
            net.load_state_dict(extra[name])
        for name, opt in self._optimizers.items():
            opt.load_state_dict(extra[name])
        self._inv = (1.0 / self.actor.obs_std).clone()
        self._shift = (-self.actor.obs_mean * self._inv).clone()
        self.updates = int(payload["counters"]["updates"])


def box_learner(setup: LearnerSetup, algorithm: BoxAlgorithm) -> BoxLearner:
    """A :class:`BoxLearner` of ``algorithm`` for ``setup.store``: observation statistics (``field_stats``,
    cached), the action scale (:func:`action_bounds`) and the eval env's Box."""
    cfg, store, eval_env = setup.cfg, setup.store, setup.eval_env
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
    show = cfg.report.progress if cfg.report.progress is not None else sys.stderr.isatty()
    for name in schema.obs_names:
        if cfg.algo.normalize_obs:
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
    if cfg.algo.normalize_obs:
        log.info("observations normalized with the mean and std of %d transitions (mmreplay.field_stats)", st.count)
    return BoxLearner(cfg, schema, setup.device, algorithm, obs_mean=np.concatenate(means),
                      obs_std=np.concatenate(stds), data_bounds=data, policy_bounds=policy, clip_actions=clip)
