"""Integrations: mmreplay as the replay memory of trainers people already have.

* :mod:`mmreplay.integrations.sb3`: ``MMReplayBuffer``, a Stable-Baselines3 ``ReplayBuffer``
  (``replay_buffer_class=MMReplayBuffer, replay_buffer_kwargs=dict(path=...)``) for DQN, SAC, TD3.
* :mod:`mmreplay.integrations.torchrl`: ``MMReplayStorage`` and ``MMReplaySampler`` for TorchRL's
  ``ReplayBuffer`` (TensorDicts in TorchRL's key layout).
* :mod:`mmreplay.integrations.torch_data`: ``TransitionDataset``, an ``IterableDataset`` over a
  store or an archive for ``torch.utils.data.DataLoader(num_workers=...)``.

Each module imports its library (SB3, TorchRL, torch) when it is imported; ``import mmreplay``
imports none of them. Trainers like these hand over explicit transitions (``obs``, ``action``,
``reward``, flags, ``next_obs``) from envs that reset in the same step; :mod:`._lanes` turns them
into mmreplay's rows (``next_obs`` is the next row of the env's lane, never stored twice).
"""
