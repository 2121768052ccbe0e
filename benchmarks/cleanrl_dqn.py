"""A plain CleanRL-style single-file DQN, for the wall-time comparison with ``mmreplay train``.

    python benchmarks/cleanrl_dqn.py --seed 1 --total-timesteps 100000 [--out result.json]

It follows cleanrl/dqn.py (an ``Args`` dataclass, ``make_env``, ``QNetwork``, ``linear_schedule``
and one loop; replay in stable-baselines3's ``ReplayBuffer``, as CleanRL does) with the same
algorithm and hyperparameters as ``mmreplay train``'s defaults, the RL-zoo DQN settings for
CartPole: lr 2.3e-3, batch 64, train every 256 env steps with 128 gradient steps, target copied
every 128 updates (= SB3's ``target_update_interval=10`` env steps: once per training round),
ε from 1 to 0.04 over 16% of the run, 1000 learning-starts steps, [256, 256] MLP, double-DQN
targets, Huber loss, gradient norm clipped at 10, one torch thread. Evaluation (20 greedy
episodes every 10k env steps, seeds ``seed + 100000 + i``) is timed apart from training, as in
``mmreplay train``. The vector env uses same-step autoreset (the final observation comes in
``infos["final_obs"]``), so every env step is a transition, as in CleanRL.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class Args:
    seed: int = 1
    env_id: str = "CartPole-v1"
    total_timesteps: int = 100_000
    learning_rate: float = 2.3e-3
    buffer_size: int = 100_000
    gamma: float = 0.99
    tau: float = 1.0
    target_network_frequency: int = 128
    """learner updates between target copies"""
    batch_size: int = 64
    start_e: float = 1.0
    end_e: float = 0.04
    exploration_fraction: float = 0.16
    learning_starts: int = 1000
    train_frequency: int = 256
    gradient_steps: int = 128
    max_grad_norm: float = 10.0
    eval_every: int = 10_000
    eval_episodes: int = 20
    threads: int = 1
    fused_adam: bool = False
    out: str | None = None


def make_env(env_id: str):
    def thunk():
        return gym.make(env_id)

    return thunk


class QNetwork(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim, 256), nn.ReLU(),
            nn.Linear(256, 256), nn.ReLU(),
            nn.Linear(256, n_actions),
        )

    def forward(self, x):
        return self.network(x)


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


@torch.no_grad()
def evaluate(q_network: nn.Module, env_id: str, episodes: int, seed: int) -> np.ndarray:
    envs = gym.vector.SyncVectorEnv([make_env(env_id)] * episodes)
    obs, _ = envs.reset(seed=seed)
    returns = np.zeros(episodes)
    finished = np.zeros(episodes, bool)
    while not finished.all():
        actions = q_network(torch.as_tensor(obs)).argmax(dim=1).numpy()
        obs, rewards, terminations, truncations, _ = envs.step(actions)
        returns += np.where(finished, 0.0, rewards)
        finished |= terminations | truncations
    envs.close()
    return returns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(Args):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            ap.add_argument(flag, action="store_true")
        else:
            ap.add_argument(flag, type={"int": int, "float": float, "str": str}.get(str(f.type).split(" ")[0], str),
                            default=f.default)
    args = Args(**vars(ap.parse_args()))
    from stable_baselines3.common.buffers import ReplayBuffer

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")

    envs = gym.vector.SyncVectorEnv([make_env(args.env_id)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    n_actions = int(envs.single_action_space.n)
    q_network = QNetwork(obs_dim, n_actions).to(device)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=args.fused_adam or None)
    target_network = QNetwork(obs_dim, n_actions).to(device)
    target_network.load_state_dict(q_network.state_dict())
    rb = ReplayBuffer(args.buffer_size, envs.single_observation_space, envs.single_action_space, device,
                      handle_timeout_termination=False)

    start_time, start_cpu = time.perf_counter(), time.process_time()
    eval_time = eval_cpu = 0.0
    evals: list[tuple[int, float, float]] = []
    updates = 0
    episode_return = 0.0
    obs, _ = envs.reset(seed=args.seed)
    envs.single_action_space.seed(args.seed)
    for global_step in range(1, args.total_timesteps + 1):
        # ALGO LOGIC: put action logic here
        epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps,
                                  global_step)
        if random.random() < epsilon:
            actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            with torch.no_grad():
                q_values = q_network(torch.as_tensor(obs, device=device))
            actions = torch.argmax(q_values, dim=1).cpu().numpy()

        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        episode_return += float(rewards[0])
        if terminations[0] or truncations[0]:
            episode_return = 0.0

        # the final observation of an episode that just ended comes in infos (same-step autoreset)
        real_next_obs = next_obs.copy()
        if "final_obs" in infos:
            for idx, ended in enumerate(infos["_final_obs"]):
                if ended:
                    real_next_obs[idx] = infos["final_obs"][idx]
        rb.add(obs, real_next_obs, actions, rewards, terminations, [{}])
        obs = next_obs

        # ALGO LOGIC: training.
        if global_step > args.learning_starts and global_step % args.train_frequency == 0:
            for _ in range(args.gradient_steps):
                data = rb.sample(args.batch_size)
                with torch.no_grad():
                    best = q_network(data.next_observations).argmax(dim=1, keepdim=True)
                    target_max = target_network(data.next_observations).gather(1, best).squeeze(1)
                    td_target = data.rewards.flatten() + args.gamma * target_max * (1 - data.dones.flatten())
                old_val = q_network(data.observations).gather(1, data.actions).squeeze(1)
                loss = F.smooth_l1_loss(old_val, td_target)
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
                optimizer.step()
                updates += 1
                if updates % args.target_network_frequency == 0:
                    for target_param, param in zip(target_network.parameters(), q_network.parameters()):
                        target_param.data.copy_(args.tau * param.data + (1.0 - args.tau) * target_param.data)

        if args.eval_every and global_step % args.eval_every == 0:
            t0, c0 = time.perf_counter(), time.process_time()
            rets = evaluate(q_network, args.env_id, args.eval_episodes, args.seed + 100_000 + len(evals))
            eval_time += time.perf_counter() - t0
            eval_cpu += time.process_time() - c0
            evals.append((global_step, float(rets.mean()), float(rets.std())))
            print(f"global_step={global_step}, eval return {rets.mean():.1f} ± {rets.std():.1f}", flush=True)

    wall = time.perf_counter() - start_time - eval_time
    cpu = time.process_time() - start_cpu - eval_cpu
    envs.close()
    result = {"seed": args.seed, "env_steps": args.total_timesteps, "updates": updates, "wall_s": wall, "cpu_s": cpu,
              "steps_per_s": args.total_timesteps / wall, "evals": evals}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh)


if __name__ == "__main__":
    main()
