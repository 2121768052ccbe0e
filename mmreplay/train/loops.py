"""``mmreplay train``: an online algorithm (DQN) in an env, synchronous or with actor processes, or
any registered algorithm offline, with the store as the replay memory.

Reads like CleanRL's ``dqn.py``: a config (:class:`TrainConfig`, one docstring per field; the CLI
options mirror it), the algorithm in its own module (``mmreplay.train.algos``, ``# ALGO LOGIC``),
built by its registry entry (:func:`make_learner`), and the loops (``train_online``,
``train_actors``, ``train_offline``) top to bottom.

* **Online, ``actors=0``**: one process steps a vector env, writes each step into the store
  (``writer.add``), and every ``train_freq`` env steps runs ``gradient_steps`` updates on batches
  drawn from the store. Before a training round the store is refreshed (at most every
  ``REFRESH_ROWS`` env steps), so every row written up to that refresh (and nothing else) can be
  drawn, and batches are drawn in the loop's own thread: with a seed, a run is exactly
  reproducible (same weights, same metrics, on the same machine).
* **Online, ``actors>0``**: actor processes (``mmreplay.ActorPool``) write the store
  with their own writers; the learner samples through a ``BatchLoader``, publishes its weights
  every ``publish_every`` updates (a policy file written atomically), and a samples-per-insert
  rate limiter keeps updates × batch ≈ ``samples_per_insert`` × new env steps in both
  directions (the learner waits for data, the actors wait for the learner).
* **Offline**: the store is opened read-only (works on a read-only copy); batches come from a
  ``Batches`` source; the algorithm's learner for the store's action kind (discrete: a
  :class:`mmreplay.train.q_learner.QLearner`; Box: a :class:`mmreplay.train.box_learner.BoxLearner`)
  makes the updates in the same loop (and the same run directory, metrics and checkpoints); an
  algorithm that does not fit the store's actions is one ``ValueError``.

Every run has a directory (``run_dir``) with ``metrics.csv`` (and TensorBoard), ``checkpoint.pt``
(atomic, every ``checkpoint_every`` steps; ``resume=True`` continues from it with the same store),
``policy.pt`` (the final network), ``best_policy.pt`` (the best evaluation) and ``config.json``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from ..agent.evaluation import greedy_actions
from ..agent.policy import FrameStack, epsilon_greedy, save_policy
from .algos import check_fits, get
from .batches import Batches, to_tensors
from .run import Run, TrainResult, next_multiple, save_result
from .stores import (
    check_eval_env,
    count_actions,
    finish_training,
    offline_n_actions,
    open_store_for_env,
    record_training,
)
from .checkpoint import restore_torch_rng

from .config import _run_dir, linear_schedule
from .settings import LearnerSetup, TrainConfig

log = logging.getLogger(__name__)


def train(cfg: TrainConfig) -> TrainResult:
    """Run a training job described by ``cfg`` (see the module docstring)."""
    if cfg.acting.ray is not None and cfg.actors < 1:
        raise ValueError("--ray runs the actors on Ray: give --actors A (A >= 1)")
    from ..actors.pool import Interrupts

    if cfg.resume:
        done = _finished(cfg)
        if done is not None:  # nothing left to do: no store opened, no segment made
            log.info("%s already finished (%s of %s steps): give a larger --steps to continue it", done.run_dir,
                     f"{done.updates if cfg.offline else done.env_steps:,}", f"{cfg.steps:,}")
            return done
    # a SIGINT (Ctrl-C) or SIGTERM stops the loop at its next safe point (never inside an update): the
    # episodes it cuts are marked, a checkpoint and the policy are written, and the result says so
    with Interrupts(raises=False) as stop:
        if cfg.offline:
            res = train_offline(cfg, stop)
        elif cfg.actors > 0:
            res = train_actors(cfg, stop)
        else:
            res = train_online(cfg, stop)
    res.interrupted = stop.signal
    if res.interrupted:
        save_result(res)  # an interrupted run's result says so (a resume tells it from a finished one)
    return res


def _finished(cfg: TrainConfig) -> TrainResult | None:
    """The result of a run being resumed that already reached ``cfg.steps`` (None if it did not)."""
    import json
    from dataclasses import fields

    path = _run_dir(cfg) / "result.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    done = data.get("updates" if cfg.offline else "env_steps", 0)
    if done < cfg.steps or data.get("interrupted"):
        return None
    known = {f.name for f in fields(TrainResult)} - {"already_finished"}
    return TrainResult(**{k: v for k, v in data.items() if k in known}, already_finished=True)


# -- online, synchronous ------------------------------------------------------------------------------
REFRESH_ROWS = 8
"""Env steps between the store refreshes of ``train_online`` at the least: at one update per env step a
refresh (the writer's commit, the reader's counts) per update cost ~70 us of a ~2 ms step (MinAtar,
``benchmarks/minatar_dqn.py``); the newest rows (at most 7 of them) wait for the next refresh."""


def train_online(cfg: TrainConfig, stop: Any = None) -> TrainResult:
    """The classic loop in one process: act, write the step into the store, train every
    ``train_freq`` env steps. Reproducible with a seed."""
    from ..agent.envs import flatten_obs, make_vec_env

    run = Run(cfg, _run_dir(cfg))
    envs = make_vec_env(cfg.env_id, cfg.num_envs, atari=cfg.atari or None, max_episode_steps=cfg.max_episode_steps)
    n_actions = count_actions(envs.single_action_space)  # (before the store: a Box env makes no empty store)
    store = open_store_for_env(cfg, envs)
    # a round every `every` env steps: at most one per vector step (train_freq below num_envs: every
    # num_envs env steps, as SB3 and CleanRL train once per vector step). Env steps do not count
    # next-step autoreset lanes, so updates per env step do not depend on how often episodes end
    every = max(cfg.algo.train_freq, cfg.num_envs)
    learner, sampler, rng, writer = _online_parts(cfg, run, store, n_actions, every)
    n = cfg.num_envs
    obs, _ = envs.reset(seed=cfg.seed + run.env_steps)
    stack = FrameStack(cfg.frame_stack) if cfg.frame_stack > 1 else None
    x = stack.reset(obs) if stack is not None else obs
    autoreset = np.zeros(n, np.bool_)  # this step only resets the lane (next-step autoreset)
    resets = 0  # autoreset.sum(), kept as an int (the per-step bookkeeping stays off numpy when nothing ends)
    ep_return = np.zeros(n)
    # train at every multiple of train_freq past learning_starts (as SB3 and CleanRL do)
    next_train = next_multiple(max(cfg.algo.learning_starts, run.env_steps), every)
    decay = cfg.algo.exploration_fraction * cfg.steps
    epsilon = linear_schedule(cfg.algo.start_e, cfg.algo.end_e, decay, run.env_steps)
    stopped = False
    refreshed = -REFRESH_ROWS  # env steps at the last refresh
    prov = record_training(store, cfg, run.dir, shared=cfg.shared_store)
    cut_rows: list[int] = []  # the steps the end of the run cut (stored truncated), for the store's records
    status = "failed"
    run.start_clock()
    try:
        while run.env_steps < cfg.steps and not stopped:
            interrupted = stop is not None and stop.stop_requested
            # ACT: epsilon-greedy, one draw per env (none when every env only resets: the actions are ignored)
            epsilon = linear_schedule(cfg.algo.start_e, cfg.algo.end_e, decay, run.env_steps)
            if resets == n:
                actions = np.zeros(n, np.int64)
            else:
                actions = epsilon_greedy(partial(greedy_actions, learner.policy_net, x, run.device), n_actions, epsilon, rng, n)
            next_obs, reward, terminated, truncated, _ = envs.step(actions)
            cut = None
            if interrupted or run.env_steps + n - resets >= cfg.steps:  # the run ends here: running
                cut = ~(terminated | truncated | autoreset)                            # episodes are cut
                truncated = truncated | cut
            # DATA: the step goes into the store (the row after an episode's end is its final obs)
            if isinstance(obs, dict):
                writer.add({**flatten_obs(obs), "action": actions, "reward": reward, "terminated": terminated,
                            "truncated": truncated})
            else:  # keyword form: the writer's fast path
                writer.add(obs=obs, action=actions, reward=reward, terminated=terminated, truncated=truncated)
            if cut is not None:
                cut_rows.extend(writer.last_step_ids[cut].tolist())
                truncated = truncated & ~cut  # (an episode the run cut is not counted as ended)
            ended = terminated | truncated
            ep_return += reward
            stepped = n - resets
            resets = int(ended.sum()) if ended.any() else 0
            if resets:
                run.returns.extend(ep_return[ended].tolist())
                run.episodes += resets
                ep_return[ended] = 0.0
            run.env_steps += stepped
            x = stack.push(next_obs, autoreset) if stack is not None else next_obs
            obs, autoreset = next_obs, ended
            # TRAIN: every train_freq env steps, gradient_steps updates on batches from the store
            if run.env_steps >= next_train:
                next_train = next_multiple(run.env_steps, every)
                refreshed = _train_round(cfg, run, store, sampler, learner, refreshed)
            run.maybe_log(learner, epsilon)
            stopped = run.maybe_eval(learner, cfg.report.eval_env or cfg.env_id) or interrupted
            run.maybe_checkpoint(learner, sampler, rng, epsilon, writer=writer)
        writer.close(last_obs=flatten_obs(obs) if isinstance(obs, dict) else obs)
        res = run.finish(learner, sampler, rng, epsilon, cfg.report.eval_env or cfg.env_id, stopped)
        status = "interrupted" if stop is not None and stop.stop_requested else "done"
        return res
    finally:
        writer.close()
        finish_training(store, prov, status, run.env_steps, cut_rows)
        envs.close()
        store.close()


def make_learner(cfg: TrainConfig, store: Any, device: Any, eval_env: str | None = None,
                 n_actions: int | None = None, *, kind: str | None = None) -> Any:
    """The learner of ``cfg.algo``'s algorithm for ``store``'s actions (its registry entry builds it);
    one ``ValueError`` when the algorithm cannot learn them. Discrete actions: ``n_actions`` (the env's),
    else counted from the eval env or the store (``offline_n_actions``). ``kind``: what ``check_fits``
    returned, when the caller checked already."""
    if kind is None:
        kind = check_fits(cfg.algo.name, store.schema, str(cfg.archive or cfg.store))
    if kind == "discrete" and n_actions is None:
        n_actions = offline_n_actions(store, eval_env, cfg)
    return get(cfg.algo.name).learner(LearnerSetup(cfg, store, device, eval_env, n_actions), kind)


def _online_parts(cfg: TrainConfig, run: Run, store: Any, n_actions: int,
                  every: int) -> tuple[Any, Any, Any, Any]:
    """The synchronous loop's learner, sampler and acting generator (restored from the checkpoint on
    a resume), and its writer."""
    learner = make_learner(cfg, store, run.device, n_actions=n_actions)
    total_updates = max(1, (cfg.steps - cfg.algo.learning_starts) // every * cfg.algo.gradient_steps)
    sampler = run.make_sampler(store, total_updates, refresh_interval_s=None)  # refreshed by the loop, not the clock
    rng = np.random.default_rng(cfg.seed)
    if run.payload:
        learner.load(run.payload)
        rng.bit_generator.state = run.payload["rng"]
        restore_torch_rng(run.payload)
    # rows are published by the refresh before each training round; the writer's publisher thread
    # (rows visible to other processes within the interval) wakes once a second, not every 5 ms:
    # each wake takes the GIL from this loop (measured: ~2x the loop's wall at CleanRL's settings)
    writer = store.writer(lanes=cfg.num_envs, cast="safe", publish_interval_s=1.0)
    return learner, sampler, rng, writer


def _train_round(cfg: TrainConfig, run: Run, store: Any, sampler: Any, learner: Any, refreshed: int) -> int:
    """One training round of the synchronous loop: ``gradient_steps`` updates on batches from the store.
    Returns the env step of the last refresh. The rows written up to the last refresh can be drawn; a
    refresh every REFRESH_ROWS env steps or more (one per round at train_freq >= REFRESH_ROWS), at fixed
    steps: the run is reproducible (no directory listing: the writer's new segments are scanned for)."""
    if run.env_steps - refreshed >= REFRESH_ROWS:
        store.refresh(scan=False)
        refreshed = run.env_steps
    for _ in range(cfg.algo.gradient_steps):
        t0 = time.perf_counter()
        b = sampler.sample(cfg.algo.batch_size)
        t1 = time.perf_counter()
        td = learner.update(to_tensors(b, run.device))
        if cfg.replay.prioritized and td is not None:
            sampler.update_priorities(b.ids, td.abs().cpu().numpy())
        run.updates += 1
        run.wait_s += t1 - t0
        run.busy_s += time.perf_counter() - t1
        run.profile_step()
    return refreshed


# -- online, actor processes ----------------------------------------------------------------------------
def train_actors(cfg: TrainConfig, stop: Any = None) -> TrainResult:
    """Actors in separate processes write the store; the learner samples it through a loader,
    publishes weights every ``publish_every`` updates, and keeps the samples-per-insert ratio."""
    cfg, run, store, prov, n_actions = _actors_setup(cfg)
    learner = make_learner(cfg, store, run.device, n_actions=n_actions)
    if run.payload:
        learner.load(run.payload)
        restore_torch_rng(run.payload)
    policy_path = run.dir / "actor_policy.pt"
    epsilon = linear_schedule(cfg.algo.start_e, cfg.algo.end_e, cfg.algo.exploration_fraction * cfg.steps, run.env_steps)
    save_policy(policy_path, learner.policy_net, epsilon=epsilon, step=run.env_steps, **run.meta())
    base_rows = run.env_steps  # env steps of earlier sessions (the pool counts its own)
    pool = _actor_pool(cfg, run, str(store.path), str(policy_path), prov)
    seen = [0]  # episodes of this session's pool already counted
    pool.start()  # the actors load the policy file written above
    try:
        stopped, epsilon, data_wait = _learn_from_actors(cfg, run, store, pool, learner, stop, policy_path,
                                                         base_rows, seen)
        run.env_steps = base_rows + pool.env_steps
        _take_returns(run, pool, seen)
    finally:
        pool.stop()
    store.refresh()
    status = "failed"
    try:
        res = run.finish(learner, None, None, epsilon, cfg.report.eval_env or cfg.env_id, stopped, data_wait=data_wait)
        status = "interrupted" if stop is not None and stop.stop_requested else "done"
        return res
    finally:
        finish_training(store, prov, status, run.env_steps, [])  # (the actors recorded the steps they cut)
        store.close()


def _actors_setup(cfg: TrainConfig) -> tuple[TrainConfig, Run, Any, str, int]:
    """The actor loop's config (small segments when rows ship through Ray), run, store (opened or
    created from a probe env's spaces), provenance record and number of actions."""
    from ..agent.envs import make_env

    probe = make_env(cfg.env_id, atari=cfg.atari or None, max_episode_steps=cfg.max_episode_steps)
    if cfg.acting.ray is not None and cfg.segment_records is None:  # rows ship a sealed segment at a time: small ones
        from ..cluster import cluster_segment_records
        from ..core.schema import Schema

        cfg = replace(cfg, segment_records=cluster_segment_records(
            Schema.from_spaces(probe.observation_space, probe.action_space), cfg.acting.envs_per_actor))
    run = Run(cfg, _run_dir(cfg))
    n_actions = count_actions(probe.action_space)

    class _Spaces:  # what open_store_for_env reads from a vector env
        single_observation_space = probe.observation_space
        single_action_space = probe.action_space

    store = open_store_for_env(cfg, _Spaces)
    probe.close()
    try:
        prov = record_training(store, cfg, run.dir, shared=cfg.shared_store)
    except BaseException:
        store.close()
        raise
    return cfg, run, store, prov, n_actions


def _actor_pool(cfg: TrainConfig, run: Run, store_path: str, policy_path: str, prov: str) -> Any:
    """The actors: an ActorPool of local processes, or (``ray``) a RayActorPool whose rows come back
    through archives and weights through Ray."""
    env = cfg.env_spec()
    if cfg.acting.ray is not None:
        from ..cluster import RayActorPool, ShipSpec

        return RayActorPool(env, store_path, actors=cfg.actors, envs_per_actor=cfg.acting.envs_per_actor,
                            policy_path=policy_path, seed=cfg.seed + run.env_steps,
                            ship=ShipSpec(cfg.acting.ray_archive, address=None if cfg.acting.ray == "local" else cfg.acting.ray))
    from ..actors import ActorPool

    return ActorPool(env, store_path, actors=cfg.actors, envs_per_actor=cfg.acting.envs_per_actor,
                     policy_path=policy_path, seed=cfg.seed + run.env_steps, run=prov)


def _learn_from_actors(cfg: TrainConfig, run: Run, store: Any, pool: Any, learner: Any, stop: Any,
                       policy_path: Any, base_rows: int, seen: list[int]) -> tuple[bool, float, float]:
    """The actor loop's learner: wait for ``learning_starts`` rows, then update within the
    samples-per-insert limit, publishing the weights every ``publish_every`` updates. Returns whether
    it stopped early, the last epsilon and the share of time spent waiting for batches."""
    total_updates = max(1, (cfg.steps - cfg.algo.learning_starts) // cfg.algo.train_freq * cfg.algo.gradient_steps)
    spi = cfg.acting.samples_per_insert or cfg.algo.batch_size * cfg.algo.gradient_steps / cfg.algo.train_freq
    decay = cfg.algo.exploration_fraction * cfg.steps
    epsilon = linear_schedule(cfg.algo.start_e, cfg.algo.end_e, decay, run.env_steps)
    slack = max(cfg.algo.train_freq, cfg.actors * cfg.acting.envs_per_actor * 4)
    warmup = max(cfg.algo.learning_starts - base_rows, 0)

    def allowed(updates: int) -> int:  # env steps the actors may have stored for this many updates
        return warmup + math.ceil(updates * cfg.algo.batch_size / spi) + slack

    pool.allow(allowed(0))
    while pool.env_steps < max(warmup, 1) and not (stop is not None and stop.stop_requested):  # warm-up
        time.sleep(0.01)
        pool.check()
        _take_returns(run, pool, seen)
    store.refresh()
    sampler = run.make_sampler(store, total_updates)
    session_updates = 0
    stopped = False
    batches = Batches(sampler, cfg, run.device)
    run.start_clock()
    try:
        while run.env_steps < cfg.steps and not stopped:
            # RATE LIMIT: at most samples_per_insert sampled transitions per inserted one
            while (session_updates + 1) * cfg.algo.batch_size > spi * (pool.env_steps - warmup + slack) and \
                    base_rows + pool.env_steps < cfg.steps:
                time.sleep(0.0005)
                pool.check()
            if batches.loader is None and session_updates % 16 == 0:
                store.refresh(scan=False)  # the actors' newest rows (new segments: every second)
            b = batches.next()
            td = learner.update(b)
            if cfg.replay.prioritized and td is not None:
                batches.update_priorities(b.ids, td.abs())
            session_updates += 1
            run.updates += 1
            pool.allow(allowed(session_updates))
            run.env_steps = base_rows + pool.env_steps
            epsilon = linear_schedule(cfg.algo.start_e, cfg.algo.end_e, decay, run.env_steps)
            if session_updates % cfg.acting.publish_every == 0:  # PUBLISH: atomic file, actors reload it
                save_policy(policy_path, learner.policy_net, epsilon=epsilon, step=run.env_steps, **run.meta())
            run.profile_step()
            if run.step >= run.next_log:  # the actors' episode returns are read here only (a queue poll)
                _take_returns(run, pool, seen)
                run.maybe_log(learner, epsilon, data_wait=batches.wait_fraction())
            stopped = run.maybe_eval(learner, cfg.report.eval_env or cfg.env_id) or (stop is not None
                                                                              and stop.stop_requested)
            run.maybe_checkpoint(learner, None, None, epsilon)
        return stopped, epsilon, batches.total_wait_fraction()
    finally:
        batches.close()


def _take_returns(run: Run, pool: Any, seen: list[int]) -> None:
    """Returns of the episodes the actors finished since the last call (``seen``: [count])."""
    total = pool.episodes
    new = total - seen[0]
    if new > 0:
        run.returns.extend(pool.episode_returns(last=new))
        run.episodes += new
        seen[0] = total


# -- offline --------------------------------------------------------------------------------------------
def train_offline(cfg: TrainConfig, stop: Any = None) -> TrainResult:
    """Any registered algorithm that fits the store's actions (``mmreplay.train.algos``) from a saved
    store, read-only; ``steps`` learner updates."""
    from ..storage import open_store

    run = Run(cfg, _run_dir(cfg))
    if cfg.archive:
        from ..archive.zarr_io import open_archive

        store = open_archive(cfg.archive)  # whole segments fetched into a temporary local cache
    else:
        store = open_store(cfg.store, mode="r")
    try:
        kind = check_fits(cfg.algo.name, store.schema, str(cfg.archive or cfg.store))
        if store.num_rows == 0 and not store.wait_for_rows():  # said before the run directory is made
            from ..core.errors import EmptyStoreError

            raise EmptyStoreError(f"{cfg.archive or cfg.store} holds no rows to train from")
        counts = store.check_counts()
        if counts["unchecked_segments"]:  # a copied or modified store: its segments are checked before training
            gb = counts["unchecked_rows"] * store.layout.record_bytes / 1e9  # samples them
            log.info("checking %d segment(s) (%.1f GB) not checked since they were written or copied, once: every "
                     "row's stamp and crc32c", counts["unchecked_segments"], gb)
            t0 = time.perf_counter()
            store.wait_checked()
            secs = time.perf_counter() - t0
            log.info("checked in %.1f s (%.2f GB/s)", secs, gb / max(secs, 1e-9))
        eval_env = cfg.report.eval_env or cfg.env_id or store.metadata.get("env_id")
        check_eval_env(store, eval_env, cfg)  # one line, before anything starts
        learner = make_learner(cfg, store, run.device, eval_env, kind=kind)
        if run.payload:
            learner.load(run.payload)
            restore_torch_rng(run.payload)
        sampler = run.make_sampler(store, cfg.steps)
    except BaseException:
        store.close()
        raise
    stopped = False
    batches = Batches(sampler, cfg, run.device)
    run.start_clock()
    try:
        while run.updates < cfg.steps and not stopped:
            b = batches.next()
            td = learner.update(b)
            if cfg.replay.prioritized and td is not None:
                batches.update_priorities(b.ids, td.abs())
            run.updates += 1
            run.profile_step()
            if run.step >= run.next_log:
                run.maybe_log(learner, data_wait=batches.wait_fraction())
            stopped = run.maybe_eval(learner, eval_env) or (stop is not None and stop.stop_requested)
            run.maybe_checkpoint(learner, sampler, None, None)
        batches.close()
        data_wait = batches.total_wait_fraction()
        res = run.finish(learner, sampler, None, None, eval_env, stopped, data_wait=data_wait)
        return res
    finally:
        batches.close()
        store.close()
