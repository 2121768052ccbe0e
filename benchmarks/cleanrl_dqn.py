"""A plain CleanRL-style single-file DQN, for the wall-time comparison with ``mmreplay train``.

    python benchmarks/cleanrl_dqn.py --seed 1 --total-timesteps 100000 [--out result.json]
    python benchmarks/cleanrl_dqn.py --preset cleanrl --seed 1 [--buffer numpy|sb3] [--out result.json]
    python benchmarks/cleanrl_dqn.py --preset minatar --env-id MinAtar/Breakout-v1 --total-timesteps 300000

It follows cleanrl/dqn.py (an ``Args`` dataclass, ``make_env``, ``QNetwork``, ``linear_schedule``
and one loop), one env, one torch thread, on the CPU. Three presets (any flag given overrides its
preset's value):

* ``--preset zoo`` (the default): the algorithm and hyperparameters of ``mmreplay train``'s
  defaults, the RL-zoo DQN settings for CartPole: lr 2.3e-3, batch 64, train every 256 env steps
  with 128 gradient steps, target copied every 128 updates (= SB3's ``target_update_interval=10``
  env steps: once per training round), ε from 1 to 0.04 over 16% of the run, 1000
  learning-starts steps, buffer 100,000, [256, 256] MLP, double-DQN targets, Huber loss, gradient
  norm clipped at 10, 100k env steps; replay in stable-baselines3's ``ReplayBuffer``
  (``--buffer sb3``), as CleanRL does.
* ``--preset cleanrl``: the defaults of CleanRL's ``cleanrl/dqn.py`` (its argument defaults:
  learning_rate 2.5e-4, buffer_size 10,000, gamma 0.99, tau 1.0, target_network_frequency 500,
  batch_size 128, start_e 1, end_e 0.05, exploration_fraction 0.5, learning_starts 10,000,
  train_frequency 10; its ``QNetwork``: Linear 120, ReLU, Linear 84, ReLU; ``F.mse_loss`` on
  ``target_network(next_obs).max(dim=1)``, no gradient clipping), but 150k env steps (CleanRL's own
  default is 500k) and evaluation as in the zoo preset. One gradient step per training round, the
  target copied every 50 updates (= CleanRL's 500 env steps at one update per 10 env steps). Replay
  in a plain numpy ring buffer (``--buffer numpy``, :class:`NumpyReplayBuffer`: preallocated
  arrays, an index, uniform ``np.random.randint`` draws, as SB3's buffer draws).
* ``--preset minatar``: the DQN of the MinAtar paper as its reference ``examples/dqn.py`` has it
  (github.com/kenjyoung/MinAtar), the settings of ``mmreplay train``'s MinAtar preset: one 3x3
  convolution of 16 channels over the (10, 10, C) frames, 128 units; centered RMSprop (lr 2.5e-4,
  squared-gradient decay 0.95, momentum 0.95, eps 0.01); batch 32, one update per env step, buffer
  100,000, 5,000 learning-starts steps, target copied every 1,000 updates, Huber loss, max over the
  target network, no clipping, ε from 1 to 0.1 over the first 100,000 steps; the numpy buffer.
  With ``--num-envs``, ``--frame-stack`` and ``--n-step`` (MinAtar configuration (b)) it builds its
  own stacks (an episode's first frame repeated at its start) and per-env n-step windows (cut at an
  episode's end, bootstrapped with ``gamma ** m``), one ε draw per env and one training round per
  vector step once the env steps pass a multiple of ``--train-frequency``, as ``mmreplay train``.

Both buffers get the same transitions: the vector env uses same-step autoreset (the final
observation of an episode comes in ``infos["final_obs"]`` and is stored as that step's next
observation, like CleanRL's ``real_next_obs``), so every env step is a transition.

Timing: the clock starts once the env, networks, optimizer and buffer are made (imports and
set-up excluded) and stops after the last env step. Evaluation (``--eval-episodes`` greedy
episodes every ``--eval-every`` env steps and at the end, seeds ``seed + 100000 + i``, as in
``mmreplay train``) is timed apart: ``wall_s`` and ``steps_per_s`` are the training loop without
it, ``total_wall_s`` the loop with it. The last line of stdout (and ``--out``) is a JSON object
with these, ``cpu_s`` (same spans), ``final_return`` (mean greedy return of the last evaluation)
and every evaluation.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class Args:
    preset: str = "zoo"
    """zoo (mmreplay train's defaults, the RL-zoo settings) or cleanrl (cleanrl/dqn.py's defaults)"""
    buffer: str | None = None
    """sb3 (stable-baselines3's ReplayBuffer) or numpy (NumpyReplayBuffer); [zoo: sb3, cleanrl: numpy]"""
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
    hidden: str = "256,256"
    """MLP layer widths"""
    loss: str = "huber"
    """huber or mse"""
    double: bool = True
    """double-DQN targets (else max over the target network)"""
    max_grad_norm: float = 10.0
    """gradient clipping by global norm, 0: off"""
    eval_every: int = 10_000
    """env steps between evaluations, 0: at the end only"""
    eval_episodes: int = 20
    log_every: int = 10_000
    """env steps between rows of ``train_returns`` in the ``--out`` JSON (the mean return of the
    training episodes that ended since the last row, as ``return_mean`` of ``mmreplay train``'s
    ``metrics.csv``)"""
    threads: int = 1
    flush_denormal: bool = True
    """flush denormal floats to zero (torch.set_flush_denormal), as ``mmreplay train`` does by default"""
    fused_adam: bool = False
    num_envs: int = 1
    """envs of the vector env (several: one ε draw per env, one training round per vector step)"""
    frame_stack: int = 1
    """frames per observation, stacked here (an episode's first frame repeated at its start)"""
    n_step: int = 1
    """n-step returns, computed here per env (windows cut at an episode's end)"""
    network: str = "mlp"
    """mlp, or minatar (a 3x3 convolution of 16 channels, then 128 units, over (H, W, C) frames)"""
    optimizer: str = "adam"
    """adam, or rmsprop (centered, as the MinAtar paper's DQN)"""
    out: str | None = None


PRESETS: dict[str, dict[str, Any]] = {
    "zoo": {"buffer": "sb3"},
    "cleanrl": dict(buffer="numpy", total_timesteps=150_000, learning_rate=2.5e-4, buffer_size=10_000, gamma=0.99,
                    tau=1.0, target_network_frequency=50, batch_size=128, start_e=1.0, end_e=0.05,
                    exploration_fraction=0.5, learning_starts=10_000, train_frequency=10, gradient_steps=1,
                    hidden="120,84", loss="mse", double=False, max_grad_norm=0.0),
    "minatar": dict(buffer="numpy", env_id="MinAtar/Breakout-v1", total_timesteps=5_000_000, learning_rate=2.5e-4,
                    buffer_size=100_000, gamma=0.99, tau=1.0, target_network_frequency=1000, batch_size=32, start_e=1.0,
                    end_e=0.1, learning_starts=5000, train_frequency=1, gradient_steps=1, loss="huber", double=False,
                    max_grad_norm=0.0, network="minatar", optimizer="rmsprop", eval_every=50_000, eval_episodes=10),
}
CHOICES = {"preset": list(PRESETS), "buffer": ["sb3", "numpy"], "loss": ["huber", "mse"], "network": ["mlp", "minatar"],
           "optimizer": ["adam", "rmsprop"]}


def make_env(env_id: str):
    if env_id.startswith("MinAtar/") and env_id not in gym.registry:
        from minatar.gym import register_envs

        register_envs()

    def thunk():
        return gym.make(env_id)

    return thunk


class QNetwork(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int, hidden: tuple[int, ...]):
        super().__init__()
        layers: list[nn.Module] = []
        for width in hidden:
            layers += [nn.Linear(obs_dim, width), nn.ReLU()]
            obs_dim = width
        self.network = nn.Sequential(*layers, nn.Linear(obs_dim, n_actions))

    def forward(self, x):
        return self.network(x)


class MinAtarQNetwork(nn.Module):
    """One 3x3 convolution of 16 channels (stride 1), 128 units, one output per action, over
    (B, H, W, C) frames (MinAtar's layout)."""

    def __init__(self, shape: tuple[int, ...], n_actions: int, k: int = 1):
        super().__init__()
        h, w, c = shape
        self.conv = nn.Conv2d(k * c, 16, kernel_size=3, stride=1)
        self.fc_hidden = nn.Linear(16 * (h - 2) * (w - 2), 128)
        self.output = nn.Linear(128, n_actions)

    def forward(self, x):  # (B, H, W, C), or stacks (B, k, H, W, C)
        x = x.float().movedim(-1, -3)
        x = F.relu(self.conv(x.flatten(1, 2) if x.dim() == 5 else x))
        return self.output(F.relu(self.fc_hidden(x.flatten(1))))


class Batch(NamedTuple):
    observations: torch.Tensor
    actions: torch.Tensor
    next_observations: torch.Tensor
    dones: torch.Tensor
    rewards: torch.Tensor
    discounts: torch.Tensor


class NumpyReplayBuffer:
    """A plain ring buffer: preallocated arrays of ``capacity`` rows, one row per transition, the
    oldest overwritten when full; ``sample`` draws indices uniformly with ``np.random`` (with
    replacement, as SB3's ``ReplayBuffer``) and returns tensors that share the gathered arrays."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], obs_dtype: Any):
        self.capacity = capacity
        self.obs = np.zeros((capacity, *obs_shape), obs_dtype)
        self.next_obs = np.zeros((capacity, *obs_shape), obs_dtype)
        self.actions = np.zeros((capacity, 1), np.int64)
        self.rewards = np.zeros(capacity, np.float32)
        self.dones = np.zeros(capacity, np.float32)
        self.discounts = np.zeros(capacity, np.float32)  # gamma ** (steps of the return)
        self.pos = 0
        self.full = False

    def add(self, obs: np.ndarray, next_obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
            dones: np.ndarray, discounts: Any) -> None:
        """One vector-env step: row i of each argument is env i's transition."""
        for i in range(len(obs)):
            p = self.pos
            self.obs[p] = obs[i]
            self.next_obs[p] = next_obs[i]
            self.actions[p, 0] = actions[i]
            self.rewards[p] = rewards[i]
            self.dones[p] = dones[i]
            self.discounts[p] = discounts if np.ndim(discounts) == 0 else discounts[i]
            self.pos = p + 1
            if self.pos == self.capacity:
                self.pos, self.full = 0, True

    def sample(self, batch_size: int) -> Batch:
        idx = np.random.randint(0, self.capacity if self.full else self.pos, size=batch_size)
        return Batch(torch.from_numpy(self.obs[idx]), torch.from_numpy(self.actions[idx]),
                     torch.from_numpy(self.next_obs[idx]), torch.from_numpy(self.dones[idx]),
                     torch.from_numpy(self.rewards[idx]), torch.from_numpy(self.discounts[idx]))


class SB3Buffer:
    """stable-baselines3's ``ReplayBuffer`` behind the same ``add``/``sample`` calls."""

    def __init__(self, capacity: int, envs: Any, device: torch.device):
        from stable_baselines3.common.buffers import ReplayBuffer

        self.rb = ReplayBuffer(capacity, envs.single_observation_space, envs.single_action_space, device,
                               handle_timeout_termination=False)

    def add(self, obs, next_obs, actions, rewards, dones, discounts=None) -> None:  # 1-step: gamma
        self.rb.add(obs, next_obs, actions, rewards, dones, [{}])

    def sample(self, batch_size: int) -> Any:
        return self.rb.sample(batch_size)


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


def push_frames(stacks: np.ndarray, frames: np.ndarray) -> np.ndarray:
    """Each env's stack of its last k frames, ``frames`` appended (a new array)."""
    return np.concatenate([stacks[:, 1:], frames[:, None]], axis=1)


@torch.no_grad()
def evaluate(q_network: nn.Module, env_id: str, episodes: int, seed: int, k: int = 1) -> np.ndarray:
    envs = gym.vector.SyncVectorEnv([make_env(env_id)] * episodes)
    obs, _ = envs.reset(seed=seed)
    x = np.repeat(obs[:, None], k, axis=1) if k > 1 else obs
    returns = np.zeros(episodes)
    finished = np.zeros(episodes, bool)
    while not finished.all():  # (each env's first episode only: no stack restarts needed)
        actions = q_network(torch.as_tensor(x)).argmax(dim=1).numpy()
        obs, rewards, terminations, truncations, _ = envs.step(actions)
        x = push_frames(x, obs) if k > 1 else obs
        returns += np.where(finished, 0.0, rewards)
        finished |= terminations | truncations
    envs.close()
    return returns


def parse_args() -> Args:
    """Flags for every ``Args`` field; a flag not given takes its preset's value, else the default."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(Args):
        flag = "--" + f.name.replace("_", "-")
        kind = str(f.type).split(" ")[0]
        if kind == "bool":
            ap.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        else:
            ap.add_argument(flag, type={"int": int, "float": float}.get(kind, str), default=None,
                            choices=CHOICES.get(f.name))
    given = {k: v for k, v in vars(ap.parse_args()).items() if v is not None}
    values = {**PRESETS[given.get("preset", Args.preset)], **given}
    if values.get("preset") == "minatar" and "exploration_fraction" not in given:  # ε reaches 0.1 after 100k steps
        values["exploration_fraction"] = min(1.0, 100_000 / values.get("total_timesteps", Args.total_timesteps))
    return Args(**values)


def build(args: Args, envs: Any, device: torch.device) -> tuple[nn.Module, nn.Module, Any, Any]:
    """The Q network, its target copy, the optimizer and the replay buffer the flags ask for."""
    hidden = tuple(int(w) for w in args.hidden.split(","))
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    n_actions = int(envs.single_action_space.n)

    def network() -> nn.Module:
        if args.network == "minatar":
            return MinAtarQNetwork(envs.single_observation_space.shape, n_actions, args.frame_stack).to(device)
        return QNetwork(obs_dim, n_actions, hidden).to(device)

    q_network = network()
    if args.optimizer == "rmsprop":
        optimizer: Any = torch.optim.RMSprop(q_network.parameters(), lr=args.learning_rate, alpha=0.95, eps=0.01,
                                             momentum=0.95, centered=True)
    else:
        optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=args.fused_adam or None)
    target_network = network()
    target_network.load_state_dict(q_network.state_dict())
    if args.buffer == "numpy":
        k = args.frame_stack
        shape = envs.single_observation_space.shape
        rb: Any = NumpyReplayBuffer(args.buffer_size, (k, *shape) if k > 1 else shape, envs.single_observation_space.dtype)
    else:
        rb = SB3Buffer(args.buffer_size, envs, device)
    return q_network, target_network, optimizer, rb


def act(args: Args, envs: Any, q_network: nn.Module, x: np.ndarray, global_step: int, device: torch.device) -> np.ndarray:
    """ε-greedy actions, one ε draw per env."""
    E = envs.num_envs
    epsilon = linear_schedule(args.start_e, args.end_e, args.exploration_fraction * args.total_timesteps,
                              global_step + E)
    if E == 1:
        explore = np.array([random.random() < epsilon])
    else:  # one draw per env
        explore = np.array([random.random() < epsilon for _ in range(E)])
    if explore.all():
        return np.array([envs.single_action_space.sample() for _ in range(E)])
    with torch.no_grad():
        q_values = q_network(torch.as_tensor(x, device=device))
    actions = torch.argmax(q_values, dim=1).cpu().numpy()
    for i in np.flatnonzero(explore):  # (one env: only a greedy step gets here)
        actions[i] = envs.single_action_space.sample()
    return actions


def store_step(args: Args, rb: Any, windows: list, x: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
               terminations: np.ndarray, ended: np.ndarray, real_next_x: np.ndarray) -> None:
    """Add the step's transitions; with n-step returns, per env the window of its last n steps (an
    episode's end flushes its shorter windows)."""
    n, gamma = args.n_step, args.gamma
    if n == 1:
        rb.add(x, real_next_x, actions, rewards, terminations, gamma)
        return
    for i in range(len(windows)):
        w = windows[i]
        w.append((x[i], int(actions[i]), float(rewards[i])))
        while w and (len(w) == n or ended[i]):
            ret = sum(gamma ** j * r for j, (_, _, r) in enumerate(w))
            rb.add(w[0][0][None], real_next_x[i][None], [w[0][1]], [ret], [terminations[i]], gamma ** len(w))
            w.pop(0)
            if not ended[i]:
                break


def update(args: Args, rb: Any, q_network: nn.Module, target_network: nn.Module, optimizer: Any, updates: int) -> int:
    """One gradient step on a sampled batch (and the target update on schedule); the update count after it."""
    data = rb.sample(args.batch_size)
    discounts = getattr(data, "discounts", None)
    with torch.no_grad():
        if args.double:
            best = q_network(data.next_observations).argmax(dim=1, keepdim=True)
            target_max = target_network(data.next_observations).gather(1, best).squeeze(1)
        else:
            target_max = target_network(data.next_observations).max(dim=1).values
        bootstrap = args.gamma if discounts is None else discounts.flatten()
        td_target = data.rewards.flatten() + bootstrap * target_max * (1 - data.dones.flatten())
    old_val = q_network(data.observations).gather(1, data.actions).squeeze(1)
    if args.loss == "mse":
        loss = F.mse_loss(old_val, td_target)
    else:
        loss = F.smooth_l1_loss(old_val, td_target)
    optimizer.zero_grad()
    loss.backward()
    if args.max_grad_norm > 0:
        nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
    optimizer.step()
    updates += 1
    if updates % args.target_network_frequency == 0:
        for target_param, param in zip(target_network.parameters(), q_network.parameters()):
            target_param.data.copy_(args.tau * param.data + (1.0 - args.tau) * target_param.data)
    return updates


def next_inputs(args: Args, x: np.ndarray, next_obs: np.ndarray, infos: dict, ended: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """The network's input after the step (a new episode restarts its stack) and the real next input of
    the transition (the final observation of an episode that just ended comes in infos: same-step autoreset)."""
    real_next_obs = next_obs.copy()
    if "final_obs" in infos:
        for idx, done in enumerate(infos["_final_obs"]):
            if done:
                real_next_obs[idx] = infos["final_obs"][idx]
    k = args.frame_stack
    if k == 1:
        return real_next_obs, next_obs
    next_x = push_frames(x, next_obs)
    next_x[ended] = np.repeat(next_obs[ended][:, None], k, axis=1)
    return push_frames(x, real_next_obs), next_x


def crossed(step: int, E: int, every: int) -> bool:
    """Whether the last E env steps passed a multiple of ``every``."""
    return step // every > (step - E) // every


def main() -> None:
    args = parse_args()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(args.flush_denormal)
    device = torch.device("cpu")
    envs = gym.vector.SyncVectorEnv([make_env(args.env_id)] * args.num_envs,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    q_network, target_network, optimizer, rb = build(args, envs, device)

    start_time, start_cpu = time.perf_counter(), time.process_time()
    eval_time = eval_cpu = 0.0
    evals: list[tuple[int, float, float]] = []

    def run_eval(step: int) -> None:
        nonlocal eval_time, eval_cpu
        t0, c0 = time.perf_counter(), time.process_time()
        rets = evaluate(q_network, args.env_id, args.eval_episodes, args.seed + 100_000 + len(evals), args.frame_stack)
        eval_time += time.perf_counter() - t0
        eval_cpu += time.process_time() - c0
        evals.append((step, float(rets.mean()), float(rets.std())))
        print(f"global_step={step}, eval return {rets.mean():.1f} ± {rets.std():.1f}", flush=True)

    updates = 0
    obs, _ = envs.reset(seed=args.seed)
    envs.single_action_space.seed(args.seed)
    E, k = envs.num_envs, args.frame_stack
    x = np.repeat(obs[:, None], k, axis=1) if k > 1 else obs  # the network's input
    windows: list[list[tuple[np.ndarray, int, float]]] = [[] for _ in range(E)]  # n-step: (x, action, reward)
    global_step = 0  # env steps
    ep_return, ended_returns = np.zeros(E), []  # training episodes: the running return per env, those ended
    train_returns: list[tuple[int, float, int]] = []  # (step, mean return, episodes) every log_every steps
    while global_step < args.total_timesteps:
        actions = act(args, envs, q_network, x, global_step, device)
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        ended = terminations | truncations
        real_next_x, next_x = next_inputs(args, x, next_obs, infos, ended)
        store_step(args, rb, windows, x, actions, rewards, terminations, ended, real_next_x)
        x = next_x
        global_step += E
        ep_return += rewards
        if ended.any():
            ended_returns.extend(ep_return[ended].tolist())
            ep_return[ended] = 0.0
        if crossed(global_step, E, args.log_every) and ended_returns:
            train_returns.append((global_step, float(np.mean(ended_returns)), len(ended_returns)))
            ended_returns = []
        # training: one round when the env steps pass a multiple of train_frequency
        if global_step > args.learning_starts and crossed(global_step, E, args.train_frequency):
            for _ in range(args.gradient_steps):
                updates = update(args, rb, q_network, target_network, optimizer, updates)
        if args.eval_episodes and args.eval_every and crossed(global_step, E, args.eval_every):
            run_eval(global_step)
    if args.eval_episodes and (not evals or evals[-1][0] < args.total_timesteps):
        run_eval(args.total_timesteps)  # as mmreplay train: the end of the run is an evaluation point
    finish(args, start_time, start_cpu, eval_time, eval_cpu, updates, evals, train_returns)
    envs.close()


def finish(args: Args, start_time: float, start_cpu: float, eval_time: float, eval_cpu: float, updates: int,
           evals: list, train_returns: list) -> None:
    """Print the summary line and the result JSON (and write it to ``--out``)."""
    total_wall = time.perf_counter() - start_time
    wall = total_wall - eval_time
    cpu = time.process_time() - start_cpu - eval_cpu
    result = {"preset": args.preset, "buffer": args.buffer, "seed": args.seed, "env_steps": args.total_timesteps,
              "updates": updates, "wall_s": wall, "cpu_s": cpu, "steps_per_s": args.total_timesteps / wall,
              "total_wall_s": total_wall, "eval_s": eval_time,
              "final_return": evals[-1][1] if evals else None, "evals": evals, "train_returns": train_returns, "args": dataclasses.asdict(args)}
    final = f"{result['final_return']:.1f}" if evals else "-"
    print(f"env steps/s {result['steps_per_s']:,.0f}; training wall {wall:.1f} s (evaluation excluded), "
          f"total wall {total_wall:.1f} s (with {eval_time:.1f} s of evaluation); final greedy return {final}",
          flush=True)
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh)


if __name__ == "__main__":
    main()
