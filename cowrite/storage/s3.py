"""What S3 storage needs beside fsspec's: one filesystem (one client) per process, options and AWS
environment, reading the times of listed keys cheaply; ListObjectsV2 with ``StartAfter``, which s3fs's
listings do not offer; the options that open the same bucket as the same principal in another process;
and an obstore store that makes a table's requests with a fraction of s3fs's CPU, where the options let
it reach the bucket exactly as s3fs would, and reads a file by ranges from its end, with no size lookup."""

from __future__ import annotations

import io
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import IO, TYPE_CHECKING, Any, cast
from urllib.parse import urlparse

import fsspec
from fsspec import AbstractFileSystem
from fsspec.asyn import sync

from cowrite.process import keep_mapping

if TYPE_CHECKING:
    from obstore import ObjectMeta
    from obstore.store import S3Credential, S3Store

log = logging.getLogger(__name__)

PAGE = 1000  # keys per listing request (S3's maximum); tests lower it to see pages joined
TAIL = 64 * 1024  # bytes an object opened for reading is asked for first: its end, where parquet's footer is
READ_AHEAD = 16 * 1024**2  # bytes a read past what was fetched asks for at least, as s3fs's blocks do
_FILESYSTEMS_KEPT = 32  # distinct S3 locations and credentials a process works with at once

_FILESYSTEMS: dict[tuple[int, str, tuple[tuple[str, str], ...]], AbstractFileSystem] = keep_mapping(
    "cowrite.storage.s3._FILESYSTEMS",
    {},
    f"{_FILESYSTEMS_KEPT} filesystems, the oldest dropped",
    "an S3 filesystem holds a client (its service model, a connection pool): one per storage opened "
    "cost a client's creation each time, and the memory of every one for good. Kept by process, options "
    "and AWS environment, so a process whose credentials or endpoint variables change gets a new client",
)


def filesystem(options: dict[str, Any]) -> AbstractFileSystem:
    key = _kept_by(options)
    fs = _FILESYSTEMS.get(key)
    if fs is None:
        if len(_FILESYSTEMS) >= _FILESYSTEMS_KEPT:
            del _FILESYSTEMS[next(iter(_FILESYSTEMS))]  # the oldest
        fs = _FILESYSTEMS[key] = fsspec.filesystem("s3", skip_instance_cache=True, **options)
        if fs.session is None:  # a session the caller passed is theirs to configure
            # Imported here: aiobotocore brings aiohttp and most of botocore, some 270 modules a process
            # that opens only local tables would load (and its garbage collector walk) for nothing.
            from aiobotocore.session import AioSession

            fs.session = AioSession(**fs.kwargs)  # what s3fs would create, and:
            fs.session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=_time)
    return fs


def _kept_by(options: dict[str, Any]) -> tuple[int, str, tuple[tuple[str, str], ...]]:
    """What a process keeps a client by: itself, the options and the AWS environment."""
    environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    return os.getpid(), json.dumps(options, sort_keys=True, default=repr), environment


def _time(value: Any) -> datetime:
    """A time in a response: S3 writes each listed key's ``LastModified`` in ISO 8601, which the standard
    library reads at a fraction of the CPU of botocore's general parser (dateutil's), the bulk of a
    listing's parsing in a writer. Anything else (HTTP dates in headers, numbers) goes to botocore's."""
    try:
        return datetime.fromisoformat(value)
    except (TypeError, ValueError):
        from botocore.utils import parse_timestamp

        return parse_timestamp(value)


def keys_after(fs: AbstractFileSystem, directory: str, after: str) -> list[tuple[str, int, float]]:
    """(name, size, modification time) of the objects directly inside ``directory`` (``bucket/key``, as
    s3fs spells paths) whose names sort after ``after``, in S3's order (byte order of the keys).
    Raises what s3fs raises (``OSError`` subclasses, botocore's errors)."""
    bucket, _, key = directory.partition("/")
    prefix = f"{key}/" if key else ""
    found: list[tuple[str, int, float]] = []
    more: dict[str, Any] = {}
    while True:
        page = fs.call_s3(
            "list_objects_v2",
            Bucket=bucket,
            Prefix=prefix,
            Delimiter="/",  # not what lies in sub-directories
            StartAfter=prefix + after,
            MaxKeys=PAGE,
            **more,
        )
        for item in page.get("Contents", ()):
            found.append((item["Key"][len(prefix) :], int(item["Size"]), item["LastModified"].timestamp()))
        if not page.get("IsTruncated"):
            return found
        more = {"ContinuationToken": page["NextContinuationToken"]}


def portable_options(fs: AbstractFileSystem, opened_with: dict[str, Any]) -> dict[str, Any]:
    """Options that open ``fs`` in another process, on another machine: ``opened_with`` (the options it
    was opened with) joined by the endpoint, region and credentials this process found in its AWS
    environment (variables, profile, instance role), so that an executor with no AWS environment of its
    own reaches the same bucket as the same principal. Credentials go out as they are now: temporary
    ones that expire during a job fail its later tasks with the storage's error."""
    options = dict(opened_with)
    if options.get("anon"):
        return options
    client = sync(fs.loop, fs.set_session)
    if "endpoint_url" not in options:
        client_kwargs = dict(options.get("client_kwargs") or {})
        client_kwargs.setdefault("endpoint_url", client.meta.endpoint_url)
        if client.meta.region_name:
            client_kwargs.setdefault("region_name", client.meta.region_name)
        options["client_kwargs"] = client_kwargs
    if "key" not in options and "secret" not in options:
        credentials = sync(fs.loop, fs.session.get_credentials)
        if credentials is not None:
            frozen = sync(fs.loop, credentials.get_frozen_credentials)
            options.pop("profile", None)  # a profile names a file the executor's machine lacks
            options.update(key=frozen.access_key, secret=frozen.secret_key)
            if frozen.token:
                options["token"] = frozen.token
    return options


# -- requests through obstore ----------------------------------------------------------------------

# s3fs's options an obstore store honours as s3fs does; those that only tune s3fs's own caches (which
# cowrite turns off or never reads through) change nothing here. Any other option (server-side
# encryption, a session of the caller's, TLS settings, ...) keeps its storage on s3fs for every request.
_HONOURED = frozenset({"key", "secret", "token", "anon", "profile", "client_kwargs", "config_kwargs"})
_S3FS_CACHES = frozenset({"use_listings_cache", "listings_expiry_time", "skip_instance_cache", "max_paths"})
_HONOURED_CLIENT = frozenset({"endpoint_url", "region_name"})
_HONOURED_CONFIG = frozenset({"connect_timeout", "read_timeout", "retries"})
_HONOURED_RETRIES = frozenset({"max_attempts", "total_max_attempts", "mode"})
# botocore's default: five attempts in all
_ATTEMPTS = 5
# How long temporary credentials (a role's) are used before botocore is asked for them again: it
# refreshes them well before they expire.
_ASK_AGAIN = timedelta(minutes=5)

_STORES: dict[tuple[str, int, str, tuple[tuple[str, str], ...]], S3Store | None] = keep_mapping(
    "cowrite.storage.s3._STORES",
    {},
    f"{_FILESYSTEMS_KEPT} stores, the oldest dropped",
    "an obstore store holds a client and its connections: one per bucket, options and AWS environment, "
    "as for the filesystems",
)
# The process whose obstore runtime runs: its threads do not survive a fork, and a store used in a
# forked child waits for them for ever. A child, and its own children, keep to s3fs.
_runtime_in: int | None = None


def object_store(fs: AbstractFileSystem, options: dict[str, Any], bucket: str) -> S3Store | None:
    """An obstore ``S3Store`` for ``bucket`` that reaches it as ``fs`` (opened with ``options``) does: the
    endpoint, region and credentials botocore resolves for s3fs (options, AWS environment, profile, role),
    temporary credentials asked for again as botocore refreshes them, path-style requests to an endpoint
    of the options or environment, virtual-hosted ones to a region's own. None — make every request with
    s3fs — where ``options`` ask for what it does not do, for an AWS endpoint other than a region's
    standard one, where botocore finds no credentials (s3fs then decides), or in a process forked from one
    that used obstore. Raises what botocore raises when it resolves them."""
    global _runtime_in
    pid = os.getpid()
    if (_runtime_in is not None and _runtime_in != pid) or not _honoured(options):
        return None
    key = (bucket, *_kept_by(options))
    if key in _STORES:
        return _STORES[key]
    if len(_STORES) >= _FILESYSTEMS_KEPT:
        del _STORES[next(iter(_STORES))]  # the oldest
    store = _STORES[key] = _open_store(fs, options, bucket)
    if store is not None:
        _runtime_in = pid
    return store


def _honoured(options: dict[str, Any]) -> bool:
    config = options.get("config_kwargs") or {}
    retries = config.get("retries") or {}
    return (
        set(options) <= _HONOURED | _S3FS_CACHES
        and set(options.get("client_kwargs") or {}) <= _HONOURED_CLIENT
        and set(config) <= _HONOURED_CONFIG
        and set(retries) <= _HONOURED_RETRIES
    )


def _open_store(fs: AbstractFileSystem, options: dict[str, Any], bucket: str) -> S3Store | None:
    from obstore.store import S3Store  # with s3fs: the s3 extra brings both

    client = sync(fs.loop, fs.set_session)  # s3fs's client: the endpoint and region botocore resolved
    endpoint: str = client.meta.endpoint_url
    config = options.get("config_kwargs") or {}
    retries = config.get("retries") or {}
    attempts = retries.get("total_max_attempts") or retries.get("max_attempts") or _ATTEMPTS
    settings: dict[str, Any] = {
        "region": client.meta.region_name or "us-east-1",
        "client_options": {
            "allow_http": endpoint.startswith("http://"),
            "connect_timeout": timedelta(seconds=config.get("connect_timeout", 60)),
            "timeout": timedelta(seconds=config.get("read_timeout", 60)),
        },
        "retry_config": {
            "max_retries": max(0, attempts - 1),
            "retry_timeout": timedelta(minutes=3),
            "backoff": {
                "init_backoff": timedelta(milliseconds=100),
                "max_backoff": timedelta(seconds=15),
                "base": 2,
            },
        },
    }
    host = urlparse(endpoint).hostname or ""
    if host.endswith(".amazonaws.com"):
        if host not in ("s3.amazonaws.com", f"s3.{settings['region']}.amazonaws.com"):
            return None  # a FIPS or dual-stack endpoint, an access point: s3fs reaches them as asked
        settings["virtual_hosted_style_request"] = True  # the region's endpoint, derived from it
    else:
        settings["endpoint"] = endpoint
    if options.get("anon"):
        return S3Store(bucket, skip_signature=True, **settings)
    # Credentials always come from here: obstore would otherwise also take some from the environment
    # (a session token beside the options' keys) that botocore leaves alone.
    provider: Callable[[], S3Credential]
    if options.get("key") and options.get("secret"):
        given: S3Credential = {
            "access_key_id": options["key"],
            "secret_access_key": options["secret"],
            "token": options.get("token"),
            "expires_at": None,
        }
        provider = given.copy
    else:
        credentials = sync(fs.loop, fs.session.get_credentials)
        if credentials is None:
            log.info("no AWS credentials found for s3://%s: its requests go through s3fs", bucket)
            return None
        provider = _SessionCredentials(fs, credentials)
    return S3Store(bucket, credential_provider=provider, **settings)


Listed = list[tuple[str, int, float]]  # (name inside the directory, size, modification time) of each file


def requests_for(fs: AbstractFileSystem, options: dict[str, Any], bucket: str) -> Requests:
    """Who makes a storage's requests in this process: obstore where :func:`object_store` gives a store,
    s3fs otherwise."""
    store = object_store(fs, options, bucket)
    return ObstoreRequests(store) if store is not None else S3fsRequests(fs)


class S3fsRequests:
    """A storage's requests through s3fs (botocore), of paths ``bucket/key``. Raises what s3fs raises."""

    def __init__(self, fs: AbstractFileSystem) -> None:
        self.fs = fs

    def read(self, path: str) -> bytes:
        return bytes(self.fs.cat_file(path, max_concurrency=1))

    def write(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(path, data)

    def create(self, path: str, data: bytes) -> bool:
        try:
            self.fs.pipe_file(path, data, mode="create")
            return True
        except FileExistsError:
            return False

    def listed(self, directory: str) -> Listed:
        entries = sync(self.fs.loop, self.fs._lsdir, directory, refresh=True)
        return [
            (e["name"].rsplit("/", 1)[-1], int(e.get("size") or 0), e["LastModified"].timestamp())
            for e in entries
            if e["type"] == "file"
        ]

    def listed_after(self, directory: str, after: str) -> Listed:
        return keys_after(self.fs, directory, after)

    def delete_all(self, paths: list[str]) -> None:
        """One DeleteObjects request a thousand keys (s3fs's bulk delete, which does not report a key S3
        refused)."""
        self.fs.rm(paths)

    def input(self, path: str) -> IO[bytes]:
        return cast(IO[bytes], self.fs.open(path, "rb"))

    def output(self, path: str) -> AbstractContextManager[IO[bytes]]:
        return cast(AbstractContextManager[IO[bytes]], self.fs.open(path, "wb"))


class ObstoreRequests:
    """A storage's requests through an obstore store, of paths ``bucket/key``. Raises ``OSError`` for what
    obstore raises (``FileNotFoundError`` for a missing key)."""

    def __init__(self, store: S3Store) -> None:
        self.store = store

    def read(self, path: str) -> bytes:
        with _as_os_errors():
            return bytes(_obstore().get(self.store, _key(path)).bytes())

    def write(self, path: str, data: bytes) -> None:
        with _as_os_errors():
            _obstore().put(self.store, _key(path), data)

    def create(self, path: str, data: bytes) -> bool:
        """Whether this PUT with ``If-None-Match: *`` created the key: False when it exists (S3's 412). Any
        other refusal raises, as through s3fs: whether the key exists then is not known."""
        from obstore.exceptions import AlreadyExistsError

        with _as_os_errors():
            try:
                _obstore().put(self.store, _key(path), data, mode="create")
            except AlreadyExistsError:
                return False
        return True

    def listed(self, directory: str) -> Listed:
        prefix = _key(f"{directory}/")
        with _as_os_errors():
            return _inside(prefix, _obstore().list_with_delimiter(self.store, prefix or None)["objects"])

    def listed_after(self, directory: str, after: str) -> Listed:
        """ListObjectsV2 with ``StartAfter``, a request a page. obstore has no delimiter with a start, so keys
        below sub-directories come too (the timeline's ``history/`` of a table Hudi archived: a page more),
        and are left out here."""
        prefix = _key(f"{directory}/")
        with _as_os_errors():
            pages = _obstore().list(self.store, prefix or None, offset=prefix + after, chunk_size=PAGE)
            return _inside(prefix, [o for page in pages for o in page])

    def delete_all(self, paths: list[str]) -> None:
        """One DeleteObjects request a thousand keys (obstore makes one even of a single key)."""
        with _as_os_errors():
            _obstore().delete(self.store, [_key(path) for path in paths])

    def input(self, path: str) -> IO[bytes]:
        """A file read by ranges (:class:`_Ranged`): opened with one request, which raises
        ``FileNotFoundError`` for a missing key."""
        return cast(IO[bytes], _Ranged(self.store, _key(path)))

    @contextmanager
    def output(self, path: str) -> Iterator[IO[bytes]]:
        """A file uploaded in parts once it outgrows a buffer, and not at all when the block raises: a
        parquet writer that failed leaves no object behind."""
        with _as_os_errors(), _obstore().open_writer(self.store, _key(path)) as out:
            yield cast(IO[bytes], _Upload(out))


Requests = S3fsRequests | ObstoreRequests


def _obstore() -> Any:
    import obstore  # loaded with the first S3 table's requests, as botocore is

    return obstore


def _key(path: str) -> str:
    return path.partition("/")[2]


def _inside(prefix: str, objects: Iterable[ObjectMeta]) -> Listed:
    """(name, size, time) of the ``objects`` directly under ``prefix``."""
    named = ((o["path"][len(prefix) :], o) for o in objects)
    return [(name, int(o["size"]), o["last_modified"].timestamp()) for name, o in named if "/" not in name]


@contextmanager
def _as_os_errors() -> Iterator[None]:
    """obstore's errors as the ``OSError`` the storage contract translates (a missing key already is a
    ``FileNotFoundError``)."""
    from obstore.exceptions import BaseError

    try:
        yield
    except BaseError as exc:
        raise OSError(str(exc)) from exc


class _Ranged(io.RawIOBase):
    """An object read by ranged GETs. Opened with a request for its last :data:`TAIL` bytes, which tells
    its size too: no size lookup before reading (s3fs makes one), a parquet footer at hand, and a small
    object whole. A read beyond what was fetched asks for :data:`READ_AHEAD` bytes from where it starts at
    least, as a reader of a file's columns reads on; the tail and the last range fetched are kept."""

    def __init__(self, store: S3Store, key: str) -> None:
        super().__init__()
        self._store, self._key, self._at = store, key, 0
        from obstore.exceptions import BaseError

        with _as_os_errors():
            try:
                tail = _obstore().get(store, key, options={"range": {"suffix": TAIL}})
            except BaseError:  # (not a missing key: obstore raises FileNotFoundError for that)
                tail = _obstore().get(store, key)  # an empty object has no range to give
            self._size = int(tail.meta["size"])
            self._tail = self._last = (tail.range[0], memoryview(tail.bytes()))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._at = max(0, offset + {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._size}[whence])
        return self._at

    def readinto(self, buffer: Any) -> int:
        out, done = memoryview(buffer).cast("B"), 0
        wanted = max(0, min(len(out), self._size - self._at))
        while done < wanted:
            start, data = self._fetched(wanted - done)
            piece = data[self._at - start : self._at - start + wanted - done]
            out[done : done + len(piece)] = piece
            done += len(piece)
            self._at += len(piece)
        return done

    def _fetched(self, wanted: int) -> tuple[int, memoryview]:
        """A range fetched that holds the byte at the position, fetched now if none does."""
        for start, data in (self._last, self._tail):
            if start <= self._at < start + len(data):
                return start, data
        start, end = self._at, min(self._size, self._at + max(wanted, READ_AHEAD))
        with _as_os_errors():
            fetched = _obstore().get_range(self._store, self._key, start=start, end=end)
        self._last = (start, memoryview(fetched))
        return self._last


class _Upload:
    """obstore's writable file, for writers that hand it any buffer: pyarrow's hold signed bytes, which it
    refuses as such."""

    def __init__(self, out: Any) -> None:
        self._out = out

    def write(self, data: Any) -> int:
        return int(self._out.write(memoryview(data).cast("B")))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._out, name)


class _SessionCredentials:
    """The credentials botocore's session holds, for obstore: asked for again every few minutes when they
    are temporary, which botocore refreshes before they expire."""

    def __init__(self, fs: AbstractFileSystem, credentials: Any) -> None:
        self._fs = fs
        self._credentials = credentials
        self._temporary = hasattr(credentials, "refresh_needed")

    def __call__(self) -> S3Credential:
        frozen = sync(self._fs.loop, self._credentials.get_frozen_credentials)
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": datetime.now(UTC) + _ASK_AGAIN if self._temporary else None,
        }
