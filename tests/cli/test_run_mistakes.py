"""Interrupts and mistakes end with one line and lose nothing: Ctrl-C in ``train`` (exit 130, a
checkpoint, episodes cut marked, ``--resume`` continues; a finished run resumed does nothing), two
SIGINTs at once in ``collect`` (every writer still closes), an eval env that does not fit the store,
a second online trainer on one store, a full disk on a new store, bad numbers, a writer used after
close, ``import --max-rows``, ``--steps`` rounded up to whole vector steps, and a Python float reward."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import mmreplay
from mmreplay.cli.main import main


def _mm(*args, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mmreplay", *map(str, args)], capture_output=True, text=True,
                          timeout=180, **kw)


def _rows(store: Path) -> int:
    try:
        with mmreplay.open_store(store) as st:
            return st.num_rows
    except mmreplay.MMReplayError:
        return 0


def _interrupt_when(p: subprocess.Popen, ready, signals: int = 1) -> tuple[str, str]:
    t0 = time.monotonic()
    while not ready():
        assert p.poll() is None, p.communicate()
        assert time.monotonic() - t0 < 90, "the run never got going"
        time.sleep(0.05)
    for _ in range(signals):  # several at once, as `timeout` or a double Ctrl-C sends them
        p.send_signal(signal.SIGINT)
    return p.communicate(timeout=120)


def test_ctrl_c_in_train_checkpoints_marks_cuts_and_resume_continues(tmp_path):
    store, run = tmp_path / "s", tmp_path / "run"
    args = ["train", "CartPole-v1", "--store", store, "--run-dir", run, "--learning-starts", "100",
            "--eval-episodes", "0", "--checkpoint-every", "0"]
    p = subprocess.Popen([sys.executable, "-m", "mmreplay", *map(str, args), "--steps", "1000000", "-q"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = _interrupt_when(p, lambda: _rows(store) > 400)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "Aborted" not in err
    done = json.loads((run / "result.json").read_text())
    assert done["interrupted"] and done["env_steps"] > 400, done
    assert list(run.glob("checkpoint*")), list(run.iterdir())
    with mmreplay.open_store(store) as st:
        info = st.info()
    (rec,) = [r for r in info["provenance"] if r.get("kind") == "train"]
    assert rec["status"] == "interrupted" and info["episodes_incomplete"] == 0
    assert info["episodes_cut"] == len(rec["cut_rows"]) <= 1  # one env: at most its running episode
    m = re.search(r"episodes +([\d,]+) terminated, ([\d,]+) truncated by the env, ([\d,]+) cut by the end of a "
                  r"run, ([\d,]+) incomplete", out)  # the summary says the same
    assert m and [int(g.replace(",", "")) for g in m.groups()] == [
        info[f"episodes_{k}"] for k in ("terminated", "truncated", "cut", "incomplete")], out
    # --resume continues from the checkpoint to the new --steps
    steps = done["env_steps"] + 200
    r = _mm(*args, "--steps", steps, "--resume", "-q")
    assert r.returncode == 0, r.stderr
    assert json.loads((run / "result.json").read_text())["env_steps"] >= steps
    # resuming a finished run does nothing: no store opened, no segment made
    segs = sorted(os.listdir(store / "segments"))
    r = _mm(*args, "--steps", steps, "--resume")
    assert r.returncode == 0 and "already finished" in r.stderr, r.stderr
    # its saved result, not mixed with the store's counts as they are now
    assert "the run had finished: its saved result" in r.stdout and "episodes " not in r.stdout, r.stdout
    assert sorted(os.listdir(store / "segments")) == segs


def test_two_sigints_at_once_never_skip_closing_the_writers(tmp_path):
    store = tmp_path / "s"
    p = subprocess.Popen([sys.executable, "-m", "mmreplay", "collect", "CartPole-v1", "--store", str(store), "--steps",
                          "1000000000", "--workers", "2", "--envs-per-worker", "4", "--no-progress"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out, err = _interrupt_when(p, lambda: _rows(store) > 2000, signals=2)
    assert p.returncode == 130 and out.startswith("interrupted: stored"), (out, err)
    with mmreplay.open_store(store) as st:
        info = st.info()
        assert info["segments_open"] == 0 and st.verify() == []
    # every lane's running episode is cut (a lane whose last step ended an episode has none: with one lane
    # per worker, both workers stopping there is a 1-in-100 run; with 8 lanes, all of them one in 10^8)
    (run,) = [r for r in info["provenance"] if r.get("kind") == "collect"]
    cuts = [len(w["cut_rows"]) for w in run["workers"]]
    assert len(cuts) == 2 and info["episodes_cut"] == sum(cuts) >= 1, (cuts, info["episodes_cut"])
    assert info["episodes_incomplete"] == 0


def test_an_eval_env_that_does_not_fit_the_store_is_one_line(tmp_path):
    store = tmp_path / "cp"
    mmreplay.collect("CartPole-v1", store, 200, workers=0, seed=0, progress=False)
    r = CliRunner().invoke(main, ["train", "--offline", "--store", str(store), "--eval-env", "Pendulum-v1",
                                  "--steps", "10", "--run-dir", str(tmp_path / "run")])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert "--eval-env Pendulum-v1 does not fit the store" in r.output and "obs" in r.output
    assert not (tmp_path / "run").exists()


def test_a_second_online_trainer_on_a_store_is_refused_unless_shared(tmp_path):
    store = tmp_path / "s"
    mmreplay.collect("CartPole-v1", store, 200, workers=0, seed=0, progress=False)
    with mmreplay.open_store(store, "a") as st:  # a trainer that runs (this process: alive)
        st.record_provenance({"kind": "train", "status": "running", "pid": os.getpid(), "run_dir": "runs/first",
                              "host": os.uname().nodename}, "first-trainer")
    args = ["train", "CartPole-v1", "--store", str(store), "--steps", "300", "--learning-starts", "100",
            "--eval-episodes", "0", "-q"]
    r = CliRunner().invoke(main, [*args, "--run-dir", str(tmp_path / "r1")])
    assert r.exit_code == 1 and "runs/first" in r.output and "--shared-store" in r.output, r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "r1" / "checkpoint.pt").exists()
    r = CliRunner().invoke(main, [*args, "--run-dir", str(tmp_path / "r2"), "--shared-store"])
    assert r.exit_code == 0, r.output


def test_disk_full_on_a_new_store_names_cli_flags_and_leaves_no_store(tmp_path):
    import resource

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    r = _mm("collect", "CartPole-v1", "--store", tmp_path / "d", "--steps", 100, preexec_fn=limit)
    assert r.returncode == 1 and "DiskFullError" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "capacity=" not in r.stderr and "on_full" not in r.stderr and "--" in r.stderr.split("hint:")[1]
    # the worker's DiskFullError (EFBIG) reaches the CLI as that exception: its message, without the errno prefix
    line = next(ln for ln in r.stderr.splitlines() if ln.startswith("worker 0 failed: "))
    assert line.startswith("worker 0 failed: DiskFullError: cannot allocate ") and "[Errno" not in line, r.stderr
    assert line.endswith("File too large (hint: free disk space, or use a smaller --capacity)"), line
    assert not (tmp_path / "d").exists()


def test_bad_numbers_are_usage_errors_in_train_as_in_collect():
    for args in (["train", "CartPole-v1", "--steps", "0"], ["train", "CartPole-v1", "--batch-size", "-1"],
                 ["collect", "CartPole-v1", "--store", "x", "--steps", "0"]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2 and "Invalid value" in r.output, (args, r.output)


def test_add_after_close_says_to_open_a_new_writer(tmp_path):
    st = mmreplay.create_store(tmp_path / "s", mmreplay.Schema.transition(obs_shape=(2,)), capacity=1000)
    w = st.writer()
    w.close()
    with pytest.raises(mmreplay.StoreClosedError, match=r"writer is closed.*store\.writer") as e:
        w.add(obs=np.zeros((1, 2), np.float32), action=[0], reward=[0.0], terminated=[False], truncated=[False])
    assert "fork" not in str(e.value)
    st.close()


def test_a_python_float_reward_takes_the_field_dtype(tmp_path):
    """What a gymnasium env returns (a Python float or int reward) is stored in a float32 field."""
    schema = mmreplay.Schema.transition(obs_shape=(2,))
    assert schema["reward"].dtype == np.float32
    with mmreplay.create_store(tmp_path / "s", schema, capacity=1000) as st:
        with st.writer() as w:
            w.add(obs=np.zeros((1, 2), np.float32), action=[0], reward=[0.1], terminated=[False], truncated=[False])
            w.add(obs=np.zeros((1, 2), np.float32), action=[0], reward=[1], terminated=[True], truncated=[False])
        st.refresh()
        assert np.allclose(st.rows("reward", np.arange(2)), [0.1, 1.0])


def test_import_max_rows_says_segments_come_whole(tmp_path):
    store = tmp_path / "s"
    mmreplay.collect("CartPole-v1", store, 3000, workers=0, seed=0, progress=False, segment_records=1024)
    assert CliRunner().invoke(main, ["export", str(store), str(tmp_path / "a.zarr")]).exit_code == 0
    r = CliRunner().invoke(main, ["import", str(tmp_path / "a.zarr"), "--store", str(tmp_path / "b"),
                                  "--max-rows", "1500"])
    assert r.exit_code == 0, r.output
    m = re.search(r"--max-rows 1,500: the newest whole segments hold ([\d,]+) rows \(a segment is imported whole\)\n"
                  r"imported \d+ segments \(([\d,]+) rows\)", r.output)
    assert m and m.group(1) == m.group(2) and int(m.group(1).replace(",", "")) > 1500, r.output


def test_steps_rounded_up_to_whole_vector_steps_are_said_and_cut_episodes_not_averaged(tmp_path):
    r = CliRunner().invoke(main, ["collect", "CartPole-v1", "--store", str(tmp_path / "s"), "--steps", "10",
                                  "--envs-per-worker", "4", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "stored 12 env steps" in r.output and "rounded up to whole vector steps" in r.output, r.output
    # 3 steps per env copy: no CartPole episode ends that soon; the 4 the end cut are not averaged
    assert "0 episodes, 4 cut by the end of the run, no episode finished)" in r.output, r.output


@pytest.mark.parametrize("what", ["export", "import"])
def test_ctrl_c_in_export_or_import_is_one_line_exit_130_and_the_same_command_continues(tmp_path, what):
    """A Ctrl-C in the middle (sent by the process itself at its 3rd segment, as a failpoint:
    ``MMREPLAY_FAILPOINT_SIGNAL=SIGINT``): exit 130 and one line; what was written is kept, and the
    same command run again completes it to what an uninterrupted run gives."""
    store, archive, back = tmp_path / "s", tmp_path / "a.zarr", tmp_path / "back"
    mmreplay.collect("CartPole-v1", store, 3000, workers=0, seed=0, segment_records=256, progress=False)
    args = ["export", store, "--to", "zarr", archive] if what == "export" else ["import", archive, "--store", back]
    if what == "import":
        assert _mm("export", store, "--to", "zarr", archive).returncode == 0
    env = {**os.environ, "MMREPLAY_FAILPOINT": ("archive_before_commit" if what == "export" else "import_after_build")
           + ":3", "MMREPLAY_FAILPOINT_SIGNAL": "SIGINT"}
    r = _mm(*args, "--no-progress", env=env)
    assert r.returncode == 130, (r.stdout, r.stderr)
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"interrupted: the {what} stopped after") and "the same command continues" in line, line
    r = _mm(*args, "--no-progress")
    assert r.returncode == 0, r.stderr
    assert _mm("verify", archive if what == "export" else back).returncode == 0
    with mmreplay.open_store(store) as src:
        want = src.num_rows
    if what == "export":
        assert f"archive holds 12 segments, {want:,} rows" in r.stdout, r.stdout
    else:
        with mmreplay.open_store(back) as b:
            assert b.num_rows == want
