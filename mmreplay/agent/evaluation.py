"""Greedy evaluation episodes of a Q network (or a continuous actor) in a gymnasium environment.

``evaluate`` runs ``episodes`` copies of the env side by side (one vector env, one batched
forward pass per step) until each copy has finished its first episode, and returns the
undiscounted returns. Actions are greedy (argmax Q; a continuous actor's deterministic action,
mapped to the env's Box bounds recorded in its spec); with frame stacks the stacks are built from
single frames exactly as the samplers build them (:class:`mmreplay.agent.FrameStack`). Seeds are
the caller's, so an evaluation is reproducible and does not touch the training generators.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .policy import FrameStack


def obs_to_device(obs: Any, device: torch.device) -> Any:
    """A vector env's observation batch as tensors (a dict keyed ``obs/key`` for Dict spaces)."""
    if isinstance(obs, dict):
        from .envs import flatten_obs

        return {k: torch.as_tensor(v, device=device) for k, v in flatten_obs(obs).items()}
    return torch.as_tensor(obs, device=device)


def greedy_actions(net: torch.nn.Module, obs: Any, device: torch.device) -> np.ndarray:
    """argmax_a Q(obs, a) for a batch of observations, as int64 numpy: ``QNetwork.greedy_numpy`` for a
    numpy batch on the CPU where it applies, else ``QNetwork.greedy`` when ``net`` has it, else
    ``net``'s forward."""
    if device.type == "cpu" and type(obs) is np.ndarray and (fast := getattr(net, "greedy_numpy", None)) is not None \
            and (a := fast(obs)) is not None:
        return a
    x = obs_to_device(obs, device)
    greedy = getattr(net, "greedy", None)
    if greedy is not None:  # (no gradient: its own)
        a = greedy(x)
    else:
        with torch.no_grad():
            a = net(x).argmax(dim=1)
    return a.numpy() if a.device.type == "cpu" else a.cpu().numpy()


def actor_actions(net: torch.nn.Module, obs: Any, device: torch.device) -> np.ndarray:
    """A continuous actor's actions at the env's scale (``Actor.to_env`` of its unit actions; the
    Gaussian actor's mean), as float32 numpy, for a batch of observations."""
    with torch.no_grad():
        a = net.to_env(net(obs_to_device(obs, device)))  # type: ignore[operator]
    return a.cpu().numpy().reshape(len(a), *net.spec.get("action_shape", [a.shape[1]]))  # type: ignore[union-attr]


def evaluate(
    net: torch.nn.Module,
    env_id: str,
    episodes: int,
    *,
    seed: int,
    device: torch.device,
    atari: bool | None = None,
    frame_stack: int = 1,
    max_episode_steps: int | None = None,
) -> np.ndarray:
    """Returns of ``episodes`` greedy episodes (float64, one per episode) of a ``QNetwork`` or an
    ``Actor`` (``mmreplay.agent.continuous``)."""
    from .envs import make_vec_env

    if episodes < 1:
        raise ValueError(f"`episodes` must be >= 1, got {episodes}")
    envs = make_vec_env(env_id, episodes, atari=atari, max_episode_steps=max_episode_steps)
    was_training = net.training
    net.eval()
    try:
        obs, _ = envs.reset(seed=seed)
        stack = FrameStack(frame_stack) if frame_stack > 1 else None
        x = stack.reset(obs) if stack is not None else obs
        returns = np.zeros(episodes)
        finished = np.zeros(episodes, np.bool_)
        autoreset = np.zeros(episodes, np.bool_)  # next-step autoreset: this step starts a new episode
        act = actor_actions if getattr(net, "spec", {}).get("kind") == "actor" else greedy_actions
        while not finished.all():
            obs, reward, terminated, truncated, _ = envs.step(act(net, x, device))
            returns += np.where(finished, 0.0, reward)
            ended = terminated | truncated
            finished |= ended
            x = stack.push(obs, autoreset) if stack is not None else obs
            autoreset = ended
        return returns
    finally:
        envs.close()
        net.train(was_training)
