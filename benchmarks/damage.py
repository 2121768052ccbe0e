"""The damage suite at scale: what random damage costs a store (``mmreplay.testing.damage``).

Each case copies a small store (1 or 3 lanes, 3-8 segments; closed, or as a killed writer leaves it
with its last segment open), damages 1-3 regions of 1-3 segments or of the store's own files
(headers, control slots, any byte of a row's record or stamp, whole pages anywhere, truncation
anywhere or mid-row, a missing file, two files swapped, a segment of another store copied in,
CATALOG.log damaged, missing or cut, counters.bin, STORE.json), then reads it with every
sampler and view, recovers, verifies and repairs it twice, and in one case of five exports and
imports it. Every invariant is checked row id by row id against the undamaged store; a case that
breaks one stops the run with its seed and damage. The test suite runs 300 cases; this runs more:

    python benchmarks/damage.py --cases 5000
    python benchmarks/damage.py --cases 500 --first-seed 100000 --dir /tmp/dmg

It prints the totals: cases, rows whose bytes the damage changed, rows no longer served after the
repairs, and of those the rows beyond the damaged ones (the target is 0: damage costs exactly the
damaged rows).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from mmreplay.testing.damage import run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=5000)
    ap.add_argument("--first-seed", type=int, default=0, help="cases use seeds first-seed .. first-seed + cases - 1")
    ap.add_argument("--dir", type=Path, default=None, help="work directory (a temporary one by default)")
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="mmreplay-damage-"))
    t0 = time.perf_counter()
    try:
        totals = run(args.cases, root, first_seed=args.first_seed, progress=True)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    totals["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(totals))
    print(f"{totals['cases']} cases: {totals['damaged_rows']:,} rows damaged, {totals['rows_not_served']:,} no longer "
          f"served after repair, {totals['rows_beyond_damaged']} beyond the damaged ones (target 0); "
          f"{totals['exported']} export round trips; {totals['manifest_refused']} damaged manifests refused")


if __name__ == "__main__":
    main()
