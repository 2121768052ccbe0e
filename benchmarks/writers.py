"""Multi-writer append throughput: 1, 2 and 4 writer processes appending to ONE store at once.

    .venv/bin/python benchmarks/writers.py                  # default sizes
    .venv/bin/python benchmarks/writers.py --quick          # sizes / 10, for a smoke run
    .venv/bin/python benchmarks/writers.py --json out.json  # also save the numbers

This is a benchmark, not a test: it asserts nothing about speed, it prints numbers.

The job. Actors in an RL setup are separate processes that all append to the same replay
store. This measures the aggregate append throughput of N writer processes (N = 1, 2, 4 by
default) sharing one store, against one process writing alone (N = 1), for two row shapes:

* ``atari``:  obs (84, 84) uint8, action int64, reward float32, terminated / truncated bool;
  200,000 rows in total per configuration (about 1.4 GB);
* ``vector``: obs (8,) float32, same other fields; 4,000,000 rows in total per configuration.

``--quick`` divides both totals by 10. Each configuration writes the same TOTAL number of rows,
split evenly between its writers, into a fresh store (``capacity`` = 2 x total, so nothing is
evicted) in a temporary directory under ``/var/tmp`` (``--dir``), deleted afterwards.

How one configuration runs. Every writer is a process started with the multiprocessing
``spawn`` context (never fork). It opens the store itself by path
(``mmreplay.open_store(path, mode="a")``), opens its own ``store.writer(lanes=L)`` (writer ids
are claimed automatically) and pre-generates a few distinct batches, all before the timed
part. The writers then wait on a shared ``Barrier`` so that they start together, append their
share with ``add_batch`` in batches of T=64 steps x L=8 lanes (512 rows a call; ``--steps``,
``--lanes``), and ``close()`` the writer: closing publishes, seals and syncs, and is part of
the timed work. Each writer reports its own ``time.perf_counter()`` start and end (a
system-wide monotonic clock on Linux, so comparable across processes) and its row count
through a ``Queue``.

* aggregate rows/s = total rows / (last end - first start);
* rows/s per writer = the mean over writers of rows / (own end - own start);
* MB/s = aggregate rows/s x row bytes / 1e6, with row bytes = obs bytes + 8 (action) + 4
  (reward) + 1 (terminated) + 1 (truncated) + 1 (the internal is_last flag);
* speed-up = aggregate rows/s over the 1-writer aggregate rows/s of the same workload.

After each configuration the store is reopened read-only and its row count is checked against
the rows the writers reported.

Target: on a 2-core machine, 2 writers >= 1.7x the aggregate throughput of one writer.
``os.cpu_count()`` is printed with the results; with more writers than cores the writers share
CPUs and no speed-up past the core count is to be expected.

Before anything is written, the free space on the target filesystem is checked
(``shutil.disk_usage``): the run refuses to start unless at least 3x the bytes the whole run
writes (every workload and writer count) are free.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import queue
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

WORKLOADS: dict[str, dict] = {
    "atari": {"obs_shape": (84, 84), "obs_dtype": "uint8", "rows_total": 200_000},
    "vector": {"obs_shape": (8,), "obs_dtype": "float32", "rows_total": 4_000_000},
}
EXTRA_ROW_BYTES = 8 + 4 + 1 + 1 + 1  # action int64, reward float32, terminated, truncated, is_last
N_DISTINCT_BATCHES = 4  # pre-generated batches each writer cycles through
BARRIER_TIMEOUT_S = 600.0
RESULT_TIMEOUT_S = 3600.0


def row_bytes(obs_shape: tuple[int, ...], obs_dtype: str) -> int:
    return int(np.prod(obs_shape, dtype=np.int64)) * np.dtype(obs_dtype).itemsize + EXTRA_ROW_BYTES


def make_batches(obs_shape, obs_dtype: str, steps: int, lanes: int, seed: int) -> list[dict[str, np.ndarray]]:
    """A few distinct ``add_batch`` payloads of leading shape ``(steps, lanes)``."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(N_DISTINCT_BATCHES):
        lead = (steps, lanes)
        if np.dtype(obs_dtype) == np.uint8:
            obs = rng.integers(0, 256, (*lead, *obs_shape), dtype=np.uint8)
        else:
            obs = rng.standard_normal((*lead, *obs_shape)).astype(obs_dtype)
        out.append({
            "obs": obs,
            "action": rng.integers(0, 18, lead, dtype=np.int64),
            "reward": rng.standard_normal(lead).astype(np.float32),
            "terminated": rng.random(lead) < 0.01,
            "truncated": rng.random(lead) < 0.005,
        })
    return out


def writer_main(idx: int, path: str, obs_shape, obs_dtype: str, rows: int, steps: int, lanes: int,
                durability: str, barrier, results) -> None:
    """One writer process: set up, wait for the others, append ``rows`` rows, close, report."""
    try:
        import mmreplay

        store = mmreplay.open_store(path, mode="a")
        w = store.writer(lanes=lanes, durability=durability)
        batches = make_batches(obs_shape, obs_dtype, steps, lanes, seed=1000 + idx)
        full_calls, rem_rows = divmod(rows, steps * lanes)
        rem_steps = rem_rows // lanes  # rows is a multiple of lanes (see split_rows)
        tail = {k: v[:rem_steps] for k, v in batches[0].items()} if rem_steps else None
        m = len(batches)
        barrier.wait(timeout=BARRIER_TIMEOUT_S)
        t0 = time.perf_counter()
        for i in range(full_calls):
            w.add_batch(**batches[i % m])
        if tail is not None:
            w.add_batch(**tail)
        w.close()
        t1 = time.perf_counter()
        wid = w.writer_id
        store.close()
        results.put({"idx": idx, "ok": True, "start": t0, "end": t1, "rows": int(rows), "writer_id": int(wid),
                     "pid": os.getpid()})
    except BaseException:  # report anything, and release the other writers waiting on the barrier
        try:
            barrier.abort()
        except Exception:  # noqa: S110
            pass
        results.put({"idx": idx, "ok": False, "error": traceback.format_exc(), "pid": os.getpid()})


def split_rows(total: int, writers: int, lanes: int) -> list[int]:
    """``total`` rows split between ``writers``, each share a multiple of ``lanes``."""
    units, extra = divmod(total // lanes, writers)
    return [(units + (1 if i < extra else 0)) * lanes for i in range(writers)]


def run_config(ctx, workdir: Path, name: str, spec: dict, total: int, writers: int, steps: int, lanes: int,
               durability: str) -> dict:
    import mmreplay

    path = workdir / f"{name}-w{writers}"
    schema = mmreplay.Schema.transition(obs_shape=spec["obs_shape"], obs_dtype=np.dtype(spec["obs_dtype"]))
    store = mmreplay.create_store(path, schema, capacity=total * 2)
    store.close()
    shares = split_rows(total, writers, lanes)
    barrier = ctx.Barrier(writers)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=writer_main, name=f"writer-{i}",
                    args=(i, str(path), spec["obs_shape"], spec["obs_dtype"], shares[i], steps, lanes, durability,
                          barrier, results))
        for i in range(writers)
    ]
    for p in procs:
        p.start()
    got: list[dict] = []
    try:
        deadline = time.monotonic() + RESULT_TIMEOUT_S
        while len(got) < writers:
            try:
                got.append(results.get(timeout=1.0))
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name}, {writers} writers: no result after {RESULT_TIMEOUT_S} s") from None
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and results.empty():
                    raise RuntimeError(f"{name}, {writers} writers: writer process(es) died: "
                                       + ", ".join(f"{p.name} exit {p.exitcode}" for p in dead)) from None
    finally:
        for p in procs:
            p.join(timeout=60)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join()
    errors = [r for r in got if not r["ok"]]
    if errors:
        raise RuntimeError(f"{name}, {writers} writers failed:\n" + "\n".join(r["error"] for r in errors))
    got.sort(key=lambda r: r["idx"])
    rows = sum(r["rows"] for r in got)
    first, last = min(r["start"] for r in got), max(r["end"] for r in got)
    wall = last - first
    rb = row_bytes(spec["obs_shape"], spec["obs_dtype"])
    stored = mmreplay.open_store(path, mode="r")
    stored_rows = stored.num_rows
    stored.close()
    if stored_rows != rows:
        print(f"WARNING: {name}, {writers} writers: the store holds {stored_rows} rows, writers reported {rows}",
              file=sys.stderr)
    shutil.rmtree(path, ignore_errors=True)
    per_writer = [r["rows"] / (r["end"] - r["start"]) for r in got]
    return {
        "workload": name,
        "writers": writers,
        "rows": rows,
        "rows_in_store": int(stored_rows),
        "row_bytes": rb,
        "seconds": wall,
        "rows_per_s": rows / wall,
        "mb_per_s": rows * rb / wall / 1e6,
        "rows_per_s_per_writer": per_writer,
        "rows_per_s_per_writer_mean": float(np.mean(per_writer)),
        "start_skew_s": max(r["start"] for r in got) - first,
        "writer_ids": [r["writer_id"] for r in got],
    }


def print_table(name: str, spec: dict, total: int, res: list[dict]) -> None:
    rb = row_bytes(spec["obs_shape"], spec["obs_dtype"])
    print(f"\n### {name}: obs {spec['obs_shape']} {spec['obs_dtype']}, {rb} bytes/row, "
          f"{total:,} rows per configuration ({total * rb / 1e9:.2f} GB)\n")
    print("| writers | rows/s aggregate | rows/s per writer | MB/s | speed-up vs 1 writer | seconds |")
    print("|---:|---:|---:|---:|---:|---:|")
    base = next((r["rows_per_s"] for r in res if r["writers"] == 1), None)
    for r in res:
        sp = f"{r['rows_per_s'] / base:.2f}x" if base else "n/a"
        print(f"| {r['writers']} | {r['rows_per_s']:,.0f} | {r['rows_per_s_per_writer_mean']:,.0f} | "
              f"{r['mb_per_s']:,.1f} | {sp} | {r['seconds']:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="divide the row totals by 10")
    ap.add_argument("--writers", default="1,2,4", help="comma-separated writer-process counts (default 1,2,4)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    ap.add_argument("--steps", type=int, default=64, help="T: vector steps per add_batch call (default 64)")
    ap.add_argument("--lanes", type=int, default=8, help="L: lanes per writer (default 8)")
    ap.add_argument("--durability", default="segment", choices=["process", "segment", "batch"],
                    help="writer durability (default: the library default, 'segment')")
    ap.add_argument("--dir", default="/var/tmp", help="where the temporary stores go (default /var/tmp)")
    ap.add_argument("--json", dest="json_out", default=None, metavar="PATH", help="save the numbers as JSON")
    args = ap.parse_args()

    writer_counts = [int(x) for x in args.writers.split(",") if x.strip()]
    names = [x.strip() for x in args.workloads.split(",") if x.strip()]
    for n in names:
        if n not in WORKLOADS:
            ap.error(f"unknown workload {n!r}; choose from {', '.join(WORKLOADS)}")
    if not writer_counts or min(writer_counts) < 1:
        ap.error("--writers must be positive ints")
    if args.steps < 1 or args.lanes < 1:
        ap.error("--steps and --lanes must be >= 1")
    div = 10 if args.quick else 1
    totals = {n: WORKLOADS[n]["rows_total"] // div for n in names}

    # the rows actually written (each share rounded down to whole lanes)
    planned = sum(sum(split_rows(totals[n], k, args.lanes)) * row_bytes(WORKLOADS[n]["obs_shape"],
                                                                         WORKLOADS[n]["obs_dtype"])
                  for n in names for k in writer_counts)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.dir).free
    if free < 3 * planned:
        sys.exit(f"refusing to run: {free / 1e9:.2f} GB free on {args.dir}, need at least 3 x "
                 f"{planned / 1e9:.2f} GB = {3 * planned / 1e9:.2f} GB")

    cpus = os.cpu_count()
    print(f"os.cpu_count() = {cpus}; python {platform.python_version()}; {platform.platform()}")
    print(f"batches: T={args.steps} steps x L={args.lanes} lanes = {args.steps * args.lanes} rows per add_batch; "
          f"durability={args.durability}; writers={writer_counts}; quick={args.quick}")
    print(f"bytes to write in this run: {planned / 1e9:.2f} GB; free on {args.dir}: {free / 1e9:.1f} GB")

    ctx = mp.get_context("spawn")
    workdir = Path(tempfile.mkdtemp(prefix="mmreplay-writers-", dir=args.dir))
    out: dict = {"cpu_count": cpus, "python": platform.python_version(), "platform": platform.platform(),
                 "quick": args.quick, "steps": args.steps, "lanes": args.lanes, "durability": args.durability,
                 "writers": writer_counts, "workloads": {}}
    try:
        for name in names:
            spec = WORKLOADS[name]
            res = []
            for k in writer_counts:
                res.append(run_config(ctx, workdir, name, spec, totals[name], k, args.steps, args.lanes,
                                      args.durability))
            base = next((r["rows_per_s"] for r in res if r["writers"] == 1), None)
            for r in res:
                r["speedup_vs_1"] = r["rows_per_s"] / base if base else None
            print_table(name, spec, totals[name], res)
            out["workloads"][name] = {"obs_shape": list(spec["obs_shape"]), "obs_dtype": spec["obs_dtype"],
                                      "rows_total": totals[name], "results": res}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=2) + "\n")
        print(f"\nsaved {args.json_out}")


if __name__ == "__main__":
    main()
