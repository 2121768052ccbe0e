"""What `mmreplay train` shows: a progress bar only when asked or on a terminal, the step a
resumed run continues from, one evaluation per evaluation point, run directories as --help says."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

import mmreplay
from mmreplay.train import config_for, default_run_dir


def _train(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mmreplay", "train", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("store") / "cp"
    mmreplay.collect("CartPole-v1", path, 400, workers=0, seed=0, progress=False)
    return path


def _evals(run: Path) -> list[int]:
    with open(run / "metrics.csv") as fh:
        return [int(float(r["step"])) for r in csv.DictReader(fh) if r["eval_return"]]


def test_progress_resume_and_one_eval_per_point(tmp_path, cartpole):
    run = tmp_path / "run"
    base = ["--offline", "--store", cartpole, "--eval-env", "CartPole-v1", "--eval-episodes", "1", "--eval-every",
            "20", "--log-every", "10", "--run-dir", run]
    r = _train([*base, "--steps", "40"], tmp_path)  # stderr is a pipe: no bar unless asked
    assert r.returncode == 0, r.stderr
    assert "update/s" not in r.stderr and "it/s" not in r.stderr
    assert _evals(run) == [20, 40]  # the end is an evaluation point: evaluated once
    r = _train([*base, "--steps", "60", "--resume", "--progress"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"resuming {run} from update 40" in r.stderr
    assert "100%|" in r.stderr and "update/s" in r.stderr  # the bar, asked for
    assert _evals(run) == [20, 40, 60]


def test_default_run_directories_are_named_as_help_says():
    assert default_run_dir(config_for(env_id="CartPole-v1", seed=3)) == Path("runs/CartPole-v1__dqn__s3")
    offline = config_for(offline=True, store="/data/cp-mediocre", eval_env="CartPole-v1", algo="cql", seed=1)
    assert default_run_dir(offline) == Path("runs/CartPole-v1__cql-offline__s1")
    from click.testing import CliRunner

    from mmreplay.cli.main import main

    help_text = " ".join(CliRunner().invoke(main, ["train", "--help"], terminal_width=1000).output.split())
    assert "runs/ENV__ALGO__sSEED" in help_text and "runs/EVAL_ENV__ALGO-offline__sSEED" in help_text


def test_actors_stepping_past_the_end_evaluate_it_once(tmp_path):
    """Actors step in chunks, so the learner's last step count can pass --steps (602 for 600):
    the evaluation at 600 is the end's, not one more at 602 (the old code's [356, 600, 602])."""
    run = tmp_path / "run"
    r = _train(["CartPole-v1", "--store", tmp_path / "s", "--actors", "1", "--steps", "600", "--eval-every", "300",
                "--eval-episodes", "1", "--learning-starts", "100", "--run-dir", run, "-q"], tmp_path)
    assert r.returncode == 0, r.stderr
    steps = _evals(run)
    assert len(steps) == 2 and steps[0] >= 300 and steps[1] >= 600, steps
    with mmreplay.open_store(tmp_path / "s") as st:  # the actor marks the episodes the stop cuts, unless its
        assert st.info()["episodes_incomplete"] <= 1   # last block was flushed at the samples-per-insert limit


def test_online_run_marks_the_episodes_its_end_cuts(tmp_path):
    r = _train(["CartPole-v1", "--store", tmp_path / "s", "--steps", "700", "--num-envs", "2", "--eval-episodes",
                "0", "--learning-starts", "100", "--run-dir", tmp_path / "run", "-q"], tmp_path)
    assert r.returncode == 0, r.stderr
    with mmreplay.open_store(tmp_path / "s") as st:
        info = st.info()
    # CartPole's time limit is 500 steps: every truncation here is a cut the run recorded
    assert info["episodes_incomplete"] == 0 and info["episodes_truncated"] == 0 and info["episodes_cut"] >= 1
    runs = [r for r in info["provenance"] if r.get("kind") == "train"]
    assert [r["status"] for r in runs] == ["done"] and len(runs[0]["cut_rows"]) == info["episodes_cut"]


def test_result_json_records_the_data_wait_the_summary_prints(tmp_path):
    """An offline run's result.json holds the session's data wait, as the returned result and the
    summary do (it was written before the loop set it: 0.0 against the printed share)."""
    from mmreplay.train import train

    mmreplay.collect("CartPole-v1", tmp_path / "s", 600, workers=0, seed=0, progress=False)
    res = train(config_for(store=str(tmp_path / "s"), offline=True, algo="bc", eval_env="CartPole-v1", steps=60,
                            eval_episodes=0, checkpoint_every=0, run_dir=str(tmp_path / "run"), tensorboard=False,
                            progress=False))
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert saved["data_wait"] == res.data_wait and res.data_wait > 0, (saved["data_wait"], res.data_wait)


def test_a_run_that_ends_before_learning_starts_says_so(tmp_path, caplog):
    from mmreplay.train import train

    with caplog.at_level("WARNING", logger="mmreplay.train.run"):
        res = train(config_for(env_id="CartPole-v1", store=str(tmp_path / "s"), steps=200, learning_starts=1000,
                                eval_episodes=0, checkpoint_every=0, run_dir=str(tmp_path / "run"),
                                tensorboard=False, progress=False))
    assert res.updates == 0
    assert any("ends before learning_starts=1,000" in r.getMessage() for r in caplog.records), caplog.records


def test_without_a_terminal_a_long_run_prints_progress_lines(tmp_path, caplog, monkeypatch):
    """stderr not a terminal (pytest's), no bar asked for: a line every PROGRESS_LINE_S (0 here: at
    each metric row); none with progress=False."""
    from mmreplay.train import run as run_mod, train

    monkeypatch.setattr(run_mod, "PROGRESS_LINE_S", 0.0)
    cfg = dict(env_id="CartPole-v1", steps=600, learning_starts=100, log_every=200, eval_episodes=0, checkpoint_every=0,
               tensorboard=False)
    with caplog.at_level("INFO", logger="mmreplay.train.run"):
        train(config_for(store=str(tmp_path / "s"), run_dir=str(tmp_path / "r1"), **cfg))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert any(line.startswith("step 400/600 (67%):") and "updates" in line for line in lines), lines
    caplog.clear()
    with caplog.at_level("INFO", logger="mmreplay.train.run"):
        train(config_for(store=str(tmp_path / "s2"), run_dir=str(tmp_path / "r2"), progress=False, **cfg))
    assert not [r for r in caplog.records if r.getMessage().startswith("step ") and "/600 (" in r.getMessage()]
