"""How long until a store is fully checked (``mmreplay.storage.checks``): cold and warm page cache.

Builds an Atari-like store of ``--size-gb`` (84x84 uint8 frames, ``beyond_ram.build``), then, for
a cold and a warm page cache, makes every segment unchecked the way a copy does (``os.utime``
changes each file's identity: mtime and ctime), drops the files' pages (``posix_fadvise
DONTNEED`` per file, as ``beyond_ram.py`` does) for the cold run, and times
``open_store(mode="r")`` + ``wait_checked()``: the background checker reads every committed row
of every sealed segment (stamps and crc32c) before the store serves it.

    python benchmarks/checks.py                 # 10 GB in /var/tmp (~1 min to build)
    python benchmarks/checks.py --size-gb 2 --dir /tmp
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from beyond_ram import build
from kit import drop_pages

import mmreplay


def timed_check(path: Path, cold: bool) -> dict:
    for f in (path / "segments").iterdir():
        os.utime(f)  # a new identity: every check recorded for these files no longer applies
    if cold:
        os.sync()  # the build's writeback must not compete with the cold reads
        drop_pages(path)
    t0 = time.perf_counter()
    store = mmreplay.open_store(path, mode="r")  # mode "r": the results stay in memory
    opened = time.perf_counter() - t0
    pending = store.check_counts()["unchecked_rows"]
    store.wait_checked()
    secs = time.perf_counter() - t0
    counts = store.check_counts()
    rows = len(store)
    nbytes = rows * store.layout.record_bytes
    store.close()
    return {"cache": "cold" if cold else "warm", "open_s": round(opened, 4), "seconds_to_checked": round(secs, 2),
            "rows": rows, "rows_pending_at_open": pending, "checked_segments": counts["checked_segments"],
            "gb_checked": round(nbytes / 1e9, 2), "gb_per_s": round(nbytes / 1e9 / secs, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=10.0)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--keep", default=None, help="reuse (or keep) the store at this path")
    args = ap.parse_args()
    tmp = None
    if args.keep and Path(args.keep).exists():
        path = Path(args.keep)
    else:
        tmp = None if args.keep else tempfile.mkdtemp(prefix="checks-", dir=args.dir)
        path = Path(args.keep) if args.keep else Path(tmp) / "store"
        info = build(path, args.size_gb * 1e9)
        print(json.dumps({"built": info}))
    try:
        for cold in (True, False):
            print(json.dumps(timed_check(path, cold)), flush=True)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
