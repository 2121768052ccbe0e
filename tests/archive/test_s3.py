"""Archives on a real S3 API (moto's server on loopback, see _s3.py): export and incremental
export, ``open_archive`` and ``import_archive``, ``field_stats``, shipping from actors' archives to a
learner, the CLI (which reaches a custom endpoint through the ``AWS_*`` environment variables),
and the failures: an endpoint gone mid-export (a rerun resumes to the same archive), a wrong key
and a missing bucket, each one line through the CLI."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _s3 import S3Bucket, S3Server, forget_clients, moto_s3
from click.testing import CliRunner

import mmreplay
from mmreplay.archive import export_archive, import_archive, open_archive
from mmreplay.core.errors import ObjectStoreError
from mmreplay.stats import field_stats
from mmreplay.cli.main import main
from mmreplay.cluster import archive_urls, ingest_archives


R = 128  # segment_records: 600 CartPole steps fill 4 segments and part of a fifth

pytestmark = pytest.mark.usefixtures("s3_server")


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    with moto_s3(tmp_path_factory.mktemp("aws")) as server:
        yield server


@pytest.fixture
def s3(s3_server: S3Server) -> Iterator[S3Bucket]:
    """A fresh bucket on the module's server."""
    yield S3Bucket(s3_server, s3_server.bucket())
    forget_clients()


def _collect(path: Path, steps: int = 600, seed: int = 0) -> None:
    mmreplay.collect("CartPole-v1", path, steps, workers=0, seed=seed, segment_records=R, progress=False)


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cartpole") / "cp"
    _collect(path)
    return path


@pytest.fixture(scope="module")
def archive(s3_server, cartpole) -> tuple[str, dict[str, Any]]:
    """``cartpole`` exported once to a bucket of this module, as a Ray actor ships it (into
    ``<root>/actor-NNN-<store uuid>``, root ``s3://<bucket>/run``): its URL and storage_options."""
    with mmreplay.open_store(cartpole) as st:
        name = f"actor-000-{st.store_uuid.hex()}"
    url, options = f"s3://{s3_server.bucket()}/run/{name}", s3_server.options()
    rep = export_archive(cartpole, url, storage_options=options)
    assert rep.segments == 5 and rep.rows == 601
    return url, options


def _arrays(url: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """What an archive holds that two exports of one store must agree on (not its random uuid)."""
    import zarr

    g = zarr.open_group(url, mode="r", storage_options=options) if options else zarr.open_group(url, mode="r")
    names = ["is_last", "is_first", "episode", "masked", "segment_table", *(f"fields/{k}" for k in g.attrs["fields"])]
    return {"committed": g.attrs["committed"], "episodes": g.attrs.get("episodes"),
            **{name: g[name][:] for name in names}}


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]), err_msg=name)


def _assert_same_transitions(a: mmreplay.ReplayStore, b: mmreplay.ReplayStore) -> None:
    ids = a.transition_ids()
    np.testing.assert_array_equal(ids, b.transition_ids())
    xa, xb = a.transitions(ids), b.transitions(ids)
    for f in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "ids"):
        np.testing.assert_array_equal(getattr(xa, f), getattr(xb, f), err_msg=f)


# -- the data paths ------------------------------------------------------------------------------
def test_export_to_s3_then_only_new_segments(tmp_path, s3, cartpole):
    """The second export, of the rows collected since, is `mmreplay export`'s: the CLI takes no
    storage option, it reaches moto through the AWS_* variables the fixture set (as
    docs/integrations.md says)."""
    path, url = tmp_path / "cp", s3.url("inc.zarr")
    shutil.copytree(cartpole, path)
    first = export_archive(path, url, storage_options=s3.options)
    assert (first.segments_written, first.segments, first.rows) == (5, 5, 601)
    assert export_archive(path, url, storage_options=s3.options).segments_written == 0
    _collect(path, 300, seed=1)  # a new writer session: new segments only
    with mmreplay.open_store(path) as st:
        segments, rows = len(st.segments()), st.num_rows
    assert os.environ["AWS_ENDPOINT_URL"] == s3.server.endpoint
    r = CliRunner().invoke(main, ["export", str(path), "--to", "zarr", url, "--no-progress"])
    assert r.exit_code == 0, r.output
    assert f"exported {segments - 5} segments ({rows - 601} rows)" in r.output and segments > 5, r.output
    assert f"archive holds {segments} segments, {rows} rows" in r.output, r.output
    export_archive(path, tmp_path / "once.zarr")  # one export of the same store, on the local disk
    _assert_same(_arrays(url, s3.options), _arrays(str(tmp_path / "once.zarr"), None))


def test_open_archive_and_import_from_s3_serve_the_stores_transitions(tmp_path, archive, cartpole):
    url, options = archive
    with mmreplay.open_store(cartpole) as src:
        with open_archive(url, tmp_path / "cache", storage_options=options) as arc:
            assert arc.mode == "r" and arc.num_rows == src.num_rows
            for kw in ({}, {"n_step": 3, "gamma": 0.9}):
                a = mmreplay.UniformSampler(src, seed=7, **kw).sample(64)
                b = mmreplay.UniformSampler(arc, seed=7, **kw).sample(64)
                for f in ("obs", "action", "reward", "next_obs", "terminated", "ids"):
                    np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
            _assert_same_transitions(src, arc)
        rep = import_archive(url, tmp_path / "dst", storage_options=options)
        assert (rep.segments_written, rep.rows) == (5, 601)
        with mmreplay.open_store(tmp_path / "dst") as dst:
            _assert_same_transitions(src, dst)


def test_field_stats_of_the_s3_archive_equal_the_stores(tmp_path, archive, cartpole):
    url, options = archive
    a = field_stats(url, "obs", storage_options=options, cache=tmp_path / "cache")
    b = field_stats(cartpole, "obs", cache=False)
    assert a.count == b.count == 576
    for k in ("mean", "std", "min", "max"):
        np.testing.assert_allclose(getattr(a, k), getattr(b, k), rtol=1e-12, err_msg=k)
    assert field_stats(url, storage_options=options, cache=tmp_path / "cache").key == a.key  # cached


def test_shipping_through_s3_ingests_every_row_once(tmp_path, archive, cartpole):
    """Two actors' archives under one root (``archive`` is actor 0's): the learner's store takes
    every row of both once; a second call takes nothing."""
    first, options = archive
    root = first.rsplit("/", 1)[0]
    _collect(tmp_path / "actor-1", 400, seed=3)
    with mmreplay.open_store(tmp_path / "actor-1") as st:
        second = f"{root}/actor-001-{st.store_uuid.hex()}"
    export_archive(tmp_path / "actor-1", second, storage_options=options)
    assert archive_urls(root, options) == archive_urls(root + "/", options) == [first, second]
    assert archive_urls(second, options) == [second]
    want = {}
    for path in (cartpole, tmp_path / "actor-1"):
        with mmreplay.open_store(path) as st:
            schema, want[path] = st.schema, (st.num_rows, len(st.transition_ids()))
    with mmreplay.create_store(tmp_path / "learner", schema, capacity=100_000, segment_records=R) as learner:
        rep = ingest_archives(learner, root, storage_options=options)
        learner.refresh()
        assert rep.rows == learner.num_rows == sum(n for n, _ in want.values()) and rep.archives == 2
        assert len(learner.transition_ids()) == sum(t for _, t in want.values())  # sessions chain as in the actors
        again = ingest_archives(learner, root, storage_options=options)
        assert (again.rows, again.segments, again.archives) == (0, 0, 2)


def test_the_cli_imports_and_trains_from_s3_through_the_environment(tmp_path, archive, s3_server):
    """No storage option on the command line: the keys and the endpoint are the AWS_* variables
    the fixture set (AWS_ENDPOINT_URL names moto), as docs/integrations.md says."""
    url, _ = archive
    assert os.environ["AWS_ENDPOINT_URL"] == s3_server.endpoint
    r = CliRunner().invoke(main, ["import", url, "--store", str(tmp_path / "dst"), "--no-progress"])
    assert r.exit_code == 0 and "imported 5 segments (601 rows)" in r.output, r.output
    r = CliRunner().invoke(main, ["train", "--offline", "--archive", url, "--algo", "bc", "--eval-env", "CartPole-v1",
                                  "--steps", "20", "--eval-episodes", "0", "--run-dir", str(tmp_path / "run"), "-q"])
    assert r.exit_code == 0 and "updates      20" in r.output, r.output
    assert (tmp_path / "run" / "policy.pt").exists()
    r = CliRunner().invoke(main, ["verify", url])  # every chunk against the chunk manifest, over the S3 API
    assert r.exit_code == 0 and "ok:" in r.output and "5 segment(s)" in r.output, r.output


# -- failures ------------------------------------------------------------------------------------
_RUN = "import sys; sys.argv = ['mmreplay', *sys.argv[1:]]; from mmreplay.cli.main import main; main()"


def _invoke(args: list[Any]) -> str:
    """Run the CLI in this process; return its one line (exit 1, no traceback)."""
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (r.output, r.exception)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "(hint: " in lines[0], r.output
    return lines[0]


def _cli(args: list[Any], cwd: Path, **env: str) -> str:
    """Run the real CLI in a process of its own (its own logging, its real stderr); return its one
    stderr line (exit 1, no traceback)."""
    full = {**{k: v for k, v in os.environ.items() if k != "MMREPLAY_DEBUG"}, **env}
    r = subprocess.run([sys.executable, "-c", _RUN, *map(str, args)], cwd=cwd, env=full, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "(hint: " in lines[0], r.stderr
    return lines[0]


def _free_port() -> int:
    """A loopback port nothing listens on (connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_export_cut_by_an_outage_resumes_to_the_same_archive(tmp_path, s3, cartpole, archive):
    """The endpoint goes away after the first segment is committed (moto's HTTP server stopped
    from the export's progress callback): the export fails within seconds (botocore's attempts
    and timeouts bounded) having committed one segment; with the endpoint back on the same port
    (moto keeps the objects) a rerun writes the other four and leaves what one export left."""
    url, server = s3.url("cut.zarr"), s3.server
    stopped = []

    def cut(done: int, total: int) -> None:
        if not stopped:
            stopped.append(done)
            server.stop()

    t0 = time.monotonic()
    try:
        with pytest.raises(ObjectStoreError, match=re.escape(url)) as info:  # botocore's, naming the archive
            export_archive(cartpole, url, storage_options=s3.options, progress=cut)
        took = time.monotonic() - t0
    finally:
        server.start()
    assert stopped == [R] and took < 20, took
    from mmreplay.cli._errors import describe

    what, hint = describe(info.value)  # what the CLI prints: one line naming the archive and the endpoint
    assert "cannot be reached" in what and url in what and server.endpoint in what and "AWS_ENDPOINT_URL" in hint
    assert _arrays(url, s3.options)["committed"] == {"segments": 1, "rows": R}
    resumed = export_archive(cartpole, url, storage_options=s3.options)
    assert (resumed.segments_written, resumed.segments, resumed.rows) == (4, 5, 601)
    _assert_same(_arrays(url, s3.options), _arrays(*archive))  # `archive`: the same store exported in one go


def test_a_wrong_key_is_refused_in_one_line(tmp_path, archive, s3_server, cartpole):
    url, _ = archive
    key, secret = s3_server.iam_key()
    with s3_server.iam_auth():
        assert archive_urls(url, s3_server.options(key, secret)) == [url]  # a right key still reads
        wrong = s3_server.options("wrong", secret)
        for call in (lambda: export_archive(cartpole, url, storage_options=wrong),
                     lambda: import_archive(url, tmp_path / "x", storage_options=wrong),
                     lambda: field_stats(url, storage_options=wrong, cache=False),
                     lambda: archive_urls(url, wrong)):
            with pytest.raises(ObjectStoreError, match="refused the credentials"):  # naming the archive
                call()
        line = _cli(["import", url, "--store", tmp_path / "dst"], tmp_path, AWS_ACCESS_KEY_ID="wrong")
    assert line.startswith(f"Error: ObjectStoreError: {url}: the object store refused the credentials"), line
    assert "AWS_ACCESS_KEY_ID" in line and not (tmp_path / "dst").exists() and not (tmp_path / "x").exists()


def test_a_missing_bucket_is_one_line(tmp_path, s3, cartpole):
    url = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/a.zarr"
    for call in (lambda: export_archive(cartpole, url, storage_options=s3.options),
                 lambda: import_archive(url, tmp_path / "x", storage_options=s3.options),
                 lambda: open_archive(url, storage_options=s3.options),
                 lambda: field_stats(url, storage_options=s3.options, cache=False)):
        with pytest.raises(ObjectStoreError, match=re.escape(f"{url}: no such bucket")):  # (an ArchiveError)
            call()
    assert not (tmp_path / "x").exists()
    assert archive_urls(url.rsplit("/", 1)[0], s3.options) == []  # a shipping root not made yet: nothing yet
    line = _invoke(["export", cartpole, "--to", "zarr", url, "--no-progress"])
    assert line.startswith(f"Error: ObjectStoreError: {url}: no such bucket") and "create the bucket" in line, line
    line = _cli(["train", "--offline", "--archive", url, "--eval-env", "CartPole-v1", "--steps", "5",
                 "--run-dir", tmp_path / "run"], tmp_path)  # without -q: train logs at INFO, botocore must not
    assert line.startswith(f"Error: ObjectStoreError: {url}: no such bucket"), line
    assert not (tmp_path / "run").exists()


def test_an_unreachable_endpoint_is_one_line(tmp_path, s3, cartpole, monkeypatch):
    dead = f"http://127.0.0.1:{_free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    forget_clients()  # a client made earlier keeps the endpoint of its time
    for args in (["export", cartpole, "--to", "zarr", s3.url("a.zarr"), "--no-progress"],
                 ["import", s3.url("a.zarr"), "--store", tmp_path / "dst", "--no-progress"]):
        line = _invoke(args)
        assert line.startswith(f"Error: ObjectStoreError: {s3.url('a.zarr')}: the object store cannot be "
                               "reached"), line
        assert dead in line and "AWS_ENDPOINT_URL" in line
    assert not (tmp_path / "dst").exists()


def test_the_library_names_the_archive_in_an_object_store_error(tmp_path, archive, s3_server):
    """The library raises an object store's refusal as ``ObjectStoreError`` naming the archive URL
    (``mmreplay.archive.remote``), with what to check."""
    url, _ = archive
    with s3_server.iam_auth(), pytest.raises(mmreplay.MMReplayError, match=re.escape(url)):
        import_archive(url, tmp_path / "x", storage_options=s3_server.options("wrong"))
