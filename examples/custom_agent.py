"""A custom agent's own training loop on the library API: store, writer, prioritized sampler, loader.

    python examples/custom_agent.py [--steps 30000] [--store /tmp/custom-agent]

No CLI and no trainer: the shape of code a large-scale agent writes around mmreplay. A vector env
writes into the store with a Writer; a PrioritizedSampler (3-step returns) feeds a BatchLoader that
gathers batches in the background (into pinned memory and onto the GPU when there is one); TD
errors go back through the loader. The store is the replay memory, on disk: rerun with the same
``--store`` and the data (and the saved priorities) are still there.
"""

from __future__ import annotations

import argparse
import copy
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import mmreplay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30_000, help="env steps")
    ap.add_argument("--envs", type=int, default=4)
    ap.add_argument("--store", default="/tmp/mmreplay-custom-agent")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    envs = gym.make_vec("CartPole-v1", num_envs=args.envs)
    schema = mmreplay.Schema.from_spaces(envs.single_observation_space, envs.single_action_space)
    try:
        store = mmreplay.create_store(args.store, schema, capacity=100_000)
    except mmreplay.StoreExistsError:
        store = mmreplay.open_store(args.store, mode="a")  # resume: the replay memory is still there
    n_actions = int(envs.single_action_space.n)
    q = nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, n_actions))
    target = copy.deepcopy(q)
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    rng = np.random.default_rng(args.seed)
    gamma, n_step = 0.99, 3

    obs, _ = envs.reset(seed=args.seed)
    returns, ep_ret, loader, t0 = [], np.zeros(args.envs), None, time.perf_counter()
    with store.writer(lanes=args.envs, cast="safe") as writer:
        for step in range(0, args.steps, args.envs):
            eps = max(0.05, 1.0 - step / (0.3 * args.steps))
            with torch.no_grad():
                greedy = q(torch.as_tensor(obs)).argmax(1).numpy()
            action = np.where(rng.random(args.envs) < eps, rng.integers(0, n_actions, args.envs), greedy)
            next_obs, reward, term, trunc, _ = envs.step(action)
            writer.add(obs=obs, action=action, reward=reward, terminated=term, truncated=trunc)
            ep_ret += reward
            for i in np.flatnonzero(term | trunc):
                returns.append(ep_ret[i])
                ep_ret[i] = 0.0
            obs = next_obs
            if step < 1000:
                continue
            if loader is None:  # the learner side: sampler -> background loader (refreshes by itself)
                sampler = mmreplay.PrioritizedSampler(store, n_step=n_step, gamma=gamma, seed=args.seed,
                                                      beta_steps=args.steps // args.envs)
                loader = iter(mmreplay.BatchLoader(sampler, 64, prefetch=2))
            b = next(loader)
            with torch.no_grad():  # double DQN target with the n-step discount (0 after termination)
                a2 = q(b.next_obs).argmax(1, keepdim=True)
                y = b.reward.float() + b.discount.float() * target(b.next_obs).gather(1, a2).squeeze(1)
            pred = q(b.obs).gather(1, b.action.long().unsqueeze(1)).squeeze(1)
            td = y - pred
            loss = (b.weights.float() * nn.functional.smooth_l1_loss(pred, y, reduction="none")).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            loader.update_priorities(b.ids, td.detach().abs().cpu().numpy())
            if step % 500 < args.envs:
                target.load_state_dict(q.state_dict())
        writer.close(last_obs=obs)
    if loader is not None:
        sampler.save()  # priorities persist with the store
        loader.close()
    print(f"{args.steps} env steps in {time.perf_counter() - t0:.1f} s; {store.num_rows} rows in {args.store}; "
          f"mean return of the last 20 episodes: {np.mean(returns[-20:]):.1f}")
    store.close()


if __name__ == "__main__":
    main()
