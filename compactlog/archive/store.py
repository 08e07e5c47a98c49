"""The one small interface the archive uses to talk to an object store, and its one
implementation on ``obstore`` (the Rust ``object_store``: S3, GCS, Azure, local, memory).

Why an interface of our own: the archive needs seven operations, two of them conditional
(put-if-absent for manifests and the lease, put-if-match on the ETag to renew the lease),
and tests wrap it (:class:`FaultyStore`) to inject failures between the archiver and the
server. Nothing else in ``compactlog.archive`` imports ``obstore``.

URLs: ``s3://bucket/prefix`` (credentials, region and endpoint from the standard ``AWS_*``
environment variables, including ``AWS_ENDPOINT_URL`` and ``AWS_ALLOW_HTTP=true``),
``gs://bucket/prefix``, ``az://container/prefix``, ``file:///path`` (a local or mounted
directory) and ``memory://name`` (one store per name and process, for tests).

``file://``: ``object_store``'s local store has put-if-absent but no put-if-match, so this
module emulates it under an ``flock`` of ``.compactlog-archive.lock`` in the directory: every
conditional write to a ``file://`` archive goes through that lock.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, TypeVar
from urllib.parse import urlparse

from ..errors import ArchiveError, ObjectMissingError, StoreError
from .store_settings import check_s3_environment, describe

T = TypeVar("T")

LOCAL_LOCK = ".compactlog-archive.lock"
SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss", "file", "memory")
MULTIPART_BYTES = 16 << 20  # objects above this go up as multipart uploads


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What ``head`` and ``list`` tell of one object."""

    key: str
    size: int
    etag: str | None
    modified_ms: int


class Store(Protocol):
    """The archive's view of an object store. Keys are relative to the archive's URL."""

    url: str

    def put(self, key: str, data: bytes | memoryview) -> None:
        """Write (or overwrite) an object; the archive uses it only for content-named,
        immutable objects, where an overwrite rewrites the same bytes."""

    def put_if_absent(self, key: str, data: bytes) -> str | None:
        """Create ``key``; its ETag, or ``None`` when it already exists."""

    def put_if_match(self, key: str, data: bytes, etag: str) -> str | None:
        """Replace ``key`` if its ETag is still ``etag``; the new ETag, or ``None`` when
        the object changed (or vanished) meanwhile."""

    def get(self, key: str) -> tuple[bytes, str | None]:
        """The object's bytes and ETag; :class:`ObjectMissingError` if absent."""

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object."""

    def head(self, key: str) -> ObjectInfo | None:
        """Size, ETag and time of an object, or ``None`` if absent."""

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``."""

    def delete(self, key: str) -> None:
        """Remove an object (absent already: fine)."""


_MEMORY: dict[str, Any] = {}
_MEMORY_LOCK = threading.Lock()


def open_store(url: str, *, retries: int = 4, timeout_s: float = 30.0) -> ObjectStore:
    """The store for an archive URL (see the module docstring for the schemes)."""
    from obstore.store import LocalStore, MemoryStore, from_url

    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme not in SCHEMES:
        raise ArchiveError(
            f"unsupported archive URL scheme {scheme or '(none)'!r}; use one of "
            "s3://, gs://, az://, file:///path or memory://name",
            path=url,
        )
    if scheme == "memory":
        with _MEMORY_LOCK:
            inner = _MEMORY.setdefault(url.rstrip("/"), MemoryStore())
        return ObjectStore(url, inner, local_root=None)
    if scheme == "file":
        root = parsed.path
        if not root or parsed.netloc not in ("", "localhost"):
            raise ArchiveError("a file URL names an absolute path: file:///path", path=url)
        os.makedirs(root, exist_ok=True)
        return ObjectStore(url, LocalStore(root, mkdir=True), local_root=root)
    if scheme == "s3a":
        url = "s3" + url[3:]
    if scheme in ("s3", "s3a"):
        check_s3_environment(url)
    options = {
        "retry_config": {
            "max_retries": retries,
            "retry_timeout": timedelta(seconds=timeout_s),
            "backoff": {
                "init_backoff": timedelta(milliseconds=50),
                "max_backoff": timedelta(seconds=2),
                "base": 2.0,
            },
        },
        "client_options": {
            "timeout": timedelta(seconds=timeout_s),
            "connect_timeout": timedelta(seconds=5),
            # client options replace the environment's, so carry AWS_ALLOW_HTTP over
            "allow_http": os.environ.get("AWS_ALLOW_HTTP", "").lower() in ("1", "true", "yes"),
        },
    }
    try:
        inner = from_url(url, **options)
    except Exception as error:  # obstore's configuration errors
        raise ArchiveError(
            f"cannot open the object store: {_first_line(error)}", path=url
        ) from None
    return ObjectStore(url, inner, local_root=None)


class ObjectStore:
    """:class:`Store` on an ``obstore`` store; its errors become the archive's errors."""

    def __init__(self, url: str, inner: Any, *, local_root: str | None) -> None:
        self.url = url
        self.inner = inner
        self._local_root = local_root

    def put(self, key: str, data: bytes | memoryview) -> None:
        import obstore

        big = len(data) > MULTIPART_BYTES and self._local_root is None
        self._call(
            "put",
            key,
            lambda: obstore.put(
                self.inner, key, data, use_multipart=big, chunk_size=8 << 20, max_concurrency=8
            ),
        )

    def put_if_absent(self, key: str, data: bytes) -> str | None:
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        with self._conditional():
            try:
                result = self._call(
                    "put_if_absent",
                    key,
                    lambda: obstore.put(self.inner, key, data, mode="create"),
                )
            except _Raised as raised:
                if isinstance(raised.error, AlreadyExistsError | PreconditionError):
                    return None
                raise raised.translated from None
        return result["e_tag"]

    def put_if_match(self, key: str, data: bytes, etag: str) -> str | None:
        import obstore
        from obstore.exceptions import PreconditionError

        if self._local_root is not None:  # emulated: compare and write under the flock
            with self._conditional():
                info = self.head(key)
                if info is None or info.etag != etag:
                    return None
                self.put(key, data)
                after = self.head(key)
                return after.etag if after is not None else None
        try:
            result = self._call(
                "put_if_match",
                key,
                lambda: obstore.put(self.inner, key, data, mode={"e_tag": etag}),
            )
        except _Raised as raised:
            if isinstance(raised.error, PreconditionError | FileNotFoundError):
                return None
            raise raised.translated from None
        return result["e_tag"]

    def get(self, key: str) -> tuple[bytes, str | None]:
        import obstore

        def fetch() -> tuple[bytes, str | None]:
            response = obstore.get(self.inner, key)
            return bytes(response.bytes()), response.meta.get("e_tag")

        return self._call("get", key, fetch)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        import obstore

        if end <= start:
            return b""
        return bytes(
            self._call(
                "get_range", key, lambda: obstore.get_range(self.inner, key, start=start, end=end)
            )
        )

    def head(self, key: str) -> ObjectInfo | None:
        import obstore

        try:
            meta = self._call("head", key, lambda: obstore.head(self.inner, key))
        except ObjectMissingError:
            return None
        return _info(meta)

    def list(self, prefix: str) -> list[ObjectInfo]:
        import obstore

        def listing() -> list[ObjectInfo]:
            found: list[ObjectInfo] = []
            for chunk in obstore.list(self.inner, prefix or None):
                found.extend(_info(meta) for meta in chunk)
            return found

        try:
            found = self._call("list", prefix, listing)
        except ObjectMissingError:  # a local prefix directory that does not exist yet
            return []
        return sorted((f for f in found if f.key.startswith(prefix)), key=lambda f: f.key)

    def delete(self, key: str) -> None:
        import obstore

        try:
            self._call("delete", key, lambda: obstore.delete(self.inner, key))
        except ObjectMissingError:
            pass

    # -- helpers -----------------------------------------------------------------------
    def _call(self, op: str, key: str, operation: Callable[[], T]) -> T:
        """Run one request; obstore's own retries (backoff, 5xx, dropped connections) have
        run by the time an error reaches here. A failure becomes one line naming the URL,
        the operation, the store's error code and the setting to check
        (``store_settings.describe``)."""
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        try:
            return operation()
        except FileNotFoundError:
            raise ObjectMissingError(
                f"{op}: object not found in the archive (NotFound); `compactlog archive "
                f"verify {self.url}` says what its manifests name and what is missing",
                path=f"{self.url.rstrip('/')}/{key}",
            ) from None
        except (AlreadyExistsError, PreconditionError) as error:
            raise _Raised(error, StoreError(_first_line(error), path=key)) from None
        except Exception as error:
            raise self._failed(op, key, error) from None
        except BaseException as error:  # a panic in the Rust client (pyo3's PanicException)
            if type(error).__name__ != "PanicException":
                raise
            raise self._failed(op, key, error) from None

    def _failed(self, op: str, key: str, error: BaseException) -> StoreError:
        scheme = urlparse(self.url).scheme.lower().replace("s3a", "s3")
        return StoreError(
            f"object store request failed: {op} {key or '(root)'}: "
            f"{describe(error, scheme=scheme)}",
            path=self.url,
        )

    @contextmanager
    def _conditional(self) -> Any:
        if self._local_root is None:
            yield
            return
        fd = os.open(os.path.join(self._local_root, LOCAL_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


class _Raised(Exception):
    """A conditional write's refusal, carried to the caller that expects it."""

    def __init__(self, error: BaseException, translated: ArchiveError) -> None:
        super().__init__(str(error))
        self.error = error
        self.translated = translated


def _info(meta: Any) -> ObjectInfo:
    modified = meta.get("last_modified")
    return ObjectInfo(
        key=meta["path"],
        size=int(meta["size"]),
        etag=meta.get("e_tag"),
        modified_ms=int(modified.timestamp() * 1000) if modified is not None else 0,
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


# -- fault injection (tests) ----------------------------------------------------------------


class FaultyStore:
    """A :class:`Store` that fails requests on purpose, before or after doing them.

    ``plan(op, key)`` is called before every request and returns ``None`` (go ahead),
    ``"before"`` (fail without doing it: the request never arrived) or ``"after"`` (do it,
    then fail: the response was lost). Tests use it to show that no failure makes a
    manifest name an object that is not complete, and that the next round recovers.
    """

    def __init__(self, inner: Store, plan: Callable[[str, str], str | None]) -> None:
        self.inner = inner
        self.url = inner.url
        self.plan = plan
        self.failures = 0

    def _run(self, op: str, key: str, call: Callable[[], T]) -> T:
        decision = self.plan(op, key)
        if decision == "before":
            self.failures += 1
            raise StoreError(f"injected failure before {op}", path=key)
        result = call()
        if decision == "after":
            self.failures += 1
            raise StoreError(f"injected failure after {op}", path=key)
        return result

    def put(self, key: str, data: bytes | memoryview) -> None:
        self._run("put", key, lambda: self.inner.put(key, data))

    def put_if_absent(self, key: str, data: bytes) -> str | None:
        return self._run("put_if_absent", key, lambda: self.inner.put_if_absent(key, data))

    def put_if_match(self, key: str, data: bytes, etag: str) -> str | None:
        return self._run("put_if_match", key, lambda: self.inner.put_if_match(key, data, etag))

    def get(self, key: str) -> tuple[bytes, str | None]:
        return self._run("get", key, lambda: self.inner.get(key))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self._run("get_range", key, lambda: self.inner.get_range(key, start, end))

    def head(self, key: str) -> ObjectInfo | None:
        return self._run("head", key, lambda: self.inner.head(key))

    def list(self, prefix: str) -> list[ObjectInfo]:
        return self._run("list", prefix, lambda: self.inner.list(prefix))

    def delete(self, key: str) -> None:
        self._run("delete", key, lambda: self.inner.delete(key))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


__all__ = ["FaultyStore", "ObjectInfo", "ObjectStore", "Store", "now_ms", "open_store"]
