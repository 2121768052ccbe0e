"""Environments for collection and evaluation: gymnasium ids to (vector) envs, Atari preprocessing.

Invariants:

* Atari environments (``ALE/...`` ids, or ``atari=True``) get the standard DQN preprocessing
  (``gymnasium.wrappers.AtariPreprocessing``: up to 30 no-op resets, frame skip 4 with a max-pool of
  the last two frames, 84×84 grayscale uint8) and yield **single frames**; frame stacks are rebuilt
  by the samplers (``frame_stack=4``), so a stored step costs ~7 KB, not 56 KB. Rewards are left
  unclipped: clipping is the trainer's choice.
* Vector envs use gymnasium's own classes; ``autoreset_mode`` is passed through and recorded on
  the env (``env.metadata["autoreset_mode"]``), and the collector handles all three modes.
* gymnasium (and ale-py) are imported lazily: ``import mmreplay`` does not load them.
* :class:`EnvSpec` is the one description of an env and its wrappers that collect, the actors
  (local or Ray), the trainer and the CLI pass around: a frozen, picklable value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

AutoresetName = Literal["next_step", "same_step", "disabled"]


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What env to make, how it is wrapped and how its copies reset (frozen, picklable)."""

    env: str | Callable[[], Any]
    """A gymnasium id (``"CartPole-v1"``, ``"ALE/Pong-v5"``) or a picklable callable that returns an env
    (then the Atari options do not apply)."""
    atari: bool | None = None
    """Whether the env gets the DQN Atari preprocessing (see the module docstring); ``None``: if ``env``
    is an ALE id (:func:`is_atari`)."""
    max_episode_steps: int | None = None
    """The episodes' time limit (``None``: the env's own)."""
    autoreset_mode: AutoresetName = "next_step"
    """Gymnasium's vector autoreset mode (``next_step``, ``same_step``, ``disabled``)."""
    terminal_on_life_loss: bool = False
    """Atari: a lost life ends the episode (terminated)."""
    sticky_actions: float | None = None
    """Atari: ALE's ``repeat_action_probability`` (``None``: the env's own, 0.25 for ``-v5``)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.env, str) or callable(self.env)):
            raise TypeError(f"`env` must be a gymnasium id or a callable returning an env, got {self.env!r}")
        _autoreset_name(self.autoreset_mode)  # ValueError naming the three modes

    @property
    def name(self) -> str:
        """The env's id, or the callable's qualified name (what provenance records)."""
        return self.env if isinstance(self.env, str) else getattr(self.env, "__qualname__", repr(self.env))

    @property
    def next_step(self) -> bool:
        """Gymnasium's default next-step autoreset (one row per lane per vector step)."""
        return _autoreset_name(self.autoreset_mode) == "next_step"

    def make(self) -> Any:
        """One env (:func:`make_env` for an id; the callable's env otherwise)."""
        if not isinstance(self.env, str):
            return self.env()
        return make_env(self.env, atari=self.atari, max_episode_steps=self.max_episode_steps,
                        terminal_on_life_loss=self.terminal_on_life_loss, sticky_actions=self.sticky_actions)

    def make_vec(self, num_envs: int, *, copy: bool = True) -> Any:
        """A synchronous vector env of ``num_envs`` copies, in this spec's autoreset mode."""
        if isinstance(self.env, str):
            return make_vec_env(self.env, num_envs, atari=self.atari, max_episode_steps=self.max_episode_steps,
                                autoreset_mode=self.autoreset_mode, terminal_on_life_loss=self.terminal_on_life_loss,
                                sticky_actions=self.sticky_actions, copy=copy)
        import gymnasium as gym

        return gym.vector.SyncVectorEnv([self.env] * num_envs, autoreset_mode=_autoreset(self.autoreset_mode),
                                        copy=copy)

    def spaces(self) -> tuple[Any, Any, dict[str, Any]]:
        """The observation and action spaces of one env made and closed again, and its gymnasium spec
        as JSON (``{"env_spec": ...}``, ``None`` when its kwargs cannot be written as JSON)."""
        e = self.make()
        try:
            spec = e.spec.to_json() if e.spec is not None else None
        except Exception:  # an env spec with unpicklable kwargs cannot be written as JSON
            spec = None
        try:
            return e.observation_space, e.action_space, {"env_spec": spec}
        finally:
            e.close()


def is_atari(env_id: str) -> bool:
    """True for Arcade Learning Environment ids (``ALE/Pong-v5``, ``PongNoFrameskip-v4``)."""
    return env_id.startswith("ALE/") or "NoFrameskip" in env_id


def _register_ale() -> None:
    try:
        import ale_py
    except ImportError as exc:  # pragma: no cover - depends on the extra
        raise ImportError(
            "Atari environments need ale-py and OpenCV: pip install 'mmreplay[atari]' "
            "(gymnasium[atari] and opencv-python-headless)"
        ) from exc
    import gymnasium as gym

    gym.register_envs(ale_py)


def make_env(
    env_id: str,
    *,
    atari: bool | None = None,
    max_episode_steps: int | None = None,
    terminal_on_life_loss: bool = False,
    sticky_actions: float | None = None,
    **kwargs: Any,
) -> Any:
    """Make one gymnasium env by id, with the DQN Atari preprocessing when ``atari``.

    ``atari=None`` means "if ``env_id`` is an ALE id". ``sticky_actions`` sets ALE's
    ``repeat_action_probability`` (default: the env's own, 0.25 for ``-v5``). Extra keyword
    arguments go to ``gymnasium.make``. Raises ``gymnasium.error.Error`` for an unknown id.
    """
    import gymnasium as gym

    if atari is None:
        atari = is_atari(env_id)
    if atari:
        _register_ale()
        ale_kwargs: dict[str, Any] = {"frameskip": 1, **kwargs}
        if sticky_actions is not None:
            ale_kwargs["repeat_action_probability"] = float(sticky_actions)
        env = gym.make(env_id, max_episode_steps=max_episode_steps, **ale_kwargs)
        return gym.wrappers.AtariPreprocessing(
            env, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=terminal_on_life_loss,
            grayscale_obs=True, scale_obs=False,
        )
    check_env_id(env_id)
    return gym.make(env_id, max_episode_steps=max_episode_steps, **kwargs)


def check_env_id(env_id: str) -> None:
    """Raise gymnasium's error (with its "did you mean") for an unknown id, or an ``ImportError``
    naming the extra to install, without making the env (registers ALE / MinAtar ids first)."""
    import gymnasium as gym

    if env_id.startswith("ALE/"):
        _register_ale()
    if env_id.startswith("MinAtar/") and env_id not in gym.registry:
        try:  # MinAtar registers its envs only when asked
            from minatar.gym import register_envs
        except ImportError as exc:  # pragma: no cover - depends on the extra
            raise ImportError("MinAtar environments need the minatar package: pip install 'mmreplay[minatar]'") from exc
        register_envs()
    gym.spec(env_id)


def _autoreset_name(mode: str) -> str:
    name = mode.replace("-", "_") if isinstance(mode, str) else mode
    if name not in ("next_step", "same_step", "disabled"):
        raise ValueError(f"`autoreset_mode` must be 'next_step', 'same_step' or 'disabled', got {mode!r}")
    return name


def _autoreset(mode: str) -> Any:
    from gymnasium.vector import AutoresetMode

    return {"next_step": AutoresetMode.NEXT_STEP, "same_step": AutoresetMode.SAME_STEP,
            "disabled": AutoresetMode.DISABLED}[_autoreset_name(mode)]


def make_vec_env(
    env_id: str,
    num_envs: int,
    *,
    atari: bool | None = None,
    max_episode_steps: int | None = None,
    autoreset_mode: AutoresetName = "next_step",
    vectorization: Literal["sync", "async"] = "sync",
    terminal_on_life_loss: bool = False,
    sticky_actions: float | None = None,
    copy: bool = True,
    **kwargs: Any,
) -> Any:
    """A gymnasium vector env of ``num_envs`` copies of :func:`make_env` (sync by default).

    ``copy=False`` returns the env's own observation buffer from ``step()``/``reset()`` (overwritten by
    the next step) instead of a copy: for a caller that copies each observation once anyway.

    ``vectorization="async"`` runs each copy in its own process (worth it only for slow envs;
    a collect worker is already a process of its own).
    """
    import functools

    import gymnasium as gym

    if num_envs < 1:
        raise ValueError(f"`num_envs` must be >= 1, got {num_envs}")
    fn = functools.partial(make_env, env_id, atari=atari, max_episode_steps=max_episode_steps,
                           terminal_on_life_loss=terminal_on_life_loss, sticky_actions=sticky_actions, **kwargs)
    mode = _autoreset(autoreset_mode)
    if vectorization == "sync":
        return gym.vector.SyncVectorEnv([fn] * num_envs, autoreset_mode=mode, copy=copy)
    if vectorization == "async":
        return gym.vector.AsyncVectorEnv([fn] * num_envs, autoreset_mode=mode, context="spawn", copy=copy)
    raise ValueError(f"`vectorization` must be 'sync' or 'async', got {vectorization!r}")


def flatten_obs(obs: Any, prefix: str = "obs") -> dict[str, np.ndarray]:
    """Observation(s) as the store's fields: ``{"obs": a}``, or ``{"obs/key": a, ...}`` for Dict spaces.

    Nested dicts join their keys with ``/``, the way :meth:`mmreplay.Schema.from_spaces` names them.
    """
    if isinstance(obs, dict):
        out: dict[str, np.ndarray] = {}
        for key, sub in obs.items():
            out.update(flatten_obs(sub, f"{prefix}/{key}"))
        return out
    return {prefix: np.asarray(obs)}


def unflatten_obs(fields: dict[str, np.ndarray], prefix: str = "obs") -> Any:
    """The inverse of :func:`flatten_obs`: a plain array when there is one ``obs`` field, else a nested dict."""
    if prefix in fields:
        return fields[prefix]
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if not name.startswith(prefix + "/"):
            continue
        node = out
        *parents, leaf = name[len(prefix) + 1:].split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def spaces_to_json(observation_space: Any, action_space: Any) -> dict[str, str]:
    """A JSON-able record of the spaces (their reprs), for a store's provenance metadata."""
    return {"observation_space": repr(observation_space), "action_space": repr(action_space)}
