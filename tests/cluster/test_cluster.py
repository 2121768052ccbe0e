"""Shipping to a learner (exactly-once ingestion from archives) and actors as Ray actors.

The ingestion tests need no Ray; the Ray tests start one local Ray instance for the module.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import mmreplay
from mmreplay.archive import export_archive, import_archive
from mmreplay.cluster import archive_urls, ingest_archives, read_ledger, start_local_ray

pytest.importorskip("zarr")

TESTS = Path(__file__).resolve().parents[1]  # the helpers (_cluster_envs.py) live in tests/
R = 32  # segment_records: 3 lanes use 30 rows of each, so lanes cross segment boundaries often


def _schema() -> mmreplay.Schema:
    return mmreplay.Schema.transition(obs_shape=(3,), obs_dtype=np.float32)


def _fill(store: mmreplay.ReplayStore, steps: int, *, tag: int = 0, t0: int = 0, lanes: int = 3, seed: int = 0,
          close: bool = True) -> mmreplay.Writer:
    """One writer; obs = (t, lane, tag) makes every row unique; random episode ends."""
    rng = np.random.default_rng(seed)
    w = store.writer(lanes=lanes)
    lane = np.arange(lanes)
    for t in range(t0, t0 + steps):
        done = rng.random(lanes) < 0.1
        w.add(obs=np.stack([np.full(lanes, t), lane, np.full(lanes, tag)], 1).astype(np.float32),
              action=(t * 10 + lane).astype(np.int64), reward=np.full(lanes, t, np.float32),
              terminated=done & (lane % 2 == 0), truncated=done & (lane % 2 == 1))
    if close:
        w.close(last_obs=np.stack([np.full(lanes, -1), lane, np.full(lanes, tag)], 1).astype(np.float32))
    return w


def _transitions(store: mmreplay.ReplayStore) -> list[tuple]:
    """Every sampleable transition as plain values (sorted): equal lists = equal data and chains."""
    store.refresh()
    b = store.transitions(store.transition_ids())
    return sorted(zip(map(bytes, b.obs), b.action.tolist(), b.reward.tolist(), map(bytes, b.next_obs),
                      b.terminated.tolist(), b.truncated.tolist()))


def _all_rows(store: mmreplay.ReplayStore, name: str = "obs") -> np.ndarray:
    store.refresh()
    s = store.reader.snapshot
    ids = [s.segment_ids[k] * store.segment_records + np.arange(s.committed[k]) for k in range(len(s.segment_ids))]
    return store.rows(name, np.concatenate(ids)) if ids else np.zeros((0,))


@pytest.fixture
def src(tmp_path):
    st = mmreplay.create_store(tmp_path / "actor", _schema(), capacity=100_000, segment_records=R)
    yield st
    st.close()


@pytest.fixture
def learner(tmp_path):
    st = mmreplay.create_store(tmp_path / "learner", _schema(), capacity=100_000, segment_records=R)
    yield st
    st.close()


# -- ingestion (no Ray) ----------------------------------------------------------------------------
def test_ingest_copies_rows_and_chains_exactly_once(tmp_path, src, learner):
    root = tmp_path / "archives"
    _fill(src, 200)
    export_archive(src, root / "a")
    rep = ingest_archives(learner, root)
    assert rep.segments == len(src.reader.segments) and rep.rows == src.num_rows == learner.num_rows
    # every transition, those whose next row is in the session's next segment included
    assert _transitions(learner) == _transitions(src)
    # the same segments again: a rerun, and a second export of the same store into another archive
    export_archive(src, root / "b")
    again = ingest_archives(learner, root)
    assert (again.rows, again.segments, again.archives) == (0, 0, 2)
    assert again.skipped == rep.segments  # archive a is settled (its watermark), b's segments are known ids
    assert learner.num_rows == src.num_rows


def test_chains_continue_across_ingest_calls_and_writer_sessions(tmp_path, src, learner):
    root = tmp_path / "archives"
    w = _fill(src, 70, close=False)  # 210 rows: 7 sealed segments, an open one
    export_archive(src, root / "a")
    first = ingest_archives(learner, root)
    sealed = sum(m.committed for m in src.reader.segments.values() if m.state == 2)
    assert first.rows == sealed == learner.num_rows > 0
    assert first.waiting == 0  # open segments are not exported by default
    for t in range(70, 120):  # the same session goes on: its next segments chain to ingested ones
        w.add(obs=np.stack([np.full(3, t), np.arange(3), np.zeros(3)], 1).astype(np.float32),
              action=np.arange(3) + 10 * t, reward=np.full(3, t, np.float32), terminated=np.zeros(3, bool),
              truncated=np.zeros(3, bool))
    w.close(last_obs=np.zeros((3, 3), np.float32))
    _fill(src, 40, tag=1, lanes=2, seed=3)  # a second writer session, two lanes
    export_archive(src, root / "a")
    second = ingest_archives(learner, root)
    assert first.rows + second.rows == src.num_rows == learner.num_rows
    assert _transitions(learner) == _transitions(src)
    led = read_ledger(learner)
    assert len(led["sessions"]) == 2 and len(led["segments"]) == len(src.reader.segments)


def test_open_segments_wait_until_exported_sealed(tmp_path, src, learner):
    root = tmp_path / "archives"
    w = _fill(src, 41, close=False)  # 123 rows: 4 sealed segments and 3 rows of an open one
    export_archive(src, root / "a", include_open=True)  # the open segment's rows so far
    rep = ingest_archives(learner, root)
    assert rep.waiting == 1 and learner.num_rows == 120
    w.close()
    export_archive(src, root / "a")
    rep = ingest_archives(learner, root)
    assert rep.waiting == 0 and learner.num_rows == src.num_rows
    assert _transitions(learner) == _transitions(src)


def test_evicted_segments_are_not_ingested_again(tmp_path, src):
    root = tmp_path / "archives"
    _fill(src, 200)
    export_archive(src, root / "a")
    small = mmreplay.create_store(tmp_path / "small", _schema(), capacity=3 * R, segment_records=R)
    try:
        rep = ingest_archives(small, root)
        assert rep.rows == src.num_rows and small.num_rows < src.num_rows  # evicted while ingesting
        assert ingest_archives(small, root).rows == 0
        assert (small.path / "INGEST_LEDGER.json").exists()
        # the watermark aside, the ids alone keep it out: a fresh archive of the same store
        export_archive(src, root / "b")
        assert ingest_archives(small, root / "b").rows == 0
    finally:
        small.close()


@pytest.mark.parametrize("point", ["ingest_after_pending", "ingest_after_build:3"])
def test_kill_9_while_ingesting_never_duplicates_rows(tmp_path, src, point):
    root = tmp_path / "archives"
    _fill(src, 300)
    export_archive(src, root / "a")
    mmreplay.create_store(tmp_path / "dst", _schema(), capacity=100_000, segment_records=R).close()
    code = f"from mmreplay.cluster import ingest_archives; ingest_archives({str(tmp_path / 'dst')!r}, {str(root)!r})"
    env = {**os.environ, "MMREPLAY_FAILPOINT": point}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    with mmreplay.open_store(tmp_path / "dst", mode="a") as dst:
        before = dst.num_rows
        assert before == (0 if point == "ingest_after_pending" else 3 * 30)  # built segments are kept
        rep = ingest_archives(dst, root)
        assert rep.rows == src.num_rows - before and dst.num_rows == src.num_rows
        assert _transitions(dst) == _transitions(src)
        rows = _all_rows(dst)
        assert len(np.unique(rows, axis=0)) == len(rows)
        assert not (dst.path / "ingest.tmp").exists() or not any((dst.path / "ingest.tmp").iterdir())


def test_a_copied_store_directory_is_a_conflict_not_a_duplicate(tmp_path, src, learner):
    root = tmp_path / "archives"
    _fill(src, 60)  # 183 rows: 7 segments
    src.close()
    shutil.copytree(tmp_path / "actor", tmp_path / "copy")
    for path, tag, url in ((tmp_path / "actor", 5, root / "a"), (tmp_path / "copy", 7, root / "b")):
        with mmreplay.open_store(path, mode="a") as st:  # both go on with the same store uuid and ids
            _fill(st, 60, tag=tag, seed=tag)
            export_archive(st, url)
    rep = ingest_archives(learner, [root / "a"])
    assert (rep.segments, rep.rows) == (14, 366)
    other = ingest_archives(learner, [root / "b"])
    # the shared prefix is skipped (same ids and contents); the copy's own segments reuse ids
    assert (other.skipped, other.conflicts, other.rows) == (7, 7, 0)
    assert learner.num_rows == 366


def test_ingest_refuses_other_schema_or_segment_size(tmp_path, src):
    root = tmp_path / "archives"
    _fill(src, 20)
    export_archive(src, root / "a")
    other = mmreplay.create_store(tmp_path / "o", mmreplay.Schema.transition(obs_shape=(4,)), segment_records=R)
    bigger = mmreplay.create_store(tmp_path / "b", _schema(), segment_records=2 * R)
    try:
        with pytest.raises(mmreplay.ArchiveError, match="schema"):
            ingest_archives(other, root)
        with pytest.raises(mmreplay.ArchiveError, match="segment_records") as exc:
            ingest_archives(bigger, root)
        assert "segment_records=32" in exc.value.hint
    finally:
        other.close()
        bigger.close()
    assert archive_urls(tmp_path / "nothing-here") == []
    assert archive_urls(root / "a") == [str(root / "a")]


def test_ingest_from_fsspec_urls(tmp_path, src, learner):
    _fill(src, 50)
    export_archive(src, "memory://mmreplay-test-cluster/run/a")
    assert archive_urls("memory://mmreplay-test-cluster/run") == ["memory://mmreplay-test-cluster/run/a"]
    rep = ingest_archives(learner, "memory://mmreplay-test-cluster/run")
    assert rep.rows == src.num_rows == learner.num_rows and rep.archives == 1
    assert _transitions(learner) == _transitions(src)


def test_import_mmreplay_cluster_does_not_import_ray():
    code = "import sys, mmreplay.cluster; assert not {'ray', 'torch', 'zarr', 'click'} & sys.modules.keys()"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- Ray ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_local():
    if importlib.util.find_spec("ray") is None:  # not importorskip: mmreplay must import Ray first
        pytest.skip("ray is not installed")
    start_local_ray(4, runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(TESTS),
                                                                                os.environ.get("PYTHONPATH", "")])}})
    import ray

    yield ray
    ray.shutdown()


def _archived_rows(root: Path) -> int:
    import zarr

    total = 0
    for url in archive_urls(root):
        g = zarr.open_group(url, mode="r")
        n = g.attrs["committed"]["segments"]
        t = np.asarray(g["segment_table"][:n])
        total += int(t[t[:, 8] == 2, 7].sum())  # committed rows of sealed segments
    return total


def _archived_transitions(root: Path, tmp: Path) -> int:
    n = 0
    for i, url in enumerate(archive_urls(root)):
        import_archive(url, tmp / f"imp{i}")
        with mmreplay.open_store(tmp / f"imp{i}") as st:
            n += len(st.transition_ids())
    return n


@pytest.mark.slow
def test_ray_collect_ships_every_row_once(tmp_path, ray_local):
    from _cluster_envs import counter_env

    from mmreplay.cluster import ray_collect

    root = tmp_path / "archive"
    res = ray_collect(counter_env, root, 3000, actors=2, envs_per_actor=2, store=tmp_path / "learner",
                      segment_records=64, local_dir=str(tmp_path / "local"), export_s=0.2, ingest_s=0.1,
                      actor_cpus=1, seed=3, progress=False)
    assert res.errors == {} and res.steps == 3000 and res.restarts == {}
    assert res.rows_ingested == 3000 + 2 * 2 == _archived_rows(root)  # plus each lane's final observation
    assert len(archive_urls(root)) == 2
    assert not any((tmp_path / "local").iterdir())  # local stores go once exported
    with mmreplay.open_store(tmp_path / "learner") as st:
        obs = _all_rows(st)
        assert len(obs) == res.rows_ingested and len(np.unique(obs, axis=0)) == len(obs)
        b = st.transitions(st.transition_ids())
        assert (b.next_obs[:, 0] == b.obs[:, 0]).all() and (b.next_obs[:, 1] == b.obs[:, 1] + 1).all()
        assert len(b) == _archived_transitions(root, tmp_path)
        assert st.provenance()[-1]["status"] == "done"


@pytest.mark.slow
def test_a_ray_actors_error_reaches_the_driver_as_the_exception_it_raised(tmp_path, ray_local):
    """As from a local worker (``CollectResult.exceptions``): the actor's own exception, not Ray's wrapper."""
    from _envs import NaNEnv

    from mmreplay.cluster import ray_collect

    res = ray_collect(NaNEnv, tmp_path / "archive", 400, actors=1, store=tmp_path / "learner", segment_records=64,
                      local_dir=str(tmp_path / "local"), export_s=0.2, ingest_s=0.1, actor_cpus=1, seed=3,
                      progress=False)
    assert set(res.errors) == set(res.exceptions) == {0}, res.errors
    exc = res.exceptions[0]
    assert type(exc) is mmreplay.InvalidValueError and exc.hint == mmreplay.InvalidValueError.hint, repr(exc)


@pytest.mark.slow
def test_ray_pool_survives_a_killed_actor_and_ships_weights(tmp_path, ray_local):
    ray = ray_local
    from _cluster_envs import CounterEnv, counter_env

    from mmreplay.agent import QNetwork, network_spec, save_policy
    from mmreplay.cluster import RayActorPool, ShipSpec

    schema = mmreplay.Schema.from_spaces(CounterEnv.observation_space, CounterEnv.action_space)
    mmreplay.create_store(tmp_path / "learner", schema, segment_records=64).close()
    net = QNetwork(network_spec(schema, 2, hidden=(8,)))
    policy = tmp_path / "policy.pt"
    save_policy(policy, net, epsilon=0.5)
    root = tmp_path / "archive"
    pool = RayActorPool(counter_env, tmp_path / "learner", actors=2, envs_per_actor=2, policy_path=policy,
                        ship=ShipSpec(root, local_dir=str(tmp_path / "local"), export_s=0.2, ingest_s=0.1,
                                      max_restarts=2))

    def steps(i):
        try:
            return ray.get(pool.handles[i].progress.remote())["steps"]
        except ray.exceptions.RayActorError:  # restarting
            return 0

    def wait(cond, what, timeout=180.0):  # Ray actors start (and restart) slowly on 2 loaded cores
        t0 = time.monotonic()
        while not cond():
            pool.check()
            assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
            time.sleep(0.05)

    pool.start()
    try:
        pool.allow(1000)  # each actor: a share of 500 plus one segment (64 rows) to seal what the learner needs
        wait(lambda: pool.env_steps >= 1000, "the allowed rows")
        assert steps(0) + steps(1) <= 1000 + 2 * 64
        os.kill(ray.get(pool.handles[0].pid.remote()), signal.SIGKILL)
        wait(lambda: pool.restarts == {0: 1}, "the restart")
        # the restarted actor reopens its store (recovery keeps the rows its predecessor published),
        # counts those rows against its share, and the learner still gets every row it allows
        pool.allow(3000)
        wait(lambda: pool.env_steps >= 3000, "the rows allowed after the restart")
        save_policy(policy, net, epsilon=0.25, step=7)  # the pool sees the new file and ships it
        data = policy.read_bytes()
        files = [next((tmp_path / "local").glob(f"*/actor-{i:03d}/policy.pt")) for i in range(2)]
        wait(lambda: all(f.read_bytes() == data for f in files), "the new weights on every actor")
        rows_before_stop = pool.env_steps
    finally:
        pool.stop()
    pool.check()
    assert pool.env_steps >= rows_before_stop and pool.episodes > 0
    assert pool.env_steps == _archived_rows(root)  # every archived row once; nothing twice
    assert len(archive_urls(root)) == 2  # the restarted actor reopened its local store and archive
    with mmreplay.open_store(tmp_path / "learner") as st:
        obs = _all_rows(st)
        assert len(obs) == pool.env_steps and len(np.unique(obs, axis=0)) == len(obs)
        # 2 env objects per incarnation: the killed one's published rows were recovered and shipped
        assert len(np.unique(obs[:, 0])) == 6
        b = st.transitions(st.transition_ids())
        assert (b.next_obs[:, 0] == b.obs[:, 0]).all() and (b.next_obs[:, 1] == b.obs[:, 1] + 1).all()
        assert len(b) == _archived_transitions(root, tmp_path)
