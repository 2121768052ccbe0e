"""Loader on a GPU: Nature-CNN DQN updates fed by BatchLoader vs synchronous sampling + copy,
and host-to-device bandwidth from pinned vs pageable memory. One script, one run (~3 minutes).

    python benchmarks/loader_gpu.py                      # on a CUDA machine
    python benchmarks/loader_gpu.py --seconds 8 --amp    # bf16 autocast for the updates too
    python benchmarks/loader_gpu.py --device cpu --rows 5000 --seconds 1   # smoke run without a GPU
    python benchmarks/loader_gpu.py --workers 4 --cuda-graphs   # loader with 4 gather threads; also graph-captured updates

Workload: the Atari replay (84x84 uint8 single frames, stacks of 4, uniform batches of 32 and
256, obs and next_obs) in a disk-backed store of ``--rows`` rows, page cache warm. Consumer: one
double-DQN update of the Nature CNN (``mmreplay.train.QLearner`` with ``algos.dqn``'s loss, Adam, Huber loss) per batch.

Rows printed (markdown):

* ``h2d``: copy of one batch's frame block ``(B, 5, 84, 84)`` uint8 to the device, from pageable
  memory (``tensor.to(device)``) and from pinned memory (``non_blocking=True`` + sync), GB/s;
* ``updates``: updates/s and the fraction of wall time the learner waited for its batch, for
  ``synchronous`` (``sampler.sample`` + ``torch.from_numpy(...).to(device)`` in the learner's
  thread) and ``BatchLoader`` (background thread gathering into pinned buffers, copies on a side
  stream, the consumer waits on an event; ``--workers`` gather threads), and with ``--cuda-graphs``
  ``BatchLoader + graphs`` (the same loader feeding a learner whose updates are captured CUDA
  graphs, ``mmreplay.train.graphs``).

The GPU is synchronised after each timed phase, so updates/s counts finished updates.
"""

from __future__ import annotations

import argparse
import json

import shutil
import tempfile
import time
from typing import Any

import numpy as np
import torch

import mmreplay
from mmreplay.train import to_tensors
from mmreplay.agent import network_spec
from mmreplay.train import QLearner, config_for, with_settings
from mmreplay.train.algos.dqn import dqn_loss


def fill(path: str, rows: int) -> mmreplay.ReplayStore:
    store = mmreplay.create_store(path, mmreplay.Schema.transition((84, 84), np.uint8), capacity=rows)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (256, 1, 84, 84), dtype=np.uint8)
    with store.writer(lanes=1) as w:
        for _ in range(rows // 256):
            w.add_batch(obs=frames, action=rng.integers(0, 6, (256, 1)), reward=rng.random((256, 1), np.float32),
                        terminated=(np.arange(256) % 128 == 127)[:, None], truncated=np.zeros((256, 1), bool))
    return store


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def h2d(batch: int, device: torch.device, repeats: int = 50) -> tuple[float, float]:
    """GB/s of one (B, 5, 84, 84) uint8 block: pageable, then pinned."""
    nbytes = batch * 5 * 84 * 84
    out = []
    for pinned in (False, True):
        host = torch.empty((batch, 5, 84, 84), dtype=torch.uint8, pin_memory=pinned and device.type == "cuda")
        host.fill_(7)
        host.to(device, non_blocking=pinned)
        sync(device)
        t0 = time.perf_counter()
        for _ in range(repeats):
            host.to(device, non_blocking=pinned)
        sync(device)
        out.append(nbytes * repeats / (time.perf_counter() - t0) / 1e9)
    return out[0], out[1]


def run_updates(learner: QLearner, batches: Any, seconds: float, device: torch.device) -> tuple[float, float]:
    """(updates/s, waiting fraction) over ``seconds`` of updates drawing from ``batches()``."""
    for _ in range(3):  # warm-up: cuDNN autotuning, allocator
        learner.update(batches())
    sync(device)
    n, waited, t0 = 0, 0.0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        w0 = time.perf_counter()
        b = batches()
        waited += time.perf_counter() - w0
        learner.update(b)
        n += 1
    sync(device)
    dt = time.perf_counter() - t0
    return n / dt, waited / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=10.0, help="per timed phase")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--amp", action="store_true", help="bf16 autocast in the updates")
    ap.add_argument("--prefetch", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1, help="the loader's gather threads")
    ap.add_argument("--cuda-graphs", action="store_true", help="also a row with graph-captured updates")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        print(f"device {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    tmp = tempfile.mkdtemp(prefix="mmreplay-loader-gpu-", dir="/var/tmp")
    results: dict[str, Any] = {"device": str(device), "amp": args.amp, "rows": args.rows, "workers": args.workers}
    try:
        t0 = time.perf_counter()
        store = fill(f"{tmp}/s", args.rows)
        print(f"filled {store.num_rows:,} rows in {time.perf_counter() - t0:.1f} s")
        print("\n| batch | h2d pageable GB/s | h2d pinned GB/s |\n|---|---|---|")
        for batch in (32, 256):
            pageable, pinned = h2d(batch, device)
            results[f"h2d_{batch}"] = {"pageable_gbps": pageable, "pinned_gbps": pinned}
            print(f"| {batch} | {pageable:.2f} | {pinned:.2f} |", flush=True)
        print("\n| batch | mode | updates/s | learner waiting |\n|---|---|---|---|")
        for batch in (32, 256):
            cfg = config_for(env_id="ALE/Pong-v5", store="-", atari=True, frame_stack=4, batch_size=batch,
                              learning_rate=1e-4, amp=args.amp, device=args.device)
            spec = network_spec(store.schema, 6, frame_stack=4)
            learner = QLearner(cfg, spec, device, dqn_loss)
            sampler = mmreplay.UniformSampler(store, frame_stack=4, seed=0)
            ups, wait = run_updates(learner, lambda s=sampler, b=batch: to_tensors(s.sample(b), device),
                                    args.seconds, device)
            results[f"sync_{batch}"] = {"updates_per_s": ups, "wait": wait}
            print(f"| {batch} | synchronous | {ups:,.0f} | {wait:.0%} |", flush=True)
            with mmreplay.BatchLoader(mmreplay.UniformSampler(store, frame_stack=4, seed=0), batch, device=device,
                                      prefetch=args.prefetch, workers=args.workers) as loader:
                ups, wait = run_updates(learner, lambda it=loader: next(it), args.seconds, device)
                results[f"loader_{batch}"] = {"updates_per_s": ups, "wait": wait, "pinned": loader.pinned}
            print(f"| {batch} | BatchLoader workers={args.workers} | {ups:,.0f} | {wait:.0%} |", flush=True)
            if args.cuda_graphs:
                graphed = QLearner(with_settings(cfg, cuda_graphs=True), spec, device, dqn_loss)
                with mmreplay.BatchLoader(mmreplay.UniformSampler(store, frame_stack=4, seed=0), batch, device=device,
                                          prefetch=args.prefetch, workers=args.workers) as loader:
                    ups, wait = run_updates(graphed, lambda it=loader: next(it), args.seconds, device)
                    results[f"loader_graphs_{batch}"] = {"updates_per_s": ups, "wait": wait,
                                                         "captured": bool(graphed.update.enabled),
                                                         "graphs": len(graphed.update.graphs)}
                print(f"| {batch} | BatchLoader workers={args.workers} + graphs | {ups:,.0f} | {wait:.0%} |", flush=True)
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
