"""The CartPole online acceptance: ``mmreplay train`` vs a CleanRL-style DQN, same settings, same run.

    python benchmarks/train_cartpole.py [--seeds 1 2 3] [--steps 100000] [--actors 0 2] [--root DIR]

For each seed, one after the other (never in parallel): ``mmreplay train CartPole-v1`` with its
defaults (the RL-zoo DQN settings, synchronous loop, ``--actors 0``), then (if asked) the same
with ``--actors 2``, then ``benchmarks/cleanrl_dqn.py`` with the same hyperparameters. Each
evaluates 20 greedy episodes every 10k env steps; wall and CPU times exclude set-up and evaluation
(CPU time, of all the process's threads, is the steadier figure on a machine shared with other jobs). The table
says, per run, the best and last evaluation, the first env step with a mean ≥ 475, the wall time
and env steps/s. The acceptance asks for ≥ 475 within 100k env steps for at least 2 of 3 seeds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run_mmreplay(root: Path, seed: int, steps: int, actors: int) -> dict[str, object]:
    tag = f"mmreplay-a{actors}-s{seed}"
    store, run_dir = root / f"{tag}-store", root / f"{tag}-run"
    shutil.rmtree(store, ignore_errors=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [str(BIN / "mmreplay"), "train", "CartPole-v1", "--store", str(store), "--run-dir", str(run_dir),
           "--seed", str(seed), "--steps", str(steps), "--actors", str(actors), "--no-tensorboard", "-q"]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    res = json.loads((run_dir / "result.json").read_text())
    return {"impl": f"mmreplay --actors {actors}", "seed": seed, "evals": res["evals"], "wall_s": res["wall_s"], "cpu_s": res["cpu_s"],
            "steps_per_s": res["steps_per_s"], "env_steps": res["env_steps"], "updates": res["updates"]}


def run_cleanrl(root: Path, seed: int, steps: int) -> dict[str, object]:
    out = root / f"cleanrl-s{seed}.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "cleanrl_dqn.py"), "--seed", str(seed), "--total-timesteps",
           str(steps), "--out", str(out)]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    res = json.loads(out.read_text())
    return {"impl": "cleanrl-style", "seed": seed, "evals": res["evals"], "wall_s": res["wall_s"], "cpu_s": res["cpu_s"],
            "steps_per_s": res["steps_per_s"], "env_steps": res["env_steps"], "updates": res["updates"]}


def summary(r: dict[str, object]) -> str:
    evals = r["evals"]
    assert isinstance(evals, list)
    best = max(e[1] for e in evals) if evals else float("nan")
    last = evals[-1][1] if evals else float("nan")
    first = next((e[0] for e in evals if e[1] >= 475), None)
    return (f"| {r['impl']} | {r['seed']} | {best:.0f} | {last:.0f} | {first if first else '-'} | "
            f"{r['wall_s']:.0f} | {r['cpu_s']:.0f} | {r['steps_per_s']:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--actors", type=int, nargs="+", default=[0], help="mmreplay --actors values to run")
    ap.add_argument("--no-cleanrl", action="store_true")
    ap.add_argument("--root", default="/var/tmp/mmreplay-cartpole")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in args.seeds:
        for actors in args.actors:
            rows.append(run_mmreplay(root, seed, args.steps, actors))
            print(summary(rows[-1]), flush=True)
        if not args.no_cleanrl:
            rows.append(run_cleanrl(root, seed, args.steps))
            print(summary(rows[-1]), flush=True)
    print("\n| implementation | seed | best eval | last eval | first step ≥ 475 | wall s (no eval) | CPU s | env steps/s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(summary(r))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
