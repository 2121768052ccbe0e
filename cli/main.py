"""``mmreplay`` commands. Each parses options, calls one library function and prints.

torch and gymnasium are imported inside the commands that need them, so ``mmreplay --help``
stays fast.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from collections.abc import Iterator

import click

import mmreplay

from ._errors import friendly
from ._progress import _PROGRESS, _progress


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(mmreplay.__version__, prog_name="mmreplay")
@click.option("--debug", is_flag=True, help="Show the traceback of an error (also: MMREPLAY_DEBUG=1).")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """mmreplay: a memory-mapped, persistent, crash-safe replay store for RL.

    \b
    Examples:
      mmreplay info /data/cartpole
      mmreplay info /data/cartpole --json
      mmreplay verify /data/cartpole --repair
      mmreplay --debug info /data/cartpole     # a traceback instead of the one-line error
    """
    ctx.obj = {"debug": debug}


@contextlib.contextmanager
def _quiet(logger: str, on: bool) -> Iterator[None]:
    """Raise ``logger``'s level to ERROR for the block (when ``on``)."""
    log = logging.getLogger(logger)
    level = log.level
    if on:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


@main.command()
@click.argument("path", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@friendly
def info(path: str, as_json: bool) -> None:
    """Show a store's schema, rows, transitions, episodes, segments, size, tiers and writers.

    \b
    Examples:
      mmreplay info /data/cartpole
      mmreplay info /data/cartpole --json | jq .rows
    """
    with mmreplay.open_store(path, mode="r", on_corrupt="skip") as store:
        data = store.info()
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(f"store        {data['path']}")
    click.echo(f"rows         {data['rows']:,}  (capacity {data['capacity']:,})")
    click.echo(f"transitions  {data['transitions']:,}")
    click.echo(f"episodes     {data['episodes']:,} ended ({data['episodes_terminated']:,} terminated, "
               f"{data['episodes_truncated']:,} truncated by the env, {data['episodes_cut']:,} cut by the end of a "
               f"run), {data['episodes_incomplete']:,} incomplete (a writer stopped mid-episode)")
    click.echo(
        f"segments     {data['segments']} ({data['segments_open']} open, {data['evicted_segments']} evicted), "
        f"{data['segment_records']:,} rows / {_human_bytes(data['segment_bytes'])} each"
    )
    if data["evictions"]:
        click.echo("evicted      " + ", ".join(f"{n} for {why}" for why, n in sorted(data["evictions"].items())))
    if data["lost_segments"]:
        lost = data["lost_segments"]
        click.echo(f"LOST         {len(lost)} segment file(s), {sum(lost.values()):,} rows: {_short_list(sorted(lost))} "
                   "(not evicted; run `mmreplay verify`)", err=True)
    if data["damaged_rows"]:
        left = data["damaged_rows"] - data["masked_rows"]
        click.echo(f"damaged      {data['damaged_rows']:,} row(s) fail their checksums: masked, left out of every batch "
                   f"with the {data['transitions_left_out']:,} transition(s) that need them"
                   + (f" ({data['masked_rows']:,} recorded by a repair)" if data["masked_rows"] else "")
                   + (f" (run `mmreplay verify {path}`)" if left > 0 else ""), err=left > 0)
    click.echo(f"on disk      {_human_bytes(data['bytes_on_disk'])} allocated in {data['segment_files']} segment "
               f"file(s) (preallocated; spares included); the rows use {_human_bytes(data['bytes_used'])}")
    t = data["tiers"]
    hot, warm, ram = t["hot"], t["warm"], t["ram"]
    click.echo(f"tiers        hot:  {hot['open_segments']} open segment(s), {_human_bytes(hot['bytes'])} "
               f"({_human_bytes(hot['in_ram_bytes'])} in RAM)")
    click.echo(f"             warm: {warm['sealed_segments']} sealed segment(s), {_human_bytes(warm['bytes'])} "
               f"({_human_bytes(warm['page_cache_bytes'])} in the page cache)")
    ratio = f"{t['store_to_ram']:.2f}x RAM" if t["store_to_ram"] is not None else "RAM unknown"
    click.echo(f"             RAM {_human_bytes(ram['total_bytes'])} ({_human_bytes(ram['available_bytes'])} available); "
               f"store is {ratio}: sample with mode={t['suggested_mode']!r}")
    ids = data["writers"]
    click.echo(f"writers      {len(ids)}" + (f" (ids {', '.join(map(str, ids))})" if ids else ""))
    click.echo("schema")
    width = max(len(f["name"]) for f in data["schema"])
    for f in data["schema"]:
        click.echo(f"  {f['name']:<{width}}  {f['dtype']:<8} {tuple(f['shape'])}")
    for name, why in data["unreadable_segments"].items():  # one line each
        hint = "" if "mmreplay verify" in str(why) else " (run `mmreplay verify`)"
        click.echo(_one_line(f"unreadable   {name}: {why}{hint}"))
    if data["metadata"]:
        click.echo(f"metadata     {json.dumps(data['metadata'])}")
    for run in data["provenance"]:  # one line per run: what made the data, and how it ended
        steps = run.get("steps_stored", run.get("steps"))
        click.echo(_one_line(f"run          {run['name']}: {run.get('kind', '?')} {run.get('env_id', '')} "
                             f"policy={run.get('policy', '?')} seed={run.get('seed', '?')} "
                             f"steps={'?' if steps is None else steps} status={run.get('status', '?')}"))


def _short_list(names: list[str], most: int = 5) -> str:
    """``a, b, c`` or ``a, b, c, d, e and 12 more``: a line stays readable."""
    head = ", ".join(names[:most])
    return head if len(names) <= most else f"{head} and {len(names) - most} more"


def _one_line(text: str) -> str:
    """``text`` on one line: a record's fields are printed as they are, and one may hold a newline."""
    return "".join(c if c.isprintable() else " " for c in text)


@main.command()
@click.argument("path", type=click.Path(file_okay=False))
@click.option("--fast", is_flag=True, help="Check sealed segments by the crc of their stamp column only (their payload "
              "is not read; a segment whose stamps differ from its seal is checked in full).")
@click.option("--repair", is_flag=True, help="Recover dead writers' segments, write back damaged stamps and control "
              "slots, mask damaged rows (the good rows of their segments are kept) and quarantine segments whose "
              "header is damaged. Never removes a file that holds a row; exits 1 if rows are lost or quarantined.")
@_PROGRESS
@friendly
def verify(path: str, fast: bool, repair: bool, progress: bool | None) -> None:
    """Check headers, control slots, stamps and checksums of every segment; exit 1 if anything is wrong.

    PATH may also be an archive (a zarr group `mmreplay export` wrote, a path or URL): every chunk
    of every segment is checked against its crc32c and the chunk manifest (a missing chunk too).

    Damaged rows are masked (present in the file, never served); lost rows are held by no file
    any more. Notes cost nothing (e.g. an eviction a killed writer left for the next writable
    open to finish) and do not fail the check.

    \b
    Examples:
      mmreplay verify /data/cartpole
      mmreplay verify /data/cartpole --fast
      mmreplay verify /data/cartpole --repair
      mmreplay verify /data/cartpole.zarr          # an archive
    """
    if "://" in path or ((Path(path) / "zarr.json").exists() and not (Path(path) / "STORE.json").exists()):
        _verify_archive(path, repair)
        return
    mode = "a" if repair else "r"
    notes: list = []
    lost = 0
    # verify reads every row itself: no background check of segments it is about to read anyway; a repair
    # prints what the open's recovery did with its own actions, so the open's one-line warning is not repeated
    with _quiet("mmreplay.storage.store", repair), \
            mmreplay.open_store(path, mode=mode, on_corrupt="skip", check_at_open=False) as store:
        if repair:
            rep = store.repair()
            for a in rep.actions:
                click.echo(f"repaired: {a}")
            problems = rep.problems
            lost = rep.rows_cost
            if rep.actions:
                click.echo(f"repair: {rep.rows_masked:,} row(s) masked, {rep.rows_quarantined:,} quarantined, "
                           f"{rep.rows_lost:,} lost")
        else:
            with _progress(progress, "segment") as cb:
                problems = store.verify(fast=fast, notes=notes, progress=cb)
        masked = store.masked_rows()
    for n in notes:
        click.echo(f"note: {n}")
    for p in problems:
        click.echo(f"problem: {p}")
    if problems or lost:
        raise SystemExit(1)
    click.echo(f"ok: {path}" + (f" ({masked:,} damaged row(s) masked by a repair: left out of every batch)"
                                 if masked else "")
               + (" (fast: stamp columns checked against their seals; payloads not read)" if fast else ""))


def _verify_archive(url: str, repair: bool) -> None:
    """``mmreplay verify`` of an archive: every chunk against its codec's crc32c and the chunk manifest."""
    if repair:
        raise click.UsageError("--repair applies to a store; an archive is repaired by exporting the store again "
                               "(or importing what verifies: `mmreplay import URL --store PATH`)")
    rep = mmreplay.verify_archive(url)
    for n in rep.notes:
        click.echo(f"note: {n}")
    for p in rep.problems:
        click.echo(f"problem: {p}")
    if rep.problems:
        raise SystemExit(1)
    click.echo(f"ok: {url} ({rep.segments:,} segment(s), {rep.rows:,} rows: every chunk as the export wrote it)")


from .archive import export_cmd, import_cmd  # noqa: E402
from .collect import collect_cmd  # noqa: E402
from .train import plot_cmd, train_cmd  # noqa: E402

for _cmd, _name in ((collect_cmd, "collect"), (train_cmd, "train"), (plot_cmd, "plot"), (export_cmd, "export"),
                    (import_cmd, "import")):
    main.add_command(_cmd, _name)
