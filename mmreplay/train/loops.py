"""``mmreplay train``: DQN online (synchronous or with actor processes) and BC / DQN / CQL offline,
with the store as the replay memory.

Reads like CleanRL's ``dqn.py``: a config dataclass (:class:`TrainConfig`, one docstring per
field; the CLI options mirror it), the algorithm in :class:`Learner` (``# ALGO LOGIC``), and the
loops (``train_online``, ``train_actors``, ``train_offline``) top to bottom.

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
  ``BatchLoader``; ``bc`` (cross-entropy on the Q-network's logits), ``dqn`` (double DQN) or
  ``cql`` (discrete CQL, Kumar et al. 2020: ``alpha * (logsumexp_a Q(s, a) - Q(s, a_data))``
  added to the double-DQN loss). A store of Box actions trains ``td3bc``, ``iql`` or ``bc``
  with :class:`mmreplay.train.continuous.ContinuousLearner` in the same loop (and the same run
  directory, metrics and checkpoints); an algorithm that does not fit the store's actions is one
  ``ValueError``.

Every run has a directory (``run_dir``) with ``metrics.csv`` (and TensorBoard), ``checkpoint.pt``
(atomic, every ``checkpoint_every`` steps; ``resume=True`` continues from it with the same store),
``policy.pt`` (the final network), ``best_policy.pt`` (the best evaluation) and ``config.json``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..agent.evaluation import greedy_actions
from ..agent.policy import FrameStack, QNetwork, epsilon_greedy, network_spec, save_policy
from ._run import (
    Batches,
    Run,
    TrainResult,
    check_eval_env,
    count_actions,
    finish_training,
    next_multiple,
    offline_n_actions,
    open_store_for_env,
    record_training,
    to_tensors,
)
from .checkpoint import restore_torch_rng

# the config lives in its own module (no torch there); re-exported for `from mmreplay.train import ...`
from .config import (  # noqa: F401
    Algo,
    TrainConfig,
    _run_dir,
    atari_config,
    default_run_dir,
    linear_schedule,
    resume_config,
    target_update_interval_of,
    validate_config,
)

log = logging.getLogger(__name__)


# -- ALGO LOGIC ---------------------------------------------------------------------------------------
def qnet_spec(cfg: TrainConfig, schema: Any, n_actions: int) -> dict[str, Any]:
    """The Q network a run trains for ``schema``'s observations (``network_spec`` of its config)."""
    return network_spec(schema, n_actions, frame_stack=cfg.frame_stack, hidden=cfg.hidden, dueling=cfg.dueling,
                        minatar=cfg.minatar)


class Learner:
    """The Q network, its target, the optimizer, and one gradient step of DQN, CQL or BC."""

    def __init__(self, cfg: TrainConfig, spec: dict[str, Any], device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.q = QNetwork(spec).to(device)
        self.target = copy.deepcopy(self.q).requires_grad_(False) if cfg.algo != "bc" else None
        # fused Adam: one kernel for every parameter (faster than the per-tensor loop for small nets; an ad-hoc
        # timing, not re-measured by benchmarks/)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=cfg.learning_rate, fused=True) if cfg.optimizer == "adam" \
            else torch.optim.RMSprop(self.q.parameters(), lr=cfg.learning_rate, alpha=0.95, eps=0.01, momentum=0.95,
                                     centered=True)  # the MinAtar paper's DQN (config.minatar_config)
        self.q_fwd = torch.compile(self.q) if cfg.compile else self.q
        self.target_fwd = torch.compile(self.target) if cfg.compile and self.target is not None else self.target
        self.amp = cfg.amp and device.type == "cuda"
        if cfg.amp and not self.amp:
            log.warning("--amp is for CUDA (bf16 autocast); training in float32 on %s", device)
        self.updates = 0
        # (target, online) pairs of parameters, then of buffers (update_target)
        self._pairs: tuple[list[tuple[torch.Tensor, torch.Tensor]], list[tuple[torch.Tensor, torch.Tensor]]] | None = None
        self.target_every = target_update_interval_of(cfg)
        # the losses and Q(s, a) of the updates since the last read_stats (no sync per update): kept, then
        # summed 1,024 updates at a time into _sums (loss, Q) over _counts (updates, Q values)
        self._losses: list[torch.Tensor] = []
        self._qs: list[torch.Tensor] = []
        self._sums = torch.zeros(2, device=device)
        self._counts = [0, 0]
        if cfg.cuda_graphs:  # the update captured and replayed (train/graphs.py), or eager with a warning
            from .graphs import GraphedUpdate

            self.update = GraphedUpdate(self)  # type: ignore[method-assign]

    @property
    def policy_net(self) -> QNetwork:
        """The network a policy file holds and evaluation runs: the Q network."""
        return self.q

    def checkpoint_parts(self) -> dict[str, Any]:
        """What ``Run.maybe_checkpoint`` writes: the Q network, its target and the optimizer."""
        return {"q": self.q, "target": self.target, "optimizer": self.optimizer, "extra": None}

    def autocast(self) -> Any:
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.amp else contextlib.nullcontext()

    def update(self, b: Any) -> torch.Tensor | None:
        """One gradient step on a batch of tensors; returns the TD errors (``None`` for BC)."""
        cfg = self.cfg
        action = b.action.long().view(-1, 1)
        td = None
        with self.autocast():
            q_all = self.q_fwd(b.obs).float()
            q_sa = q_all.gather(1, action).squeeze(1)
            if cfg.algo == "bc":
                loss = F.cross_entropy(q_all, action.squeeze(1))
            else:
                with torch.no_grad():
                    q_next_target = self.target_fwd(b.next_obs).float()
                    if cfg.double:
                        best = self.q_fwd(b.next_obs).argmax(dim=1, keepdim=True)
                        q_next = q_next_target.gather(1, best).squeeze(1)
                    else:
                        q_next = q_next_target.max(dim=1).values
                    if b.discount is not None:  # n-step / frame-stack views: gamma^m, 0 after termination
                        y = b.reward.float() + b.discount.float() * q_next
                    else:  # r + gamma * (1 - terminated) * q_next, as two ops
                        y = b.reward.float().add(q_next.masked_fill_(b.terminated.bool(), 0.0), alpha=cfg.gamma)
                if cfg.prioritized or b.weights is not None:  # TD errors for the priorities, importance weights
                    td = q_sa - y
                    per_sample = F.smooth_l1_loss(q_sa, y, reduction="none") if cfg.loss == "huber" else td.pow(2)
                    if b.weights is not None:
                        per_sample = per_sample * b.weights.float()
                    loss = per_sample.mean()
                else:  # one fused op (each small op costs a few us on the CPU)
                    loss = F.smooth_l1_loss(q_sa, y) if cfg.loss == "huber" else F.mse_loss(q_sa, y)
                if cfg.algo == "cql":  # push down Q of unseen actions, up Q of the data's
                    loss = loss + cfg.cql_alpha * (torch.logsumexp(q_all, dim=1) - q_sa).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.q.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        self.updates += 1
        if self.target is not None and self.updates % self.target_every == 0:
            self.update_target()
        self._losses.append(loss.detach())  # summed in blocks (no op per update beyond the detaches)
        self._qs.append(q_sa.detach())
        if len(self._losses) == 1024:
            self._fold()
        return None if td is None else td.detach()

    def _fold(self) -> None:
        """Add the kept losses and Q values to the sums (memory stays bounded however rarely stats are read)."""
        if self._losses:
            self._sums += torch.stack([torch.stack(self._losses).sum(), torch.cat(self._qs).sum()])
            self._counts[0] += len(self._losses)
            self._counts[1] += sum(len(x) for x in self._qs)
            self._losses, self._qs = [], []

    @torch.no_grad()
    def update_target(self) -> None:
        assert self.target is not None
        if self._pairs is None:  # the tensors, gathered once (a state_dict walk per copy cost ~1 ms here)
            self._pairs = ([*zip(self.target.parameters(), self.q.parameters())],
                           [*zip(self.target.buffers(), self.q.buffers())])
        params, buffers = self._pairs
        if self.cfg.tau >= 1.0:
            for t, p in (*params, *buffers):
                t.copy_(p)
        else:
            for t, p in params:
                t.lerp_(p, self.cfg.tau)

    def read_stats(self) -> tuple[float | None, float | None]:
        """Mean loss and mean Q(s, a) since the last call."""
        self._fold()
        n, m = self._counts
        if not n:
            return None, None
        loss, q = self._sums.tolist()
        self._sums.zero_()
        self._counts = [0, 0]
        return loss / n, q / m

    def load(self, payload: dict[str, Any]) -> None:
        self.q.load_state_dict(payload["state_dict"])
        if self.target is not None and payload.get("target") is not None:
            self.target.load_state_dict(payload["target"])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.updates = int(payload["counters"]["updates"])


def train(cfg: TrainConfig) -> TrainResult:
    """Run a training job described by ``cfg`` (see the module docstring)."""
    if cfg.ray is not None and cfg.actors < 1:
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
    known = {f.name for f in fields(TrainResult)}
    return TrainResult(**{k: v for k, v in data.items() if k in known})


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
    store = open_store_for_env(cfg, envs)
    n_actions = count_actions(envs.single_action_space)
    learner = Learner(cfg, qnet_spec(cfg, store.schema, n_actions), run.device)
    # a round every `every` env steps: at most one per vector step (train_freq below num_envs: every
    # num_envs env steps, as SB3 and CleanRL train once per vector step). Env steps do not count
    # next-step autoreset lanes, so updates per env step do not depend on how often episodes end
    every = max(cfg.train_freq, cfg.num_envs)
    total_updates = max(1, (cfg.steps - cfg.learning_starts) // every * cfg.gradient_steps)
    sampler = run.make_sampler(store, total_updates, refresh_interval_s=None)  # refreshed below, not by the clock
    rng = np.random.default_rng(cfg.seed)
    if run.payload:
        learner.load(run.payload)
        rng.bit_generator.state = run.payload["rng"]
        restore_torch_rng(run.payload)
    # rows are published by the refresh before each training round; the writer's publisher thread
    # (rows visible to other processes within the interval) wakes once a second, not every 5 ms:
    # each wake takes the GIL from this loop (measured: ~2x the loop's wall at CleanRL's settings)
    writer = store.writer(lanes=cfg.num_envs, cast="safe", publish_interval_s=1.0)
    n = cfg.num_envs
    obs, _ = envs.reset(seed=cfg.seed + run.env_steps)
    stack = FrameStack(cfg.frame_stack) if cfg.frame_stack > 1 else None
    x = stack.reset(obs) if stack is not None else obs
    autoreset = np.zeros(n, np.bool_)  # this step only resets the lane (next-step autoreset)
    resets = 0  # autoreset.sum(), kept as an int (the per-step bookkeeping stays off numpy when nothing ends)
    ep_return = np.zeros(n)
    # train at every multiple of train_freq past learning_starts (as SB3 and CleanRL do)
    next_train = next_multiple(max(cfg.learning_starts, run.env_steps), every)
    decay = cfg.exploration_fraction * cfg.steps
    epsilon = linear_schedule(cfg.start_e, cfg.end_e, decay, run.env_steps)
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
            epsilon = linear_schedule(cfg.start_e, cfg.end_e, decay, run.env_steps)
            if resets == n:
                actions = np.zeros(n, np.int64)
            else:
                actions = epsilon_greedy(partial(greedy_actions, learner.q, x, run.device), n_actions, epsilon, rng, n)
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
                # the rows written up to the last refresh can be drawn; a refresh every REFRESH_ROWS env steps
                # or more (one per round at train_freq >= REFRESH_ROWS), at fixed steps: the run is
                # reproducible (no directory listing: the writer's new segments are scanned for)
                if run.env_steps - refreshed >= REFRESH_ROWS:
                    store.refresh(scan=False)
                    refreshed = run.env_steps
                for _ in range(cfg.gradient_steps):
                    t0 = time.perf_counter()
                    b = sampler.sample(cfg.batch_size)
                    t1 = time.perf_counter()
                    td = learner.update(to_tensors(b, run.device))
                    if cfg.prioritized and td is not None:
                        sampler.update_priorities(b.ids, td.abs().cpu().numpy())
                    run.updates += 1
                    run.wait_s += t1 - t0
                    run.busy_s += time.perf_counter() - t1
                    run.profile_step()
            run.maybe_log(learner, epsilon)
            stopped = run.maybe_eval(learner, cfg.eval_env or cfg.env_id) or interrupted
            run.maybe_checkpoint(learner, sampler, rng, epsilon, writer=writer)
        writer.close(last_obs=flatten_obs(obs) if isinstance(obs, dict) else obs)
        res = run.finish(learner, sampler, rng, epsilon, cfg.eval_env or cfg.env_id, stopped)
        status = "interrupted" if stop is not None and stop.stop_requested else "done"
        return res
    finally:
        writer.close()
        finish_training(store, prov, status, run.env_steps, cut_rows)
        envs.close()
        store.close()


# -- online, actor processes ----------------------------------------------------------------------------
def train_actors(cfg: TrainConfig, stop: Any = None) -> TrainResult:
    """Actors in separate processes write the store; the learner samples it through a loader,
    publishes weights every ``publish_every`` updates, and keeps the samples-per-insert ratio."""
    try:
        from ..actors.pool import ActorPool
    except ImportError as exc:
        raise NotImplementedError("--actors needs mmreplay.ActorPool, which this install lacks") from exc
    from ..agent.envs import make_env

    probe = make_env(cfg.env_id, atari=cfg.atari or None, max_episode_steps=cfg.max_episode_steps)
    if cfg.ray is not None and cfg.segment_records is None:  # rows ship a sealed segment at a time: small ones
        from ..cluster.driver import cluster_segment_records
        from ..core.schema import Schema

        cfg = replace(cfg, segment_records=cluster_segment_records(
            Schema.from_spaces(probe.observation_space, probe.action_space), cfg.envs_per_actor))
    run = Run(cfg, _run_dir(cfg))
    n_actions = count_actions(probe.action_space)

    class _Spaces:  # what _open_store_for_env reads from a vector env
        single_observation_space = probe.observation_space
        single_action_space = probe.action_space

    store = open_store_for_env(cfg, _Spaces)
    probe.close()
    try:
        prov = record_training(store, cfg, run.dir, shared=cfg.shared_store)
    except BaseException:
        store.close()
        raise
    learner = Learner(cfg, qnet_spec(cfg, store.schema, n_actions), run.device)
    total_updates = max(1, (cfg.steps - cfg.learning_starts) // cfg.train_freq * cfg.gradient_steps)
    spi = cfg.samples_per_insert or cfg.batch_size * cfg.gradient_steps / cfg.train_freq
    if run.payload:
        learner.load(run.payload)
        restore_torch_rng(run.payload)
    decay = cfg.exploration_fraction * cfg.steps
    policy_path = run.dir / "actor_policy.pt"
    epsilon = linear_schedule(cfg.start_e, cfg.end_e, decay, run.env_steps)
    save_policy(policy_path, learner.q, epsilon=epsilon, step=run.env_steps, **run.meta())
    store_path = str(store.path)
    base_rows = run.env_steps  # env steps of earlier sessions (the pool counts its own)
    if cfg.ray is not None:  # Ray actors on any node; rows come back through archives, weights through Ray
        from ..cluster.driver import RayActorPool

        pool: Any = RayActorPool(cfg.env_id, store_path, actors=cfg.actors, envs_per_actor=cfg.envs_per_actor,
                                 policy_path=str(policy_path), seed=cfg.seed + run.env_steps,
                                 atari=cfg.atari or None, max_episode_steps=cfg.max_episode_steps,
                                 address=None if cfg.ray == "local" else cfg.ray, archive_url=cfg.ray_archive)
    else:
        pool = ActorPool(cfg.env_id, store_path, actors=cfg.actors, envs_per_actor=cfg.envs_per_actor,
                         policy_path=str(policy_path), seed=cfg.seed + run.env_steps, atari=cfg.atari or None,
                         max_episode_steps=cfg.max_episode_steps, run=prov)
    slack = max(cfg.train_freq, cfg.actors * cfg.envs_per_actor * 4)

    warmup = max(cfg.learning_starts - base_rows, 0)

    def allowed(updates: int) -> int:  # env steps the actors may have stored for this many updates
        return warmup + math.ceil(updates * cfg.batch_size / spi) + slack

    seen = [0]  # episodes of this session's pool already counted
    pool.start()  # the actors load the policy file written above
    pool.allow(allowed(0))
    sampler = None
    stopped = False
    try:
        while pool.env_steps < max(warmup, 1) and not (stop is not None and stop.stop_requested):  # warm-up
            time.sleep(0.01)
            pool.check()
            _take_returns(run, pool, seen)
        store.refresh()
        sampler = run.make_sampler(store, total_updates)
        session_updates = 0
        batches = Batches(sampler, cfg, run.device)
        run.start_clock()
        try:
            while run.env_steps < cfg.steps and not stopped:
                # RATE LIMIT: at most samples_per_insert sampled transitions per inserted one
                while (session_updates + 1) * cfg.batch_size > spi * (pool.env_steps - warmup + slack) and \
                        base_rows + pool.env_steps < cfg.steps:
                    time.sleep(0.0005)
                    pool.check()
                if batches.loader is None and session_updates % 16 == 0:
                    store.refresh(scan=False)  # the actors' newest rows (new segments: every second)
                b = batches.next()
                td = learner.update(b)
                if cfg.prioritized and td is not None:
                    batches.update_priorities(b.ids, td.abs())
                session_updates += 1
                run.updates += 1
                pool.allow(allowed(session_updates))
                run.env_steps = base_rows + pool.env_steps
                epsilon = linear_schedule(cfg.start_e, cfg.end_e, decay, run.env_steps)
                if session_updates % cfg.publish_every == 0:  # PUBLISH: atomic file, actors reload it
                    save_policy(policy_path, learner.q, epsilon=epsilon, step=run.env_steps, **run.meta())
                run.profile_step()
                if run.step >= run.next_log:  # the actors' episode returns are read here only (a queue poll)
                    _take_returns(run, pool, seen)
                    run.maybe_log(learner, epsilon, data_wait=batches.wait_fraction())
                stopped = run.maybe_eval(learner, cfg.eval_env or cfg.env_id) or (stop is not None
                                                                                  and stop.stop_requested)
                run.maybe_checkpoint(learner, None, None, epsilon)
            data_wait = batches.total_wait_fraction()
        finally:
            batches.close()
        run.env_steps = base_rows + pool.env_steps
        _take_returns(run, pool, seen)
    finally:
        pool.stop()
    store.refresh()
    status = "failed"
    try:
        res = run.finish(learner, None, None, epsilon, cfg.eval_env or cfg.env_id, stopped)
        res.data_wait = data_wait
        status = "interrupted" if stop is not None and stop.stop_requested else "done"
        return res
    finally:
        finish_training(store, prov, status, run.env_steps, [])  # (the actors recorded the steps they cut)
        store.close()


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
    """BC, DQN or CQL (discrete actions), TD3+BC, IQL or BC (Box actions, ``continuous.py``) from a
    saved store, read-only; ``steps`` learner updates."""
    from ..storage import open_store

    run = Run(cfg, _run_dir(cfg))
    if cfg.archive:
        from ..archive.zarr_io import open_archive

        store = open_archive(cfg.archive)  # whole segments fetched into a temporary local cache
    else:
        store = open_store(cfg.store, mode="r")
    try:
        from ..agent.continuous import is_continuous
        from .continuous import check_algo_fits

        check_algo_fits(cfg.algo, store.schema, str(cfg.archive or cfg.store))
        waiting = store.check_counts()["unchecked_segments"]
        if waiting:  # a copied or modified store: its segments are checked before training samples them
            log.info("checking %d segment(s) not checked since they were written or copied", waiting)
            store.wait_checked()
        eval_env = cfg.eval_env or cfg.env_id or store.metadata.get("env_id")
        check_eval_env(store, eval_env, cfg)  # one line, before anything starts
        learner: Any
        if is_continuous(store.schema):  # TD3+BC, IQL or BC for Box actions (continuous.py)
            from .continuous import make_learner

            learner = make_learner(cfg, store, eval_env, run.device)
        else:
            n_actions = offline_n_actions(store, eval_env, cfg)
            learner = Learner(cfg, qnet_spec(cfg, store.schema, n_actions), run.device)
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
            if cfg.prioritized and td is not None:
                batches.update_priorities(b.ids, td.abs())
            run.updates += 1
            run.profile_step()
            if run.step >= run.next_log:
                run.maybe_log(learner, data_wait=batches.wait_fraction())
            stopped = run.maybe_eval(learner, eval_env) or (stop is not None and stop.stop_requested)
            run.maybe_checkpoint(learner, sampler, None, None)
        batches.close()
        data_wait = batches.total_wait_fraction()
        res = run.finish(learner, sampler, None, None, eval_env, stopped)
        res.data_wait = data_wait
        return res
    finally:
        batches.close()
        store.close()
