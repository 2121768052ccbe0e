"""The training configuration: :class:`TrainConfig` (the run's settings, grouped; one docstring per
field) holding the algorithm's own config (``mmreplay.train.algos``), the presets per env family
(:func:`config_for`, the one place a preset is picked), validation, run-directory naming, and the
schedules. No torch here: the CLI builds and checks a config before torch loads.

Every setting has one name, unique across :class:`TrainConfig`, its groups and every registered
algorithm's config: ``mmreplay train``'s options are those names, and :func:`from_flat` maps a
flat mapping of them (options, or the flat ``config.json`` of runs made before the algorithms had
modules) onto the nested layout by name.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
from collections.abc import Mapping
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any

from .algos import action_kind, get, names
from .algos.dqn import ALGORITHM as _DEFAULT
from .settings import GROUPS, setting_groups, ActingConfig, HardwareConfig, ReplayConfig, ReportConfig, TrainConfig


RUN_PRESETS: dict[str, dict[str, Any]] = {
    "classic": {},
    "offline": {},
    "box": dict(offline=True, steps=1_000_000, eval_every=5000, eval_episodes=10, log_every=1000,
                checkpoint_every=10_000),
    "atari": dict(atari=True, frame_stack=4, steps=10_000_000, eval_episodes=5, eval_every=250_000, log_every=10_000,
                  checkpoint_every=100_000),
    "minatar": dict(minatar=True, capacity=100_000, steps=5_000_000, eval_every=50_000, eval_episodes=10,
                    log_every=10_000, checkpoint_every=100_000),
}
"""The run settings each env family changes (``mmreplay.train.algos.FAMILIES``); an algorithm's
config changes its own (its ``PRESETS``). ``box`` is CORL's: 1,000,000 updates, 10 evaluation
episodes every 5,000; ``atari`` Nature DQN's; ``minatar`` the MinAtar paper's (a 100,000-row replay
memory, 5M steps)."""

DEFAULT_ALGO = _DEFAULT.name
"""The algorithm a run gets when it names none (``TrainConfig``'s default ``algo``)."""


def with_settings(cfg: TrainConfig, **settings: Any) -> TrainConfig:
    """A copy of ``cfg`` with ``settings`` (by name, wherever they live: ``steps``,
    ``learning_starts``, ``eval_every``...) changed; no preset is applied again. ``ValueError`` for a
    setting the run's algorithm does not have."""
    _refuse_foreign(get(settings.get("algo") or cfg.algo.name), settings)
    return from_flat({**cfg.flat(), **settings})


def _refuse_foreign(algorithm: Any, settings: Mapping[str, Any]) -> None:
    """``ValueError`` naming the first of ``settings`` that neither the run nor ``algorithm`` has (and
    whose algorithm it is, when it is one's): never dropped in silence."""
    foreign = sorted(set(settings) - set(setting_groups()) - set(algorithm.config.field_names()) - {"algo"})
    if foreign:
        owners = [n for n in names() if foreign[0] in get(n).config.field_names()]
        raise ValueError(f"`{foreign[0]}` is not a setting of --algo {algorithm.name}"
                         + (f" (it is {', '.join(owners)}'s)" if owners else ""))


def algo_field_names() -> set[str]:
    """The settings of every registered algorithm's config."""
    return {n for name in names() for n in get(name).config.field_names()}


def from_flat(values: Mapping[str, Any]) -> TrainConfig:
    """The config a flat mapping of settings names (``algo``: a registered name; missing settings
    take the defaults of their dataclass, not a preset).

    How a flat ``config.json`` (runs made before the algorithms had modules: every setting of every
    algorithm at the top level) maps onto the nested layout: each name goes to the one place that
    has it — a field of :class:`TrainConfig`, of one of its groups, or of the named algorithm's
    config; settings of the other algorithms (a DQN run's file holds ``cql_alpha``, ``iql_beta``...)
    are dropped; ``target_update_interval: null`` meant 128 online and 1000 offline, and becomes
    that number. Any other name is a ``ValueError``."""
    values = dict(values)
    algorithm = get(values.pop("algo", None) or DEFAULT_ALGO)
    own = set(algorithm.config.field_names())
    if "target_update_interval" in values and values["target_update_interval"] is None:
        values["target_update_interval"] = 1000 if values.get("offline") else 128
    leaves = setting_groups()
    top: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {g: {} for g in GROUPS}
    algo: dict[str, Any] = {}
    others = algo_field_names() - own
    for key, value in values.items():
        if key in own:
            algo[key] = tuple(value) if key == "hidden" else value
        elif key in leaves:
            (groups[leaves[key]] if leaves[key] else top)[key] = value
        elif key in others:
            continue  # another algorithm's setting: not this run's
        else:
            raise ValueError(f"`{key}` is not a setting of a training run (nor of any registered algorithm)")
    return TrainConfig(**top, algo=algorithm.config(**algo), **{g: cls(**groups[g]) for g, cls in GROUPS.items()})


def from_dict(data: Mapping[str, Any]) -> TrainConfig:
    """The config a ``config.json`` or a checkpoint's ``config`` holds: the nested layout
    (:meth:`TrainConfig.to_dict`) or the flat one of older runs (:func:`from_flat`)."""
    if not isinstance(data.get("algo"), Mapping):
        return from_flat(data)
    flat: dict[str, Any] = {k: v for k, v in data.items() if k not in GROUPS and k != "algo"}
    for group in GROUPS:
        flat.update(data.get(group) or {})
    algo = dict(data["algo"])
    flat["algo"] = algo.pop("name")
    flat.update(algo)
    return from_flat(flat)


def box_actions(store: str | None = None, archive: str | None = None) -> bool | None:
    """Whether the offline source (a store path or a zarr archive) holds Box actions (a float ``action``
    field), read from its manifest or archive metadata without opening its data; ``None`` when it
    cannot be read (the run reports why)."""
    try:
        from ..core.schema import Schema

        if archive:
            from ..archive.layout import open_group, read_meta

            schema = Schema.from_json(read_meta(open_group(archive, "r", None), archive)["schema"])
        elif store:
            from ..storage import read_manifest

            schema = Schema.from_json(read_manifest(Path(store))["schema"])
        else:
            return None
    except Exception:  # a missing or unreadable source: the run itself says what is wrong
        return None
    return action_kind(schema) == "box"


def family_of(values: Mapping[str, Any]) -> str:
    """The env family whose presets a run of these settings gets (``mmreplay.train.algos.FAMILIES``):
    ``atari`` or ``minatar`` when asked (``minatar`` too for a ``MinAtar/`` env id); ``box`` for an
    algorithm that learns Box actions only, or an offline one that learns both from a source of Box
    actions; ``offline`` for other offline runs; else ``classic``."""
    if values.get("atari"):
        return "atari"
    if values.get("minatar") or (values.get("minatar") is None and str(values.get("env_id") or "").startswith("MinAtar/")):
        return "minatar"
    kinds = get(values.get("algo") or DEFAULT_ALGO).kinds
    if kinds == ("box",):
        return "box"
    if values.get("offline"):
        if "box" in kinds and box_actions(values.get("store"), values.get("archive")):
            return "box"
        return "offline"
    return "classic"


def config_for(env_id: str | None = None, *, family: str | None = None, **options: Any) -> TrainConfig:
    """The config ``mmreplay train`` runs for these options: the one place a preset is picked, so a
    run from Python (``mmreplay.train.train(config_for("ALE/Pong-v5", atari=True, store=...))``)
    is the run the CLI makes of the same inputs.

    ``options`` are settings by name (``None`` values are left out; ``algo`` a registered name).
    ``resume=True``: the config saved in ``run_dir`` (default: the run directory these options
    name) with the options over it. Else the env family's presets (:func:`family_of`, or
    ``family``): the run's (:data:`RUN_PRESETS`), then the algorithm's (its config's ``PRESETS``),
    then the options. Raises ``ValueError`` when both ``store`` and ``archive`` are given, or for a
    setting no part of the run has (another algorithm's, a typo)."""
    given = {k: v for k, v in options.items() if v is not None}
    if given.get("store") is not None and given.get("archive") is not None:
        raise ValueError("`store` and `archive` are exclusive: train from one of them")
    if env_id is not None:
        given["env_id"] = env_id
    if given.pop("resume", False):
        run_dir = given.pop("run_dir", None)
        if run_dir is None:
            run_dir = str(default_run_dir(from_flat({k: v for k, v in given.items() if k in setting_groups()
                                                     or k == "algo"})))
        return resume_config(run_dir, **given)
    algorithm = get(given.get("algo") or DEFAULT_ALGO)
    _refuse_foreign(algorithm, given)
    fam = family or family_of(given)
    run = {**RUN_PRESETS[fam], **{k: v for k, v in given.items() if k in setting_groups()}}
    values = {**run, **algorithm.config.preset(fam, run), **given, "algo": algorithm.name}
    return from_flat(values)


def atari_config(**overrides: Any) -> TrainConfig:
    """Nature-DQN settings for Atari (frame stacks of 4, CNN, 1M-row store): :func:`config_for` with
    the ``atari`` family, then ``overrides``."""
    return config_for(family="atari", **{"atari": True, **overrides})


def minatar_config(**overrides: Any) -> TrainConfig:
    """The DQN of the MinAtar paper (Young & Tian 2019, "MinAtar: An Atari-inspired testbed for
    thorough and reproducible reinforcement learning experiments") with its reference
    implementation's settings (``mmreplay.train.algos.dqn``): :func:`config_for` with the
    ``minatar`` family, then ``overrides``."""
    return config_for(family="minatar", **{"minatar": True, **overrides})


def continuous_config(algo: str, **overrides: Any) -> TrainConfig:
    """Offline ``algo`` for Box actions with the defaults of CORL's single-file implementations
    (``td3_bc.py``, ``iql.py``, ``any_percent_bc.py``; ``mmreplay.train.algos.base.BoxConfig``):
    :func:`config_for` with the ``box`` family, then ``overrides``."""
    return config_for(family="box", algo=algo, **overrides)


_POSITIVE = ("steps", "num_envs", "envs_per_actor", "capacity", "n_step", "frame_stack", "publish_every", "prefetch",
             "threads", "segment_records")  # (None: the default)
_NATURAL = ("eval_every", "eval_episodes", "log_every", "checkpoint_every", "actors", "max_episode_steps")


def validate_config(cfg: TrainConfig) -> None:
    """Raise ``ValueError`` naming the first bad setting (before anything is created)."""
    flat = cfg.flat()
    for name in _POSITIVE:
        if flat[name] is not None and int(flat[name]) < 1:
            raise ValueError(f"`{name}` must be >= 1, got {flat[name]}")
    for name in _NATURAL:
        if flat[name] is not None and flat[name] < 0:
            raise ValueError(f"`{name}` must be >= 0, got {flat[name]}")
    algorithm = get(cfg.algo.name)
    if type(cfg.algo) is not algorithm.config:
        raise ValueError(f"`algo` holds a {type(cfg.algo).__name__}; --algo {algorithm.name} takes a "
                         f"{algorithm.config.__name__}")
    cfg.algo.validate()
    if not cfg.offline and not algorithm.online:
        raise ValueError(f"`algo`={algorithm.name!r} is offline only: pass offline=True (--offline) or one of "
                         f"{', '.join(repr(n) for n in names() if get(n).online)}")
    if not cfg.store and not (cfg.offline and cfg.archive):
        raise ValueError("`store` is required: the store to train from (offline) or to fill (online)")
    if cfg.archive and not cfg.offline:
        raise ValueError("`archive` is for offline training (pass offline=True / --offline)")
    if not cfg.offline and not cfg.env_id:
        raise ValueError("`env_id` is required online")
    if cfg.minatar and cfg.atari:
        raise ValueError("`minatar` and `atari` are exclusive: one preprocessing and network per run")
    r = cfg.replay
    for name in ("per_alpha", "per_beta", "per_beta_final"):
        if not 0.0 <= getattr(r, name) <= 1.0:
            raise ValueError(f"`{name}` must lie in [0, 1], got {getattr(r, name)}")
    if cfg.acting.samples_per_insert is not None and cfg.acting.samples_per_insert <= 0:
        raise ValueError(f"`samples_per_insert` must be > 0, got {cfg.acting.samples_per_insert}")
    if r.sampler_mode not in ("exact", "windowed"):
        raise ValueError(f"`sampler_mode` must be 'exact' or 'windowed', got {r.sampler_mode!r}")
    if r.sampler_mode == "windowed" and r.prioritized:
        raise ValueError("`sampler_mode`='windowed' is for uniform sampling, not `prioritized`")
    if r.cache_bytes is not None and r.cache_bytes < 1:
        raise ValueError(f"`cache_bytes` must be a positive number of bytes, got {r.cache_bytes}")
    if cfg.offline and cfg.actors:
        raise ValueError("`actors` is for online training; offline runs read the store only")


def default_run_dir(cfg: TrainConfig) -> Path:
    """``runs/<env>__<algo>__s<seed>`` (stable, so ``--resume`` finds it); offline runs are named
    after ``eval_env`` (``<algo>-offline``), or after the store or archive when there is none."""
    name = (cfg.env_id or cfg.report.eval_env or Path(cfg.store or str(cfg.archive).rstrip("/")).name).replace("/", "-")
    return Path("runs") / f"{name}__{cfg.algo.name}{'-offline' if cfg.offline else ''}__s{cfg.seed}"


def resume_config(run_dir: str | Path, **overrides: Any) -> TrainConfig:
    """The config saved in ``run_dir``'s checkpoint (either layout, :func:`from_dict`), with
    ``overrides`` (settings by name, e.g. more ``steps``) and ``resume=True``."""
    from .checkpoint import CHECKPOINT_NAME, load_checkpoint  # torch

    payload = load_checkpoint(Path(run_dir) / CHECKPOINT_NAME)
    saved = from_dict(payload["config"]).flat()
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if overrides.get("algo", saved["algo"]) != saved["algo"]:
        raise ValueError(f"`algo`: {run_dir} is a {saved['algo']} run; --resume continues it with the same algorithm")
    _refuse_foreign(get(saved["algo"]), overrides)
    return from_flat({**saved, **overrides, "resume": True, "run_dir": str(run_dir)})


def _run_dir(cfg: TrainConfig) -> Path:
    """Validate ``cfg`` (before anything is made) and return its run directory."""
    validate_config(cfg)
    return Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg)


def linear_schedule(start: float, end: float, duration: float, t: float) -> float:
    """Linear from ``start`` to ``end`` over ``duration`` steps, then ``end``."""
    if duration <= 0:
        return end
    return start + min(t / duration, 1.0) * (end - start)


def field_help(cls: type) -> dict[str, str]:
    """Each dataclass field of ``cls`` (its bases' included) -> its docstring (the string right after
    the field), read from the source: what ``mmreplay train``'s option help says."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        node = _class_nodes(klass.__module__).get(klass.__qualname__) if is_dataclass(klass) else None
        body = node.body if node is not None else []  # (no source: a class made at run time, no help)
        for field_node, nxt in zip(body, body[1:]):
            if isinstance(field_node, ast.AnnAssign) and isinstance(field_node.target, ast.Name) \
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) \
                    and isinstance(nxt.value.value, str):
                out[field_node.target.id] = inspect.cleandoc(nxt.value.value)
    return out


@functools.cache
def _class_nodes(module: str) -> dict[str, ast.ClassDef]:
    """The top-level classes of ``module``'s source, by name: each module parsed once (the CLI reads
    every config's field docstrings when it loads)."""
    try:
        tree = ast.parse(inspect.getsource(sys.modules[module]))
    except (OSError, TypeError, KeyError):
        return {}
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


__all__ = ["DEFAULT_ALGO", "GROUPS", "ActingConfig", "HardwareConfig", "RUN_PRESETS", "ReplayConfig", "ReportConfig",
           "TrainConfig", "with_settings",
           "algo_field_names", "atari_config", "box_actions", "config_for", "continuous_config", "default_run_dir",
           "family_of", "field_help", "from_dict", "from_flat", "linear_schedule", "minatar_config",
           "resume_config", "validate_config"]
