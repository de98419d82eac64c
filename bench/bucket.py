"""The object-store benchmarks' bucket: the tests' moto server, and the options its clients sign with.

Every client signs with an access key of its own (moto accepts any), so a proxy in front of the server can
charge each request to the process that made it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BUCKET = "cowrite-bench"
SECRET = "cowrite-bench-secret"
REGION = "us-east-1"


@contextmanager
def s3_server() -> Iterator[Any]:
    """The tests' moto server (it serialises conditional PUTs, as S3 decides them atomically)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support.servers import S3Server

    with S3Server(bucket=BUCKET) as server:
        yield server


def cowrite_options(endpoint: str, client: str) -> dict[str, Any]:
    """s3fs options that sign with ``client`` as the access key."""
    client_kwargs = {"endpoint_url": endpoint, "region_name": REGION}
    return {"key": client, "secret": SECRET, "client_kwargs": client_kwargs}


def delta_options(endpoint: str, client: str) -> dict[str, str]:
    """delta-rs's storage options that sign with ``client`` as the access key."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": client,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_REGION": REGION,
        "AWS_ALLOW_HTTP": "true",
    }
