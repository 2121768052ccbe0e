"""``mmreplay train`` and ``mmreplay plot``: one option per setting of the run
(:class:`mmreplay.train.TrainConfig` and its groups) and of every registered algorithm's config,
written from those dataclasses: the flag from the setting's name, the type from its annotation,
the help from its docstring, the bracketed default from the presets (``config_for`` per env family).

Every option defaults to "not given", so a run's config is the preset (``mmreplay.train.config_for``)
or, with ``--resume``, the config saved in the run's checkpoint, with only the options given on the
command line changed. torch is imported inside the command bodies, so ``mmreplay --help`` stays fast.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any

import click

from ._errors import describe, friendly, one_line


def _hidden(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        widths = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated layer widths like 256,256, got {value!r}") from None
    if not widths or min(widths) < 1:
        raise click.BadParameter(f"expected positive layer widths like 256,256, got {value!r}")
    return widths


class _Algo(click.ParamType):
    """A registered algorithm's name, checked when the command runs (an algorithm registered after
    the CLI loaded is accepted too)."""

    name = "algo"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        from mmreplay.train import algorithm_names

        return "[" + "|".join(algorithm_names()) + "]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from mmreplay.train import algorithm_names

        if value not in algorithm_names():
            self.fail(f"{value!r} is not one of {', '.join(algorithm_names())}", param, ctx)
        return str(value)


# How a setting is spelled on the command line where the rule (``--setting-name``; a bool as
# ``--x/--no-x``) does not say it, and types the annotation does not give. Defaults and help are
# never written here: they come from the configs (``mmreplay.train``: field docstrings, presets).
_DECLS: dict[str, tuple[str, ...]] = {
    "offline": ("--offline/--online",), "prioritized": ("--prioritized/--uniform",),
    "iql_deterministic": ("--iql-deterministic/--iql-gaussian",), "learning_rate": ("--learning-rate", "--lr"),
}
_FLAGS = {"resume", "shared_store", "atari", "amp", "compile", "cuda_graphs", "profile"}  # on when given
_EXTRA: dict[str, dict[str, Any]] = {
    "store": dict(type=click.Path(file_okay=False)), "run_dir": dict(type=click.Path(file_okay=False)),
    "algo": dict(type=_Algo()), "hidden": dict(type=str, callback=_hidden, metavar="W1,W2"),
    "ray": dict(type=str, is_flag=False, flag_value="local", metavar="[ADDRESS]"),
    "ray_archive": dict(type=str, metavar="URL"), "cache_bytes": dict(type=click.IntRange(min=1)),
}
_HELP_MORE = {  # what an option's docstring cannot say: the CLI's own spelling
    "archive": " s3:// reads AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL_S3.",
    "ray": " (after ENV_ID)",
}
_SWITCHES = {"algo", "offline", "atari", "minatar"}  # the options that pick a preset: their help says how
_SKIP = {"env_id"}  # the ENV_ID argument


def _settings() -> list[tuple[str, Any, str]]:
    """``(name, annotation, docstring)`` of every setting: TrainConfig's and its groups' fields, then
    each registered algorithm's (a name shared by several algorithms once)."""
    import dataclasses
    import typing

    from mmreplay.train import algorithm_names, get_algorithm
    from mmreplay.train import SETTING_GROUPS as GROUPS
    from mmreplay.train import TrainConfig, field_help

    out: list[tuple[str, Any, str]] = []
    seen = set(GROUPS) | _SKIP
    algos = {n: get_algorithm(n).config for n in algorithm_names()}
    for cls in [TrainConfig, *GROUPS.values(), *algos.values()]:
        hints, docs = typing.get_type_hints(cls), field_help(cls)
        for f in dataclasses.fields(cls):
            if f.name not in seen:
                seen.add(f.name)
                doc = docs.get(f.name, "")
                owners = [n for n, c in algos.items() if f.name in c.field_names()]
                if owners and len(owners) < len(algos):  # an algorithm's own setting: whose
                    doc = f"{', '.join(owners)}: {doc}"
                out.append((f.name, str if f.name == "algo" else hints[f.name], doc))
    return out


def _click_type(annotation: Any) -> Any:
    """The click type of a setting's annotation (``X | None`` as ``X``; a Literal as a Choice)."""
    import types
    import typing

    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if typing.get_origin(annotation) is typing.Literal:
        return click.Choice([str(a) for a in typing.get_args(annotation)])
    return {int: click.INT, float: click.FLOAT, str: click.STRING, bool: bool}.get(annotation, click.STRING)


def _help_text(doc: str) -> str:
    """The help of a setting: its docstring, reST markup dropped; past ~200 characters its first
    sentence only (a period outside parentheses)."""
    text = " ".join(doc.replace("``", "").split())
    if len(text) <= 200:
        return text
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch == "." and depth == 0 and text[i + 1: i + 2] in (" ", ""):
            return text[: i + 1]
    return text


def _option(name: str, annotation: Any, doc: str) -> Any:
    """The click option of setting ``name``: flag names by the rule (or ``_DECLS``), type from the
    annotation (or ``_EXTRA``), help from its docstring, the default the presets give."""
    flag = "--" + name.replace("_", "-")
    kind = _click_type(annotation)
    kw: dict[str, Any] = dict(default=None, show_default=False)
    if name in _FLAGS:
        decls, kw = _DECLS.get(name, (flag,)), {**kw, "is_flag": True}
    elif kind is bool:
        decls = _DECLS.get(name, (f"{flag}/--no-{flag[2:]}",))
    else:
        decls, kw = _DECLS.get(name, (flag,)), {**kw, "type": kind}
    kw.update(_EXTRA.get(name, {}))
    text = _help_text(doc) + _HELP_MORE.get(name, "")
    if name == "algo":  # the registry's own words for each algorithm
        from mmreplay.train import algorithm_names, get_algorithm
        from mmreplay.train import DEFAULT_ALGO

        text = "; ".join(f"{n}: {get_algorithm(n).summary}" for n in algorithm_names()) + f". [{DEFAULT_ALGO}]"
    shown = None if name in _SWITCHES or kw.get("is_flag") else preset_defaults(name)
    kw["help"] = f"{text} {shown}" if shown else text
    return click.option(*decls, **kw)


def _shown(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, tuple):
        return ",".join(map(str, v))
    return str(v)


@functools.cache
def _presets() -> dict[str, dict[str, Any]]:
    """Family -> the settings ``config_for`` gives it: the default algorithm's, then every other
    algorithm's own (each registered algorithm that learns the family's action kind)."""
    from mmreplay.train import algorithm_names, config_for, get_algorithm
    from mmreplay.train import FAMILIES

    out: dict[str, dict[str, Any]] = {}
    for fam in FAMILIES:
        kind = "box" if fam == "box" else "discrete"
        values: dict[str, Any] = {}
        for algo in algorithm_names():
            if kind in get_algorithm(algo).kinds:
                values = {**config_for(family=fam, algo=algo).flat(), **values}
        out[fam] = values
    return out


def preset_defaults(field: str) -> str | None:
    """The bracketed default of setting ``field`` as the presets set it, from the presets themselves
    (``mmreplay.train.config_for`` per env family): ``[100,000; atari 10,000,000; ...]``, a family
    named only where it differs; None when no preset sets a value (computed when the run starts, or
    unset: the option's help says what applies then)."""
    values = {fam: flat[field] for fam, flat in _presets().items() if field in flat}
    if not values:
        return None
    base = next(iter(values.values()))
    if base is None or base == "":
        return None
    parts = [_shown(base)] + [f"{fam} {_shown(v)}" for fam, v in values.items() if v != base]
    return f"[{'; '.join(parts)}]"


def _train_options(fn: Any) -> Any:
    for name, annotation, doc in reversed(_settings()):
        fn = _option(name, annotation, doc)(fn)
    return fn


def option_fields() -> set[str]:
    """The settings the options set (for the test that checks they mirror the configs)."""
    return {name for name, _, _ in _settings()} | {"env_id"}


@click.command("train", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.argument("env_id", required=False)
@_train_options
@click.option("-q", "--quiet", is_flag=True, help="Print only the summary.")
@friendly
def train_cmd(env_id: str | None, quiet: bool, **opts: Any) -> None:
    """Train online in an env (DQN; the store is the replay memory), or offline from a store or
    archive with any algorithm that fits its actions (--algo below: discrete or Box).

    Metrics go to RUN_DIR/metrics.csv (and TensorBoard), checkpoints to RUN_DIR/checkpoint.pt
    (atomic; --resume continues a killed run with the same store), the final network to
    RUN_DIR/policy.pt. Defaults are presets per env family: classic control (RL-zoo's CartPole
    DQN), offline (discrete actions), box (Box actions from a store: CORL's settings; actions
    mapped between the store's recorded scale and the eval env's bounds), atari (--atari: Nature
    DQN) and minatar (--minatar, on for MinAtar/ ids: the MinAtar paper's DQN). Bracketed values
    in the option list are those defaults, written from the presets; an option names the
    algorithms it belongs to when not all have it.

    \b
    Examples:
      mmreplay train CartPole-v1 --store /data/cartpole --steps 100000 --seed 1
      mmreplay train CartPole-v1 --store /data/cp --actors 2 --run-dir runs/cp-async
      mmreplay train CartPole-v1 --store /data/cp --resume --run-dir runs/cp   # after a crash
      mmreplay train --offline --store /data/cp-mediocre --algo cql --eval-env CartPole-v1 --steps 10000
      mmreplay train --offline --archive s3://bucket/cp.zarr --algo bc --eval-env CartPole-v1
      mmreplay train --offline --store /data/hopper-medium --algo td3bc --eval-env Hopper-v5 --steps 100000
      mmreplay train --offline --store /data/sac-buffer --algo iql --eval-env Hopper-v5 --resume --run-dir runs/iql
      mmreplay train ALE/Pong-v5 --atari --store /data/pong --n-step 3 --prioritized
      mmreplay train MinAtar/Breakout-v1 --store /data/breakout --steps 500000
      mmreplay plot runs/cp
    """
    if not quiet:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        for name in ("botocore", "aiobotocore"):  # an S3 client's INFO lines ("Found credentials in environment
            logging.getLogger(name).setLevel(logging.WARNING)  # variables.") are not the run's to print
    try:
        cfg = train_config(env_id, opts)
        _check_options(cfg)
        from mmreplay.agent import check_env_id

        for env in {cfg.env_id, cfg.report.eval_env} - {None}:
            check_env_id(env)  # a typo fails here, before torch loads or anything is made
        from mmreplay.train import train

        result = train(cfg)  # (an object store's error names the archive: mmreplay.archive.remote)
    except (ValueError, FileExistsError, FileNotFoundError, NotImplementedError) as exc:
        if describe(exc) is not None:
            raise  # an mmreplay or file-system error: `friendly` gives it its CLI hint
        raise click.ClickException(one_line(str(exc), None)) from None
    _summary(cfg, result)


def _flags() -> dict[str, str]:
    """Setting -> the option that sets it (``learning_rate`` -> ``--learning-rate``)."""
    return {name: _DECLS.get(name, ("--" + name.replace("_", "-"),))[0].split("/")[0] for name, _, _ in _settings()}


def _as_usage_error(exc: ValueError) -> click.UsageError | None:
    """A config error naming a setting (``learning_rate`` must be > 0) as a usage error in the
    option's name (exit 2), as click's own for a bad type or range; None when it names none."""
    import re

    m = re.match(r"`(\w+)`", str(exc))
    flag = _flags().get(m.group(1)) if m else None
    if m is None or flag is None:
        return None
    rest = str(exc)[m.end():]  # "must be > 0, got -1.0", or "=1.0 copies ..." (which keeps the flag)
    if rest.startswith((" is required", " is not a setting")):
        return click.UsageError(f"{flag}{rest}")
    return click.BadParameter(f"{flag}{rest}" if rest.startswith("=") else rest.strip(), param_hint=flag)


def _check_options(cfg: Any) -> None:
    """The config's checks (``validate_config``) as usage errors in the option's name (exit 2):
    ``--lr -1`` says ``--learning-rate``, not ``learning_rate``."""
    from mmreplay.train import validate_config

    try:
        validate_config(cfg)
    except ValueError as exc:
        usage = _as_usage_error(exc)
        if usage is None:
            raise
        raise usage from None


def train_config(env_id: str | None, opts: dict[str, Any]) -> Any:
    """The run's :class:`mmreplay.train.TrainConfig` from ``mmreplay train``'s options: the library's
    ``config_for`` picks the preset (the same run ``mmreplay.train`` gets from Python)."""
    from mmreplay.train import config_for

    try:
        return config_for(env_id, **opts)
    except ValueError as exc:
        if "exclusive" in str(exc):
            raise click.UsageError("--store and --archive are exclusive: train from one of them") from None
        usage = _as_usage_error(exc)
        if usage is None:
            raise
        raise usage from None


def _store_episodes(path: str) -> None:
    """The store's episodes by how they ended, as ``mmreplay info`` counts them (a line, or nothing
    when the store cannot be read now)."""
    import mmreplay

    try:
        with mmreplay.open_store(path) as st:
            i = st.info()
    except Exception:  # a summary line is never a reason to fail a finished run
        return
    click.echo(f"episodes     {i['episodes_terminated']:,} terminated, {i['episodes_truncated']:,} truncated by the "
               f"env, {i['episodes_cut']:,} cut by the end of a run, {i['episodes_incomplete']:,} incomplete "
               "(the whole store)")


def _summary(cfg: Any, result: Any) -> None:
    """Print the run's summary; exit 130 / 143 if a signal interrupted it."""
    click.echo(f"run          {result.run_dir}")
    if not cfg.offline:
        click.echo(f"env steps    {result.env_steps:,}  ({result.steps_per_s:,.0f}/s)")
    click.echo(f"updates      {result.updates:,}  ({result.updates_per_s:,.0f}/s, data wait {result.data_wait:.1%})")
    click.echo(f"wall time    {result.wall_s:.1f} s")
    if result.already_finished:  # its saved result only: the store as it is now is another story
        click.echo("(the run had finished: its saved result; nothing ran and the store was not read)")
    elif not cfg.offline and cfg.store:
        from mmreplay.storage import disk_footprint

        disk = disk_footprint(cfg.store)
        click.echo(f"store        {cfg.store}: {disk.bytes_on_disk / 2**20:,.1f} MiB allocated on disk in "
                   f"{disk.segment_files} segment file(s)")
        _store_episodes(cfg.store)
    if result.damaged_rows:
        click.echo(f"DAMAGED      {result.damaged_rows:,} row(s) of the store failed their checksums and were left out "
                   f"of every batch (run `mmreplay verify {cfg.store or cfg.archive}`)", err=True)
    if result.evals:
        step, mean, std = result.evals[-1]
        click.echo(f"final eval   {mean:.1f} ± {std:.1f}  (step {step:,}; best {result.best_return:.1f})")
    click.echo(f"policy       {result.policy_path}")
    if result.interrupted:
        click.echo(f"interrupted  at step {result.env_steps if not cfg.offline else result.updates:,}: the episodes it "
                   f"cut are marked, a checkpoint is written; `mmreplay train --resume --run-dir {result.run_dir}` "
                   "continues", err=True)
        sys.exit(128 + result.interrupted)  # 130 after Ctrl-C, 143 after SIGTERM
    click.echo(f"plot with    mmreplay plot {result.run_dir}")


@click.command("plot", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("compare", nargs=-1, type=click.Path(exists=True, file_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="PNG path. [RUN_DIR/learning_curve.png]")
@click.option("--title", default=None, help="Plot title. [the run directory's name]")
@friendly
def plot_cmd(run_dir: str, compare: tuple[str, ...], out: str | None, title: str | None) -> None:
    """Write a PNG learning curve of a run: return vs env steps, with the evaluation points. With
    more run directories (COMPARE: other seeds, another trainer's metrics.csv), every run's
    evaluation points on one figure.

    \b
    Examples:
      mmreplay plot runs/CartPole-v1__dqn__s1
      mmreplay plot runs/cp --out cp.png --title "CartPole DQN"
      mmreplay plot runs/cp-s1 runs/cp-s2 runs/cp-s3 --out seeds.png
    """
    from mmreplay.train import plot_run

    try:
        path = plot_run(run_dir, out, title=title, compare=compare)
    except (ImportError, FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(str(path))
