"""The offline table: BC, CQL and offline DQN on two CartPole datasets, 3 seeds each.

    python benchmarks/offline.py [--root /var/tmp/mmreplay-offline] [--updates 10000] [--seeds 1 2 3]

Datasets (~50k transitions each, collected with ``mmreplay.collect``):

* ``random``: the uniform random policy (behaviour return ≈ 22);
* ``mediocre``: ε-greedy with ε = 0.6 around a fixed linear controller that balances the pole
  for the full 500 steps on its own (behaviour return ≈ 90-100).

Each cell trains ``--updates`` updates at batch 64 (``mmreplay.train``, offline: the store is
opened read-only) and evaluates 20 greedy episodes at the end (and every quarter of the run, to
see the trend); updates/s excludes evaluation time. Runs are sequential (one at a time).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

import numpy as np


class LinearController:
    """ε-greedy around ``a = [θ + 0.1·ẋ + 0.5·θ̇ + 0.01·x > 0]`` (500/500 when ε = 0)."""

    def __init__(self, epsilon: float, seed: int) -> None:
        self.epsilon = epsilon
        self.rng = np.random.default_rng(seed)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        x, xd, th, thd = np.asarray(obs).T
        greedy = (th + 0.1 * xd + 0.5 * thd + 0.01 * x > 0).astype(np.int64)
        explore = self.rng.random(len(greedy)) < self.epsilon
        return np.where(explore, self.rng.integers(0, 2, len(greedy)), greedy)


def make_dataset(root: Path, name: str, steps: int, seed: int) -> dict[str, float]:
    """Collect one dataset into ``root/name`` (kept if it is already there)."""
    from mmreplay.actors import collect

    path = root / name
    meta_path = root / f"{name}.json"
    if path.exists() and meta_path.exists():
        return json.loads(meta_path.read_text())
    shutil.rmtree(path, ignore_errors=True)
    policy = "random" if name == "random" else LinearController(0.6, seed)
    res = collect("CartPole-v1", path, steps, policy=policy, workers=0, envs_per_worker=8, seed=seed,
                  progress=False, metadata={"dataset": name})
    info = {"steps": res.steps, "transitions": res.transitions, "episodes": res.episodes,
            "behaviour_return": float(np.mean(res.episode_returns)), "seconds": res.seconds}
    meta_path.write_text(json.dumps(info))
    return info


def run_cell(root: Path, dataset: str, algo: str, seed: int, updates: int, **overrides: object) -> dict[str, object]:
    from mmreplay.train import config_for, train

    run_dir = root / "runs" / f"{dataset}-{algo}-s{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = config_for(offline=True, store=str(root / dataset), algo=algo, steps=updates, batch_size=64, seed=seed,
                      eval_env="CartPole-v1", eval_every=updates // 4, eval_episodes=20, run_dir=str(run_dir),
                      checkpoint_every=0, log_every=1000, tensorboard=False, **overrides)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    res = train(cfg)
    return {"dataset": dataset, "algo": algo, "seed": seed, "final": res.final_return,
            "evals": [round(e[1], 1) for e in res.evals], "updates_per_s": res.updates_per_s,
            "data_wait": res.data_wait, "wall_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/var/tmp/mmreplay-offline")
    ap.add_argument("--updates", type=int, default=10_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=50_000, help="env steps per dataset")
    ap.add_argument("--algos", nargs="+", default=["bc", "cql", "dqn"])
    ap.add_argument("--datasets", nargs="+", default=["random", "mediocre"])
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    behaviour = {d: make_dataset(root, d, args.steps, seed=100 + i) for i, d in enumerate(args.datasets)}
    for d, info in behaviour.items():
        print(f"dataset {d}: {info['transitions']} transitions, {info['episodes']} episodes, "
              f"behaviour return {info['behaviour_return']:.1f}")
    rows = []
    for d in args.datasets:
        for algo in args.algos:
            for seed in args.seeds:
                r = run_cell(root, d, algo, seed, args.updates)
                rows.append(r)
                print(f"{d:9s} {algo:4s} seed {seed}: final {r['final']:.1f}  evals {r['evals']}  "
                      f"{r['updates_per_s']:.0f} updates/s  data wait {r['data_wait']:.1%}", flush=True)
    print("\n| dataset (behaviour) | algo | final return, 3 seeds | mean | updates/s |")
    print("|---|---|---|---|---|")
    for d in args.datasets:
        for algo in args.algos:
            cell = [r for r in rows if r["dataset"] == d and r["algo"] == algo]
            finals = [r["final"] for r in cell]
            ups = statistics.mean(r["updates_per_s"] for r in cell)
            print(f"| {d} ({behaviour[d]['behaviour_return']:.0f}) | {algo} | {', '.join(f'{f:.0f}' for f in finals)} "
                  f"| {statistics.mean(finals):.0f} | {ups:.0f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"behaviour": behaviour, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
