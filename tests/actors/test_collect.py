"""`mmreplay.collect` / `mmreplay collect`: what the env emitted is what the store holds."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import _envs
import mmreplay
from mmreplay.cli.main import main
from mmreplay.actors import PolicySpec, collect
from mmreplay.agent.envs import make_env

ROOT = Path(__file__).resolve().parents[2]


def _stored(store) -> collections.Counter:
    ids = store.transition_ids()
    b = store.transitions(ids)
    obs_names = store.schema.obs_names

    def key(batch_obs, i):
        if obs_names == ("obs",):
            return np.asarray(batch_obs[i]).tobytes()
        return tuple((n.removeprefix("obs/"), np.asarray(batch_obs[n.removeprefix("obs/")][i]).tobytes())
                     for n in sorted(obs_names))

    return collections.Counter(
        (key(b.obs, i), int(b.action[i]), float(b.reward[i]), key(b.next_obs, i), bool(b.terminated[i]),
         bool(b.truncated[i]))
        for i in range(len(ids)))


@pytest.mark.parametrize("mode", ["next_step", "same_step", "disabled"])
@pytest.mark.parametrize("env", ["cartpole", "dict"])
def test_store_holds_exactly_what_the_env_emitted(tmp_path, mode, env):
    _envs.EMITTED.clear()
    _envs.LAST.clear()
    fn = _envs.recorded_cartpole if env == "cartpole" else _envs.recorded_dict_env
    res = collect(fn, tmp_path / "s", 600, workers=0, envs_per_worker=3, seed=4, autoreset_mode=mode, progress=False)
    emitted = collections.Counter(_envs.emitted_as_stored())  # what the env emitted, the end's cuts marked
    with mmreplay.open_store(tmp_path / "s") as store:
        got = _stored(store)
        if env == "dict":
            assert set(store.schema.obs_names) == {"obs/pos", "obs/t"}
    assert got == emitted
    assert res.transitions == sum(emitted.values()) and res.steps == 600
    assert any(k[4] for k in emitted) and any(k[5] for k in emitted)  # both episode ends happened
    # episodes that ended on their own: the ones the end of the run cut are stored truncated, not counted
    assert res.episodes == sum(1 for k in _envs.EMITTED if k[4] or k[5])
    with mmreplay.open_store(tmp_path / "s") as store:
        info = store.info()
    cut = sum(1 for i in _envs.LAST.values() if not (_envs.EMITTED[i][4] or _envs.EMITTED[i][5]))
    assert (info["episodes_cut"], info["episodes"]) == (cut, res.episodes + cut)


def test_workers_share_one_store_and_each_run_is_recorded(tmp_path):
    p = tmp_path / "s"
    r1 = collect("CartPole-v1", p, 3000, workers=2, envs_per_worker=2, seed=10, progress=False)
    r2 = collect("CartPole-v1", p, 1000, workers=2, envs_per_worker=2, seed=20, progress=False)
    assert not r1.errors and not r2.errors and r1.steps == 3000 and r2.steps == 1000
    with mmreplay.open_store(p) as store:
        assert store.num_rows == 4000 + 8  # plus one final observation per lane per run
        assert len(store.transition_ids()) == r1.transitions + r2.transitions
        runs = store.provenance()
        info = store.info()
    assert [r["seed"] for r in runs] == [10, 20] and all(r["status"] == "done" for r in runs)
    assert runs[0]["env_seeds"] == [[10, 11], [12, 13]] and runs[1]["env_seeds"] == [[20, 21], [22, 23]]
    assert runs[0]["env_id"] == "CartPole-v1" and runs[0]["policy"] == "random" and runs[0]["mmreplay_version"]
    assert "Box" in runs[0]["observation_space"] and runs[0]["steps_stored"] == 3000
    # a worker that finishes before the other opens its writer frees its writer slot for reuse,
    # so the number of distinct writer ids is 1 or 2; every stored row belongs to one of them
    assert info["metadata"]["env_id"] == "CartPole-v1" and 1 <= len(info["writers"]) <= 2
    assert sum(info["rows_per_writer"].values()) == info["rows"] == 4000 + 8
    assert [r["seed"] for r in info["provenance"]] == [10, 20]
    out = CliRunner().invoke(main, ["info", str(p)]).output
    assert out.count("run          ") == 2 and "policy=random seed=20 steps=1000 status=done" in out
    with pytest.raises(mmreplay.SchemaError, match="obs"):
        collect("Acrobot-v1", p, 10, workers=0, progress=False)


def test_same_seed_gives_the_same_data(tmp_path):
    a = collect("CartPole-v1", tmp_path / "a", 500, workers=1, envs_per_worker=2, seed=3, progress=False)
    b = collect("CartPole-v1", tmp_path / "b", 500, workers=0, envs_per_worker=2, seed=3, progress=False)
    assert a.episode_returns == b.episode_returns
    with mmreplay.open_store(tmp_path / "a") as sa, mmreplay.open_store(tmp_path / "b") as sb:
        assert _stored(sa) == _stored(sb)


def test_a_crashed_worker_is_reported_and_the_others_finish(tmp_path):
    res = collect(_envs.CrashingEnv, tmp_path / "s", 1000, workers=2, envs_per_worker=1, seed=0, progress=False)
    assert set(res.errors) == {1} and "simulated env crash" in res.errors[1]
    assert 500 + 300 <= res.steps <= 1000  # worker 0 stored its 500; worker 1 stored what it did before the crash
    with mmreplay.open_store(tmp_path / "s") as store:
        assert store.num_rows >= 800 and store.verify() == []
        assert store.provenance()[-1]["status"] == "failed"


def test_a_workers_mmreplay_error_reaches_the_parent_as_the_exception_it_raised(tmp_path):
    """A worker's exception crosses the process boundary pickled: its type, message and hint
    (``exceptions``), beside its formatted traceback (``errors``)."""
    res = collect(_envs.NaNEnv, tmp_path / "s", 400, workers=2, seed=0, progress=False)
    assert set(res.exceptions) == set(res.errors) == {0, 1}, res.errors
    for w, exc in res.exceptions.items():
        assert type(exc) is mmreplay.InvalidValueError and exc.hint == mmreplay.InvalidValueError.hint
        assert exc.__traceback__ is None and "obs" in str(exc)  # (the field it names; the traceback is text)
        text = res.errors[w]
        assert text.startswith("Traceback") and text.strip().splitlines()[-1] == f"mmreplay.core.errors.InvalidValueError: {exc}"


def test_policy_spec_parsing():
    assert PolicySpec.parse("random") == PolicySpec()
    assert PolicySpec.parse("eps-greedy:/a/b.pt") == PolicySpec("eps-greedy", "/a/b.pt", None)
    assert PolicySpec.parse("eps-greedy:/a/b.pt:0.3") == PolicySpec("eps-greedy", "/a/b.pt", 0.3)
    assert PolicySpec.parse("eps-greedy:c:/x.pt") == PolicySpec("eps-greedy", "c:/x.pt", None)
    assert PolicySpec.parse("greedy:/a.pt") == PolicySpec("eps-greedy", "/a.pt", 0.0)
    for bad in ("eps-greedy", "softmax:x", "eps-greedy:/a.pt:1.5", ""):
        with pytest.raises(ValueError):
            PolicySpec.parse(bad)


def test_cli_collect_and_bad_input(tmp_path):
    r = CliRunner().invoke(main, ["collect", "CartPole-v1", "--store", str(tmp_path / "s"), "--steps", "300",
                                  "--workers", "0", "--envs-per-worker", "2", "--seed", "1"])
    assert r.exit_code == 0, r.output
    assert "stored 300 env steps" in r.output and "seed 1" in r.output
    r = CliRunner().invoke(main, ["collect", "CartPole-v1", "--store", str(tmp_path / "s"), "--steps", "10",
                                  "--policy", "softmax"])
    assert r.exit_code == 2 and "--policy" in r.output
    r = CliRunner().invoke(main, ["collect", "NoSuchEnv-v0", "--store", str(tmp_path / "t"), "--steps", "10"])
    assert r.exit_code == 1 and "NoSuchEnv" in r.output and "Traceback" not in r.output  # one line since issue 19
    r = CliRunner().invoke(main, ["collect", "MountainCar-v0", "--store", str(tmp_path / "s"), "--steps", "10",
                                  "--workers", "0"])
    assert r.exit_code == 1 and "SchemaError" in r.output


def test_ctrl_c_stops_every_worker_and_keeps_the_data(tmp_path):
    p = tmp_path / "s"
    proc = subprocess.Popen([sys.executable, "-m", "mmreplay", "collect", "CartPole-v1", "--store", str(p),
                             "--steps", "100000000", "--workers", "2", "--envs-per-worker", "2", "--seed", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # a shell's background job (nohup ... &) inherits SIGINT ignored, and then Python
                            # installs no KeyboardInterrupt handler: give the command a terminal's default
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if (p / "STORE.json").is_file():  # written (atomically) last by create_store
                with mmreplay.open_store(p, mode="r") as s:
                    if s.num_rows > 2000:
                        break
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "interrupted: stored" in out
    with mmreplay.open_store(p, mode="a") as store:
        assert store.num_rows > 2000 and store.verify() == []
        with store.writer(writer_id=0) as w, store.writer(writer_id=1) as w2:  # both workers let go of their ids
            assert w.lanes == 1 and w2.lanes == 1
        assert store.provenance()[-1]["status"] == "interrupted"


def test_atari_frames_are_single_84x84_uint8(tmp_path):
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    res = collect("ALE/Pong-v5", tmp_path / "pong", 64, workers=0, envs_per_worker=2, seed=0, progress=False)
    assert res.steps == 64
    with mmreplay.open_store(tmp_path / "pong") as store:
        f = store.schema["obs"]
        assert f.shape == (84, 84) and f.dtype == np.uint8
        b = mmreplay.UniformSampler(store, seed=0, frame_stack=4).sample(8)
        assert b.obs.shape == (8, 4, 84, 84) and b.obs.max() > 0
        assert store.provenance()[-1]["atari"] is None and "Pong" in store.metadata["env_id"]


def _policy_file(path, schema, epsilon, seed=0):
    import torch

    from mmreplay.agent import QNetwork, network_spec, save_policy

    torch.manual_seed(seed)
    net = QNetwork(network_spec(schema, 2, hidden=(16,)))
    save_policy(path, net, epsilon=epsilon)
    return path


def test_eps_greedy_policy_from_a_policy_file(tmp_path):
    from mmreplay.agent import load_policy

    collect("CartPole-v1", tmp_path / "s", 100, workers=0, seed=0, progress=False)  # makes the store: its schema
    with mmreplay.open_store(tmp_path / "s") as store:
        pol = _policy_file(tmp_path / "p.pt", store.schema, epsilon=0.5)
    res = collect("CartPole-v1", tmp_path / "g", 400, workers=1, envs_per_worker=2, seed=1, progress=False,
                  policy=f"eps-greedy:{pol}:0")
    assert not res.errors
    with mmreplay.open_store(tmp_path / "g") as store:
        b = store.transitions(store.transition_ids())
        assert store.provenance()[-1]["policy"] == f"eps-greedy:{pol}:0"
    q = load_policy(pol).q_values(b.obs)
    clear = np.abs(q[:, 0] - q[:, 1]) > 1e-5  # a near-tie may flip between batch shapes (different matmul kernels)
    assert clear.mean() > 0.95
    np.testing.assert_array_equal(q.argmax(1)[clear], b.action[clear])  # greedy: every action is the net's


def test_an_actor_process_runs_torch_on_one_thread(tmp_path, monkeypatch):
    """Actors run beside the learner and each other: torch's default (a thread per core in each)
    oversubscribed the cores. The calling process's own setting is left alone."""
    import torch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("MMREPLAY_TEST_THREADS_FILE", str(tmp_path / "threads"))
    before = torch.get_num_threads()
    res = collect(_envs.thread_probe_cartpole, tmp_path / "s", 200, workers=1, seed=1, progress=False)
    assert not res.errors, res.errors
    assert (tmp_path / "threads").read_text() == "1"
    assert torch.get_num_threads() == before


def test_actor_pool_respects_the_limit_and_follows_new_weights(tmp_path):
    from mmreplay.agent import load_policy
    from mmreplay.actors import ActorPool

    collect("CartPole-v1", tmp_path / "s", 2, workers=0, seed=0, progress=False)
    with mmreplay.open_store(tmp_path / "s") as store:
        base_rows = store.num_rows
        pol = _policy_file(tmp_path / "p.pt", store.schema, epsilon=1.0)
    pool = ActorPool("CartPole-v1", tmp_path / "s", actors=2, envs_per_actor=2, policy_path=pol, seed=5)
    with pool:
        pool.allow(400)
        deadline = time.monotonic() + 60
        while pool.env_steps < 400 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        assert pool.env_steps == 400  # the limit holds exactly
        with mmreplay.open_store(tmp_path / "s") as store:
            _policy_file(pol, store.schema, epsilon=0.0)  # the same net, now greedy
        time.sleep(0.3)
        pool.allow(800)
        while pool.env_steps < 800 and time.monotonic() < deadline:
            time.sleep(0.05)
        pool.check()
    with mmreplay.open_store(tmp_path / "s") as store:
        # + each lane's step after the stop that marks its running episode cut (outside the limit, which
        # counts the steps taken while the trainer runs), + each lane's final observation
        assert store.num_rows - base_rows == 800 + 4 + 4
        ids = store.transition_ids()
        b = store.transitions(ids)
    greedy = load_policy(pol).act(b.obs) == b.action
    # ~half the random actions of the first 400 steps match the greedy one, all of the last 400
    assert greedy.sum() > 0.65 * len(ids), (greedy.sum(), len(ids))
    assert pool.episodes > 0 and all(r > 0 for r in pool.episode_returns())


@pytest.mark.parametrize("env_id,module", [("MinAtar/Breakout-v1", "minatar"), ("LunarLander-v3", "Box2D")])
def test_other_registered_envs(tmp_path, env_id, module):
    pytest.importorskip(module)
    res = collect(env_id, tmp_path / "s", 200, workers=0, envs_per_worker=2, seed=0, progress=False)
    with mmreplay.open_store(tmp_path / "s") as store:
        b = store.transitions(store.transition_ids())
        space = make_env(env_id).observation_space
        assert store.schema["obs"].dtype == space.dtype and b.obs.shape[1:] == space.shape
        assert len(b) == res.transitions and np.isfinite(b.reward).all()


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "mmreplay", *map(str, args)], capture_output=True, text=True,
                          timeout=120, **kw)


def test_cli_failure_paths_are_one_line(tmp_path):
    """For collect: a corrupt, full or disk-full store exits 1 with one line, no traceback."""
    import resource

    # corrupt manifest
    collect("CartPole-v1", tmp_path / "c", 10, workers=0, seed=0, progress=False)
    for m in (tmp_path / "c" / "STORE.json", tmp_path / "c" / "STORE.copy.json"):  # both copies
        m.write_bytes(m.read_bytes().replace(b"CartPole", b"CartPolf"))
    r = _cli("collect", "CartPole-v1", "--store", tmp_path / "c", "--steps", 10)
    assert r.returncode == 1 and "CorruptStoreError" in r.stderr and "Traceback" not in r.stderr
    # full store that refuses to evict
    store = mmreplay.create_store(tmp_path / "f", mmreplay.Schema.from_spaces(
        make_env("CartPole-v1").observation_space, make_env("CartPole-v1").action_space),
        capacity=64, segment_records=32, on_full="error")
    store.close()
    r = _cli("collect", "CartPole-v1", "--store", tmp_path / "f", "--steps", 500)
    assert r.returncode == 1 and "StoreFullError" in r.stderr and "Traceback" not in r.stderr
    with mmreplay.open_store(tmp_path / "f") as s:
        assert 0 < s.num_rows <= 64 + 2 * 32 and s.verify() == []  # capacity + a segment + the open one
    # disk full: files may not grow past 1 MiB (EFBIG; Python ignores SIGXFSZ)

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    r = _cli("collect", "CartPole-v1", "--store", tmp_path / "d", "--steps", 100,
             preexec_fn=limit)
    assert r.returncode == 1 and "DiskFullError" in r.stderr and "Traceback" not in r.stderr
    assert not list((tmp_path / "d").rglob("*.tmp"))
    # bad flags
    assert _cli("collect", "CartPole-v1", "--steps", 10).returncode == 2  # --store missing
    assert _cli("collect", "CartPole-v1", "--store", tmp_path / "x", "--steps", 0).returncode == 2


def test_cli_ray_address_needs_a_shared_archive(tmp_path):
    r = CliRunner().invoke(main, ["collect", "CartPole-v1", "--store", str(tmp_path / "s"), "--steps", "10",
                                  "--ray", "ray://head:10001"])
    assert r.exit_code == 2 and "--ray-archive" in r.output


def test_train_cli_failure_paths_are_one_line(tmp_path):
    """For train: a missing or corrupt store exits 1 with one line, no traceback."""
    r = _cli("train", "--offline", "--store", tmp_path / "missing", "--algo", "bc", "--eval-env", "CartPole-v1",
             "--steps", 10, "--run-dir", tmp_path / "r1")
    last = r.stderr.strip().splitlines()[-1]  # (a note that tensorboard is missing may come first)
    assert r.returncode == 1 and "Traceback" not in r.stderr and last.startswith("Error: ") and "missing" in last
    collect("CartPole-v1", tmp_path / "c", 50, workers=0, seed=0, progress=False)
    for m in (tmp_path / "c" / "STORE.json", tmp_path / "c" / "STORE.copy.json"):  # both copies
        m.write_bytes(m.read_bytes().replace(b"CartPole", b"CartPolf"))
    r = _cli("train", "CartPole-v1", "--store", tmp_path / "c", "--steps", 10, "--run-dir", tmp_path / "r2")
    assert r.returncode == 1 and "CorruptStoreError" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert _cli("train", "CartPole-v1", "--store", tmp_path / "c", "--algo", "ppo").returncode == 2


def test_collect_segment_records_and_honest_sizes(tmp_path):
    """--segment-records sizes a small store's segments, so it keeps about what --capacity asks; the
    summary and info give the bytes allocated on disk (preallocated files) apart from the bytes the
    rows use."""
    import json

    path = tmp_path / "s"
    r = CliRunner().invoke(main, ["collect", "CartPole-v1", "--store", str(path), "--steps", "5000", "--workers", "0",
                                  "--capacity", "2000", "--segment-records", "512", "--seed", "0"])
    assert r.exit_code == 0, r.output
    assert "MiB of rows" in r.output and "allocated on disk in" in r.output
    data = json.loads(CliRunner().invoke(main, ["info", str(path), "--json"]).output)
    assert data["segment_records"] == 512
    assert 2000 <= data["rows"] <= 2000 + 2 * 512  # capacity + the open segment + one more
    assert data["bytes_used"] == data["rows"] * (mmreplay.open_store(path).layout.record_bytes + 16)
    assert data["bytes_on_disk"] >= data["segment_files"] * data["segment_bytes"] > data["bytes_used"]
    r = CliRunner().invoke(main, ["info", str(path)])
    assert "allocated in" in r.output and "the rows use" in r.output
    r = CliRunner().invoke(main, ["collect", "CartPole-v1", "--store", str(path), "--steps", "10", "--workers", "0",
                                  "--segment-records", "256"])
    assert r.exit_code == 2 and "--segment-records" in r.output  # an existing store keeps its segment size


@pytest.mark.parametrize("autoreset", ["next_step", "same_step"])
def test_episodes_cut_by_the_end_of_a_collect_are_truncations(tmp_path, autoreset):
    """The end of the run cuts every running episode: its last step is stored as truncated, counted
    as cut (apart from the env's own truncations), so info agrees with the collect summary (which
    counts the episodes that ended on their own) and nothing is left incomplete."""
    res = collect("CartPole-v1", tmp_path / "s", 4000, workers=0, envs_per_worker=4, seed=0, progress=False,
                  autoreset_mode=autoreset)
    with mmreplay.open_store(tmp_path / "s") as st:
        info = st.info()
    assert info["episodes_incomplete"] == 0
    assert info["episodes_terminated"] + info["episodes_truncated"] == res.episodes
    assert info["episodes"] == res.episodes + info["episodes_cut"]
    assert info["episodes_truncated"] == 0 and info["episodes_cut"] == 4  # no time limit below 500: 4 cut


def test_info_counts_an_unmarked_cut_episode_as_incomplete(tmp_path, schema):
    """A writer closed mid-episode (as every store was written before runs marked their end) leaves
    an episode that ends neither terminated nor truncated: info counts it apart."""
    from conftest import step

    st = mmreplay.create_store(tmp_path / "s", schema, segment_records=8)
    with st.writer(lanes=2) as w:
        for t in range(9):
            w.add(**step(2, t, term=[t == 3, False]))
        w.close(last_obs=step(2, 9)["obs"])
    info = st.info()
    assert (info["episodes_terminated"], info["episodes_truncated"], info["episodes_incomplete"]) == (1, 0, 2)
    assert info["episodes"] == 1
    st.close()


def test_collect_summary_says_when_a_full_disk_evicted(tmp_path):
    path = tmp_path / "s"
    collect("CartPole-v1", path, 600, workers=0, seed=0, progress=False, segment_records=128)
    with mmreplay.open_store(path, mode="a") as st:
        assert st.files.evict_for_new_segment(force_one=True)  # what the writer does when the disk is full
    r = CliRunner().invoke(main, ["collect", "CartPole-v1", "--store", str(path), "--steps", "100", "--workers", "0"])
    assert r.exit_code == 0, r.output
    assert "the disk was full: 1 segment(s) were evicted" in r.output


def test_the_specs_are_checked_when_made_and_collect_is_their_keyword_form(tmp_path):
    """A run is described once (EnvSpec, WriterSpec, CollectSpec: frozen, picklable, checked when
    made, errors naming the field); ``collect``'s keywords build the same run ``run_collect`` takes."""
    import pickle

    from mmreplay.actors import CollectSpec, EnvSpec, WriterSpec, run_collect

    with pytest.raises(ValueError, match="steps"):
        CollectSpec(0)
    with pytest.raises(ValueError, match="envs_per_worker"):
        CollectSpec(10, envs_per_worker=0)
    with pytest.raises(ValueError, match="autoreset_mode"):
        EnvSpec("CartPole-v1", autoreset_mode="sometimes")
    with pytest.raises(ValueError, match="durability"):
        WriterSpec(str(tmp_path / "x"), durability="never")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="policy"):
        CollectSpec(10, policy="greedy")
    run = CollectSpec(64, workers=0, envs_per_worker=2, policy="random", seed=3, progress=False)
    assert run.policy == PolicySpec() and pickle.loads(pickle.dumps(run)) == run
    assert run.shares() == [64] and CollectSpec(7, workers=3).shares() == [3, 2, 2]
    env = EnvSpec("CartPole-v1", max_episode_steps=20)
    a = run_collect(env, WriterSpec(tmp_path / "a", segment_records=64), run)  # type: ignore[arg-type]
    b = collect("CartPole-v1", tmp_path / "b", 64, workers=0, envs_per_worker=2, seed=3, progress=False,
                max_episode_steps=20, segment_records=64)
    assert a.steps == b.steps == 64 and a.episodes == b.episodes > 0
    with mmreplay.open_store(tmp_path / "a") as sa, mmreplay.open_store(tmp_path / "b") as sb:
        assert _stored(sa) == _stored(sb) and sa.metadata["env_id"] == "CartPole-v1"
