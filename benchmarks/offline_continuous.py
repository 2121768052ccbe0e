"""Offline continuous control: ``mmreplay train --offline --algo td3bc|iql`` against the single-file
reference (``offline_continuous_ref.py``) on the same data, side by side.

    python benchmarks/offline_continuous_data.py            # once: makes and caches the datasets
    python benchmarks/offline_continuous.py                 # 2 datasets x 2 algos x 3 seeds x 2 trainers
    python benchmarks/offline_continuous.py --updates 2000 --eval-every 1000 --seeds 1 --root /tmp/tiny --out /tmp/tiny/bench
    (a run whose result is in --out already is not run again: an interrupted benchmark resumes)

Datasets: ``<root>/<name>`` (mmreplay stores; ``mmreplay train --store``) and ``<root>/<name>.npz``
(the same transitions, D4RL's layout, for the reference), made by ``offline_continuous_data.py``.
Every run: ``--updates`` updates (batch 256, CORL's settings on both sides), ``--eval-episodes``
episodes every ``--eval-every`` updates, one torch thread, ``--jobs`` runs at a time (each under
``nice``), in the order mmreplay s1, reference s1, mmreplay s2, ... per dataset and algorithm.

Printed per (dataset, algorithm): D4RL-normalized final scores per seed (``100 * (return - random) /
(expert - random)`` with D4RL's published reference returns, :data:`D4RL_REF`), updates/s of both
(training loop only, evaluation excluded) and their ratio, mmreplay's learner data wait, and the
MinAtar benchmark's curve test (``minatar_dqn.curve_test``: the permutation p of the mean gap
between the normalized curves over the evaluations, the final score's p, and how often a trainer
identical to the reference meets the targets with this many seeds). ``--variants archive windowed``
adds mmreplay runs (seed 1) from a zarr archive of each dataset (``mmreplay export``) and with the
windowed sampler over a resident third of the store's segments (``--sampler-mode windowed``), for
the speed figures. Everything goes to ``--out`` (``offline_continuous.json`` with every run's result).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

D4RL_REF = {"Hopper": (-20.272305, 3234.3), "HalfCheetah": (-280.178953, 12135.0), "Walker2d": (1.629008, 4592.3)}
"""D4RL's random and expert returns (``d4rl/infos.py`` ``REF_MIN_SCORE`` / ``REF_MAX_SCORE`` of the
gym-MuJoCo v2 datasets), by env name: normalized score = 100 (R - random) / (expert - random)."""


def normalized(env: str, ret: float) -> float:
    name = env.split("-")[0]
    lo, hi = D4RL_REF[name]
    return 100.0 * (ret - lo) / (hi - lo)


def run(cmd: list[str], log: Path) -> float:
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        subprocess.run(["nice", "-n", str(19), *cmd], stdout=fh, stderr=subprocess.STDOUT, check=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    return time.perf_counter() - t0


def log_of(result: Path) -> Path:
    """Where a run's output goes: beside its result (an mmreplay run's beside its run directory)."""
    return result.parent.with_suffix(".log") if result.name == "result.json" else result.with_suffix(".log")


def jobs_for(args: argparse.Namespace, root: Path, out: Path) -> list[tuple[str, Path, list[str]]]:
    """(label, result path, command) of every run, in running order."""
    jobs = []
    common = ["--eval-every", str(args.eval_every), "--eval-episodes", str(args.eval_episodes)]
    for ds in args.datasets:
        for algo in args.algos:
            for s in args.seeds:
                mm = out / f"{ds}-{algo}-mmreplay-s{s}"
                jobs.append((f"{ds} {algo} mmreplay s{s}", mm / "result.json",
                             [sys.executable, "-m", "mmreplay", "train", "--offline", "--store", str(root / ds),
                              "--algo", algo, "--eval-env", args.env, "--steps", str(args.updates), "--seed", str(s),
                              "--run-dir", str(mm), "--threads", "1", "--checkpoint-every", str(args.updates),
                              "--log-every", "1000", "--no-tensorboard", "-q", *common]))
                jobs.append((f"{ds} {algo} reference s{s}", out / f"{ds}-{algo}-reference-s{s}.json",
                             [sys.executable, str(HERE / "offline_continuous_ref.py"), "--algo", algo, "--data",
                              str(root / f"{ds}.npz"), "--env", args.env, "--updates", str(args.updates), "--seed",
                              str(s), "--out", str(out / f"{ds}-{algo}-reference-s{s}.json"), *common]))
            if "windowed" in args.variants:  # a resident set of a third of the store's segments (at least 2)
                import mmreplay

                with mmreplay.open_store(root / ds) as st:
                    n_seg = st.info()["segments"]
                    cache = max(2, n_seg // 3) * st.layout.file_size
                win = out / f"{ds}-{algo}-windowed-s1"
                jobs.append((f"{ds} {algo} mmreplay-windowed s1", win / "result.json",
                             [sys.executable, "-m", "mmreplay", "train", "--offline", "--store", str(root / ds),
                              "--algo", algo, "--eval-env", args.env, "--steps", str(args.updates), "--seed", "1",
                              "--run-dir", str(win), "--threads", "1", "--sampler-mode", "windowed",
                              "--cache-bytes", str(cache), "--checkpoint-every", str(args.updates),
                              "--log-every", "1000", "--no-tensorboard", "-q", *common]))
            if "archive" in args.variants:
                arch = out / f"{ds}-{algo}-archive-s1"
                jobs.append((f"{ds} {algo} mmreplay-archive s1", arch / "result.json",
                             [sys.executable, "-m", "mmreplay", "train", "--offline", "--archive",
                              str(root / f"{ds}.zarr"), "--algo", algo, "--eval-env", args.env, "--steps",
                              str(args.updates), "--seed", "1", "--run-dir", str(arch), "--threads", "1",
                              "--checkpoint-every", str(args.updates), "--log-every", "1000", "--no-tensorboard",
                              "-q", *common]))
    return jobs


def summarize(args: argparse.Namespace, out: Path) -> dict:
    sys.path.insert(0, str(HERE))
    from minatar_dqn import curve_test

    summary: dict = {}
    for ds in args.datasets:
        for algo in args.algos:
            res: dict[str, dict[int, dict]] = {"mmreplay": {}, "reference": {}}
            for s in args.seeds:
                p = out / f"{ds}-{algo}-mmreplay-s{s}" / "result.json"
                if p.exists():
                    res["mmreplay"][s] = json.loads(p.read_text())
                p = out / f"{ds}-{algo}-reference-s{s}.json"
                if p.exists():
                    res["reference"][s] = json.loads(p.read_text())
            seeds = [s for s in args.seeds if s in res["mmreplay"] and s in res["reference"]]
            if not seeds:
                continue
            curves = {n: np.array([[normalized(args.env, e[1]) for e in res[n][s]["evals"]] for s in seeds])
                      for n in res}
            n_evals = min(c.shape[1] for c in curves.values())
            mm, ref = curves["mmreplay"][:, :n_evals], curves["reference"][:, :n_evals]
            ups = {n: [res[n][s]["updates_per_s"] for s in seeds] for n in res}
            wait = [res["mmreplay"][s]["data_wait"] for s in seeds]
            test = curve_test(mm, ref) if len(seeds) >= 2 else None
            row = {"seeds": seeds, "final": {"mmreplay": mm[:, -1].tolist(), "reference": ref[:, -1].tolist()},
                   "curve": {"mmreplay": mm.mean(0).tolist(), "reference": ref.mean(0).tolist(),
                             "reference_min": ref.min(0).tolist(), "reference_max": ref.max(0).tolist()},
                   "updates_per_s": ups, "ratio": float(np.mean(ups["mmreplay"]) / np.mean(ups["reference"])),
                   "data_wait": wait, "curve_test": test}
            for variant in ("archive", "windowed"):
                p = out / f"{ds}-{algo}-{variant}-s1" / "result.json"
                if p.exists():
                    a = json.loads(p.read_text())
                    row[variant] = {"updates_per_s": a["updates_per_s"], "data_wait": a["data_wait"],
                                    "final": normalized(args.env, a["final_return"]),
                                    "vs_store_s1": a["updates_per_s"] / res["mmreplay"][seeds[0]]["updates_per_s"]}
            summary[f"{ds}/{algo}"] = row
            print(f"\n{args.env} {ds}, {algo}, {args.updates:,} updates, seeds {seeds}")
            print(f"  final normalized score per seed: mmreplay {', '.join(f'{v:.1f}' for v in mm[:, -1])} "
                  f"(mean {mm[:, -1].mean():.1f}); reference {', '.join(f'{v:.1f}' for v in ref[:, -1])} "
                  f"(mean {ref[:, -1].mean():.1f}, range {ref[:, -1].min():.1f}..{ref[:, -1].max():.1f})")
            print(f"  updates/s: mmreplay {np.mean(ups['mmreplay']):,.0f} ({', '.join(f'{v:,.0f}' for v in ups['mmreplay'])}), "
                  f"reference {np.mean(ups['reference']):,.0f} ({', '.join(f'{v:,.0f}' for v in ups['reference'])}): "
                  f"{row['ratio']:.2f}x; mmreplay data wait {', '.join(f'{w:.1%}' for w in wait)}")
            if test is not None:
                print(f"  curve test: mean gap {test['gap']:+.1f} points over {n_evals} evaluations, permutation "
                      f"p = {test['p']:.2f} (final score alone p = {test['p_final']:.2f}; exact over {test['splits']} "
                      f"splits); a trainer identical to the reference meets final >= 0.9x in "
                      f"{test['null']['final']:.0%}, curve-not-below in {test['null']['curve']:.0%}, both in "
                      f"{test['null']['both']:.0%} of draws")
            for variant, what in (("archive", "from the zarr archive"), ("windowed", "windowed sampler, a third "
                                                                                      "of the segments resident")):
                if variant in row:
                    v = row[variant]
                    print(f"  {what} (seed 1): {v['updates_per_s']:,.0f} updates/s ({v['vs_store_s1']:.2f}x the store "
                          f"run of seed {seeds[0]}), data wait {v['data_wait']:.1%}, final {v['final']:.1f}")
            for i in range(n_evals):
                step = res["reference"][seeds[0]]["evals"][i][0]
                print(f"    {step:>8,}: mmreplay {mm[:, i].mean():6.1f}  reference {ref[:, i].mean():6.1f} "
                      f"({ref[:, i].min():.1f}..{ref[:, i].max():.1f})")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="Hopper-v5")
    ap.add_argument("--root", default=None, help="the datasets [~/.cache/mmreplay-bench/<env>]")
    ap.add_argument("--datasets", nargs="+", default=["medium", "replay"])
    ap.add_argument("--algos", nargs="+", default=["td3bc", "iql"], choices=["td3bc", "iql"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--updates", type=int, default=100_000)
    ap.add_argument("--eval-every", type=int, default=10_000)
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--variants", nargs="*", default=[], choices=["archive", "windowed"])
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time [1]")
    ap.add_argument("--only-summary", action="store_true", help="run nothing; print what --out holds")
    ap.add_argument("--out", default=None, help="[<root>/bench]")
    args = ap.parse_args()
    root = Path(args.root or Path.home() / ".cache" / "mmreplay-bench" / args.env.replace("/", "-")).expanduser()
    out = Path(args.out or root / "bench").expanduser()
    out.mkdir(parents=True, exist_ok=True)
    if "archive" in args.variants and not args.only_summary:
        for ds in args.datasets:
            if not (root / f"{ds}.zarr").exists():
                subprocess.run([sys.executable, "-m", "mmreplay", "export", str(root / ds), "--to", "zarr",
                                str(root / f"{ds}.zarr")], check=True)
    todo = [] if args.only_summary else [j for j in jobs_for(args, root, out) if not j[1].exists()]
    if args.jobs > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda j: run(j[2], log_of(j[1])), todo))
    else:
        for label, result, cmd in todo:
            secs = run(cmd, log_of(result))
            print(f"ran {label} in {secs:.0f} s", flush=True)
    summary = summarize(args, out)
    (out / "offline_continuous.json").write_text(json.dumps({"args": vars(args), **summary}, indent=2))
    print(f"results in {out}")


if __name__ == "__main__":
    main()
