"""Actors: processes that step gymnasium vector envs and append every step to a store.

:func:`collect` is the library form of ``mmreplay collect``; :class:`ActorPool` runs the same
actors for an online trainer, without a step budget, under a samples-per-insert limit.

Invariants:

* Each worker is a **spawned** process (never forked) with its own vector env of ``E`` copies and
  its own :class:`~mmreplay.Writer`; workers share nothing but the store directory, so two
  ``collect`` runs (or two terminals) on one store just add data.
* What the store holds is exactly what the env emitted. With gymnasium's default next-step
  autoreset one writer with ``E`` lanes stores each vector step as one row per lane (the row after
  a done is the episode's final observation). Same-step autoreset and disabled autoreset emit two
  rows for a lane that ends an episode (its last transition and its final observation from
  ``info["final_obs"]``); lanes then drift apart in time, so those modes use one single-lane writer
  per env copy. Termination and truncation are kept apart in every mode.
* Every published row survives Ctrl-C (workers are told to stop, finish their step and close
  their writers, keeping the final observations) and a crash of any other worker. A worker also
  stops when its parent dies. A crashed worker is reported; the others finish.
* Seeds: env copy ``j`` of worker ``w`` is reset with ``seed + w * E + j`` and the random policy's
  action space with ``seed + w``; the seed, env id, spaces, policy and mmreplay version of every run
  go to a provenance record in the store (:meth:`ReplayStore.provenance`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import pickle
import queue as queue_mod
import signal
import sys
import threading
import time
import traceback
from collections import deque
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


@dataclasses.dataclass
class CollectResult:
    """What a collect run stored, per run and per worker."""

    steps: int
    """Env steps stored (rows written, one per env copy per vector step)."""
    transitions: int
    """Of those, steps that are sampleable transitions (the autoreset steps of next-step mode are not)."""
    episodes: int
    episode_returns: list[float]
    seconds: float
    bytes_written: int
    seed: int
    interrupted: bool = False
    errors: dict[int, str] = dataclasses.field(default_factory=dict)
    provenance: str | None = None
    loop_seconds: float = 0.0
    """The longest worker's stepping loop (no process start-up, env creation or store opening)."""

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


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


# -- processes -----------------------------------------------------------------------------
def _worker_process(cfg: WorkerConfig, q: Any, stop: Any, counts: Any, allowed: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; Ctrl-C goes to the group
    parent = os.getppid()
    w = cfg.worker

    def report(kind: str, payload: Any) -> None:
        q.put((kind, w, payload))

    def should_stop() -> bool:
        return stop.is_set() or os.getppid() != parent

    def may_step(n: int) -> bool:  # counts steps as they are taken: the limit is exact, not per report
        limit = allowed.value
        if limit >= 0 and sum(counts[:]) + n > limit:
            return False
        counts[w] += n
        return True

    try:
        run_worker(cfg, report, should_stop, may_step if allowed is not None else None)
    except BaseException:
        q.put(("error", w, traceback.format_exc()))
        raise SystemExit(1) from None
    q.put(("exit", w, None))


def _spawn(cfgs: list[WorkerConfig], *, limited: bool) -> tuple[Any, Any, Any, Any, list[Any]]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    stop = ctx.Event()
    counts = ctx.Array("q", len(cfgs), lock=False)
    allowed = ctx.Value("q", -1, lock=False) if limited else None
    procs = [ctx.Process(target=_worker_process, args=(c, q, stop, counts, allowed), name=f"mmreplay-actor-{c.worker}",
                         daemon=True) for c in cfgs]
    for p in procs:
        p.start()
    return q, stop, counts, allowed, procs


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def _env_spaces(env: str | Callable[[], Any], atari: bool | None, max_episode_steps: int | None,
                terminal_on_life_loss: bool, sticky_actions: float | None) -> tuple[Any, Any, dict[str, Any]]:
    from .envs import make_env

    e = (make_env(env, atari=atari, max_episode_steps=max_episode_steps, terminal_on_life_loss=terminal_on_life_loss,
                  sticky_actions=sticky_actions) if isinstance(env, str) else env())
    try:
        spec = e.spec.to_json() if e.spec is not None else None
    except Exception:  # an env spec with unpicklable kwargs cannot be written as JSON
        spec = None
    try:
        return e.observation_space, e.action_space, {"env_spec": spec}
    finally:
        e.close()


def open_or_create(path: str | os.PathLike[str], observation_space: Any, action_space: Any, *,
                   capacity: int = 1_000_000, metadata: dict[str, Any] | None = None,
                   segment_records: int | None = None) -> Any:
    """Open the store at ``path`` for appending, or create it from the spaces if it does not exist.

    An existing store must have the schema the spaces give (``SchemaError`` lists the
    differences); two processes creating it at once both end up appending to one store.
    """
    from .errors import SchemaError, StoreExistsError
    from .schema import Schema
    from .store import create_store, open_store

    schema = Schema.from_spaces(observation_space, action_space)
    p = Path(path)
    if not p.exists():
        try:
            return create_store(p, schema, capacity, metadata=metadata, segment_records=segment_records)
        except StoreExistsError:
            pass
    store = open_store(p, mode="a")
    if store.schema.hash != schema.hash:
        have = {f.name: (str(f.dtype), f.shape) for f in store.schema.fields}
        want = {f.name: (str(f.dtype), f.shape) for f in schema.fields}
        diff = [f"{n}: store {have.get(n)} vs env {want.get(n)}" for n in sorted(set(have) | set(want))
                if have.get(n) != want.get(n)]
        store.close()
        raise SchemaError(f"{p} holds a different schema than this env produces ({'; '.join(diff)})")
    return store


def collect(
    env: str | Callable[[], Any],
    store: str | os.PathLike[str],
    steps: int,
    *,
    workers: int = 1,
    envs_per_worker: int = 1,
    policy: str | PolicySpec | Policy = "random",
    seed: int | None = None,
    atari: bool | None = None,
    capacity: int = 1_000_000,
    durability: Literal["process", "segment", "batch"] = "segment",
    max_episode_steps: int | None = None,
    autoreset_mode: AutoresetName = "next_step",
    terminal_on_life_loss: bool = False,
    sticky_actions: float | None = None,
    progress: bool | None = None,
    metadata: dict[str, Any] | None = None,
) -> CollectResult:
    """Fill ``store`` (created from the env's spaces if missing) with ``steps`` env steps.

    Parameters
    ----------
    env
        A gymnasium id (``"CartPole-v1"``, ``"ALE/Pong-v5"``) or a picklable callable returning an env.
    steps
        Env steps to store in total (each worker stores its share, rounded up to whole vector
        steps of ``envs_per_worker``).
    workers
        Spawned worker processes, each with its own vector env and writer. ``0`` runs one worker
        in this process (for policies that cannot be pickled).
    policy
        ``"random"``, ``"eps-greedy:CHECKPOINT[:EPS]"``, a :class:`PolicySpec`, or a callable
        mapping a batch of observations to a batch of actions.
    seed
        Base seed (``None``: a fresh random one, recorded in the provenance record).
    autoreset_mode
        The vector env's autoreset mode; every mode stores the same episodes.
    progress
        Show a progress bar (default: when stderr is a terminal).

    Returns a :class:`CollectResult`. On ``KeyboardInterrupt`` workers stop, keep what they
    wrote, and the result has ``interrupted=True``. A crashed worker is listed in ``errors``.
    """
    if steps < 1:
        raise ValueError(f"`steps` must be >= 1, got {steps}")
    if workers < 0 or envs_per_worker < 1:
        raise ValueError(f"need workers >= 0 and envs_per_worker >= 1, got {workers} and {envs_per_worker}")
    if isinstance(policy, str):
        policy = PolicySpec.parse(policy)
    if workers > 0 and not isinstance(policy, PolicySpec):
        try:
            pickle.dumps(policy)
        except Exception as exc:
            raise ValueError(f"a policy callable must be picklable to run in worker processes (or use workers=0): {exc}"
                             ) from None
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % (2**31))
    from . import __version__

    obs_space, act_space, extra = _env_spaces(env, atari, max_episode_steps, terminal_on_life_loss, sticky_actions)
    env_name = env if isinstance(env, str) else getattr(env, "__qualname__", repr(env))
    base = {"env_id": env_name, "observation_space": repr(obs_space), "action_space": repr(act_space),
            "mmreplay_version": __version__, **extra}
    st = open_or_create(store, obs_space, act_space, capacity=capacity, metadata={**base, **(metadata or {})})
    n_workers = max(workers, 1)
    shares = _split(steps, n_workers)
    cfgs = [WorkerConfig(w, env, str(st.path), -(-shares[w] // envs_per_worker) * envs_per_worker, envs_per_worker,
                         seed, policy, atari, max_episode_steps, autoreset_mode, durability, terminal_on_life_loss,
                         sticky_actions) for w in range(n_workers) if shares[w] > 0]
    record = {**base, "kind": "collect", "status": "running", "workers": workers, "envs_per_worker": envs_per_worker,
              "policy": str(policy) if isinstance(policy, PolicySpec) else "callable", "seed": seed,
              "env_seeds": [[seed + c.worker * envs_per_worker + j for j in range(envs_per_worker)] for c in cfgs],
              "steps_requested": steps, "autoreset_mode": autoreset_mode, "max_episode_steps": max_episode_steps,
              "atari": atari, "durability": durability, "host": os.uname().nodename, "pid": os.getpid(),
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    name = st.record_provenance(record)
    total = sum(c.steps or 0 for c in cfgs)
    bar = _Progress(total, progress)
    result = CollectResult(0, 0, 0, [], 0.0, 0, seed, provenance=name)
    t0 = time.perf_counter()

    def absorb(payload: dict[str, Any]) -> None:
        result.steps += payload["steps"]
        result.transitions += payload["transitions"]
        result.episodes += payload["episodes"]
        result.bytes_written += payload["bytes"]
        result.episode_returns.extend(payload["returns"])
        if payload["final"]:
            result.loop_seconds = max(result.loop_seconds, payload["loop_s"])
        bar.update(payload["steps"], result)

    try:
        if workers == 0:
            stop = threading.Event()
            try:
                run_worker(cfgs[0], lambda kind, p: absorb(p), stop.is_set)
            except KeyboardInterrupt:
                result.interrupted = True
        else:
            _run_processes(cfgs, absorb, result)
    finally:
        result.seconds = time.perf_counter() - t0
        bar.close()
        record.update(status="interrupted" if result.interrupted else ("failed" if result.errors else "done"),
                      steps_stored=result.steps, episodes=result.episodes, seconds=round(result.seconds, 3),
                      errors={str(k): v.splitlines()[-1] if v else "" for k, v in result.errors.items()},
                      finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        with contextlib.suppress(Exception):
            st.record_provenance(record, name)
        st.close()
    return result


def _run_processes(cfgs: list[WorkerConfig], absorb: Callable[[dict[str, Any]], None], result: CollectResult) -> None:
    q, stop, _, _, procs = _spawn(cfgs, limited=False)
    by_id = {c.worker: p for c, p in zip(cfgs, procs)}
    running = set(by_id)

    def drain(timeout: float) -> None:
        try:
            kind, w, payload = q.get(timeout=timeout)
        except queue_mod.Empty:
            return
        if kind == "progress":
            absorb(payload)
        elif kind == "error":
            result.errors[w] = payload
        elif kind == "exit":
            running.discard(w)

    try:
        while running:
            drain(0.1)
            for w in list(running):
                p = by_id[w]
                if not p.is_alive() and p.exitcode is not None:
                    while not q.empty():  # take what it reported before it died
                        drain(0.05)
                    if w in running:
                        running.discard(w)
                        if p.exitcode != 0 and w not in result.errors:
                            why = f"signal {-p.exitcode}" if p.exitcode < 0 else f"exit code {p.exitcode}"
                            result.errors[w] = f"worker {w} died ({why})"
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        stop.set()
        # keep draining while the workers close their writers: a worker exits only once its queue
        # feeder has flushed into the pipe, so waiting without reading could stall both sides
        deadline = time.monotonic() + 120
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            try:
                drain(0.1)
            except KeyboardInterrupt:  # a second Ctrl-C: stop waiting; published rows are safe anyway
                break
        for p in procs:
            if p.is_alive():  # pragma: no cover - a wedged env
                p.kill()
            p.join()
        while not q.empty():
            with contextlib.suppress(Exception):
                drain(0.01)
        q.close()


class _Progress:
    """A tqdm bar on a terminal (steps, steps/s, episodes, mean return, bytes); silent otherwise."""

    def __init__(self, total: int, enabled: bool | None) -> None:
        if enabled is None:
            enabled = sys.stderr.isatty()
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:  # pragma: no cover - tqdm is a dependency
                return
            self.bar = tqdm(total=total, unit="step", unit_scale=True, dynamic_ncols=True, smoothing=0.1)

    def update(self, n: int, result: CollectResult) -> None:
        if self.bar is None:
            return
        recent = result.episode_returns[-100:]
        self.bar.set_postfix_str(
            f"episodes={result.episodes} return={np.mean(recent):.1f} written={result.bytes_written / 2**20:.0f}MiB"
            if recent else f"episodes={result.episodes} written={result.bytes_written / 2**20:.0f}MiB", refresh=False)
        self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# -- actors for a trainer -----------------------------------------------------------------
class ActorPool:
    """Actor processes that fill a store for an online trainer, under a samples-per-insert limit.

    Each actor acts ε-greedily with the policy file at ``policy_path`` (re-read when it changes;
    ε from the file's ``meta["epsilon"]``) and appends to the store with its own writer. The
    learner calls :meth:`allow` with the total env steps it is ready for; actors wait beyond it.

    >>> pool = ActorPool("CartPole-v1", "/data/run/store", actors=2, policy_path="/data/run/policy.pt")
    >>> pool.start(); pool.allow(10_000)  # doctest: +SKIP
    """

    def __init__(self, env_id: str, store_path: str | os.PathLike[str], *, actors: int, envs_per_actor: int = 1,
                 policy_path: str | os.PathLike[str], seed: int = 0, atari: bool | None = None,
                 max_episode_steps: int | None = None, durability: Literal["process", "segment", "batch"] = "segment",
                 terminal_on_life_loss: bool = False) -> None:
        if actors < 1:
            raise ValueError(f"`actors` must be >= 1, got {actors}")
        spec = PolicySpec("eps-greedy", str(policy_path), None, reload_s=0.2)
        self.cfgs = [WorkerConfig(w, env_id, str(store_path), None, envs_per_actor, seed, spec, atari, max_episode_steps,
                                  "next_step", durability, terminal_on_life_loss) for w in range(actors)]
        self._procs: list[Any] = []
        self._returns: deque[float] = deque(maxlen=1000)
        self._episodes = 0
        self.errors: dict[int, str] = {}

    def start(self) -> ActorPool:
        """Spawn the actors (each loads the policy file first: write it before starting)."""
        self._q, self._stop, self._counts, self._allowed, self._procs = _spawn(self.cfgs, limited=True)
        self._allowed.value = 0
        return self

    def allow(self, total_env_steps: int) -> None:
        """Let the actors store up to ``total_env_steps`` env steps in all (a negative value: no limit)."""
        self._allowed.value = int(total_env_steps)

    @property
    def env_steps(self) -> int:
        """Env steps stored so far by all actors (as last reported, within ~0.25 s)."""
        return int(sum(self._counts[:])) if self._procs else 0

    def _drain(self) -> None:
        while True:
            try:
                kind, w, payload = self._q.get_nowait()
            except (queue_mod.Empty, OSError, ValueError):
                return
            if kind == "progress":
                self._returns.extend(payload["returns"])
                self._episodes += payload["episodes"]
            elif kind == "error":
                self.errors[w] = payload

    def episode_returns(self, last: int = 100) -> list[float]:
        """Returns of the last ``last`` completed episodes (any actor)."""
        self._drain()
        return list(self._returns)[-last:]

    @property
    def episodes(self) -> int:
        self._drain()
        return self._episodes

    def check(self) -> None:
        """Raise ``RuntimeError`` with the traceback if an actor failed."""
        self._drain()
        for w, p in enumerate(self._procs):
            if not p.is_alive() and p.exitcode not in (0, None) and w not in self.errors:
                self.errors[w] = f"actor {w} died (exit code {p.exitcode})"
        if self.errors:
            w, tb = next(iter(self.errors.items()))
            raise RuntimeError(f"actor {w} failed:\n{tb}")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every actor; each closes its writer, so every row it wrote stays in the store."""
        if not self._procs:
            return
        self._stop.set()
        self._allowed.value = -1  # unblock actors waiting on the limit so they see the stop
        for p in self._procs:
            p.join(timeout=timeout)
            if p.is_alive():  # pragma: no cover
                p.kill()
                p.join()
        self._drain()
        self._q.close()
        self._procs = []

    def __enter__(self) -> ActorPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
