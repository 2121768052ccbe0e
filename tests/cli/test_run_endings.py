"""Every way a ``collect`` run can end, through the CLI: ``info --json``'s episode counts agree with
the rows themselves (read back from a zarr export) and with what a Minari export leaves out, and
the run's record says how it ended."""

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
from mmreplay.archive import export_archive
from mmreplay.cli.main import main

LIMIT = 15  # --max-episode-steps: an episode the env truncates has exactly this many steps


def _collect(store: Path, steps: int, workers: int = 2) -> list[str]:
    return [sys.executable, "-m", "mmreplay", "collect", "CartPole-v1", "--store", str(store), "--steps", str(steps),
            "--workers", str(workers), "--envs-per-worker", "4", "--max-episode-steps", str(LIMIT), "--seed", "3",
            "--no-progress"]


def _wait_for_rows(store: Path, p: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until a segment of the store holds a published row (the workers are appending)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert p.poll() is None, p.communicate()
        if (store / "segments").is_dir():
            try:
                with mmreplay.open_store(store) as st:
                    if st.num_rows > 2000:
                        return
            except mmreplay.MMReplayError:
                pass
        time.sleep(0.05)
    raise AssertionError("the collect wrote nothing")


def _end(how: str, store: Path) -> tuple[int, str]:
    """Run a collect and end it ``how``; its exit status and stdout."""
    if how in ("normal", "steps mid-episode"):
        steps, workers = (400, 0) if how == "normal" else (203, 2)  # 203: rounded up to whole vector steps
        p = subprocess.run(_collect(store, steps, workers), capture_output=True, text=True, timeout=120)
        return p.returncode, p.stdout
    p = subprocess.Popen(_collect(store, 10**9), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        _wait_for_rows(store, p)
        if how == "SIGINT":
            p.send_signal(signal.SIGINT)
        elif how == "SIGTERM":
            p.send_signal(signal.SIGTERM)
        elif how == "kill -9 (all)":
            os.killpg(p.pid, signal.SIGKILL)
        else:  # kill -9 of the parent only: its workers see it gone, stop and close
            p.kill()
        out, _ = p.communicate(timeout=60)
        if how.startswith("kill -9"):  # until every worker is gone (and reaped)
            deadline = time.monotonic() + 30
            while _alive_in(p.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        return p.returncode, out
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


def _alive_in(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _from_rows(archive: Path) -> dict[str, int]:
    """Episode categories worked out from the exported rows alone: episode ids, final observations
    and the step flags (a cut episode is stored truncated before the env's time limit)."""
    import zarr

    g = zarr.open_group(str(archive), mode="r")
    ep = np.asarray(g["episode"][:])
    last = np.asarray(g["is_last"][:], bool)
    term = np.asarray(g["fields"]["terminated"][:], bool)
    trunc = np.asarray(g["fields"]["truncated"][:], bool)
    assert not np.asarray(g["masked"][:], bool).any()
    ok = ep >= 0
    ep, last, term, trunc = ep[ok], last[ok], term[ok], trunc[ok]
    ids = np.unique(ep)
    closed = np.isin(ids, ep[last])  # the episode has its final observation
    steps = ~last
    order = np.arange(len(ep))
    last_step = np.full(ids.max() + 1, -1)
    np.maximum.at(last_step, ep[steps], order[steps])
    length = np.bincount(ep[steps], minlength=ids.max() + 1)
    keep = length[ids] > 0  # a lane's first row alone (its worker stopped before a step) is no episode
    ids, closed = ids[keep], closed[keep]
    k = last_step[ids]
    t_end, tr_end, n = term[k], trunc[k], length[ids]
    return {"episodes_terminated": int((closed & t_end).sum()),
            "episodes_truncated": int((closed & ~t_end & tr_end & (n == LIMIT)).sum()),
            "episodes_cut": int((closed & ~t_end & tr_end & (n < LIMIT)).sum()),
            "episodes_incomplete": int((~closed | ~(t_end | tr_end)).sum())}


ENDINGS = [  # how, exit status, run status, episodes cut?, episodes left incomplete?
    ("normal", 0, "done", True, False),
    ("steps mid-episode", 0, "done", True, False),
    ("SIGINT", 130, "interrupted", True, False),
    ("SIGTERM", 143, "interrupted", True, False),
    ("kill -9 (all)", -9, "died", False, True),
    ("kill -9 (parent)", -9, "interrupted", True, False),
]


@pytest.mark.parametrize("how, rc, status, cut, incomplete", ENDINGS, ids=[e[0] for e in ENDINGS])
def test_episode_counts_agree_however_a_collect_ends(tmp_path, monkeypatch, how, rc, status, cut, incomplete):
    pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    store = tmp_path / "s"
    code, out = _end(how, store)
    assert code == rc, out
    r = CliRunner().invoke(main, ["info", str(store), "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    rep = export_archive(store, tmp_path / "a.zarr", include_open=True)
    truth = _from_rows(tmp_path / "a.zarr")
    got = {k: info[k] for k in truth}
    assert got == truth, (how, got, truth)
    import zarr  # the archive's metadata says the same (and the export's report)

    kinds = {k.removeprefix("episodes_"): v for k, v in truth.items()}
    assert rep.episodes == kinds and zarr.open_group(str(tmp_path / "a.zarr"), mode="r").attrs["episodes"] == kinds
    assert info["episodes"] == truth["episodes_terminated"] + truth["episodes_truncated"] + truth["episodes_cut"]
    assert (info["episodes_cut"] > 0) == cut and (info["episodes_incomplete"] > 0) == incomplete, info
    assert info["episodes_truncated"] > 0 and info["episodes_terminated"] > 0
    (run,) = [rec for rec in info["provenance"] if rec.get("kind") != "worker"]  # its workers are folded in
    assert run.get("status") == status, run
    if code in (0, 130, 143):  # the summary counts the episodes that ended on their own
        m = re.search(r" transitions, ([\d,]+) episodes, ([\d,]+) cut by the end of the run,", out)
        assert m, out
        n, c = (int(g.replace(",", "")) for g in m.groups())
        assert (n, c) == (truth["episodes_terminated"] + truth["episodes_truncated"], truth["episodes_cut"]), out

    from mmreplay.interop.minari import export_minari

    m = export_minari(store, f"mmreplay/test-{how.replace(' ', '').replace('(', '').replace(')', '')}-v0")
    assert m.episodes == info["episodes"] and m.skipped == info["episodes_incomplete"], (m, info)
