"""What S3 storage needs beside fsspec's: one filesystem (one client) per process, options and AWS
environment, reading the times of listed keys cheaply; ListObjectsV2 with ``StartAfter``, which s3fs's
listings do not offer; and the options that open the same bucket as the same principal in another
process."""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any

import fsspec
from fsspec import AbstractFileSystem
from fsspec.asyn import sync

from cowrite.process import keep_mapping

PAGE = 1000  # keys per listing request (S3's maximum); tests lower it to see pages joined
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
    environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    key = (os.getpid(), json.dumps(options, sort_keys=True, default=repr), environment)
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
