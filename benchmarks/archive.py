"""Archive benchmark: compression ratio and speed of zarr export/import on real Atari frames.

Frames come from ALE (ale-py, ROMs included in its wheel) through gymnasium's standard DQN
preprocessing (frame skip 4, grayscale, 84x84), played by a uniformly random policy, one episode
after another (T+1 rows per episode, as a collector stores them). The store is exported to a
local zarr archive with the default codecs (blosc zstd, crc32c per chunk) and imported back.

Reported per game: raw bytes of the rows (every field, padding excluded), bytes the archive
takes on disk, the ratio for all fields and for the frames alone, export and import throughput
in raw MB/s, and whether the round trip is exact. Random play repeats screens more than a
trained agent does, so treat the ratios as an upper range; SpaceInvaders, busier on screen, is
the conservative figure.

    python benchmarks/archive.py                        # 20,000 steps of three games
    python benchmarks/archive.py --steps 5000 --games Pong --clevel 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import mmreplay
from mmreplay.archive import export_archive, import_archive


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def fill_atari(store: mmreplay.ReplayStore, game: str, steps: int, seed: int) -> int:
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.wrappers.AtariPreprocessing(gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.0),
                                          frame_skip=4)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    z = {"action": np.zeros(1, np.int64), "reward": np.zeros(1, np.float32), "terminated": np.zeros(1, bool),
         "truncated": np.zeros(1, bool)}
    episodes = 0
    with store.writer(lanes=1) as w:
        for _ in range(steps):
            a = int(rng.integers(env.action_space.n))
            nxt, r, term, trunc, _ = env.step(a)
            w.add(obs=obs[None], action=np.array([a]), reward=np.array([r], np.float32), terminated=np.array([term]),
                  truncated=np.array([trunc]))
            obs = nxt
            if term or trunc:
                w.add(obs=obs[None], **z)  # the final observation (is_last)
                obs, _ = env.reset()
                episodes += 1
        w.close(last_obs=obs[None])
    env.close()
    return episodes


def run(game: str, steps: int, clevel: int, base: Path) -> dict[str, object]:
    schema = mmreplay.Schema.transition(obs_shape=(84, 84), obs_dtype=np.uint8)
    src = base / f"{game}-store"
    store = mmreplay.create_store(src, schema, capacity=10 * steps)
    episodes = fill_atari(store, game, steps, seed=0)
    store.refresh()
    rows = store.num_rows
    raw = rows * sum(f.row_bytes for f in schema.fields)
    raw_frames = rows * schema["obs"].row_bytes
    url = base / f"{game}.zarr"
    os.sync()
    t = time.perf_counter()
    rep = export_archive(store, url, clevel=clevel)
    t_export = time.perf_counter() - t
    stored = dir_bytes(url)
    stored_frames = dir_bytes(url / "fields" / "obs")
    os.sync()
    t = time.perf_counter()
    import_archive(url, base / f"{game}-back")
    t_import = time.perf_counter() - t
    with mmreplay.open_store(base / f"{game}-back") as back:
        ids = store.transition_ids()
        exact = bool(np.array_equal(ids, back.transition_ids())
                     and np.array_equal(store.rows("obs", ids), back.rows("obs", ids)))
    store.close()
    return {"game": game, "rows": rows, "episodes": episodes, "segments": rep.segments, "raw_MB": raw / 1e6,
            "stored_MB": stored / 1e6, "ratio": raw / stored, "frames_ratio": raw_frames / stored_frames,
            "export_MBps": raw / t_export / 1e6, "import_MBps": raw / t_import / 1e6, "exact": exact}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--games", default="Breakout,Pong,SpaceInvaders")
    ap.add_argument("--clevel", type=int, default=3)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="mmreplay-bench-archive-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    try:
        print(f"{'game':<14}{'rows':>8}{'episodes':>9}{'segments':>9}{'raw MB':>9}{'stored MB':>10}{'ratio':>8}"
              f"{'frames':>8}{'export MB/s':>12}{'import MB/s':>12}  exact")
        for game in args.games.split(","):
            r = run(game, args.steps, args.clevel, base)
            print(f"{r['game']:<14}{r['rows']:>8,}{r['episodes']:>9}{r['segments']:>9}{r['raw_MB']:>9.1f}"
                  f"{r['stored_MB']:>10.2f}{r['ratio']:>8.1f}{r['frames_ratio']:>8.1f}{r['export_MBps']:>12.0f}"
                  f"{r['import_MBps']:>12.0f}  {r['exact']}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
