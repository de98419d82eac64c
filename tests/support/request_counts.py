"""Requests to the S3 server counted one by one, for tests of what an operation costs: the object-store
benchmark's proxy (``bench.proxy.ProxyProcess``, in a process of its own, without delay) between the
client and the server."""

from __future__ import annotations

import sys
from urllib.parse import parse_qs, unquote, urlsplit

from support import ROOT

sys.path.insert(0, str(ROOT))
from bench import proxy  # noqa: E402
from bench.proxy import Request, sequential  # noqa: E402
from cowrite.storage.together import finish_background  # noqa: E402

__all__ = ["ProxyProcess", "Request", "sequential", "what"]


class ProxyProcess(proxy.ProxyProcess):
    """The benchmark's proxy, whose :meth:`reset` first waits for the requests this process made in the
    background (a lock's release, on an object store): they count with the operation that made them."""

    def reset(self) -> list[Request]:
        finish_background()
        return super().reset()


def what(request: Request) -> tuple[str, str]:
    """A request as (kind, what it is about): the directory listed, or the directory of the file."""
    url = urlsplit(request.path)
    if request.kind == "LIST":
        return "LIST", parse_qs(url.query)["prefix"][0].rstrip("/").rsplit("/", 1)[-1]
    return request.kind, unquote(url.path).rsplit("/", 2)[-2]
