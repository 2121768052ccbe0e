"""``mmreplay collect``: fill a store from gymnasium environments with worker processes."""

from __future__ import annotations

import sys
from typing import Any

import click

from ._errors import describe, friendly, one_line, worker_failure


@click.command("collect")
@click.argument("env_id")
@click.option("--store", "store", required=True, type=click.Path(file_okay=False),
              help="Store directory; created from the env's spaces if missing, appended to if it exists.")
@click.option("--steps", type=click.IntRange(min=1), required=True, help="Env steps to store in total.")
@click.option("--workers", type=click.IntRange(min=0), default=1, show_default=True,
              help="Worker processes (spawned), each with its own vector env and writer; 0 runs in this process.")
@click.option("--envs-per-worker", type=click.IntRange(min=1), default=1, show_default=True,
              help="Env copies in each worker's vector env (the writer's lanes).")
@click.option("--policy", default="random", show_default=True,
              help="random | eps-greedy:CHECKPOINT[:EPS] (a policy file from `mmreplay train`) | "
                   "gaussian:POLICY[:STD] (the actor of a Box-action offline run, Gaussian noise of std STD "
                   "in [-1, 1] action units; 0: deterministic).")
@click.option("--seed", type=int, default=None, help="Base seed (default: random; recorded in the store).")
@click.option("--atari/--no-atari", default=None,
              help="DQN Atari preprocessing, single 84x84 frames (default: on for ALE/ ids).")
@click.option("--terminal-on-life-loss", is_flag=True, help="Atari: end an episode when a life is lost.")
@click.option("--capacity", type=click.IntRange(min=1), default=1_000_000, show_default=True,
              help="Rows kept when creating the store (oldest segments are evicted beyond it).")
@click.option("--segment-records", type=click.IntRange(min=1), default=None,
              help="Rows per segment file when creating the store [about 32 MiB]; a store holds up to --capacity "
                   "plus one segment per worker (per env for frame rows with lane segments, README 'Lanes') and one more, so "
                   "use segments well below a small capacity.")
@click.option("--durability", type=click.Choice(["process", "segment", "batch"]), default="segment", show_default=True,
              help="What a crash can lose; see README 'Guarantees'.")
@click.option("--max-episode-steps", type=click.IntRange(min=1), default=None, help="Truncate episodes at T steps.")
@click.option("--autoreset", "autoreset_mode", type=click.Choice(["next-step", "same-step", "disabled"]),
              default="next-step", show_default=True, help="The vector env's autoreset mode (all store the same data).")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: when stderr is a terminal).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None, metavar="[ADDRESS]",
              help="Run the workers as Ray actors (pip install 'mmreplay[ray]'): on the cluster at ADDRESS "
                   "('auto', 'ray://head:10001'), or on a local Ray instance without one. Put it after ENV_ID.")
@click.option("--ray-archive", default=None, metavar="URL",
              help="With --ray: where actors export sealed segments for the store to ingest; a path or fsspec URL "
                   "every node reaches. [STORE.archive; required with an ADDRESS]")
@friendly
def collect_cmd(env_id: str, **options: Any) -> None:
    """Run ENV_ID with worker processes and store every step in a replay store.

    Collecting twice into one store, or from two terminals at once, adds data. Ctrl-C stops every
    worker; everything already written is kept and a summary is printed.

    \b
    Examples:
      mmreplay collect CartPole-v1 --store /data/cartpole --steps 50000 --workers 2 --envs-per-worker 8
      mmreplay collect ALE/Pong-v5 --store /data/pong --steps 200000 --workers 2 --envs-per-worker 4
      mmreplay collect CartPole-v1 --store /data/mediocre --steps 50000 --policy eps-greedy:run/policy.pt:0.6
      mmreplay collect Hopper-v5 --store /data/hopper-more --steps 100000 --policy gaussian:runs/td3bc/policy.pt:0.1
      mmreplay collect CartPole-v1 --store /data/cp --steps 200000 --workers 4 --ray
    """
    env, writer, run, ship = collect_specs(env_id, options)
    _against_the_store(options)
    if ship is not None:
        from mmreplay.cluster import run_ray_collect

        result = run_ray_collect(env, writer, run, ship)
    else:
        from mmreplay.actors import run_collect

        try:
            result = run_collect(env, writer, run)
        except ValueError as exc:  # checked before any worker starts or any store is made
            if describe(exc) is not None:
                raise
            raise click.ClickException(one_line(str(exc), "see `mmreplay collect --help`")) from None
    _summary(result, options["store"], options["steps"], run.envs_per_worker, ray=ship is not None)


def _against_the_store(o: dict[str, Any]) -> None:
    """Options that cannot apply, said in the options' terms before anything runs: a
    ``--segment-records`` other than an existing store's (a usage error), a ``--capacity`` given for
    an existing store (a note: it keeps its own), more ``--workers`` than cores (a note)."""
    import mmreplay
    from mmreplay.storage import usable_cores

    cores = usable_cores()
    if o["workers"] > cores:
        click.echo(f"note: --workers {o['workers']} on {cores} core(s): each worker is a process with its own envs "
                   "and segment files; past the cores they take turns (fewer workers with more --envs-per-worker "
                   "step faster)", err=True)
    try:
        with mmreplay.open_store(o["store"], mode="r", check_at_open=False) as st:
            records, capacity = st.segment_records, st.capacity
    except mmreplay.MMReplayError:  # no store yet (or one the run itself will report on)
        return
    if o["segment_records"] is not None and o["segment_records"] != records:
        raise click.BadParameter(f"{o['segment_records']:,}: the store at {o['store']} has {records:,} rows per "
                                 "segment, set when it was made (leave --segment-records out to add to it, or "
                                 "collect into a new --store)", param_hint="--segment-records")
    source = click.get_current_context().get_parameter_source("capacity")
    if source is click.core.ParameterSource.COMMANDLINE and o["capacity"] != capacity:
        click.echo(f"note: --capacity applies to a new store: {o['store']} keeps its capacity of {capacity:,} rows",
                   err=True)


def collect_specs(env_id: str, o: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """The run's specs from ``mmreplay collect``'s options, the one place they are read: an EnvSpec,
    a WriterSpec, a CollectSpec and, with ``--ray``, a ShipSpec (else ``None``). Usage errors name
    the option."""
    from mmreplay.actors import CollectSpec, EnvSpec, PolicySpec, WriterSpec

    try:
        policy = PolicySpec.parse(o["policy"])
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--policy") from None
    env = EnvSpec(env_id, atari=o["atari"], max_episode_steps=o["max_episode_steps"],
                  autoreset_mode=o["autoreset_mode"].replace("-", "_"),
                  terminal_on_life_loss=o["terminal_on_life_loss"])
    writer = WriterSpec(o["store"], capacity=o["capacity"], segment_records=o["segment_records"],
                        durability=o["durability"])
    ship = None
    if o["ray_address"] is not None:
        from mmreplay.cluster import ShipSpec

        if o["segment_records"] is not None:
            raise click.UsageError("--segment-records is set by --ray (actors ship small segments)")
        address = None if o["ray_address"] == "local" else o["ray_address"]
        if address is not None and o["ray_archive"] is None:
            raise click.UsageError("--ray ADDRESS needs --ray-archive: a shared path or URL every node reaches")
        ship = ShipSpec(o["ray_archive"] or f"{o['store'].rstrip('/')}.archive", address=address)
    workers = max(o["workers"], 1) if ship is not None else o["workers"]
    run = CollectSpec(o["steps"], workers=workers, envs_per_worker=o["envs_per_worker"], policy=policy,
                      seed=o["seed"], progress=o["progress"])
    return env, writer, run, ship


def _summary(result: Any, store: str, steps: int, envs_per_worker: int, *, ray: bool) -> None:
    """Print what the run stored, its warnings and errors; exit 130 / 143 if interrupted, 1 on errors."""
    rets = result.episode_returns
    mean = (f"mean return of last {min(len(rets), 100)}: {sum(rets[-100:]) / len(rets[-100:]):.2f}" if rets
            else "no episode finished")
    state = "interrupted" if result.interrupted else ("finished with errors" if result.errors else "done")
    from mmreplay.storage import disk_footprint

    disk = disk_footprint(store)  # (zero when the run made no store, or removed the one it could not fill)
    allocated, files = disk.bytes_on_disk, disk.segment_files
    click.echo(f"{state}: stored {result.steps:,} env steps ({result.transitions:,} transitions, "
               f"{result.episodes:,} episodes, {result.episodes_cut:,} cut by the end of the run, {mean}) "
               f"in {result.seconds:.1f} s, {result.steps_per_s:,.0f} steps/s, "
               f"{result.bytes_written / 2**20:,.1f} MiB of rows; seed {result.seed}; store {store}: "
               f"{allocated / 2**20:,.1f} MiB allocated on disk in {files} segment file(s)")
    if result.steps > steps and not result.interrupted:
        click.echo(f"note: --steps {steps:,} is rounded up to whole vector steps ({envs_per_worker} env(s) per worker "
                   f"step together): {result.steps:,} env steps stored")
    _disk_pressure(disk.evictions.get("disk", 0))
    if ray:
        restarts = sum(result.restarts.values())
        click.echo(f"shipped through {result.archive}: {result.rows_ingested:,} rows ingested into {store}"
                   + (f"; {restarts} actor restart(s)" if restarts else ""))
    for w, text in sorted(result.errors.items()):
        click.echo(f"worker {w} failed: {worker_failure(text, result.exceptions.get(w))}", err=True)
    if result.interrupted:
        sys.exit(128 + (result.signal or 2))  # 130 after Ctrl-C, 143 after SIGTERM
    if result.errors:
        sys.exit(1)


def _disk_pressure(evicted: int) -> None:
    """One line when a full disk made the store evict below its capacity (``evicted`` segments)."""
    if evicted:
        click.echo(f"warning: the disk was full: {evicted} segment(s) were evicted to make room, so the store "
                   f"holds fewer rows than its capacity (free disk space, or collect with a smaller --capacity)",
                   err=True)
