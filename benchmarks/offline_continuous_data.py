"""Make (once, cached) the continuous-control datasets of ``benchmarks/offline_continuous.py``.

    python benchmarks/offline_continuous_data.py                        # Hopper-v5, 100k SAC steps
    python benchmarks/offline_continuous_data.py --sac-steps 3000 --medium-steps 2000 --root /tmp/tiny

Needs ``pip install 'gymnasium[mujoco]' stable-baselines3`` (MuJoCo from the package index, CPU).
Everything goes under ``--root`` (default ``~/.cache/mmreplay-bench/<env>``, outside the
repository); a dataset already made there (its ``<name>.json`` written) is not made again.

* ``replay``: the store that stable-baselines3's SAC wrote through mmreplay's SB3 buffer
  (``mmreplay.integrations.sb3.MMReplayBuffer``, the buffer's ``path``) during its own training
  of ``--sac-steps`` env steps (SB3's SAC defaults, one torch thread): a saved buffer becomes an
  offline dataset, as D4RL's ``-medium-replay`` datasets are a SAC run's replay buffer. Every
  ``--eval-every`` steps the SAC policy is evaluated (``--eval-episodes`` deterministic episodes)
  and saved (``sac-<step>.zip``).
* ``medium``: ``--medium-steps`` env steps of the saved SAC policy whose evaluation is closest to a
  third of the final one (its sampled, stochastic actions, 8 envs), collected with
  ``mmreplay.collect`` into a store, as D4RL's ``-medium`` datasets are episodes of a policy at
  about a third of an expert's return.

Minimum returns (the script stops otherwise, keeping the SAC run: a rerun with lower thresholds
reuses it): the final SAC evaluation ``--min-final`` (700 by default on Hopper-v5: a policy that
hops forward; SB3's SAC reached 705 in 100k steps here, 37 minutes with one torch thread on the
shared 2-core machine), the medium policy ``--min-medium`` (200: ten
times a random policy's ~20) and at most 0.6x the final one (not the final policy).

Each dataset is also written as ``<name>.npz`` in D4RL's layout (``observations``, ``actions``,
``rewards``, ``next_observations``, ``terminals``, ``timeouts``: one row per transition, the
store's ``transition_ids()``), which the single-file reference (``offline_continuous_ref.py``)
reads without mmreplay. ``datasets.json`` records what was made, with the minutes it took.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np


def export_npz(store_path: Path, out: Path) -> dict:
    """The store's transitions as a D4RL-style ``.npz``; returns counts and episode returns."""
    import mmreplay

    with mmreplay.open_store(store_path, mode="r") as store:
        store.wait_checked()
        ids = store.transition_ids()
        b = store.transitions(ids)
        np.savez(out, observations=b.obs.astype(np.float32), actions=b.action.astype(np.float32),
                 rewards=b.reward.astype(np.float32), next_observations=b.next_obs.astype(np.float32),
                 terminals=b.terminated.astype(np.float32), timeouts=b.truncated.astype(np.float32))
        info = store.info()
    ends = b.terminated | b.truncated
    return {"transitions": int(len(ids)), "episodes": int(ends.sum()), "rows": info["rows"]}


def make_replay(root: Path, args: argparse.Namespace) -> dict:
    """SAC on the env, its replay buffer an mmreplay store; saves the policy every eval_every steps."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger

    from mmreplay.integrations.sb3 import MMReplayBuffer

    torch.set_num_threads(1)
    store = root / "replay"
    trained = root / "replay-run.json"  # SAC's run, written once it ended: the thresholds can be retried on it
    if trained.exists() and store.exists():
        run = json.loads(trained.read_text())
        print(f"replay: reusing the SAC run in {root} ({run['sac_steps']:,} steps)")
        return _finish_replay(root, args, run)
    shutil.rmtree(store, ignore_errors=True)  # an interrupted run starts over (SAC is not resumable here)
    evals: list[dict] = []

    def evaluate(policy_model) -> float:
        env = gym.vector.SyncVectorEnv([lambda: gym.make(args.env)] * args.eval_episodes)
        obs, _ = env.reset(seed=10_000 + len(evals))
        done = np.zeros(args.eval_episodes, bool)
        ret = np.zeros(args.eval_episodes)
        while not done.all():
            a, _ = policy_model.predict(obs, deterministic=True)
            obs, r, te, tr, _ = env.step(a)
            ret += np.where(done, 0.0, r)
            done |= te | tr
        env.close()
        return float(ret.mean())

    class Snapshots(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % args.eval_every == 0:
                path = root / f"sac-{self.num_timesteps}.zip"
                self.model.save(path)
                ret = evaluate(self.model)
                evals.append({"step": self.num_timesteps, "return": ret, "path": str(path)})
                print(f"SAC step {self.num_timesteps:,}: deterministic return {ret:.0f} "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
            return True

    env = gym.make(args.env)
    model = SAC("MlpPolicy", env, seed=args.seed, device="cpu", buffer_size=args.sac_steps + 10_000,
                replay_buffer_class=MMReplayBuffer, replay_buffer_kwargs=dict(path=str(store)))
    model.set_logger(Logger(folder=None, output_formats=[]))
    t0 = time.perf_counter()
    model.learn(args.sac_steps, callback=Snapshots())
    model.replay_buffer.close()  # each env's pending final observation is written
    run = {"sac_steps": args.sac_steps, "minutes": (time.perf_counter() - t0) / 60, "evals": evals}
    trained.write_text(json.dumps(run, indent=2))
    return _finish_replay(root, args, run)


def _finish_replay(root: Path, args: argparse.Namespace, run: dict) -> dict:
    final = run["evals"][-1]["return"]
    if final < args.min_final:
        raise SystemExit(f"SAC reached {final:.0f} at {run['sac_steps']:,} steps, below --min-final {args.min_final}: "
                         "train longer (remove the replay folder and pass more --sac-steps), or accept it with a "
                         "lower --min-final (the SAC run is kept and reused)")
    info = {"name": "replay", "store": str(root / "replay"), "sac_steps": run["sac_steps"], "minutes": run["minutes"],
            "final_return": final, "evals": run["evals"], **export_npz(root / "replay", root / "replay.npz")}
    (root / "replay.json").write_text(json.dumps(info, indent=2))
    return info


def make_medium(root: Path, args: argparse.Namespace, replay: dict) -> dict:
    """Episodes of the SAC snapshot closest to a third of the final return, in an mmreplay store."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import SAC

    import mmreplay

    torch.set_num_threads(1)
    final = replay["final_return"]
    pick = min(replay["evals"], key=lambda e: abs(e["return"] - final / 3))
    if not args.min_medium <= pick["return"] <= args.max_medium_fraction * final:
        raise SystemExit(f"no SAC snapshot between --min-medium {args.min_medium} and {args.max_medium_fraction}x the final return "
                         f"{final:.0f} (closest to a third: {pick['return']:.0f} at step {pick['step']})")
    model = SAC.load(pick["path"], device="cpu")
    model.policy.set_training_mode(False)

    def policy(obs: np.ndarray) -> np.ndarray:  # the policy's sampled actions (SB3 rescales them to the Box)
        a, _ = model.predict(obs, deterministic=False)
        return a.astype(np.float32)

    store = root / "medium"
    shutil.rmtree(store, ignore_errors=True)
    space = gym.make(args.env).action_space
    t0 = time.perf_counter()
    res = mmreplay.collect(args.env, store, args.medium_steps, workers=0, envs_per_worker=8, policy=policy,
                           seed=args.seed + 1, progress=False, capacity=args.medium_steps + 100_000,
                           metadata={"dataset": "medium", "action_scale": "env",
                                     "action_space": {"low": space.low.tolist(), "high": space.high.tolist()},
                                     "sac_snapshot": pick})
    info = {"name": "medium", "store": str(store), "snapshot": pick, "minutes": (time.perf_counter() - t0) / 60,
            "behaviour_return": float(np.mean(res.episode_returns)) if res.episode_returns else None,
            **export_npz(store, root / "medium.npz")}
    (root / "medium.json").write_text(json.dumps(info, indent=2))
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="Hopper-v5")
    ap.add_argument("--root", default=None, help="[~/.cache/mmreplay-bench/<env>]")
    ap.add_argument("--sac-steps", type=int, default=100_000)
    ap.add_argument("--eval-every", type=int, default=10_000)
    ap.add_argument("--eval-episodes", type=int, default=5)
    ap.add_argument("--medium-steps", type=int, default=200_000)
    ap.add_argument("--min-final", type=float, default=700.0)
    ap.add_argument("--min-medium", type=float, default=200.0)
    ap.add_argument("--max-medium-fraction", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    root = Path(args.root or Path.home() / ".cache" / "mmreplay-bench" / args.env.replace("/", "-"))
    root.mkdir(parents=True, exist_ok=True)
    made = {}
    for name in ("replay", "medium"):
        done = root / f"{name}.json"
        if done.exists():
            made[name] = json.loads(done.read_text())
            print(f"{name}: cached in {root}")
            continue
        made[name] = make_replay(root, args) if name == "replay" else make_medium(root, args, made["replay"])
    (root / "datasets.json").write_text(json.dumps({"env": args.env, "args": vars(args), **made}, indent=2))
    for name, info in made.items():
        ret = info.get("final_return", info.get("behaviour_return"))
        print(f"{name}: {info['transitions']:,} transitions, {info['episodes']:,} episodes, "
              f"{'final SAC' if name == 'replay' else 'behaviour'} return {ret:.0f}, {info['minutes']:.1f} min")


if __name__ == "__main__":
    main()
