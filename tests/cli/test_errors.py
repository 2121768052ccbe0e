"""Every user mistake ends in one clear stderr line, exit 1 (2 for usage), no traceback, and
leaves nothing new behind. Each row runs the real CLI in a subprocess; a missing extra is
simulated by blocking its import there (``sys.modules[name] = None``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import mmreplay

_RUN = ("import sys; [sys.modules.__setitem__(m, None) for m in sys.argv[1].split(',') if m]; "
        "sys.argv = ['mmreplay', *sys.argv[2:]]; from mmreplay.cli.main import main; main()")


def _cli(args: list[str], cwd: Path, block: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MMREPLAY_DEBUG"}
    return subprocess.run([sys.executable, "-c", _RUN, ",".join(block), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("store") / "cp"
    mmreplay.collect("CartPole-v1", path, 300, workers=0, seed=0, progress=False)
    return path


def _one_line_error(r: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


# (name, argv with {store} / {file} placeholders, import to block, text the line must hold)
ROWS = [
    ("unknown env (collect)", ["collect", "CartPol-v1", "--store", "new", "--steps", "100"], (),
     "Did you mean: `CartPole`"),
    ("unknown env (train)", ["train", "CartPol-v1", "--store", "new", "--steps", "100", "--run-dir", "run"], (),
     "Did you mean: `CartPole`"),
    ("unknown eval env (train --offline)", ["train", "--offline", "--store", "{store}", "--eval-env", "CartPol-v1",
                                            "--steps", "10", "--run-dir", "run"], (), "Did you mean: `CartPole`"),
    ("Atari without its extra", ["collect", "ALE/Pong-v5", "--store", "new", "--steps", "10"], ("ale_py",),
     "pip install 'mmreplay[atari]'"),
    ("MinAtar without its extra", ["collect", "MinAtar/Breakout-v1", "--store", "new", "--steps", "10"],
     ("minatar", "minatar.gym"), "pip install 'mmreplay[minatar]'"),
    ("export onto a regular file", ["export", "{store}", "--to", "zarr", "{file}"], (), "{file}"),
    ("export to s3 without s3fs", ["export", "{store}", "--to", "zarr", "s3://bucket/cp.zarr"], ("s3fs",),
     "pip install s3fs"),
    ("info of a missing store", ["info", "no/such/store"], (), "`mmreplay collect ENV_ID --store PATH`"),
    ("a missing policy file", ["collect", "CartPole-v1", "--store", "new", "--steps", "100", "--policy",
                               "eps-greedy:missing.pt"], (), "missing.pt does not exist"),
    ("a policy of another env", ["collect", "Acrobot-v1", "--store", "new", "--steps", "100", "--policy",
                                 "eps-greedy:{policy}"], (), "this env has observations {'obs': (6,)} and 3 actions"),
    ("train from a missing store", ["train", "--offline", "--store", "no/such/store", "--eval-env", "CartPole-v1",
                                    "--steps", "10", "--run-dir", "run"], (), "no/such/store"),
    ("train from a missing archive", ["train", "--offline", "--archive", "no/such.zarr", "--eval-env", "CartPole-v1",
                                      "--steps", "10", "--run-dir", "run"], (), "no/such.zarr"),
]


@pytest.fixture(scope="module")
def cartpole_policy(cartpole) -> Path:
    """A CartPole policy file (20 offline updates; made once)."""
    run = cartpole.parent / "run"
    r = _cli(["train", "--offline", "--store", cartpole, "--eval-env", "CartPole-v1", "--steps", "20",
              "--eval-episodes", "0", "--run-dir", run, "-q"], cartpole.parent)
    assert r.returncode == 0, r.stderr
    return run / "policy.pt"


@pytest.mark.parametrize(("name", "argv", "block", "says"), ROWS, ids=[r[0] for r in ROWS])
def test_user_error_is_one_line_and_leaves_nothing(tmp_path, cartpole, cartpole_policy, name, argv, block, says):
    (tmp_path / "a-file").write_text("not a directory")
    fill = {"{store}": str(cartpole), "{file}": str(tmp_path / "a-file")}
    args = [a.replace("{policy}", str(cartpole_policy)) for a in (fill.get(a, a) for a in argv)]
    before, store_before = _tree(tmp_path), _tree(cartpole)
    line = _one_line_error(_cli(args, tmp_path, block))
    assert line.startswith("Error: ") and fill.get(says, says) in line, line
    assert "(hint: " in line and "mmreplay.create_store" not in line, line  # hints name commands, not calls
    assert _tree(tmp_path) == before, f"{name} left {_tree(tmp_path) - before}"
    assert _tree(cartpole) == store_before


def test_store_and_archive_together_is_a_usage_error(tmp_path, cartpole):
    r = _cli(["train", "--offline", "--store", cartpole, "--archive", "x.zarr", "--steps", "10"], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--store and --archive are exclusive" in r.stderr
    assert _tree(tmp_path) == set()


def test_debug_shows_the_traceback(tmp_path):
    r = _cli(["--debug", "info", "no/such/store"], tmp_path)
    assert r.returncode == 1 and "Traceback" in r.stderr and "StoreNotFoundError" in r.stderr


def _mount_tmpfs(mnt: Path, size: str = "16m") -> bool:
    mnt.mkdir()
    return os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                                                capture_output=True).returncode == 0


def test_collect_into_a_store_on_a_read_only_filesystem(tmp_path, cartpole):
    mnt = tmp_path / "ro"
    if not _mount_tmpfs(mnt, "256m"):  # room for the store's preallocated segments
        pytest.skip("needs root and mount")
    try:
        shutil.copytree(cartpole, mnt / "cp")
        assert subprocess.run(["mount", "-o", "remount,ro", str(mnt)]).returncode == 0
        line = _one_line_error(_cli(["collect", "CartPole-v1", "--store", mnt / "cp", "--steps", "10"], tmp_path))
        assert "ReadOnlyStoreError" in line and "no row can be added" in line, line
        assert "mode='a'" not in line and "copy the store to a writable filesystem" in line, line  # no contradiction
    finally:
        subprocess.run(["umount", str(mnt)])


def test_read_only_filesystem_targets_are_one_line(tmp_path, cartpole, cartpole_policy):
    mnt = tmp_path / "ro"
    if not _mount_tmpfs(mnt):
        pytest.skip("needs root and mount")
    try:
        assert subprocess.run(["mount", "-o", "remount,ro", str(mnt)]).returncode == 0
        plotted = tmp_path / "plotted"  # a run with a return to draw (the offline one above evaluated nothing)
        plotted.mkdir()
        from mmreplay.train.runlog import COLUMNS

        row = {c: "" for c in COLUMNS} | {"step": "100", "updates": "1", "time_s": "1", "eval_return": "10",
                                           "eval_std": "0"}
        (plotted / "metrics.csv").write_text(",".join(COLUMNS) + "\n" + ",".join(row[c] for c in COLUMNS) + "\n")
        cases = [
            ["plot", plotted, "--out", mnt / "curve.png"],
            ["export", cartpole, "--to", "zarr", mnt / "cp.zarr"],
            ["train", "--offline", "--store", cartpole, "--eval-env", "CartPole-v1", "--steps", "10",
             "--eval-episodes", "0", "--run-dir", mnt / "run"],
        ]
        for args in cases:
            line = _one_line_error(_cli(args, tmp_path))
            assert "Read-only file system" in line and "writable" in line, line
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mnt)])


def test_saving_priorities_beside_a_read_only_store_is_one_clear_error(tmp_path, cartpole):
    mnt = tmp_path / "ro"
    if not _mount_tmpfs(mnt, "256m"):
        pytest.skip("needs root and mount")
    try:
        shutil.copytree(cartpole, mnt / "cp")
        assert subprocess.run(["mount", "-o", "remount,ro", str(mnt)]).returncode == 0
        with mmreplay.open_store(mnt / "cp", mode="r") as st:
            ps = mmreplay.PrioritizedSampler(st, seed=0)
            with pytest.raises(mmreplay.ReadOnlyStoreError, match="cannot save the priorities") as err:
                ps.save()
            assert "make its directory writable" in str(err.value)
    finally:
        subprocess.run(["umount", str(mnt)])


def test_plot_of_a_run_with_nothing_recorded_writes_nothing(tmp_path):
    from mmreplay.train.runlog import COLUMNS

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.csv").write_text(",".join(COLUMNS) + "\n")
    line = _one_line_error(_cli(["plot", run], tmp_path))
    assert "nothing to plot" in line and "metrics.csv" in line, line
    assert not (run / "learning_curve.png").exists()


def test_a_failed_worker_is_said_from_the_exception_it_raised():
    """``mmreplay collect``'s line for a failed worker comes from the exception object the worker
    sent (``CollectResult.exceptions``): a user error's type, message and CLI hint, whatever its
    traceback text says; a bug's last traceback line; how a worker died, when it raised nothing."""
    import errno
    import pickle

    from mmreplay.cli._errors import worker_failure

    exc = pickle.loads(pickle.dumps(mmreplay.DiskFullError("cannot allocate 8 bytes for s/x.seg: File too large",
                                                           err=errno.EFBIG)))
    text = "Traceback (most recent call last):\n  ...\nmmreplay.core.errors.DiskFullError: [Errno 27] ... (hint: lower capacity=)\n"
    assert worker_failure(text, exc) == ("DiskFullError: cannot allocate 8 bytes for s/x.seg: File too large "
                                         "(hint: free disk space, or use a smaller --capacity)")
    assert worker_failure("Traceback (most recent call last):\n  ...\nRuntimeError: boom\n",
                          RuntimeError("boom")) == "RuntimeError: boom"
    assert worker_failure("worker 1 died (signal 9)", None) == "worker 1 died (signal 9)"


def test_a_dopamine_import_of_a_wrong_directory_says_what_to_pass_not_to_export(tmp_path):
    (tmp_path / "empty").mkdir()
    line = _one_line_error(_cli(["import", tmp_path / "empty", "--from", "dopamine", "--store", tmp_path / "s"],
                                tmp_path))
    assert "replay_logs" in line and "mmreplay export" not in line, line
    assert not (tmp_path / "s").exists()


def test_a_missing_env_package_is_said_once_with_the_extra_that_brings_it(tmp_path):
    pytest.importorskip("gymnasium")
    try:
        import mujoco  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("MuJoCo is installed here")
    line = _one_line_error(_cli(["collect", "Hopper-v5", "--store", tmp_path / "s", "--steps", "10"], tmp_path))
    assert line.count("pip install") == 1 and "mmreplay[mujoco]" in line, line
    assert not (tmp_path / "s").exists()


def test_train_inputs_that_cannot_work_make_nothing(tmp_path):
    """A Box-action env for online DQN: no empty store left at --store; an empty store offline: no
    run directory."""
    line = _one_line_error(_cli(["train", "Pendulum-v1", "--store", tmp_path / "p", "--steps", "100"], tmp_path))
    assert "Discrete action space" in line and not (tmp_path / "p").exists(), line
    mmreplay.create_store(tmp_path / "e", mmreplay.Schema.transition(obs_shape=(4,)), capacity=1000).close()
    line = _one_line_error(_cli(["train", "--offline", "--store", tmp_path / "e", "--eval-env", "CartPole-v1",
                                 "--steps", "10", "--run-dir", tmp_path / "run"], tmp_path))
    assert "holds no rows to train from" in line and not (tmp_path / "run").exists(), line
