"""Networks for continuous (Box) actions: the actor a policy file holds, the twin critics and the
value network of the offline learners (``mmreplay.train.box_learner``), and :class:`ContinuousPolicy`,
a loaded actor acting on numpy batches.

Conventions (the invariants every user of these networks relies on):

* **Unit actions inside, env actions outside.** Networks see and produce actions in ``[-1, 1]``
  per dimension (``tanh`` outputs); :meth:`Actor.to_env` maps them affinely onto the Box bounds
  ``[action_low, action_high]`` recorded in the actor's spec (the eval env's, when training had one),
  and :func:`unit_actions` maps data actions the other way. A policy file therefore acts in the env
  it was trained for without knowing how the dataset stored its actions.
* **Observation normalization is part of the actor.** The buffers ``obs_mean`` / ``obs_std`` (the
  dataset's statistics, ``mmreplay.field_stats``; 0 and 1 when training did not normalize) are
  applied inside :meth:`Actor.forward`, so a policy file takes raw observations; the learners call
  :meth:`Actor.forward_normalized` on observations they normalized once per batch.
* An actor's spec is JSON (``kind="actor"``): observation fields (flattened, cast to float and
  concatenated in schema order, as ``QNetwork``'s MLP does), ``action_dim``, ``hidden``,
  ``gaussian`` (IQL's Gaussian policy: a state-independent ``log_std`` parameter, the mean acts)
  and the Box bounds.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..core.errors import SchemaError

if TYPE_CHECKING:
    from ..core.schema import Schema

__all__ = ["Actor", "ContinuousPolicy", "TwinCritic", "ValueNetwork", "actor_spec", "is_continuous", "unit_actions"]

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
"""Clamp of the Gaussian actor's log standard deviation (CORL's IQL)."""


def is_continuous(schema: Schema) -> bool:
    """True when the schema's ``action`` field holds continuous (Box) actions (``Schema.box_actions``)."""
    return schema.box_actions


def _mlp(sizes: list[int], out_act: nn.Module | None = None) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-2], sizes[1:-1]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(sizes[-2], sizes[-1]))
    if out_act is not None:
        layers.append(out_act)
    return nn.Sequential(*layers)


def _encode(obs: Any, names: list[str]) -> torch.Tensor:
    """One float tensor ``(B, features)`` from a tensor or a dict of tensors keyed like the store."""
    if not isinstance(obs, dict):
        return obs.float() if obs.dim() == 2 else obs.flatten(1).float()
    parts = [(obs[n] if n in obs else obs[n.removeprefix("obs/")]).flatten(1).float() for n in names]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def actor_spec(schema: Schema, *, hidden: tuple[int, ...] | list[int] = (256, 256), gaussian: bool = False,
               action_low: Any = None, action_high: Any = None) -> dict[str, Any]:
    """The JSON spec of an :class:`Actor` for ``schema``'s observation and (float) action fields.

    ``action_low`` / ``action_high``: the Box bounds unit actions map to (``None``: ``[-1, 1]``).
    """
    if not is_continuous(schema):
        raise SchemaError(f"an actor needs a float `action` field (a Box action space), got "
                          f"{schema['action'].dtype if 'action' in schema else 'none'}")
    obs = [{"name": n, "shape": list(schema[n].shape), "dtype": schema[n].dtype.str} for n in schema.obs_names]
    if not obs:
        raise SchemaError("the schema has no observation field (`obs` or `obs/<key>`)")
    dim = int(math.prod(schema["action"].shape))
    low = np.broadcast_to(np.asarray(-1.0 if action_low is None else action_low, np.float64), (dim,))
    high = np.broadcast_to(np.asarray(1.0 if action_high is None else action_high, np.float64), (dim,))
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(high > low)):
        raise ValueError(f"action bounds must be finite with high > low, got low={low.tolist()} high={high.tolist()}")
    return {"kind": "actor", "obs": obs, "action_dim": dim, "action_shape": list(schema["action"].shape),
            "hidden": [int(h) for h in hidden], "gaussian": bool(gaussian),
            "action_low": low.tolist(), "action_high": high.tolist()}


class Actor(nn.Module):
    """A deterministic (TD3+BC, BC) or Gaussian (IQL) policy: ``tanh`` unit actions ``(B, action_dim)``
    from raw observations (normalized inside, see the module docstring)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__()
        if spec.get("kind") != "actor":
            raise ValueError(f"not an actor spec: kind {spec.get('kind')!r}")
        self.spec = spec
        """The actor's spec (:func:`actor_spec`): what a policy file records to rebuild it."""
        self.names = [o["name"] for o in spec["obs"]]
        """The observation fields the actor reads, in the order it concatenates them."""
        features = sum(math.prod(o["shape"]) for o in spec["obs"])
        dim = int(spec["action_dim"])
        self.net = _mlp([features, *spec["hidden"], dim], nn.Tanh())
        """The MLP from normalized features to unit actions (``tanh``)."""
        self.log_std = nn.Parameter(torch.zeros(dim)) if spec["gaussian"] else None
        """The Gaussian actor's state-independent log standard deviation per action dimension; ``None``
        for a deterministic actor."""
        self.register_buffer("obs_mean", torch.zeros(features))
        self.register_buffer("obs_std", torch.ones(features))
        low = torch.tensor(spec["action_low"], dtype=torch.float32)
        high = torch.tensor(spec["action_high"], dtype=torch.float32)
        self.register_buffer("_center", (high + low) / 2, persistent=False)
        self.register_buffer("_half", (high - low) / 2, persistent=False)

    def set_normalization(self, mean: Any, std: Any) -> None:
        """Observation statistics applied inside :meth:`forward` (flattened feature order)."""
        self.obs_mean.copy_(torch.as_tensor(np.asarray(mean, np.float32).ravel()))
        self.obs_std.copy_(torch.as_tensor(np.asarray(std, np.float32).ravel()))

    def normalize(self, obs: Any) -> torch.Tensor:
        """Normalized features ``(B, features)`` from raw observations (a tensor, or a dict keyed like the
        store): flattened in spec order, minus ``obs_mean``, over ``obs_std``."""
        return (_encode(obs, self.names) - self.obs_mean) / self.obs_std

    def forward_normalized(self, x: torch.Tensor) -> torch.Tensor:
        """Unit actions (the Gaussian's mean) from normalized features."""
        return self.net(x)

    def forward(self, obs: Any) -> torch.Tensor:
        return self.net(self.normalize(obs))

    def log_prob(self, x: torch.Tensor, unit_action: torch.Tensor) -> torch.Tensor:
        """Gaussian actor: log-density of ``unit_action`` under ``N(mean(x), exp(log_std))``, summed
        over the action's dimensions (``(B,)``)."""
        assert self.log_std is not None, "a deterministic actor has no density"
        mean = self.net(x)
        log_std = self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        z = (unit_action - mean) * torch.exp(-log_std)
        return (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def to_env(self, unit: torch.Tensor) -> torch.Tensor:
        """Unit actions mapped onto the spec's Box bounds (clipped to them)."""
        return torch.maximum(torch.minimum(unit, unit.new_ones(())), -unit.new_ones(())) * self._half + self._center


def unit_actions(action: torch.Tensor, low: Any, high: Any) -> torch.Tensor:
    """Env-scale actions in ``[low, high]`` mapped affinely to ``[-1, 1]``."""
    lo = torch.as_tensor(np.asarray(low, np.float32), device=action.device)
    hi = torch.as_tensor(np.asarray(high, np.float32), device=action.device)
    return (action.float() - (hi + lo) / 2) / ((hi - lo) / 2)


class TwinCritic(nn.Module):
    """Two independent Q networks ``Q_i(s, a)`` (each an MLP of ``hidden`` ReLU layers, initialized as
    ``nn.Linear`` is), computed together: their weights are stacked and each layer is one batched
    matmul for both. ``forward`` returns ``(2, B)``."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...] | list[int]) -> None:
        super().__init__()
        sizes = [obs_dim + action_dim, *hidden, 1]
        self.weights = nn.ParameterList()
        """Each layer's weights of both critics, stacked: ``(2, in, out)``."""
        self.biases = nn.ParameterList()
        """Each layer's biases of both critics, stacked: ``(2, 1, out)``."""
        for a, b in zip(sizes[:-1], sizes[1:]):
            pair = [nn.Linear(a, b) for _ in range(2)]  # the default initialization of each critic
            self.weights.append(nn.Parameter(torch.stack([p.weight.detach().T for p in pair]).contiguous()))
            self.biases.append(nn.Parameter(torch.stack([p.bias.detach()[None] for p in pair]).contiguous()))

    def forward(self, x: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        h = torch.cat([x, action], dim=1).expand(2, -1, -1)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = torch.baddbmm(b, h, w)
            if i < last:
                h = F.relu(h)
        return h.squeeze(-1)

    def q1(self, x: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The first critic alone ``(B,)`` (TD3+BC's actor loss)."""
        h = torch.cat([x, action], dim=1)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = torch.addmm(b[0], h, w[0])
            if i < last:
                h = F.relu(h)
        return h.squeeze(-1)


class ValueNetwork(nn.Module):
    """``V(s)`` ``(B,)``: an MLP of ``hidden`` ReLU layers (IQL)."""

    def __init__(self, obs_dim: int, hidden: tuple[int, ...] | list[int]) -> None:
        super().__init__()
        self.net = _mlp([obs_dim, *hidden, 1])
        """The MLP from normalized features to ``V(s)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


class ContinuousPolicy:
    """A loaded :class:`Actor` acting on numpy batches (``mmreplay.agent.load_policy`` returns one
    for an actor's policy file). ``meta`` is the file's meta; ``low`` / ``high`` the Box bounds
    actions come out in."""

    continuous = True
    """Always true: how the actors tell this policy from a discrete :class:`mmreplay.agent.Policy`
    (``getattr(policy, "continuous", False)``)."""
    frame_stack = 1
    """Frames per observation: 1 (an actor reads single observations)."""

    def __init__(self, net: Actor, meta: dict[str, Any], device: Any = "cpu") -> None:
        self.net = net
        """The actor."""
        self.meta = meta
        """The policy file's meta: at least ``epsilon`` and ``step``, and what training recorded (env id,
        ``algo``, ``seed``, ...)."""
        self.device = torch.device(device)
        """The device the actor runs on."""
        self.spec = net.spec
        """The actor's spec (:func:`actor_spec`)."""
        self.obs_names = tuple(net.names)
        """The observation fields the policy reads (a dict observation has these keys)."""
        self.action_dim = int(net.spec["action_dim"])
        """Dimensions of an action (flattened)."""
        self.action_shape = tuple(net.spec.get("action_shape", [self.action_dim]))
        """The shape of one action, as the store's ``action`` field has it."""
        self.low = np.asarray(net.spec["action_low"], np.float32)
        """The Box's lower bounds (float32, flattened): :meth:`act`'s actions are at least these."""
        self.high = np.asarray(net.spec["action_high"], np.float32)
        """The Box's upper bounds (float32, flattened): :meth:`act`'s actions are at most these."""

    def _tensors(self, obs: Any) -> Any:
        if not isinstance(obs, dict):
            if self.obs_names != ("obs",):
                raise SchemaError(f"this policy reads the fields {list(self.obs_names)}: pass a dict of arrays")
            obs = {"obs": obs}
        out = {}
        for o in self.spec["obs"]:
            a = obs.get(o["name"], obs.get(o["name"].removeprefix("obs/")))
            if a is None:
                raise SchemaError(f"observation field {o['name']!r} is missing (got keys {sorted(obs)})")
            a = np.asarray(a)
            if a.shape[1:] != tuple(o["shape"]):
                raise SchemaError(f"observation field {o['name']!r}: expected shape (B, "
                                  f"{', '.join(map(str, o['shape']))}), got {a.shape}")
            out[o["name"]] = torch.as_tensor(a).to(self.device)
        return out

    @torch.no_grad()
    def unit(self, obs: Any) -> np.ndarray:
        """The actor's unit actions ``(B, action_dim)`` float32 (the Gaussian's mean)."""
        return self.net(self._tensors(obs)).float().cpu().numpy()

    def act(self, obs: Any, noise_std: float = 0.0, rng: np.random.Generator | None = None) -> np.ndarray:
        """Actions at the env's scale ``(B, *action_shape)`` float32, inside the bounds. With
        ``noise_std > 0``, Gaussian exploration noise of that standard deviation is added to the unit
        actions (a fraction of each dimension's half-range, as TD3's ``expl_noise`` is of
        ``max_action``) before they are clipped and mapped."""
        u = self.unit(obs)
        if noise_std > 0:
            rng = rng if rng is not None else np.random.default_rng()
            u = u + rng.normal(0.0, noise_std, u.shape).astype(np.float32)
        u = np.clip(u, -1.0, 1.0)
        a = (u + 1.0) * ((self.high - self.low) / 2) + self.low
        return np.clip(a, self.low, self.high).astype(np.float32).reshape(len(a), *self.action_shape)
