"""Prioritized replay benchmark: one op = sample 256 + update 256 priorities, capacity 1,000,000.

    python benchmarks/prioritized.py [--capacity N] [--seconds S] [--repeats R]

mmreplay's PrioritizedSampler (persistent store on disk) against cpprb's
PrioritizedReplayBuffer (C++) and TorchRL's PrioritizedReplayBuffer (LazyMemmapStorage), all
filled with the same 1,000,000 vector transitions (obs (8,) float32), alpha 0.6, beta 0.4, in
one process run; medians of interleaved repeats. Peers install with `pip install -e .[bench]`.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import mmreplay

OBS = (8,)


def _batches(n_envs: int, rng: np.random.Generator, count: int = 16):
    obs = rng.standard_normal((count, n_envs, *OBS), dtype=np.float32)
    return [(obs[i], obs[(i + 1) % count], rng.integers(0, 4, n_envs), rng.standard_normal(n_envs, dtype=np.float32),
             rng.random(n_envs) < 0.01) for i in range(count)]


class MM:
    name = "mmreplay"

    def __init__(self, capacity: int, tmp: str, data) -> None:
        path = Path(tempfile.mkdtemp(dir=tmp)) / "s"
        self.store = mmreplay.create_store(path, mmreplay.Schema.transition(OBS), capacity=capacity)
        with self.store.writer(lanes=256) as w:
            for i in range(capacity // 256):
                o, _, a, r, d = data[i % len(data)]
                w.add(obs=o, action=a, reward=r, terminated=d, truncated=np.zeros(256, bool))
        self.ps = mmreplay.PrioritizedSampler(self.store, alpha=0.6, beta=0.4, seed=0)
        self.rng = np.random.default_rng(0)

    def op(self, b: int) -> None:
        batch = self.ps.sample(b)
        self.ps.update_priorities(batch.ids, self.rng.exponential(1.0, b))

    def close(self) -> None:
        self.store.close()


class Cpprb:
    name = "cpprb"

    def __init__(self, capacity: int, tmp: str, data) -> None:
        from cpprb import PrioritizedReplayBuffer

        self.rb = PrioritizedReplayBuffer(capacity, {"obs": {"shape": OBS}, "next_obs": {"shape": OBS},
                                                     "act": {"dtype": np.int64}, "rew": {}, "done": {}}, alpha=0.6)
        for i in range(capacity // 256):
            o, no, a, r, d = data[i % len(data)]
            self.rb.add(obs=o, next_obs=no, act=a, rew=r, done=d)
        self.rng = np.random.default_rng(0)

    def op(self, b: int) -> None:
        s = self.rb.sample(b, beta=0.4)
        self.rb.update_priorities(s["indexes"], self.rng.exponential(1.0, b) + 1e-6)

    def close(self) -> None:
        pass


class TorchRL:
    name = "torchrl"

    def __init__(self, capacity: int, tmp: str, data) -> None:
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyMemmapStorage, TensorDictPrioritizedReplayBuffer

        self.torch = torch
        self.rb = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyMemmapStorage(
            capacity, scratch_dir=tempfile.mkdtemp(dir=tmp)), batch_size=256, priority_key="td_error")
        for i in range(capacity // 256):
            o, no, a, r, d = data[i % len(data)]
            self.rb.extend(TensorDict({"obs": torch.from_numpy(o), "next_obs": torch.from_numpy(no),
                                       "action": torch.from_numpy(a), "reward": torch.from_numpy(r),
                                       "done": torch.from_numpy(d)}, batch_size=[256]))
        self.rng = np.random.default_rng(0)

    def op(self, b: int) -> None:
        s = self.rb.sample(b)
        s.set("td_error", self.torch.from_numpy(self.rng.exponential(1.0, b)))
        self.rb.update_tensordict_priority(s)

    def close(self) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--peers", default="cpprb,torchrl")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="mmreplay-per-", dir="/var/tmp")
    data = _batches(256, np.random.default_rng(0))
    systems = [MM] + [c for c in (Cpprb, TorchRL) if c.name in args.peers.split(",")]
    rates: dict[str, list[float]] = {c.name: [] for c in systems}
    try:
        for rep in range(args.repeats):
            for cls in systems:
                gc.collect()
                os.sync()
                try:
                    sysm = cls(args.capacity, tmp, data)
                except (ImportError, RuntimeError) as exc:  # e.g. TorchRL built without its C++ sum tree
                    print(f"skipping {cls.name}: {exc}", file=sys.stderr)
                    rates.pop(cls.name, None)
                    continue
                sysm.op(args.batch)
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < args.seconds:
                    for _ in range(8):
                        sysm.op(args.batch)
                    n += 8
                rates[cls.name].append(n / (time.perf_counter() - t0))
                print(f"[{rep + 1}/{args.repeats}] {cls.name}: {rates[cls.name][-1]:,.0f} ops/s", flush=True)
                sysm.close()
                del sysm
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: float(np.median(v)) for k, v in rates.items() if v}
    best = max((k for k in med if k != "mmreplay"), key=med.get, default=None)
    print(f"\n| system | ops/s (sample {args.batch} + update {args.batch}), capacity {args.capacity:,} |")
    print("|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:,.0f} |")
    if best:
        print(f"\nmmreplay / best peer ({best}): {med['mmreplay'] / med[best]:.2f}x (median of {args.repeats})")


if __name__ == "__main__":
    main()
