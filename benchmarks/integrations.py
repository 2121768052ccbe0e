"""The integrations side by side with each library's own buffer, in one run.

    python benchmarks/integrations.py [--parts dqn,sac,torchrl,dataloader] [--seeds 1 2 3]
                                      [--sampling sb3 store] [--out FILE]

* ``dqn``: SB3 DQN on CartPole-v1 at the RL-zoo settings (50k steps), with SB3's own
  ``ReplayBuffer`` and with ``MMReplayBuffer``, per seed, one run after the other: the greedy
  return (mean of 20 deterministic episodes after training), the wall / CPU time of
  ``model.learn`` alone (no set-up, no evaluation) and the time spent inside the buffer's own
  ``add`` and ``sample`` (the same timing wrapper on both buffers). The buffer that runs first
  alternates from seed to seed. ``MMReplayBuffer`` runs with each ``--sampling`` mode given
  (default ``sb3``, its default: SB3's own draws, so a seed trains what SB3's buffer trains;
  ``store``: uniform draws over the store with the buffer's own generator).
* ``sac``: the same for SB3 SAC on Pendulum-v1 (RL-zoo settings, 20k steps).
* ``torchrl``: a TorchRL DQN loss loop (sample 256, ``DQNLoss``, backward, Adam step) fed from
  ``MMReplayStorage`` + ``MMReplaySampler`` and from TorchRL's ``LazyMemmapStorage`` (its default
  ``RandomSampler``; data extended flat, as TorchRL's examples do), on the same 100,000
  transitions; sampling alone and the whole loop, samples/s, medians of interleaved repeats.
* ``dataloader``: ``TransitionDataset`` through ``DataLoader`` with 0 and 2 workers against a
  ``UniformSampler`` + ``tensor_batch`` loop in one process (batch 256, 200,000 rows of 17 floats),
  batches/s after the workers started (the first 20 batches are not timed).

Every store lives under ``--root`` (local disk) and is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

DQN_ZOO = dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
               target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
               exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]))
SAC_ZOO = dict(learning_rate=1e-3)


def _learn(algo: str, env_id: str, steps: int, seed: int, ours: str | None, root: Path,
           zoo: dict[str, Any]) -> dict[str, Any]:
    import stable_baselines3 as sb3
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.logger import Logger

    from mmreplay.integrations.sb3 import MMReplayBuffer

    path = root / f"{algo}-{seed}"
    shutil.rmtree(path, ignore_errors=True)
    kw = dict(replay_buffer_class=MMReplayBuffer, replay_buffer_kwargs=dict(path=path, sampling=ours)) if ours else {}
    model = getattr(sb3, algo)("MlpPolicy", env_id, seed=seed, verbose=0, **zoo, **kw)
    model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's default logger leaves a /tmp/SB3-<time> folder
    spent = {"add": 0.0, "sample": 0.0}
    buf = model.replay_buffer
    for name in spent:  # the buffer's own work: the same wrapper around either buffer's methods
        setattr(buf, name, _timed(getattr(buf, name), name, spent))
    t, c = time.perf_counter(), time.process_time()
    model.learn(steps)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    mean, std = evaluate_policy(model, model.get_env(), n_eval_episodes=20, deterministic=True)
    if ours:
        model.replay_buffer.close()
        shutil.rmtree(path, ignore_errors=True)
    return {"algo": algo, "buffer": f"mmreplay-{ours}" if ours else "sb3", "seed": seed, "return": float(mean),
            "return_std": float(std), "wall_s": wall, "cpu_s": cpu, "add_s": spent["add"], "sample_s": spent["sample"]}


def _timed(f: Any, name: str, spent: dict[str, float]) -> Any:
    def timed(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[name] += time.perf_counter() - t0
    return timed


def part_sb3(algo: str, seeds: list[int], root: Path, modes: list[str]) -> list[dict[str, Any]]:
    env_id, steps, zoo = ("CartPole-v1", 50_000, DQN_ZOO) if algo == "DQN" else ("Pendulum-v1", 20_000, SAC_ZOO)
    out = []
    for seed in seeds:
        runs: list[str | None] = [None, *modes]
        for ours in (runs if seed % 2 else runs[::-1]):  # alternate who goes first (load drifts)
            r = _learn(algo, env_id, steps, seed, ours, root, zoo)
            print(json.dumps(r), flush=True)
            out.append(r)
    return out


def _rollout(envs: int, T: int, rng: np.random.Generator) -> Any:
    import torch
    from tensordict import TensorDict

    obs = rng.standard_normal((envs, T + 1, 4)).astype(np.float32)
    done = rng.random((envs, T, 1)) < 0.02
    f = torch.zeros(envs, T, 1, dtype=torch.bool)
    d = torch.from_numpy(done)
    action = np.eye(2, dtype=np.int64)[rng.integers(0, 2, (envs, T))]
    return TensorDict({"observation": torch.from_numpy(obs[:, :-1]), "action": torch.from_numpy(action),
                       "done": f, "terminated": f, "truncated": f,
                       "next": {"observation": torch.from_numpy(obs[:, 1:]), "reward": torch.randn(envs, T, 1),
                                "done": d, "terminated": d, "truncated": torch.zeros_like(d)}}, [envs, T])


def part_torchrl(root: Path, repeats: int = 5, iters: int = 300, batch: int = 256) -> dict[str, Any]:
    import torch
    from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer
    from torchrl.modules import MLP, QValueActor
    from torchrl.objectives import DQNLoss

    from mmreplay.integrations.torchrl import MMReplaySampler, MMReplayStorage, collate

    rng = np.random.default_rng(0)
    blocks = [_rollout(8, 1250, rng) for _ in range(10)]  # 100,000 transitions
    ours_storage = MMReplayStorage(root / "torchrl", 200_000)
    ours = TensorDictReplayBuffer(storage=ours_storage, sampler=MMReplaySampler(), collate_fn=collate,
                                  batch_size=batch)
    peer = TensorDictReplayBuffer(storage=LazyMemmapStorage(200_000, scratch_dir=root / "memmap"), batch_size=batch)
    for b in blocks:
        ours.extend(b)
        peer.extend(b.reshape(-1))
    actor = QValueActor(MLP(in_features=4, out_features=2, num_cells=[64, 64]), in_keys=["observation"],
                        action_space="one-hot")
    loss_fn = DQNLoss(actor, action_space="one-hot", delay_value=True)
    opt = torch.optim.Adam(loss_fn.parameters(), 1e-3)

    def sample_only(rb: Any) -> float:
        t = time.perf_counter()
        for _ in range(iters):
            rb.sample()
        return iters * batch / (time.perf_counter() - t)

    def loop(rb: Any) -> float:
        t = time.perf_counter()
        for _ in range(iters):
            loss = loss_fn(rb.sample())["loss"]
            opt.zero_grad()
            loss.backward()
            opt.step()
        return iters * batch / (time.perf_counter() - t)

    res: dict[str, list[float]] = {"ours_sample": [], "peer_sample": [], "ours_loop": [], "peer_loop": []}
    for rb in (ours, peer):  # warm up (compiled kernels, page cache)
        sample_only(rb)
        loop(rb)
    for _ in range(repeats):
        res["ours_sample"].append(sample_only(ours))
        res["peer_sample"].append(sample_only(peer))
        res["ours_loop"].append(loop(ours))
        res["peer_loop"].append(loop(peer))
    ours_storage.close()
    med = {k: statistics.median(v) for k, v in res.items()}
    out = {"part": "torchrl", "batch": batch, **{k: round(v) for k, v in med.items()},
           "sample_ratio": med["ours_sample"] / med["peer_sample"], "loop_ratio": med["ours_loop"] / med["peer_loop"]}
    print(json.dumps(out), flush=True)
    return out


def part_dataloader(root: Path, repeats: int = 3, batches: int = 400, batch: int = 256) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    import mmreplay
    from mmreplay.integrations.torch_data import TransitionDataset
    from mmreplay.loader import tensor_batch

    path = root / "offline"
    schema = mmreplay.Schema.transition(obs_shape=(17,), obs_dtype=np.float32, action_shape=(6,),
                                        action_dtype=np.float32)
    rng = np.random.default_rng(0)
    with mmreplay.create_store(path, schema, capacity=1_000_000) as store, store.writer(lanes=8) as w:
        T = 25_000
        w.add_batch(obs=rng.standard_normal((T, 8, 17)).astype(np.float32),
                    action=rng.standard_normal((T, 8, 6)).astype(np.float32),
                    reward=rng.standard_normal((T, 8)).astype(np.float32),
                    terminated=rng.random((T, 8)) < 0.001, truncated=np.zeros((T, 8), bool))

    def in_process() -> float:
        with mmreplay.open_store(path) as store, mmreplay.UniformSampler(store, seed=0) as s:
            for _ in range(20):
                tensor_batch(s.sample(batch), "cpu")
            t = time.perf_counter()
            for _ in range(batches):
                tensor_batch(s.sample(batch), "cpu")
            return batches / (time.perf_counter() - t)

    def loader(workers: int) -> float:
        data = TransitionDataset(path, batch, num_batches=batches + 20, seed=0)
        it = iter(DataLoader(data, batch_size=None, num_workers=workers, multiprocessing_context="fork"
                             if workers else None))
        for _ in range(20):
            next(it)
        t = time.perf_counter()
        n = sum(1 for _ in it)
        return n / (time.perf_counter() - t)

    res: dict[str, list[float]] = {"sampler": [], "loader_0": [], "loader_2": []}
    for _ in range(repeats):
        res["sampler"].append(in_process())
        res["loader_0"].append(loader(0))
        res["loader_2"].append(loader(2))
    med = {k: statistics.median(v) for k, v in res.items()}
    out = {"part": "dataloader", "batch": batch, **{k: round(v) for k, v in med.items()},
           "ratio_0": med["loader_0"] / med["sampler"], "ratio_2": med["loader_2"] / med["sampler"]}
    print(json.dumps(out), flush=True)
    return out


def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["| algo | seed | mmreplay sampling | return, SB3 buffer | return, mmreplay | wall s, SB3 | wall s, mmreplay "
             "| wall ratio | add + sample s, SB3 | add + sample s, mmreplay |", "|---|---|---|---|---|---|---|---|---|---|"]
    by = {(r["algo"], r["seed"], r["buffer"]): r for r in rows}
    for algo, seed, buffer in sorted({(r["algo"], r["seed"], r["buffer"]) for r in rows if r["buffer"] != "sb3"}):
        a, b = by.get((algo, seed, "sb3")), by[(algo, seed, buffer)]
        if a:
            lines.append(f"| {algo} | {seed} | {buffer.removeprefix('mmreplay-')} | {a['return']:.1f} | {b['return']:.1f} "
                         f"| {a['wall_s']:.1f} | {b['wall_s']:.1f} | {b['wall_s'] / a['wall_s']:.3f} "
                         f"| {a['add_s'] + a['sample_s']:.1f} | {b['add_s'] + b['sample_s']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="dqn,sac,torchrl,dataloader")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--sampling", nargs="+", default=["sb3"], choices=["sb3", "store"],
                    help="MMReplayBuffer's sampling modes to run (each against SB3's own buffer)")
    ap.add_argument("--root", default=None, help="directory for the stores (default: a temporary one)")
    ap.add_argument("--out", default=None, help="write every result as JSON here")
    args = ap.parse_args()
    parts = args.parts.split(",")
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="mmreplay-integrations-"))
    root.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    try:
        if "torchrl" in parts:
            results["torchrl"] = part_torchrl(root)
        if "dataloader" in parts:
            results["dataloader"] = part_dataloader(root)
        rows = []
        if "dqn" in parts:
            rows += part_sb3("DQN", args.seeds, root, args.sampling)
        if "sac" in parts:
            rows += part_sb3("SAC", args.seeds, root, args.sampling)
        results["sb3"] = rows
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if results.get("sb3"):
        print(_table(results["sb3"]))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
