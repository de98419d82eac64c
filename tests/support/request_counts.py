"""Requests to the S3 server counted one by one, for tests of what an operation costs: the object-store
benchmark's proxy (``bench.proxy.ProxyProcess``, in a process of its own, without delay) between the
client and the server."""

from __future__ import annotations

import sys
from urllib.parse import parse_qs, unquote, urlsplit

from support import ROOT

sys.path.insert(0, str(ROOT))
from bench.proxy import ProxyProcess, Request, sequential  # noqa: E402

__all__ = ["ProxyProcess", "Request", "sequential", "what"]


def what(request: Request) -> tuple[str, str]:
    """A request as (kind, what it is about): the directory listed, or the directory of the file."""
    url = urlsplit(request.path)
    if request.kind == "LIST":
        return "LIST", parse_qs(url.query)["prefix"][0].rstrip("/").rsplit("/", 1)[-1]
    return request.kind, unquote(url.path).rsplit("/", 2)[-2]
