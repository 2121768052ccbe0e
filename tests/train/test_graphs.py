"""Graph-captured updates (``--cuda-graphs``, ``mmreplay.train.graphs``): the same updates as
eager ones on a device; on a CPU the option is accepted and falls back with one warning."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import mmreplay
from mmreplay.agent import network_spec
from mmreplay.train import BoxLearner, QLearner, config_for, to_tensors
from mmreplay.train.settings import HardwareConfig
from mmreplay.train.algos import cql, dqn, iql


def _batches(n, B=64, obs=8, seed=0, device="cpu", weights=False):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        b = mmreplay.TransitionBatch(rng.normal(size=(B, obs)).astype(np.float32), rng.integers(0, 3, B),
                                     rng.normal(size=B).astype(np.float32), rng.normal(size=(B, obs)).astype(np.float32),
                                     rng.random(B) < 0.1, np.zeros(B, bool), np.arange(B),
                                     weights=rng.random(B).astype(np.float32) if weights else None)
        out.append(to_tensors(b, torch.device(device)))
    return out


def _learner(device, graphs, **kw):
    cfg = config_for(env_id="x", store="x", offline=True, hidden=(64, 64), learning_rate=1e-3, max_grad_norm=10.0,
                      target_update_interval=50, cuda_graphs=graphs, **kw)
    schema = mmreplay.Schema.transition(obs_shape=(8,), obs_dtype=np.float32)
    torch.manual_seed(0)
    loss = cql.cql_loss if cfg.algo.name == "cql" else dqn.dqn_loss
    return QLearner(cfg, network_spec(schema, 3, hidden=(64, 64), dueling=cfg.algo.dueling), torch.device(device), loss)


def test_cuda_graphs_on_a_cpu_warn_once_and_train_eagerly(caplog):
    batches = _batches(5)
    with caplog.at_level(logging.WARNING, logger="mmreplay.train.graphs"):
        graphed = _learner("cpu", True, prioritized=True)
    eager = _learner("cpu", False, prioritized=True)
    warnings = [r.getMessage() for r in caplog.records if r.name == "mmreplay.train.graphs"]
    assert len(warnings) == 1 and "need a CUDA device" in warnings[0] and "eagerly" in warnings[0]
    for b in batches:
        torch.testing.assert_close(graphed.update(b), eager.update(b), rtol=0, atol=0)
    assert graphed.updates == eager.updates == 5
    assert graphed.read_stats() == eager.read_stats()
    for p, q in zip(graphed.q.parameters(), eager.q.parameters()):
        assert torch.equal(p, q)
    assert len([r for r in caplog.records if r.name == "mmreplay.train.graphs"]) == 1  # once, not per update


def test_cuda_graphs_option_is_opt_in_and_says_so():
    from mmreplay.cli.main import main

    assert HardwareConfig().cuda_graphs is False
    out = CliRunner().invoke(main, ["train", "--help"]).output
    assert "--cuda-graphs" in out and "Opt-in" in out


def test_continuous_learner_accepts_the_option_on_a_cpu(caplog):
    schema = mmreplay.Schema.transition(obs_shape=(3,), obs_dtype=np.float32, action_shape=(1,),
                                        action_dtype=np.float32)
    cfg = mmreplay.train.continuous_config("iql", store="x", hidden=(16,), cuda_graphs=True, steps=10)
    bounds = (np.full(1, -1.0, np.float32), np.ones(1, np.float32))
    with caplog.at_level(logging.WARNING, logger="mmreplay.train.graphs"):
        learner = BoxLearner(cfg, schema, torch.device("cpu"), iql.box_algorithm(cfg.algo),
                             obs_mean=np.zeros(3, np.float32), obs_std=np.ones(3, np.float32), data_bounds=bounds,
                             policy_bounds=bounds)
    assert len([r for r in caplog.records if r.name == "mmreplay.train.graphs"]) == 1
    rng = np.random.default_rng(0)
    b = mmreplay.TransitionBatch(rng.normal(size=(16, 3)).astype(np.float32), rng.uniform(-1, 1, (16, 1)).astype(np.float32),
                                 rng.normal(size=16).astype(np.float32), rng.normal(size=(16, 3)).astype(np.float32),
                                 np.zeros(16, bool), np.zeros(16, bool), np.arange(16))
    learner.update(to_tensors(b, torch.device("cpu")))
    assert learner.updates == 1 and learner.read_stats()[0] is not None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kw", [dict(), dict(prioritized=True, dueling=True), dict(algo="cql", double=False)])
def test_graph_captured_updates_equal_eager_ones(kw):
    """200 updates eagerly and 200 replayed from captured graphs, same seeds and batches: every
    parameter equal within 1e-5 relative (fp32), the target copies on the same updates, the same
    statistics and TD errors."""
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    batches = _batches(200, device="cuda", weights=kw.get("prioritized", False))
    eager, graphed = _learner("cuda", False, **kw), _learner("cuda", True, **kw)
    assert graphed.update.enabled
    for i, b in enumerate(batches):
        td_e, td_g = eager.update(b), graphed.update(b)
        if td_e is not None:
            torch.testing.assert_close(td_g, td_e, rtol=1e-5, atol=1e-5, msg=f"TD errors of update {i}")
    assert len(graphed.update.graphs) == 2  # one shape, two phases (with and without the target copy)
    torch.cuda.synchronize()
    assert graphed.updates == eager.updates == 200
    for (name, p), q in zip(graphed.q.named_parameters(), eager.q.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    for p, q in zip(graphed.target.parameters(), eager.target.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    (le, qe), (lg, qg) = eager.read_stats(), graphed.read_stats()
    assert lg == pytest.approx(le, rel=1e-4) and qg == pytest.approx(qe, rel=1e-4, abs=1e-6)
