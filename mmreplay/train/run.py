"""The run's state (:class:`Run`) and what it did (:class:`TrainResult`): the run directory, the
counters, the sampler, metrics, evaluations and checkpoints on schedule, kept out of the training
loops so that they read top to bottom.

Invariants kept here:

* a run directory holds at most one run: a new run refuses a directory with a checkpoint
  (``resume`` continues it instead), and a resumed run drops the metric rows logged after its
  checkpoint's step, so ``metrics.csv`` reads as one run;
* training time excludes set-up (imports, compilation, store creation) and evaluations, in every
  loop and in ``mmreplay``'s benchmarks alike;
* priorities (prioritized replay) are saved in the store *before* the checkpoint that counts on
  them is written, and both writes are atomic.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..agent.evaluation import evaluate
from ..agent.policy import save_policy
from .batches import pick_device
from .checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from .runlog import RunLog

if TYPE_CHECKING:
    from ..sampling.uniform import TransitionSampler
    from ..storage import ReplayStore, Writer
    from .settings import TrainConfig

log = logging.getLogger(__name__)

PROGRESS_LINE_S = 30.0
"""Seconds between progress lines when stderr is not a terminal (no bar): long runs are not silent in logs."""


@dataclass
class TrainResult:
    """What a run did; also written to ``run_dir/result.json``."""

    run_dir: str
    """The run directory."""
    policy_path: str
    """The final policy file, ``run_dir/policy.pt`` (``mmreplay.agent.load_policy`` reads it)."""
    env_steps: int
    """Env steps taken, resumed sessions included (offline: 0)."""
    updates: int
    """Learner updates made, resumed sessions included."""
    wall_s: float
    """Training wall time (set-up and evaluations excluded), summed over resumed sessions."""
    cpu_s: float
    """CPU time of this process's threads over the same spans (less sensitive to other load)."""
    evals: list[tuple[int, float, float]]
    """(step, mean, std) of every evaluation."""
    final_return: float | None
    """Mean return of the last evaluation (``None``: no evaluation ran)."""
    best_return: float | None
    """Best mean evaluation return (``best_policy.pt`` holds its network; ``None``: no evaluation ran)."""
    steps_per_s: float
    """Env steps per second of training time, from the metric rows (0.0 offline)."""
    updates_per_s: float
    """Learner updates per second of training time, from the metric rows."""
    data_wait: float
    """Share (0 to 1) of the learner's time spent waiting for batches: measured over the whole session
    when the loop did, else the mean of the metric rows."""
    damaged_rows: int = 0
    """Rows of the store that failed their checksums and were left out of every batch."""
    interrupted: int | None = None
    """The signal (SIGINT, SIGTERM) that stopped the run early, if one did: it stopped at a safe point,
    marked the episodes it cut, and wrote a checkpoint (``--resume`` continues from it)."""
    already_finished: bool = False
    """A resume of a run that had reached its ``steps``: this is its saved result, nothing ran (not
    written to result.json)."""


class Run:
    """Bookkeeping shared by the loops (kept out of them so they read top to bottom)."""

    def __init__(self, cfg: TrainConfig, run_dir: Path) -> None:
        self.cfg = cfg
        """The run's config."""
        self.dir = run_dir
        """The run directory (made by :meth:`begin`)."""
        ckpt = self.dir / CHECKPOINT_NAME
        if not cfg.resume and ckpt.exists():
            raise FileExistsError(f"{self.dir} already holds a run (checkpoint.pt): pass --resume to continue it, "
                                  "or another --run-dir")
        self.device = pick_device(cfg.hardware.device)
        """The device the run trains on (``cfg.hardware.device``, :func:`mmreplay.train.pick_device`)."""
        if cfg.hardware.threads:
            torch.set_num_threads(cfg.hardware.threads)
        elif self.device.type == "cpu" and not cfg.atari:
            torch.set_num_threads(1)  # small MLP matmuls lose more to thread hand-offs than they gain
        if cfg.hardware.flush_denormal and self.device.type == "cpu":
            torch.set_flush_denormal(True)  # (a no-op where the CPU cannot)
        torch.manual_seed(cfg.seed)
        self.payload = load_checkpoint(ckpt, self.device) if cfg.resume else None
        """The checkpoint a resumed run continues from (``load_checkpoint``), ``None`` for a new run: the
        loops restore the learner, the random states and the sampler from it."""
        counters = self.payload["counters"] if self.payload else {}
        self.env_steps = int(counters.get("env_steps", 0))
        """Env steps taken, resumed sessions included (the loops count them)."""
        self.updates = int(counters.get("updates", 0))
        """Learner updates made, resumed sessions included (the loops count them)."""
        self.episodes = int(counters.get("episodes", 0))
        """Episodes finished, resumed sessions included (the online loops count them)."""
        self.best = counters.get("best_eval")
        """The best mean evaluation return so far (``best_policy.pt`` holds its network), ``None``
        before the first evaluation."""
        self._time_before = float(counters.get("time_s", 0.0))
        self._cpu_before = float(counters.get("cpu_s", 0.0))
        self.evals: list[tuple[int, float, float]] = [tuple(e) for e in counters.get("evals", [])]  # type: ignore[misc]
        """(step, mean, std) of every evaluation, resumed sessions included."""
        step = self.step
        self.log: RunLog | None = None  # made by begin(), once every input is open
        """The metrics log (``metrics.csv``, TensorBoard), made by :meth:`begin`."""
        self._bar: Any = None
        self._lines, self._line_t = False, 0.0  # progress lines without a terminal (begin() decides)
        self._t0 = time.perf_counter()
        self._cpu0 = time.process_time()
        self._last = (self._t0, self.env_steps, self.updates)
        self.returns: list[float] = []
        """Returns of the episodes finished since the last metric row (the online loops add them;
        :meth:`maybe_log` writes their mean and empties the list)."""
        self.wait_s = 0.0
        """Seconds spent waiting for batches since the last metric row (the synchronous loop adds them)."""
        self.busy_s = 0.0
        """Seconds spent on everything else since the last metric row (as ``wait_s``)."""
        self.next_log = next_multiple(step, cfg.report.log_every)
        """The step at which :meth:`maybe_log` writes the next metric row (``log_every``)."""
        self._logged = step if cfg.resume else -1  # step of the last metric row
        self._next_eval = next_multiple(step, cfg.report.eval_every) if cfg.report.eval_every else math.inf
        self._next_ckpt = next_multiple(step, cfg.report.checkpoint_every) if cfg.report.checkpoint_every else math.inf
        self._profiler: Any = None

    def begin(self) -> None:
        """Make the run directory, its ``config.json`` and metrics log. The loops call it once the
        env, the store and the networks are made, so a run that fails on its inputs (a wrong env
        id, a missing store) leaves no run directory behind."""
        if self.log is not None:
            return
        cfg, step = self.cfg, self.step
        if not cfg.offline and cfg.steps <= cfg.algo.learning_starts:
            log.warning("steps=%s ends before learning_starts=%s (--steps, --learning-starts): the run fills the "
                        "store and makes no update", f"{cfg.steps:,}", f"{cfg.algo.learning_starts:,}")
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
        self.log = RunLog(self.dir, resume_step=step if cfg.resume else None, tensorboard=cfg.report.tensorboard)
        if cfg.resume:
            log.info("resuming %s from %s %d", self.dir, "update" if cfg.offline else "env step", step)
        show = cfg.report.progress if cfg.report.progress is not None else sys.stderr.isatty()
        # stderr not a terminal (a log file, a pipe) and no bar asked for: a progress line every PROGRESS_LINE_S
        self._lines = cfg.report.progress is None and not show
        self._line_t = time.perf_counter()
        if show:
            from tqdm import tqdm

            self._bar = tqdm(total=cfg.steps, initial=step, unit="update" if cfg.offline else "step",
                            unit_scale=True, dynamic_ncols=True, file=sys.stderr)

    def start_clock(self) -> None:
        """Training time starts now (set-up, imports and compilation are not counted)."""
        self.begin()
        self._t0 = time.perf_counter()
        self._cpu0 = time.process_time()
        self._last = (self._t0, self.env_steps, self.updates)

    @property
    def step(self) -> int:
        """The run's step: learner updates offline, env steps online (what ``steps``, ``log_every``,
        ``eval_every`` and ``checkpoint_every`` count)."""
        return self.updates if self.cfg.offline else self.env_steps

    @property
    def wall_s(self) -> float:
        """Training wall time in seconds since :meth:`start_clock` (evaluations excluded), plus that of
        the sessions a resumed run continues."""
        return self._time_before + time.perf_counter() - self._t0

    @property
    def cpu_s(self) -> float:
        """CPU time in seconds of this process's threads over the same spans as :attr:`wall_s`."""
        return self._cpu_before + time.process_time() - self._cpu0

    def meta(self) -> dict[str, Any]:
        """What the policy files and the checkpoint record about the run: env id (the evaluation env
        when set), ``algo``, ``seed``, ``atari``, ``frame_stack``, ``offline``."""
        c = self.cfg
        return {"env_id": c.report.eval_env or c.env_id, "algo": c.algo.name, "seed": c.seed, "atari": c.atari,
                "frame_stack": c.frame_stack, "offline": c.offline}

    def make_sampler(self, store: ReplayStore, total_updates: int,
                     refresh_interval_s: float | None = 1.0) -> TransitionSampler:
        """The run's sampler over ``store``, as the config says: prioritized (``beta`` annealed over
        ``total_updates``) or uniform; refreshed every ``refresh_interval_s`` online, never offline;
        on resume, with the checkpoint's random state. Loads the sampling kernels (set-up)."""
        from ..sampling import load_kernels
        from ..sampling.prioritized import PrioritizedSampler
        from ..sampling.uniform import UniformSampler

        c = self.cfg
        refresh = None if c.offline else refresh_interval_s
        if c.replay.prioritized:
            sampler: TransitionSampler = PrioritizedSampler(
                store, alpha=c.replay.per_alpha, beta=c.replay.per_beta, beta_final=c.replay.per_beta_final,
                beta_steps=max(1, total_updates), seed=c.seed, refresh_interval_s=refresh, name=self.dir.name,
                n_step=c.replay.n_step, gamma=c.algo.gamma, frame_stack=c.frame_stack)
        else:
            sampler = UniformSampler(store, seed=c.seed, refresh_interval_s=refresh, n_step=c.replay.n_step, gamma=c.algo.gamma,
                                     frame_stack=c.frame_stack, mode=c.replay.sampler_mode, cache_bytes=c.replay.cache_bytes)
        if self.payload and self.payload.get("sampler"):
            sampler.set_random_state(self.payload["sampler"])
        load_kernels()  # set-up, before the clock starts (the first sample would import them)
        return sampler

    def maybe_log(self, learner: Any, epsilon: float | None = None, data_wait: float | None = None,
                  force: bool = False) -> None:
        """Write a metric row (and move the progress bar) when ``log_every`` steps have passed, or now
        with ``force`` unless this step has one: rates since the last row, the learner's mean loss and
        Q, the mean return of the episodes since, ``data_wait`` (default: from ``wait_s``/``busy_s``)."""
        if not force and self.step < self.next_log:
            return
        if force and self.step == self._logged:
            return
        self._logged = self.step
        self.next_log = next_multiple(self.step, self.cfg.report.log_every)
        now = time.perf_counter()
        t, s, u = self._last
        dt = max(now - t, 1e-9)
        self._last = (now, self.env_steps, self.updates)
        loss, q = learner.read_stats()
        if data_wait is None:
            total = self.wait_s + self.busy_s
            data_wait = self.wait_s / total if total > 0 else None
            self.wait_s = self.busy_s = 0.0
        steps_per_s = (self.env_steps - s) / dt if not self.cfg.offline else None
        assert self.log is not None, "begin() makes the log"
        self.log.write(step=self.step, updates=self.updates, time_s=self.wall_s, episodes=self.episodes or None,
                       return_mean=float(np.mean(self.returns)) if self.returns else None, loss=loss, q_mean=q,
                       epsilon=epsilon, steps_per_s=steps_per_s, updates_per_s=(self.updates - u) / dt,
                       data_wait=data_wait)
        self.returns = []
        if self._lines and now - self._line_t >= PROGRESS_LINE_S:
            self._line_t = now
            log.info("%s %s/%s (%.0f%%): %s updates, %s/s%s%s", "update" if self.cfg.offline else "step",
                     f"{self.step:,}", f"{self.cfg.steps:,}", 100 * self.step / max(self.cfg.steps, 1),
                     f"{self.updates:,}", f"{(self.updates - u) / dt if self.cfg.offline else steps_per_s or 0:,.0f}",
                     f", last eval {self.evals[-1][1]:.1f}" if self.evals else "",
                     f", data wait {data_wait:.0%}" if data_wait is not None else "")
        if self._bar is not None:  # the bar moves with the metric rows (every log_every steps)
            post = {"upd/s": f"{(self.updates - u) / dt:,.0f}"}
            if steps_per_s is not None:
                post["steps/s"] = f"{steps_per_s:,.0f}"
            if self.evals:
                post["eval"] = f"{self.evals[-1][1]:.1f}"
            if data_wait is not None:
                post["wait"] = f"{data_wait:.0%}"
            self._bar.set_postfix(post, refresh=False)
            self._bar.update(min(self.step, self.cfg.steps) - self._bar.n)

    def maybe_eval(self, learner: Any, env_id: str | None, force: bool = False) -> bool:
        """Evaluate when due; True when ``target_return`` is reached."""
        c = self.cfg
        if not env_id or c.report.eval_episodes == 0 or (not force and self.step < self._next_eval):
            return False
        self._next_eval = next_multiple(self.step, c.report.eval_every) if c.report.eval_every else math.inf
        t0, c0 = time.perf_counter(), time.process_time()
        rets = evaluate(learner.policy_net, env_id, c.report.eval_episodes, seed=c.seed + 100_000 + len(self.evals),
                        device=self.device, atari=c.atari or None, frame_stack=c.frame_stack,
                        max_episode_steps=c.max_episode_steps)
        spent = time.perf_counter() - t0  # evaluation time is not training time
        self._t0 += spent
        self._cpu0 += time.process_time() - c0
        self._last = (self._last[0] + spent, *self._last[1:])
        mean, std = float(rets.mean()), float(rets.std())
        self.evals.append((self.step, mean, std))
        assert self.log is not None, "begin() makes the log"
        self.log.write(step=self.step, updates=self.updates, time_s=self.wall_s, eval_return=mean, eval_std=std)
        log.info("step %d: eval return %.1f ± %.1f", self.step, mean, std)
        if self.best is None or mean >= self.best:
            self.best = mean
            save_policy(self.dir / "best_policy.pt", learner.policy_net, epsilon=None, step=self.step, eval_return=mean,
                        **self.meta())
        if c.report.target_return is not None and mean >= c.report.target_return:
            log.info("step %d: the target return %g is reached: training stops here (target_return)", self.step,
                     c.report.target_return)
            return True
        return False

    def maybe_checkpoint(self, learner: Any, sampler: TransitionSampler | None, rng: np.random.Generator | None,
                         epsilon: float | None, force: bool = False, writer: Writer | None = None) -> None:
        """Write ``checkpoint.pt`` when ``checkpoint_every`` steps have passed (or with ``force``): the
        learner, counters, ``rng`` and sampler state. First ``writer`` publishes (the store visibly holds
        every env step counted) and, online, the sampler saves its priorities in the store."""
        if not force and self.step < self._next_ckpt:
            return
        if writer is not None:
            writer.publish()  # the store holds (visibly) every env step the checkpoint counts
        self._next_ckpt = next_multiple(self.step, self.cfg.report.checkpoint_every) if self.cfg.report.checkpoint_every else math.inf
        save = getattr(sampler, "save", None)
        if save is not None and not self.cfg.offline:
            save()  # priorities live in the store; written before the checkpoint that counts on them
        counters = {"env_steps": self.env_steps, "updates": self.updates, "episodes": self.episodes,
                    "time_s": self.wall_s, "cpu_s": self.cpu_s, "best_eval": self.best, "evals": self.evals}
        save_checkpoint(self.dir / CHECKPOINT_NAME, **learner.checkpoint_parts(), config=self.cfg.to_dict(),
                        counters=counters, rng=rng, sampler=sampler, meta={**self.meta(), "epsilon": epsilon})

    def profile_step(self) -> None:
        """Profile updates 10..30 of this session when ``profile`` is set (trace in run_dir/profile)."""
        if not self.cfg.hardware.profile:
            return
        if self._profiler is None:
            from torch.profiler import ProfilerActivity, profile, schedule

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
            out = self.dir / "profile"
            out.mkdir(exist_ok=True)

            def done(p: Any) -> None:
                p.export_chrome_trace(str(out / "trace.json"))
                (out / "summary.txt").write_text(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
                log.info("profiler trace written to %s", out)

            self._profiler = profile(activities=acts, schedule=schedule(wait=5, warmup=5, active=20, repeat=1),
                                    on_trace_ready=done)
            self._profiler.__enter__()
        self._profiler.step()

    def finish(self, learner: Any, sampler: TransitionSampler | None, rng: np.random.Generator | None,
               epsilon: float | None, eval_env: str | None, stopped: bool,
               data_wait: float | None = None) -> TrainResult:
        """End the session: a last evaluation (unless ``stopped``, or one at the last step exists),
        metric row and checkpoint, then ``policy.pt`` and ``result.json``; returns the
        :class:`TrainResult`. ``data_wait``: the session's share of time waiting for batches, when
        the loop measured it over the whole session (else the metric rows' mean), in both."""
        if self._profiler is not None:
            self._profiler.__exit__(None, None, None)
        # one evaluation per evaluation point: the end of the run is one, unless an evaluation at or
        # past the last step already happened (actors may step a little past it: 6002 for 6000)
        if not stopped and (not self.evals or self.evals[-1][0] < min(self.step, self.cfg.steps)):
            self.maybe_eval(learner, eval_env, force=True)
        self.maybe_log(learner, epsilon, force=True)
        self.maybe_checkpoint(learner, sampler, rng, epsilon, force=True)
        policy = self.dir / "policy.pt"
        save_policy(policy, learner.policy_net, epsilon=None, step=self.step, **self.meta())
        assert self.log is not None, "begin() makes the log"
        self.log.close()
        if self._bar is not None:
            self._bar.close()
        wall, cpu = self.wall_s, self.cpu_s
        rows = _read_rates(self.dir)
        store = getattr(sampler, "store", None)
        damaged = store.check_counts()["damaged_rows"] if hasattr(store, "check_counts") else 0
        res = TrainResult(run_dir=str(self.dir), policy_path=str(policy), env_steps=self.env_steps,
                          updates=self.updates, wall_s=wall, cpu_s=cpu, evals=self.evals,
                          final_return=self.evals[-1][1] if self.evals else None, best_return=self.best,
                          damaged_rows=damaged, **rows)
        if data_wait is not None:
            res.data_wait = data_wait
        save_result(res)
        return res


def save_result(res: TrainResult) -> None:
    """``run_dir/result.json``: what the run did (``--resume`` reads it back)."""
    data = asdict(res)
    data.pop("already_finished")
    (Path(res.run_dir) / "result.json").write_text(json.dumps(data, indent=2) + "\n")


def next_multiple(x: int, every: int) -> int | float:
    return (x // every + 1) * every if every > 0 else math.inf


def _read_rates(run_dir: Path) -> dict[str, float]:
    from .runlog import read_metrics

    m = read_metrics(run_dir)
    t = m["time_s"]
    ok = ~np.isnan(m["updates_per_s"])
    wait = m["data_wait"][~np.isnan(m["data_wait"])]
    span = float(np.nanmax(t)) if len(t) else 0.0
    steps = float(np.nanmax(m["step"])) if len(t) else 0.0
    ups = float(np.nanmax(m["updates"])) / span if span > 0 and ok.any() else 0.0
    online = bool(np.nan_to_num(m["steps_per_s"]).max(initial=0) > 0)
    return {"steps_per_s": steps / span if span > 0 and online else 0.0, "updates_per_s": ups,
            "data_wait": float(wait.mean()) if len(wait) else 0.0}
