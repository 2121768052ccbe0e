"""Archive export and import rates: MB/s of rows, to a local path and to an S3 API (moto on loopback).

    python benchmarks/archive_rates.py                   # Atari frames and vector rows, local and S3 (~3 min)
    python benchmarks/archive_rates.py --targets local --rows 20000

For each kind of row (84x84 uint8 frames, ``Schema.transition(obs_shape=(84, 84))``; and vector rows,
``obs_shape=(17,)`` float32 as MuJoCo's) it builds a store of ``--rows`` rows (one writer, sealed
segments), then, ``--repeats`` times: ``export_archive`` into a new archive (a local directory, or
``s3://`` on moto's standalone server started here on 127.0.0.1: an S3 API over HTTP, in memory), and
``import_archive`` of it into a new store. It prints the rate of each as MB of rows (rows x the row's
bytes: fields and ``is_last``) per second of the call, the median over the repeats, and the archive's
size. Time is the library's call alone (the store's pages are in the page cache: the disk's read rate
is not what is measured).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import mmreplay


def build(path: Path, kind: str, rows: int) -> tuple[mmreplay.ReplayStore, int]:
    """A store of ``rows`` rows of ``kind`` (``frames`` or ``vector``); returns it and a row's bytes."""
    rng = np.random.default_rng(0)
    if kind == "frames":
        schema = mmreplay.Schema.transition(obs_shape=(84, 84), obs_dtype=np.uint8)
        pool = rng.integers(0, 256, (256, 84, 84), dtype=np.uint8)
        pool[:, :40] = pool[:, :40] // 64 * 64  # (some structure, as game frames have: they compress)
    else:
        schema = mmreplay.Schema.transition(obs_shape=(17,), obs_dtype=np.float32)
        pool = rng.standard_normal((256, 17)).astype(np.float32)
    store = mmreplay.create_store(path, schema, capacity=rows * 2, segment_records=4096)
    with store.writer(lanes=1) as w:
        for lo in range(0, rows, 1024):
            t = np.arange(lo, min(lo + 1024, rows))
            w.add_batch(obs=pool[t % 256][:, None], action=(t % 6).astype(np.int64)[:, None],
                        reward=(t % 3).astype(np.float32)[:, None], terminated=(t % 500 == 499)[:, None],
                        truncated=np.zeros((len(t), 1), bool))
    store.refresh()
    row_bytes = sum(f.dtype.itemsize * int(np.prod(f.shape)) for f in schema.fields) + 1
    return store, row_bytes


def moto_server() -> tuple[object, dict]:
    """moto's S3 API on 127.0.0.1 (a free port), a bucket, and the storage options that reach it."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # (the server's log line per request)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                 region_name="us-east-1").create_bucket(Bucket="bench")
    opts = {"key": "test", "secret": "test", "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    return server, opts


def time_round(store: mmreplay.ReplayStore, url: str, back: Path, opts: dict | None) -> tuple[float, float, int]:
    """(export seconds, import seconds, archive bytes) of one export and import."""
    t0 = time.perf_counter()
    mmreplay.export_archive(store, url, storage_options=opts)
    t1 = time.perf_counter()
    mmreplay.import_archive(url, back, storage_options=opts)
    t2 = time.perf_counter()
    size = 0
    if "://" not in url:
        size = sum(p.stat().st_size for p in Path(url).rglob("*") if p.is_file())
    return t1 - t0, t2 - t1, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=40_000)
    ap.add_argument("--kinds", nargs="+", default=["frames", "vector"], choices=["frames", "vector"])
    ap.add_argument("--targets", nargs="+", default=["local", "s3"], choices=["local", "s3"])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mmreplay-archive-rates-", dir="/var/tmp"))
    server, opts = moto_server() if "s3" in args.targets else (None, None)
    try:
        for kind in args.kinds:
            store, row_bytes = build(tmp / f"src-{kind}", kind, args.rows)
            mb = args.rows * row_bytes / 1e6
            for target in args.targets:
                ex, im, size = [], [], 0
                for r in range(args.repeats):
                    url = (str(tmp / f"{kind}-{r}.zarr") if target == "local"
                           else f"s3://bench/{kind}-{r}-{time.time_ns()}.zarr")
                    e, i, size = time_round(store, url, tmp / f"back-{kind}-{target}-{r}", opts if target == "s3" else None)
                    ex.append(e)
                    im.append(i)
                    shutil.rmtree(tmp / f"back-{kind}-{target}-{r}", ignore_errors=True)
                    if target == "local":
                        shutil.rmtree(url, ignore_errors=True)
                print(json.dumps({"kind": kind, "target": target, "rows": args.rows, "mb_rows": round(mb, 1),
                                  "export_mb_s": round(mb / statistics.median(ex), 1),
                                  "import_mb_s": round(mb / statistics.median(im), 1),
                                  "archive_mb": round(size / 1e6, 1) if size else None,
                                  "version": mmreplay.__version__, "module": mmreplay.__file__}), flush=True)
            store.close()
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
