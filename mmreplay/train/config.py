"""The training configuration: :class:`TrainConfig` (one docstring per field; ``mmreplay train``'s
options mirror it), its presets (``atari_config``, ``minatar_config``, ``continuous_config``, ``resume_config``), validation and run-directory
naming, and the schedules. No torch here: the CLI builds and checks a config before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from ..agent.envs import EnvSpec

Algo = Literal["dqn", "bc", "cql", "td3bc", "iql"]


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Everything a training run needs. Defaults: the RL-zoo DQN settings for classic control
    (CartPole); :func:`atari_config` gives the Nature-DQN ones. "steps" are env steps online and
    learner updates offline."""

    env_id: str | None = None
    """Gymnasium id to train in (online), or to evaluate in (offline, unless ``eval_env``)."""
    store: str = ""
    """Store path: the replay memory online (created if missing, else appended to), the dataset offline."""
    offline: bool = False
    """Train from the store only (opened read-only); no env interaction except evaluation."""
    archive: str | None = None
    """Offline: train from a zarr archive (path or fsspec URL) instead of ``store``, read-only
    (its segments are fetched into a temporary local cache first, see ``mmreplay.archive``)."""
    algo: Algo = "dqn"
    """``dqn`` (double DQN), ``bc`` (behaviour cloning, offline) or ``cql`` (discrete CQL, offline) for
    discrete actions; ``td3bc`` (TD3+BC), ``iql`` (implicit Q-learning) or ``bc`` (offline) for Box
    actions, with :func:`continuous_config`'s settings."""
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
    atari: bool = False
    """Atari preprocessing (84x84 uint8 frames, frame skip 4) and the Nature CNN."""
    minatar: bool = False
    """The MinAtar network over ``(H, W, C)`` frames (one 3x3 convolution of 16 channels, then 128
    units); :func:`minatar_config` gives the MinAtar paper's DQN settings."""
    max_episode_steps: int | None = None
    """Time limit of training and evaluation episodes (``None``: the env's own)."""
    frame_stack: int = 1
    """Frames per observation, rebuilt by the sampler from single stored frames (Atari: 4)."""
    actors: int = 0
    """Actor processes writing the store; 0 runs the synchronous loop (exactly reproducible)."""
    envs_per_actor: int = 1
    """Environments per actor process."""
    ray: str | None = None
    """Run the actors as Ray actors: a cluster address ("auto", "ray://head:10001") or "local" (a
    local Ray instance for the run). Needs ``actors >= 1`` and the ``ray`` extra."""
    ray_archive: str | None = None
    """With ``ray``: the archive root the actors export sealed segments into, a path or fsspec URL
    every node and the learner reach (default ``STORE.archive``, only without a cluster address)."""
    capacity: int = 1_000_000
    """Rows the store keeps (oldest segments evicted beyond it) when the run creates it."""
    segment_records: int | None = None
    """Rows per segment file when the run creates the store (``None``: about 32 MiB, at most
    ``capacity / 64`` rows, so a full store stays within ~3% of ``capacity``)."""
    learning_rate: float = 2.3e-3
    """The optimizer's learning rate."""
    optimizer: Literal["adam", "rmsprop"] = "adam"
    """``adam``, or ``rmsprop``: centered RMSprop with squared-gradient decay 0.95, momentum 0.95 and
    eps 0.01 (the MinAtar paper's DQN)."""
    batch_size: int = 64
    """Transitions per update."""
    gamma: float = 0.99
    """Discount factor."""
    n_step: int = 1
    """n-step returns, computed by the sampler from consecutive rows."""
    train_freq: int = 256
    """Online: env steps between training rounds (at most one round per vector step: below
    ``num_envs``, a round every ``num_envs`` env steps). Env steps count transitions, not the
    steps that only reset a lane, so the updates per env step do not depend on episode lengths."""
    gradient_steps: int = 128
    """Online: updates per training round."""
    learning_starts: int = 1000
    """Online: env steps before the first update (the first rows are random-ish anyway)."""
    target_update_interval: int | None = None
    """Updates between target updates (``None``: 128 online, the RL-zoo CartPole setting; 1000
    offline, where the faster target made CQL's return on random data swing instead of rise;
    the Atari preset 1000)."""
    tau: float = 1.0
    """Target update: 1 copies the weights; below 1, Polyak averaging target += tau (q - target)."""
    double: bool = True
    """Double DQN targets (the online net picks the next action, the target net values it)."""
    dueling: bool = False
    """Dueling head V(s) + A(s, a) - mean A."""
    hidden: tuple[int, ...] = (256, 256)
    """Hidden layer widths of the MLP (vector observations)."""
    loss: Literal["huber", "mse"] = "huber"
    """TD loss: Huber (smooth L1, as SB3 and the Nature paper) or squared error."""
    max_grad_norm: float = 10.0
    """Gradient clipping by global norm (0 disables)."""
    start_e: float = 1.0
    """Exploration epsilon at the start."""
    end_e: float = 0.04
    """Exploration epsilon after the decay."""
    exploration_fraction: float = 0.16
    """Fraction of ``steps`` over which epsilon decays linearly."""
    prioritized: bool = False
    """Prioritized replay (proportional), priorities saved in the store for ``resume``."""
    per_alpha: float = 0.6
    """Priority exponent."""
    per_beta: float = 0.4
    """Importance-weight exponent at the start, annealed linearly to ``per_beta_final``."""
    per_beta_final: float = 1.0
    """Importance-weight exponent at the end of training."""
    cql_alpha: float = 1.0
    """Weight of the CQL regulariser."""
    policy_noise: float = 0.2
    """TD3+BC: standard deviation of the target policy's smoothing noise (unit actions in [-1, 1])."""
    noise_clip: float = 0.5
    """TD3+BC: the smoothing noise is clipped to [-noise_clip, noise_clip]."""
    policy_freq: int = 2
    """TD3+BC: critic updates per actor (and target) update."""
    td3bc_alpha: float = 2.5
    """TD3+BC: the actor loss is ``-lambda Q + (pi - a)^2`` with ``lambda = td3bc_alpha / mean|Q|``."""
    iql_expectile: float = 0.7
    """IQL: the expectile the value network fits to the critics (CORL's ``iql_tau``)."""
    iql_beta: float = 3.0
    """IQL: inverse temperature of the advantage weights ``exp(beta * A)``."""
    iql_deterministic: bool = False
    """IQL: a deterministic actor (squared error weighted by ``exp(beta * A)``) instead of the Gaussian."""
    normalize_obs: bool = True
    """Continuous algorithms: normalize observations with the dataset's mean and std
    (``mmreplay.field_stats``, over the transitions' observations, plus 1e-3)."""
    samples_per_insert: float | None = None
    """Actors: sampled transitions per inserted one (``None``: batch × gradient_steps / train_freq)."""
    publish_every: int = 64
    """Actors: learner updates between weight publications."""
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

    def env_spec(self) -> EnvSpec:
        """The env an online run acts in, as its actors make it (:class:`mmreplay.agent.envs.EnvSpec`)."""
        from ..agent.envs import EnvSpec

        if self.env_id is None:
            raise ValueError("`env_id` is needed: the env an online run acts in")
        return EnvSpec(self.env_id, atari=self.atari or None, max_episode_steps=self.max_episode_steps)


def target_update_interval_of(cfg: TrainConfig) -> int:
    """The target update interval a run uses: ``cfg.target_update_interval``, else the online or
    offline default."""
    if cfg.target_update_interval is not None:
        return int(cfg.target_update_interval)
    return 1000 if cfg.offline else 128


def continuous_config(**overrides: Any) -> TrainConfig:
    """Offline TD3+BC / IQL / BC for Box actions with the defaults of CORL's single-file implementations
    (``td3_bc.py``, ``iql.py``, ``any_percent_bc.py``): batch 256, Adam lr 3e-4 for every network,
    (256, 256) ReLU layers, gamma 0.99, Polyak tau 0.005, no gradient clipping, observations
    normalized, 1,000,000 updates, 10 evaluation episodes every 5,000 updates; TD3+BC's noise 0.2
    clipped at 0.5, actor every 2 updates, alpha 2.5; IQL's expectile 0.7, beta 3, Gaussian actor.
    Then ``overrides`` (``algo`` defaults to ``"td3bc"``)."""
    base = dict(offline=True, algo="td3bc", batch_size=256, learning_rate=3e-4, hidden=(256, 256), gamma=0.99,
                tau=0.005, max_grad_norm=0.0, steps=1_000_000, eval_every=5000, eval_episodes=10, log_every=1000,
                checkpoint_every=10_000)
    return TrainConfig(**{**base, **overrides})


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
    return "action" in schema and schema["action"].dtype.kind == "f"


def atari_config(**overrides: Any) -> TrainConfig:
    """Nature-DQN settings for Atari (frame stacks of 4, CNN, 1M-row store), then ``overrides``."""
    base = dict(atari=True, frame_stack=4, learning_rate=1e-4, batch_size=32, train_freq=4, gradient_steps=1,
                learning_starts=80_000, target_update_interval=1000, end_e=0.01, exploration_fraction=0.10,
                steps=10_000_000, eval_episodes=5, eval_every=250_000, log_every=10_000, checkpoint_every=100_000,
                n_step=1)
    return TrainConfig(**{**base, **overrides})


def minatar_config(**overrides: Any) -> TrainConfig:
    """The DQN of the MinAtar paper (Young & Tian 2019, "MinAtar: An Atari-inspired testbed for
    thorough and reproducible reinforcement learning experiments"), with the settings of its
    reference implementation (``examples/dqn.py`` of github.com/kenjyoung/MinAtar): the MinAtar
    network, centered RMSprop (lr 2.5e-4, squared-gradient decay 0.95, momentum 0.95, eps 0.01),
    batch 32, one update per env step, a 100,000-transition replay memory and 5,000 steps before
    the first update, the target network copied every 1,000 updates, Huber loss, gamma 0.99, the
    target network's max (not double DQN), no gradient clipping, epsilon from 1 to 0.1 and 5M
    steps; then ``overrides``. One difference: epsilon decays over the first 100,000 steps here,
    over the 100,000 steps after the first 5,000 (uniformly random) ones in the paper's code."""
    steps = int(overrides.get("steps", 5_000_000))
    base = dict(minatar=True, optimizer="rmsprop", learning_rate=2.5e-4, batch_size=32, train_freq=1, gradient_steps=1,
                learning_starts=5000, capacity=100_000, target_update_interval=1000, double=False, loss="huber",
                max_grad_norm=0.0, gamma=0.99, n_step=1, start_e=1.0, end_e=0.1,
                exploration_fraction=min(1.0, 100_000 / max(1, steps)), steps=5_000_000, eval_every=50_000,
                eval_episodes=10, log_every=10_000, checkpoint_every=100_000)
    return TrainConfig(**{**base, **overrides})


_POSITIVE = ("steps", "num_envs", "envs_per_actor", "capacity", "batch_size", "n_step", "train_freq",
             "target_update_interval", "frame_stack", "publish_every", "prefetch")


def validate_config(cfg: TrainConfig) -> None:
    """Raise ``ValueError`` naming the first bad field (before anything is created)."""
    for name in _POSITIVE:
        if getattr(cfg, name) is not None and int(getattr(cfg, name)) < 1:
            raise ValueError(f"`{name}` must be >= 1, got {getattr(cfg, name)}")
    for name in ("gradient_steps", "learning_starts", "eval_every", "eval_episodes", "log_every", "checkpoint_every",
                 "actors", "max_grad_norm", "cql_alpha"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"`{name}` must be >= 0, got {getattr(cfg, name)}")
    if cfg.algo not in ("dqn", "bc", "cql", "td3bc", "iql"):
        raise ValueError(f"`algo` must be 'dqn', 'bc', 'cql', 'td3bc' or 'iql', got {cfg.algo!r}")
    if cfg.policy_freq < 1:
        raise ValueError(f"`policy_freq` must be >= 1, got {cfg.policy_freq}")
    for name in ("policy_noise", "noise_clip", "td3bc_alpha"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"`{name}` must be >= 0, got {getattr(cfg, name)}")
    if not 0.0 < cfg.iql_expectile < 1.0:
        raise ValueError(f"`iql_expectile` must lie in (0, 1), got {cfg.iql_expectile}")
    if cfg.iql_beta <= 0:
        raise ValueError(f"`iql_beta` must be > 0, got {cfg.iql_beta}")
    if cfg.algo in ("td3bc", "iql") and cfg.tau >= 1.0:
        raise ValueError(f"`tau`={cfg.tau} copies the target networks at every update; {cfg.algo} Polyak-averages "
                         "them (CORL: 0.005): build the config with mmreplay.train.continuous_config(...)")
    if not cfg.offline and cfg.algo != "dqn":
        raise ValueError(f"`algo`={cfg.algo!r} is offline only: pass offline=True (--offline) or algo='dqn'")
    if not cfg.store and not (cfg.offline and cfg.archive):
        raise ValueError("`store` is required: the store to train from (offline) or to fill (online)")
    if cfg.archive and not cfg.offline:
        raise ValueError("`archive` is for offline training (pass offline=True / --offline)")
    if not cfg.offline and not cfg.env_id:
        raise ValueError("`env_id` is required online")
    if cfg.optimizer not in ("adam", "rmsprop"):
        raise ValueError(f"`optimizer` must be 'adam' or 'rmsprop', got {cfg.optimizer!r}")
    if cfg.minatar and cfg.atari:
        raise ValueError("`minatar` and `atari` are exclusive: one preprocessing and network per run")
    if cfg.loss not in ("huber", "mse"):
        raise ValueError(f"`loss` must be 'huber' or 'mse', got {cfg.loss!r}")
    for name in ("gamma", "tau", "start_e", "end_e", "exploration_fraction", "per_alpha", "per_beta", "per_beta_final"):
        v = getattr(cfg, name)
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"`{name}` must lie in [0, 1], got {v}")
    if cfg.tau == 0:
        raise ValueError("`tau` must be > 0")
    if cfg.learning_rate <= 0:
        raise ValueError(f"`learning_rate` must be > 0, got {cfg.learning_rate}")
    if not cfg.hidden or any(int(h) < 1 for h in cfg.hidden):
        raise ValueError(f"`hidden` must be positive layer widths, got {cfg.hidden}")
    if cfg.samples_per_insert is not None and cfg.samples_per_insert <= 0:
        raise ValueError(f"`samples_per_insert` must be > 0, got {cfg.samples_per_insert}")
    if cfg.sampler_mode not in ("exact", "windowed"):
        raise ValueError(f"`sampler_mode` must be 'exact' or 'windowed', got {cfg.sampler_mode!r}")
    if cfg.sampler_mode == "windowed" and cfg.prioritized:
        raise ValueError("`sampler_mode`='windowed' is for uniform sampling, not `prioritized`")
    if cfg.cache_bytes is not None and cfg.cache_bytes < 1:
        raise ValueError(f"`cache_bytes` must be a positive number of bytes, got {cfg.cache_bytes}")
    if cfg.offline and cfg.actors:
        raise ValueError("`actors` is for online training; offline runs read the store only")


def default_run_dir(cfg: TrainConfig) -> Path:
    """``runs/<env>__<algo>__s<seed>`` (stable, so ``--resume`` finds it); offline runs are named
    after ``eval_env`` (``<algo>-offline``), or after the store or archive when there is none."""
    name = (cfg.env_id or cfg.eval_env or Path(cfg.store or str(cfg.archive).rstrip("/")).name).replace("/", "-")
    return Path("runs") / f"{name}__{cfg.algo}{'-offline' if cfg.offline else ''}__s{cfg.seed}"


def resume_config(run_dir: str | Path, **overrides: Any) -> TrainConfig:
    """The config saved in ``run_dir``'s checkpoint, with ``overrides`` (e.g. more ``steps``) and
    ``resume=True``."""
    from .checkpoint import CHECKPOINT_NAME, load_checkpoint  # torch

    payload = load_checkpoint(Path(run_dir) / CHECKPOINT_NAME)
    saved = payload["config"]
    saved["hidden"] = tuple(saved["hidden"])
    return TrainConfig(**{**saved, **overrides, "resume": True, "run_dir": str(run_dir)})


def config_for(env_id: str | None = None, **options: Any) -> TrainConfig:
    """The config ``mmreplay train`` runs for these options: the one place a preset is picked, so a
    run from Python (``mmreplay.train.train(config_for("ALE/Pong-v5", atari=True, store=...))``)
    is the run the CLI makes of the same inputs.

    Options are ``TrainConfig`` fields (``None`` values are left out). ``resume=True``: the config
    saved in ``run_dir`` (default: the run directory these options name) with the options over it.
    Else the preset the options pick, with the options over it: CORL's settings
    (``continuous_config``) for ``algo`` ``td3bc`` or ``iql``, or ``bc`` offline on a store or
    archive of Box actions; Nature-DQN's (``atari_config``) with ``atari=True``; MinAtar's
    (``minatar_config``) with ``minatar=True`` or a ``MinAtar/`` env id; else ``TrainConfig``'s
    defaults. Raises ``ValueError`` when both ``store`` and ``archive`` are given."""
    from dataclasses import replace

    given = {k: v for k, v in options.items() if v is not None}
    if given.get("store") is not None and given.get("archive") is not None:
        raise ValueError("`store` and `archive` are exclusive: train from one of them")
    if env_id is not None:
        given["env_id"] = env_id
    if given.pop("resume", False):
        run_dir = given.pop("run_dir", None) or str(default_run_dir(replace(TrainConfig(), **given)))
        return resume_config(run_dir, **given)
    if given.get("minatar") is None and str(given.get("env_id", "")).startswith("MinAtar/"):
        given["minatar"] = True
    algo = given.get("algo")
    if algo in ("td3bc", "iql") or (algo == "bc" and given.get("offline")
                                    and box_actions(given.get("store"), given.get("archive"))):
        return continuous_config(**given)  # Box actions: CORL's settings
    if given.get("atari"):
        return atari_config(**given)
    return minatar_config(**given) if given.get("minatar") else TrainConfig(**given)


def _run_dir(cfg: TrainConfig) -> Path:
    """Validate ``cfg`` (before anything is made) and return its run directory."""
    validate_config(cfg)
    return Path(cfg.run_dir) if cfg.run_dir else default_run_dir(cfg)


def linear_schedule(start: float, end: float, duration: float, t: float) -> float:
    """Linear from ``start`` to ``end`` over ``duration`` steps, then ``end``."""
    if duration <= 0:
        return end
    return start + min(t / duration, 1.0) * (end - start)
