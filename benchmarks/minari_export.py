"""Minari export at Minari's own writer's rate: ``export_minari`` against
``minari.create_dataset_from_buffers`` / ``update_dataset_from_buffer`` given the same episodes,
already in memory (the writer alone: what an export cannot beat, since it goes through it).

Builds a store of ``--episodes`` episodes of ``--steps`` steps of vector rows (obs 24 float32,
action 6 float32) in a temporary directory, then, ``--repeats`` times, interleaved: the export
into a new local dataset (``MINARI_DATASETS_PATH`` under the temporary directory), and Minari's
writer fed the same episodes as ``EpisodeBuffer`` s in batches of 64 (as the export feeds it);
medians, and their ratio (the target: export <= 1.1x the writer alone).

    .venv/bin/python benchmarks/minari_export.py                  # 400 episodes of 500 steps: ~1 min
    .venv/bin/python benchmarks/minari_export.py --episodes 40 --repeats 1   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

import mmreplay

OBS, ACT, BATCH = 24, 6, 64


def build(path: Path, episodes: int, steps: int) -> dict[str, np.ndarray]:
    """A store of ``episodes`` terminated episodes of ``steps`` steps; returns the rows written."""
    rng = np.random.default_rng(0)
    n = episodes * (steps + 1)
    rows = {"obs": rng.standard_normal((n, OBS)).astype(np.float32),
            "action": rng.uniform(-1, 1, (n, ACT)).astype(np.float32),
            "reward": rng.standard_normal(n)}
    schema = mmreplay.Schema.from_spaces(gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32),
                                         gym.spaces.Box(-1, 1, (ACT,), np.float32))
    with mmreplay.create_store(path, schema, capacity=n + 4096, on_full="error",
                               metadata={"action_scale": "env", "action_space": {"low": [-1.0] * ACT,
                                                                                 "high": [1.0] * ACT}}) as st:
        with st.writer() as w:
            for e in range(episodes):
                lo = e * (steps + 1)
                term = np.zeros(steps, bool)
                term[-1] = True
                w.add_batch({"obs": rows["obs"][lo:lo + steps, None], "action": rows["action"][lo:lo + steps, None],
                             "reward": rows["reward"][lo:lo + steps, None], "terminated": term[:, None],
                             "truncated": np.zeros((steps, 1), bool)})
                w.end_episodes(last_obs=rows["obs"][lo + steps][None])
    return rows


def writer_only(rows: dict[str, np.ndarray], episodes: int, steps: int, dataset_id: str) -> float:
    """Seconds of Minari's writer given the episodes as EpisodeBuffers (made before the clock starts)."""
    import minari
    from minari.data_collector import EpisodeBuffer

    T = steps + 1
    bufs = [EpisodeBuffer(id=e, observations=rows["obs"][e * T:(e + 1) * T], actions=rows["action"][e * T:e * T + steps],
                          rewards=rows["reward"][e * T:e * T + steps],
                          terminations=np.arange(steps) == steps - 1, truncations=np.zeros(steps, bool))
            for e in range(episodes)]
    obs_space = gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32)
    act_space = gym.spaces.Box(-1, 1, (ACT,), np.float32)
    t0 = time.perf_counter()
    ds = minari.create_dataset_from_buffers(dataset_id, bufs[:BATCH], env=None, observation_space=obs_space,
                                            action_space=act_space, algorithm_name="bench", data_format="hdf5")
    for i in range(BATCH, episodes, BATCH):
        ds.update_dataset_from_buffer(bufs[i:i + BATCH])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=400)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    import warnings

    warnings.simplefilter("ignore")
    tmp = Path(tempfile.mkdtemp(prefix="minari-bench-", dir=args.dir))
    os.environ["MINARI_DATASETS_PATH"] = str(tmp / "datasets")
    try:
        rows = build(tmp / "store", args.episodes, args.steps)
        mb = sum(a.nbytes for a in rows.values()) / 1e6
        times: dict[str, list[float]] = {"export": [], "writer": []}
        for r in range(args.repeats):
            t0 = time.perf_counter()
            rep = mmreplay.export_minari(tmp / "store", f"bench/export{r}-v0")
            times["export"].append(time.perf_counter() - t0)
            times["writer"].append(writer_only(rows, args.episodes, args.steps, f"bench/writer{r}-v0"))
            assert rep.episodes == args.episodes, rep
            shutil.rmtree(tmp / "datasets", ignore_errors=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(json.dumps({"episodes": args.episodes, "steps": args.steps, "mb": round(mb, 1),
                          **{f"{k}_s": [round(x, 3) for x in v] for k, v in times.items()},
                          "export_mb_per_s": round(mb / med["export"], 1), "writer_mb_per_s": round(mb / med["writer"], 1),
                          "export_over_writer": round(med["export"] / med["writer"], 3)}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
