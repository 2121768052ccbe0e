"""Errors of an object store (S3 and the like) behind an archive's URL, said in one line naming the archive.

An S3 client's errors name an object or nothing (``PermissionError('Forbidden')`` from s3fs, a
botocore ``EndpointConnectionError`` naming one chunk's HTTP URL). :func:`naming` turns them, where
they leave an archive function, into :class:`mmreplay.core.errors.ObjectStoreError` (an
``ArchiveError``) naming the archive's URL, with what to check: the environment variables an S3
client reads (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL_S3``...) or the
``storage_options`` passed. The rule (:func:`object_store_error`): credentials refused -> the key
settings; no bucket -> create it; no connection or a timeout -> the endpoint settings (an export or
import run again resumes where it stopped). Other errors pass unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from ..core.errors import ObjectStoreError

__all__ = ["naming", "object_store_error"]

# the settings an S3 client reads from the environment, named by the object-store hints
_S3_KEYS = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
_S3_ENDPOINT = "AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL)"
_DENIED = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
           "AccountProblem", "AllAccessDisabled"}


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from (``__cause__``, or an unsuppressed ``__context__``)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ if cur.__cause__ is not None else (None if cur.__suppress_context__ else cur.__context__)


def object_store_error(exc: BaseException) -> tuple[str, str] | None:
    """``(message, hint)`` for an object store's refusal or absence: a botocore error, or the
    ``OSError`` s3fs made of one (``PermissionError('Forbidden')``); ``None`` for anything else.
    The rule: credentials refused -> the key variables; no bucket -> create it; no connection or
    a timeout -> the endpoint variables (an export or import run again resumes where it stopped)."""
    boto = next((e for e in _causes(exc) if type(e).__module__.startswith("botocore.")), None)
    if boto is None:
        return None
    kind = type(boto).__name__
    response = getattr(boto, "response", None)
    if isinstance(response, dict):  # ClientError: the store answered with an error code
        err = response.get("Error") or {}
        code = str(err.get("Code", "")) or "?"
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        text = str(err.get("Message") or (exc if exc is not boto else "")) or code
        what = f"{code}: {text}" if text != code else code
        if code in _DENIED or status == 403 or isinstance(exc, PermissionError):
            return (f"the object store refused the credentials ({what})",
                    f"check {_S3_KEYS}, and that {_S3_ENDPOINT} names the store they belong to")
        if code == "NoSuchBucket":
            return f"no such bucket ({what})", f"create the bucket, or check the URL and {_S3_ENDPOINT}"
        return f"the object store answered {what}", f"check the URL, {_S3_KEYS} and {_S3_ENDPOINT}"
    if kind in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "ProfileNotFound"):
        return f"no credentials for the object store ({boto})", f"set {_S3_KEYS}"
    if kind in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
                "ProxyConnectionError", "SSLError"):
        return (f"the object store cannot be reached ({boto})",
                f"check that the store is running and that {_S3_ENDPOINT} names it; run again: an export or "
                "import resumes where it stopped")
    return f"{kind}: {boto}", f"check the URL, {_S3_KEYS} and {_S3_ENDPOINT}"



@contextmanager
def naming(url: str | os.PathLike[str] | None) -> Iterator[None]:
    """Raise an object store's error in the block as ``ObjectStoreError`` naming ``url`` (the
    original chained); other errors pass unchanged."""
    try:
        yield
    except ObjectStoreError:
        raise
    except Exception as exc:
        found = None if url is None else object_store_error(exc)
        if found is None:
            raise
        raise ObjectStoreError(f"{url}: {found[0]}", hint=found[1]) from exc
