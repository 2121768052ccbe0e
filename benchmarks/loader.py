"""Loader benchmark: BatchLoader (background gather into host buffers) against synchronous
sampling + torch.from_numpy, with a simulated learner step, for the Atari workload.

    python benchmarks/loader.py [--rows 50000] [--step-ms 2.0] [--seconds 3] [--workers 2] [--rounds 3]

Reports batches/s and the fraction of wall time the learner spent waiting for data, at batch
32 and 256 (frames 84x84 uint8, stacks of 4). Then the data path alone (no learner): batches/s
of synchronous sampling (``sampler.sample`` + ``tensor_batch``) and of ``BatchLoader`` with 1
and ``--workers`` gather threads, in ``--rounds`` interleaved rounds (median, and the ratio to
synchronous). The learner step is a busy wait of --step-ms
(standing in for a network update that releases the GIL, as torch kernels do). On a CUDA
machine the loader also copies to the GPU asynchronously (`--device cuda`).
"""

from __future__ import annotations

import argparse
import sys
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import mmreplay

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kit import data_path_rates  # noqa: E402


def learner_step(ms: float) -> None:
    """Stand-in for an update: torch work that releases the GIL for about ``ms``."""
    end = time.perf_counter() + ms / 1e3
    x = torch.ones(256, 256)
    while time.perf_counter() < end:
        x = x @ x * 1e-3


def rate(fn: Any, seconds: float) -> float:
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - t0)


def data_path(store: mmreplay.ReplayStore, args: argparse.Namespace) -> None:
    """Batches/s of the data path alone: synchronous vs BatchLoader with 1 and N workers."""
    print("\n| batch | data path | batches/s (median) | vs synchronous | rounds |\n|---|---|---|---|---|")
    for batch in (32, 256):
        got = data_path_rates(store, batch, rounds=args.rounds, workers=args.workers, device=args.device,
                              timer=lambda op: rate(op, args.seconds))
        sync = float(np.median(got["synchronous"]))
        for mode, vals in got.items():
            med = float(np.median(vals))
            print(f"| {batch} | {mode} | {med:,.0f} | {med / sync:.2f}x | {', '.join(f'{v:,.0f}' for v in vals)} |",
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--step-ms", type=float, default=2.0)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", type=int, default=2, help="gather threads of the loader's second data-path row")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the data-path rows")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="mmreplay-loader-", dir="/var/tmp")
    try:
        store = mmreplay.create_store(f"{tmp}/s", mmreplay.Schema.transition((84, 84), np.uint8), capacity=args.rows)
        frames = np.random.default_rng(0).integers(0, 255, (64, 1, 84, 84), dtype=np.uint8)
        with store.writer(lanes=1) as w:
            for _ in range(args.rows // 64):
                w.add_batch(obs=frames, action=np.zeros((64, 1), np.int64), reward=np.zeros((64, 1), np.float32),
                            terminated=(np.arange(64) == 63)[:, None], truncated=np.zeros((64, 1), bool))
        print("| batch | mode | batches/s | learner waiting |\n|---|---|---|---|")
        for batch in (32, 256):
            sampler = mmreplay.UniformSampler(store, frame_stack=4, seed=0)
            sampler.sample(batch)
            n, waited, t0 = 0, 0.0, time.perf_counter()
            while time.perf_counter() - t0 < args.seconds:
                w0 = time.perf_counter()
                b = sampler.sample(batch)
                torch.from_numpy(b.obs).to(args.device)
                waited += time.perf_counter() - w0
                learner_step(args.step_ms)
                n += 1
            dt = time.perf_counter() - t0
            print(f"| {batch} | synchronous | {n / dt:,.0f} | {waited / dt:.0%} |")
            with mmreplay.BatchLoader(mmreplay.UniformSampler(store, frame_stack=4, seed=0), batch,
                                      device=args.device, profile=True) as loader:
                next(loader)
                n, t0 = 0, time.perf_counter()
                w_start = loader.stats()["wait_s"]
                while time.perf_counter() - t0 < args.seconds:
                    b = next(loader)
                    learner_step(args.step_ms)
                    n += 1
                dt = time.perf_counter() - t0
                print(f"| {batch} | BatchLoader | {n / dt:,.0f} | {(loader.stats()['wait_s'] - w_start) / dt:.0%} |")
        data_path(store, args)
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
