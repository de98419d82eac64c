"""What S3 storage needs beside fsspec's: one filesystem (one client) per process, options and AWS
environment, and ListObjectsV2 with ``StartAfter``, which s3fs's listings do not offer."""

from __future__ import annotations

import json
import os
from typing import Any

import fsspec
from fsspec import AbstractFileSystem

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
    return fs


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

