"""Side-by-side speed harness: mmreplay against SB3, cpprb and TorchRL in one process run.

    python benchmarks/run.py                 # everything available, default sizes
    python benchmarks/run.py --quick         # smaller sizes, for a smoke run
    python benchmarks/run.py --json out.json

Workload "vector" (issue 2): a transition is obs (8,) float32, int64 action, float32 reward,
terminated/truncated flags; capacity 1,000,000.

* single adds: one transition per call (``n_envs=1``), sustained over the whole fill (``--single``
  adds, default the capacity; capped at ``--single-seconds`` for slow peers);
* batched adds: batches of 256 (a 256-env vector step), filling the whole capacity;
* only each library's own add call is timed: its inputs are prebuilt in the library's native form
  (SB3's ``dones`` and ``infos`` list, TorchRL's TensorDict, cpprb's and mmreplay's keyword/field
  mapping), as its user already has them (``kit.Peer.native``);
* uniform sampling of batch 256 returned as numpy, from the full 1,000,000 rows;
* mmreplay sampling from the same rows split over 1, 16 and 256 segments.

mmreplay writes to disk-backed persistent segments in a temporary directory on the same disk
as TorchRL's memmap storage (``--dir``); SB3 and cpprb keep everything in RAM. Peers store
``next_obs`` explicitly; mmreplay derives it from the next row of the lane. Ratios are
mmreplay's rate over the best peer's, measured in this run. Before each timed phase the harness
runs ``sync`` and waits before each system is made, so no system is timed while another's disk
writeback is in flight.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kit  # noqa: E402
from kit import OBS_SHAPE, PEERS, available, quiesce  # noqa: E402

import mmreplay  # noqa: E402


DURABILITY = "segment"


class MMReplayPeer:
    """mmreplay driven through its public API the way the peers are."""

    name = "mmreplay"

    def __init__(self, capacity: int, n_envs: int, tmpdir: str, segment_records: int | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="mmreplay-", dir=tmpdir)) / "store"
        schema = mmreplay.Schema.transition(obs_shape=OBS_SHAPE, obs_dtype=np.float32)
        self.store = mmreplay.create_store(self.path, schema, capacity=capacity, segment_records=segment_records)
        self.writer = self.store.writer(lanes=n_envs, durability=DURABILITY)
        self.sampler: mmreplay.UniformSampler | None = None

    def add(self, obs, next_obs, action, reward, terminated, truncated) -> None:
        del next_obs  # derived from the lane's next row
        self.writer.add(obs=obs, action=action, reward=reward, terminated=terminated, truncated=truncated)

    def native(self, obs, next_obs, action, reward, terminated, truncated):  # noqa: ANN001, ANN201
        del next_obs
        return partial(self.writer.add, {"obs": obs, "action": action, "reward": reward, "terminated": terminated,
                                         "truncated": truncated})

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        if self.sampler is None:
            self.sampler = mmreplay.UniformSampler(self.store, seed=0)
        b = self.sampler.sample(batch_size)
        return {"obs": b.obs, "next_obs": b.next_obs, "action": b.action, "reward": b.reward, "terminated": b.terminated}

    def close(self) -> None:
        self.writer.close()
        self.store.close()


def _data(n_envs: int, n: int, rng: np.random.Generator):
    """``n`` distinct vector steps of ``n_envs`` transitions, cycled by the timing loops."""
    obs = rng.standard_normal((n, n_envs, *OBS_SHAPE), dtype=np.float32)
    return [
        (obs[i], obs[(i + 1) % n], rng.integers(0, 4, n_envs), rng.standard_normal(n_envs, dtype=np.float32),
         rng.random(n_envs) < 0.01, rng.random(n_envs) < 0.005)
        for i in range(n)
    ]


def time_adds(peer, data, total: int, seconds: float) -> float:
    """Steps added per second (each step has ``n_envs`` transitions), sustained over ``total``
    steps (or until ``seconds``). Only the library's own add call is timed: every input is
    prebuilt in its native form (``peer.native``), as its user already has it."""
    calls = [peer.native(*d) for d in data]
    chunk = max(1, min(256, len(calls)))
    t0 = time.perf_counter()
    deadline = t0 + seconds
    i = 0
    m = len(calls)
    while i < total:
        n = min(chunk, total - i)
        j = i % m
        for call in calls[j : j + n] if j + n <= m else calls[j:] + calls[: n - (m - j)]:
            call()
        i += n
        if time.perf_counter() > deadline:
            break
    return i / (time.perf_counter() - t0)


def time_samples(peer, batch: int, seconds: float) -> float:
    """Batches of ``batch`` sampled per second, after a ``quiesce``, the clock read every 16 batches."""
    quiesce()
    return kit.rate(partial(peer.sample, batch), seconds, every=16)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--single", type=int, default=None, help="single adds per system (default: the capacity, "
                    "i.e. sustained over the whole fill)")
    ap.add_argument("--single-seconds", type=float, default=60.0, help="time cap on single adds (slow peers)")
    ap.add_argument("--seconds", type=float, default=3.0, help="time per sample measurement")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dir", default=None, help="where disk-backed stores go (default: a temp dir on /var/tmp)")
    ap.add_argument("--quick", action="store_true", help="capacity 100k, 1 s per measurement")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated peers to include")
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--repeats", type=int, default=3, help="runs per system; the table shows medians")
    ap.add_argument("--durability", default="segment", choices=["process", "segment", "batch"],
                    help="mmreplay writer durability (default: the library default, 'segment')")
    args = ap.parse_args()
    if args.quick:
        args.capacity, args.seconds, args.single, args.repeats = 100_000, 1.0, 50_000, 1
    if args.single is None:
        args.single = args.capacity
    return args


def measure(cls, args: argparse.Namespace, base: Path, single_data, batch_data) -> dict[str, float]:  # noqa: ANN001
    """One run of one system: single adds over a fresh buffer, then batched adds and sampling over another."""
    r: dict[str, float] = {}
    quiesce()  # before a system is made, not between making it and timing it (a sync
    # there would write back mmreplay's pre-faulted pages and fault them in again)
    p = cls(args.capacity, 1, str(base))
    r["single_adds_per_s"] = time_adds(p, single_data, args.single, args.single_seconds)
    getattr(p, "close", lambda: None)()
    del p
    gc.collect()
    quiesce()
    p = cls(args.capacity, args.batch, str(base))
    r["batched_rows_per_s"] = time_adds(p, batch_data, args.capacity // args.batch, 1e9) * args.batch
    r["sample_batches_per_s"] = time_samples(p, args.batch, args.seconds)
    getattr(p, "close", lambda: None)()
    del p
    gc.collect()
    return r


def segment_sweep(args: argparse.Namespace, base: Path, batch_data) -> dict[int, tuple[int, float]]:  # noqa: ANN001
    """mmreplay's sampling rate over the same rows split into 1, 16 and 256 segments."""
    seg_rates = {}
    for nseg in (1, 16, 256):
        rows = args.capacity
        quiesce()
        p = MMReplayPeer(rows, args.batch, str(base), segment_records=-(-rows // nseg // args.batch) * args.batch)
        time_adds(p, batch_data, rows // args.batch, 1e9)
        p.store.refresh()
        actual = int((p.store.reader.snapshot.committed > 0).sum())
        seg_rates[nseg] = (actual, time_samples(p, args.batch, args.seconds))
        p.close()
        print(f"mmreplay sampling over {actual} segments: {seg_rates[nseg][1]:,.0f} batches/s", flush=True)
    return seg_rates


def report(args: argparse.Namespace, results: dict[str, dict[str, float]], seg_rates: dict) -> None:
    metrics = [("single_adds_per_s", "single adds/s"), ("batched_rows_per_s", "batched adds (rows/s, batch 256)"),
               ("sample_batches_per_s", "uniform sample (batches/s, batch 256)")]
    peers = [n for n in results if n != "mmreplay"]
    rows = []
    for key, label in metrics:
        best = max(peers, key=lambda n: results[n][key]) if peers else None
        rows.append([label, *(results[n][key] for n in results), best or "-",
                     kit.ratio(results["mmreplay"][key], results[best][key]) if best else "-"])
    print()
    print(f"mmreplay durability={args.durability!r}; medians of {args.repeats} interleaved runs")
    print(kit.table([f"workload (capacity {args.capacity:,})", *results, "best peer", "mmreplay / best"], rows))
    print()
    print(kit.table(["segments", *(str(v[0]) for v in seg_rates.values())],
                    [["sample batches/s", *(v[1] for v in seg_rates.values())]]))


def main() -> None:
    args = parse_args()
    try:  # SB3 and TorchRL sample through torch; with its default threads on 2 cores a small
        import torch  # copy costs milliseconds (measured), which is not what we compare

        torch.set_num_threads(1)
    except ImportError:
        pass
    global DURABILITY
    DURABILITY = args.durability
    base = Path(tempfile.mkdtemp(prefix="mmreplay-bench-", dir=args.dir or "/var/tmp"))
    avail = available()
    names = [n for n in args.peers.split(",") if n]
    for n in names:
        if avail.get(n):
            print(f"skipping {n}: {avail[n]}", file=sys.stderr)
    systems = {"mmreplay": MMReplayPeer, **{n: PEERS[n] for n in names if avail.get(n) is None}}
    rng = np.random.default_rng(0)
    single_data = _data(1, 4096, rng)
    batch_data = _data(args.batch, 64, rng)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
    try:
        for rep in range(args.repeats):  # systems interleaved, so slow spells of the machine hit all
            for name, cls in systems.items():
                r = measure(cls, args, base, single_data, batch_data)
                runs[name].append(r)
                print(f"[{rep + 1}/{args.repeats}] {name:>9}: " + ", ".join(f"{k} {v:,.0f}" for k, v in r.items()),
                      flush=True)
        results = {name: {k: kit.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
        seg_rates = segment_sweep(args, base, batch_data)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report(args, results, seg_rates)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"capacity": args.capacity, "results": results, "runs": runs,
                                                   "segments": {str(k): v for k, v in seg_rates.items()}}, indent=2))


if __name__ == "__main__":
    main()
