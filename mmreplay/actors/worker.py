"""One actor's loop: act in a gymnasium vector env and append every step to a store.

:func:`run_worker` is what every actor runs, in a spawned process (:mod:`mmreplay.actors`), in a
Ray actor (:mod:`mmreplay.cluster`) or in the calling process. Its policy is random, ε-greedy
around a policy file (reloaded when the file changes, frame stacks kept per lane), a continuous
actor's file with Gaussian noise, or a callable.

Invariants: what the store holds is exactly what the env emitted, in each gymnasium autoreset
mode (see :mod:`mmreplay.actors`), except that the last step of an episode the end of the run
cuts is stored as truncated (``WorkerConfig.cut_episodes``); the first step of a writer goes through full validation and
small rows are gathered a few steps at a time into one ``add_batch`` (:class:`_StepBuffer`);
writers are always closed with the final observations, also after a crash, and the progress
made before a crash is reported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..agent.envs import EnvSpec, flatten_obs
from .specs import PolicyFn, PolicySpec

# -- policies -------------------------------------------------------------------------------
def check_policy(spec: PolicySpec, observation_space: Any, action_space: Any) -> None:
    """Load ``spec``'s policy file and check it against the env's spaces, before any worker starts
    or any store is made: a missing file, or a policy trained on another env (other observation
    fields or shapes, another number of actions), raises ``ValueError`` naming both sides."""
    if spec.kind == "random":
        return
    from ..agent.policy import load_policy
    from ..core.schema import Schema

    path = Path(spec.path or "")
    if not path.is_file():
        raise ValueError(f"policy file {spec.path} does not exist (give a policy.pt written by `mmreplay train`)")
    policy = load_policy(str(path))
    schema = Schema.from_spaces(observation_space, action_space)
    want = {n: tuple(schema[n].shape) for n in schema.obs_names}
    have = {o["name"]: tuple(o["shape"]) for o in policy.spec["obs"]}
    if getattr(policy, "continuous", False):  # an actor of a Box-action offline run
        if spec.kind == "eps-greedy" and spec.epsilon != 0.0:
            raise ValueError(f"policy {spec.path} is a continuous actor: use gaussian:{spec.path}[:STD] "
                             "(Gaussian exploration noise), not eps-greedy")
        shape = tuple(getattr(action_space, "shape", None) or ())
        if want != have or getattr(action_space, "n", None) is not None or shape != policy.action_shape:
            raise ValueError(f"policy {spec.path} was trained for observations {have} and Box actions of shape "
                             f"{policy.action_shape}; this env has observations {want} and actions {action_space!r}: "
                             "use a policy trained on it")
        low, high = np.asarray(action_space.low, np.float32).ravel(), np.asarray(action_space.high, np.float32).ravel()
        if not (np.allclose(low, policy.low) and np.allclose(high, policy.high)):
            import logging

            logging.getLogger(__name__).warning(
                "policy %s maps its actions onto %s..%s, this env's bounds are %s..%s: its actions are clipped to them",
                spec.path, policy.low.tolist(), policy.high.tolist(), low.tolist(), high.tolist())
        return
    if spec.kind == "gaussian":
        raise ValueError(f"policy {spec.path} is a Q network (discrete actions): use eps-greedy:{spec.path}[:EPS]")
    n_actions = int(getattr(action_space, "n", -1))
    if want != have or n_actions != policy.n_actions:
        raise ValueError(f"policy {spec.path} was trained for observations {have} and {policy.n_actions} actions; "
                         f"this env has observations {want} and {n_actions} actions: use a policy trained on it")


class _EpsGreedy:
    """ε-greedy over a policy file (Gaussian noise around a continuous actor's actions), reloaded when
    the file changes; keeps frame stacks per lane."""

    def __init__(self, spec: PolicySpec, seed: int) -> None:
        if spec.path is None:
            raise ValueError("an eps-greedy policy needs a checkpoint path")
        self.spec = spec
        self.path = Path(spec.path)
        self.rng = np.random.default_rng(seed)
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        self.policy: Any = None
        self._stack: Any = None
        self._load()

    def _load(self) -> None:
        from ..agent.policy import load_policy

        st = self.path.stat()  # FileNotFoundError names the path
        stamp = (st.st_ino, st.st_mtime_ns)
        if stamp != self._stamp:
            self.policy = load_policy(str(self.path))
            self._stamp = stamp
        self._checked = time.monotonic()

    @property
    def epsilon(self) -> float:
        if getattr(self.policy, "continuous", False):
            return self.spec.noise  # a continuous actor's Gaussian noise
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
            from ..agent.policy import FrameStack

            if self._stack is None or self._stack.k != k:
                self._stack = FrameStack(k)
                x = self._stack.reset(x)
            else:
                x = self._stack.push(x, new_episode)
        # the policy's actions are the env's (check_policy); its network runs only for lanes that act greedily
        return self.policy.act(x, self.epsilon, self.rng)


# -- one worker ----------------------------------------------------------------------------
@dataclasses.dataclass
class WorkerConfig:
    """Everything a worker process needs (picklable)."""

    worker: int
    """The worker's index in the run (0, 1, ...): it offsets the seeds."""
    env: EnvSpec
    """What env to make, and how to wrap and reset it."""
    store: str
    """The store's path (it exists: the parent made it)."""
    steps: int | None
    """Env steps (rows) to store; ``None``: until stopped."""
    envs: int
    """Env copies of the worker's vector env (its writer's lanes)."""
    seed: int
    """The run's base seed."""
    policy: PolicySpec | PolicyFn
    """What the worker acts with."""
    durability: str = "segment"
    """The writer's durability level."""
    report_s: float = 0.25
    """Seconds between the worker's progress reports to the parent."""
    gather_steps: int = 256
    """Most vector steps gathered before one ``add_batch`` (and at most 256 KiB): rows reach
    readers that many steps late. A trainer's actors use a few (fresh data), ``collect`` many."""
    run: str | None = None
    """The run's provenance record name: the worker keeps its own record beside it (``<run>.wNNN``)."""
    cut_episodes: bool = True
    """Store the last step of an episode the end of the run interrupts (the step budget, a stop,
    Ctrl-C) as a truncation, as D4RL's ``timeouts`` and Minari do: bootstrapping continues through
    it and nobody counts it as an episode that ended on its own. Same-step and disabled
    autoreset mark it at the step budget only (they write each step as it comes)."""

    def __post_init__(self) -> None:
        if not isinstance(self.env, EnvSpec):
            raise TypeError(f"`env` must be an EnvSpec, got {type(self.env).__name__}")


def _row(obs: Any, action: Any, reward: Any, term: Any, trunc: Any) -> dict[str, Any]:
    return {**flatten_obs(obs), "action": action, "reward": reward, "terminated": term, "truncated": trunc}


def _take(tree: Any, idx: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _take(v, idx) for k, v in tree.items()}
    return np.asarray(tree)[idx]


RECORD_S = 2.0
"""A worker rewrites its provenance record at most this often while it runs."""


def run_worker(
    cfg: WorkerConfig,
    report: Callable[[str, Any], None],
    should_stop: Callable[[], bool],
    may_step: Callable[[int], bool] | None = None,
) -> None:
    """Run one actor: step a vector env, act, append to the store, report progress.

    ``report(kind, payload)`` receives ``("progress", {...})`` about every ``report_s`` and at the
    end. ``may_step(n)`` (optional) is asked before each vector step of ``n`` env steps; while it
    is False the actor publishes what it gathered and waits (the trainer's samples-per-insert limit).
    ``should_stop()`` is asked once per gathered block (at most ``gather_steps`` vector steps apart).
    """
    _Worker(cfg, report, should_stop, may_step).run()


class _Worker:
    """One run of :func:`run_worker`: the store, the vector env, the writers and the counts it keeps
    between the stepping loop (next-step autoreset, or one writer per copy) and the closing."""

    def __init__(self, cfg: WorkerConfig, report: Callable[[str, Any], None], should_stop: Callable[[], bool],
                 may_step: Callable[[int], bool] | None) -> None:
        from ..storage import open_store

        self.cfg, self.report, self.should_stop, self.may_step = cfg, report, should_stop, may_step
        self.store = open_store(cfg.store, mode="a")
        self.next_step = cfg.env.next_step
        self.disabled = cfg.env.autoreset_mode.replace("-", "_") == "disabled"
        self.ours = isinstance(cfg.policy, PolicySpec)
        # next-step with our own policies: the env's observation buffer is copied once, into the step
        # buffer, before the step overwrites it (no deepcopy per step); a user's policy may keep references
        self.envs = cfg.env.make_vec(cfg.envs, copy=not (self.next_step and self.ours))
        self.act = self._policy()
        E = cfg.envs
        # next-step: one writer, E lanes; same-step/disabled: lanes drift apart, one writer per copy
        self.writers = [self.store.writer(lanes=E, durability=cfg.durability, cast="safe")] if self.next_step else [
            self.store.writer(lanes=1, durability=cfg.durability, cast="safe") for _ in range(E)]
        self.row_bytes = self.store.layout.record_bytes
        self.stats = _Stats(E)
        self.sent = {"steps": 0, "transitions": 0, "episodes": 0}
        self.last_report = time.monotonic()
        self.stopped = False  # a stop was asked (the run is interrupted, not finished)
        self.cut_rows: list[int] = []  # global row ids of the steps the end of the run cut (same-step / disabled)
        self.buf: _StepBuffer | None = None
        self.last_record = 0.0
        self.obs: Any = None
        self.t_loop, self.c_loop = time.perf_counter(), time.process_time()

    def _policy(self) -> Callable[[Any, np.ndarray], Any]:
        cfg, envs = self.cfg, self.envs
        if self.ours and cfg.policy.kind in ("eps-greedy", "gaussian"):  # type: ignore[union-attr]
            return _EpsGreedy(cfg.policy, cfg.seed + 7919 * (cfg.worker + 1))  # type: ignore[arg-type]
        if self.ours:
            envs.action_space.seed(cfg.seed + cfg.worker)
            return lambda obs, new: envs.action_space.sample()
        user = cfg.policy
        return lambda obs, new: user(obs)  # type: ignore[operator]

    def stop_asked(self) -> bool:
        self.stopped = self.stopped or bool(self.should_stop())
        return self.stopped

    def record_run(self, status: str) -> None:
        """This worker's own provenance record (``<run>.wNNN``): how far it got, how it ended, and the
        steps it stored as truncated because the run ended there; rewritten as it goes, so a run whose
        processes were killed still says what they stored."""
        cfg = self.cfg
        if cfg.run is None:
            return
        rec = {"kind": "worker", "run": cfg.run, "worker": cfg.worker, "status": status, "pid": os.getpid(),
               "host": socket.gethostname(), "steps": self.stats.steps, "episodes": self.stats.episodes,
               "cut_rows": self.cut_rows + (self.buf.cut_rows if self.buf is not None else []),
               "writer_ids": [w.writer_id for w in self.writers], "updated_at": time.time()}
        with contextlib.suppress(Exception):  # provenance is a record, never a reason to fail a run
            self.store.record_provenance(rec, f"{cfg.run}.w{cfg.worker:03d}")
        self.last_record = time.monotonic()

    def flush_report(self, final: bool = False) -> None:
        stats, sent = self.stats, self.sent
        delta: dict[str, Any] = {k: getattr(stats, k) - sent[k] for k in sent}
        delta["bytes"] = delta["steps"] * self.row_bytes
        delta["returns"] = stats.returns
        delta["final"] = final
        if final:  # the episodes the end of the run cut (stored truncated)
            delta["cut"] = len(self.cut_rows) + (len(self.buf.cut_rows) if self.buf is not None else 0)
        delta["loop_s"] = time.perf_counter() - self.t_loop
        delta["loop_cpu_s"] = time.process_time() - self.c_loop  # all of this process's threads
        self.report("progress", delta)
        sent.update({k: getattr(stats, k) for k in sent})
        stats.returns = []
        self.last_report = time.monotonic()
        if not final and self.last_report - self.last_record >= RECORD_S:
            self.record_run("running")

    def run(self) -> None:
        cfg, E = self.cfg, self.cfg.envs
        self.record_run("running")
        how = "done"
        try:
            self.obs, _ = self.envs.reset(seed=[cfg.seed + cfg.worker * E + j for j in range(E)])
            self.t_loop, self.c_loop = time.perf_counter(), time.process_time()  # no env creation, seeded reset
            budget = math.inf if cfg.steps is None else cfg.steps
            if self.next_step:
                self._gathered_loop(budget)
            else:
                self._per_copy_loop(budget)
        except KeyboardInterrupt:
            how = "interrupted"
            raise
        except BaseException:
            how = "failed"
            raise
        finally:
            self._close(how)

    def _gathered_loop(self, budget: float) -> None:
        """Next-step autoreset: gather up to T vector steps, then one add_batch and one vectorized
        count of the episodes (gather_steps or 256 KiB: rows reach readers that much later; the flush
        costs little per step), and at most half a segment: a block then needs at most the one spare
        segment the writer makes in the background, never one made on the spot."""
        cfg, E, envs, act, may_step = self.cfg, self.cfg.envs, self.envs, self.act, self.may_step
        T = max(1, min(cfg.gather_steps, (256 << 10) // (E * self.row_bytes), self.store.segment_records // (2 * E)))
        buf = self.buf = _StepBuffer(self.writers[0], T, self.stats, fresh_actions=self.ours)
        new_episode = np.ones(E, bool)  # obs is an episode's first observation (frame stacks restart)
        prev_done = np.zeros(E, bool)
        steps = 0
        watch = isinstance(act, _EpsGreedy)  # only our ε-greedy needs episode starts (frame stacks)
        obs = self.obs
        try:
            while steps < budget:
                if buf.full or buf.empty:  # every T steps: stop? report? (stop before the flush, so the
                    if self.stop_asked():  # last step is still gathered and can be marked as cut)
                        break
                    buf.flush()
                    if time.monotonic() - self.last_report >= cfg.report_s:
                        self.flush_report()
                if may_step is not None and not may_step(E):
                    if self.stop_asked():
                        break
                    buf.flush()  # the learner waits for these rows
                    time.sleep(0.001)
                    if time.monotonic() - self.last_report >= cfg.report_s:
                        self.flush_report()
                    continue
                action = act(obs, new_episode)
                buf.put_obs(obs, action)  # before step() overwrites it
                obs, reward, term, trunc, _ = envs.step(action)
                buf.put_outcome(reward, term, trunc)  # may flush
                steps += E
                if watch:  # a lane done in the last step was reset by this one: its obs starts an episode
                    new_episode, prev_done = prev_done, term | trunc
            if cfg.cut_episodes and buf.empty and 0 < steps < budget and (
                    may_step is None or self.stopped or may_step(E)):
                # stopped right after a flush: the last step is written, so one more carries the cut (within a
                # trainer's samples-per-insert limit while it runs; once it stopped the run, the limit no longer
                # matters: its running episodes are stored truncated and counted as cut, as the guarantees say)
                action = act(obs, new_episode)
                buf.put_obs(obs, action)
                obs, reward, term, trunc, _ = envs.step(action)
                buf.put_outcome(reward, term, trunc)
        finally:
            self.obs = obs

    def _per_copy_loop(self, budget: float) -> None:
        """Same-step and disabled autoreset: one single-lane writer per copy, rows written per step."""
        cfg, E, envs, writers, stats = self.cfg, self.cfg.envs, self.envs, self.writers, self.stats
        new_episode = np.ones(E, bool)
        zero = np.zeros(1, np.float64)
        obs = self.obs
        while stats.steps < budget and not self.stop_asked():  # per copy: rows differ per step
            if self.may_step is not None and not self.may_step(E):
                time.sleep(0.001)
                if time.monotonic() - self.last_report >= cfg.report_s:
                    self.flush_report()
                continue
            action = self.act(obs, new_episode)
            next_obs, reward, term, trunc, info = envs.step(action)
            env_done = term | trunc
            cut_now = np.zeros(E, bool)
            if cfg.cut_episodes and stats.steps + E >= budget:  # the run ends here: running episodes are cut
                cut_now = ~env_done
                trunc = trunc | cut_now
            done = term | trunc
            # same-step: the final observations are in info; disabled: next_obs until we reset
            for j in range(E):
                a = action[j:j + 1]
                writers[j].add(_row(_take(obs, [j]), a, reward[j:j + 1], term[j:j + 1], trunc[j:j + 1]))
                if cut_now[j]:
                    self.cut_rows.append(writers[j].last_row_id)
                if done[j]:  # the episode's final observation is its own (last) row of the lane
                    final = (_take(next_obs, [j]) if self.disabled or not env_done[j]  # cut: next_obs is its own
                             else _one_lane(info["final_obs"][j]))
                    writers[j].add(_row(final, a, zero, [False], [False]))
            if self.disabled and done.any():  # reset_mask resets those copies, returns the whole batch
                next_obs, _ = envs.reset(options={"reset_mask": done})
            stats.count(reward[None], env_done[None], autoreset_rows=False)  # (a cut is no episode end)
            new_episode = done  # done lanes were reset in this step
            obs = self.obs = next_obs
            if time.monotonic() - self.last_report >= cfg.report_s:
                self.flush_report()

    def _close(self, how: str) -> None:
        """Flush the last block (also after a crash: what was gathered before it), close the writers
        with the final observations, record how the run ended and send the final report."""
        try:
            if self.buf is not None:
                if self.cfg.cut_episodes:
                    self.buf.cut_last()  # episodes the end of the run interrupts are stored as truncated
                self.buf.flush()
            for j, w in enumerate(self.writers):
                if self.obs is None:
                    w.close()
                else:  # keep the final observations: the last steps become transitions
                    w.close(last_obs=self.obs if self.next_step else _take(self.obs, [j]))
        finally:
            self.envs.close()
            self.record_run("interrupted" if how == "done" and self.stopped else how)
            self.store.close()
            self.flush_report(final=True)  # also after a crash: what was written before it is stored


class _Stats:
    """What a worker reports: env steps, transitions, episodes and their returns, counted a block
    of vector steps at a time (cumulative sums, no loop per step)."""

    def __init__(self, lanes: int) -> None:
        self.steps = self.transitions = self.episodes = 0
        self.returns: list[float] = []
        self._ep_return = np.zeros(lanes)  # the running episodes' returns so far
        self._prev_done = np.zeros(lanes, bool)  # lanes done in the last step counted

    def count(self, reward: np.ndarray, done: np.ndarray, *, autoreset_rows: bool) -> None:
        """Count ``n`` vector steps: ``reward`` and ``done`` are ``(n, lanes)``. ``autoreset_rows``:
        the step after a done is the next-step autoreset (reward 0, a final observation, no transition)."""
        n, lanes = done.shape
        self.steps += n * lanes
        self.transitions += n * lanes
        if autoreset_rows:
            self.transitions -= int(np.count_nonzero(self._prev_done)) + int(np.count_nonzero(done[:-1]))
            self._prev_done = done[-1]
        cum = np.cumsum(reward, axis=0, dtype=np.float64)
        cum += self._ep_return
        if not done.any():
            self._ep_return = cum[-1]
            return
        t = np.arange(n)[:, None]
        last = np.maximum.accumulate(np.where(done, t, -1), axis=0)  # the latest done at or before t
        before = np.concatenate([np.full((1, lanes), -1), last[:-1]])  # ... strictly before t
        base = np.where(before >= 0, np.take_along_axis(cum, np.maximum(before, 0), 0), 0.0)
        self.returns.extend((cum - base)[done].tolist())  # in time order, lanes in order
        self.episodes += int(np.count_nonzero(done))
        end = last[-1]
        self._ep_return = np.where(end >= 0, cum[-1] - cum[np.maximum(end, 0), np.arange(lanes)], cum[-1])


class _StepBuffer:
    """Gathers up to ``T`` vector steps and appends them with one ``add_batch``.

    Observations are copied into preallocated arrays when they are seen (the vector env may
    overwrite its observation buffer in the next step); rewards and flags are fresh arrays from
    every ``step()``, kept by reference and concatenated at the flush, and so are actions when the
    policy returns a new array each call (``fresh_actions``: ours do; a user's is copied). The first step goes through
    ``Writer.add`` (full validation, clear errors); later copies use ``casting="safe"`` (no silent
    lossy cast) and ``add_batch`` validates again (non-finite values), so a bad step costs at most
    the ``T - 1`` steps gathered before it. Each flush also counts the block's episodes (``stats``).
    """

    def __init__(self, writer: Any, T: int, stats: _Stats, fresh_actions: bool = False) -> None:
        self.writer = writer
        self.T = T
        self.stats = stats
        self.first = True  # the first step is written by Writer.add, not buffered
        self.k = 0  # steps buffered (observations and actions)
        self.lastobs: dict[str, Any] | None = None
        self.rewards: list[np.ndarray] = []
        self.terms: list[np.ndarray] = []
        self.truncs: list[np.ndarray] = []
        self.tail_done = np.zeros(writer.lanes, np.bool_)  # the last flushed step's done flags
        self.cut: np.ndarray | None = None  # lanes whose episode cut_last() cut (until the flush)
        self.cut_rows: list[int] = []  # global row ids of the steps it cut (written)
        by_ref = ("reward", "terminated", "truncated", *(("action",) if fresh_actions else ()))
        self.bufs = {f.name: np.empty((T, writer.lanes, *f.shape), f.dtype) for f in writer.schema.fields
                     if f.name not in by_ref}
        self.obs, self.action = self.bufs.get("obs"), self.bufs.get("action")
        self.actions: list[np.ndarray] | None = [] if fresh_actions else None
        self.action_shape = (writer.lanes, *writer.schema["action"].shape)

    @property
    def empty(self) -> bool:
        return not self.rewards

    def put_obs(self, obs: Any, action: Any) -> None:
        """The observation a step starts from (array or dict) and the action taken."""
        if self.first:
            fields = {**flatten_obs(obs), "action": action}
            self.lastobs = {k: np.array(v) for k, v in fields.items()}  # step() may overwrite obs
            return
        k = self.k  # counted when the step's outcome is in
        if isinstance(obs, dict):
            for name, x in flatten_obs(obs).items():
                np.copyto(self.bufs[name][k], x, casting="safe")
        elif obs.dtype == self.obs.dtype:  # the usual case: a plain copy (copyto's casting check costs more)
            self.obs[k] = obs
        else:
            np.copyto(self.obs[k], obs, casting="safe")
        if self.actions is None:
            np.copyto(self.action[k], action, casting="safe")
        else:
            self.actions.append(action)

    def put_outcome(self, reward: np.ndarray, term: np.ndarray, trunc: np.ndarray) -> None:
        if self.first:
            self.writer.add(**self.lastobs, reward=reward, terminated=term, truncated=trunc)
            self.first = False
            self.lastobs = None
        else:
            self.k += 1
        self.rewards.append(reward)
        self.terms.append(term)
        self.truncs.append(trunc)

    @property
    def full(self) -> bool:
        return len(self.rewards) >= self.T

    def cut_last(self) -> bool:
        """Mark the last gathered step as a truncation in every lane whose episode is still running
        (not done in it, nor in an autoreset row after a done): the run ends there. False when
        that step is already written (the unbuffered first step)."""
        if not self.k:
            return False
        done = self.terms[-1] | self.truncs[-1]
        prev = self.terms[-2] | self.truncs[-2] if len(self.terms) >= 2 else self.tail_done
        self.cut = ~(done | prev)
        self.truncs[-1] = self.truncs[-1] | self.cut  # a new array: the env's is kept by reference
        return True

    def flush(self) -> None:
        if not self.rewards:
            return
        n, lanes = len(self.rewards), self.writer.lanes  # (concatenate: a fraction of np.stack's cost per step)
        reward, term, trunc = (np.concatenate(x).reshape(n, lanes) for x in (self.rewards, self.terms, self.truncs))
        cut, self.cut = self.cut, None
        self.tail_done = term[-1] | trunc[-1]  # for cut_last() when the next block holds one step
        self.rewards, self.terms, self.truncs = [], [], []
        k, self.k = self.k, 0
        if k:  # the last k steps (the block may start with the unbuffered first step)
            batch = {**{n: b[:k] for n, b in self.bufs.items()},
                     "reward": reward[-k:], "terminated": term[-k:], "truncated": trunc[-k:]}
            if self.actions is not None:  # (one more if a step() raised after its action was taken)
                actions, self.actions = self.actions[:k], []
                batch["action"] = np.concatenate(actions).reshape(k, *self.action_shape)
            self.writer.add_batch(batch)
            self.writer.publish()  # visible now, and the writer's publisher thread stays asleep
        done = term | trunc
        if cut is not None:  # episodes the end of the run cut: stored as truncated, not counted as ended
            self.cut_rows.extend(self.writer.last_step_ids[cut].tolist())
            done[-1] &= ~cut
        self.stats.count(reward, done, autoreset_rows=True)


def _one_lane(x: Any) -> Any:
    """One env's observation (array or nested dict) batched as a single lane."""
    if isinstance(x, dict):
        return {k: _one_lane(v) for k, v in x.items()}
    return np.asarray(x)[None]
