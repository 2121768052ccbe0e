"""Quickstart: fill a store from a gymnasium vector env, sample transitions, reopen it elsewhere.

    python examples/quickstart.py /tmp/cartpole-store [--steps 5000] [--envs 8]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import gymnasium as gym
import numpy as np

import mmreplay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path")
    ap.add_argument("--steps", type=int, default=5000, help="vector-env steps to collect")
    ap.add_argument("--envs", type=int, default=8, help="environments in the vector env (lanes)")
    args = ap.parse_args()

    # --- collect: the plain gymnasium vector-env loop (next-step autoreset) ---------------
    envs = gym.make_vec("CartPole-v1", num_envs=args.envs)
    schema = mmreplay.Schema.from_spaces(envs.single_observation_space, envs.single_action_space)
    store = mmreplay.create_store(args.path, schema, capacity=1_000_000, metadata={"env_id": "CartPole-v1"})
    obs, _ = envs.reset(seed=0)
    # cast="safe": accept lossless conversions (some vector envs return float32 rewards)
    with store.writer(lanes=envs.num_envs, cast="safe") as writer:
        for _ in range(args.steps):
            action = envs.action_space.sample()
            next_obs, reward, terminated, truncated, _ = envs.step(action)
            writer.add(obs=obs, action=action, reward=reward, terminated=terminated, truncated=truncated)
            obs = next_obs
        writer.close(last_obs=obs)  # keep the final observations: last steps become transitions
    envs.close()

    # --- sample: uniform transitions with next_obs rebuilt from the next row -------------
    sampler = mmreplay.UniformSampler(store, seed=0)
    batch = sampler.sample(256)
    print(f"sampled {len(batch)} transitions: obs {batch.obs.shape}, next_obs {batch.next_obs.shape}, "
          f"mean reward {batch.reward.mean():.2f}, terminated {int(batch.terminated.sum())}")
    store.close()

    # --- reopen from another process: nothing to load, it is all on disk -----------------
    code = (
        "import mmreplay, sys; s = mmreplay.open_store(sys.argv[1]); "
        "print(f'reopened in a new process: {s.num_rows} rows, {len(s.transition_ids())} transitions')"
    )
    subprocess.run([sys.executable, "-c", code, args.path], check=True)
    assert np.isfinite(batch.reward).all()


if __name__ == "__main__":
    main()
