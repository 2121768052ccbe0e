"""Ray actors: env steps/s stored with 1, 2 and 4 Ray actors, and the lag from an actor publishing
a row to the learner being able to sample it.

    python benchmarks/cluster.py [--quick] [--steps 400000] [--actors 1 2 4] [--envs-per-actor 8]

One local Ray instance (started here, as `mmreplay collect --ray` does without an address).

Throughput (CartPole-v1, random actions, E env copies per actor): `ray_collect` with A actors,
each writing a local store and exporting sealed segments every second into an archive directory,
while this process ingests them into the learner's store every 0.5 s. Reported:
* stored/s: rows in the learner's store at the end / wall time of the whole `ray_collect` call
  (actor creation, the last exports and the last ingest included; Ray already running);
* actors loop/s: env steps of all actors / the longest actor's stepping loop (no start-up);
* local collect/s: the same A and E with `mmreplay.collect` worker processes into one store (no Ray,
  no shipping), for reference.

Lag: CartPole with the wall clock appended to every observation (float64). While 2 actors
collect, this process polls a read-only handle of the learner's store every 20 ms; for each row
that became visible, lag = the time it became visible - the clock in its observation (the step
that produced the row, which the actor published within the next env step). Reported as
percentiles over rows, and the lag of the newest row each time new rows became visible
(steps/s: both actors together). Rows travel one sealed segment at a time, so lag ~ segment
fill time (segment_records / actor rate) + export period + ingest period + the work of each.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import tempfile
import threading
import time

import numpy as np


def clock_cartpole(step_s: float = 0.0):  # noqa: ANN201 - pickled by value into the Ray actors (this is __main__)
    """CartPole whose observation ends with the wall clock; ``step_s`` sleeps in each step (a slower actor)."""
    import gymnasium as gym

    class Clock(gym.ObservationWrapper):
        def __init__(self, env):  # noqa: ANN001
            super().__init__(env)
            lo = np.append(env.observation_space.low.astype(np.float64), 0.0)
            hi = np.append(env.observation_space.high.astype(np.float64), np.inf)
            self.observation_space = gym.spaces.Box(lo, hi, dtype=np.float64)

        def step(self, action):  # noqa: ANN001, ANN201
            if step_s:
                time.sleep(step_s)
            return super().step(action)

        def observation(self, obs):  # noqa: ANN001, ANN201
            return np.append(obs.astype(np.float64), time.time())

    return Clock(gym.make("CartPole-v1"))


def throughput(tmp: str, steps: int, actors: int, envs: int) -> tuple[float, float, int]:
    from mmreplay.cluster import ray_collect

    d = tempfile.mkdtemp(dir=tmp)
    t0 = time.perf_counter()
    r = ray_collect("CartPole-v1", f"{d}/archive", steps, actors=actors, envs_per_actor=envs, store=f"{d}/learner",
                    seed=0, progress=False, local_dir=f"{d}/local", capacity=max(steps * 2, 100_000))
    wall = time.perf_counter() - t0
    assert not r.errors, r.errors
    shutil.rmtree(d)
    return r.rows_ingested / wall, r.steps / r.loop_seconds, r.rows_ingested


def local_collect(tmp: str, steps: int, workers: int, envs: int) -> float:
    from mmreplay.actors import collect

    d = tempfile.mkdtemp(dir=tmp)
    t0 = time.perf_counter()
    r = collect("CartPole-v1", f"{d}/s", steps, workers=workers, envs_per_worker=envs, seed=0, progress=False,
                capacity=max(steps * 2, 100_000))
    wall = time.perf_counter() - t0
    shutil.rmtree(d)
    return r.steps / wall


def lag(tmp: str, steps: int, actors: int, envs: int, segment_records: int | None, export_s: float,
        ingest_s: float, step_s: float) -> dict[str, float]:
    import mmreplay
    from mmreplay.cluster import cluster_segment_records, ray_collect

    d = tempfile.mkdtemp(dir=tmp)
    e = clock_cartpole()
    schema = mmreplay.Schema.from_spaces(e.observation_space, e.action_space)
    e.close()
    R = segment_records or cluster_segment_records(schema, envs)
    mmreplay.create_store(f"{d}/learner", schema, capacity=steps * 2, segment_records=R).close()
    out: dict = {}
    th = threading.Thread(target=lambda: out.update(r=ray_collect(
        functools.partial(clock_cartpole, step_s), f"{d}/archive", steps, actors=actors, envs_per_actor=envs, store=f"{d}/learner", seed=0,
        progress=False, local_dir=f"{d}/local", export_s=export_s, ingest_s=ingest_s)))
    th.start()
    lags, newest = [], []
    seen: set[int] = set()
    with mmreplay.open_store(f"{d}/learner") as st:
        while th.is_alive():
            time.sleep(0.02)
            st.refresh()
            now = time.time()
            s = st.reader.snapshot
            fresh = [(int(sid), int(n)) for sid, n in zip(s.segment_ids, s.committed) if int(sid) not in seen]
            if not fresh:
                continue
            ids = np.concatenate([sid * R + np.arange(n) for sid, n in fresh])
            clock = st.rows("obs", ids)[:, -1]
            seen.update(sid for sid, _ in fresh)
            lags.append(now - clock)
            newest.append(now - clock.max())
    th.join()
    r = out["r"]
    shutil.rmtree(d)
    x = np.concatenate(lags)
    return {"R": R, "rows": len(x), "rate": r.steps / r.loop_seconds, "p50": float(np.median(x)),
            "p90": float(np.percentile(x, 90)), "p99": float(np.percentile(x, 99)), "max": float(x.max()),
            "newest_p50": float(np.median(newest)), "newest_max": float(np.max(newest))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small runs (a smoke test of this script)")
    ap.add_argument("--steps", type=int, default=400_000)
    ap.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--envs-per-actor", type=int, default=8)
    args = ap.parse_args()
    steps = 40_000 if args.quick else args.steps
    E = args.envs_per_actor
    from mmreplay.cluster import start_local_ray

    t0 = time.perf_counter()
    start_local_ray(max(os.cpu_count() or 1, max(args.actors)))  # loopback only, like `collect --ray`
    import ray

    print(f"local Ray started in {time.perf_counter() - t0:.1f} s; {os.cpu_count()} cores", flush=True)
    tmp = tempfile.mkdtemp(prefix="mmreplay-bench-cluster-", dir="/var/tmp")
    try:
        print(f"\nthroughput, CartPole-v1, random actions, E={E} per actor, {steps:,} steps")
        print(f"{'A':>2} {'stored/s':>12} {'actors loop/s':>13} {'local collect/s':>16} {'rows':>9}")
        for A in args.actors:
            rate, loop, rows = throughput(tmp, steps, A, E)
            ref = local_collect(tmp, steps, A, E)
            print(f"{A:>2} {rate:>12,.0f} {loop:>13,.0f} {ref:>16,.0f} {rows:>9,}", flush=True)
        print("\nlag, actor publishes a row -> learner can sample it (2 actors, E=4, CartPole + clock)")
        print(f"{'actor':>10} {'segment':>8} {'export_s':>8} {'ingest_s':>8} {'steps/s':>9} {'p50':>7} {'p90':>7} "
              f"{'p99':>7} {'max':>7} {'newest p50':>10} {'newest max':>10}")
        full, slow = (100_000, 20_000) if args.quick else (600_000, 60_000)
        # full speed with the defaults; then actors slowed to ~2.5k steps/s each (0.4 ms per env step,
        # about an eps-greedy actor with a small network), with the defaults and with low-lag settings
        for what, n, step_s, R, ex, ing in (("full", full, 0.0, None, 1.0, 0.5), ("0.4ms/step", slow, 4e-4, None, 1.0, 0.5),
                                            ("0.4ms/step", slow, 4e-4, 1024, 0.25, 0.1)):
            m = lag(tmp, n, 2, 4, R, ex, ing, step_s)
            print(f"{what:>10} {m['R']:>8} {ex:>8} {ing:>8} {m['rate']:>9,.0f} {m['p50']:>6.2f}s {m['p90']:>6.2f}s "
                  f"{m['p99']:>6.2f}s {m['max']:>6.2f}s {m['newest_p50']:>9.2f}s {m['newest_max']:>9.2f}s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        ray.shutdown()


if __name__ == "__main__":
    main()
