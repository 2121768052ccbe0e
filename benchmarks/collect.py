"""Collect throughput: env steps/s stored by `mmreplay.collect` vs the same envs stepped without storing.

    python benchmarks/collect.py [--quick] [--envs CartPole-v1 ALE/Pong-v5] [--capacity N] [--repeats N]

For each env (CartPole with E=8 and E=32 copies per worker, Atari with E=4) and W in (1, 2) worker
processes it runs, interleaved and 3 times (median):
* env only: W spawned processes each stepping a sync vector env of E copies with random actions;
* collect: `mmreplay.collect` with the same W, E and policy, into a fresh store.
The store's capacity is the run's steps (no eviction; default segments of steps / (4 x (W + 1))
rows), or ``--capacity`` (a small store: small segments, one made and one evicted every
capacity / (4 x (W + 1)) rows). The storing overhead is 1 - collect/env-only in steps/s (target: under 10%), the median of the
interleaved pairs; ``cpu`` is the same from the CPU time per env step of the stepping loops (every
thread of every worker process), which other jobs on the machine disturb less than wall time.

Both compare two separate runs, so on a shared machine their noise (±10-30 points between
pairs) can exceed the overhead itself. ``attributed`` measures the storing work directly, inside
one collect: a worker (W=1, run in a spawned process) whose step buffer's calls (``put_obs``,
``put_outcome``, ``flush``: the copies, ``add_batch``, episode counting) are timed in thread CPU,
plus the CPU of every other thread of the process (the writer's publisher, segment supply and
sync threads) over the whole collect, set-up and close included; the overhead is that storing
CPU over the rest of the loop's CPU (the env stepping and acting). The timing's own cost per call
(measured around a no-op) is taken off; what storing costs the env through the caches is left
out (the wall and CPU columns include it).
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


def _attributed(env_id: str, steps: int, envs: int, tmp: str, capacity: int | None, out) -> None:  # noqa: ANN001
    from mmreplay.actors import worker

    spent, calls = [0.0], [0]

    def timing(f):  # noqa: ANN001, ANN202
        def timed(*a, **k):  # noqa: ANN002, ANN003, ANN202
            t = time.thread_time()
            try:
                return f(*a, **k)
            finally:
                spent[0] += time.thread_time() - t
                calls[0] += 1
        return timed

    # what the timing itself adds per call (thread_time is a system call on some VMs: ~0.7 us), measured
    # around a no-op and taken off, so the figure is the storing calls' own
    noop = timing(lambda: None)
    for _ in range(20_000):
        noop()
    per_call = spent[0] / calls[0]
    for name in ("put_obs", "put_outcome", "flush"):  # the worker's storing calls, in thread CPU
        setattr(worker._StepBuffer, name, timing(getattr(worker._StepBuffer, name)))
    path = tempfile.mkdtemp(dir=tmp)
    shutil.rmtree(path)
    # a short collect first: loading numba and the kernels (once per process) is not per-step work
    collect(env_id, path + "-warm", 4 * envs, workers=0, envs_per_worker=envs, seed=1, progress=False)
    shutil.rmtree(path + "-warm")
    spent[0], calls[0] = 0.0, 0
    c0, m0 = time.process_time(), time.thread_time()
    r = collect(env_id, path, steps, workers=0, envs_per_worker=envs, seed=0, progress=False,
                capacity=capacity or max(steps, 1000))
    others = (time.process_time() - c0) - (time.thread_time() - m0)  # every other thread, exited ones too
    shutil.rmtree(path)
    out.put((spent[0] - calls[0] * per_call, others, r.loop_cpu_seconds))


def attributed(env_id: str, steps: int, envs: int, tmp: str, capacity: int | None) -> float:
    """Storing CPU over the rest of the loop's CPU, inside one collect (W=1)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_attributed, args=(env_id, steps, envs, tmp, capacity, q))
    p.start()
    main, others, loop = q.get()
    p.join()
    storing = main + others
    return storing / (loop - storing)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="+", default=["CartPole-v1", "ALE/Pong-v5"])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--capacity", type=int, default=None, help="store capacity (default: the run's steps)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="mmreplay-collect-bench-", dir="/var/tmp")
    try:
        print(f"{'env':<14} {'W':>2} {'E':>2} {'env only':>12} {'collect':>12} {'overhead':>9} {'cpu':>7} "
              f"{'attributed':>10}")
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
                att = (f"{statistics.median(attributed(env_id, steps, E, tmp, args.capacity) for _ in range(args.repeats)):>10.1%}"
                       if W == 1 else f"{'':>10}")
                print(f"{env_id:<14} {W:>2} {E:>2} {ea:>10,.0f}/s {eb:>10,.0f}/s {wall:>8.1%} {cpu:>6.1%} {att}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
