"""One actor's loop: act in a gymnasium vector env and append every step to a store.

:func:`run_worker` is what every actor runs, in a spawned process (:mod:`mmreplay.actors`), in a
Ray actor (:mod:`mmreplay.cluster`) or in the calling process. Its policy is random, ε-greedy
around a policy file (reloaded when the file changes, frame stacks kept per lane) or a callable.

Invariants: what the store holds is exactly what the env emitted, in each gymnasium autoreset
mode (see :mod:`mmreplay.actors`); the first step of a writer goes through full validation and
small rows are gathered a few steps at a time into one ``add_batch`` (:class:`_StepBuffer`);
writers are always closed with the final observations, also after a crash, and the progress
made before a crash is reported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .envs import AutoresetName, flatten_obs

Policy = Callable[[Any], Any]
"""A policy callable: a batch of observations as the vector env returns them -> a batch of actions."""

# -- policies -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """What the actors act with: ``random``, or ε-greedy around a policy file from ``mmreplay train``.

    ``epsilon=None`` takes the ε recorded in the policy file (``meta["epsilon"]``; the online
    trainer's current ε), else 0.05. The file is re-read whenever it changes on disk
    (``reload_s`` is how often to look), so actors follow a learner that republishes its weights.
    """

    kind: Literal["random", "eps-greedy"] = "random"
    path: str | None = None
    epsilon: float | None = None
    reload_s: float = 1.0

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        """Parse ``random``, ``eps-greedy:CHECKPOINT`` or ``eps-greedy:CHECKPOINT:EPS``."""
        if text == "random":
            return cls()
        kind, sep, rest = text.partition(":")
        if kind not in ("eps-greedy", "epsilon-greedy", "greedy") or not sep or not rest:
            raise ValueError(f"policy must be 'random', 'eps-greedy:CHECKPOINT' or 'eps-greedy:CHECKPOINT:EPS', got {text!r}")
        eps: float | None = 0.0 if kind == "greedy" else None
        head, _, tail = rest.rpartition(":")
        if head:
            try:
                eps = float(tail)
                rest = head
            except ValueError:
                pass  # a ':' inside the path
        if eps is not None and not 0.0 <= eps <= 1.0:
            raise ValueError(f"policy epsilon must be in [0, 1], got {eps}")
        return cls("eps-greedy", rest, eps)

    def __str__(self) -> str:
        if self.kind == "random":
            return "random"
        return f"eps-greedy:{self.path}" + ("" if self.epsilon is None else f":{self.epsilon:g}")


class _EpsGreedy:
    """ε-greedy over a policy file, reloaded when the file changes; keeps frame stacks per lane."""

    def __init__(self, spec: PolicySpec, action_space: Any, seed: int) -> None:
        if spec.path is None:
            raise ValueError("an eps-greedy policy needs a checkpoint path")
        self.spec = spec
        self.path = Path(spec.path)
        self.action_space = action_space
        self.rng = np.random.default_rng(seed)
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        self.policy: Any = None
        self._stack: Any = None
        self._load()

    def _load(self) -> None:
        from .agent import load_policy

        st = self.path.stat()  # FileNotFoundError names the path
        stamp = (st.st_ino, st.st_mtime_ns)
        if stamp != self._stamp:
            self.policy = load_policy(str(self.path))
            self._stamp = stamp
        self._checked = time.monotonic()

    @property
    def epsilon(self) -> float:
        if self.spec.epsilon is not None:
            return self.spec.epsilon
        eps = self.policy.meta.get("epsilon")
        return 0.05 if eps is None else float(eps)

    def __call__(self, obs: Any, new_episode: np.ndarray) -> np.ndarray:
        if time.monotonic() - self._checked > self.spec.reload_s:
            with contextlib.suppress(OSError):  # a file being replaced: keep the weights we have
                self._load()
        x = flatten_obs(obs) if isinstance(obs, dict) else np.asarray(obs)
        k = self.policy.frame_stack
        if k > 1:  # the network sees k stacked single frames, clamped at episode starts
            from .agent import FrameStack

            if self._stack is None or self._stack.k != k:
                self._stack = FrameStack(k)
                x = self._stack.reset(x)
            else:
                x = self._stack.push(x, new_episode)
        actions = np.asarray(self.policy.act(x))
        n = len(new_episode)
        explore = self.rng.random(n) < self.epsilon
        if explore.any():
            actions = actions.copy()
            actions[explore] = np.asarray(self.action_space.sample())[explore]
        return actions


# -- one worker ----------------------------------------------------------------------------
@dataclasses.dataclass
class WorkerConfig:
    """Everything a worker process needs (picklable)."""

    worker: int
    env: str | Callable[[], Any]
    store: str
    steps: int | None  # env steps (rows) to store; None: until stopped
    envs: int
    seed: int
    policy: PolicySpec | Policy
    atari: bool | None
    max_episode_steps: int | None
    autoreset_mode: AutoresetName
    durability: str
    terminal_on_life_loss: bool = False
    sticky_actions: float | None = None
    report_s: float = 0.25


def _make_vec(cfg: WorkerConfig) -> Any:
    from .envs import make_vec_env

    if isinstance(cfg.env, str):
        return make_vec_env(cfg.env, cfg.envs, atari=cfg.atari, max_episode_steps=cfg.max_episode_steps,
                            autoreset_mode=cfg.autoreset_mode, terminal_on_life_loss=cfg.terminal_on_life_loss,
                            sticky_actions=cfg.sticky_actions)
    import gymnasium as gym

    from .envs import _autoreset

    return gym.vector.SyncVectorEnv([cfg.env] * cfg.envs, autoreset_mode=_autoreset(cfg.autoreset_mode))


def _row(obs: Any, action: Any, reward: Any, term: Any, trunc: Any) -> dict[str, Any]:
    return {**flatten_obs(obs), "action": action, "reward": reward, "terminated": term, "truncated": trunc}


def _take(tree: Any, idx: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _take(v, idx) for k, v in tree.items()}
    return np.asarray(tree)[idx]


def run_worker(
    cfg: WorkerConfig,
    report: Callable[[str, Any], None],
    should_stop: Callable[[], bool],
    may_step: Callable[[int], bool] | None = None,
) -> None:
    """Run one actor: step a vector env, act, append to the store, report progress.

    ``report(kind, payload)`` receives ``("progress", {...})`` about every ``report_s`` and at the
    end. ``may_step(n)`` (optional) is asked before each vector step of ``n`` env steps; while it
    is False the actor waits (the trainer's samples-per-insert limit).
    """
    from .store import open_store

    store = open_store(cfg.store, mode="a")
    envs = _make_vec(cfg)
    E = cfg.envs
    next_step = cfg.autoreset_mode.replace("-", "_") == "next_step"
    disabled = cfg.autoreset_mode.replace("-", "_") == "disabled"
    if isinstance(cfg.policy, PolicySpec) and cfg.policy.kind == "eps-greedy":
        act: Any = _EpsGreedy(cfg.policy, envs.action_space, cfg.seed + 7919 * (cfg.worker + 1))
    elif isinstance(cfg.policy, PolicySpec):
        envs.action_space.seed(cfg.seed + cfg.worker)
        act = lambda obs, new: envs.action_space.sample()  # noqa: E731
    else:
        user = cfg.policy
        act = lambda obs, new: user(obs)  # noqa: E731
    # next-step: one writer, E lanes; same-step/disabled: lanes drift apart, one writer per copy
    writers = [store.writer(lanes=E, durability=cfg.durability, cast="safe")] if next_step else [
        store.writer(lanes=1, durability=cfg.durability, cast="safe") for _ in range(E)]
    row_bytes = store.layout.record_bytes
    stats = {"steps": 0, "transitions": 0, "episodes": 0, "returns": [], "bytes": 0}
    sent = dict(stats)
    last_report = time.monotonic()

    def flush_report(final: bool = False) -> None:
        nonlocal last_report
        delta = {k: stats[k] - sent[k] for k in ("steps", "transitions", "episodes", "bytes")}
        delta["returns"] = stats["returns"]
        delta["final"] = final
        delta["loop_s"] = time.perf_counter() - t_loop
        report("progress", delta)
        sent.update({k: stats[k] for k in ("steps", "transitions", "episodes", "bytes")})
        stats["returns"] = []
        last_report = time.monotonic()

    obs = None
    t_loop = time.perf_counter()
    try:
        obs, _ = envs.reset(seed=[cfg.seed + cfg.worker * E + j for j in range(E)])
        t_loop = time.perf_counter()  # the loop's rate: without env creation and the seeded reset
        ep_return = np.zeros(E)
        prev_done = np.zeros(E, bool)
        new_episode = np.ones(E, bool)  # obs is an episode's first observation (frame stacks restart)
        n_prev_done = 0
        dict_obs = isinstance(obs, dict)
        add = writers[0].add if next_step else None
        if next_step:  # small rows: gather a few steps, then one add_batch (a third of the cost per step)
            T = max(1, min(16, 65536 // (E * row_bytes)))
            if T > 1:
                add = _StepBuffer(writers[0], T).add
        budget = math.inf if cfg.steps is None else cfg.steps
        steps = 0
        while steps < budget and not should_stop():
            if may_step is not None and not may_step(E):
                time.sleep(0.001)
                if time.monotonic() - last_report >= cfg.report_s:
                    flush_report()
                continue
            action = act(obs, new_episode)
            next_obs, reward, term, trunc, info = envs.step(action)
            done = term | trunc
            if next_step:  # one row per lane (keywords: the writer's fast path)
                if dict_obs:
                    add(**flatten_obs(obs), action=action, reward=reward, terminated=term, truncated=trunc)
                else:
                    add(obs=obs, action=action, reward=reward, terminated=term, truncated=trunc)
                # an autoreset step (the one after a done) has reward 0 and is no transition
                stats["transitions"] += E - n_prev_done
            else:
                stats["transitions"] += E
                # same-step: the final observations are in info; disabled: next_obs until we reset
                zero = np.zeros(1, np.float64)
                for j in range(E):
                    a = action[j:j + 1]
                    writers[j].add(_row(_take(obs, [j]), a, reward[j:j + 1], term[j:j + 1], trunc[j:j + 1]))
                    if done[j]:  # the episode's final observation is its own (last) row of the lane
                        final = _take(next_obs, [j]) if disabled else _one_lane(info["final_obs"][j])
                        writers[j].add(_row(final, a, zero, [False], [False]))
                if disabled and done.any():  # reset_mask resets those copies, returns the whole batch
                    next_obs, _ = envs.reset(options={"reset_mask": done})
            ep_return += reward
            n_prev_done = int(np.count_nonzero(done))
            if n_prev_done:
                stats["episodes"] += n_prev_done
                stats["returns"].extend(ep_return[done].tolist())
                ep_return[done] = 0.0
            # next-step: a lane done last step was reset by this one; otherwise done lanes were reset now
            new_episode = prev_done if next_step else done
            prev_done = done
            steps += E
            stats["steps"] = steps
            obs = next_obs
            if time.monotonic() - last_report >= cfg.report_s:
                stats["bytes"] = steps * row_bytes
                flush_report()
        stats["bytes"] = steps * row_bytes
    finally:
        try:
            if next_step and add is not None and hasattr(add, "__self__") and isinstance(add.__self__, _StepBuffer):
                add.__self__.flush()
            for j, w in enumerate(writers):
                if obs is None:
                    w.close()
                else:  # keep the final observations: the last steps become transitions
                    w.close(last_obs=obs if next_step else _take(obs, [j]))
        finally:
            envs.close()
            store.close()
            flush_report(final=True)  # also after a crash: what was written before it is stored


class _StepBuffer:
    """Gathers ``T`` vector steps and appends them with one ``add_batch``.

    The first step goes through ``Writer.add`` (full validation, clear errors); later steps are
    copied with ``casting="safe"`` (no silent lossy cast) and validated again by ``add_batch``
    (non-finite values), so a bad step costs at most the ``T - 1`` steps gathered before it.
    """

    def __init__(self, writer: Any, T: int) -> None:
        self.writer = writer
        self.T = T
        self.k = -1  # -1: the first step is not buffered
        self.bufs = {f.name: np.empty((T, writer.lanes, *f.shape), f.dtype) for f in writer.schema.fields}

    def add(self, **fields: Any) -> None:
        k = self.k
        if k < 0:
            self.writer.add(**fields)
            self.k = 0
            return
        bufs = self.bufs
        for name, x in fields.items():
            np.copyto(bufs[name][k], x, casting="safe")
        self.k = k = k + 1
        if k == self.T:
            self.flush()

    def flush(self) -> None:
        if self.k > 0:
            self.writer.add_batch({n: b[: self.k] for n, b in self.bufs.items()})
            self.k = 0


def _one_lane(x: Any) -> Any:
    """One env's observation (array or nested dict) batched as a single lane."""
    if isinstance(x, dict):
        return {k: _one_lane(v) for k, v in x.items()}
    return np.asarray(x)[None]
