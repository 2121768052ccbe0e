"""``mmreplay export`` and ``mmreplay import``: a thin layer over mmreplay.archive, .minari and .dopamine."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from ._errors import friendly
from ._progress import _PROGRESS, _progress


@contextmanager
def _stoppable(what: str, kept: str, progress: Any) -> Iterator[Any]:
    """Around an export or import: Ctrl-C or SIGTERM stops it with one line saying what is kept
    (whole segments: the archive or the store counts a segment only once it is written) and that
    the same command continues; exit 130 / 143, as ``collect`` and ``train``. Yields the progress
    callback to pass on (it records how far the run got, and draws ``progress``'s bar)."""
    from mmreplay.actors import Interrupts

    done = [0]

    def record(n: int, total: int) -> None:
        done[0] = n
        if progress is not None:
            progress(n, total)

    with Interrupts() as it:
        try:
            yield record
        except KeyboardInterrupt:
            click.echo(f"interrupted: the {what} stopped after {done[0]:,} rows; {kept}, and the same command "
                       "continues where it stopped", err=True)
            sys.exit(128 + int(it.signal or signal.SIGINT))


@click.command("export")
@click.argument("path", type=click.Path(file_okay=False))
@click.argument("target")
@click.option("--to", "fmt", type=click.Choice(["zarr", "minari"]), default="zarr", show_default=True,
              help="zarr: TARGET is a path or fsspec URL; minari: TARGET is a dataset id.")
@click.option("--include-open", is_flag=True, help="zarr: also export the rows of open segments.")
@click.option("--clevel", type=click.IntRange(1, 9), default=3, show_default=True, help="zarr: zstd level.")
@click.option("--no-verify", is_flag=True, help="zarr: do not check row checksums before archiving.")
@_PROGRESS
@friendly
def export_cmd(path: str, target: str, fmt: str, include_open: bool, clevel: int, no_verify: bool,
               progress: bool | None) -> None:
    """Export the store at PATH to a zarr v3 archive or a Minari dataset.

    A second zarr export into the same TARGET appends only new segments, and an interrupted
    one resumes where it stopped. An s3:// TARGET takes its keys and endpoint from the environment
    (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL_S3 for MinIO, Ceph...).

    \b
    Examples:
      mmreplay export /data/pong --to zarr /archive/pong.zarr
      mmreplay export /data/pong --to zarr s3://bucket/pong.zarr --include-open
      mmreplay export /data/cartpole --to minari mmreplay/cartpole/random-v0
    """
    if fmt == "zarr":
        from mmreplay.archive import export_archive

        with _progress(progress, "row") as bar, _stoppable("export", "every segment it wrote is in the archive",
                                                            bar) as cb:
            r = export_archive(path, target, include_open=include_open, clevel=clevel, verify=not no_verify,
                               progress=cb)
        e = r.episodes
        click.echo(f"exported {r.segments_written} segments ({r.rows_written:,} rows) to {r.url}; "
                   f"archive holds {r.segments} segments, {r.rows:,} rows"
                   + (f", episodes: {e['terminated']:,} terminated, {e['truncated']:,} truncated by the env, "
                      f"{e['cut']:,} cut by the end of a run, {e['incomplete']:,} incomplete" if e else "")
                   + (f"; {r.damaged_rows:,} damaged row(s) archived masked, in {r.episodes_masked:,} episode(s) "
                      "marked so" if r.damaged_rows else ""))
    else:
        from mmreplay.interop.minari import export_minari

        with _progress(progress, "episode") as cb:
            try:
                m = export_minari(path, target, progress=cb)
            except ImportError as exc:
                raise click.ClickException(str(exc)) from None
        click.echo(f"exported {m.episodes:,} episodes ({m.steps:,} steps) to Minari dataset {m.dataset_id}"
                   + (f"; left out {m.skipped} episodes ({m.skipped - m.masked} incomplete, {m.masked} holding a "
                      "damaged row)" if m.skipped else ""))


@click.command("import")
@click.argument("source")
@click.option("--store", "store_path", required=True, type=click.Path(file_okay=False),
              help="Store to create (zarr: or an earlier import of the same archive, to resume or update it).")
@click.option("--from", "fmt", type=click.Choice(["zarr", "minari", "dopamine"]), default="zarr", show_default=True,
              help="zarr: SOURCE is an archive path or URL; minari: a dataset id; dopamine: a checkpoint directory.")
@click.option("--max-rows", type=click.IntRange(1), default=None,
              help="zarr: import only the newest whole segments holding at least this many rows (a segment is "
                   "never split: its row ids stay the archived ones).")
@click.option("--checkpoints", default=None, help="dopamine: checkpoint numbers, e.g. 0,1,2 (default: all).")
@click.option("--stack-size", type=click.IntRange(1), default=4, show_default=True,
              help="dopamine: frame-stack size the buffer was written with.")
@_PROGRESS
@friendly
def import_cmd(source: str, store_path: str, fmt: str, max_rows: int | None, checkpoints: str | None,
               stack_size: int, progress: bool | None) -> None:
    """Create a store at --store from a zarr archive, a Minari dataset or Dopamine checkpoints.

    An s3:// SOURCE takes its keys and endpoint from the environment (AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL_S3 for MinIO, Ceph...).

    \b
    Examples:
      mmreplay import /archive/pong.zarr --store /data/pong
      mmreplay import D4RL/door/human-v2 --from minari --store /data/door
      mmreplay import ./dqn-replay/Pong/1/replay_logs --from dopamine --store /data/pong-dqn
    """
    if fmt == "zarr":
        from mmreplay.archive import import_archive

        with _progress(progress, "row") as bar, _stoppable("import", f"every segment it wrote is in {store_path}",
                                                            bar) as cb:
            r = import_archive(source, store_path, max_rows=max_rows, progress=cb)
        for line in r.lines():  # segments a missing or damaged chunk cost (their rows masked, or not imported)
            click.echo(f"problem: {line}", err=True)
        if max_rows is not None and r.rows > max_rows:
            click.echo(f"--max-rows {max_rows:,}: the newest whole segments hold {r.rows:,} rows (a segment is "
                       "imported whole)")
        click.echo(f"imported {r.segments_written} segments ({r.rows_written:,} rows) into {r.path}; "
                   f"it holds {r.segments} archived segments, {r.rows:,} rows")
        if r.masked or r.skipped:  # what the archive lost is not in the store as data: said, and exit 1
            raise SystemExit(1)
    elif fmt == "minari":
        from mmreplay.interop.minari import import_minari

        with _progress(progress, "episode") as cb:
            try:
                m = import_minari(source, store_path, progress=cb)
            except ImportError as exc:
                raise click.ClickException(str(exc)) from None
        click.echo(f"imported {m.episodes:,} episodes ({m.steps:,} steps) from {m.dataset_id} into {store_path}")
    else:
        from mmreplay.interop.dopamine import import_dopamine

        try:
            ns = [int(x) for x in checkpoints.split(",")] if checkpoints else None
        except ValueError:
            raise click.BadParameter(f"expected comma-separated numbers, got {checkpoints!r}",
                                     param_hint="--checkpoints") from None
        with _progress(progress, "transition") as cb:
            d = import_dopamine(source, store_path, checkpoints=ns, stack_size=stack_size, progress=cb)
        click.echo(f"imported {d.transitions:,} transitions of checkpoints {list(d.checkpoints)} into {d.path}: "
                   f"{d.rows:,} rows, {d.episodes:,} episode ends, {d.padding:,} padding transitions dropped")
