"""The one place mmreplay starts a local Ray instance: services on loopback only, dashboard off.

Ray's services (GCS, raylet, object manager, workers) have no authentication by default, and a
Ray head that the network can reach runs any job anyone sends it. A user who asks for "actors
on my machine" (``mmreplay collect --ray`` / ``train --ray`` without an address, the tests and
``benchmarks/cluster.py``) must not get a job server on the network, so a local instance is
started like this:

* ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is put in the environment *before* ``ray`` is first
  imported. Ray reads it once, at import: with it, Ray takes the loopback address as the node
  address instead of resolving ``127.0.0.1`` to the machine's network address, and every
  service binds there (checked on Linux with ray 2.60: each listening socket of the instance is
  ``127.0.0.1`` or ``::ffff:127.0.0.1``; ``tests/cluster/test_local_ray.py`` checks it on every run).
  Child processes (raylet, GCS, workers) inherit the variable.
* ``ray.init(_node_ip_address="127.0.0.1", include_dashboard=False)``.
* After start-up the node address Ray reports is checked; anything but loopback shuts the
  instance down and raises :class:`~mmreplay.errors.RayNotLoopbackError` (fail closed).

**If the user imported Ray first** (before any mmreplay entry point that starts Ray), Ray has
already read its setting, so the variable can no longer take effect; :func:`start_local_ray`
then refuses with :class:`~mmreplay.errors.RayNotLoopbackError` and starts nothing. Fixes: set
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` in the environment before Python starts, import Ray
after calling mmreplay, or call ``ray.init(...)`` yourself (mmreplay then uses the instance it
finds and does not start one).

The variable stays set in this process afterwards: a later ``ray.init(address="auto")`` from
the same process would take loopback as its node address. Connecting to a real cluster
(``--ray ADDRESS``) does not go through here and changes nothing.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ..core.errors import RayNotLoopbackError

__all__ = ["LOOPBACK_ENV", "start_local_ray"]

#: the environment variable (and value) that makes Ray use loopback as the node address
LOOPBACK_ENV = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _ray_reads_loopback() -> bool:
    """Whether the imported Ray takes loopback as the node address (the variable was set in time)."""
    consts = sys.modules.get("ray._private.ray_constants")
    flag = getattr(consts, "ENABLE_RAY_CLUSTER", None)
    return flag is False


def start_local_ray(num_cpus: int, **init_kwargs: Any) -> None:
    """Start a local Ray instance that listens on loopback only, with the dashboard off.

    ``init_kwargs`` go to ``ray.init`` (``runtime_env=``, ``namespace=``, ...); the address,
    node address and dashboard are not the caller's to set. Raises
    :class:`~mmreplay.errors.RayNotLoopbackError` when the instance would not be loopback-only
    (Ray was imported before the setting could be made, or Ray reports another node address).
    """
    name, value = LOOPBACK_ENV
    if "ray" not in sys.modules:
        os.environ[name] = value
    import ray

    if not _ray_reads_loopback():
        raise RayNotLoopbackError(
            "a local Ray instance started now would listen on the machine's network address: Ray was "
            f"imported before mmreplay could set {name}={value}",
            hint=f"set {name}={value} before starting Python, import ray after mmreplay starts it, "
                 "or call ray.init() yourself")
    for key in ("address", "_node_ip_address", "include_dashboard", "dashboard_host"):
        if key in init_kwargs:
            raise TypeError(f"start_local_ray() sets `{key}` itself")
    init_kwargs.setdefault("configure_logging", False)
    ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1", **init_kwargs)
    node_ip = ray.util.get_node_ip_address()
    if node_ip not in _LOOPBACK:
        ray.shutdown()
        raise RayNotLoopbackError(f"the local Ray instance came up on {node_ip}, not on loopback; shut it down",
                                  hint="set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before starting Python")
