"""A store larger than RAM for the offline benchmark's speed figure: a dataset's rows written COPIES
times into a new store (same schema, lanes, segment size and metadata), through the public API
(``store.rows`` to read, ``create_store`` and ``Writer.add_batch`` to write). Each copy ends as the
source does, so the episodes are the source's, repeated; field statistics and scores are the same.

    python benchmarks/offline_continuous_big.py ~/.cache/mmreplay-bench/Hopper-v5/medium /var/tmp/big 1500
    # 300,012,000 rows, 36 GB, ~3 min; then the same run in RAM and beyond it, side by side:
    mmreplay train --offline --algo td3bc --eval-env Hopper-v5 --steps 100000 --threads 1 \\
        --store ~/.cache/mmreplay-bench/Hopper-v5/medium --run-dir runs/inram &
    mmreplay train --offline --algo td3bc --eval-env Hopper-v5 --steps 100000 --threads 1 \\
        --store /var/tmp/big --sampler-mode windowed --cache-bytes 2147483648 --run-dir runs/big

(docs/results.md, "Offline RL for continuous control", gives the figures and the other flags.)
The first training run on the new store checks every sealed segment and computes the observation
statistics before it starts (about 18 minutes for 36 GB here); later runs start in seconds.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import mmreplay

FIELDS = ("obs", "action", "reward", "terminated", "truncated")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", help="the dataset's store")
    ap.add_argument("dest", help="the new store (must not exist)")
    ap.add_argument("copies", type=int, help="how many times the source's rows are written")
    args = ap.parse_args()
    with mmreplay.open_store(args.source, mode="r") as src:
        R, segs = src.segment_records, src.segments()
        lanes = segs[0].lanes
        ids = np.concatenate([s.segment_id * R + np.arange(s.committed) for s in segs])
        schema, meta = src.schema, dict(src.manifest.get("metadata", {}))
        steps = {n: (a := src.rows(n, ids)).reshape(len(ids) // lanes, lanes, *a.shape[1:]) for n in FIELDS}
    rows = len(ids) * args.copies
    meta["enlarged_from"] = {"store": str(args.source), "copies": args.copies}
    t0 = time.perf_counter()
    with mmreplay.create_store(args.dest, schema, capacity=rows + 10 * R, segment_records=R, on_full="error",
                               metadata=meta) as out, out.writer(lanes=lanes) as w:
        for done in range(1, args.copies + 1):
            w.add_batch(steps)
            if done % 100 == 0:
                print(f"{done} copies, {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"wrote {args.copies} copies ({rows:,} rows) in {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
