"""Atari training speed and memory: ``mmreplay train ALE/Pong-v5 --atari`` against SB3's DQN.

    python benchmarks/atari_train.py [--steps 100000] [--actors 0 2] [--out FILE]
    python benchmarks/atari_train.py --quick        # 6,000 env steps, learning starts 2,000: a smoke run
    python benchmarks/atari_train.py --device cuda --actors 0 4 --cuda-graphs   # both sides on the GPU

Both sides train the Nature DQN (the same CNN: 32x8x8/4, 64x4x4/2, 64x3x3/1, 512) on ALE/Pong-v5
through the same env code (``mmreplay.agent.envs.make_env(..., atari=True)``: gymnasium's
``AtariPreprocessing``, frame skip 4, 84x84 grayscale, 30 no-op starts), one env, with the same
settings: a replay memory of ``--capacity`` transitions (the run's steps by default), batch 32,
one update every 4 env steps, learning starts at 10,000 env steps, Adam lr 1e-4, Huber loss,
gamma 0.99, gradients clipped at norm 10, the target network copied every 1,000 updates (SB3
counts its ``target_update_interval`` in env steps: 4,000), the target's max (no double DQN),
epsilon 1 -> 0.01 over the first 10% of the run, frame stacks of 4:

* SB3: ``DQN("CnnPolicy")`` with ``optimize_memory_usage=True, handle_timeout_termination=False``
  (stacked observations kept in RAM, ``next_obs`` read from the next row), the env in a
  ``DummyVecEnv`` + ``VecFrameStack(4)``;
* mmreplay: ``mmreplay train ALE/Pong-v5 --atari`` with the matching flags: single frames stored
  once in a store on disk under ``--root``, stacks rebuilt by the sampler; with ``--actors A``
  the env steps in ``A`` actor processes and the learner samples through the loader.

Each run is a subprocess of its own, one after the other (never two at once). Reported per run:
env steps/s and updates/s over the training loop (start-up excluded on both sides: SB3's
``learn()`` call, ``mmreplay train``'s ``wall_s``); the peak anonymous RSS (``RssAnon`` of the
process and its children, sampled every 0.5 s: memory that is not page cache), the replay
memory's bytes (SB3: its arrays' ``nbytes``; mmreplay: the store's blocks on disk, which live in
the page cache, not in anonymous memory) and those bytes per stored step; the share of the loop
spent getting batches (SB3: time inside ``replay_buffer.sample``; mmreplay: its ``data_wait``).
Learning is not the point at 100k steps: speed and memory are. Target: mmreplay >= 1.0x SB3's env
steps/s at <= 0.5x its anonymous RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = "ALE/Pong-v5"


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _anon(pids: list[int]) -> int:
    total = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def run_measured(cmd: list[str], log: Path) -> tuple[float, int]:
    """Run ``cmd``; its wall time and the peak anonymous RSS of its process tree."""
    print("$", " ".join(cmd), flush=True)
    os.sync()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    peak = 0
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        stop = threading.Event()

        def watch() -> None:
            nonlocal peak
            while not stop.wait(0.5):
                peak = max(peak, _anon(_tree(proc.pid)))

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        rc = proc.wait()
        stop.set()
        t.join()
    if rc:
        sys.stdout.write(log.read_text()[-4000:])
        raise SystemExit(f"exit status {rc}: {' '.join(cmd)}")
    return time.perf_counter() - t0, peak


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


# -- the SB3 side (run in a subprocess: ``--sb3-child``) -----------------------------------------------
def sb3_child(args: argparse.Namespace) -> None:
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack

    from mmreplay.agent.envs import make_env

    def make() -> gym.Env:  # (84, 84) frames as (1, 84, 84): channels first, stacked by VecFrameStack
        return gym.wrappers.ReshapeObservation(make_env(ENV, atari=True), (1, 84, 84))

    torch.manual_seed(args.seed)
    torch.set_flush_denormal(True)  # as `mmreplay train` does on the CPU (its --flush-denormal default)
    env = VecFrameStack(DummyVecEnv([make]), n_stack=4, channels_order="first")
    env.seed(args.seed)
    model = DQN("CnnPolicy", env, buffer_size=args.capacity, learning_starts=args.learning_starts, batch_size=32,
                train_freq=4, gradient_steps=1, target_update_interval=4 * 1000, learning_rate=1e-4, gamma=0.99,
                exploration_fraction=0.1, exploration_final_eps=0.01, max_grad_norm=10,
                optimize_memory_usage=True, replay_buffer_kwargs=dict(handle_timeout_termination=False),
                seed=args.seed, device=args.device, verbose=0)
    model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's default logger leaves a /tmp/SB3-<time> folder
    rb = model.replay_buffer
    spent = [0.0]
    sample = rb.sample

    def timed(*a, **k):  # noqa: ANN002, ANN003
        t0 = time.perf_counter()
        try:
            return sample(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t0

    rb.sample = timed
    t0 = time.perf_counter()
    model.learn(total_timesteps=args.steps)
    wall = time.perf_counter() - t0
    nbytes = sum(getattr(rb, k).nbytes for k in ("observations", "actions", "rewards", "dones")
                 if isinstance(getattr(rb, k, None), np.ndarray))
    Path(args.sb3_child).write_text(json.dumps({
        "wall_s": wall, "env_steps": model.num_timesteps, "updates": model._n_updates, "data_wait": spent[0] / wall,
        "memory_bytes": nbytes, "stored_steps": min(model.num_timesteps, args.capacity)}))


def run_sb3(args: argparse.Namespace, tmp: Path) -> dict:
    out = tmp / "sb3.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--sb3-child", str(out), "--steps", str(args.steps),
           "--capacity", str(args.capacity), "--learning-starts", str(args.learning_starts), "--seed", str(args.seed),
           "--device", args.device]
    process_s, peak = run_measured(cmd, tmp / "sb3.log")
    r = json.loads(out.read_text())
    return {"system": "SB3 DQN (optimize_memory_usage)", "env_steps_per_s": r["env_steps"] / r["wall_s"],
            "updates_per_s": r["updates"] / r["wall_s"], "wall_s": r["wall_s"], "process_s": process_s,
            "anon_rss": peak, "memory_bytes": r["memory_bytes"], "where": "RAM (anonymous)",
            "bytes_per_step": r["memory_bytes"] / max(1, r["stored_steps"]), "data_wait": r["data_wait"]}


def run_mmreplay(args: argparse.Namespace, tmp: Path, actors: int) -> dict:
    d = tmp / f"mmreplay-a{actors}"
    cmd = [sys.executable, "-m", "mmreplay", "train", ENV, "--atari", "--store", str(d / "store"), "--run-dir",
           str(d / "run"), "--steps", str(args.steps), "--capacity", str(args.capacity), "--learning-starts",
           str(args.learning_starts), "--batch-size", "32", "--train-freq", "4", "--gradient-steps", "1",
           "--target-update-interval", "1000", "--lr", "1e-4", "--gamma", "0.99", "--loss", "huber",
           "--max-grad-norm", "10", "--no-double", "--end-e", "0.01", "--exploration-fraction", "0.1",
           "--frame-stack", "4", "--n-step", "1", "--seed", str(args.seed), "--eval-every", "0", "--eval-episodes",
           "0", "--checkpoint-every", "0", "--device", args.device, "--no-tensorboard", "--no-progress", "-q",
           *(["--cuda-graphs"] if args.cuda_graphs else []),
           *(["--actors", str(actors), "--envs-per-actor", "1"] if actors else ["--num-envs", "1", "--actors", "0"])]
    process_s, peak = run_measured(cmd, tmp / f"mmreplay-a{actors}.log")
    r = json.loads((d / "run" / "result.json").read_text())
    import mmreplay

    with mmreplay.open_store(d / "store", mode="r") as s:
        rows = s.num_rows
    store_bytes = disk_bytes(d / "store")
    name = "mmreplay train" + (f" --actors {actors}" if actors else "") + (" --cuda-graphs" if args.cuda_graphs else "")
    return {"system": name, "env_steps_per_s": r["env_steps"] / r["wall_s"], "updates_per_s": r["updates"] / r["wall_s"],
            "wall_s": r["wall_s"], "process_s": process_s, "anon_rss": peak, "memory_bytes": store_bytes,
            "where": "disk (page cache)", "bytes_per_step": store_bytes / max(1, rows), "data_wait": r.get("data_wait")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=None, help="env steps per run [100000; --quick 6000]")
    ap.add_argument("--capacity", type=int, default=None, help="replay memory, both sides [the run's steps]")
    ap.add_argument("--learning-starts", type=int, default=None, help="[10000; --quick 2000]")
    ap.add_argument("--actors", type=int, nargs="+", default=[0, 2], help="mmreplay runs: 0 (one process) and/or A "
                    "actor processes [0 2]")
    ap.add_argument("--no-sb3", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--root", default="/var/tmp")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--device", default="cpu", help="both sides' torch device [cpu]")
    ap.add_argument("--cuda-graphs", action="store_true", help="mmreplay runs with --cuda-graphs")
    ap.add_argument("--sb3-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.steps = args.steps or (6_000 if args.quick else 100_000)
    args.learning_starts = args.learning_starts if args.learning_starts is not None else (
        2_000 if args.quick else 10_000)
    args.capacity = args.capacity or args.steps
    if args.sb3_child:
        sb3_child(args)
        return
    tmp = Path(tempfile.mkdtemp(prefix="atari-train-", dir=args.root))
    rows = []
    try:
        if not args.no_sb3:
            rows.append(run_sb3(args, tmp))
            print(rows[-1], flush=True)
        for a in args.actors:
            rows.append(run_mmreplay(args, tmp, a))
            print(rows[-1], flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gib = 1 << 30
    print(f"\n{ENV}, {args.steps:,} env steps, replay memory {args.capacity:,}, learning starts "
          f"{args.learning_starts:,}, one env, seed {args.seed}, device {args.device}, {os.cpu_count()} cores; one run each")
    print("| system | env steps/s | updates/s | peak anonymous RSS | replay memory | bytes/stored step | "
          "sampling share of the loop |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for r in rows:
        dw = "-" if r["data_wait"] is None else f"{r['data_wait']:.1%}"
        print(f"| {r['system']} | {r['env_steps_per_s']:,.0f} | {r['updates_per_s']:,.1f} | {r['anon_rss'] / gib:.2f} GiB "
              f"| {r['memory_bytes'] / gib:.2f} GiB, {r['where']} | {r['bytes_per_step']:,.0f} | {dw} |")
    sb3 = next((r for r in rows if r["system"].startswith("SB3")), None)
    mm = next((r for r in rows if r["system"].startswith("mmreplay train") and "--actors" not in r["system"]), None)
    if sb3 and mm:
        sp, mem = mm["env_steps_per_s"] / sb3["env_steps_per_s"], mm["anon_rss"] / sb3["anon_rss"]
        ok = "met" if sp >= 1.0 and mem <= 0.5 else "NOT met"
        print(f"\nmmreplay / SB3: env steps/s {sp:.2f}x, anonymous RSS {mem:.2f}x (target >= 1.0x at <= 0.5x: {ok})")
    if args.out:
        Path(args.out).write_text(json.dumps({"steps": args.steps, "capacity": args.capacity, "device": args.device,
                                              "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
