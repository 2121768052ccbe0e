"""``python -m benchmarks``: the benchmarks, what each measures and how long it takes; run one or a suite.

    python -m benchmarks                       # the list
    python -m benchmarks atari --quick         # one script, with its own flags (python benchmarks/atari.py --quick)
    python -m benchmarks --suite quick         # every smoke run, one after the other (a few minutes)
    python -m benchmarks --suite headline      # the commands of the README's performance table (hours)

Each entry runs ``python benchmarks/NAME.py`` in a subprocess (the scripts stay runnable on their
own); the shared code is ``benchmarks/kit.py``; the figures and their conditions are in
docs/results.md. Durations are those of the default settings on the 2-core development VM, as
recorded with the figures (``~``: an estimate from the settings, not a timed run).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent


class Bench(NamedTuple):
    measures: str
    takes: str
    quick: tuple[str, ...] | None = None  # the smoke-run flags, when the script has a short form
    headline: tuple[str, ...] | None = None  # the flags of the README's performance-table figure


BENCHMARKS: dict[str, Bench] = {
    "run": Bench("vector buffer side by side (make bench): single and batched adds, uniform sampling, vs SB3, cpprb, "
                 "TorchRL; sampling over 1/16/256 segments", "~15 min", ("--quick",),
                 ("--peers", "sb3,cpprb,torchrl", "--repeats", "3", "--seconds", "1")),
    "atari": Bench("Atari frame stacks of 4 (B=32/256) and bytes per step vs cpprb, numpy, SB3, TorchRL; 1 or L lanes",
                   "~10 min", ("--quick",), ()),
    "prioritized": Bench("prioritized sample 256 + update 256, capacity 1M, vs cpprb and TorchRL", "~3 min",
                         ("--capacity", "100000", "--seconds", "1", "--repeats", "1"), ()),
    "beyond_ram": Bench("a 40 GB store (1.6x RAM): exact + prefetch, windowed, in RAM; the disk's random-read limit; "
                        "windowed mode's bias", "~10 min",
                        ("--size-gb", "2", "--cache-gb", "0.25", "--seconds", "1", "--bias-seconds", "3"), ()),
    "writers": Bench("aggregate append rate of 1, 2, 4 writer processes into one store (Atari and vector rows)",
                     "~5 min", ("--quick",)),
    "collect": Bench("collect's storing overhead against the same envs stepped without storing (wall, CPU, "
                     "attributed)", "~20 min", ("--quick",), ("--repeats", "5")),
    "loader": Bench("BatchLoader against synchronous sampling with a simulated 2 ms learner step (CPU)", "~1 min",
                    ("--rows", "5000", "--seconds", "1"), ("--rows", "30000", "--seconds", "2")),
    "loader_gpu": Bench("Nature-CNN updates/s fed by the loader vs synchronous + copy; pinned vs pageable "
                        "bandwidth (CUDA)", "~3 min on a GPU", ("--device", "cpu", "--rows", "5000", "--seconds", "1")),
    "gpu_check": Bench("learner updates/s eager and graph-captured, and the data path to the device (run by "
                       "gpu_check.sh on a GPU machine)", "~5 min on a GPU",
                       ("--device", "cpu", "--rows", "3000", "--seconds", "0.5", "--batch-sizes", "8", "32")),
    "scale": Bench("per-batch cost (uniform, sequence, prioritized, frame stacks), open and whole-store passes "
                   "(field_stats, verify, export, first check) at 1M/10M/100M rows vs TorchRL and cpprb",
                   "~30 min (est.)", ("--quick",)),
    "minari_export": Bench("export_minari against Minari's own writer given the same episodes in memory",
                           "~1 min", ("--episodes", "40", "--repeats", "1")),
    "checks": Bench("time until a 10 GB store is fully checked after open, cold and warm page cache", "~3 min",
                    ("--size-gb", "0.5", "--dir", "/tmp")),
    "archive": Bench("zarr archive size against the rows for ALE frames (Breakout, Pong, SpaceInvaders)", "~5 min",
                     ("--steps", "2000", "--games", "Pong")),
    "archive_rates": Bench("export and import rates (MB/s of rows) to a local path and to an S3 API (moto on "
                           "loopback), Atari frames and vector rows", "~5 min", ("--rows", "4000", "--repeats", "1")),
    "damage": Bench("the damage suite: random damage to stores, rows lost or masked beyond the damaged ones",
                    "6 min (5,000 cases)", ("--cases", "20")),
    "crash_states": Bench("every state a crash may leave writer sessions in (each durability, two lanes), recovery "
                          "and repair crashing too: the invariants checked in each", "~25 min (est.)",
                          ("--sessions", "lanes", "--recovery-bases", "2")),
    "cluster": Bench("Ray actors: env steps/s stored with 1, 2, 4 actors, and the lag to the learner", "~10 min",
                     ("--quick",)),
    "train_loop": Bench("mmreplay train's loop vs a single-file DQN with a numpy ring (CartPole, CleanRL settings)",
                        "~15 min", ("--quick",), ("--steps", "150000", "--repeats", "3")),
    "train_cartpole": Bench("mmreplay train on CartPole, 3 seeds (sync and --actors 2), vs a CleanRL-style DQN",
                            "~30 min (est.)", ("--seeds", "1", "--steps", "5000")),
    "minatar_dqn": Bench("mmreplay train --minatar vs a single-file reference DQN on MinAtar Breakout, 3 seeds, "
                         "configurations (a) and (b)", "~1 h 30 min (est.; (a) 6 seeds took 1 h 45 min)", None, ()),
    "atari_train": Bench("Nature DQN on Pong, 100k env steps: mmreplay train vs SB3's DQN (speed, memory)",
                         "~1 h (est.)", ("--quick",), ()),
    "integrations": Bench("SB3 DQN and SAC with their own buffer vs MMReplayBuffer; TorchRL storage; "
                          "TransitionDataset", "~40 min (est.)", ("--parts", "torchrl,dataloader", "--seeds", "1"),
                          ("--parts", "dqn", "--seeds", "1", "2", "3")),
    "offline": Bench("offline BC, CQL and DQN on random and mediocre CartPole datasets, 3 seeds", "~30 min (est.)",
                     ("--updates", "500", "--seeds", "1", "--steps", "5000")),
    "offline_continuous": Bench("offline TD3+BC / IQL on Hopper-v5 against a CORL-style single-file reference "
                                "(resumes where it stopped)", "hours (one run ~15 min)", None, ()),
    "kit": Bench("self-check of the peer adapters (rough add and sample rates)", "~1 min", ()),
}
# Scripts that are parts of others, not benchmarks of their own: cleanrl_dqn.py (the reference DQN of
# train_loop, train_cartpole and minatar_dqn), offline_continuous_data.py, offline_continuous_ref.py and
# offline_continuous_big.py (the datasets, the reference and the larger-than-RAM store of offline_continuous).
SUITES = {"quick": "quick", "headline": "headline"}


def listing() -> str:
    width = max(map(len, BENCHMARKS))
    lines = [f"{'name':<{width}}  {'takes':<24}  measures"]
    lines += [f"{name:<{width}}  {b.takes:<24}  {b.measures}" for name, b in BENCHMARKS.items()]
    lines.append("\npython -m benchmarks NAME [FLAGS...] runs one; --suite quick (smoke runs) or --suite headline "
                 "(the README's performance table) runs several.")
    return "\n".join(lines)


def run(name: str, flags: list[str]) -> int:
    cmd = [sys.executable, str(HERE / f"{name}.py"), *flags]
    print(f"\n$ python benchmarks/{name}.py {' '.join(flags)}".rstrip(), flush=True)
    t0 = time.perf_counter()
    rc = subprocess.call(cmd)
    print(f"[{name}: exit {rc}, {time.perf_counter() - t0:.0f} s]", flush=True)
    return rc


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", nargs="?", choices=list(BENCHMARKS), help="the benchmark to run")
    ap.add_argument("--suite", choices=list(SUITES), help="run every benchmark that has this form")
    args, flags = ap.parse_known_args(argv)
    if args.suite:
        if args.name or flags:
            ap.error("--suite runs the benchmarks with their own settings: give no NAME or flags")
        chosen = {n: getattr(b, args.suite) for n, b in BENCHMARKS.items() if getattr(b, args.suite) is not None}
        failed = [n for n, f in chosen.items() if run(n, list(f)) != 0]
        print(f"\nsuite {args.suite}: {len(chosen) - len(failed)} of {len(chosen)} ran" +
              (f"; failed: {', '.join(failed)}" if failed else ""))
        return 1 if failed else 0
    if args.name is None:
        print(listing())
        return 0
    return run(args.name, flags)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
