"""Atari-shaped replay benchmark: frame-stacked sampling speed and storage per step, one process run.

    .venv/bin/python benchmarks/atari.py            # full size: capacity 200,000, 3 s loops, 3 repeats
    .venv/bin/python benchmarks/atari.py --quick    # smoke run: capacity 20,000, 1 s loops, 1 repeat
    .venv/bin/python benchmarks/atari.py --systems mmreplay,cpprb --lanes 1 8 --interleaved --repeats 5
                                                    # data written by 1 env and by 8 (a vector env's lanes)

What it measures
----------------
The DQN-on-Atari replay workload: single frames 84x84 uint8, stacks of 4, a buffer of 200,000
transitions, uniform batches of 32 and of 256 returned as NumPy arrays: ``obs`` and ``next_obs``
of shape (B, 4, 84, 84) uint8, plus ``action``, ``reward`` and ``done``. The data are synthetic
episodes of random length 50-500 steps, ending in a terminal flag, whose frames cycle through a
pool of 1,000 distinct random frames (generation stays cheap). Every frame carries its pool id
in its first two pixels, so a check run before the timings can tell for each system whether
the stacks it returns are the right frames in the right order (``sanity`` lines).

Systems (each filled once with the same episodes, then sampled):

* ``mmreplay`` (public API), disk-backed segments under ``--dir`` (page cache warm after the fill):
  single frames are stored once, as ``Schema.transition(obs_shape=(84, 84), obs_dtype=uint8)``
  rows written with ``add_batch`` (an episode of T actions is T+1 rows, the final observation
  last); ``UniformSampler(store, frame_stack=4)`` builds the stacks at sampling time. Two more
  rows: ``n_step=3, gamma=0.99`` with frame stacks, and ``PrioritizedSampler(frame_stack=4,
  n_step=3)`` timed as one op = sample + ``update_priorities`` of the batch.
* cpprb ``ReplayBuffer`` with ``next_of="obs"`` and ``stack_compress="obs"``, in RAM: the
  memory compression cpprb documents for Atari. cpprb compresses the *last* axis, so obs is
  declared (84, 84, 4) (declared (4, 84, 84), cpprb slides its window over the last 84-pixel
  axis and hands back corrupted frames); its batches are handed back as (B, 4, 84, 84) views
  (``np.moveaxis``, no copy). Memory: RSS growth over its construction and fill.
* TorchRL ``ReplayBuffer(storage=LazyMemmapStorage(...))``: stacked obs and next_obs (4, 84, 84)
  stored per transition in memory-mapped files on disk (how users do it without a
  frame-stack-aware storage): ~56 KB per transition, ~11 GB at 200,000. Free disk is checked
  first; TorchRL alone gets a smaller capacity if it does not fit, and the output says so.
* Stable-Baselines3 ``ReplayBuffer(optimize_memory_usage=True)`` with observation space
  Box(0, 255, (4, 84, 84), uint8): SB3's Atari setting (stacked obs stored, next_obs = next
  row), in RAM (~5.6 GB at 200,000). Available memory is checked first.
* ``numpy gather``: a pre-stacked in-RAM array (N, 4, 84, 84) uint8 and ``arr[idx]``,
  ``arr[idx + 1]``, the floor any in-RAM stacked store pays. To keep the full-size run within
  RAM, the array is SB3's own observation array (the same layout) when SB3 is present.

Lanes (``--lanes 1 8``): a vector env of L envs writes L rows per step. With L > 1 the plan's
episodes are dealt to L lanes (each to the lane whose stream is shortest so far), written
through ``store.writer(lanes=L)`` in chunks of 256 steps (the streams are cut to the shortest;
a cut episode's last steps are not sampled), and the three mmreplay rows are repeated for that
store, marked ``[L lanes]``. For frame-sized rows the writer gives each lane a chain of segments
of its own by default (``lane_segments``, when the capacity holds 4 segments per lane: the full
size does, ``--quick`` does not), so a stack is one contiguous read; ``--interleaved`` adds a
store written as (time, lane) rows (``lane_segments=False``), where the frames of one stack are
L rows apart, marked ``[L lanes, (time, lane) rows]``. cpprb has no lanes:
its ``stack_compress`` rebuilds a stack from the previous *adds*, so it is correct only when fed
one stream. The row ``cpprb ... [L lanes]`` feeds it L envs' steps interleaved, one ``add`` per
env per vector step, as a vector-env loop would: its sanity line counts the wrong stacks, and it
is left out of the best-peer ratios.

Timing: batches per second at B=32 and B=256, each a time-bounded loop (``--seconds``, default
3 s) after one warm-up call; ``--repeats`` (default 3) interleaved repeats of the sampling phase
(systems filled once), medians reported. Bytes per step: mmreplay, the sum of the file sizes
under ``<store>/segments`` over ``store.num_rows``; TorchRL, its memmap files over its stored
transitions; SB3 and the numpy baseline, their arrays' ``nbytes`` over capacity; cpprb, RSS
growth over stored transitions.

Targets (full size): mmreplay with frame stacks, sampling from its disk-backed segments with the
page cache warm, at least 1.3x the best peer (cpprb, TorchRL, SB3) at batch 32 and 1.2x at
batch 256, at least 4x TorchRL's memmap storage at both, storing ~7 KB per step (one 84x84
frame, 7,056 bytes, plus the scalar fields).

Threads: every system samples on one thread. numpy, cpprb and mmreplay's kernels are
single-threaded; torch (behind SB3's and TorchRL's copies) is set to ``--torch-threads``
(default 1): on a small machine with other work running, torch's intra-op thread pool made a
1 MB tensor copy ~100x slower (7.6 ms against 0.05 ms on a 2-core box with one core busy).

Temporary data go under /var/tmp (``--dir``) and are deleted at the end.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from functools import partial
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kit  # noqa: E402
from kit import POOL, H, W, dir_bytes, gb, make_pool, mem_available, quiesce, rss  # noqa: E402

import mmreplay  # noqa: E402

STACK = 4
N_ACTIONS = 18
FRAME_BYTES = H * W
STACKED_BYTES = STACK * H * W
BATCHES = (32, 256)
# Offsets of a stack's frames relative to the step (oldest first), clamped at the episode start.
OFF = np.arange(-(STACK - 1), 1)
PEER_NAMES = ("cpprb", "torchrl", "sb3")
MM_MAIN = "mmreplay (frame stacks)"

Batch = dict[str, np.ndarray]


# -- data -------------------------------------------------------------------------------------
@dataclass
class Plan:
    """The episodes every system is filled with: lengths (actions per episode), the global
    frame counter of each episode's first observation, and per-transition action/reward."""

    lengths: np.ndarray
    frame_start: np.ndarray
    trans_start: np.ndarray
    action: np.ndarray
    reward: np.ndarray

    @property
    def transitions(self) -> int:
        return int(self.lengths.sum())

    @property
    def rows(self) -> int:  # mmreplay rows: T + 1 per episode
        return self.transitions + len(self.lengths)


def make_plan(n: int, rng: np.random.Generator) -> Plan:
    lengths: list[int] = []
    total = 0
    while total < n:
        t = min(int(rng.integers(50, 501)), n - total)
        lengths.append(t)
        total += t
    lens = np.array(lengths, np.int64)
    frame_start = np.concatenate([[0], np.cumsum(lens + 1)[:-1]])
    trans_start = np.concatenate([[0], np.cumsum(lens)[:-1]])
    action = rng.integers(0, N_ACTIONS, n).astype(np.int64)
    reward = rng.choice(np.array([-1.0, 0.0, 0.0, 1.0], np.float32), n)
    return Plan(lens, frame_start, trans_start, action, reward)


@dataclass
class Episode:
    T: int
    first: int  # index of its first transition
    frames: np.ndarray  # (T+1,) pool ids of its observations
    obs_ids: np.ndarray  # (T, STACK) pool ids of each obs stack
    next_ids: np.ndarray  # (T, STACK) pool ids of each next_obs stack
    action: np.ndarray
    reward: np.ndarray
    done: np.ndarray  # terminal flag on the last transition


def episodes(plan: Plan, limit: int | None = None) -> Iterator[Episode]:
    """The plan's episodes in order; with ``limit``, only the first ``limit`` transitions (the
    last episode cut short, still ending in a terminal flag)."""
    left = plan.transitions if limit is None else min(limit, plan.transitions)
    for T, g0, s in zip(plan.lengths.tolist(), plan.frame_start.tolist(), plan.trans_start.tolist()):
        if left <= 0:
            return
        T = min(T, left)
        left -= T
        t = np.arange(T)[:, None]
        done = np.zeros(T, np.bool_)
        done[-1] = True
        yield Episode(
            T=T,
            first=s,
            frames=(g0 + np.arange(T + 1)) % POOL,
            obs_ids=(g0 + np.maximum(t + OFF, 0)) % POOL,
            next_ids=(g0 + np.maximum(t + 1 + OFF, 0)) % POOL,
            action=plan.action[s : s + T],
            reward=plan.reward[s : s + T],
            done=done,
        )


class Scratch:
    """Reused buffers for stacked episodes (no allocation churn while filling, so RSS growth
    measures the buffer under test)."""

    def __init__(self, pool: np.ndarray, max_t: int = 500) -> None:
        self.pool = pool
        self.obs = np.zeros((max_t, STACK, H, W), np.uint8)
        self.nxt = np.zeros((max_t, STACK, H, W), np.uint8)

    def stacks(self, ep: Episode) -> tuple[np.ndarray, np.ndarray]:
        o, n = self.obs[: ep.T], self.nxt[: ep.T]
        np.take(self.pool, ep.obs_ids, axis=0, out=o)
        np.take(self.pool, ep.next_ids, axis=0, out=n)
        return o, n


# -- systems ----------------------------------------------------------------------------------
@dataclass
class System:
    name: str
    storage: str
    op: Callable[[int], object]  # the timed operation
    sample: Callable[[int], Batch]  # for the sanity check
    bytes_per_step: float
    one_step: bool = True  # next_obs is the obs of the next step (not n steps on)
    notes: list[str] = field(default_factory=list)


def lane_streams(plan: Plan, lanes: int) -> list[list[Episode]]:
    """The plan's episodes dealt to ``lanes`` envs: each episode goes to the lane whose stream (T + 1
    rows per episode) is shortest so far, as a vector env's lanes run their own episodes."""
    streams: list[list[Episode]] = [[] for _ in range(lanes)]
    rows = [0] * lanes
    for ep in episodes(plan):
        j = rows.index(min(rows))
        streams[j].append(ep)
        rows[j] += ep.T + 1
    return streams


def lane_rows(stream: list[Episode], length: int) -> dict[str, np.ndarray]:
    """One lane's first ``length`` rows (pool id of the frame, action, reward, terminated); an
    episode's final observation is a row of its own, as ``mmreplay.Writer`` stores it."""
    frames = np.concatenate([ep.frames for ep in stream])[:length]
    zero_i, zero_f = np.zeros(1, np.int64), np.zeros(1, np.float32)
    action = np.concatenate([np.concatenate([ep.action, zero_i]) for ep in stream])[:length]
    reward = np.concatenate([np.concatenate([ep.reward, zero_f]) for ep in stream])[:length]
    term = np.concatenate([np.concatenate([ep.done, [False]]) for ep in stream])[:length]
    return {"frames": frames, "action": action, "reward": reward, "terminated": term}


class MMReplay:
    def __init__(self, plan: Plan, pool: np.ndarray, base: Path, lanes: int = 1, lane_segments: bool | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="mmreplay-", dir=base)) / "store"
        self.lanes, self.lane_segments = lanes, lane_segments
        schema = mmreplay.Schema.transition(obs_shape=(H, W), obs_dtype=np.uint8)
        # capacity in rows (T + 1 per episode): all the plan's transitions fit, nothing is evicted
        self.store = mmreplay.create_store(self.path, schema, capacity=plan.rows)
        if lanes > 1:
            self._fill_lanes(plan, pool)
        else:
            self._fill_one(plan, pool)
        self.store.refresh()
        self.rows = self.store.num_rows
        self.seg_bytes = dir_bytes(self.path / "segments")
        self.seg_alloc = sum(p.stat().st_blocks * 512 for p in (self.path / "segments").rglob("*") if p.is_file())
        self.bytes_per_step = self.seg_bytes / self.rows
        self.rng = np.random.default_rng(1)

    def _fill_lanes(self, plan: Plan, pool: np.ndarray, chunk: int = 256) -> None:
        """``lanes`` envs written through one writer, rows (time, lane): a lane's consecutive steps are
        ``lanes`` rows apart. The streams are cut to the shortest (a cut episode has no final row: its
        last steps are not sampled)."""
        streams = lane_streams(plan, self.lanes)
        length = min(sum(ep.T + 1 for ep in st) for st in streams)
        cols = [lane_rows(st, length) for st in streams]
        with self.store.writer(lanes=self.lanes, lane_segments=self.lane_segments) as w:
            self.lane_segments = w.lane_segments  # the writer's choice when None
            for t0 in range(0, length, chunk):
                t1 = min(t0 + chunk, length)
                ids = np.stack([c["frames"][t0:t1] for c in cols], axis=1)  # (T, lanes)
                w.add_batch(obs=pool[ids], **{k: np.stack([c[k][t0:t1] for c in cols], axis=1)
                                              for k in ("action", "reward", "terminated")},
                            truncated=np.zeros(ids.shape, np.bool_))

    def _fill_one(self, plan: Plan, pool: np.ndarray) -> None:
        with self.store.writer(lanes=1) as w:
            for ep in episodes(plan):
                R = ep.T + 1
                action = np.zeros((R, 1), np.int64)
                action[: ep.T, 0] = ep.action
                reward = np.zeros((R, 1), np.float32)
                reward[: ep.T, 0] = ep.reward
                term = np.zeros((R, 1), np.bool_)
                term[: ep.T, 0] = ep.done
                w.add_batch(obs=pool[ep.frames][:, None], action=action, reward=reward, terminated=term,
                            truncated=np.zeros((R, 1), np.bool_))

    @staticmethod
    def _batch(b: mmreplay.TransitionBatch) -> Batch:
        return {"obs": b.obs, "next_obs": b.next_obs, "action": b.action, "reward": b.reward, "done": b.terminated}

    def systems(self) -> list[System]:
        layout = "" if self.lanes == 1 else (" into lane segments (a chain per lane)" if self.lane_segments
                                             else " as (time, lane) rows")
        note = (f"{self.rows:,} rows (T+1 per episode) written by {self.lanes} lane(s){layout}; segment files "
                f"{gb(self.seg_bytes)} by size, {gb(self.seg_alloc)} allocated on disk "
                f"({self.seg_alloc / self.rows:,.0f} bytes/row)")
        tag = lanes_tag(self.lanes, interleaved=self.lane_segments is False)
        out = []
        s1 = mmreplay.UniformSampler(self.store, frame_stack=STACK, seed=0)

        def uniform(b: int, s=s1) -> Batch:
            return self._batch(s.sample(b))

        out.append(System(MM_MAIN + tag, "disk segments", uniform, uniform, self.bytes_per_step, notes=[note]))
        s3 = mmreplay.UniformSampler(self.store, frame_stack=STACK, n_step=3, gamma=0.99, seed=0)

        def nstep(b: int, s=s3) -> Batch:
            return self._batch(s.sample(b))

        out.append(System("mmreplay (n-step 3 + frame stacks)" + tag, "disk segments", nstep, nstep, self.bytes_per_step,
                          one_step=False))
        per = mmreplay.PrioritizedSampler(self.store, frame_stack=STACK, n_step=3, seed=0)
        rng = self.rng

        def per_op(b: int, s=per) -> Batch:
            batch = s.sample(b)
            s.update_priorities(batch.ids, rng.exponential(1.0, b))
            return self._batch(batch)

        def per_sample(b: int, s=per) -> Batch:
            return self._batch(s.sample(b))

        out.append(System("mmreplay PER (sample+update, n-step 3, stacks)" + tag, "disk segments", per_op, per_sample,
                          self.bytes_per_step, one_step=False))
        return out

    def close(self) -> None:
        self.store.close()


def lanes_tag(lanes: int, interleaved: bool = False) -> str:
    return "" if lanes == 1 else f" [{lanes} lanes, (time, lane) rows]" if interleaved else f" [{lanes} lanes]"


def make_cpprb(plan: Plan, scratch: Scratch, lanes: int = 1) -> System:
    """cpprb fed one stream (``lanes=1``: its compression is right), or ``lanes`` envs' steps
    interleaved as a vector-env loop adds them (one ``add`` per env per step): ``stack_compress``
    then rebuilds stacks from the previous *adds*, which belong to other envs."""
    from cpprb import ReplayBuffer

    n = plan.transitions
    gc.collect()
    before = rss()
    rb = ReplayBuffer(
        n,
        {
            # stack_compress compresses the LAST axis, so the stack goes last (cpprb's Atari layout)
            "obs": {"shape": (H, W, STACK), "dtype": np.uint8},
            "act": {"dtype": np.int64},
            "rew": {"dtype": np.float32},
            "done": {"dtype": np.float32},
        },
        next_of="obs",
        stack_compress="obs",
    )
    if lanes == 1:
        for ep in episodes(plan):
            o, nx = scratch.stacks(ep)
            rb.add(obs=np.moveaxis(o, 1, -1), next_obs=np.moveaxis(nx, 1, -1), act=ep.action, rew=ep.reward,
                   done=ep.done.astype(np.float32))
            rb.on_episode_end()
    else:  # per vector step, one add per env (its right stacks), lanes interleaved
        streams = [iter([(ep, t) for ep in st for t in range(ep.T)]) for st in lane_streams(plan, lanes)]
        pool = scratch.pool
        live = list(range(lanes))
        while live:
            for j in list(live):
                step = next(streams[j], None)
                if step is None:
                    live.remove(j)
                    continue
                ep, t = step
                rb.add(obs=np.moveaxis(pool[ep.obs_ids[t]], 0, -1), next_obs=np.moveaxis(pool[ep.next_ids[t]], 0, -1),
                       act=ep.action[t], rew=ep.reward[t], done=float(ep.done[t]))
    gc.collect()
    stored = rb.get_stored_size()
    grown = rss() - before

    def sample(b: int) -> Batch:
        s = rb.sample(b)
        return {"obs": np.moveaxis(s["obs"], -1, 1), "next_obs": np.moveaxis(s["next_obs"], -1, 1),
                "action": s["act"].reshape(-1), "reward": s["rew"].reshape(-1), "done": s["done"].reshape(-1)}

    sysm = System("cpprb (next_of + stack_compress)" + lanes_tag(lanes), "RAM", sample, sample, grown / stored,
                  notes=[f"RSS growth {gb(grown)} for {stored:,} transitions; obs declared (84, 84, 4), "
                         "returned as (B, 4, 84, 84) moveaxis views"])
    sysm.keep = rb  # type: ignore[attr-defined]
    return sysm


def make_torchrl(plan: Plan, scratch: Scratch, base: Path, capacity: int) -> System:
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyMemmapStorage, RandomSampler, ReplayBuffer

    scratch_dir = tempfile.mkdtemp(prefix="torchrl-", dir=base)
    rb = ReplayBuffer(storage=LazyMemmapStorage(capacity, scratch_dir=scratch_dir), sampler=RandomSampler())
    for ep in episodes(plan, limit=capacity):
        o, nx = scratch.stacks(ep)
        rb.extend(TensorDict({
            "obs": torch.from_numpy(o), "next_obs": torch.from_numpy(nx),
            "action": torch.from_numpy(ep.action), "reward": torch.from_numpy(ep.reward),
            "done": torch.from_numpy(ep.done),
        }, batch_size=[ep.T]))
    stored = len(rb)

    def sample(b: int) -> Batch:
        td = rb.sample(b)
        return {"obs": td.get("obs").numpy(), "next_obs": td.get("next_obs").numpy(),
                "action": td.get("action").numpy(), "reward": td.get("reward").numpy(),
                "done": td.get("done").numpy()}

    notes = [f"{stored:,} transitions in {gb(dir_bytes(Path(scratch_dir)))} of memmap files; "
             f"torch threads {torch.get_num_threads()}"]
    sysm = System("TorchRL (LazyMemmapStorage)", "disk memmap", sample, sample,
                  dir_bytes(Path(scratch_dir)) / stored, notes=notes)
    sysm.keep = rb  # type: ignore[attr-defined]
    return sysm


def make_sb3(plan: Plan, scratch: Scratch) -> System:
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer

    n = plan.transitions
    rb = ReplayBuffer(n, spaces.Box(0, 255, (STACK, H, W), np.uint8), spaces.Discrete(N_ACTIONS), device="cpu",
                      n_envs=1, optimize_memory_usage=True, handle_timeout_termination=False)
    infos: list[dict] = [{}]
    for ep in episodes(plan):
        o, nx = scratch.stacks(ep)
        a, r, d = ep.action, ep.reward, ep.done
        for t in range(ep.T):
            rb.add(o[t : t + 1], nx[t : t + 1], a[t : t + 1], r[t : t + 1], d[t : t + 1], infos)
    nbytes = sum(getattr(rb, k).nbytes for k in ("observations", "actions", "rewards", "dones", "timeouts")
                 if getattr(rb, k, None) is not None)

    def sample(b: int) -> Batch:
        s = rb.sample(b)
        return {"obs": s.observations.numpy(), "next_obs": s.next_observations.numpy(),
                "action": s.actions.numpy().reshape(-1), "reward": s.rewards.numpy().reshape(-1),
                "done": s.dones.numpy().reshape(-1)}

    sysm = System("SB3 (optimize_memory_usage)", "RAM", sample, sample, nbytes / n,
                  notes=[f"arrays {gb(nbytes)}"])
    sysm.keep = rb  # type: ignore[attr-defined]
    return sysm


def make_numpy(plan: Plan, scratch: Scratch, shared: np.ndarray | None) -> System:
    n = plan.transitions
    if shared is not None:
        arr = shared.reshape(n, STACK, H, W)  # SB3's observation array (n_envs=1): a view
        notes = ["shares SB3's observation array (same layout), to stay within RAM"]
    else:
        arr = np.empty((n, STACK, H, W), np.uint8)
        for ep in episodes(plan):
            arr[ep.first : ep.first + ep.T] = scratch.stacks(ep)[0]
        notes = []
    action, reward = plan.action, plan.reward
    done = np.zeros(n, np.bool_)
    done[np.cumsum(plan.lengths) - 1] = True
    rng = np.random.default_rng(0)

    def sample(b: int) -> Batch:
        idx = rng.integers(0, n - 1, b)
        return {"obs": arr[idx], "next_obs": arr[idx + 1], "action": action[idx], "reward": reward[idx],
                "done": done[idx]}

    bpp = (arr.nbytes + action.nbytes + reward.nbytes + done.nbytes) / n
    return System("numpy gather (pre-stacked, RAM)", "RAM", sample, sample, bpp, notes=notes)


# -- sanity check -----------------------------------------------------------------------------
def _ids(stacks: np.ndarray, pool: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pool ids of every frame of (B, STACK, H, W) stacks, and whether each whole frame is
    exactly that pool frame."""
    s = np.asarray(stacks)
    ids = kit.frame_ids(s)
    known = ids < POOL
    ids = np.where(known, ids, 0)
    intact = known & (s == pool[ids]).all(axis=(2, 3))
    return ids, intact.all(axis=1)


def _ordered(ids: np.ndarray) -> np.ndarray:
    """Consecutive frames, with repeats of the first only (clamped at an episode start)."""
    d = (ids[:, 1:] - ids[:, :-1]) % POOL
    return ((d == 0) | (d == 1)).all(axis=1) & (np.diff(d, axis=1) >= 0).all(axis=1)


def sanity(sysm: System, pool: np.ndarray, b: int = 1024) -> str:
    out = sysm.sample(b)
    shapes = {k: tuple(np.shape(v)) for k, v in out.items()}
    types = {k for k, v in out.items() if not isinstance(v, np.ndarray)}
    oi, o_ok = _ids(out["obs"], pool)
    ni, n_ok = _ids(out["next_obs"], pool)
    o_ok &= _ordered(oi)
    n_ok &= _ordered(ni)
    if sysm.one_step:
        n_ok &= (ni[:, :-1] == oi[:, 1:]).all(axis=1) & ((ni[:, -1] - oi[:, -1]) % POOL == 1)
    done = np.asarray(out["done"]).reshape(-1).astype(bool)
    bad_o, bad_n = int((~o_ok).sum()), int((~n_ok).sum())
    bad_n_term = int((~n_ok & done).sum())
    msg = (f"obs {shapes['obs']} {np.asarray(out['obs']).dtype}, next_obs {shapes['next_obs']}; "
           f"wrong obs stacks {bad_o}/{b}, wrong next_obs stacks {bad_n}/{b} "
           f"({bad_n_term} of them on terminal transitions)")
    if types:
        msg += f"; NOT numpy: {sorted(types)}"
    return msg


# -- main -------------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=200_000, help="transitions per system")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each timed sampling loop")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats of the sampling phase")
    ap.add_argument("--quick", action="store_true", help="capacity 20,000, 1 s loops, 1 repeat")
    ap.add_argument("--dir", default="/var/tmp", help="where disk-backed data go (a temp dir inside, deleted)")
    ap.add_argument("--torchrl-capacity", type=int, default=None, help="override TorchRL's capacity")
    ap.add_argument("--torch-threads", type=int, default=1, help="torch.set_num_threads for SB3 and TorchRL")
    ap.add_argument("--systems", default="mmreplay,cpprb,torchrl,sb3,numpy", help="comma-separated subset")
    ap.add_argument("--lanes", type=int, nargs="+", default=[1],
                    help="mmreplay stores written by this many lanes (rows (time, lane), as a vector env writes "
                         "them), one store each, e.g. --lanes 1 8; with more than 1, cpprb is also fed that many "
                         "envs' steps interleaved (its stacks are then wrong: the sanity line counts them) [1]")
    ap.add_argument("--interleaved", action="store_true",
                    help="with --lanes L > 1, also a store written as (time, lane) rows (lane_segments=False), "
                         "next to the writer's default (lane segments, a chain per lane, when the capacity allows)")
    args = ap.parse_args()
    if args.quick:
        args.capacity, args.seconds, args.repeats = 20_000, 1.0, 1
    return args


def resource_plan(args: argparse.Namespace, plan: Plan, base: Path, wanted: set[str]) -> int:
    """Check disk and RAM for the systems wanted (SB3 dropped when RAM is short); TorchRL's capacity."""
    n = args.capacity
    per_trn_torchrl = 2 * STACKED_BYTES + 8 + 4 + 1
    stores = len(args.lanes) + (sum(x > 1 for x in args.lanes) if args.interleaved else 0)
    mm_est = stores * (plan.rows * (FRAME_BYTES + 64) + (64 << 20))
    free_disk = shutil.disk_usage(base).free
    tr_cap = min(n, args.torchrl_capacity or n)
    if "torchrl" in wanted and args.torchrl_capacity is None:
        room = free_disk - mm_est - (2 << 30)
        if room < tr_cap * per_trn_torchrl:
            tr_cap = max(0, int(room // per_trn_torchrl) // 1000 * 1000)
            print(f"NOTE: free disk {gb(free_disk)} is short for TorchRL's {gb(n * per_trn_torchrl)}: "
                  f"TorchRL gets capacity {tr_cap:,} instead of {n:,}", flush=True)
    avail = mem_available()
    sb3_need = n * STACKED_BYTES
    cpprb_need = n * FRAME_BYTES * (1 + sum(x > 1 for x in args.lanes))
    if "sb3" in wanted and avail < sb3_need + cpprb_need + (2 << 30):
        wanted.discard("sb3")
        print(f"NOTE: skipping SB3: it needs {gb(sb3_need)} of RAM, {gb(avail)} available "
              f"(with cpprb's {gb(cpprb_need)} and 2 GB headroom)", flush=True)
    working_set = (sb3_need if "sb3" in wanted else 0) + cpprb_need + mm_est + tr_cap * per_trn_torchrl
    print(f"plan: {n:,} transitions in {len(plan.lengths):,} episodes ({plan.rows:,} mmreplay rows); "
          f"free disk {gb(free_disk)}, MemAvailable {gb(avail)}, RAM + page cache wanted ~{gb(working_set)}",
          flush=True)
    if working_set > avail:
        print("WARNING: RAM + page cache wanted exceeds MemAvailable: disk-backed systems (TorchRL first) may "
              "be timed partly from disk; use --torchrl-capacity to shrink TorchRL", flush=True)
    return tr_cap


@dataclass
class Bench:
    """The systems made so far, what failed, and what to close at the end."""

    systems: list[System] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)

    def build(self, label: str, fn: Callable[[], list[System] | System]) -> None:
        t0 = time.perf_counter()
        try:
            made = fn()
        except Exception as exc:  # report and go on with the others
            self.fail(f"FAILED to build {label}", exc)
            traceback.print_exc()
            return
        self.systems.extend(made if isinstance(made, list) else [made])
        print(f"filled {label} in {time.perf_counter() - t0:.1f} s", flush=True)

    def fail(self, what: str, exc: Exception) -> None:
        msg = f"{what}: {type(exc).__name__}: {exc}"
        self.errors.append(msg.removeprefix("FAILED ").removeprefix("to build "))
        print(msg if msg.startswith("FAILED") else f"FAILED {msg}", file=sys.stderr, flush=True)

    def mmreplay(self, plan: Plan, pool: np.ndarray, base: Path, lanes: int, lane_segments: bool | None) -> list[System]:
        m = MMReplay(plan, pool, base, lanes, lane_segments=lane_segments)
        self.closers.append(m.close)
        return m.systems()


def build_systems(bench: Bench, args: argparse.Namespace, wanted: set[str], plan: Plan, pool: np.ndarray,
                  scratch: Scratch, base: Path, tr_cap: int) -> None:
    if "sb3" in wanted:
        bench.build("sb3", lambda: make_sb3(plan, scratch))
    sb3_sys = next((s for s in bench.systems if s.name.startswith("SB3")), None)
    if "numpy" in wanted:
        shared = None if sb3_sys is None else sb3_sys.keep.observations  # type: ignore[attr-defined]
        bench.build("numpy", lambda: make_numpy(plan, scratch, shared))
    if "cpprb" in wanted:
        bench.build("cpprb", lambda: make_cpprb(plan, scratch))
        for lanes in (x for x in args.lanes if x > 1):
            bench.build(f"cpprb fed {lanes} interleaved envs", lambda lanes=lanes: make_cpprb(plan, scratch, lanes))
    if "mmreplay" in wanted:
        for lanes in args.lanes:
            bench.build(f"mmreplay{lanes_tag(lanes)}", lambda lanes=lanes: bench.mmreplay(plan, pool, base, lanes, None))
        for lanes in (x for x in args.lanes if x > 1 and args.interleaved):
            bench.build(f"mmreplay{lanes_tag(lanes, interleaved=True)}",
                        lambda lanes=lanes: bench.mmreplay(plan, pool, base, lanes, False))
    if "torchrl" in wanted and tr_cap > 0:
        bench.build("torchrl", lambda: make_torchrl(plan, scratch, base, tr_cap))
        if tr_cap < args.capacity:
            for s in bench.systems:
                if s.name.startswith("TorchRL"):
                    s.name += f" [capacity {tr_cap:,}]"


def check_systems(bench: Bench, pool: np.ndarray) -> None:
    print()
    for s in bench.systems:
        try:
            print(f"sanity {s.name}: {sanity(s, pool)}", flush=True)
        except Exception as exc:
            bench.fail(f"{s.name} sanity", exc)
        for note in s.notes:
            print(f"  note: {note}")
    print()


def time_systems(bench: Bench, args: argparse.Namespace) -> tuple[dict[str, dict[int, list[float]]], set[str]]:
    """``--repeats`` rounds, the systems' order rotated each round; a system that fails drops out."""
    systems = bench.systems
    rates: dict[str, dict[int, list[float]]] = {s.name: {b: [] for b in BATCHES} for s in systems}
    broken: set[str] = set()
    for rep in range(args.repeats):
        order = systems[rep % max(1, len(systems)):] + systems[: rep % max(1, len(systems))]
        for s in order:
            if s.name in broken:
                continue
            for b in BATCHES:
                gc.collect()
                try:
                    rates[s.name][b].append(kit.rate(partial(s.op, b), args.seconds))
                except Exception as exc:
                    bench.fail(f"{s.name} B={b}", exc)
                    broken.add(s.name)
                    break
            if s.name not in broken:
                print(f"[{rep + 1}/{args.repeats}] {s.name}: "
                      + ", ".join(f"B={b} {rates[s.name][b][-1]:,.0f}/s" for b in BATCHES), flush=True)
    return rates, broken


def report_ratios(systems: list[System], med: dict[str, dict[int, float]], broken: set[str], lanes: int) -> None:
    """mmreplay's frame stacks of ``lanes`` lanes over the best peer, TorchRL and the numpy floor."""
    # peers as their users run them correctly: cpprb fed interleaved envs returns wrong stacks, so it is no peer
    peers = [s.name for s in systems if s.name.split(" ")[0].lower() in PEER_NAMES and s.name not in broken
             and "lanes]" not in s.name]
    torchrl = next((p for p in peers if p.startswith("TorchRL")), None)
    npy = next((s.name for s in systems if s.name.startswith("numpy") and s.name not in broken), None)
    main_name = MM_MAIN + lanes_tag(lanes)
    mm = med.get(main_name)
    if mm is None:
        return
    rows = []
    if peers:
        best = {b: max(peers, key=lambda p: med[p][b]) for b in BATCHES}
        r32, r256 = mm[32] / med[best[32]][32], mm[256] / med[best[256]][256]
        ok = "met" if r32 >= 1.3 and r256 >= 1.2 else "NOT met"
        rows.append([f"best peer ({best[32].split(' ')[0]} / {best[256].split(' ')[0]})", f"{r32:.2f}x",
                     f"{r256:.2f}x", f">= 1.3x / 1.2x: {ok}"])
    if torchrl:
        r32, r256 = mm[32] / med[torchrl][32], mm[256] / med[torchrl][256]
        rows.append(["TorchRL memmap", f"{r32:.2f}x", f"{r256:.2f}x", f">= 4x: {'met' if min(r32, r256) >= 4 else 'NOT met'}"])
    if npy:
        rows.append(["numpy gather baseline", kit.ratio(mm[32], med[npy][32]), kit.ratio(mm[256], med[npy][256]),
                     "(reference)"])
    print()
    print(kit.table([f"ratio (mmreplay frame stacks, {lanes} lane(s), over)", "B=32", "B=256", "target"], rows))
    mm_sys = next(s for s in systems if s.name == main_name)
    print(f"\nmmreplay ({lanes} lane(s)) stores {mm_sys.bytes_per_step:,.0f} bytes per step on disk (target "
          f"~7 KB; one frame is {FRAME_BYTES:,} bytes)")


def report(bench: Bench, args: argparse.Namespace, rates: dict[str, dict[int, list[float]]], broken: set[str]) -> None:
    med = {name: {b: kit.median(v) for b, v in r.items()} for name, r in rates.items()}
    print()
    print(f"Atari-shaped replay, {args.capacity:,} transitions, 84x84 uint8 frames, stacks of {STACK}; batches/s are "
          f"medians of {args.repeats} interleaved {args.seconds:g} s loops; numpy arrays out; torch threads "
          f"{args.torch_threads}")
    print()
    print(kit.table(["system", "storage", "batches/s B=32", "batches/s B=256", "bytes/step"],
                    [[s.name, s.storage, med[s.name][32], med[s.name][256], s.bytes_per_step] for s in bench.systems]))
    for lanes in args.lanes:
        report_ratios(bench.systems, med, broken, lanes)
    if bench.errors:
        print("\nerrors:")
        for e in bench.errors:
            print(f"  {e}")


def main() -> None:
    args = parse_args()
    wanted = set(args.systems.split(","))
    if wanted & {"sb3", "torchrl"}:
        import torch

        torch.set_num_threads(args.torch_threads)
    rng = np.random.default_rng(0)
    pool = make_pool(rng)
    plan = make_plan(args.capacity, rng)
    scratch = Scratch(pool)
    scratch.stacks(next(episodes(plan)))  # touch the scratch buffers before any RSS baseline
    base = Path(tempfile.mkdtemp(prefix="mmreplay-atari-", dir=args.dir))
    tr_cap = resource_plan(args, plan, base, wanted)
    bench = Bench()
    try:
        build_systems(bench, args, wanted, plan, pool, scratch, base, tr_cap)
        quiesce()
        check_systems(bench, pool)
        rates, broken = time_systems(bench, args)
    finally:
        for c in bench.closers:
            try:
                c()
            except Exception:
                pass
        shutil.rmtree(base, ignore_errors=True)
    report(bench, args, rates, broken)


if __name__ == "__main__":
    main()
