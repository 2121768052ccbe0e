"""Minari export/import (exact episodes, lossless images, spaces and env spec) and the Dopamine
(DQN Replay Dataset) importer on a small synthetic checkpoint directory of the same format."""

from __future__ import annotations

import gzip
import tracemalloc

import numpy as np
import pytest

import mmreplay
from mmreplay.archive import ArchiveError
from mmreplay.interop.dopamine import import_dopamine

# -- Minari ---------------------------------------------------------------------------------------


@pytest.fixture
def minari_home(tmp_path, monkeypatch):
    pytest.importorskip("minari")
    pytest.importorskip("h5py")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    return tmp_path / "minari"


def _write_episodes(store: mmreplay.ReplayStore, lanes: int, steps: int, seed: int) -> list[dict[str, np.ndarray]]:
    """A next-step-autoreset vector loop on a Dict observation; returns the expected episodes."""
    rng = np.random.default_rng(seed)
    cur = [{"pos": [], "img": [], "action": [], "reward": [], "terminated": [], "truncated": [], "q": []}
           for _ in range(lanes)]
    episodes = []
    done = np.zeros(lanes, bool)
    with store.writer(lanes=lanes) as w:
        for _ in range(steps):
            pos = rng.standard_normal((lanes, 2)).astype(np.float32)
            img = rng.integers(0, 256, (lanes, 6, 6), dtype=np.uint8)
            q = rng.standard_normal(lanes)
            end = rng.random(lanes) < 0.12
            term = np.where(done, False, end & (rng.random(lanes) < 0.5))
            trunc = np.where(done, False, end & ~term)
            action = np.where(done, 0, rng.integers(0, 5, lanes))
            reward = np.where(done, 0.0, rng.standard_normal(lanes))
            w.add(**{"obs/pos": pos, "obs/img": img, "action": action.astype(np.int64), "reward": reward,
                     "terminated": term, "truncated": trunc, "q": q})
            for lane in range(lanes):
                c = cur[lane]
                c["pos"].append(pos[lane])
                c["img"].append(img[lane])
                c["q"].append(q[lane])
                if done[lane]:  # this row is the final observation
                    episodes.append({k: np.array(v) for k, v in c.items()})
                    cur[lane] = {k: [] for k in c}
                else:
                    for k, v in (("action", action), ("reward", reward), ("terminated", term), ("truncated", trunc)):
                        c[k].append(v[lane])
            done = term | trunc
    return episodes  # lanes still running at the end are not complete episodes


def test_minari_export_reproduces_every_episode(tmp_path, minari_home):
    import gymnasium as gym
    import minari

    from mmreplay.interop.minari import export_minari, import_minari

    schema = mmreplay.Schema([
        mmreplay.Field("obs/pos", np.float32, (2,)), mmreplay.Field("obs/img", np.uint8, (6, 6)),
        mmreplay.Field("action", np.int64), mmreplay.Field("reward", np.float64),
        mmreplay.Field("terminated", np.bool_), mmreplay.Field("truncated", np.bool_),
        mmreplay.Field("q", np.float64),
    ])
    spec = gym.spec("CartPole-v1").to_json()
    store = mmreplay.create_store(tmp_path / "s", schema, segment_records=40, metadata={"env_spec": spec})
    expected = _write_episodes(store, lanes=3, steps=120, seed=0)
    rep = export_minari(store, "mmreplay/toy/exact-v0")
    assert rep.episodes == len(expected) > 10 and rep.skipped == 3  # one running episode per lane
    ds = minari.load_dataset("mmreplay/toy/exact-v0")
    assert ds.total_episodes == len(expected) and ds.total_steps == sum(len(e["action"]) for e in expected)
    assert ds.storage.metadata["jpeg_encoding"] is False
    assert ds.env_spec.id == "CartPole-v1"
    assert isinstance(ds.observation_space, gym.spaces.Dict) and ds.action_space == gym.spaces.Discrete(5)
    key = lambda e: e["pos"][0].tobytes()  # noqa: E731 - random first observations identify episodes
    want = {key(e): e for e in expected}
    for got in ds.iterate_episodes():
        e = want.pop(got.observations["pos"][0].tobytes())
        np.testing.assert_array_equal(got.observations["pos"], e["pos"])
        np.testing.assert_array_equal(got.observations["img"], e["img"])
        np.testing.assert_array_equal(got.infos["q"], e["q"])
        for mine, theirs in (("action", "actions"), ("reward", "rewards"), ("terminated", "terminations"),
                             ("truncated", "truncations")):
            np.testing.assert_array_equal(getattr(got, theirs), e[mine], err_msg=mine)
        assert got.observations["pos"].dtype == np.float32 and got.rewards.dtype == np.float64
    assert not want
    # and back: the imported store holds the same episodes, with the same fields
    back = import_minari("mmreplay/toy/exact-v0", tmp_path / "back")
    assert (back.episodes, back.steps) == (rep.episodes, rep.steps)
    with mmreplay.open_store(tmp_path / "back") as b:
        assert b.schema.names == schema.names and b.metadata["env_spec"] == spec
        assert b.info()["episodes"] == rep.episodes and b.verify() == []
    store.close()


def test_minari_export_of_one_lane_across_segments(tmp_path, minari_home):
    """Episodes of one lane, many crossing a segment boundary, come out exactly: each is read as
    one slice per segment it spans (``_runs``), and more episodes than one writer batch (64)."""
    import minari

    from mmreplay.interop.minari import _runs, export_minari, store_episodes

    rng = np.random.default_rng(3)
    store = mmreplay.create_store(tmp_path / "s", mmreplay.Schema.transition(obs_shape=(3,)), segment_records=50)
    expected = []
    with store.writer() as w:
        for i in range(150):
            T = int(rng.integers(1, 40))
            e = {"obs": rng.standard_normal((T + 1, 3)).astype(np.float32), "action": rng.integers(0, 4, T),
                 "reward": rng.standard_normal(T).astype(np.float32),
                 "terminated": np.arange(T) == T - 1 if i % 2 else np.zeros(T, bool)}
            e["truncated"] = np.zeros(T, bool) if i % 2 else np.arange(T) == T - 1
            w.add_batch({"obs": e["obs"][:T, None], "action": e["action"][:, None], "reward": e["reward"][:, None],
                         "terminated": e["terminated"][:, None], "truncated": e["truncated"][:, None]})
            w.end_episodes(last_obs=e["obs"][T][None])
            expected.append(e)
    episodes = store_episodes(store)[0]
    spans = [len(np.unique(e // store.segment_records)) for e in episodes]
    assert [len(_runs(store, e)) for e in episodes] == spans and max(spans) == 2
    rep = export_minari(store, "mmreplay/lane/cross-v0")
    assert (rep.episodes, rep.skipped) == (150, 0)
    for got, e in zip(minari.load_dataset("mmreplay/lane/cross-v0").iterate_episodes(), expected):
        np.testing.assert_array_equal(got.observations, e["obs"])
        for mine, theirs in (("action", "actions"), ("reward", "rewards"), ("terminated", "terminations"),
                             ("truncated", "truncations")):
            np.testing.assert_array_equal(getattr(got, theirs), e[mine], err_msg=mine)
    store.close()


@pytest.mark.filterwarnings("ignore::UserWarning")  # the source dataset has no env
def test_minari_images_round_trip_losslessly(tmp_path, minari_home):
    import gymnasium as gym
    import minari
    from minari.data_collector import EpisodeBuffer

    from mmreplay.interop.minari import export_minari, import_minari

    rng = np.random.default_rng(1)
    obs_space = gym.spaces.Box(0, 255, (32, 32, 3), np.uint8)  # an image space: Minari would JPEG it
    act_space = gym.spaces.Discrete(4)
    bufs = []
    for i, T in enumerate((5, 1, 9)):
        bufs.append(EpisodeBuffer(
            observations=rng.integers(0, 256, (T + 1, 32, 32, 3), dtype=np.uint8),
            actions=rng.integers(0, 4, T), rewards=rng.standard_normal(T),
            terminations=np.eye(T, dtype=bool)[-1] if i == 0 else np.zeros(T, bool),
            truncations=np.eye(T, dtype=bool)[-1] if i == 2 else np.zeros(T, bool)))  # episode 1: neither
    minari.create_dataset_from_buffers("mmreplay/img/src-v0", bufs, observation_space=obs_space,
                                       action_space=act_space, algorithm_name="test", author="t", author_email="t",
                                       code_permalink="t", description="t", jpeg_encoding=False)
    rep = import_minari("mmreplay/img/src-v0", tmp_path / "s")
    assert (rep.episodes, rep.steps) == (3, 15)
    with mmreplay.open_store(tmp_path / "s") as st:
        assert st.schema["obs"].shape == (32, 32, 3) and st.info()["transitions"] == 15
        out = export_minari(st, "mmreplay/img/back-v0")
    assert (out.episodes, out.steps, out.skipped) == (3, 15, 0)
    ds = minari.load_dataset("mmreplay/img/back-v0")
    assert ds.observation_space == obs_space and ds.action_space == act_space
    for got, b in zip(ds.iterate_episodes(), bufs):
        np.testing.assert_array_equal(got.observations, b.observations)  # bit for bit: no JPEG
        for name in ("actions", "rewards", "terminations", "truncations"):
            np.testing.assert_array_equal(getattr(got, name), getattr(b, name), err_msg=name)


def test_minari_errors_are_clear(tmp_path, minari_home):
    from mmreplay.interop.minari import export_minari, import_minari

    with pytest.raises(ArchiveError, match="cannot load Minari dataset"):
        import_minari("mmreplay/none/missing-v0", tmp_path / "x")
    store = mmreplay.create_store(tmp_path / "e", mmreplay.Schema.transition(obs_shape=(2,)))
    with pytest.raises(ArchiveError, match="no complete episode"):
        export_minari(store, "mmreplay/none/empty-v0")
    store.close()


# -- Dopamine -------------------------------------------------------------------------------------
class _DopamineBuffer:
    """Dopamine's OutOfGraphReplayBuffer.add, reduced to what the checkpoint files hold; saves
    checkpoint ``k`` into ``directory`` when ``add_count`` reaches ``saves[k]``."""

    def __init__(self, capacity: int, directory=None, saves=(), stack: int = 4) -> None:
        self.cap, self.stack = capacity, stack
        self.dir, self.saves = directory, list(saves)
        self.obs = np.zeros((capacity, 84, 84), np.uint8)
        self.action = np.zeros(capacity, np.int32)
        self.reward = np.zeros(capacity, np.float32)
        self.terminal = np.zeros(capacity, np.uint8)
        self.add_count = 0

    def _put(self, o, a, r, t) -> None:
        i = self.add_count % self.cap
        self.obs[i], self.action[i], self.reward[i], self.terminal[i] = o, a, r, t
        self.add_count += 1
        if self.add_count in self.saves:
            self.save(self.dir, self.saves.index(self.add_count))

    def add(self, o, a, r, t) -> None:
        if self.add_count == 0 or self.terminal[(self.add_count - 1) % self.cap] == 1:
            for _ in range(self.stack - 1):
                self._put(np.zeros((84, 84), np.uint8), 0, 0.0, 0)
        self._put(o, a, r, t)

    def save(self, directory, n: int) -> None:
        for kind, arr in (("observation", self.obs), ("action", self.action), ("reward", self.reward),
                          ("terminal", self.terminal)):
            with gzip.open(directory / f"$store$_{kind}_ckpt.{n}.gz", "wb") as fh:
                np.save(fh, arr, allow_pickle=False)
        with gzip.open(directory / f"add_count_ckpt.{n}.gz", "wb") as fh:
            np.save(fh, np.array(self.add_count), allow_pickle=False)


def _dopamine_dir(base, capacity: int = 200, saves=(200, 400, 500), seed: int = 0):
    """Checkpoints of one buffer after ``saves`` adds; returns the expected step rows of all of them."""
    d = base / "replay_logs"
    d.mkdir()
    rng = np.random.default_rng(seed)
    buf = _DopamineBuffer(capacity, d, saves)
    rows: list[tuple[np.ndarray, int, np.float32, bool]] = []
    while buf.add_count < saves[-1]:
        T = int(rng.integers(3, 40))
        for i in range(T):
            frame = rng.integers(1, 256, (84, 84), dtype=np.uint8)
            a, r, t = int(rng.integers(0, 6)), np.float32(rng.standard_normal()), i == T - 1
            buf.add(frame, a, r, int(t))
            if buf.add_count > saves[-1]:
                break  # past the last checkpoint: in no file
            rows.append((frame, a, r, t))
            if t:
                rows.append((np.zeros((84, 84), np.uint8), 0, np.float32(0), False))  # the final-observation row
    return d, rows


def _lane_rows(store: mmreplay.ReplayStore):
    store.refresh()
    s = store.reader.snapshot
    ids = np.concatenate([sid * store.segment_records + np.arange(k) for sid, k in zip(s.segment_ids, s.committed)])
    return {name: store.rows(name, ids) for name in (*store.schema.names, "is_last")}


def test_dopamine_checkpoints_become_episodes(tmp_path):
    # three checkpoints of a 200-transition buffer: 0 and 1 full and in order, 2 wrapped (oldest row
    # at 100) and overlapping checkpoint 1 by 100 transitions, which are imported once
    d, rows = _dopamine_dir(tmp_path)
    rep = import_dopamine(d, tmp_path / "s", chunk_rows=37)
    assert rep.checkpoints == (0, 1, 2) and rep.transitions == 500
    assert rep.episodes == sum(r[3] for r in rows) > 10
    assert rep.padding == rep.transitions - (len(rows) - rep.episodes) > 3 * (rep.episodes - 1)
    with mmreplay.open_store(tmp_path / "s") as st:
        got = _lane_rows(st)
        assert len(got["obs"]) == len(rows) == rep.rows
        np.testing.assert_array_equal(got["obs"], np.stack([r[0] for r in rows]))
        np.testing.assert_array_equal(got["action"], np.array([r[1] for r in rows], np.int32))
        np.testing.assert_array_equal(got["reward"], np.array([r[2] for r in rows], np.float32))
        term = np.array([r[3] for r in rows])
        np.testing.assert_array_equal(got["terminated"], term)
        np.testing.assert_array_equal(got["is_last"], np.r_[False, term[:-1]])
        assert not got["truncated"].any()
        assert st.schema["obs"].shape == (84, 84) and st.schema["action"].dtype == np.int32  # single frames
        assert st.metadata["source"] == "dopamine" and st.verify() == []
        b = mmreplay.UniformSampler(st, frame_stack=4, n_step=3, gamma=0.99, seed=0).sample(16)
        assert b.obs.shape == (16, 4, 84, 84)


def test_dopamine_gap_starts_a_new_session_and_streams(tmp_path):
    d, rows = _dopamine_dir(tmp_path, capacity=150, saves=(150, 300, 450))
    rep = import_dopamine(d, tmp_path / "gap", checkpoints=[0, 2], chunk_rows=64)
    assert rep.transitions == 300
    with mmreplay.open_store(tmp_path / "gap") as st:
        sessions: dict[int, list[int]] = {}
        for sid, m in st.reader.segments.items():
            sessions.setdefault(m.header.session_epoch, []).append(sid)
        assert len(sessions) == 2  # checkpoint 2 does not continue checkpoint 0: no stitched episode
        end = max(min(sessions.values(), key=min))
        final = end * st.segment_records + st.reader.segments[end].committed - 1
        assert final not in set(st.transition_ids().tolist())  # the first stretch's last row links to nothing
    # streaming: a 2,000-frame (14 MB) checkpoint is imported holding a few chunks in memory at most
    big = tmp_path / "big"
    big.mkdir()
    buf = _DopamineBuffer(2000, big, [2000])
    rng = np.random.default_rng(2)
    i = 0
    while buf.add_count < 2000:
        buf.add(rng.integers(1, 256, (84, 84), dtype=np.uint8), 1, np.float32(1.0), int(i % 50 == 49))
        i += 1
    tracemalloc.start()
    try:
        rep = import_dopamine(big, tmp_path / "big-store", chunk_rows=64)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rep.transitions == 2000
    assert peak < 4 << 20, f"peak {peak / 2**20:.1f} MiB: the file was not streamed"


def test_dopamine_errors_and_cli(tmp_path):
    from click.testing import CliRunner

    from mmreplay.cli.archive import import_cmd

    with pytest.raises(ArchiveError, match="no \\$store\\$_observation"):
        import_dopamine(tmp_path, tmp_path / "none")
    (tmp_path / "bad").mkdir()
    d, _ = _dopamine_dir(tmp_path / "bad", capacity=100, saves=(100,))
    (d / "$store$_reward_ckpt.0.gz").unlink()
    r = CliRunner().invoke(import_cmd, [str(d), "--from", "dopamine", "--store", str(tmp_path / "x"), "--no-progress"])
    assert r.exit_code == 1 and "reward_ckpt.0.gz is missing" in r.output
    (tmp_path / "ok").mkdir()
    d2, rows2 = _dopamine_dir(tmp_path / "ok", capacity=100, saves=(100,))
    r = CliRunner().invoke(import_cmd, [str(d2), "--from", "dopamine", "--store", str(tmp_path / "y"),
                                        "--checkpoints", "0", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert f"{len(rows2):,} rows" in r.output
    r = CliRunner().invoke(import_cmd, [str(d2), "--from", "dopamine", "--store", str(tmp_path / "z"),
                                        "--checkpoints", "zero"])
    assert r.exit_code == 2
