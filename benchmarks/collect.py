"""Collect throughput: env steps/s stored by `mmreplay.collect` vs the same envs stepped without storing.

    python benchmarks/collect.py [--quick] [--envs CartPole-v1 ALE/Pong-v5] [--capacity N]

For each env (CartPole with E=8 and E=32 copies per worker, Atari with E=4) and W in (1, 2) worker
processes it runs, interleaved and 3 times (median):
* env only: W spawned processes each stepping a sync vector env of E copies with random actions;
* collect: `mmreplay.collect` with the same W, E and policy, into a fresh store.
The store's capacity is the run's steps (no eviction; default segments of steps / (4 x (W + 1))
rows), or ``--capacity`` (a small store: small segments, one made and one evicted every
capacity / (4 x (W + 1)) rows). The storing overhead is 1 - collect/env-only in steps/s (target: under 10%), the median of the
interleaved pairs; ``cpu`` is the same from the CPU time per env step of the stepping loops (every
thread of every worker process), which other jobs on the machine disturb less than wall time.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import statistics
import tempfile
import time

from mmreplay.actors import collect
from mmreplay.agent.envs import make_vec_env


def _env_only(env_id: str, steps: int, envs: int, seed: int, out) -> None:  # noqa: ANN001
    v = make_vec_env(env_id, envs)
    v.reset(seed=[seed + j for j in range(envs)])
    v.action_space.seed(seed)
    done = 0
    t0, c0 = time.perf_counter(), time.process_time()
    while done < steps:
        v.step(v.action_space.sample())
        done += envs
    out.put((done, time.perf_counter() - t0, time.process_time() - c0))
    v.close()


def env_only(env_id: str, steps: int, workers: int, envs: int) -> tuple[float, float]:
    """(env steps/s, CPU seconds per env step)"""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    share = steps // workers
    procs = [ctx.Process(target=_env_only, args=(env_id, share, envs, 100 * w, q)) for w in range(workers)]
    for p in procs:
        p.start()
    res = [q.get() for _ in procs]
    for p in procs:
        p.join()
    # aggregate rate over the stepping loops (process start-up excluded, as collect's timing below)
    n = sum(r[0] for r in res)
    return n / max(r[1] for r in res), sum(r[2] for r in res) / n


def stored(env_id: str, steps: int, workers: int, envs: int, tmp: str, capacity: int | None) -> tuple[float, float]:
    """(env steps/s, CPU seconds per env step)"""
    path = tempfile.mkdtemp(dir=tmp)
    shutil.rmtree(path)
    r = collect(env_id, path, steps, workers=workers, envs_per_worker=envs, seed=0, progress=False,
                capacity=capacity or max(steps, 1000))
    assert not r.errors, r.errors
    shutil.rmtree(path)
    return r.steps / r.loop_seconds, r.loop_cpu_seconds / r.steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="+", default=["CartPole-v1", "ALE/Pong-v5"])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--capacity", type=int, default=None, help="store capacity (default: the run's steps)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="mmreplay-collect-bench-", dir="/var/tmp")
    try:
        print(f"{'env':<14} {'W':>2} {'E':>2} {'env only':>12} {'collect':>12} {'overhead':>9} {'cpu':>7}")
        runs = [(e, E) for e in args.envs for E in ((4,) if e.startswith("ALE/") else (8, 32))]
        for env_id, E in runs:
            atari = env_id.startswith("ALE/")
            steps = (20_000 if atari else 200_000) // (4 if args.quick else 1)
            for W in (1, 2):
                a, b = [], []
                for _ in range(args.repeats):
                    a.append(env_only(env_id, steps, W, E))
                    b.append(stored(env_id, steps, W, E, tmp, args.capacity))
                ea, eb = statistics.median(x[0] for x in a), statistics.median(x[0] for x in b)
                wall = statistics.median(1 - y[0] / x[0] for x, y in zip(a, b))
                cpu = statistics.median(y[1] / x[1] - 1 for x, y in zip(a, b))
                print(f"{env_id:<14} {W:>2} {E:>2} {ea:>10,.0f}/s {eb:>10,.0f}/s {wall:>8.1%} {cpu:>6.1%}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
