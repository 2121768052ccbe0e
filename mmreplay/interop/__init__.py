"""interop: other data formats — Minari datasets (``minari``) and the DQN Replay Dataset (``dopamine``).

Invariant: an export or import is exact (every step matches the store) or fails without
leaving a partial dataset behind.
"""
