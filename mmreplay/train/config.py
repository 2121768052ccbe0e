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
import inspect
import textwrap
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .algos import AlgoConfig, action_kind, get, names
from .algos.dqn import DQNConfig

if TYPE_CHECKING:
    from ..agent.envs import EnvSpec


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """How the run samples its store."""

    n_step: int = 1
    """n-step returns, computed by the sampler from consecutive rows."""
    prioritized: bool = False
    """Prioritized replay (proportional), priorities saved in the store for ``resume``."""
    per_alpha: float = 0.6
    """Priority exponent."""
    per_beta: float = 0.4
    """Importance-weight exponent at the start, annealed linearly to ``per_beta_final``."""
    per_beta_final: float = 1.0
    """Importance-weight exponent at the end of training."""
    sampler_mode: Literal["exact", "windowed"] = "exact"
    """Uniform sampling over every row (``exact``) or over a resident set of whole segments copied into
    RAM and swapped in the background (``windowed``, for stores larger than RAM; ``UniformSampler``)."""
    cache_bytes: int | None = None
    """``windowed``: bytes of the resident set (``None``: the sampler's default)."""
    loader: bool | None = None
    """Offline and actors: draw batches in a ``BatchLoader`` thread (pinned buffers, asynchronous
    copies). ``None``: on CUDA only; on the CPU, drawing in the learner's thread is as fast and
    leaves the cores to the updates (and to the actors)."""
    prefetch: int = 2
    """Batches the loader prepares ahead."""


@dataclass(frozen=True, slots=True)
class ActingConfig:
    """How actor processes (``actors`` >= 1) act and hand over their rows."""

    envs_per_actor: int = 1
    """Environments per actor process."""
    ray: str | None = None
    """Run the actors as Ray actors: a cluster address ("auto", "ray://head:10001") or "local" (a
    local Ray instance for the run). Needs ``actors >= 1`` and the ``ray`` extra."""
    ray_archive: str | None = None
    """With ``ray``: the archive root the actors export sealed segments into, a path or fsspec URL
    every node and the learner reach (default ``STORE.archive``, only without a cluster address)."""
    samples_per_insert: float | None = None
    """Sampled transitions per inserted one (``None``: batch × gradient_steps / train_freq)."""
    publish_every: int = 64
    """Learner updates between weight publications."""


@dataclass(frozen=True, slots=True)
class ReportConfig:
    """Evaluation, metrics and checkpoints."""

    eval_env: str | None = None
    """Env id for evaluation episodes (default ``env_id``, or the store's ``env_id`` metadata)."""
    eval_every: int = 10_000
    """Steps between evaluations (0: only at the end)."""
    eval_episodes: int = 20
    """Greedy episodes per evaluation (0: no evaluation)."""
    target_return: float | None = None
    """Stop once an evaluation's mean return reaches this (``None``: run all ``steps``)."""
    log_every: int = 1000
    """Steps between metric rows."""
    checkpoint_every: int = 10_000
    """Steps between checkpoints (0: only at the end)."""
    progress: bool | None = None
    """A progress bar on stderr (steps, steps/s, updates/s, last eval, data wait); ``None``: when
    stderr is a terminal."""
    tensorboard: bool = True
    """Also log to TensorBoard under ``run_dir/tb`` when the ``tensorboard`` package is installed."""


@dataclass(frozen=True, slots=True)
class HardwareConfig:
    """Where and how the updates run."""

    device: str = "auto"
    """``auto`` (CUDA if available, else CPU), ``cpu``, ``cuda``, ``cuda:1``..."""
    amp: bool = False
    """bf16 autocast of the forward passes on CUDA (ignored on CPU)."""
    compile: bool = False
    """``torch.compile`` the Q network for the updates."""
    cuda_graphs: bool = False
    """Opt-in: capture each update once per batch shape as a CUDA graph and replay it
    (``mmreplay.train.graphs``); on a CPU, with ``amp`` or ``compile``, or when a capture fails,
    one warning and eager updates."""
    profile: bool = False
    """Write a torch profiler trace of a few updates to ``run_dir/profile``."""
    threads: int | None = None
    """torch intra-op threads (``None``: 1 for MLPs on the CPU, torch's default otherwise)."""
    flush_denormal: bool = True
    """On the CPU, flush denormal floats to zero (``torch.set_flush_denormal``, process-wide): an
    optimizer's running averages of gradients that are mostly zero (MinAtar's bool frames) decay
    into denormals, on which every arithmetic operation is many times slower. MinAtar Breakout,
    20,000 steps: 57.7 s without, 42.1 s with (``benchmarks/minatar_dqn.py`` measures both sides
    with it on)."""


_GROUPS = {"replay": ReplayConfig, "acting": ActingConfig, "report": ReportConfig, "hardware": HardwareConfig}


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Everything a training run needs: the run's settings, grouped (``replay``, ``acting``,
    ``report``, ``hardware``), and the algorithm's config (``algo``). Build one with
    :func:`config_for` to get the preset ``mmreplay train`` applies. "steps" are env steps online
    and learner updates offline."""

    env_id: str | None = None
    """Gymnasium id to train in (online), or to evaluate in (offline, unless ``eval_env``)."""
    store: str = ""
    """Store path: the replay memory online (created if missing, else appended to), the dataset offline."""
    offline: bool = False
    """Train from the store only (opened read-only); no env interaction except evaluation."""
    archive: str | None = None
    """Offline: train from a zarr archive (path or fsspec URL) instead of ``store``, read-only
    (its segments are fetched into a temporary local cache first, see ``mmreplay.archive``)."""
    algo: AlgoConfig = field(default_factory=DQNConfig)
    """The algorithm and its settings (``mmreplay.train.algos``; ``algo.name`` names it)."""
    steps: int = 100_000
    """Online: env steps in total (actions taken, all envs and actors). Offline: learner updates."""
    seed: int = 1
    """Seed of envs, networks, exploration and sampling."""
    run_dir: str | None = None
    """Where metrics, checkpoints and policies go (default ``runs/<env>__<algo>__s<seed>``)."""
    resume: bool = False
    """Continue the run in ``run_dir`` from its checkpoint (same store: nothing is reloaded)."""
    shared_store: bool = False
    """Train online from a store another online run is training from (refused otherwise: both would
    write into it and sample from it)."""
    num_envs: int = 1
    """Environments of the synchronous loop's vector env (one store lane each)."""
    actors: int = 0
    """Actor processes writing the store; 0 runs the synchronous loop (exactly reproducible)."""
    atari: bool = False
    """Atari preprocessing (84x84 uint8 frames, frame skip 4) and the Nature CNN."""
    minatar: bool = False
    """The MinAtar network over ``(H, W, C)`` frames (one 3x3 convolution of 16 channels, then 128
    units)."""
    max_episode_steps: int | None = None
    """Time limit of training and evaluation episodes (``None``: the env's own)."""
    frame_stack: int = 1
    """Frames per observation, rebuilt by the sampler from single stored frames (Atari: 4)."""
    capacity: int = 1_000_000
    """Rows the store keeps (oldest segments evicted beyond it) when the run creates it."""
    segment_records: int | None = None
    """Rows per segment file when the run creates the store (``None``: about 32 MiB, at most
    ``capacity / 64`` rows, so a full store stays within ~3% of ``capacity``)."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """How the run samples its store."""
    acting: ActingConfig = field(default_factory=ActingConfig)
    """How actor processes act (``actors`` >= 1)."""
    report: ReportConfig = field(default_factory=ReportConfig)
    """Evaluation, metrics and checkpoints."""
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    """Where and how the updates run."""

    def env_spec(self) -> EnvSpec:
        """The env an online run acts in, as its actors make it (:class:`mmreplay.agent.envs.EnvSpec`)."""
        from ..agent.envs import EnvSpec

        if self.env_id is None:
            raise ValueError("`env_id` is needed: the env an online run acts in")
        return EnvSpec(self.env_id, atari=self.atari or None, max_episode_steps=self.max_episode_steps)

    def to_dict(self) -> dict[str, Any]:
        """The nested layout ``config.json`` and checkpoints hold (``algo`` with its ``name``)."""
        out = asdict(self)
        out["algo"] = {"name": self.algo.name, **asdict(self.algo)}
        return out

    def flat(self) -> dict[str, Any]:
        """Every setting by its name (``algo``: the algorithm's name), as the CLI's options name them."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _GROUPS and f.name != "algo"}
        for group in _GROUPS:
            out.update(asdict(getattr(self, group)))
        out.update(asdict(self.algo))
        out["algo"] = self.algo.name
        return out


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

DEFAULT_ALGO = DQNConfig.name
"""The algorithm a run gets when it names none (``TrainConfig``'s default ``algo``)."""


def _leaf_names() -> dict[str, str | None]:
    """Each run setting's name -> its group (``None``: a field of TrainConfig itself)."""
    out: dict[str, str | None] = {f.name: None for f in fields(TrainConfig) if f.name not in _GROUPS}
    for group, cls in _GROUPS.items():
        out.update({f.name: group for f in fields(cls)})
    return out


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
    leaves = _leaf_names()
    top: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {g: {} for g in _GROUPS}
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
    return TrainConfig(**top, algo=algorithm.config(**algo), **{g: cls(**groups[g]) for g, cls in _GROUPS.items()})


def from_dict(data: Mapping[str, Any]) -> TrainConfig:
    """The config a ``config.json`` or a checkpoint's ``config`` holds: the nested layout
    (:meth:`TrainConfig.to_dict`) or the flat one of older runs (:func:`from_flat`)."""
    if not isinstance(data.get("algo"), Mapping):
        return from_flat(data)
    flat: dict[str, Any] = {k: v for k, v in data.items() if k not in _GROUPS and k != "algo"}
    for group in _GROUPS:
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
            run_dir = str(default_run_dir(from_flat({k: v for k, v in given.items() if k in _leaf_names()
                                                     or k == "algo"})))
        return resume_config(run_dir, **given)
    algorithm = get(given.get("algo") or DEFAULT_ALGO)
    foreign = sorted(set(given) - set(_leaf_names()) - set(algorithm.config.field_names()) - {"algo"})
    if foreign:
        owners = [n for n in names() if foreign[0] in get(n).config.field_names()]
        raise ValueError(f"`{foreign[0]}` is not a setting of --algo {algorithm.name}"
                         + (f" (it is {', '.join(owners)}'s)" if owners else ""))
    fam = family or family_of(given)
    run = {**RUN_PRESETS[fam], **{k: v for k, v in given.items() if k in _leaf_names()}}
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


_POSITIVE = ("steps", "num_envs", "envs_per_actor", "capacity", "n_step", "frame_stack", "publish_every", "prefetch")
_NATURAL = ("eval_every", "eval_episodes", "log_every", "checkpoint_every", "actors")


def validate_config(cfg: TrainConfig) -> None:
    """Raise ``ValueError`` naming the first bad setting (before anything is created)."""
    flat = cfg.flat()
    for name in _POSITIVE:
        if flat[name] is not None and int(flat[name]) < 1:
            raise ValueError(f"`{name}` must be >= 1, got {flat[name]}")
    for name in _NATURAL:
        if flat[name] < 0:
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
        if not is_dataclass(klass) or klass is object:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # no source (a class made at run time): no help
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr) \
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                out[node.target.id] = inspect.cleandoc(nxt.value.value)
    return out


__all__ = ["ActingConfig", "HardwareConfig", "RUN_PRESETS", "ReplayConfig", "ReportConfig", "TrainConfig",
           "algo_field_names", "atari_config", "box_actions", "config_for", "continuous_config", "default_run_dir",
           "family_of", "field_help", "from_dict", "from_flat", "linear_schedule", "minatar_config",
           "resume_config", "validate_config"]
