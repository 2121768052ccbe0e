"""A single-file TD3+BC and IQL (CORL-style) with a plain numpy buffer, for the comparison with
``mmreplay train --offline``.

    python benchmarks/offline_continuous_ref.py --algo td3bc --data ~/.cache/mmreplay-bench/Hopper-v5/medium.npz \\
        --env Hopper-v5 --updates 100000 --seed 1 --out result.json

It imports nothing from mmreplay and shares no code with it. It follows CORL's ``td3_bc.py`` and
``iql.py`` (github.com/tinkoff-ai/CORL; the defaults of their ``TrainConfig``): batch 256, Adam lr
3e-4 for every network, (256, 256) ReLU MLPs, gamma 0.99, Polyak tau 0.005; TD3+BC: target noise
0.2 clipped at 0.5 (times ``max_action``), actor and targets every 2 updates, alpha 2.5, two
critics with an optimizer each; IQL: expectile 0.7, beta 3, exp-advantage clipped at 100, a
Gaussian actor (``tanh`` mean, state-independent log std clamped to [-20, 2]) with a cosine
learning-rate schedule over the updates, twin Q and a value network, the target Q Polyak-averaged
every update. States are normalized with the dataset's mean and std (+1e-3), as CORL does, before
the buffer is filled; rewards are left as they are (CORL's ``normalize_reward`` default, False).

Data: a D4RL-style ``.npz`` (``observations``, ``actions``, ``rewards``, ``next_observations``,
``terminals``), as ``benchmarks/offline_continuous_data.py`` writes. Actions are taken to be at
the env's scale (``max_action = env.action_space.high[0]``, as CORL).

The buffer: numpy arrays, ``np.random.randint`` indices (with replacement), ``torch.from_numpy``
of the gathered rows. Evaluation (``--eval-episodes`` episodes every ``--eval-every`` updates and
at the end): a vector env of that many copies reset with seed ``seed + 100000 + i`` (the i-th
evaluation), each copy's first episode, the actor's deterministic action (the Gaussian's mean), as
``mmreplay train`` evaluates. The clock starts once data, networks and optimizers are made and
leaves evaluations out. The last line of stdout (and ``--out``) is a JSON object: ``updates``,
``wall_s``, ``cpu_s``, ``updates_per_s``, ``evals`` ((update, mean, std) each), ``final_return``.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

EXP_ADV_MAX = 100.0
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


class NumpyBuffer:
    """The dataset in numpy arrays; uniform draws with replacement."""

    def __init__(self, data: dict[str, np.ndarray]):
        self.obs = data["observations"]
        self.actions = data["actions"]
        self.rewards = data["rewards"]
        self.next_obs = data["next_observations"]
        self.dones = data["terminals"]
        self.size = len(self.obs)

    def sample(self, batch_size: int):
        idx = np.random.randint(0, self.size, size=batch_size)
        return (torch.from_numpy(self.obs[idx]), torch.from_numpy(self.actions[idx]),
                torch.from_numpy(self.rewards[idx]), torch.from_numpy(self.next_obs[idx]),
                torch.from_numpy(self.dones[idx]))


def mlp(sizes: list[int], out: nn.Module | None = None) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-2], sizes[1:-1]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(sizes[-2], sizes[-1]))
    if out is not None:
        layers.append(out)
    return nn.Sequential(*layers)


class Actor(nn.Module):
    def __init__(self, state_dim: int, action_dim: int, max_action: float, gaussian: bool = False):
        super().__init__()
        self.net = mlp([state_dim, 256, 256, action_dim], nn.Tanh())
        self.log_std = nn.Parameter(torch.zeros(action_dim)) if gaussian else None
        self.max_action = max_action

    def forward(self, state: torch.Tensor) -> torch.Tensor:  # the mean (IQL) / the action (TD3+BC), unit scale
        return self.net(state)

    def log_prob(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        std = torch.exp(self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX))
        return torch.distributions.Normal(self.net(state), std).log_prob(action).sum(-1)


class Critic(nn.Module):
    def __init__(self, state_dim: int, action_dim: int):
        super().__init__()
        self.net = mlp([state_dim + action_dim, 256, 256, 1])

    def forward(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([state, action], 1)).squeeze(-1)


def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    for tp, sp in zip(target.parameters(), source.parameters()):
        tp.data.copy_((1 - tau) * tp.data + tau * sp.data)


class TD3BC:
    def __init__(self, s: int, a: int, max_action: float, args: argparse.Namespace):
        self.actor = Actor(s, a, max_action)
        self.actor_target = copy.deepcopy(self.actor)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=args.lr, fused=args.fused_adam or None)
        self.critic_1, self.critic_2 = Critic(s, a), Critic(s, a)
        self.critic_1_target, self.critic_2_target = copy.deepcopy(self.critic_1), copy.deepcopy(self.critic_2)
        self.critic_1_opt = torch.optim.Adam(self.critic_1.parameters(), lr=args.lr, fused=args.fused_adam or None)
        self.critic_2_opt = torch.optim.Adam(self.critic_2.parameters(), lr=args.lr, fused=args.fused_adam or None)
        self.max_action, self.args, self.total_it = max_action, args, 0

    def train(self, batch) -> torch.Tensor:
        args = self.args
        self.total_it += 1
        state, action, reward, next_state, done = batch
        with torch.no_grad():
            noise = (torch.randn_like(action) * args.policy_noise * self.max_action).clamp(
                -args.noise_clip * self.max_action, args.noise_clip * self.max_action)
            next_action = (self.max_action * self.actor_target(next_state) + noise).clamp(-self.max_action, self.max_action)
            target_q = torch.min(self.critic_1_target(next_state, next_action), self.critic_2_target(next_state, next_action))
            target_q = reward + (1 - done) * args.gamma * target_q
        q1, q2 = self.critic_1(state, action), self.critic_2(state, action)
        critic_loss = F.mse_loss(q1, target_q) + F.mse_loss(q2, target_q)
        self.critic_1_opt.zero_grad()
        self.critic_2_opt.zero_grad()
        critic_loss.backward()
        self.critic_1_opt.step()
        self.critic_2_opt.step()
        if self.total_it % args.policy_freq == 0:
            pi = self.max_action * self.actor(state)
            q = self.critic_1(state, pi)
            lmbda = args.alpha / q.abs().mean().detach()
            actor_loss = -lmbda * q.mean() + F.mse_loss(pi, action)
            self.actor_opt.zero_grad()
            actor_loss.backward()
            self.actor_opt.step()
            soft_update(self.critic_1_target, self.critic_1, args.tau)
            soft_update(self.critic_2_target, self.critic_2, args.tau)
            soft_update(self.actor_target, self.actor, args.tau)
        return critic_loss.detach()


class IQL:
    def __init__(self, s: int, a: int, max_action: float, args: argparse.Namespace):
        self.actor = Actor(s, a, max_action, gaussian=True)
        self.q1, self.q2 = Critic(s, a), Critic(s, a)
        self.q_params = [*self.q1.parameters(), *self.q2.parameters()]
        self.q1_target, self.q2_target = copy.deepcopy(self.q1), copy.deepcopy(self.q2)
        self.vf = mlp([s, 256, 256, 1])
        kw = dict(lr=args.lr, fused=args.fused_adam or None)
        self.v_opt = torch.optim.Adam(self.vf.parameters(), **kw)
        self.q_opt = torch.optim.Adam(self.q_params, **kw)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), **kw)
        self.schedule = torch.optim.lr_scheduler.CosineAnnealingLR(self.actor_opt, args.updates)
        self.max_action, self.args = max_action, args

    def train(self, batch) -> torch.Tensor:
        args = self.args
        obs, actions, rewards, next_obs, dones = batch
        with torch.no_grad():
            next_v = self.vf(next_obs).squeeze(-1)
            target_q = torch.min(self.q1_target(obs, actions), self.q2_target(obs, actions))
        v = self.vf(obs).squeeze(-1)
        adv = target_q - v
        v_loss = torch.mean(torch.abs(args.expectile - (adv < 0).float()) * adv ** 2)
        self.v_opt.zero_grad()
        v_loss.backward()
        self.v_opt.step()
        targets = rewards + (1.0 - dones) * args.gamma * next_v
        qs = (self.q1(obs, actions), self.q2(obs, actions))
        q_loss = sum(F.mse_loss(q, targets) for q in qs) / len(qs)
        self.q_opt.zero_grad()
        q_loss.backward()
        self.q_opt.step()
        soft_update(self.q1_target, self.q1, args.tau)
        soft_update(self.q2_target, self.q2, args.tau)
        exp_adv = torch.exp(args.beta * adv.detach()).clamp(max=EXP_ADV_MAX)
        bc_losses = -self.actor.log_prob(obs, actions / self.max_action)
        policy_loss = torch.mean(exp_adv * bc_losses)
        self.actor_opt.zero_grad()
        policy_loss.backward()
        self.actor_opt.step()
        self.schedule.step()
        return q_loss.detach()


@torch.no_grad()
def evaluate(actor: Actor, env_id: str, episodes: int, seed: int, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * episodes)
    low, high = envs.single_action_space.low, envs.single_action_space.high
    obs, _ = envs.reset(seed=seed)
    returns, finished = np.zeros(episodes), np.zeros(episodes, bool)
    while not finished.all():
        x = torch.as_tensor(((obs - mean) / std).astype(np.float32))
        a = np.clip(actor(x).numpy() * actor.max_action, low, high)
        obs, r, term, trunc, _ = envs.step(a)
        returns += np.where(finished, 0.0, r)
        finished |= term | trunc
    envs.close()
    return returns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algo", choices=["td3bc", "iql"], required=True)
    ap.add_argument("--data", required=True, help="a D4RL-style .npz")
    ap.add_argument("--env", default="Hopper-v5")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--updates", type=int, default=100_000)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--gamma", type=float, default=0.99)
    ap.add_argument("--tau", type=float, default=0.005)
    ap.add_argument("--policy-noise", type=float, default=0.2)
    ap.add_argument("--noise-clip", type=float, default=0.5)
    ap.add_argument("--policy-freq", type=int, default=2)
    ap.add_argument("--alpha", type=float, default=2.5)
    ap.add_argument("--expectile", type=float, default=0.7)
    ap.add_argument("--beta", type=float, default=3.0)
    ap.add_argument("--eval-every", type=int, default=10_000)
    ap.add_argument("--eval-episodes", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fused-adam", action="store_true", help="fused Adam (CORL uses the default)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    data = dict(np.load(args.data))
    mean = data["observations"].mean(0)
    std = data["observations"].std(0) + 1e-3
    for k in ("observations", "next_observations"):
        data[k] = ((data[k] - mean) / std).astype(np.float32)
    for k in ("actions", "rewards", "terminals"):
        data[k] = data[k].astype(np.float32)
    buffer = NumpyBuffer(data)
    env = gym.make(args.env)
    max_action = float(env.action_space.high[0])
    s, a = data["observations"].shape[1], data["actions"].shape[1]
    agent = (TD3BC if args.algo == "td3bc" else IQL)(s, a, max_action, args)

    evals: list[tuple[int, float, float]] = []
    eval_s = 0.0
    losses: list[float] = []
    t0, c0 = time.perf_counter(), time.process_time()
    eval_cpu = 0.0
    for t in range(1, args.updates + 1):
        loss = agent.train(buffer.sample(args.batch_size))
        if t % 1000 == 0:
            losses.append(float(loss))
        if (args.eval_every and t % args.eval_every == 0) or t == args.updates:
            e0, ec = time.perf_counter(), time.process_time()
            agent.actor.eval()
            rets = evaluate(agent.actor, args.env, args.eval_episodes, args.seed + 100_000 + len(evals), mean, std)
            agent.actor.train()
            evals.append((t, float(rets.mean()), float(rets.std())))
            eval_s += time.perf_counter() - e0
            eval_cpu += time.process_time() - ec
            print(f"update {t}: eval return {rets.mean():.1f} ± {rets.std():.1f}", flush=True)
    wall = time.perf_counter() - t0 - eval_s
    cpu = time.process_time() - c0 - eval_cpu
    result = {"algo": args.algo, "seed": args.seed, "data": args.data, "updates": args.updates, "wall_s": wall,
              "cpu_s": cpu, "updates_per_s": args.updates / wall, "eval_s": eval_s, "evals": evals,
              "final_return": evals[-1][1], "losses": losses, "args": vars(args)}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh)


if __name__ == "__main__":
    main()
