"""The training loop per env step: ``mmreplay train`` vs a single-file DQN with a plain numpy buffer.

    python benchmarks/train_loop.py [--steps 150000] [--seeds 1 [2 ...]] [--repeats 3] [--root DIR] [--out FILE]
    python benchmarks/train_loop.py --quick      # 20k env steps, 1 repeat: a smoke run
    python benchmarks/train_loop.py --zoo        # at the RL-zoo settings instead

Both sides run the same algorithm with the same settings, one after the other (never in
parallel), each as a subprocess of its own, ``--repeats`` times per seed, interleaved (repeat r
runs the reference then mmreplay, repeat r+1 mmreplay then the reference, and so on), with an
``os.sync()`` before each run:

* the reference: ``benchmarks/cleanrl_dqn.py --preset cleanrl`` (CleanRL's ``dqn.py`` defaults:
  120-84 MLP, Adam 2.5e-4, batch 128, learning starts 10,000, train every 10 env steps with one
  gradient step, target copied every 500 env steps = 50 updates, buffer 10,000, MSE, no double
  DQN, no clipping, ε 1 -> 0.05 over half the run, gamma 0.99) with its numpy ring buffer;
* ``python -m mmreplay train CartPole-v1`` with the matching flags (:func:`mmreplay_flags`,
  printed before each run): the store is the replay memory, in a fresh temporary directory (as
  is the run directory) under ``--root``.

With ``--zoo``: the reference at ``--preset zoo --buffer sb3`` (stable-baselines3's
``ReplayBuffer``) against ``mmreplay train``'s defaults (the same RL-zoo settings), both with a
100,000-transition buffer (the zoo's ``buffer_size``; ``mmreplay train``'s default capacity is
1,000,000 rows).

What is timed, the same span on both sides: the training loop, from after set-up (imports, env,
networks, optimizer, buffer or store made: process start-up excluded on both) to the end of the
run, evaluations excluded (``--eval-episodes`` greedy episodes every ``--eval-every`` env steps
and at the end, on both). The reference reports it as ``wall_s`` in its ``--out`` JSON;
``mmreplay train`` as ``wall_s`` in ``RUN_DIR/result.json`` (the ``wall time`` line of its
summary), which also counts closing the writer, the last metrics row and the final checkpoint
and ``policy.pt`` written at the end (checkpoints during the run are off,
``--checkpoint-every 0``, as the reference writes none). Env steps/s is env steps / that wall
time on both sides (``mmreplay train``'s own ``steps_per_s``, in the JSON as
``reported_steps_per_s``, is the same up to the end-of-run writes). Both count an env step as a
stored transition; ``mmreplay train`` also steps the env once more per episode (its vector env
resets an ended lane on the next step, and the store keeps the final observation as a row of its
own), the reference does not (same-step autoreset). Also shown: the subprocess's whole wall time
(interpreter start, imports, set-up and evaluations included), and the final greedy return
(mean of the last evaluation).

Before the timed runs, one short untimed run of each side (``--no-warmup`` skips it) compiles
and caches mmreplay's numba kernels and warms the page cache. The table gives medians over the
repeats and the ratio mmreplay wall / reference wall (target <= 1.1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# cleanrl/dqn.py's defaults, as mmreplay train flags (target: 500 env steps / train_freq 10 = 50 updates)
CLEANRL_FLAGS = ["--hidden", "120,84", "--lr", "2.5e-4", "--batch-size", "128", "--learning-starts", "10000",
                 "--train-freq", "10", "--gradient-steps", "1", "--target-update-interval", "50", "--tau", "1.0",
                 "--capacity", "10000", "--loss", "mse", "--no-double", "--max-grad-norm", "0", "--start-e", "1",
                 "--end-e", "0.05", "--exploration-fraction", "0.5", "--gamma", "0.99"]
ZOO_FLAGS = ["--capacity", "100000"]  # the rest are mmreplay train's defaults (the RL-zoo settings)


def mmreplay_flags(args: argparse.Namespace, seed: int, steps: int, tmp: Path) -> list[str]:
    return ["CartPole-v1", "--store", str(tmp / "store"), "--run-dir", str(tmp / "run"), "--seed", str(seed),
            "--steps", str(steps), *(ZOO_FLAGS if args.zoo else CLEANRL_FLAGS), "--num-envs", "1", "--actors", "0",
            "--eval-every", str(args.eval_every), "--eval-episodes", str(args.eval_episodes),
            "--checkpoint-every", str(args.checkpoint_every), "--device", "cpu", "--threads", "1",
            "--no-tensorboard", "--no-progress", "-q"]


def reference_flags(args: argparse.Namespace, seed: int, steps: int, out: Path) -> list[str]:
    preset = ["--preset", "zoo", "--buffer", "sb3"] if args.zoo else ["--preset", "cleanrl"]
    return [*preset, "--seed", str(seed), "--total-timesteps", str(steps), "--eval-every", str(args.eval_every),
            "--eval-episodes", str(args.eval_episodes), "--threads", "1", "--out", str(out)]


def _run(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> float:
    """Run ``cmd`` (output to ``log``); its wall time in seconds, start-up included."""
    print("$", " ".join(cmd), flush=True)
    os.sync()  # the previous run's dirty pages are not flushed during this one
    t0 = time.perf_counter()
    with log.open("w") as fh:
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, env=env).returncode
    spent = time.perf_counter() - t0
    if rc:
        sys.stdout.write(log.read_text()[-4000:])
        raise SystemExit(f"exit status {rc}: {' '.join(cmd)}")
    return spent


def run_reference(args: argparse.Namespace, seed: int, steps: int, flags: list[str] | None = None) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="train-loop-ref-", dir=args.root))
    try:
        out = tmp / "result.json"
        cmd = [sys.executable, str(ROOT / "benchmarks" / "cleanrl_dqn.py"),
               *(flags if flags is not None else reference_flags(args, seed, steps, out))]
        process_s = _run(cmd, tmp / "log.txt")
        if flags is not None:
            return {}
        res = json.loads(out.read_text())
        return {"impl": "reference", "seed": seed, "env_steps": res["env_steps"], "updates": res["updates"],
                "wall_s": res["wall_s"], "steps_per_s": res["env_steps"] / res["wall_s"], "process_s": process_s,
                "final_return": res["final_return"], "cmd": cmd}
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


def run_mmreplay(args: argparse.Namespace, seed: int, steps: int, extra: list[str] | None = None) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="train-loop-mmreplay-", dir=args.root))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        cmd = [sys.executable, "-m", "mmreplay", "train", *mmreplay_flags(args, seed, steps, tmp), *(extra or [])]
        process_s = _run(cmd, tmp / "log.txt", env)
        if extra is not None:
            return {}
        res = json.loads((tmp / "run" / "result.json").read_text())
        return {"impl": "mmreplay", "seed": seed, "env_steps": res["env_steps"], "updates": res["updates"],
                "wall_s": res["wall_s"], "steps_per_s": res["env_steps"] / res["wall_s"], "process_s": process_s,
                "final_return": res["final_return"], "reported_steps_per_s": res["steps_per_s"], "cmd": cmd}
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


def warm_up(args: argparse.Namespace) -> None:
    """Short untimed runs that train a little (numba kernels compiled and cached, page cache warm)."""
    print("warm-up (untimed)", flush=True)
    short = ["--learning-starts", "1000", "--eval-episodes", "0"]
    run_mmreplay(args, 1, 2000, extra=short)
    run_reference(args, 1, 2000, flags=["--preset", "zoo" if args.zoo else "cleanrl", "--total-timesteps", "2000",
                                        *short])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=None, help="env steps per run [150000; --quick 20000]")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    ap.add_argument("--repeats", type=int, default=None, help="runs per seed and side [3; --quick 1]")
    ap.add_argument("--quick", action="store_true", help="20k env steps, 1 repeat (a smoke run)")
    ap.add_argument("--zoo", action="store_true", help="at the RL-zoo settings: reference --preset zoo --buffer sb3 "
                    "vs mmreplay train's defaults")
    ap.add_argument("--eval-every", type=int, default=10_000, help="env steps between evaluations [10000]")
    ap.add_argument("--eval-episodes", type=int, default=20, help="greedy episodes per evaluation [20]")
    ap.add_argument("--checkpoint-every", type=int, default=0,
                    help="mmreplay train's --checkpoint-every [0: only the final one]")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--root", default="/var/tmp", help="where the temporary stores and run dirs go [/var/tmp]")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directories")
    ap.add_argument("--out", default=None, help="write the runs and the table as JSON here")
    args = ap.parse_args()
    steps = args.steps or (20_000 if args.quick else 150_000)
    repeats = args.repeats or (1 if args.quick else 3)

    if not args.no_warmup:
        warm_up(args)
    rows: list[dict] = []
    for r in range(repeats):
        for seed in args.seeds:
            order = (run_reference, run_mmreplay) if r % 2 == 0 else (run_mmreplay, run_reference)
            for fn in order:
                row = fn(args, seed, steps)
                row["repeat"] = r
                rows.append(row)
                print(f"  {row['impl']}: {row['steps_per_s']:,.0f} env steps/s, training wall {row['wall_s']:.1f} s, "
                      f"process {row['process_s']:.1f} s, final return {row['final_return']}", flush=True)

    ref_name = ("cleanrl_dqn.py --preset zoo --buffer sb3" if args.zoo
                else "cleanrl_dqn.py --preset cleanrl (numpy buffer)")
    print(f"\n{'RL-zoo' if args.zoo else 'CleanRL dqn.py'} settings, CartPole-v1, {steps:,} env steps, "
          f"medians of {repeats} run(s); wall: training loop, evaluation and start-up excluded")
    print("| seed | implementation | env steps/s | training wall s | process wall s | final greedy return |")
    print("|---|---|---|---|---|---|")
    summary = []
    for seed in args.seeds:
        med = {}
        for impl, name in (("reference", ref_name), ("mmreplay", "mmreplay train")):
            mine = [x for x in rows if x["impl"] == impl and x["seed"] == seed]
            med[impl] = {k: statistics.median(x[k] for x in mine) for k in ("steps_per_s", "wall_s", "process_s")}
            returns = ", ".join(f"{x['final_return']:.1f}" for x in mine if x["final_return"] is not None) or "-"
            print(f"| {seed} | {name} | {med[impl]['steps_per_s']:,.0f} | {med[impl]['wall_s']:.1f} | "
                  f"{med[impl]['process_s']:.1f} | {returns} |")
        paired = [m["wall_s"] / x["wall_s"] for x in rows if x["impl"] == "reference" and x["seed"] == seed
                  for m in rows if m["impl"] == "mmreplay" and m["seed"] == seed and m["repeat"] == x["repeat"]]
        ratio = med["mmreplay"]["wall_s"] / med["reference"]["wall_s"]
        summary.append({"seed": seed, **{f"{k}_{impl}": v for impl, d in med.items() for k, v in d.items()},
                        "wall_ratio": ratio, "paired_ratios": paired})
    for s in summary:
        verdict = "within" if s["wall_ratio"] <= 1.1 else "ABOVE"
        print(f"seed {s['seed']}: mmreplay wall / reference wall = {s['wall_ratio']:.2f} ({verdict} the 1.1 target; "
              f"per repeat: {', '.join(f'{p:.2f}' for p in s['paired_ratios'])})")
    if steps < 150_000:
        print(f"(the 1.1 target is for 150,000-step runs; at {steps:,} steps each process's one-off costs weigh more)")
    if args.out:
        Path(args.out).write_text(json.dumps({"steps": steps, "repeats": repeats, "zoo": args.zoo, "runs": rows,
                                              "summary": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
