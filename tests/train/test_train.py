"""mmreplay train: policy files, the learner's losses, and shortened acceptance runs (online, resume
after SIGKILL, offline, actors, Atari). Full-length figures come from benchmarks/train_cartpole.py
and benchmarks/offline.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mmreplay  # noqa: E402
from mmreplay.agent import FrameStack, QNetwork, load_policy, network_spec, save_policy  # noqa: E402
from mmreplay.agent.evaluation import greedy_actions  # noqa: E402
from mmreplay.train import QLearner, TrainConfig, config_for, to_tensors, train, with_settings  # noqa: E402
from mmreplay.train.algos import bc, cql, dqn  # noqa: E402

LOSSES = {"dqn": dqn.dqn_loss, "cql": cql.cql_loss, "bc": bc.discrete_loss}


def _q_learner(cfg: TrainConfig, spec: dict) -> QLearner:
    """The Q learner of ``cfg``'s discrete algorithm over a network of ``spec``."""
    return QLearner(cfg, spec, torch.device("cpu"), LOSSES[cfg.algo.name], target=cfg.algo.name != "bc")

CARTPOLE_FAST = dict(learning_starts=500, train_freq=64, gradient_steps=32, target_update_interval=32,
                     eval_episodes=10, tensorboard=False, segment_records=4096, capacity=100_000)


def _cartpole_cfg(tmp_path: Path, name: str, **kw: object) -> TrainConfig:
    return config_for(env_id="CartPole-v1", store=str(tmp_path / f"{name}-store"), run_dir=str(tmp_path / f"{name}-run"),
                       **{**CARTPOLE_FAST, **kw})  # type: ignore[arg-type]


# -- policy files -----------------------------------------------------------------------------------
def test_policy_file_roundtrip_dict_obs_and_cnn(tmp_path):
    schema = mmreplay.Schema([mmreplay.Field("obs/pos", np.float32, (3,)), mmreplay.Field("obs/vel", np.float32, (2,)),
                              mmreplay.Field("action", np.int64), mmreplay.Field("reward", np.float32),
                              mmreplay.Field("terminated", np.bool_), mmreplay.Field("truncated", np.bool_)])
    net = QNetwork(network_spec(schema, 4, hidden=(16,), dueling=True))
    obs = {"obs/pos": np.random.rand(5, 3).astype(np.float32), "obs/vel": np.random.rand(5, 2).astype(np.float32)}
    with torch.no_grad():
        want = net({k: torch.as_tensor(v) for k, v in obs.items()}).numpy()
    save_policy(tmp_path / "p.pt", net, epsilon=0.25, step=7, env_id="Toy-v0")
    assert [p.name for p in tmp_path.iterdir()] == ["p.pt"]  # no temp file left behind
    pol = load_policy(tmp_path / "p.pt")
    assert pol.meta == {"env_id": "Toy-v0", "epsilon": 0.25, "step": 7} and pol.n_actions == 4
    np.testing.assert_allclose(pol.q_values(obs), want, rtol=1e-6)
    np.testing.assert_array_equal(pol.act({"pos": obs["obs/pos"], "vel": obs["obs/vel"]}), want.argmax(1))
    explore = pol.act(obs, 1.0, np.random.default_rng(0))  # every row explores: the network is not run
    pol.net, net_of = None, pol.net
    assert explore.shape == (5,) and np.all(explore < 4)
    np.testing.assert_array_equal(pol.act(obs, 1.0, np.random.default_rng(0)), explore)
    pol.net = net_of
    with pytest.raises(mmreplay.SchemaError, match="obs/vel"):
        pol.q_values({"obs/pos": obs["obs/pos"], "obs/vel": np.zeros((5, 3), np.float32)})

    frames = mmreplay.Schema.transition(obs_shape=(84, 84), obs_dtype=np.uint8)
    cnn = QNetwork(network_spec(frames, 6, frame_stack=4))
    assert cnn.spec["kind"] == "cnn"
    save_policy(tmp_path / "cnn.pt", cnn)
    pol = load_policy(tmp_path / "cnn.pt")
    x = np.random.randint(0, 255, (2, 4, 84, 84), np.uint8)
    with torch.no_grad():  # uint8 frames are scaled by 1/255 inside the network
        want = cnn(torch.as_tensor(x).float() / 255).numpy()
    np.testing.assert_allclose(pol.q_values(x), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(mmreplay.SchemaError, match=r"\(B, 4, 84, 84\)"):
        pol.act(x[:, 0])

    # a plain MLP policy acts through the numpy path: the network's argmax; a wrong shape is still an error
    vec = mmreplay.Schema.transition(obs_shape=(4,), obs_dtype=np.float32)
    save_policy(tmp_path / "mlp.pt", QNetwork(network_spec(vec, 3, hidden=(32,), frame_stack=2)))
    pol = load_policy(tmp_path / "mlp.pt")
    x = np.random.default_rng(0).normal(size=(64, 2, 4)).astype(np.float32)
    clear, want = _clear_argmax(pol.q_values(x))
    got = pol.act(x)
    assert got.dtype == np.int64 and clear.mean() > 0.9
    np.testing.assert_array_equal(got[clear], want[clear])
    with pytest.raises(mmreplay.SchemaError, match=r"\(B, 2, 4\)"):
        pol.act(x[:, 0])


def test_frame_stack_matches_the_samplers_stacks(tmp_path):
    """Acting stacks (FrameStack with the next-step autoreset flags) equal the sampler's."""
    store = mmreplay.create_store(tmp_path / "s", mmreplay.Schema.transition(obs_shape=(1,), obs_dtype=np.float32),
                                  segment_records=1024)
    ends = {3, 4, 11}  # steps whose env.step ends the episode (4: a one-step episode right after a reset)
    stack, seen = FrameStack(3), {}
    autoreset = np.zeros(1, bool)
    x = stack.reset(np.zeros((1, 1), np.float32))
    with store.writer(lanes=1) as w:
        for t in range(16):
            done = t in ends and not autoreset[0]
            seen[t] = x[0, :, 0].copy()
            w.add(obs=np.full((1, 1), t, np.float32), action=np.zeros(1, np.int64), reward=np.ones(1, np.float32),
                  terminated=np.array([done]), truncated=np.zeros(1, bool))
            x = stack.push(np.full((1, 1), t + 1, np.float32), autoreset)
            autoreset = np.array([done])
    sampler = mmreplay.UniformSampler(store, frame_stack=3, seed=0)
    ids = sampler.valid_ids()
    t_of = store.rows("obs", ids)[:, 0].astype(int)
    stacks = sampler.view(ids).obs[:, :, 0]
    assert len(ids) >= 10
    for t, s in zip(t_of, stacks):
        np.testing.assert_array_equal(s, seen[t], err_msg=f"step {t}")
    store.close()


# -- the learner -----------------------------------------------------------------------------------
def _batch(n=32, seed=0):
    rng = np.random.default_rng(seed)
    obs, nxt = rng.normal(size=(n, 4)).astype(np.float32), rng.normal(size=(n, 4)).astype(np.float32)
    return mmreplay.TransitionBatch(obs, rng.integers(0, 2, n), rng.normal(size=n), nxt, rng.random(n) < 0.2,
                                    np.zeros(n, bool), np.arange(n), discount=None)


@pytest.mark.parametrize("algo,prioritized", [("dqn", False), ("dqn", True), ("cql", False), ("bc", False)])
def test_learner_losses_match_hand_computation(algo, prioritized):
    extra = {"cql_alpha": 0.5} if algo == "cql" else {}
    cfg = config_for(env_id="x", store="x", algo=algo, offline=True, hidden=(32,), learning_rate=1e-3,
                     prioritized=prioritized, **extra)
    schema = mmreplay.Schema.transition(obs_shape=(4,), obs_dtype=np.float32)
    torch.manual_seed(0)
    learner = _q_learner(cfg, network_spec(schema, 2, hidden=(32,)))
    with torch.no_grad():  # make the target differ from the online net
        for p in learner.q.parameters():
            p.add_(0.1)
    b = to_tensors(_batch(), torch.device("cpu"))
    a = b.action.long()
    with torch.no_grad():
        q_all = learner.q(b.obs)
        q_sa = q_all.gather(1, a[:, None]).squeeze(1)
        if algo == "bc":
            want_loss = torch.nn.functional.cross_entropy(q_all, a)
        else:
            best = learner.q(b.next_obs).argmax(1, keepdim=True)  # double DQN: online net picks
            y = b.reward.float() + 0.99 * (1 - b.terminated.float()) * learner.target(b.next_obs).gather(1, best)[:, 0]
            want_td = q_sa - y
            want_loss = torch.nn.functional.smooth_l1_loss(q_sa, y)
            if algo == "cql":
                want_loss = want_loss + 0.5 * (torch.logsumexp(q_all, 1) - q_sa).mean()
    td = learner.update(b)
    loss, q_mean = learner.read_stats()
    assert loss == pytest.approx(float(want_loss), rel=1e-5)
    assert q_mean == pytest.approx(float(q_sa.mean()), rel=1e-5, abs=1e-6)
    if algo == "bc":
        assert td is None and learner.target is None
    elif prioritized:  # the TD errors the priorities are made of
        torch.testing.assert_close(td, want_td)
    else:
        assert td is None  # (not computed without prioritized replay)
    with torch.no_grad():
        assert not torch.equal(learner.q(b.obs), q_all)  # the step changed the weights


def test_learner_stats_average_every_update_since_the_last_read():
    """``read_stats`` averages the loss and Q(s, a) of every update since the last read, however many
    (the learner sums them in blocks of 1,024 updates): with a zero learning rate each update's loss is the
    same, so the mean over 1,100 updates is that loss."""
    cfg = config_for(env_id="x", store="x", offline=True, hidden=(16,), learning_rate=0.0, loss="mse", double=False)
    schema = mmreplay.Schema.transition(obs_shape=(4,), obs_dtype=np.float32)
    torch.manual_seed(0)
    learner = _q_learner(cfg, network_spec(schema, 2, hidden=(16,)))
    b = to_tensors(_batch(), torch.device("cpu"))
    with torch.no_grad():
        q_sa = learner.q(b.obs).gather(1, b.action.long()[:, None]).squeeze(1)
        y = b.reward.float() + 0.99 * (1 - b.terminated.float()) * learner.target(b.next_obs).max(1).values
        want = float(torch.nn.functional.mse_loss(q_sa, y))
    for _ in range(1100):
        learner.update(b)
    loss, q_mean = learner.read_stats()
    assert loss == pytest.approx(want, rel=1e-5)
    assert q_mean == pytest.approx(float(q_sa.mean()), rel=1e-5, abs=1e-6)
    assert learner.read_stats() == (None, None)  # nothing since


def test_polyak_target_update():
    cfg = config_for(env_id="x", store="x", tau=0.25, target_update_interval=1, hidden=(8,))
    learner = _q_learner(cfg, network_spec(mmreplay.Schema.transition(obs_shape=(4,)), 2, hidden=(8,)))
    before = [p.clone() for p in learner.target.parameters()]
    learner.update(to_tensors(_batch(), torch.device("cpu")))
    for t, b, q in zip(learner.target.parameters(), before, learner.q.parameters()):
        torch.testing.assert_close(t, b + 0.25 * (q - b))


# -- online, synchronous -----------------------------------------------------------------------------
def test_online_cartpole_learns_and_is_reproducible(tmp_path):
    """Shortened acceptance: the synchronous loop learns CartPole from the store, with PER and
    3-step returns, and the same seed gives the same weights and metrics."""
    kw = dict(steps=3000, eval_every=1500, checkpoint_every=0, seed=4, prioritized=True, n_step=3, log_every=500)
    r1 = train(_cartpole_cfg(tmp_path, "a", **kw))
    r2 = train(_cartpole_cfg(tmp_path, "b", **kw))
    assert r1.env_steps == 3000 and r1.updates == 32 * len(range(512, 3001, 64))  # rounds past learning_starts
    assert r1.best_return >= 150, r1.evals  # random play: ~22
    assert r1.evals == r2.evals
    p1, p2 = load_policy(r1.policy_path), load_policy(r2.policy_path)
    for (k, v1), v2 in zip(p1.net.state_dict().items(), p2.net.state_dict().values()):
        assert torch.equal(v1, v2), k
    m1 = (Path(r1.run_dir) / "metrics.csv").read_text().splitlines()
    m2 = (Path(r2.run_dir) / "metrics.csv").read_text().splitlines()
    col = m1[0].split(",").index("loss")
    assert [ln.split(",")[col] for ln in m1] == [ln.split(",")[col] for ln in m2]
    with mmreplay.open_store(tmp_path / "a-store") as s:
        assert s.info()["transitions"] >= 3000  # every step went into the store
    assert (tmp_path / "a-store" / "priorities" / "a-run.npz").exists()


def test_the_trainer_flushes_denormals_on_the_cpu_unless_told_not_to(tmp_path):
    """Denormal floats (an optimizer's running averages of mostly-zero gradients decay into them)
    make every operation on them many times slower; the trainer flushes them to zero on the CPU."""
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush denormals")
    tiny = torch.tensor([1e-40])
    short = dict(steps=600, eval_episodes=0, device="cpu")  # one training round
    try:
        assert (tiny * 1.0).item() != 0.0  # kept as a denormal
        train(_cartpole_cfg(tmp_path, "keep", flush_denormal=False, **short))
        assert (tiny * 1.0).item() != 0.0
        train(_cartpole_cfg(tmp_path, "flush", **short))
        assert (tiny * 1.0).item() == 0.0  # flushed to zero (process-wide, as documented)
    finally:
        torch.set_flush_denormal(False)


def test_config_is_validated_before_anything_is_made(tmp_path):
    with pytest.raises(ValueError, match="batch_size"):
        train(_cartpole_cfg(tmp_path, "v", batch_size=0))
    with pytest.raises(ValueError, match="offline only"):
        train(config_for("CartPole-v1", store=str(tmp_path / "v-store"), run_dir=str(tmp_path / "v-run"), algo="cql"))
    assert not (tmp_path / "v-store").exists() and not (tmp_path / "v-run").exists()
    mmreplay.create_store(tmp_path / "w-store", mmreplay.Schema.transition(obs_shape=(3,))).close()
    with pytest.raises(mmreplay.SchemaError, match="field 'obs'"):  # a store of another env
        train(_cartpole_cfg(tmp_path, "w"))


def test_cli_options_mirror_the_config_and_do_not_import_torch():
    import dataclasses

    from click.testing import CliRunner

    from mmreplay.cli.main import main
    from mmreplay.cli.train import option_fields

    from mmreplay.train import algorithm_names, get_algorithm
    from mmreplay.train.config import GROUPS

    settings = {f.name for f in dataclasses.fields(TrainConfig)} - set(GROUPS)
    settings |= {f.name for g in GROUPS.values() for f in dataclasses.fields(g)}
    settings |= {n for a in algorithm_names() for n in get_algorithm(a).config.field_names()}
    assert option_fields() == settings
    r = CliRunner().invoke(main, ["train", "--help"])
    assert r.exit_code == 0 and "Examples:" in r.output and "--prioritized / --uniform" in r.output
    r = CliRunner().invoke(main, ["train", "CartPole-v1"])
    assert r.exit_code == 2 and "--store is required" in r.output, r.output  # a usage error, in the flag's name
    code = "import sys; from mmreplay.cli.main import main; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- resume after SIGKILL, through the CLI --------------------------------------------------------------
def _mmreplay(*args: str) -> list[str]:
    return [sys.executable, "-m", "mmreplay", *args]


@pytest.mark.slow
def test_resume_after_sigkill_keeps_the_store_and_finishes(tmp_path):
    store, run = tmp_path / "store", tmp_path / "run"
    args = ["train", "CartPole-v1", "--store", str(store), "--run-dir", str(run), "--steps", "3000",
            "--learning-starts", "500", "--train-freq", "64", "--gradient-steps", "32", "--target-update-interval", "32",
            "--checkpoint-every", "500", "--eval-every", "500", "--eval-episodes", "10", "--segment-records", "2048",
            "--learning-rate", "1e-3",
            "--no-tensorboard", "-q"]
    from mmreplay.train.checkpoint import load_checkpoint

    proc = subprocess.Popen(_mmreplay(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if (run / "checkpoint.pt").exists() and load_checkpoint(run / "checkpoint.pt")["counters"]["env_steps"] >= 1000:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    killed_at = load_checkpoint(run / "checkpoint.pt")["counters"]["env_steps"]  # a newer one may have landed
    assert 1000 <= killed_at <= 2000, killed_at  # evals every 500: at least two after the resume
    with mmreplay.open_store(store) as s:
        rows_at_kill = s.num_rows
    assert rows_at_kill >= killed_at  # the writer published every step before the checkpoint counted it
    out = subprocess.run(_mmreplay("train", "--resume", "--run-dir", str(run)), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads((run / "result.json").read_text())
    after = [mean for step, mean, _ in result["evals"] if step > killed_at]
    assert result["env_steps"] == 3000 and len(after) >= 2 and max(after) >= 80, result["evals"]  # random: ~22
    with mmreplay.open_store(store, mode="a") as s:  # the killed writer's rows were recovered, none lost
        assert s.num_rows >= rows_at_kill + (3000 - killed_at)
    lines = (run / "metrics.csv").read_text().splitlines()[1:]
    steps = [int(float(ln.split(",")[0])) for ln in lines if ln.split(",")[5] == ""]  # training rows
    assert steps == sorted(steps) and len(steps) == len(set(steps))  # rows after the checkpoint were dropped
    plot = subprocess.run(_mmreplay("plot", str(run)), capture_output=True, text=True)
    if "matplotlib" not in plot.stderr:
        assert plot.returncode == 0, plot.stderr
        assert (run / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
        other = tmp_path / "other-trainer"  # another trainer's evaluations in the same CSV format
        other.mkdir()
        (other / "metrics.csv").write_text("step,eval_return,eval_std\n1000,20.0,1.5\n3000,90.0,4.0\n")
        both = subprocess.run(_mmreplay("plot", str(run), str(other), "--out", str(tmp_path / "both.png")),
                              capture_output=True, text=True)
        assert both.returncode == 0, both.stderr
        assert (tmp_path / "both.png").read_bytes()[:4] == b"\x89PNG"


# -- offline --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """Small "random" and "mediocre" CartPole stores (the benchmark uses ~50k transitions each)."""
    from mmreplay.actors import collect

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from offline import LinearController

    root = tmp_path_factory.mktemp("offline")
    out = {}
    for name, policy in (("random", "random"), ("mediocre", LinearController(0.6, seed=5))):
        res = collect("CartPole-v1", root / name, 8000, policy=policy, workers=0, envs_per_worker=8, seed=11,
                      progress=False)
        out[name] = (root / name, float(np.mean(res.episode_returns)))
    return out


def _offline(tmp_path, store, algo, steps=1000, **kw):
    return train(config_for(offline=True, store=str(store), algo=algo, steps=steps, eval_env="CartPole-v1",
                             eval_every=0, eval_episodes=20, run_dir=str(tmp_path / f"{algo}-{store.name}"),
                             tensorboard=False, checkpoint_every=0, **kw))


def test_offline_bc_and_cql_on_mediocre_data_from_a_read_only_copy(tmp_path, datasets):
    path, behaviour = datasets["mediocre"]
    assert 50 < behaviour < 200
    ro = tmp_path / "ro"
    subprocess.run(["cp", "-a", str(path), str(ro)], check=True)
    subprocess.run(["chmod", "-R", "a-w", str(ro)], check=True)
    try:
        bc = _offline(tmp_path, ro, "bc")
        cql = _offline(tmp_path, ro, "cql", loader=True)  # through the BatchLoader thread as well
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(ro)], check=True)
    assert bc.final_return >= 400 and cql.final_return >= 300, (bc.evals, cql.evals)
    assert bc.updates == cql.updates == 1000


def test_offline_bc_on_random_data_is_no_better_than_random(tmp_path, datasets):
    path, behaviour = datasets["random"]
    bc = _offline(tmp_path, path, "bc")
    assert bc.final_return <= behaviour * 1.5, (bc.evals, behaviour)


# -- actors ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_actors_fill_the_store_under_the_samples_per_insert_limit(tmp_path):
    pytest.importorskip("mmreplay.actors").ActorPool  # noqa: B018
    cfg = _cartpole_cfg(tmp_path, "act", steps=3000, actors=2, eval_every=0, eval_episodes=5, checkpoint_every=0,
                        publish_every=16)
    res = train(cfg)
    assert 3000 <= res.env_steps < 3000 + 2 * 300
    spi = cfg.algo.batch_size * cfg.algo.gradient_steps / cfg.algo.train_freq  # 32 sampled per inserted transition
    expected = (res.env_steps - cfg.algo.learning_starts) * spi / cfg.algo.batch_size
    assert abs(res.updates - expected) <= 300 * spi / cfg.algo.batch_size + 50, (res.updates, expected)
    with mmreplay.open_store(cfg.store) as s:
        assert s.num_rows >= res.env_steps
        info = s.info()
    # the episodes the run's end interrupts are stored truncated and counted as cut, none incomplete (the actors
    # take the one step that carries the cut after the trainer stopped them, past the samples-per-insert limit)
    workers = [w for r in info["provenance"] if isinstance(r.get("workers"), list) for w in r["workers"]]
    assert info["episodes_incomplete"] == 0, info
    assert info["episodes_cut"] == sum(len(w["cut_rows"]) for w in workers), (info["episodes_cut"], workers)
    assert load_policy(Path(res.run_dir) / "actor_policy.pt").meta["epsilon"] == pytest.approx(cfg.algo.end_e)


# -- Atari path -----------------------------------------------------------------------------------------
def test_training_rounds_follow_env_steps_not_vector_steps(tmp_path):
    """With ``train_freq`` below ``num_envs`` a round comes every ``num_envs`` env steps, counted
    without the lanes' autoreset steps: the updates per env step are the same however often episodes
    end (a round per vector step gave CartPole's short random episodes a few % more updates)."""
    cfg = _cartpole_cfg(tmp_path, "rounds", num_envs=4, steps=1200, learning_starts=200, train_freq=1,
                        gradient_steps=1, batch_size=8, exploration_fraction=1.0, start_e=1.0, end_e=1.0,
                        eval_every=0, eval_episodes=1, checkpoint_every=0, threads=1)
    res = train(cfg)
    with mmreplay.open_store(cfg.store) as s:  # random CartPole episodes: many autoreset steps in the run
        assert s.rows("terminated", s.transition_ids()).sum() > 20
    assert res.updates == res.env_steps // 4 - 200 // 4


def test_a_runs_store_keeps_its_replay_memory_within_a_few_percent_of_capacity(tmp_path):
    """A store the run creates has segments of at most capacity / 64 rows (1,024 at least), so a
    full one holds from ``capacity`` to ``capacity`` + 2 segments of rows (the store default,
    capacity / 8 + 1,024 here, let it reach 1.75x)."""
    from mmreplay.train import replay_segment_records

    schema = mmreplay.Schema.transition(obs_shape=(10, 10, 4), obs_dtype=np.bool_)
    assert replay_segment_records(schema, 100_000, 1) == 1562
    cfg = _cartpole_cfg(tmp_path, "cap", capacity=4096, segment_records=None, steps=9000, learning_starts=9000,
                        eval_every=0, eval_episodes=1, checkpoint_every=0, threads=1)
    train(cfg)
    with mmreplay.open_store(cfg.store) as s:
        assert s.segment_records == 1024
        assert 4096 <= s.num_rows <= 4096 + 2 * 1024
    train(with_settings(cfg, run_dir=str(tmp_path / "cap-run2"), steps=500, learning_starts=500))  # the store reopened as is
    with mmreplay.open_store(cfg.store) as s:
        assert s.segment_records == 1024 and 4096 <= s.num_rows <= 4096 + 2 * 1024


def test_atari_path_end_to_end(tmp_path):
    pytest.importorskip("ale_py")
    from mmreplay.train import atari_config

    cfg = atari_config(env_id="ALE/Pong-v5", store=str(tmp_path / "pong"), run_dir=str(tmp_path / "pong-run"),
                       steps=240, learning_starts=160, train_freq=8, batch_size=8, n_step=3, prioritized=True,
                       eval_episodes=1, max_episode_steps=60, eval_every=0, checkpoint_every=0, capacity=10_000,
                       segment_records=512, tensorboard=False, threads=1)
    res = train(cfg)
    assert res.env_steps >= 240 and res.updates == (240 - 160) // 8
    pol = load_policy(res.policy_path)
    assert pol.spec["kind"] == "cnn" and pol.frame_stack == 4
    with mmreplay.open_store(cfg.store) as s:
        assert s.schema["obs"].shape == (84, 84) and s.schema["obs"].dtype == np.uint8  # single frames stored


def _clear_argmax(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose best Q-value leads the second by a margin (a near-tie may flip between kernels), and argmax."""
    top2 = np.sort(q, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0] > 1e-4, q.argmax(1)


@pytest.mark.parametrize("kind", ["mlp", "stacked", "dueling", "dict", "cnn"])
def test_acting_forward_picks_the_networks_argmax(kind):
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    if kind == "dict":
        schema = mmreplay.Schema([mmreplay.Field("obs/pos", np.float32, (3,)), mmreplay.Field("obs/vel", np.float32, (2,)),
                                  mmreplay.Field("action", np.int64), mmreplay.Field("reward", np.float32)])
        x = {"obs/pos": torch.randn(64, 3), "obs/vel": torch.randn(64, 2)}
    elif kind == "cnn":
        schema = mmreplay.Schema.transition(obs_shape=(36, 36), obs_dtype=np.uint8)
        x = torch.as_tensor(rng.integers(0, 255, (16, 36, 36), dtype=np.uint8))
    else:
        schema = mmreplay.Schema.transition(obs_shape=(4,), obs_dtype=np.float32)
        x = torch.randn(64, 2, 4) if kind == "stacked" else torch.randn(64, 4)
    net = QNetwork(network_spec(schema, 5, hidden=(32, 16), dueling=kind == "dueling",
                                frame_stack=2 if kind == "stacked" else 1))
    assert (net._chain is not None) == (kind in ("mlp", "stacked", "dict"))  # the addmm chain: MLPs, no dueling head
    with torch.no_grad():
        clear, want = _clear_argmax(net(x).numpy())
    got = net.greedy(x)
    assert got.dtype == torch.int64 and not got.requires_grad
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(got.numpy()[clear], want[clear])
    with torch.no_grad():  # trained weights are read as they are now (the chain holds the modules, not copies)
        for p in net.parameters():
            p.add_(torch.randn_like(p))
        clear, want = _clear_argmax(net(x).numpy())
    np.testing.assert_array_equal(net.greedy(x).numpy()[clear], want[clear])
    # the numpy acting path (an MLP chain on the CPU, float32 observations), through greedy_actions
    obs = {k: v.numpy() for k, v in x.items()} if kind == "dict" else x.numpy()
    fast = net.greedy_numpy(obs) if kind != "dict" else None
    assert (fast is not None) == (kind in ("mlp", "stacked"))
    if fast is not None:
        assert fast.dtype == np.int64
        np.testing.assert_array_equal(fast[clear], want[clear])
        np.testing.assert_array_equal(greedy_actions(net, obs, torch.device("cpu"))[clear], want[clear])
        assert net.greedy_numpy(obs.astype(np.float64)) is None  # (then the torch path)
        with torch.no_grad():  # an optimizer-style in-place step is seen by the numpy views
            for p in net.parameters():
                p.mul_(-1.0)
            clear, want = _clear_argmax(net(x).numpy())
        np.testing.assert_array_equal(net.greedy_numpy(obs)[clear], want[clear])
        for p in net.parameters():  # parameters given new storage: new views
            p.data = p.data.clone() * 2.0
        with torch.no_grad():
            clear, want = _clear_argmax(net(x).numpy())
        np.testing.assert_array_equal(net.greedy_numpy(obs)[clear], want[clear])


def test_epsilon_greedy_draws_once_per_lane():
    from mmreplay.agent import epsilon_greedy

    calls = []

    def greedy():
        calls.append(1)
        return np.full(20_000, 7)

    a = epsilon_greedy(greedy, 4, 1.0, np.random.default_rng(0), 20_000)
    assert not calls and a.dtype == np.int64  # every lane explores: the network is not run
    counts = np.bincount(a, minlength=4)
    assert counts.shape == (4,) and np.all(np.abs(counts / 20_000 - 0.25) < 0.02)  # uniform over the actions
    a = epsilon_greedy(greedy, 4, 0.3, np.random.default_rng(1), 20_000)
    assert len(calls) == 1
    explored = a != 7
    assert abs(explored.mean() - 0.3) < 0.02 and np.all(a[explored] < 4)
    np.testing.assert_allclose(np.bincount(a[explored], minlength=4) / explored.sum(), 0.25, atol=0.03)
    np.testing.assert_array_equal(a, epsilon_greedy(greedy, 4, 0.3, np.random.default_rng(1), 20_000))  # seeded
    np.testing.assert_array_equal(epsilon_greedy(np.arange(5) % 4, 4, 0.0, np.random.default_rng(2)), np.arange(5) % 4)
    # one lane draws the same number as a lane of many: the same actions as before the one-lane path
    for eps in (0.0, 0.3, 1.0):
        r1, rn = np.random.default_rng(3), np.random.default_rng(3)
        one = [epsilon_greedy(lambda: np.array([2]), 4, eps, r1, 1) for _ in range(500)]
        u = rn.random(500)
        assert all(a.dtype == np.int64 and a.shape == (1,) for a in one)
        np.testing.assert_array_equal(np.concatenate(one), np.where(u < eps, np.minimum((u * (4 / max(eps, 1e-12))).astype(np.int64), 3), 2))


# -- MinAtar path -----------------------------------------------------------------------------------------
def test_minatar_network_reads_channels_last_frames_and_their_stacks():
    frames = mmreplay.Schema.transition(obs_shape=(10, 10, 4), obs_dtype=np.bool_)
    net = QNetwork(network_spec(frames, 3, frame_stack=2, minatar=True))
    assert net.spec["kind"] == "minatar"
    conv, fc = net.encoder[0], net.encoder[3]  # the paper's: 16 3x3 filters, stride 1, then 128 units
    assert (conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride) == (8, 16, (3, 3), (1, 1))
    assert (fc.in_features, fc.out_features) == (16 * 8 * 8, 128)
    x = np.random.default_rng(0).random((5, 2, 10, 10, 4)) < 0.3  # (B, k, H, W, C) as the sampler stacks them
    chw = torch.as_tensor(x).float().permute(0, 1, 4, 2, 3).reshape(5, 8, 10, 10)
    with torch.no_grad():
        want = net.head(net.encoder[1:](conv(chw)))
        np.testing.assert_allclose(net(torch.as_tensor(x)).numpy(), want.numpy(), rtol=1e-6)
    with pytest.raises(mmreplay.SchemaError, match=r"\(H, W, C\)"):
        network_spec(mmreplay.Schema.transition(obs_shape=(4,)), 2, minatar=True)


def test_minatar_preset_is_the_papers_dqn_and_the_cli_picks_it_for_minatar_ids(tmp_path):
    pytest.importorskip("minatar")
    from mmreplay.train import minatar_config
    from mmreplay.train.config import validate_config

    cfg = minatar_config(env_id="MinAtar/Breakout-v1", store="x", steps=1_000_000)
    assert (cfg.minatar, cfg.algo.optimizer, cfg.algo.learning_rate, cfg.algo.batch_size, cfg.algo.train_freq, cfg.algo.gradient_steps,
            cfg.algo.learning_starts, cfg.capacity, cfg.algo.target_update_interval, cfg.algo.double, cfg.algo.loss, cfg.algo.max_grad_norm,
            cfg.algo.end_e) == (True, "rmsprop", 2.5e-4, 32, 1, 1, 5000, 100_000, 1000, False, "huber", 0.0, 0.1)
    assert cfg.algo.exploration_fraction * cfg.steps == 100_000  # epsilon reaches 0.1 after 100k steps
    with pytest.raises(ValueError, match="exclusive"):
        validate_config(minatar_config(env_id="x", store="x", atari=True))
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "mmreplay", "train", "MinAtar/Breakout-v1", "--store", str(tmp_path / "s"),
                        "--run-dir", str(run), "--steps", "400", "--learning-starts", "300", "--batch-size", "8",
                        "--eval-every", "0", "--eval-episodes", "1", "--checkpoint-every", "0", "-q"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    saved = json.loads((run / "config.json").read_text())
    assert saved["minatar"] is True and saved["algo"]["optimizer"] == "rmsprop" and saved["capacity"] == 100_000
    pol = load_policy(run / "policy.pt")
    assert pol.spec["kind"] == "minatar"
    with mmreplay.open_store(tmp_path / "s") as s:
        assert s.schema["obs"].shape == (10, 10, 4) and s.schema["obs"].dtype == np.bool_  # single frames


def test_offline_from_a_zarr_archive(tmp_path, datasets):
    pytest.importorskip("zarr")
    from mmreplay.archive import export_archive

    path, behaviour = datasets["mediocre"]
    export_archive(path, tmp_path / "mediocre.zarr")
    res = train(config_for(offline=True, archive=str(tmp_path / "mediocre.zarr"), algo="bc", steps=400,
                            eval_env="CartPole-v1", eval_every=0, eval_episodes=10, run_dir=str(tmp_path / "arch"),
                            tensorboard=False, checkpoint_every=0))
    assert res.updates == 400 and res.final_return > behaviour, res.evals


def test_target_update_interval_defaults_online_offline_and_atari():
    from mmreplay.train.config import atari_config, validate_config

    assert config_for(env_id="x", store="x").algo.target_update_interval == 128  # RL-zoo CartPole
    assert config_for(store="x", offline=True, algo="cql").algo.target_update_interval == 1000
    assert config_for(store="x", offline=True, target_update_interval=64).algo.target_update_interval == 64
    assert atari_config(env_id="x", store="x").algo.target_update_interval == 1000
    with pytest.raises(ValueError, match="target_update_interval"):
        validate_config(config_for(env_id="x", store="x", target_update_interval=0))
