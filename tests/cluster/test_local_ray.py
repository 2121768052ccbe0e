"""A local Ray instance started by mmreplay listens on loopback only (and says so when it cannot)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

if importlib.util.find_spec("ray") is None:  # not importorskip: Ray must be first imported by mmreplay
    pytest.skip("ray is not installed", allow_module_level=True)

_LOOPBACK_HEX = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}

# Runs in a fresh interpreter (so Ray is first imported by mmreplay there): lists every listening
# TCP socket before and after start_local_ray + one actor, with the process that owns each.
_PROBE = textwrap.dedent('''
    import json, os, sys

    def listening():
        out = {}
        for fn in ("/proc/net/tcp", "/proc/net/tcp6"):
            for ln in open(fn).read().splitlines()[1:]:
                p = ln.split()
                if p[3] == "0A":  # TCP_LISTEN
                    addr, port = p[1].split(":")
                    out[p[9]] = (addr, int(port, 16))
        return out

    def owners():
        res = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    t = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if t.startswith("socket:["):
                        res[t[8:-1]] = open(f"/proc/{pid}/cmdline").read().replace("\\0", " ")[:100]
            except OSError:
                pass
        return res

    before = listening()
    from mmreplay.cluster import start_local_ray
    start_local_ray(1)
    import ray

    @ray.remote
    class Echo:
        def ping(self):
            return "pong"

    assert ray.get(Echo.remote().ping.remote()) == "pong"
    after, who = listening(), owners()
    new = [[a, p, who.get(inode, "?")] for inode, (a, p) in after.items() if inode not in before]
    print(json.dumps(new))
    ray.shutdown()
''')


def test_local_ray_listens_on_loopback_only():
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    new = json.loads(out.stdout.strip().splitlines()[-1])
    # Another process of the machine may open a listener meanwhile: judge only Ray's and ours.
    ray_socks = [s for s in new if "ray" in s[2] or "python" in s[2]]
    assert len(ray_socks) >= 3, new  # GCS, raylet, the actor: the probe did see Ray's servers
    exposed = [s for s in ray_socks if s[0] not in _LOOPBACK_HEX]
    assert exposed == [], f"Ray listens beyond loopback: {exposed}"


def test_ray_imported_first_is_refused_not_exposed():
    code = textwrap.dedent('''
        import ray
        from mmreplay.cluster import start_local_ray
        from mmreplay.core.errors import RayNotLoopbackError
        try:
            start_local_ray(1)
        except RayNotLoopbackError as e:
            assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in e.hint, e.hint
            assert not ray.is_initialized()
            print("refused")
    ''')
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "refused"
