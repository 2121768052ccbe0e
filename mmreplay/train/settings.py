"""The settings of a training run: :class:`TrainConfig` (one docstring per field), its groups, and
what a learner is built from (:class:`LearnerSetup`). Plain dataclasses, no torch and no registry:
``config`` picks presets and builds these; the learners and the algorithms read them.

Every setting has one name, unique across :class:`TrainConfig`, its groups and every registered
algorithm's config (``mmreplay.train.config.from_flat`` maps names onto places).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from .algos.base import AlgoConfig

if TYPE_CHECKING:
    import torch

    from ..agent.envs import EnvSpec
    from ..storage import ReplayStore


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


GROUPS = {"replay": ReplayConfig, "acting": ActingConfig, "report": ReportConfig, "hardware": HardwareConfig}
"""TrainConfig's groups of settings: attribute name -> dataclass."""


@functools.cache
def setting_groups() -> dict[str, str | None]:
    """Each run setting's name (``algo`` included) -> its group (``None``: a field of
    :class:`TrainConfig` itself); cached: read it only."""
    out: dict[str, str | None] = {f.name: None for f in fields(TrainConfig) if f.name not in GROUPS}
    for group, cls in GROUPS.items():
        out.update({f.name: group for f in fields(cls)})
    return out


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Everything a training run needs: the algorithm's config (``algo``, required) and the run's
    settings, grouped (``replay``, ``acting``, ``report``, ``hardware``). Build one with
    :func:`mmreplay.train.config_for` to get the preset ``mmreplay train`` applies. "steps" are env
    steps online and learner updates offline."""

    algo: AlgoConfig = field(kw_only=True)
    """The algorithm and its settings (``mmreplay.train.algos``; ``algo.name`` names it)."""
    env_id: str | None = None
    """Gymnasium id to train in (online), or to evaluate in (offline, unless ``eval_env``)."""
    store: str = ""
    """Store path: the replay memory online (created if missing, else appended to), the dataset offline."""
    offline: bool = False
    """Train from the store only (opened read-only); no env interaction except evaluation."""
    archive: str | None = None
    """Offline: train from a zarr archive (path or fsspec URL) instead of ``store``, read-only
    (its segments are fetched into a temporary local cache first, see ``mmreplay.archive``)."""
    steps: int = 100_000
    """Online: env steps in total (actions taken, all envs and actors). Offline: learner updates."""
    seed: int = 1
    """Seed of envs, networks, exploration and sampling."""
    run_dir: str | None = None
    """Where metrics, checkpoints and policies go (default ``runs/ENV__ALGO__sSEED``; offline
    ``runs/EVAL_ENV__ALGO-offline__sSEED``, or the store's (archive's) name without an eval env)."""
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
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in GROUPS and f.name != "algo"}
        for group in GROUPS:
            out.update(asdict(getattr(self, group)))
        out.update(asdict(self.algo))
        out["algo"] = self.algo.name
        return out




@dataclass(frozen=True)
class LearnerSetup:
    """What an algorithm's learner factory gets: the run's config, the store it learns from (opened),
    the device, the evaluation env id (``None``: none) and, for discrete actions, the number of
    actions."""

    cfg: TrainConfig
    store: ReplayStore
    device: torch.device
    eval_env: str | None = None
    n_actions: int | None = None
