"""Actors: processes that step gymnasium vector envs and append every step to a store.

:func:`run_collect` is the library form of ``mmreplay collect`` (it takes the run's specs, see
:mod:`mmreplay.actors.specs`; :func:`collect` is its keyword form); :class:`ActorPool` runs the same
actors for an online trainer, without a step budget, under a samples-per-insert limit.

Invariants:

* Each worker is a **spawned** process (never forked) with its own vector env of ``E`` copies and
  its own :class:`~mmreplay.Writer`; workers share nothing but the store directory, so two
  ``collect`` runs (or two terminals) on one store just add data.
* What the store holds is exactly what the env emitted. With gymnasium's default next-step
  autoreset one writer with ``E`` lanes stores each vector step as one row per lane (the row after
  a done is the episode's final observation). Same-step autoreset and disabled autoreset emit two
  rows for a lane that ends an episode (its last transition and its final observation from
  ``info["final_obs"]``); lanes then drift apart in time, so those modes use one single-lane writer
  per env copy. Termination and truncation are kept apart in every mode; the last step of an
  episode the end of the run cuts is stored as a truncation (D4RL ``timeouts``, Minari).
* Every published row survives Ctrl-C (workers are told to stop, finish their step and close
  their writers, keeping the final observations) and a crash of any other worker. A worker also
  stops when its parent dies. A crashed worker is reported; the others finish. Its error crosses
  the process boundary as the exception it raised (pickled; an ``MMReplayError`` keeps its type,
  message and hint) beside its formatted traceback: :attr:`CollectResult.exceptions` and
  :attr:`CollectResult.errors`.
* A store collect creates from a Box action space records ``action_scale: "env"`` and the Box's
  bounds in its metadata (:func:`action_scale_metadata`).
* Seeds: env copy ``j`` of worker ``w`` is reset with ``seed + w * E + j`` and the random policy's
  action space with ``seed + w``; the seed, env id, spaces, policy and mmreplay version of every run
  go to a provenance record in the store (:meth:`ReplayStore.provenance`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import queue as queue_mod
import shutil
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..agent.envs import AutoresetName, EnvSpec
from .progress import CollectProgress
from .specs import CollectSpec, PolicyFn, PolicySpec, WriterSpec
from .worker import WorkerConfig, check_policy, run_worker

__all__ = ["ActorPool", "CollectResult", "CollectSpec", "EnvSpec", "Interrupts", "PolicyFn", "PolicySpec",
           "WorkerConfig", "WriterSpec", "action_scale_metadata", "collect", "env_metadata", "open_store_for_spaces",
           "run_collect", "run_worker"]


@dataclasses.dataclass
class CollectResult:
    """What a collect run stored, per run and per worker."""

    steps: int
    """Env steps stored (rows written, one per env copy per vector step)."""
    transitions: int
    """Of those, steps that are sampleable transitions (the autoreset steps of next-step mode are not)."""
    episodes: int
    """Episodes that ended on their own (terminated, or truncated by the env)."""
    episode_returns: list[float]
    """The return of each episode that ended on its own, in the order the workers reported them."""
    seconds: float
    """Wall time of the whole run (workers' start-up included)."""
    bytes_written: int
    """Record bytes of the rows stored (``steps`` times the store's record size)."""
    seed: int
    """The run's base seed (drawn if none was given): the same seed, the same env streams."""
    interrupted: bool = False
    """Whether a signal (Ctrl-C, SIGTERM) stopped the run early; what was written is kept."""
    signal: int | None = None
    """The signal that stopped the run (SIGINT or SIGTERM), if one did."""
    errors: dict[int, str] = dataclasses.field(default_factory=dict)
    """Worker index -> what ended it, as text for display and records: the formatted traceback of
    the exception it raised, or how it died (``worker 1 died (signal 9)``). Every failed worker is
    here."""
    exceptions: dict[int, BaseException] = dataclasses.field(default_factory=dict)
    """Worker index -> the exception it raised, rebuilt in this process from its pickle (no traceback
    or cause attached: those are in ``errors``), for a caller that acts on its type: ``mmreplay
    collect`` prints an ``MMReplayError``'s message with its hint. A worker that died without raising
    (a signal, an exit code), or whose exception does not pickle, is in ``errors`` only."""
    provenance: str | None = None
    """The name of the run's provenance record in the store (``ReplayStore.provenance()``)."""
    loop_seconds: float = 0.0
    """The longest worker's stepping loop (no process start-up, env creation or store opening)."""
    loop_cpu_seconds: float = 0.0
    """CPU time of the workers' stepping loops, summed (every thread of each worker process)."""
    episodes_cut: int = 0
    """Running episodes the end of the run cut (stored truncated; ``info()`` counts them apart)."""

    @property
    def steps_per_s(self) -> float:
        """Env steps stored per second of the whole run (``steps / seconds``; 0.0 when no time passed)."""
        return self.steps / self.seconds if self.seconds > 0 else 0.0



# -- processes -----------------------------------------------------------------------------
def _worker_process(cfg: WorkerConfig, q: Any, stop: Any, counts: Any, allowed: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; Ctrl-C goes to the group
    terminated = threading.Event()  # a SIGTERM to the group (a service manager): stop as if told, close the writers
    signal.signal(signal.SIGTERM, lambda *_: terminated.set())
    # one torch intra-op thread per actor process (unless OMP_NUM_THREADS says otherwise): a policy's forward
    # pass is over a few observations and runs beside the learner and the other actors; torch's default, a
    # thread per core in each, oversubscribed the cores (`mmreplay train --atari --actors 2`: 47 env steps/s
    # on 2 cores in benchmarks/atari_train.py, 148 with one thread). Set before torch is imported, if it is.
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    else:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    parent = os.getppid()
    w = cfg.worker

    def report(kind: str, payload: Any) -> None:
        q.put((kind, w, payload))

    def should_stop() -> bool:
        return stop.is_set() or terminated.is_set() or os.getppid() != parent

    if counts is not None:
        lock, raw = counts.get_lock(), counts.get_obj()

    def may_step(n: int) -> bool:  # counts steps as they are taken: the limit is exact, not per report
        if stop.is_set():  # no step after stop()
            return False
        limit = allowed.value
        with lock:  # check and count as one step: two actors must not both pass the check at the limit
            if limit >= 0 and sum(raw) + n > limit:
                return False
            raw[w] += n
        return True

    try:
        run_worker(cfg, report, should_stop, may_step if counts is not None else None)
    except BaseException as exc:
        q.put(("error", w, (traceback.format_exc(), _pickled(exc))))
        raise SystemExit(1) from None
    q.put(("exit", w, None))


def _pickled(exc: BaseException) -> bytes | None:
    """``exc`` pickled for the parent (the queue's feeder thread would drop a message it cannot
    pickle, text and all), or ``None`` when it does not pickle or unpickle."""
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
    except Exception:
        return None
    return data


def _failure(payload: tuple[str, bytes | None]) -> tuple[str, BaseException | None]:
    """A worker's ``("error", ...)`` payload as its traceback text and the exception it raised
    (``None`` when none came, or it cannot be rebuilt here)."""
    text, data = payload
    if data is None:
        return text, None
    try:
        exc = pickle.loads(data)
    except Exception:
        return text, None
    return text, exc if isinstance(exc, BaseException) else None


def _spawn(cfgs: list[WorkerConfig], *, limited: bool) -> tuple[Any, Any, Any, Any, list[Any]]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    stop = ctx.Event()
    # steps per actor and the limit (ActorPool only); may_step checks and counts under the array's lock.
    # The caller keeps both alive while the processes run (a child rebuilds the lock from its name).
    counts = ctx.Array("q", len(cfgs)) if limited else None
    allowed = ctx.Value("q", -1, lock=False) if limited else None
    procs = [ctx.Process(target=_worker_process, args=(c, q, stop, counts, allowed), name=f"mmreplay-actor-{c.worker}",
                         daemon=True) for c in cfgs]
    for p in procs:
        p.start()
    return q, stop, counts, allowed, procs


def open_store_for_spaces(writer: WriterSpec, observation_space: Any, action_space: Any, *,
                          metadata: dict[str, Any] | None = None, writers: int = 1) -> Any:
    """Open ``writer.store`` for appending, or create it from the spaces (with ``writer``'s sizing) if
    it does not exist (``writers``: how many will append at once, which sizes a new store's default
    segments).

    :func:`mmreplay.storage.open_or_create` with the schema the spaces give (its one
    compatibility rule: the same schema, and ``segment_records`` when given).
    """
    from ..core.schema import Schema
    from ..storage import open_or_create

    if writer.store is None:
        raise ValueError("`store` is needed: the path of the store to open or create")
    return open_or_create(writer.store, Schema.from_spaces(observation_space, action_space), writer.capacity,
                          segment_records=writer.segment_records, metadata=metadata, what="this env", writers=writers)


def action_scale_metadata(action_space: Any) -> dict[str, Any]:
    """What a new store records about Box actions (empty for other spaces): ``action_scale`` =
    ``"env"`` (actions as the env takes them, which is what collect stores) and, when the bounds are
    finite, ``action_space`` = ``{"low": [...], "high": [...]}`` (floats, flattened). The offline
    trainer maps the actions to ``[-1, 1]`` with these (``mmreplay.train.box_learner``)."""
    low, high = getattr(action_space, "low", None), getattr(action_space, "high", None)
    if low is None or high is None or getattr(action_space, "n", None) is not None:
        return {}
    low, high = np.asarray(low, np.float64).ravel(), np.asarray(high, np.float64).ravel()
    out: dict[str, Any] = {"action_scale": "env"}
    if np.all(np.isfinite(low)) and np.all(np.isfinite(high)):
        out["action_space"] = {"low": low.tolist(), "high": high.tolist()}
    return out


def env_metadata(env: EnvSpec, observation_space: Any, action_space: Any, extra: dict[str, Any]) -> dict[str, Any]:
    """What a collect run records about its env in a new store and in its provenance: the env's
    name, its spaces, the mmreplay version and ``extra`` (the env's gymnasium spec)."""
    from ..core.version import __version__

    return {"env_id": env.name, "observation_space": repr(observation_space), "action_space": repr(action_space),
            "mmreplay_version": __version__, **extra}


def collect(
    env: str | Callable[[], Any],
    store: str | os.PathLike[str],
    steps: int,
    *,
    workers: int = 1,
    envs_per_worker: int = 1,
    policy: str | PolicySpec | PolicyFn = "random",
    seed: int | None = None,
    atari: bool | None = None,
    capacity: int = 1_000_000,
    segment_records: int | None = None,
    durability: Literal["process", "segment", "batch"] = "segment",
    max_episode_steps: int | None = None,
    autoreset_mode: AutoresetName = "next_step",
    terminal_on_life_loss: bool = False,
    sticky_actions: float | None = None,
    progress: bool | None = None,
    metadata: dict[str, Any] | None = None,
) -> CollectResult:
    """Fill ``store`` (created from the env's spaces if missing) with ``steps`` env steps: the keyword
    form of :func:`run_collect` (the keywords are the fields of its specs).

    Parameters
    ----------
    env
        A gymnasium id (``"CartPole-v1"``, ``"ALE/Pong-v5"``) or a picklable callable returning an env.
    steps
        Env steps to store in total (each worker stores its share, rounded up to whole vector
        steps of ``envs_per_worker``).
    workers
        Spawned worker processes, each with its own vector env and writer. ``0`` runs one worker
        in this process (for policies that cannot be pickled).
    policy
        ``"random"``, ``"eps-greedy:CHECKPOINT[:EPS]"``, a :class:`PolicySpec`, or a callable
        mapping a batch of observations to a batch of actions.
    seed
        Base seed (``None``: a fresh random one, recorded in the provenance record).
    capacity, segment_records
        Rows the store keeps, and rows per segment file, when this call creates the store
        (``segment_records=None``: segments of about 32 MiB). A full store holds up to
        ``capacity`` plus one segment per writer and one more: choose segments well below
        ``capacity`` for a small store. An existing store must have ``segment_records`` if given.
    autoreset_mode
        The vector env's autoreset mode; every mode stores the same episodes.
    progress
        Show a progress bar (default: when stderr is a terminal).

    Returns a :class:`CollectResult`. On ``KeyboardInterrupt`` workers stop, keep what they
    wrote, and the result has ``interrupted=True``. A crashed worker is listed in ``errors``.
    """
    return run_collect(
        EnvSpec(env, atari=atari, max_episode_steps=max_episode_steps, autoreset_mode=autoreset_mode,
                terminal_on_life_loss=terminal_on_life_loss, sticky_actions=sticky_actions),
        WriterSpec(os.fspath(store), capacity=capacity, segment_records=segment_records, durability=durability,
                   metadata=metadata),
        CollectSpec(steps, workers=workers, envs_per_worker=envs_per_worker, policy=policy, seed=seed,
                    progress=progress))


def run_collect(env: EnvSpec, writer: WriterSpec, run: CollectSpec) -> CollectResult:
    """Fill ``writer.store`` (created from the env's spaces if missing) with ``run.steps`` env steps of
    ``env``: the library form of ``mmreplay collect`` (see :func:`collect` for what each field does)."""
    run = run.seeded()
    if run.workers > 0 and not isinstance(run.policy, PolicySpec):
        try:
            pickle.dumps(run.policy)
        except Exception as exc:
            raise ValueError(f"a policy callable must be picklable to run in worker processes (or use workers=0): {exc}"
                             ) from None
    obs_space, act_space, extra = env.spaces()
    if isinstance(run.policy, PolicySpec):
        check_policy(run.policy, obs_space, act_space)  # here, not ~2 s later in a worker, and before a store is made
    base = env_metadata(env, obs_space, act_space, extra)
    created = writer.store is not None and not Path(writer.store).exists()
    st = open_store_for_spaces(writer, obs_space, act_space, writers=max(run.workers, 1),
                               metadata={**base, **action_scale_metadata(act_space), **(writer.metadata or {})})
    shares = run.shares()
    cfgs = [WorkerConfig(w, env, str(st.path), run.rounded(shares[w]), run.envs_per_worker, run.seed,  # type: ignore[arg-type]
                         run.policy, writer.durability) for w in range(len(shares)) if shares[w] > 0]
    record = _collect_record(base, env, writer, run, cfgs)
    name = st.record_provenance(record)
    cfgs = [dataclasses.replace(c, run=name) for c in cfgs]  # each worker keeps its own record beside it
    result = CollectResult(0, 0, 0, [], 0.0, 0, run.seed, provenance=name)  # type: ignore[arg-type]
    failed = False
    t0 = time.perf_counter()
    try:
        _run_workers(cfgs, run, result)
    except BaseException:
        failed = True
        raise
    finally:
        result.seconds = time.perf_counter() - t0
        _close_collect(st, record, name, result, remove=created and (failed or bool(result.errors)))
    return result


def _collect_record(base: dict[str, Any], env: EnvSpec, writer: WriterSpec, run: CollectSpec,
                    cfgs: list[WorkerConfig]) -> dict[str, Any]:
    """The provenance record a collect run starts with (``status: running``)."""
    E = run.envs_per_worker
    return {**base, "kind": "collect", "status": "running", "workers": run.workers, "envs_per_worker": E,
            "policy": str(run.policy) if isinstance(run.policy, PolicySpec) else "callable", "seed": run.seed,
            "env_seeds": [[run.seed + c.worker * E + j for j in range(E)] for c in cfgs],  # type: ignore[operator]
            "steps_requested": run.steps, "autoreset_mode": env.autoreset_mode,
            "max_episode_steps": env.max_episode_steps, "atari": env.atari, "durability": writer.durability,
            "host": os.uname().nodename, "pid": os.getpid(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _run_workers(cfgs: list[WorkerConfig], run: CollectSpec, result: CollectResult) -> None:
    """Run the workers (in this process when ``run.workers == 0``), adding their reports to ``result``."""
    bar = CollectProgress(sum(c.steps or 0 for c in cfgs), run.progress)

    def absorb(payload: dict[str, Any]) -> None:
        result.steps += payload["steps"]
        result.transitions += payload["transitions"]
        result.episodes += payload["episodes"]
        result.bytes_written += payload["bytes"]
        result.episode_returns.extend(payload["returns"])
        if payload["final"]:
            result.episodes_cut += payload.get("cut", 0)
            result.loop_seconds = max(result.loop_seconds, payload["loop_s"])
            result.loop_cpu_seconds += payload.get("loop_cpu_s", 0.0)
        bar.update(payload["steps"], result)

    try:
        with Interrupts() as interrupts:
            if run.workers == 0:
                stop = threading.Event()
                try:
                    run_worker(cfgs[0], lambda kind, p: absorb(p), stop.is_set)
                except KeyboardInterrupt:
                    result.interrupted = True
            else:
                _run_processes(cfgs, absorb, result, interrupts)
        result.signal = interrupts.signal
    finally:
        bar.close()


def _close_collect(st: Any, record: dict[str, Any], name: str, result: CollectResult, *, remove: bool) -> None:
    """Finish the run's provenance record and close the store; a store this run made and could not
    put a row in (``remove``: it failed) is removed: it leaves nothing behind."""
    record.update(status="interrupted" if result.interrupted else ("failed" if result.errors else "done"),
                  steps_stored=result.steps, episodes=result.episodes, seconds=round(result.seconds, 3),
                  errors={str(k): v.splitlines()[-1] if v else "" for k, v in result.errors.items()},
                  finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    with contextlib.suppress(Exception):
        st.record_provenance(record, name)
    empty = result.steps == 0 and st.num_rows == 0
    st.close()
    if remove and empty:
        shutil.rmtree(st.path, ignore_errors=True)


def _run_processes(cfgs: list[WorkerConfig], absorb: Callable[[dict[str, Any]], None], result: CollectResult,
                   interrupts: Interrupts | None = None) -> None:
    q, stop, _, _, procs = _spawn(cfgs, limited=False)
    by_id = {c.worker: p for c, p in zip(cfgs, procs)}
    running = set(by_id)

    def drain(timeout: float) -> None:
        try:
            kind, w, payload = q.get(timeout=timeout)
        except queue_mod.Empty:
            return
        if kind == "progress":
            absorb(payload)
        elif kind == "error":
            result.errors[w], exc = _failure(payload)
            if exc is not None:
                result.exceptions[w] = exc
        elif kind == "exit":
            running.discard(w)

    try:
        while running:
            drain(0.1)
            for w in list(running):
                p = by_id[w]
                if not p.is_alive() and p.exitcode is not None:
                    while not q.empty():  # take what it reported before it died
                        drain(0.05)
                    if w in running:
                        running.discard(w)
                        if p.exitcode != 0 and w not in result.errors:
                            why = f"signal {-p.exitcode}" if p.exitcode < 0 else f"exit code {p.exitcode}"
                            result.errors[w] = f"worker {w} died ({why})"
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        stop.set()
        # keep draining while the workers close their writers: a worker exits only once its queue
        # feeder has flushed into the pipe, so waiting without reading could stall both sides
        start = time.monotonic()
        while any(p.is_alive() for p in procs):
            waited = time.monotonic() - start
            if waited > 120 or (interrupts is not None and interrupts.hurry and waited > 15):
                break  # a wedged env: more interrupts shorten the wait, never the closing of a live writer
            try:
                drain(0.1)
            except KeyboardInterrupt:  # (no Interrupts installed: a second Ctrl-C stops waiting)
                break
        for p in procs:
            if p.is_alive():  # pragma: no cover - a wedged env
                p.kill()
            p.join()
        while not q.empty():
            with contextlib.suppress(Exception):
                drain(0.01)
        q.close()


class Interrupts:
    """How a run is told to stop, used as a context manager around it in the main thread: the first
    SIGINT (Ctrl-C) or SIGTERM (``timeout``, a service manager) raises ``KeyboardInterrupt`` there;
    later ones (a terminal's double Ctrl-C, ``timeout`` sending both) never interrupt the closing
    of the writers, they only shorten how long a wedged worker is waited for (``hurry``)."""

    def __init__(self, *, raises: bool = True) -> None:
        self.signal: int | None = None
        """The first signal that arrived (``signal.SIGINT`` or ``signal.SIGTERM``)."""
        self._count = 0
        self.raises = raises
        """Raise ``KeyboardInterrupt`` at the first signal; else only record it (``stop_requested``),
        for a loop that stops at its next safe point (a trainer: never inside an update)."""
        self._old: dict[int, Any] = {}

    @property
    def stop_requested(self) -> bool:
        """A signal has arrived: with ``raises=False``, the loop's cue to stop at its next safe point."""
        return self.signal is not None

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self._count += 1
        if self.signal is None:
            self.signal = signum
            if self.raises:
                raise KeyboardInterrupt
            print("mmreplay: stopping at the next safe point (a checkpoint is written)", file=sys.stderr)
            return
        if self._count == 2:
            print("mmreplay: stopping; the writers are closed first (their rows are kept)", file=sys.stderr)

    @property
    def hurry(self) -> bool:
        """Two or more signals have arrived: a run waits less for a wedged worker to finish."""
        return self._count >= 2

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


# -- actors for a trainer -----------------------------------------------------------------
class ActorPool:
    """Actor processes that fill a store for an online trainer, under a samples-per-insert limit.

    Each actor acts ε-greedily with the policy file at ``policy_path`` (re-read when it changes;
    ε from the file's ``meta["epsilon"]``) and appends to the store with its own writer. The
    learner calls :meth:`allow` with the total env steps it is ready for; actors wait beyond it.

    >>> pool = ActorPool("CartPole-v1", "/data/run/store", actors=2, policy_path="/data/run/policy.pt")
    >>> pool.start(); pool.allow(10_000)  # doctest: +SKIP
    """

    def __init__(self, env: EnvSpec | str, store_path: str | os.PathLike[str], *, actors: int, envs_per_actor: int = 1,
                 policy_path: str | os.PathLike[str], seed: int = 0,
                 durability: Literal["process", "segment", "batch"] = "segment", run: str | None = None) -> None:
        if actors < 1:
            raise ValueError(f"`actors` must be >= 1, got {actors}")
        env = env if isinstance(env, EnvSpec) else EnvSpec(env)
        if not env.next_step:
            raise ValueError(f"a trainer's actors use next-step autoreset, got {env.autoreset_mode!r}")
        spec = PolicySpec("eps-greedy", str(policy_path), None, reload_s=0.2)
        # rows are published every 16 vector steps: the learner samples data a few ms old
        self._cfgs = [WorkerConfig(w, env, str(store_path), None, envs_per_actor, seed, spec, durability,
                                  gather_steps=16, run=run)
                     for w in range(actors)]  # ``run``: the trainer's provenance record (the actors keep theirs beside it)
        self._procs: list[Any] = []
        self._returns: deque[float] = deque(maxlen=1000)
        self._episodes = 0
        self.errors: dict[int, str] = {}
        """Actor index -> the formatted traceback of what it raised, or how it died."""
        self.exceptions: dict[int, BaseException] = {}
        """Actor index -> the exception it raised (as :attr:`CollectResult.exceptions`)."""

    def start(self) -> ActorPool:
        """Spawn the actors (each loads the policy file first: write it before starting)."""
        self._q, self._stop, self._counts, self._allowed, self._procs = _spawn(self._cfgs, limited=True)
        self._allowed.value = 0
        return self

    def allow(self, total_env_steps: int) -> None:
        """Let the actors store up to ``total_env_steps`` env steps in all (a negative value: no limit)."""
        self._allowed.value = int(total_env_steps)

    @property
    def env_steps(self) -> int:
        """Env steps stored so far by all actors (as last reported, within ~0.25 s)."""
        return int(sum(self._counts[:])) if self._procs else 0

    def _drain(self) -> None:
        while True:
            try:
                kind, w, payload = self._q.get_nowait()
            except (queue_mod.Empty, OSError, ValueError):
                return
            if kind == "progress":
                self._returns.extend(payload["returns"])
                self._episodes += payload["episodes"]
            elif kind == "error":
                self.errors[w], exc = _failure(payload)
                if exc is not None:
                    self.exceptions[w] = exc

    def episode_returns(self, last: int = 100) -> list[float]:
        """Returns of the last ``last`` completed episodes (any actor)."""
        self._drain()
        return list(self._returns)[-last:]

    @property
    def episodes(self) -> int:
        """Episodes the actors ended so far (terminated, or truncated by the env), as last reported."""
        self._drain()
        return self._episodes

    def check(self) -> None:
        """Raise ``RuntimeError`` with the traceback if an actor failed (from the exception it raised,
        where one came)."""
        self._drain()
        for w, p in enumerate(self._procs):
            if not p.is_alive() and p.exitcode not in (0, None) and w not in self.errors:
                self.errors[w] = f"actor {w} died (exit code {p.exitcode})"
        if self.errors:
            w, tb = next(iter(self.errors.items()))
            raise RuntimeError(f"actor {w} failed:\n{tb}") from self.exceptions.get(w)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every actor; each closes its writer, so every row it wrote stays in the store."""
        if not self._procs:
            return
        self._stop.set()  # actors waiting on the limit see it within a millisecond
        for p in self._procs:
            p.join(timeout=timeout)
            if p.is_alive():  # pragma: no cover
                p.kill()
                p.join()
        self._drain()
        self._q.close()
        self._procs = []

    def __enter__(self) -> ActorPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
