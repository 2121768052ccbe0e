"""The GPU check's in-process parts (``benchmarks/gpu_check.sh`` runs them, then
``loader_gpu.py`` and ``atari_train.py``): learner updates/s, eager and graph-captured, and the
data path alone. One JSON file (``--out``), also printed as markdown.

    python benchmarks/gpu_check.py --device cuda --out $OUT/gpu_check.json
    python benchmarks/gpu_check.py --device cpu --rows 3000 --seconds 0.5 --batch-sizes 8 32   # CPU check

Parts (each timed over ``--seconds`` after a warm-up; the device is synchronised at the end of
each timed phase, so rates count finished work):

* ``learner``: Nature-CNN double-DQN updates (``mmreplay.train.QLearner`` with ``algos.dqn``'s loss, Adam, Huber loss,
  gradients clipped at 10) on one device-resident Atari batch (uint8 stacks of 4 frames),
  eager and with ``cuda_graphs=True`` (``mmreplay.train.graphs``; on a CPU it falls back, and
  the row says so);
* ``data``: Atari batches (84x84 uint8 frames, stacks of 4) from a disk-backed store of
  ``--rows`` rows to the device: synchronous (``sampler.sample`` + ``tensor_batch``), and
  ``BatchLoader`` with 1 and ``--workers`` gather threads, in ``--rounds`` interleaved rounds
  (median); and the device tier (``mmreplay.loader.device_tier``: the store mirrored in device
  memory, starts drawn on the host, stacks and the gather on the device), after checking that
  its first batches equal the host path's with the same seed (``equal_to_host``).
"""

from __future__ import annotations

import argparse
import sys
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import mmreplay
from mmreplay.agent import network_spec
from mmreplay.loader import TensorBatch
from mmreplay.train import QLearner, config_for
from mmreplay.train.algos.dqn import dqn_loss

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kit import data_path_rates  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def atari_store(path: str, rows: int) -> mmreplay.ReplayStore:
    store = mmreplay.create_store(path, mmreplay.Schema.transition((84, 84), np.uint8), capacity=rows)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (256, 1, 84, 84), dtype=np.uint8)
    with store.writer(lanes=1) as w:
        for _ in range(max(1, rows // 256)):
            w.add_batch(obs=frames, action=rng.integers(0, 6, (256, 1)), reward=rng.random((256, 1), np.float32),
                        terminated=(np.arange(256) % 128 == 127)[:, None], truncated=np.zeros((256, 1), bool))
    return store


def timed(fn: Any, seconds: float, device: torch.device, warmup: int = 5) -> float:
    """Calls of ``fn`` per second over ``seconds`` (after ``warmup`` calls), device synchronised."""
    for _ in range(warmup):
        fn()
    sync(device)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    sync(device)
    return n / (time.perf_counter() - t0)


def learner_rows(args: argparse.Namespace, device: torch.device) -> list[dict[str, Any]]:
    schema = mmreplay.Schema.transition((84, 84), np.uint8)
    spec = network_spec(schema, 6, frame_stack=4)
    rows = []
    for batch in args.batch_sizes:
        g = torch.Generator().manual_seed(0)
        b = TensorBatch(obs=torch.randint(0, 255, (batch, 4, 84, 84), dtype=torch.uint8, generator=g).to(device),
                        action=torch.randint(0, 6, (batch,), generator=g).to(device),
                        reward=torch.rand(batch, generator=g).to(device),
                        next_obs=torch.randint(0, 255, (batch, 4, 84, 84), dtype=torch.uint8, generator=g).to(device),
                        terminated=(torch.rand(batch, generator=g) < 0.01).to(device),
                        truncated=torch.zeros(batch, dtype=torch.bool, device=device), ids=np.arange(batch))
        for graphs in (False, True):
            cfg = config_for(env_id="ALE/Pong-v5", store="-", atari=True, frame_stack=4, batch_size=batch,
                              learning_rate=1e-4, max_grad_norm=10.0, target_update_interval=1000,
                              device=str(device), cuda_graphs=graphs)
            torch.manual_seed(0)
            learner = QLearner(cfg, spec, device, dqn_loss)
            ups = timed(lambda lr=learner, b=b: lr.update(b), args.seconds, device, warmup=8)
            row = {"part": "learner", "batch": batch, "mode": "graphs" if graphs else "eager", "updates_per_s": ups}
            if graphs:
                row["captured"] = bool(learner.update.enabled)
                row["why_not"] = learner.update.why
                row["graphs"] = len(learner.update.graphs)
            rows.append(row)
            print(f"| learner | {batch} | {row['mode']} | {ups:,.1f} updates/s |"
                  + (f" captured={row['captured']} |" if graphs else ""), flush=True)
    return rows


def data_rows(args: argparse.Namespace, device: torch.device, store: mmreplay.ReplayStore) -> list[dict[str, Any]]:
    rows = []
    for batch in args.batch_sizes:
        got = data_path_rates(store, batch, rounds=args.rounds, workers=args.workers, device=device,
                              prefetch=args.prefetch, timer=lambda op: timed(op, args.seconds, device))
        sync_rate = float(np.median(got["synchronous"]))
        for mode, vals in got.items():
            med = float(np.median(vals))
            rows.append({"part": "data", "batch": batch, "mode": mode, "batches_per_s": med, "rounds": vals,
                         "vs_synchronous": med / sync_rate})
            print(f"| data | {batch} | {mode} | {med:,.0f} batches/s | {med / sync_rate:.2f}x |", flush=True)
        rows.append(device_tier_row(args, device, store, batch, sync_rate))
    return rows


def device_tier_row(args: argparse.Namespace, device: torch.device, store: mmreplay.ReplayStore, batch: int,
                    sync_rate: float) -> dict[str, Any]:
    """``DeviceTier``: the store mirrored on the device, starts drawn on the host, stacks and the
    gather on the device; timed like the other modes (a sampler seeded by the round), after a
    check that its first batches equal the host path's with the same seed."""
    from mmreplay.loader import tensor_batch
    from mmreplay.loader.device_tier import DeviceTier

    host = mmreplay.UniformSampler(store, frame_stack=4, seed=99)
    check = DeviceTier(mmreplay.UniformSampler(store, frame_stack=4, seed=99), device)
    t0 = time.perf_counter()
    check.refresh()
    sync(device)
    mirror_s = time.perf_counter() - t0
    equal = True
    for _ in range(3):
        got, want = check.sample(batch), tensor_batch(host.sample(batch), device)
        equal &= all(torch.equal(getattr(got, f), getattr(want, f))
                     for f in ("obs", "next_obs", "action", "reward", "discount", "terminated", "truncated"))
    mirror_bytes = check.nbytes
    del check
    vals = []
    for r in range(args.rounds):
        tier = DeviceTier(mmreplay.UniformSampler(store, frame_stack=4, seed=r), device)
        tier.refresh()
        vals.append(timed(lambda t=tier: t.sample(batch), args.seconds, device))
        del tier
    med = float(np.median(vals))
    print(f"| data | {batch} | device tier | {med:,.0f} batches/s | {med / sync_rate:.2f}x |"
          f" equal to host: {equal}, mirror {mirror_bytes / 2**20:,.0f} MiB in {mirror_s:.2f} s |", flush=True)
    return {"part": "data", "batch": batch, "mode": "device tier", "batches_per_s": med, "rounds": vals,
            "vs_synchronous": med / sync_rate, "equal_to_host": bool(equal), "mirror_bytes": mirror_bytes,
            "mirror_s": mirror_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", type=int, default=100_000, help="rows of the data path's store")
    ap.add_argument("--seconds", type=float, default=4.0, help="per timed phase")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the data-path rows")
    ap.add_argument("--workers", type=int, default=4, help="gather threads of the loader's second row")
    ap.add_argument("--prefetch", type=int, default=3)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--parts", nargs="+", default=["learner", "data"], choices=["learner", "data"])
    ap.add_argument("--root", default="/var/tmp")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    device = torch.device(args.device)
    env: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "cpus": os.cpu_count(),
                           "args": vars(args)}
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        env["gpu"] = torch.cuda.get_device_name(device)
    print(json.dumps(env), flush=True)
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    if "learner" in args.parts:
        rows += learner_rows(args, device)
    if "data" in args.parts:
        tmp = tempfile.mkdtemp(prefix="gpu-check-", dir=args.root)
        try:
            store = atari_store(f"{tmp}/s", args.rows)
            rows += data_rows(args, device, store)
            store.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    env["wall_s"] = time.perf_counter() - t0
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"env": env, "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
