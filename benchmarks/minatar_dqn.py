"""MinAtar learning and wall time: ``mmreplay train`` against a single-file reference DQN.

    python benchmarks/minatar_dqn.py                               # 300k steps, seeds 1 2 3, 2 runs at a time
    python benchmarks/minatar_dqn.py --steps 50000 --seeds 1 --jobs 2 --out /tmp/minatar
    (runs whose results are in --out already are not run again: an interrupted run resumes)

``mmreplay train ENV`` uses its MinAtar preset (``mmreplay.train.minatar_config``); the reference
is ``benchmarks/cleanrl_dqn.py --preset minatar`` (the same algorithm and settings, a plain numpy
ring buffer storing ``obs`` and ``next_obs``). Two configurations (``--configs a b``):

* (a) the MinAtar paper's: one frame, 1-step returns, one env;
* (b) the image path under load: 4 envs (4 store lanes), stacks of 4 frames (rebuilt by mmreplay's
  sampler from single stored frames; built by the reference as it steps), 3-step returns (the
  sampler's windows; the reference's own per-env windows). One training round per vector step.

Both evaluate ``--eval-episodes`` greedy episodes every ``--eval-every`` env steps and at the end. Wall times are each run's training loop, evaluation
excluded (both report it so). A uniformly random policy's return is measured for reference.

(Named ``minatar_dqn.py``, not ``minatar.py``: a script run from this folder would import such a
file in place of the ``minatar`` package.) Runs go ``--jobs`` at a time, in the order mmreplay s1,
reference s1, mmreplay s2, ... (one torch thread each). Results per configuration: a table per seed, the curves (mean over seeds of mmreplay
against the reference's seed range at each evaluation; :func:`curve_test`: the permutation p of
the gap between the curves, and how often a trainer identical to the reference would meet the
targets with as many seeds), ``OUT/minatar-<config>.png``
(``mmreplay plot`` of every run, the reference's evaluations written as run directories), and
``OUT/minatar.json``.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from mmreplay.train.runlog import COLUMNS, plot_run, read_metrics

HERE = Path(__file__).resolve().parent


def random_return(env_id: str, episodes: int, seed: int) -> float:
    """Mean return of a uniformly random policy."""
    sys.path.insert(0, str(HERE))
    from cleanrl_dqn import make_env

    env = make_env(env_id)()
    env.action_space.seed(seed)
    total = 0.0
    for i in range(episodes):
        env.reset(seed=seed + i)
        done = False
        while not done:
            _, r, term, trunc, _ = env.step(env.action_space.sample())
            total += float(r)
            done = term or trunc
    return total / episodes


def curve_test(mm: np.ndarray, ref: np.ndarray, draws: int = 20_000) -> dict:
    """How far mmreplay's curve is from the reference's, and how often chance alone misses the targets.

    ``mm`` and ``ref``: greedy returns, one row per seed, one column per evaluation (the last is
    the final return). Returns ``gap``, mmreplay's mean minus the reference's averaged over the
    evaluations; ``p``, the exact one-sided permutation p-value of that gap (the share of the
    splits of the pooled seeds into two groups of these sizes whose gap is as low or lower: small
    means mmreplay is worse beyond what the seed-to-seed spread explains; with 3 seeds a side 1/20
    is the least there is); ``p_final``, the same for the final return alone; and ``null``, how
    often a trainer *identical* to the reference meets each learning target with these seed
    counts: both groups drawn, with replacement, from the pooled curves of both trainers
    (``final``: mean final return >= 0.9x the other's; ``curve``: mean curve never below the
    other's seed range; ``both``)."""
    pooled, k = np.concatenate([mm, ref]), len(mm)
    first = np.array([np.isin(np.arange(len(pooled)), c) for c in itertools.combinations(range(len(pooled)), k)])  # (splits, seeds): a split's first group
    gaps = first @ pooled / k - ~first @ pooled / len(ref)  # (splits, evals)
    gap = mm.mean(0) - ref.mean(0)  # per evaluation
    rng = np.random.default_rng(0)
    a, b = (pooled[rng.integers(0, len(pooled), (draws, n))] for n in (k, len(ref)))  # (draws, seeds, evals)
    final = a[:, :, -1].mean(1) >= 0.9 * b[:, :, -1].mean(1)
    curve = np.all(a.mean(1) >= b.min(1) - 1e-9, axis=1)
    return {"gap": float(gap.mean()), "p": float(np.mean(gaps.mean(1) <= gap.mean() + 1e-9)),
            "p_final": float(np.mean(gaps[:, -1] <= gap[-1] + 1e-9)), "splits": len(first),
            "null": {"final": float(final.mean()), "curve": float(curve.mean()), "both": float((final & curve).mean())}}


def training_returns(out: Path, config: str, seeds: list[int], res: dict) -> tuple[list[int], dict] | None:
    """The mean return of the training episodes (epsilon-greedy, every episode that ended in each
    log interval) at the steps every run logged it: ``return_mean`` of ``mmreplay train``'s
    ``metrics.csv``, ``train_returns`` of the reference's JSON. ``(steps, {trainer: (seeds, steps)
    array})``, or None when a reference run predates ``train_returns``."""
    if any("train_returns" not in res["reference"][s] for s in seeds):
        return None
    rows = {"reference": [{int(t): m for t, m, _ in res["reference"][s]["train_returns"]} for s in seeds],
            "mmreplay": []}
    for s in seeds:
        m = read_metrics(out / f"{config}-mmreplay-s{s}" / "run")
        ok = ~np.isnan(m["return_mean"])
        rows["mmreplay"].append(dict(zip(m["step"][ok].astype(int).tolist(), m["return_mean"][ok].tolist())))
    steps = sorted(set.intersection(*(set(r) for runs in rows.values() for r in runs)))
    return steps, {n: np.array([[r[t] for t in steps] for r in runs]) for n, runs in rows.items()}


def run(cmd: list[str], log: Path) -> None:
    with open(log, "w") as fh:
        subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=True)


CONFIGS = {"a": [], "b": ["--num-envs", "4", "--frame-stack", "4", "--n-step", "3"]}
"""Flags both trainers get per configuration (the same names in ``mmreplay train`` and the reference)."""


def draw_runs(config: str, args: argparse.Namespace, out: Path, res: dict) -> None:
    """The reference's evaluations as run directories, and every run of the configuration on one plot."""
    for s in args.seeds:  # the reference's evaluations as a run directory, for `mmreplay plot`
        ref_dir = out / f"{config}-reference-s{s}"
        ref_dir.mkdir(exist_ok=True)
        with open(ref_dir / "metrics.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=COLUMNS)
            w.writeheader()
            for step, ret, std in res["reference"][s]["evals"]:
                w.writerow({"step": step, "eval_return": ret, "eval_std": std})
    runs = [out / f"{config}-mmreplay-s{s}" / "run" for s in args.seeds] + [out / f"{config}-reference-s{s}"
                                                                            for s in args.seeds]
    try:
        png = plot_run(runs[0], out / f"minatar-{config}.png", title=f"{args.env} ({config}): mmreplay train vs "
                       "reference", compare=runs[1:])
        print(f"plot: {png} (= mmreplay plot {' '.join(map(str, runs))} --out ...)")
    except ImportError as exc:
        print(f"no plot: {exc}")


def run_config(config: str, args: argparse.Namespace, out: Path, rand: float) -> dict:
    """Run (or reuse) every seed of one configuration for both trainers; print and return the summary."""
    extra = CONFIGS[config]
    common = ["--seed", "{s}", "--eval-every", str(args.eval_every), "--eval-episodes", str(args.eval_episodes), *extra]
    jobs = []
    for s in args.seeds:
        mm = out / f"{config}-mmreplay-s{s}"
        jobs.append(("mmreplay", s, [sys.executable, "-m", "mmreplay", "train", args.env, "--store", str(mm / "store"),
                                     "--run-dir", str(mm / "run"), "--steps", str(args.steps), "--train-freq",
                                     str(args.train_freq), "--threads", "1", "-q", *[c.format(s=s) for c in common]]))
        jobs.append(("reference", s, [sys.executable, str(HERE / "cleanrl_dqn.py"), "--preset", "minatar", "--env-id",
                                      args.env, "--total-timesteps", str(args.steps), "--train-frequency",
                                      str(args.train_freq), "--out", str(out / f"{config}-reference-s{s}.json"),
                                      *[c.format(s=s) for c in common]]))
    result = {"mmreplay": lambda s: out / f"{config}-mmreplay-s{s}" / "run" / "result.json",
              "reference": lambda s: out / f"{config}-reference-s{s}.json"}
    todo = [j for j in jobs if not result[j[0]](j[1]).exists()]  # results in OUT already: not run again
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda j: run(j[2], out / f"{config}-{j[0]}-s{j[1]}.log"), todo))
    res = {n: {s: json.loads(f(s).read_text()) for s in args.seeds} for n, f in result.items()}
    print(f"\n{args.env}, configuration ({config}) {' '.join(extra) or '(one frame, 1-step, one env)'}, "
          f"{args.steps:,} env steps, train every {args.train_freq}, random policy {rand:.2f}")
    print("| seed | trainer | env steps/s | training wall s | final greedy return |\n|---|---|---|---|---|")
    for s in args.seeds:
        for name, r in res.items():
            print(f"| {s} | {name} | {r[s]['steps_per_s']:,.0f} | {r[s]['wall_s']:.1f} | {r[s]['final_return']:.2f} |")
    final = {n: float(np.mean([r[s]["final_return"] for s in args.seeds])) for n, r in res.items()}
    wall = {n: float(np.mean([r[s]["wall_s"] for s in args.seeds])) for n, r in res.items()}
    # evaluation i of every run (mmreplay's steps can pass the multiple: it counts no autoreset step)
    curves: dict[str, dict[int, list[float]]] = {n: {} for n in res}
    steps: dict[int, int] = {}
    for n, r in res.items():
        for s in args.seeds:
            for i, (step, ret, _) in enumerate(r[s]["evals"]):
                curves[n].setdefault(i, []).append(ret)
                steps.setdefault(i, int(step))
    ref = curves["reference"]

    def where(i: int) -> str:  # mmreplay's mean at evaluation i against the reference's seed range
        m, r = np.mean(curves["mmreplay"][i]), ref.get(i)
        return "missing" if not r else "below" if m < min(r) - 1e-9 else "above" if m > max(r) + 1e-9 else "inside"

    places = {i: where(i) for i in curves["mmreplay"]}
    inside = all(p == "inside" for p in places.values())
    print(f"final return (mean of seeds): mmreplay {final['mmreplay']:.2f}, reference {final['reference']:.2f} "
          f"({final['mmreplay'] / max(final['reference'], 1e-9):.2f}x; target >= 0.9x)")
    print(f"mmreplay's mean curve inside the reference's seed range at every evaluation: {inside} "
          f"(below it at {sum(p == 'below' for p in places.values())}, above it at "
          f"{sum(p == 'above' for p in places.values())} of {len(places)} evaluations)")
    n_evals = min(len(curves["mmreplay"]), len(ref))
    test = curve_test(*(np.array([curves[n][i] for i in range(n_evals)]).T for n in ("mmreplay", "reference")))
    print(f"  mean gap over the evaluations {test['gap']:+.2f}, permutation p = {test['p']:.2f}; final return alone "
          f"p = {test['p_final']:.2f} (one-sided, exact over {test['splits']} splits of the seeds: small = mmreplay "
          f"worse beyond the seed spread). A trainer identical to the reference (both sides drawn from the pooled "
          f"seeds) meets the final-return target in {test['null']['final']:.0%}, the curve-not-below target in "
          f"{test['null']['curve']:.0%}, both in {test['null']['both']:.0%} of draws at {len(args.seeds)} seeds a side")
    train = training_returns(out, config, args.seeds, res)
    if train is not None and train[0]:  # far less noisy than 10 greedy episodes: every training episode counts
        t_steps, t = train
        tt = curve_test(t["mmreplay"], t["reference"])
        print(f"training episodes' mean return (epsilon-greedy), {len(t_steps)} log rows from {t_steps[0]:,} to "
              f"{t_steps[-1]:,} steps: mean gap {tt['gap']:+.2f}, permutation p = {tt['p']:.2f}, last row "
              f"p = {tt['p_final']:.2f}; " + ", ".join(
                  f"{st // 1000}k: {t['mmreplay'][:, j].mean():.2f} vs {t['reference'][:, j].mean():.2f} "
                  f"({t['reference'][:, j].min():.2f}..{t['reference'][:, j].max():.2f})"
                  for j, st in enumerate(t_steps) if st % args.eval_every == 0))
    print(f"training wall (mean of seeds): {wall['mmreplay'] / wall['reference']:.2f}x the reference's (target <= 1.1x)")
    for i in sorted(curves["mmreplay"]):
        r = ref.get(i, [np.nan])
        print(f"  step {steps[i]:>8,}: mmreplay {np.mean(curves['mmreplay'][i]):6.2f}  reference {np.mean(r):6.2f} "
              f"(range {min(r):.2f}..{max(r):.2f}): {places[i]}")
    draw_runs(config, args, out, res)
    return {"final": final, "wall": wall, "inside": inside, "places": places, "curve_test": test,
            "training_returns": None if train is None else {"steps": train[0], **{n: a.tolist() for n, a in train[1].items()}},
            "runs": {n: {str(s): r[s] for s in r} for n, r in res.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="MinAtar/Breakout-v1")
    ap.add_argument("--configs", nargs="+", default=["a", "b"], choices=list(CONFIGS))
    ap.add_argument("--steps", type=int, default=300_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--eval-every", type=int, default=50_000)
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--train-freq", type=int, default=1, help="env steps between training rounds, both trainers [1]")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=None, help="where runs, logs and minatar.json go [a temp dir]")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="mmreplay-minatar-"))
    out.mkdir(parents=True, exist_ok=True)
    rand = random_return(args.env, 100, 12345)
    summary = {c: run_config(c, args, out, rand) for c in args.configs}
    (out / "minatar.json").write_text(json.dumps({"args": vars(args), "random_return": rand, **summary}))
    print(f"runs and logs in {out}")


if __name__ == "__main__":
    main()
