"""Dyna-Q with an mmreplay store as the model memory, and planning updates vectorized.

    python examples/dyna_q.py [--episodes 100] [--planning 128] [--env CliffWalking-v1] [--plot curve.png]

Tabular Q-learning on a gymnasium toy-text env. Every real step is appended to a store (the
model memory: its final size is unknown in advance, and it survives the process); after each
real step, ``--planning`` transitions are sampled from the store and replayed.

Planning is one numpy update per step instead of a Python loop over the sampled transitions.
Duplicates need care: with ``Q[s, a] += alpha * td`` fancy indexing keeps only one of the
duplicate (s, a) entries' updates. Here the TD errors are grouped by (s, a) with ``np.bincount``
and a pair drawn ``k`` times moves by ``1 - (1 - alpha)**k`` of its mean TD error, which is what
``k`` sequential updates towards the same target do. The script runs both versions on the same
seed and prints the learning curves and the planning speed-up.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import gymnasium as gym
import numpy as np

import mmreplay


def plan_vectorized(Q: np.ndarray, s: np.ndarray, a: np.ndarray, r: np.ndarray, s2: np.ndarray,
                    term: np.ndarray, alpha: float, gamma: float) -> None:
    """One batched Q-learning update from transitions ``(s, a, r, s2, term)``, duplicates grouped."""
    n_actions = Q.shape[1]
    td = r + gamma * (~term) * Q[s2].max(axis=1) - Q[s, a]
    sa = s * n_actions + a
    counts = np.bincount(sa, minlength=Q.size)
    sums = np.bincount(sa, weights=td, minlength=Q.size)
    hit = counts > 0
    step = 1.0 - (1.0 - alpha) ** counts[hit]  # k sequential steps towards one target
    Q.reshape(-1)[hit] += step * sums[hit] / counts[hit]


def plan_sequential(Q: np.ndarray, s: np.ndarray, a: np.ndarray, r: np.ndarray, s2: np.ndarray,
                    term: np.ndarray, alpha: float, gamma: float) -> None:
    """The textbook loop: one update per sampled transition, in order."""
    for i in range(len(s)):
        target = r[i] + (0.0 if term[i] else gamma * Q[s2[i]].max())
        Q[s[i], a[i]] += alpha * (target - Q[s[i], a[i]])


def run(env_id: str, episodes: int, planning: int, vectorized: bool, seed: int, path: str,
        alpha: float = 0.5, gamma: float = 0.95, eps: float = 0.1) -> tuple[list[float], float]:
    """Dyna-Q for ``episodes`` episodes; returns the episode returns and seconds spent planning."""
    env = gym.make(env_id, max_episode_steps=200)
    schema = mmreplay.Schema.from_spaces(env.observation_space, env.action_space)
    store = mmreplay.create_store(path, schema, capacity=1_000_000, segment_records=4096)
    Q = np.zeros((env.observation_space.n, env.action_space.n))
    rng = np.random.default_rng(seed)
    plan = plan_vectorized if vectorized else plan_sequential
    returns, planning_s = [], 0.0
    with store.writer(lanes=1, durability="process") as w:
        sampler = None
        for ep in range(episodes):
            obs, _ = env.reset(seed=seed + ep)
            total, done = 0.0, False
            while not done:
                if rng.random() < eps:
                    action = int(rng.integers(env.action_space.n))
                else:  # greedy with random tie-breaking
                    q = Q[obs]
                    action = int(rng.choice(np.flatnonzero(q == q.max())))
                nxt, reward, term, trunc, _ = env.step(action)
                # real experience: one Q-learning step, and into the model memory
                target = reward + (0.0 if term else gamma * Q[nxt].max())
                Q[obs, action] += alpha * (target - Q[obs, action])
                w.add(obs=np.array([obs]), action=np.array([action]), reward=np.array([float(reward)]),
                      terminated=np.array([term]), truncated=np.array([trunc]))
                if term or trunc:  # the final observation closes the episode in the store
                    w.add(obs=np.array([nxt]), action=np.array([0]), reward=np.array([0.0]),
                          terminated=np.array([False]), truncated=np.array([False]))
                total += reward
                obs, done = nxt, term or trunc
                # planning: replay transitions sampled from the store
                if planning:
                    if sampler is None:
                        w.publish()
                        store.refresh()
                        if len(store.transition_ids()) == 0:
                            continue
                        sampler = mmreplay.UniformSampler(store, seed=seed)
                    t0 = time.perf_counter()
                    b = sampler.sample(planning)
                    plan(Q, b.obs, b.action, b.reward, b.next_obs, b.terminated, alpha, gamma)
                    planning_s += time.perf_counter() - t0
            returns.append(total)
    store.close()
    env.close()
    return returns, planning_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="CliffWalking-v1")
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--planning", type=int, default=128, help="transitions replayed per real step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default=None, help="write the learning curves to this PNG (needs matplotlib)")
    args = ap.parse_args()
    curves = {}
    with tempfile.TemporaryDirectory(prefix="dyna-q-") as tmp:
        runs = [("no planning (Q-learning)", 0, True), ("Dyna-Q, sequential planning", args.planning, False),
                ("Dyna-Q, vectorized planning", args.planning, True)]
        for i, (name, n, vec) in enumerate(runs):
            t0 = time.perf_counter()
            rets, plan_s = run(args.env, args.episodes, n, vec, args.seed, f"{tmp}/{i}")
            curves[name] = (rets, plan_s, time.perf_counter() - t0)
    k = max(1, args.episodes // 10)
    print(f"{args.env}: mean return per block of {k} episodes ({args.planning} planning updates per step)")
    for name, (rets, plan_s, wall) in curves.items():
        blocks = " ".join(f"{np.mean(rets[j:j + k]):7.1f}" for j in range(0, len(rets), k))
        print(f"  {name:<30} {blocks}   planning {plan_s:5.2f} s, total {wall:5.2f} s")
    seq = curves["Dyna-Q, sequential planning"][1]
    vec = curves["Dyna-Q, vectorized planning"][1]
    print(f"planning speed-up, vectorized vs sequential: {seq / vec:.1f}x")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for name, (rets, _, _) in curves.items():
            smooth = np.convolve(rets, np.ones(k) / k, mode="valid")
            ax.plot(np.arange(len(smooth)) + k, smooth, label=name)
        ax.set_xlabel("episode")
        ax.set_ylabel(f"return (moving mean of {k})")
        ax.set_title(f"Dyna-Q on {args.env}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        print(f"learning curves: {args.plot}")


if __name__ == "__main__":
    main()
