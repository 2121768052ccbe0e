"""Every command answers after any crash, whatever the store's records, leftovers or catalog look
like: ``info``, ``info --json``, ``verify``, ``verify --repair``, ``export``, ``collect`` and
``train --offline`` exit 0, 1 or 2, never with a traceback, and the same on a second run; one
line, at most, says what is odd.

One oddity at a time, on a copy of a small store (301 CartPole rows in 3 segments of 128): what
a kill -9, a power loss, an older or newer version or a stray hand leaves in ``provenance/``,
``segments/``, ``ingest.tmp/`` or ``CATALOG.log``. A record's fields are data written by other
processes, possibly killed mid-way: their readers accept any JSON shape. Each command runs twice
in-process (``CliRunner``; ``collect --workers 0`` runs its worker here too, so a worker's
exception would surface as this process's traceback). A line is "about the oddity" when the
command's run on the pristine store does not say it (numbers and paths made alike). Last, kill -9 of
a real ``collect --workers 2``, right after its run's record is written and at a random moment.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from crc32c import crc32c

import mmreplay
from mmreplay.cli.main import main
from mmreplay.storage.catalog import CATALOG, Catalog, _line

# -- the oddities: each changes one thing in a store ------------------------------------------------

NO_PID = 2**22 + 7
"""Above Linux's largest ``pid_max``: the pid of no process (a run recorded as running is dead)."""


def _record(store: Path, data: bytes | str, name: str = "odd") -> None:
    (store / "provenance" / f"{name}.json").write_bytes(data.encode() if isinstance(data, str) else data)


def _run_record(store: Path) -> Path:
    (run,) = [p for p in (store / "provenance").glob("*.json") if ".w" not in p.name]
    return run


def _edit_run(**fields: object) -> Callable[[Path], None]:
    """The run's own record with ``fields`` in place."""

    def edit(store: Path) -> None:
        run = _run_record(store)
        rec = json.loads(run.read_text())
        rec.update(fields)
        run.write_text(json.dumps(rec))

    return edit


def _edit_worker(**fields: object) -> Callable[[Path], None]:
    """The (first) worker's record with ``fields`` in place."""

    def edit(store: Path) -> None:
        (w,) = (store / "provenance").glob("*.w000.json")
        rec = json.loads(w.read_text())
        rec.update(fields)
        w.write_text(json.dumps(rec))

    return edit


def _killed_before_workers(workers: object) -> Callable[[Path], None]:
    """A kill -9 of ``collect --workers 2`` after the run's record was written, before its workers'."""

    def edit(store: Path) -> None:
        for w in (store / "provenance").glob("*.w*.json"):
            w.unlink()
        _edit_run(workers=workers, status="running", pid=NO_PID)(store)

    return edit


def _segments(store: Path) -> list[Path]:
    return sorted((store / "segments").glob("*.seg"))


def _next_segment_name(store: Path) -> str:
    last = _segments(store)[-1].name
    return f"{int(last[:13]) + 1:013d}{last[13:]}"


def _leftover(suffix: str, *, hidden: bool = False, data: bytes = b"") -> Callable[[Path], None]:
    def edit(store: Path) -> None:
        name = _next_segment_name(store) + suffix
        (store / "segments" / (f".{name}" if hidden else name)).write_bytes(data)

    return edit


def _departed(event: str, suffix: str) -> Callable[[Path], None]:
    """A sealed segment whose departure is in the catalog, renamed ``suffix`` (``.deleted``: an
    eviction killed before the unlink; ``.corrupt``: a quarantine)."""

    def edit(store: Path) -> None:
        seg = _segments(store)[1]
        Catalog(store).departed(seg.name, event, "capacity" if event == "evicted" else None)
        seg.rename(seg.with_name(seg.name + suffix))

    return edit


def _good_crc(body: bytes) -> bytes:
    """A catalog line whose crc matches ``body``, whatever it holds."""
    return b"%08x %s\n" % (crc32c(body), body)


def _catalog_lines(*events: dict[str, object] | bytes) -> Callable[[Path], None]:
    """Append lines to the catalog: events with a good crc (``seg`` defaults to the first segment's
    name, ``seg=None`` leaves it out), or raw bytes."""

    def edit(store: Path) -> None:
        first = _segments(store)[0].name
        with open(store / CATALOG, "ab") as fh:
            for e in events:
                if isinstance(e, dict):
                    e = _line({k: v for k, v in {"seg": first, **e}.items() if v is not None})
                fh.write(e)

    return edit


def _truncate_catalog(store: Path) -> None:
    data = (store / CATALOG).read_bytes()
    (store / CATALOG).write_bytes(data[: len(data) - 20])


def _empty_segment_file(store: Path) -> None:
    """The newest segment file, created but its size never reached the disk (a power loss)."""
    (store / "segments" / _next_segment_name(store)).write_bytes(b"")


def _ingest_leftover(store: Path) -> None:
    d = store / "ingest.tmp"
    d.mkdir()
    (d / _next_segment_name(store)).write_bytes(b"\0" * 4096)
    (d / "junk").write_bytes(b"x")


ODDITIES: dict[str, Callable[[Path], None]] = {
    "none": lambda store: None,
    # provenance records
    "record not JSON": lambda s: _record(s, b"\x00\xffnot json{"),
    "record empty": lambda s: _record(s, b""),
    "record a list": lambda s: _record(s, '[1, 2, {"kind": "collect"}]'),
    "record a number": lambda s: _record(s, "42"),
    "record a string": lambda s: _record(s, '"collect"'),
    "record nested past the parser's depth": lambda s: _record(s, "[" * 100_000 + "]" * 100_000),
    "record a directory": lambda s: (s / "provenance" / "x.json").mkdir(),
    "workers an int (killed before the workers' records)": _killed_before_workers(2),
    "workers a string": _killed_before_workers("two"),
    "workers a list of non-dicts": _killed_before_workers([1, "w", None, [2]]),
    "cut_rows a string": _edit_worker(cut_rows="299"),
    "cut_rows a list of strings, None and others": _edit_worker(cut_rows=["299", None, "x", 1.5, [3], 2**70, -1]),
    "steps a string (run died)": lambda s: (_edit_worker(steps="300", episodes=None)(s),
                                            _edit_run(status="running", pid=NO_PID)(s)),
    "status a number": _edit_run(status=3),
    "status a list, a worker's": lambda s: (_edit_worker(status=["running"])(s),
                                           _edit_run(status="running", pid=NO_PID)(s)),
    "pid a string": _edit_run(status="running", pid="1234"),
    "pid out of range": lambda s: (_edit_worker(status="running", pid=2**70)(s),
                                   _edit_run(status="running", pid=-1)(s)),
    "host a number": _edit_run(status="running", host=7),
    "name and run of other types": lambda s: (_edit_run(name=5, kind=[1])(s), _edit_worker(run=["x"], worker="w")(s)),
    "fields with newlines": _edit_run(env_id="Cart\nPole", policy="a\nb", status="x\ny"),
    # leftovers in segments/ and the store's directory
    ".tmp": _leftover(".tmp", hidden=True, data=b"\0" * 100),
    ".deleted": _departed("evicted", ".deleted"),
    ".corrupt": _departed("quarantined", ".corrupt"),
    "odd file name": lambda s: (s / "segments" / "notes.txt").write_text("hello"),
    "odd segment-like name": lambda s: (s / "segments" / "00000000000x9-w000.seg").write_bytes(b"\0" * 64),
    "a directory named like a segment": lambda s: (s / "segments" / _next_segment_name(s)).mkdir(),
    "empty segment file (power loss)": _empty_segment_file,
    "leftover ingest.tmp/": _ingest_leftover,
    # the catalog
    "catalog garbage lines": _catalog_lines(b"garbage\n", b"\x00\x01\x02\n", b"zzzzzzzz {}\n", b"12345678 x\n"),
    "catalog rows a string": _catalog_lines({"e": "sealed", "rows": "128"}),
    "catalog id an int": _catalog_lines({"e": "checked", "id": 7, "bad": []}),
    "catalog bad a string": _catalog_lines({"e": "masked", "id": [1, 2, 3, 4], "bad": "0-4"}),
    "catalog seg missing": _catalog_lines({"e": "sealed", "rows": 128, "seg": None}),
    "catalog seg a number": _catalog_lines({"e": "evicted", "seg": 7, "why": "capacity"}),
    "catalog fields of other types": _catalog_lines(
        {"e": "checked", "bad": []}, {"e": "checked", "id": [1, 2], "bad": [[1], [1, "2"], 5, [3, 1]]},
        {"e": ["sealed"], "rows": 1}, {"e": "evictions", "why": "capacity", "n": "3", "seg": None},
        {"e": "evicted", "why": ["disk"]}, {"e": "sealed", "rows": 1, "seg": "../x"},
        _good_crc(b"[1]"), _good_crc(b"7"), _good_crc(b"[" * 100_000)),
    "catalog truncated last line": _truncate_catalog,
    "catalog missing": lambda s: (s / CATALOG).unlink(),
}

# -- running the commands -----------------------------------------------------------------------------


class _Said(logging.Handler):
    """The warnings mmreplay logs while a command runs (each is a line on stderr outside pytest)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines += [ln for ln in record.getMessage().splitlines() if ln.strip()]


def _invoke(args: list[str]) -> tuple[Result, list[str]]:
    """Run the CLI in-process: its result and every line it said (output, then logged warnings)."""
    said, logger = _Said(), logging.getLogger("mmreplay")
    logger.addHandler(said)
    try:
        r = CliRunner().invoke(main, args)
    finally:
        logger.removeHandler(said)
    return r, [ln for ln in r.output.splitlines() if ln.strip()] + said.lines


def _same(line: str, store: Path) -> str:
    """A line with the store's folder, run names, numbers and sizes made alike (what differs between
    two stores)."""
    line = line.replace(str(store), "STORE").replace(str(store.parent), "TMP")
    line = re.sub(r"\d{8}T\d{6}\.\d{9}Z-\d+-[0-9a-f]{6}", "RUN", line)
    return re.sub(r"[\d.,]+( ?[KMGT]?i?B)?", "#", line)


def _commands(store: Path, tmp: Path) -> list[tuple[str, Callable[[int], list[str]]]]:
    """Each command, as argv for its ``k``-th run (export and train into a fresh target each time)."""
    s = str(store)
    return [
        ("info", lambda k: ["info", s]),
        ("info --json", lambda k: ["info", s, "--json"]),
        ("verify", lambda k: ["verify", s]),
        ("export", lambda k: ["export", s, "--to", "zarr", str(tmp / f"out{k}.zarr")]),
        ("train", lambda k: ["train", "--offline", "--store", s, "--algo", "bc", "--steps", "3", "--eval-episodes",
                             "0", "--hidden", "8", "--batch-size", "8", "--run-dir", str(tmp / f"run{k}"), "-q",
                             "--no-tensorboard", "--device", "cpu", "--no-loader"]),
        ("collect", lambda k: ["collect", "CartPole-v1", "--store", s, "--steps", "50", "--seed", "0", "--workers", "0",
                               "--no-progress"]),
    ]


READ_ONLY = ("info", "info --json", "verify", "export", "train")
"""Commands that change nothing a second run reads: it answers the same."""

@pytest.fixture(autouse=True, scope="module")
def _no_fsync() -> Iterator[None]:
    """Durability is not what is tested here (tests/fault is where power losses are): the commands'
    fsyncs, most of a small collect's time, are skipped in this process."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", lambda fd: None)
        yield


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """301 rows (300 CartPole steps and the final observation) in 3 segments of 128."""
    path = tmp_path_factory.mktemp("odd") / "s"
    r = CliRunner().invoke(main, ["collect", "CartPole-v1", "--store", str(path), "--steps", "300",
                                  "--segment-records", "128", "--seed", "0", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert len(_segments(path)) == 3
    return path


def _repair(store: Path) -> list[tuple[str, Callable[[int], list[str]]]]:
    return [("verify --repair", lambda k: ["verify", str(store), "--repair"])]


@pytest.fixture(scope="module")
def baseline(base: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """What each command says of the store as it is (lines made alike): the lines an oddity adds to."""
    out: dict[str, set[str]] = {}
    tmp = tmp_path_factory.mktemp("baseline")
    store = tmp / "s"
    shutil.copytree(base, store)
    for name, argv in _commands(store, tmp) + _repair(store):
        for k in range(2):
            r, said = _invoke(argv(k))
            assert r.exit_code == 0, (name, r.output)
            out.setdefault(name, set()).update(_same(ln, store) for ln in said)
    return out


def _check(name: str, args: list[str], store: Path, baseline: dict[str, set[str]], *, lines: bool = True) -> int:
    """Run one command: exit 0, 1 or 2, no traceback, and (``lines``) at most one line the pristine
    store's run does not say (a logged warning counts); returns the exit code."""
    r, said = _invoke(args)
    assert r.exit_code in (0, 1, 2), (name, r.exit_code, r.output)
    assert r.exception is None or isinstance(r.exception, SystemExit), (name, r.output, r.exc_info)
    assert "Traceback" not in r.output, (name, r.output)
    if name == "info --json":  # the data as it is, records included: JSON, whatever they hold
        if r.exit_code == 0:
            json.loads(r.output)
        return r.exit_code
    new = [ln for ln in said if _same(ln, store) not in baseline[name]]
    if name == "verify --repair":  # its summary comes with what it did
        new = [ln for ln in new if not ln.startswith("repair: ")]
    if name == "info":  # the odd record's own run line (its fields are printed as they are, on one line)
        new = [ln for ln in new if not ln.startswith("run          ")]
    assert not lines or len(new) <= 1, (name, new)
    return r.exit_code


def _odd_copy(base: Path, tmp: Path, oddity: str) -> Path:
    store = tmp / "s"
    shutil.copytree(base, store)
    ODDITIES[oddity](store)
    return store


@pytest.mark.parametrize("oddity", list(ODDITIES))
def test_every_command_answers_whatever_the_store_holds(oddity: str, base: Path, baseline: dict[str, set[str]],
                                                         tmp_path: Path) -> None:
    """Each command twice in a row on the oddity (collect last: it writes); ``verify --repair`` twice
    on a copy of the oddity as it was left, then ``info`` and ``verify`` of what it left."""
    store = _odd_copy(base, tmp_path, oddity)
    fresh = tmp_path / "r"
    shutil.copytree(store, fresh)
    for name, argv in _commands(store, tmp_path) + _repair(fresh):
        where = fresh if name == "verify --repair" else store
        codes = [_check(name, argv(k), where, baseline, lines=True) for k in range(2)]
        assert name not in READ_ONLY or codes[0] == codes[1], (name, codes)
    for name, argv in _commands(fresh, tmp_path)[:3]:
        _check(name, argv(0), fresh, baseline)


def test_info_of_a_run_killed_before_its_workers_wrote_records(base: Path, tmp_path: Path) -> None:
    """The run's record says ``workers: 2`` (a count) and no worker record exists: ``store.info()``,
    ``info``, ``info --json``, ``export`` and ``verify`` read it; the run is told ``died``."""
    store = _odd_copy(base, tmp_path, "workers an int (killed before the workers' records)")
    with mmreplay.open_store(store, mode="r") as st:
        info = st.info()
    (run,) = info["provenance"]
    assert run["status"] == "died" and run["workers"] == 2 and info["episodes_cut"] == 0
    for args in (["info", str(store)], ["info", str(store), "--json"],
                 ["export", str(store), "--to", "zarr", str(tmp_path / "a.zarr")], ["verify", str(store)]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0 and r.exception is None, (args, r.output)
    assert json.loads(CliRunner().invoke(main, ["info", str(store), "--json"]).output)["rows"] == info["rows"]


# -- kill -9 of a collect with two workers --------------------------------------------------------------


def _killed_collect(store: Path, until: Callable[[subprocess.Popen[bytes]], bool]) -> bool:
    """Start ``collect --workers 2`` (a long one), wait until ``until`` returns, kill -9 its process
    group (the parent and its workers); returns what ``until`` did."""
    p = subprocess.Popen([sys.executable, "-m", "mmreplay", "collect", "CartPole-v1", "--store", str(store),
                          "--steps", "10000000", "--workers", "2", "--segment-records", "4096", "--no-progress"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        return until(p)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the workers are gone too
            try:
                os.killpg(p.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.01)


def _records(store: Path, p: subprocess.Popen[bytes], worker: bool) -> list[str]:
    """Once the run's record (``worker``: a worker's record too) is there, the records' names."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and p.poll() is None:
        names = sorted(f.name for f in (store / "provenance").glob("*.json"))
        if names and (not worker or any(".w" in n for n in names)):
            return names
        time.sleep(0.002)
    raise AssertionError(f"no record appeared (exit {p.poll()})")


def _answers(store: Path, tmp: Path, what: str) -> None:
    """``info``, ``info --json``, ``export`` and ``verify``, twice: exit 0 or 1, no traceback."""
    for k in range(2):
        out = str(tmp / f"{store.name}-{k}.zarr")
        for args in (["info", str(store)], ["info", str(store), "--json"], ["export", str(store), "--to", "zarr", out],
                     ["verify", str(store)]):
            r = CliRunner().invoke(main, args)
            assert r.exit_code in (0, 1), (what, args, r.output)
            assert r.exception is None or isinstance(r.exception, SystemExit), (what, args, r.exc_info)
            assert "Traceback" not in r.output, (what, args, r.output)


def test_commands_answer_after_kill_9_of_collect_with_two_workers(tmp_path: Path) -> None:
    """kill -9 of ``collect --workers 2`` right after its run's record is written (before the workers'
    records: the state the crash in ``cut_rows`` came from; the workers take about a second to
    start), then, on the same store, at a random moment while its workers write; after each,
    ``info``, ``info --json``, ``export`` and ``verify`` exit 0 or 1 with no traceback, twice."""
    for attempt in range(3):  # a machine stalled for the workers' whole start misses the moment: again
        store = tmp_path / f"s{attempt}"
        if _killed_collect(store, lambda p: all(".w" not in n for n in _records(store, p, worker=False))):
            break
    else:
        raise AssertionError("the workers' records came with the run's, three times")
    _answers(store, tmp_path, "kill -9 before the workers' records")
    info = json.loads(CliRunner().invoke(main, ["info", str(store), "--json"]).output)
    assert [(run["status"], run["workers"]) for run in info["provenance"]] == [("died", 2)], info["provenance"]

    pause = random.uniform(0.0, 0.5)

    def writing(p: subprocess.Popen[bytes]) -> bool:
        _records(store, p, worker=True)
        time.sleep(pause)
        return True

    _killed_collect(store, writing)
    _answers(store, tmp_path, f"kill -9 {pause:.3f} s after a worker's first record")
