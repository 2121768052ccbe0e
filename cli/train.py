"""``mmreplay train`` and ``mmreplay plot``: options mirror :class:`mmreplay.train.TrainConfig`.

Every option defaults to "not given", so a run's config is the preset (classic control, or
Nature DQN with ``--atari``) or, with ``--resume``, the config saved in the run's checkpoint,
with only the options given on the command line changed. torch is imported inside the command
bodies, so ``mmreplay --help`` stays fast.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from ._errors import describe, friendly, one_line

_FLOAT = click.FLOAT
_INT = click.INT
_POS = click.IntRange(min=1)  # a bad value is a usage error (exit 2), as collect's
_NAT = click.IntRange(min=0)


def _opt(*names: str, **kw: Any) -> Any:
    return click.option(*names, default=None, show_default=False, **kw)


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


# (option declarations, kwargs); the destination is the TrainConfig field of the same name
_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--store",), dict(type=click.Path(file_okay=False), help="Store path: filled online, read offline.")),
    (("--offline/--online",), dict(help="Train from the store only (read-only), no env interaction but evaluation.")),
    (("--archive",), dict(type=str, help="Offline: a zarr archive (path or fsspec URL) instead of --store; s3:// "
                                         "reads AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL_S3.")),
    (("--algo",), dict(type=click.Choice(["dqn", "bc", "cql", "td3bc", "iql"]),
                       help="dqn (double DQN); bc, cql offline (discrete actions); td3bc, iql, bc offline (Box "
                            "actions, CORL's settings). [dqn]")),
    (("--steps",), dict(type=_POS, help="Env steps online / learner updates offline. [100000]")),
    (("--seed",), dict(type=_INT, help="Seed of envs, networks, exploration and sampling. [1]")),
    (("--run-dir",), dict(type=click.Path(file_okay=False), help="Metrics, checkpoints, policies. [runs/ENV__ALGO__sSEED; offline: "
                                                                 "runs/EVAL_ENV__ALGO-offline__sSEED, or the "
                                                                 "store's (archive's) name without --eval-env]")),
    (("--resume",), dict(is_flag=True, default=None, help="Continue the run in --run-dir from its checkpoint "
                                                           "(rows a killed run stored after it stay in the store, "
                                                           "and are sampled; its steps count from the checkpoint).")),
    (("--shared-store",), dict(is_flag=True, default=None, help="Train online from a store another online run is "
                                                                 "training from (refused otherwise).")),
    (("--num-envs",), dict(type=_POS, help="Envs of the synchronous loop's vector env. [1]")),
    (("--atari",), dict(is_flag=True, default=None, help="Atari preprocessing, Nature CNN, Nature-DQN preset.")),
    (("--minatar/--no-minatar",), dict(help="MinAtar network and the MinAtar paper's DQN preset. "
                                                          "[on for MinAtar/ ids]")),
    (("--max-episode-steps",), dict(type=_NAT, help="Time limit of episodes. [the env's]")),
    (("--frame-stack",), dict(type=_POS, help="Frames per observation, stacked by the sampler. [1; atari 4]")),
    (("--actors",), dict(type=_NAT, help="Actor processes writing the store; 0: synchronous loop. [0]")),
    (("--envs-per-actor",), dict(type=_POS, help="Envs per actor process. [1]")),
    (("--ray",), dict(type=str, is_flag=False, flag_value="local", metavar="[ADDRESS]",
                      help="Actors as Ray actors: on the cluster at ADDRESS ('auto', 'ray://head:10001'), or on a "
                           "local Ray instance without one (after ENV_ID).")),
    (("--ray-archive",), dict(type=str, metavar="URL",
                              help="With --ray: where actors export segments, a path or URL every node reaches. "
                                   "[STORE.archive]")),
    (("--capacity",), dict(type=_POS, help="Rows the store keeps, if the run creates it. [1000000]")),
    (("--segment-records",), dict(type=_POS, help="Rows per segment file, if the run creates the store.")),
    (("--learning-rate", "--lr"), dict(type=_FLOAT, help="Learning rate. [2.3e-3; atari 1e-4; minatar 2.5e-4]")),
    (("--optimizer",), dict(type=click.Choice(["adam", "rmsprop"]), help="adam, or centered RMSprop. [adam; minatar "
                                                                            "rmsprop]")),
    (("--batch-size",), dict(type=_POS, help="Transitions per update. [64; atari 32]")),
    (("--gamma",), dict(type=_FLOAT, help="Discount. [0.99]")),
    (("--n-step",), dict(type=_POS, help="n-step returns (computed by the sampler). [1]")),
    (("--train-freq",), dict(type=_POS, help="Env steps between training rounds (at least num_envs: one round per vector step at most). [256; atari 4; minatar 1]")),
    (("--gradient-steps",), dict(type=_POS, help="Updates per training round. [128; atari 1]")),
    (("--learning-starts",), dict(type=_NAT, help="Env steps before the first update. [1000; atari 80000]")),
    (("--target-update-interval",), dict(type=_POS, help="Updates between target updates. [128; offline 1000; atari 1000]")),
    (("--tau",), dict(type=_FLOAT, help="Target update: 1 copies, <1 Polyak-averages. [1.0]")),
    (("--double/--no-double",), dict(help="Double DQN targets. [double]")),
    (("--dueling/--no-dueling",), dict(help="Dueling head. [no]")),
    (("--hidden",), dict(type=str, callback=_hidden, help="MLP layer widths. [256,256]")),
    (("--loss",), dict(type=click.Choice(["huber", "mse"]), help="TD loss. [huber]")),
    (("--max-grad-norm",), dict(type=_FLOAT, help="Gradient clipping by global norm, 0 off. [10]")),
    (("--start-e",), dict(type=_FLOAT, help="Epsilon at the start. [1.0]")),
    (("--end-e",), dict(type=_FLOAT, help="Epsilon after the decay. [0.04; atari 0.01]")),
    (("--exploration-fraction",), dict(type=_FLOAT, help="Fraction of --steps for the epsilon decay. [0.16]")),
    (("--prioritized/--uniform",), dict(help="Prioritized replay. [uniform]")),
    (("--per-alpha",), dict(type=_FLOAT, help="Priority exponent. [0.6]")),
    (("--per-beta",), dict(type=_FLOAT, help="Importance-weight exponent at the start. [0.4]")),
    (("--per-beta-final",), dict(type=_FLOAT, help="Importance-weight exponent at the end. [1.0]")),
    (("--cql-alpha",), dict(type=_FLOAT, help="Weight of the CQL regulariser. [1.0]")),
    (("--policy-noise",), dict(type=_FLOAT, help="TD3+BC: target policy smoothing noise (unit actions). [0.2]")),
    (("--noise-clip",), dict(type=_FLOAT, help="TD3+BC: clip of the smoothing noise. [0.5]")),
    (("--policy-freq",), dict(type=_POS, help="TD3+BC: critic updates per actor update. [2]")),
    (("--td3bc-alpha",), dict(type=_FLOAT, help="TD3+BC: weight alpha of Q in the actor loss. [2.5]")),
    (("--iql-expectile",), dict(type=_FLOAT, help="IQL: expectile of the value regression. [0.7]")),
    (("--iql-beta",), dict(type=_FLOAT, help="IQL: inverse temperature of the advantage weights. [3.0]")),
    (("--iql-deterministic/--iql-gaussian",), dict(help="IQL: deterministic or Gaussian actor. [gaussian]")),
    (("--normalize-obs/--no-normalize-obs",), dict(help="Continuous: normalize observations with the dataset's "
                                                        "mean and std (mmreplay.field_stats). [yes]")),
    (("--samples-per-insert",), dict(type=_FLOAT, help="Actors: sampled per inserted transition. [batch*gradient_steps/train_freq]")),
    (("--publish-every",), dict(type=_POS, help="Actors: updates between weight publications. [64]")),
    (("--eval-env",), dict(type=str, help="Env id for evaluation. [ENV_ID or the store's env_id]")),
    (("--eval-every",), dict(type=_NAT, help="Steps between evaluations, 0: at the end only. [10000]")),
    (("--eval-episodes",), dict(type=_NAT, help="Greedy episodes per evaluation, 0: none. [20]")),
    (("--target-return",), dict(type=_FLOAT, help="Stop once an evaluation reaches this mean return.")),
    (("--log-every",), dict(type=_NAT, help="Steps between metric rows. [1000]")),
    (("--checkpoint-every",), dict(type=_NAT, help="Steps between checkpoints, 0: at the end only. [10000]")),
    (("--progress/--no-progress",), dict(help="Progress bar on stderr. [when stderr is a terminal]")),
    (("--tensorboard/--no-tensorboard",), dict(help="Also log to TensorBoard if installed. [yes]")),
    (("--device",), dict(type=str, help="auto, cpu, cuda, cuda:1... [auto]")),
    (("--amp",), dict(is_flag=True, default=None, help="bf16 autocast on CUDA.")),
    (("--compile",), dict(is_flag=True, default=None, help="torch.compile the Q network.")),
    (("--cuda-graphs",), dict(is_flag=True, default=None, help="Opt-in (not yet measured on a GPU): replay each update "
                                                               "as a captured CUDA graph; eager, with one warning, "
                                                               "where it cannot.")),
    (("--profile",), dict(is_flag=True, default=None, help="torch profiler trace of a few updates.")),
    (("--threads",), dict(type=_POS, help="torch intra-op threads. [1 for MLPs on CPU]")),
    (("--flush-denormal/--no-flush-denormal",), dict(help="On the CPU, flush denormal floats to zero (faster; "
                                                          "torch.set_flush_denormal). [yes]")),
    (("--loader/--no-loader",), dict(help="Offline/actors: batches from a BatchLoader thread. [on CUDA only]")),
    (("--sampler-mode",), dict(type=click.Choice(["exact", "windowed"]),
                               help="Uniform over every row, or over a resident set of segments in RAM (stores "
                                    "larger than RAM). [exact]")),
    (("--cache-bytes",), dict(type=_POS, help="windowed: bytes of the resident set. [the sampler's default]")),
    (("--prefetch",), dict(type=_NAT, help="Batches the loader prepares ahead. [2]")),
]


_SWITCHES = {"algo", "offline", "atari", "minatar"}  # the options that pick a preset: their help says how


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


def preset_defaults(field: str) -> str | None:
    """The bracketed default of TrainConfig field ``field`` as the presets set it, from the presets
    themselves (``mmreplay.train``: ``TrainConfig``, ``atari_config``, ``minatar_config``,
    ``continuous_config``): ``[100,000; atari 10,000,000; ...]``, a family named only where it
    differs; None when no preset sets a value (the option's help says what applies then)."""
    from mmreplay.train import TrainConfig, atari_config, continuous_config, minatar_config

    base = getattr(TrainConfig(), field, None)
    if base is None or base == "":  # computed when the run starts (or unset): the help says how, in words
        return None
    fams = [(name, getattr(make(), field, None)) for name, make in
            (("atari", atari_config), ("minatar", minatar_config), ("continuous", continuous_config))]
    parts = [_shown(base)] + [f"{name} {_shown(v)}" for name, v in fams if v != base]
    return f"[{'; '.join(parts)}]"


def _with_preset(decls: tuple[str, ...], kw: dict[str, Any]) -> dict[str, Any]:
    """``kw`` with its help's bracketed default written from the presets (never typed twice)."""
    field = decls[0].split("/")[0].lstrip("-").replace("-", "_")
    if "help" not in kw or kw.get("is_flag") or field in _SWITCHES:
        return kw
    shown = preset_defaults(field)
    if shown is None:
        return kw
    text = kw["help"]
    if text.endswith("]") and " [" in text:
        text = text[: text.rindex(" [")]
    return {**kw, "help": f"{text} {shown}"}


def _train_options(fn: Any) -> Any:
    for decls, kw in reversed(_OPTIONS):
        kw = _with_preset(decls, kw)
        if kw.get("is_flag"):
            fn = click.option(*decls, **kw)(fn)
        else:
            fn = _opt(*decls, **kw)(fn)
    return fn


def option_fields() -> set[str]:
    """The TrainConfig fields the options set (for the test that checks they mirror the config)."""
    out = set()
    for decls, _ in _OPTIONS:
        name = decls[0].split("/")[0].lstrip("-").replace("-", "_")
        out.add(name)
    return out | {"env_id"}


@click.command("train", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.argument("env_id", required=False)
@_train_options
@click.option("-q", "--quiet", is_flag=True, help="Print only the summary.")
@friendly
def train_cmd(env_id: str | None, quiet: bool, **opts: Any) -> None:
    """Train DQN online (the store is the replay memory), or offline from a store: BC / DQN / CQL for
    discrete actions, TD3+BC / IQL / BC for Box actions (continuous control).

    Metrics go to RUN_DIR/metrics.csv (and TensorBoard), checkpoints to RUN_DIR/checkpoint.pt
    (atomic; --resume continues a killed run with the same store), the final network to
    RUN_DIR/policy.pt. Defaults are the RL-zoo DQN settings for CartPole; --atari switches to
    Nature-DQN ones, --minatar (on for MinAtar/ ids) to the MinAtar paper's DQN; --algo td3bc, iql
    (and bc on a Box-action store) to CORL's settings (batch 256, lr 3e-4, tau 0.005, 1M updates,
    10 episodes every 5000 updates, observations normalized with the dataset's statistics); their
    actions are mapped between the store's recorded scale and the eval env's bounds. Bracketed
    values in the option list are the defaults, as each preset sets them (written from the presets).

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

        for env in {cfg.env_id, cfg.eval_env} - {None}:
            check_env_id(env)  # a typo fails here, before torch loads or anything is made
        from mmreplay.train import train

        result = train(cfg)  # (an object store's error names the archive: mmreplay.archive.remote)
    except (ValueError, FileExistsError, FileNotFoundError, NotImplementedError) as exc:
        if describe(exc) is not None:
            raise  # an mmreplay or file-system error: `friendly` gives it its CLI hint
        raise click.ClickException(one_line(str(exc), None)) from None
    _summary(cfg, result)


def _flags() -> dict[str, str]:
    """TrainConfig field -> the option that sets it (``learning_rate`` -> ``--learning-rate``)."""
    return {decls[0].split("/")[0].lstrip("-").replace("-", "_"): decls[0].split("/")[0] for decls, _ in _OPTIONS}


def _check_options(cfg: Any) -> None:
    """The config's checks (``validate_config``) as usage errors in the option's name (exit 2), as
    click's own for a bad type or range: ``--lr -1`` says ``--learning-rate``, not ``learning_rate``."""
    import re

    from mmreplay.train import validate_config

    try:
        validate_config(cfg)
    except ValueError as exc:
        m = re.match(r"`(\w+)`", str(exc))
        flag = _flags().get(m.group(1)) if m else None
        if flag is None:
            raise
        rest = str(exc)[m.end():]  # "must be > 0, got -1.0", or "=1.0 copies ..." (which keeps the flag)
        if rest.startswith(" is required"):
            raise click.UsageError(f"{flag}{rest}") from None
        raise click.BadParameter(f"{flag}{rest}" if rest.startswith("=") else rest.strip(), param_hint=flag) from None


def train_config(env_id: str | None, opts: dict[str, Any]) -> Any:
    """The run's :class:`mmreplay.train.TrainConfig` from ``mmreplay train``'s options: the library's
    ``config_for`` picks the preset (the same run ``mmreplay.train`` gets from Python)."""
    from mmreplay.train import config_for

    try:
        return config_for(env_id, **opts)
    except ValueError as exc:
        if "exclusive" in str(exc):
            raise click.UsageError("--store and --archive are exclusive: train from one of them") from None
        raise


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
