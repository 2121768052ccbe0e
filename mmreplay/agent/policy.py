"""Q networks for discrete actions, and policy files that rebuild them (or a continuous actor,
``mmreplay.agent.continuous``) without the training config.

Networks (:class:`QNetwork`) are built from a small JSON-able *spec* (:func:`network_spec`):

* ``kind="mlp"``: every observation field (a frame stack of it if ``frame_stack > 1``) is
  flattened, cast to float and concatenated, then hidden ReLU layers;
* ``kind="cnn"``: the Nature DQN encoder (Mnih et al. 2015: 32×8×8/4, 64×4×4/2, 64×3×3/1,
  512) over one uint8 image field; the frames travel as uint8 and are scaled by 1/255 **on the
  network's device**, inside ``forward``;
* the head is a linear layer to ``n_actions`` Q-values, or a dueling head
  (Wang et al. 2016: ``V(s) + A(s, a) - mean_a A(s, a)``).

Policy file (``save_policy`` / ``load_policy``): a ``torch.save`` payload holding only tensors
and strings (so ``torch.load(weights_only=True)`` reads it) with the keys ``format``
(``"mmreplay-policy"``), ``version``, ``spec_json`` (the network spec), ``state_dict`` and
``meta_json`` (at least ``epsilon`` and ``step``). It is written atomically (temp file, fsync,
rename, fsync of the directory), so a reader that polls the path sees either the old or the new
file, never a torn one. Training checkpoints (``mmreplay.train``) carry the same keys plus the
training state, so ``load_policy`` also opens a checkpoint.

Observations given to :class:`Policy` are a batch: an array ``(B, *obs_shape)`` for a single
``obs`` field, or a dict keyed like the store (``{"obs/key": array}``, plain ``{"key": ...}`` is
accepted too). With ``frame_stack = k > 1`` the network wants ``(B, k, *obs_shape)``;
:class:`FrameStack` builds those stacks from single frames of a vector env, clamped at episode
starts exactly as the samplers clamp them.
"""

from __future__ import annotations

import io
import json
import math
import os
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..core.errors import SchemaError
from ..core.fs import atomic_write

if TYPE_CHECKING:
    from ..core.schema import Schema

__all__ = ["FrameStack", "Policy", "QNetwork", "epsilon_greedy", "load_policy", "network_spec", "save_policy"]

POLICY_FORMAT = "mmreplay-policy"
POLICY_VERSION = 1


# -- networks -------------------------------------------------------------------------------------
def network_spec(
    schema: Schema,
    n_actions: int,
    *,
    frame_stack: int = 1,
    hidden: tuple[int, ...] | list[int] = (256, 256),
    dueling: bool = False,
    cnn: bool | None = None,
    minatar: bool = False,
) -> dict[str, Any]:
    """The spec of a Q network for a store's observation fields (JSON-able, see module docstring).

    ``cnn=None`` picks the Nature CNN when there is one uint8 observation field of 2 or 3
    dimensions (``(H, W)`` grayscale or ``(C, H, W)``), the MLP otherwise. ``minatar``: the MinAtar
    network (one 3x3 convolution of 16 channels, stride 1, then 128 units; Young & Tian 2019) over
    one bool or uint8 field of ``(H, W, C)`` frames, MinAtar's layout (channels last).
    """
    if not isinstance(n_actions, (int, np.integer)) or n_actions < 1:
        raise ValueError(f"`n_actions` must be a positive int, got {n_actions!r}")
    if frame_stack < 1:
        raise ValueError(f"`frame_stack` must be >= 1, got {frame_stack}")
    obs = [{"name": n, "shape": list(schema[n].shape), "dtype": schema[n].dtype.str} for n in schema.obs_names]
    if not obs:
        raise SchemaError("the schema has no observation field (`obs` or `obs/<key>`)")
    if minatar:
        if len(obs) != 1 or np.dtype(obs[0]["dtype"]) not in (np.bool_, np.uint8) or len(obs[0]["shape"]) != 3:
            raise SchemaError(f"the MinAtar network needs one bool or uint8 observation field of shape (H, W, C), got {obs}")
        return {"kind": "minatar", "obs": obs, "n_actions": int(n_actions), "frame_stack": int(frame_stack),
                "hidden": [128], "dueling": bool(dueling)}
    image = len(obs) == 1 and np.dtype(obs[0]["dtype"]) == np.uint8 and len(obs[0]["shape"]) in (2, 3)
    if cnn is None:
        cnn = image
    if cnn and not image:
        raise SchemaError(f"the CNN needs one uint8 observation field of shape (H, W) or (C, H, W), got {obs}")
    return {"kind": "cnn" if cnn else "mlp", "obs": obs, "n_actions": int(n_actions), "frame_stack": int(frame_stack),
            "hidden": [int(h) for h in hidden], "dueling": bool(dueling)}


class QNetwork(nn.Module):
    """Q-values ``(B, n_actions)`` from a batch of observations (a tensor, or a dict of tensors
    keyed by the store's field names). Built from :func:`network_spec`."""

    encoder: nn.Sequential
    """The layers from the observations to the features the head reads: the Nature CNN, the MinAtar
    network or the MLP (see the module docstring)."""
    head: nn.Linear
    """The linear layer to the Q-values (without a dueling head)."""
    value: nn.Linear
    """The dueling head's ``V(s)`` (a dueling network only)."""
    advantage: nn.Linear
    """The dueling head's ``A(s, a)`` (a dueling network only)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__()
        self.spec = spec
        """The network's spec (:func:`network_spec`): what a policy file records to rebuild it."""
        self.names = [o["name"] for o in spec["obs"]]
        """The observation fields the network reads, in the order it concatenates them."""
        k = int(spec["frame_stack"])
        if spec["kind"] == "cnn":
            shape = spec["obs"][0]["shape"]
            channels = k * (shape[0] if len(shape) == 3 else 1)
            h, w = shape[-2:]
            self.encoder = nn.Sequential(
                nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(),
                nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
                nn.Flatten(),
            )
            with torch.no_grad():
                flat = self.encoder(torch.zeros(1, channels, h, w)).shape[1]
            self.encoder.append(nn.Linear(flat, 512))
            self.encoder.append(nn.ReLU())
            features = 512
        elif spec["kind"] == "minatar":  # (H, W, C) frames, k stacked: k * C input channels
            h, w, c = spec["obs"][0]["shape"]
            self.encoder = nn.Sequential(nn.Conv2d(k * c, 16, 3, stride=1), nn.ReLU(), nn.Flatten(),
                                         nn.Linear(16 * (h - 2) * (w - 2), 128), nn.ReLU())
            features = 128
        else:
            layers: list[nn.Module] = []
            features = sum(k * math.prod(o["shape"]) for o in spec["obs"])
            for width in spec["hidden"]:
                layers += [nn.Linear(features, width), nn.ReLU()]
                features = width
            self.encoder = nn.Sequential(*layers)
        n = int(spec["n_actions"])
        if spec["dueling"]:
            self.value = nn.Linear(features, 1)
            self.advantage = nn.Linear(features, n)
        else:
            self.head = nn.Linear(features, n)
        # the acting chain (``greedy``): an MLP's linear layers, in order (the same modules, not copies)
        self._chain = (*(m for m in self.encoder if isinstance(m, nn.Linear)), self.head) \
            if spec["kind"] == "mlp" and not spec["dueling"] else None
        # forward of the MinAtar encoder: its convolution and linear layer, called as functions (the same modules)
        self._minatar = (self.encoder[0], self.encoder[3]) if spec["kind"] == "minatar" else None
        # greedy_numpy: the chain's parameters, their addresses when viewed, and the numpy views (weight.T, bias)
        self._np_params: list[torch.Tensor] = []
        self._np_key: list[int] = []
        self._np_chain: list[tuple[np.ndarray, np.ndarray]] = []

    def encode_input(self, obs: Any) -> torch.Tensor:
        """One float tensor ``(B, ...)`` from the observation fields (uint8 frames scaled here)."""
        if self.spec["kind"] == "cnn":
            x = _field(obs, self.names[0]) if isinstance(obs, dict) else obs
            x = x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()
            if x.dim() == 5:  # (B, k, C, H, W) -> (B, k*C, H, W)
                x = x.flatten(1, 2)
            elif x.dim() == 3:  # (B, H, W): one grayscale frame
                x = x.unsqueeze(1)
            return x
        if self.spec["kind"] == "minatar":  # (B, [k,] H, W, C) -> (B, k*C, H, W)
            x = (_field(obs, self.names[0]) if isinstance(obs, dict) else obs).float()
            x = x.movedim(-1, -3)
            return x.flatten(1, 2) if x.dim() == 5 else x
        if not isinstance(obs, dict):
            return obs.float() if obs.dim() == 2 else obs.flatten(1).float()
        parts = [_field(obs, n).flatten(1).float() for n in self.names]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def forward(self, obs: Any) -> torch.Tensor:
        x = self.encode_input(obs)
        if self._minatar is not None:  # a module call costs ~3 us: 10-20 us of a 45-65 us one-row forward
            conv, lin = self._minatar
            z = F.relu(F.linear(F.relu(F.conv2d(x, conv.weight, conv.bias)).flatten(1), lin.weight, lin.bias))
        else:
            z = self.encoder(x)
        if self.spec["dueling"]:
            a = self.advantage(z)
            return self.value(z) + a - a.mean(dim=1, keepdim=True)
        return self.head(z)

    def greedy(self, obs: Any) -> torch.Tensor:
        """``argmax_a Q(obs, a)`` (int64, no gradient): the acting forward pass. An MLP without a
        dueling head runs as its chain of ``linear`` + ReLU with the same weights, one op each (the
        modules' call overhead is most of a one-row forward: an ad-hoc timing gave ~22 µs against
        ~40 µs for a 120-84 MLP); anything else is ``forward``."""
        with torch.no_grad():
            if self._chain is None or isinstance(obs, dict):
                return self(obs).argmax(dim=1)
            h = obs if obs.dim() == 2 and obs.dtype == torch.float32 else obs.flatten(1).float()
            *hidden, head = self._chain
            for lin in hidden:
                h = F.linear(h, lin.weight, lin.bias).relu_()
            return F.linear(h, head.weight, head.bias).argmax(dim=1)

    def greedy_numpy(self, obs: np.ndarray) -> np.ndarray | None:
        """``greedy`` in numpy for float32 observations ``(B, ...)`` of an MLP whose parameters are in
        CPU memory (int64 actions), else ``None``. A few-row forward through a small MLP is mostly
        per-op overhead, about 3x less in numpy than in torch (an ad-hoc timing of a one-row 120-84
        MLP: ~8 µs against ~27 µs). The weights are read through numpy views of the parameters,
        so every optimizer step is seen; the same float32 math as ``forward`` (the last bits may
        differ, as between BLAS libraries)."""
        if self._chain is None or obs.dtype != np.float32 or obs.ndim < 2:
            return None
        params = self._np_params
        if not params:  # the chain's parameter tensors, in order (read per call: no module attribute lookups)
            params = self._np_params = [p for lin in self._chain for p in (lin.weight, lin.bias)]
        key = [p.data_ptr() for p in params]
        if key != self._np_key:  # first call, or parameters moved: new views (or none off the CPU)
            if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in params):
                return None
            v = [p.detach().numpy() for p in params]
            self._np_chain, self._np_key = [(v[i].T, v[i + 1]) for i in range(0, len(v), 2)], key
        h = obs.reshape(len(obs), -1)
        *hidden, (w, b) = self._np_chain
        for wh, bh in hidden:
            h = h @ wh
            h += bh
            np.maximum(h, 0, out=h)
        h = h @ w
        h += b
        return h.argmax(axis=1)


def _field(obs: dict[str, Any], name: str) -> Any:
    """A field of a dict observation keyed like the store (``obs/key``) or like a batch (``key``)."""
    return obs[name] if name in obs else obs[name.removeprefix("obs/")]


# -- policy files ---------------------------------------------------------------------------------
def _jsonable(meta: dict[str, Any]) -> dict[str, Any]:
    try:
        return json.loads(json.dumps(meta))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"policy meta must be JSON-serialisable: {exc}") from None


def policy_payload(net: QNetwork, *, epsilon: float | None = None, step: int = 0, **meta: Any) -> dict[str, Any]:
    """The policy keys of a policy file or checkpoint (tensors copied to the CPU)."""
    from .continuous import Actor

    if isinstance(net, nn.Module) and not isinstance(net, (QNetwork, Actor)):
        net = getattr(net, "_orig_mod", net)  # torch.compile wrapper
    if not isinstance(net, (QNetwork, Actor)):
        q = getattr(net, "q", None) or getattr(net, "actor", None)
        if not isinstance(q, nn.Module):
            raise TypeError(f"expected a QNetwork or an Actor (or an object with a `.q` / `.actor` one), "
                            f"got {type(net).__name__}")
        net = getattr(q, "_orig_mod", q)
    info = _jsonable({**meta, "epsilon": None if epsilon is None else float(epsilon), "step": int(step)})
    state = {k: v.detach().to("cpu", copy=True) for k, v in net.state_dict().items()}
    return {"format": POLICY_FORMAT, "version": POLICY_VERSION, "spec_json": json.dumps(net.spec),
            "state_dict": state, "meta_json": json.dumps(info)}


def save_torch_atomic(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """``torch.save`` to a temp file, fsync, rename over ``path``, fsync the directory."""
    buf = io.BytesIO()
    torch.save(payload, buf)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(p, buf.getvalue())


def save_policy(path: str | os.PathLike[str], net_or_agent: Any, *, epsilon: float | None = None, step: int = 0,
                **meta: Any) -> None:
    """Write a self-describing policy file atomically (see the module docstring).

    Parameters
    ----------
    net_or_agent
        A :class:`QNetwork` (or a ``torch.compile`` of one, or any object with a ``.q`` one).
    epsilon
        Exploration rate the actors should use with this policy (``None``: greedy / not set).
    step
        Training step the weights come from (env steps online, updates offline).
    meta
        Further JSON-serialisable facts (env id, algo, seed), returned in ``Policy.meta``.
    """
    save_torch_atomic(path, policy_payload(net_or_agent, epsilon=epsilon, step=step, **meta))


def read_payload(path: str | os.PathLike[str], device: Any = "cpu") -> dict[str, Any]:
    """The raw payload of a policy file or checkpoint (``weights_only`` load)."""
    try:
        payload = torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise ValueError(f"{path} is not a readable mmreplay policy file or checkpoint: {exc}") from None
    if not isinstance(payload, dict) or payload.get("format") != POLICY_FORMAT:
        raise ValueError(f"{path} is not an mmreplay policy file (format {payload.get('format')!r})"
                         if isinstance(payload, dict) else f"{path} is not an mmreplay policy file")
    if int(payload.get("version", 0)) > POLICY_VERSION:
        raise ValueError(f"{path}: policy file version {payload['version']}, this mmreplay reads {POLICY_VERSION}")
    return payload


def load_policy(path: str | os.PathLike[str], device: Any = "cpu") -> Any:
    """Rebuild the network of a policy file (or a training checkpoint) on ``device``: a
    :class:`Policy` over a Q network, or a :class:`mmreplay.agent.continuous.ContinuousPolicy` over
    the actor that ``mmreplay train --offline --algo td3bc|iql|bc`` saves for Box actions."""
    payload = read_payload(path, device)
    spec = json.loads(payload["spec_json"])
    if spec.get("kind") == "actor":
        from .continuous import Actor, ContinuousPolicy

        actor = Actor(spec)
        actor.load_state_dict(payload["state_dict"])
        actor.to(device).eval()
        return ContinuousPolicy(actor, json.loads(payload["meta_json"]), device)
    net = QNetwork(spec)
    net.load_state_dict(payload["state_dict"])
    net.to(device).eval()
    return Policy(net, json.loads(payload["meta_json"]), device)


class Policy:
    """A loaded Q network acting on numpy batches (see :func:`load_policy`).

    ``meta`` holds at least ``epsilon`` (float or ``None``) and ``step``; ``n_actions`` and
    ``frame_stack`` come from the network spec.
    """

    def __init__(self, net: QNetwork, meta: dict[str, Any], device: Any = "cpu") -> None:
        self.net = net
        """The Q network."""
        self.meta = meta
        """The policy file's meta: at least ``epsilon`` and ``step``, and what training recorded (env id,
        ``algo``, ``seed``, ...)."""
        self.device = torch.device(device)
        """The device the network runs on."""
        self.spec = net.spec
        """The network's spec (:func:`network_spec`)."""
        self.n_actions = int(net.spec["n_actions"])
        """Number of discrete actions."""
        self.frame_stack = int(net.spec["frame_stack"])
        """Frames per observation the network wants (``(B, k, *obs_shape)`` when above 1: :class:`FrameStack`)."""
        self.obs_names = tuple(net.names)
        """The observation fields the policy reads (a dict observation has these keys)."""
        o = self.spec["obs"][0]
        # a plain observation batch's shape after B (greedy's numpy path: one field, an MLP on the CPU)
        self._plain = (tuple(o["shape"]) if self.frame_stack == 1 else (self.frame_stack, *o["shape"])) \
            if self.obs_names == ("obs",) and self.device.type == "cpu" else None

    def _tensors(self, obs: Any) -> dict[str, torch.Tensor]:
        k = self.frame_stack
        if not isinstance(obs, dict):
            if self.obs_names != ("obs",):
                raise SchemaError(f"this policy reads the fields {list(self.obs_names)}: pass a dict of arrays")
            obs = {"obs": obs}
        out: dict[str, torch.Tensor] = {}
        batch = None
        for o in self.spec["obs"]:
            name = o["name"]
            a = obs.get(name, obs.get(name.removeprefix("obs/")))
            if a is None:
                raise SchemaError(f"observation field {name!r} is missing (got keys {sorted(obs)})")
            a = np.asarray(a)
            want = tuple(o["shape"]) if k == 1 else (k, *o["shape"])
            if a.shape[1:] != want or (batch is not None and len(a) != batch):
                raise SchemaError(f"observation field {name!r}: expected shape (B, {', '.join(map(str, want))})"
                                  f"{' (a frame stack: see mmreplay.agent.FrameStack)' if k > 1 else ''}, "
                                  f"got {a.shape}")
            batch = len(a)
            out[name] = torch.as_tensor(a).to(self.device)
        return out

    @torch.no_grad()
    def q_values(self, obs: Any) -> np.ndarray:
        """Q-values ``(B, n_actions)`` as float32 numpy for a batch of observations."""
        return self.net(self._tensors(obs)).float().cpu().numpy()

    def greedy(self, obs: Any) -> np.ndarray:
        """Greedy actions ``(B,)`` int64 for a batch of observations."""
        if type(obs) is np.ndarray and obs.shape[1:] == self._plain and (a := self.net.greedy_numpy(obs)) is not None:
            return a  # (QNetwork.greedy_numpy: an MLP on the CPU, float32 observations)
        return self.q_values(obs).argmax(axis=1).astype(np.int64)

    def act(self, obs: Any, epsilon: float = 0.0, rng: np.random.Generator | None = None) -> np.ndarray:
        """Greedy actions ``(B,)`` int64; with ``epsilon > 0``, epsilon-greedy drawn from ``rng`` (the
        network runs only when some observation is acted on greedily)."""
        if epsilon <= 0:
            return self.greedy(obs)
        n = len(next(iter(obs.values()))) if isinstance(obs, dict) else len(obs)
        return epsilon_greedy(partial(self.greedy, obs), self.n_actions, epsilon,
                              rng if rng is not None else np.random.default_rng(), n)


def epsilon_greedy(greedy: Any, n_actions: int, epsilon: float, rng: np.random.Generator,
                   n: int | None = None) -> np.ndarray:
    """Replace each action by a uniform one with probability ``epsilon`` (vectorized).

    ``greedy``: the greedy actions ``(B,)``, or a function returning them, called only when some
    lane does not explore (then give ``n = B``). One uniform draw ``u`` per lane decides both: a
    lane explores when ``u < epsilon``, and then takes action ``floor(u / epsilon * n_actions)``
    (``u / epsilon`` is uniform on [0, 1) given ``u < epsilon``, independent of the decision).
    Returns int64 ``(B,)``.
    """
    if n is None:
        n = len(greedy)
    if n == 1:  # one env: the same draw as a Python float (no array ops); rng.random() is rng.random(1)[0]
        v = rng.random()
        if v < epsilon:
            return np.array([min(int(v * (n_actions / epsilon)), n_actions - 1)], np.int64)
        return np.asarray(greedy() if callable(greedy) else greedy, dtype=np.int64)
    u = rng.random(n)
    explore = u < epsilon
    if not explore.any():
        return np.asarray(greedy() if callable(greedy) else greedy, dtype=np.int64)
    rand = np.minimum((u * (n_actions / epsilon)).astype(np.int64), n_actions - 1)
    if explore.all():
        return rand
    g = greedy() if callable(greedy) else greedy
    return np.where(explore, rand, np.asarray(g)).astype(np.int64, copy=False)


class FrameStack:
    """Stacks of the last ``k`` single frames per env of a vector env, for acting.

    ``reset(obs)`` starts every lane; ``push(obs, new_episode)`` appends a step's frames, and
    lanes flagged ``new_episode`` (their obs is the first of an episode: with next-step autoreset,
    the lanes whose previous step ended) restart with that frame repeated ``k`` times, which is
    how the samplers clamp stacks at an episode start. Returns ``(B, k, *shape)`` arrays (a dict
    of them for dict observations); each call returns a fresh array.
    """

    def __init__(self, k: int) -> None:
        if k < 1:
            raise ValueError(f"`k` must be >= 1, got {k}")
        self.k = k
        """Frames per stack."""
        self._buf: dict[str, np.ndarray] = {}

    def reset(self, obs: Any) -> Any:
        """Start every lane at ``obs`` (its frame repeated ``k`` times); returns the stacks."""
        items = obs.items() if isinstance(obs, dict) else [("", obs)]
        self._buf = {key: np.repeat(np.asarray(a)[:, None], self.k, axis=1) for key, a in items}
        return self._out(obs)

    def push(self, obs: Any, new_episode: np.ndarray | None = None) -> Any:
        """Append a step's frames ``obs``; lanes flagged in ``new_episode`` restart with their frame
        repeated ``k`` times. Returns the stacks (before any :meth:`reset`, the same as one)."""
        if not self._buf:
            return self.reset(obs)
        items = obs.items() if isinstance(obs, dict) else [("", obs)]
        for key, a in items:
            a = np.asarray(a)
            buf = self._buf[key]
            buf[:, :-1] = buf[:, 1:]
            buf[:, -1] = a
            if new_episode is not None and new_episode.any():
                buf[new_episode] = a[new_episode][:, None]
        return self._out(obs)

    def _out(self, obs: Any) -> Any:
        if isinstance(obs, dict):
            return {key: b.copy() for key, b in self._buf.items()}
        return self._buf[""].copy()
