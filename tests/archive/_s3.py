"""A real S3 API for the archive tests: moto's standalone server on loopback.

:func:`moto_s3` (test_s3.py's ``s3_server`` fixture, one per module) starts
``moto.server.ThreadedMotoServer`` on 127.0.0.1 at a free port and points every AWS setting of
this process (and of the CLI subprocesses it starts) at it: dummy keys, ``AWS_ENDPOINT_URL`` =
the server, no instance-metadata lookups, no config or credentials file, no proxy for loopback,
at most 2 attempts per request. So nothing can reach real AWS, even a call that passes no
``storage_options``. :class:`S3Bucket` (the ``s3`` fixture, one per test) is a fresh bucket and
the ``storage_options`` an ``s3://`` URL needs (key, secret, endpoint, region, botocore's retries
and timeouts bounded so that a failure ends within seconds).

moto keeps buckets and objects in this process, not in the HTTP server: :meth:`S3Server.stop`
takes the endpoint away (connections are refused) and :meth:`S3Server.start` brings it back on
the same port with the same objects, like an object store's outage. :meth:`S3Server.iam_auth`
turns moto's IAM authentication on (moto's ``/moto-api/reset-auth``): then only keys of an IAM
user made with :meth:`S3Server.iam_key` are accepted. The test module imports this one (not a
conftest.py: the suite's own takes the module name ``conftest``).
"""

from __future__ import annotations

import contextlib
import logging
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REGION = "us-east-1"
KEY, SECRET = "mmreplay-test-key", "mmreplay-test-secret"


class S3Server:
    """moto's S3 API on ``127.0.0.1:port`` (see the module docstring)."""

    def __init__(self) -> None:
        self.port = 0
        self._server: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        self.port = self._server.get_host_and_port()[1]

    def stop(self) -> None:
        """Close the listening socket: requests fail (connection refused) until :meth:`start`."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    def client(self, service: str = "s3", **kw: Any) -> Any:
        import boto3

        kw.setdefault("aws_access_key_id", KEY)
        kw.setdefault("aws_secret_access_key", SECRET)
        return boto3.client(service, endpoint_url=self.endpoint, region_name=REGION, **kw)

    def options(self, key: str = KEY, secret: str = SECRET) -> dict[str, Any]:
        """The fsspec ``storage_options`` of an ``s3://`` URL on this server."""
        return {"key": key, "secret": secret,
                "client_kwargs": {"endpoint_url": self.endpoint, "region_name": REGION},
                "config_kwargs": {"retries": {"max_attempts": 2, "mode": "standard"}, "connect_timeout": 2,
                                  "read_timeout": 5}}

    def bucket(self) -> str:
        name = f"mmreplay-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def iam_key(self) -> tuple[str, str]:
        """A key of a new IAM user allowed every S3 action (for use under :meth:`iam_auth`)."""
        iam = self.client("iam")
        user = f"mmreplay-{uuid.uuid4().hex[:8]}"
        iam.create_user(UserName=user)
        iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument='{"Version": "2012-10-17", "Statement": '
                            '[{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}')
        k = iam.create_access_key(UserName=user)["AccessKey"]
        return k["AccessKeyId"], k["SecretAccessKey"]

    def _set_auth(self, count: str) -> None:
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset-auth", data=count.encode(), method="POST",
                                     headers={"Content-Type": "text/plain"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200

    @contextlib.contextmanager
    def iam_auth(self) -> Iterator[None]:
        """moto checks every request's signature and IAM policy in the block (it accepts any key outside)."""
        self._set_auth("0")
        try:
            yield
        finally:
            self._set_auth("inf")


def forget_clients() -> None:
    """Close and drop s3fs's cached filesystems: each holds a client made with the settings of its
    time, so a later test's changed settings are read afresh. zarr opens them asynchronous, on its
    own event loop, where s3fs never closes them (aiohttp warns "Unclosed client session" when they
    are collected): closed here on that loop."""
    import s3fs
    from zarr.core.sync import sync

    for fs in list(s3fs.S3FileSystem._cache.values()):
        client = getattr(fs, "_s3", None)
        if fs.asynchronous and client is not None:
            with contextlib.suppress(Exception):
                sync(client.close(), timeout=5)
    s3fs.S3FileSystem.clear_instance_cache()


@dataclass
class S3Bucket:
    """A fresh bucket on :class:`S3Server` and the ``storage_options`` of its URLs."""

    server: S3Server
    name: str

    def url(self, path: str) -> str:
        return f"s3://{self.name}/{path}"

    @property
    def options(self) -> dict[str, Any]:
        return self.server.options()


@contextlib.contextmanager
def moto_s3(scratch: Path) -> Iterator[S3Server]:
    """An :class:`S3Server` with this process's AWS settings pointed at it for the block (see the
    module docstring); ``scratch``: a directory of the test's, where no AWS config file is."""
    import s3fs  # noqa: F401 - imported before the server's thread starts importing its own modules

    mp = pytest.MonkeyPatch()
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL_S3",
                 "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "AWS_CA_BUNDLE"):
        mp.delenv(name, raising=False)
    mp.setenv("AWS_CONFIG_FILE", str(scratch / "no-aws-config"))
    mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(scratch / "no-aws-credentials"))
    mp.setenv("AWS_ACCESS_KEY_ID", KEY)
    mp.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    mp.setenv("AWS_DEFAULT_REGION", REGION)
    mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
    mp.setenv("AWS_MAX_ATTEMPTS", "2")
    mp.setenv("AWS_RETRY_MODE", "standard")
    for name in ("NO_PROXY", "no_proxy"):  # a proxy set for the machine is never asked for loopback
        mp.setenv(name, "127.0.0.1,localhost")
    werkzeug = logging.getLogger("werkzeug")  # one line per request otherwise
    level = werkzeug.level
    werkzeug.setLevel(logging.ERROR)
    server = S3Server()
    try:
        server.start()
        mp.setenv("AWS_ENDPOINT_URL", server.endpoint)  # a call without storage_options reaches moto too
        forget_clients()
        yield server
    finally:
        server.stop()
        forget_clients()
        werkzeug.setLevel(level)
        mp.undo()
