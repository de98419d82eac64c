"""A delaying, request-counting HTTP proxy: an object store's round trips, on loopback.

A local S3 server answers in microseconds; S3, GCS or ADLS answer in 10-50 ms. Put this proxy between
the clients and the server and every request waits ``delay`` seconds before it is forwarded, as if it
crossed a network. Requests in flight wait concurrently, like on a real connection pool, so what a
protocol pays is the number of round trips it makes one after another, not the number it makes.

Every request is counted by kind: ``GET``, ``LIST`` (a GET of a listing), ``HEAD``, ``PUT``, ``POST``,
``DELETE``; with ``trace=True`` each is also kept as a :class:`Request`, named by the access key that
signed it, so that clients given keys of their own (one per writer process) can be told apart. The proxy
is part of the benchmarks and the chaos harness, not of cowrite:

    with DelayingProxy(server.endpoint_url, delay=0.02) as proxy:
        options = {..., "client_kwargs": {"endpoint_url": proxy.endpoint_url}}
        ...
        print(proxy.counts())

:class:`ProxyProcess` runs one in a process of its own (``python -m bench.proxy UPSTREAM DELAY``), so that a
busy client process cannot hold requests up through its interpreter lock: the chaos harness runs its
checker and consumers beside the proxy it puts in front of the writers.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType

import aiohttp
from aiohttp import web

# Headers about one hop of a connection, never forwarded (RFC 9110, section 7.6.1).
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
}


# Answered by the proxy itself: "_proxy" is no valid bucket name, so no S3 request can mean it.
_REQUESTS = "/_proxy/requests"

# SigV4: "AWS4-HMAC-SHA256 Credential=<access key>/<date>/<region>/s3/aws4_request, ..."
_ACCESS_KEY = re.compile(r"Credential=([^/]+)/")


@dataclass(frozen=True)
class Request:
    """One forwarded request: who signed it, its kind, and when it arrived and was answered."""

    client: str
    kind: str
    path: str  # with its query
    began: float  # time.time() on arrival, before the delay
    ended: float  # time.time() once answered


def sequential(requests: list[Request]) -> int:
    """The longest chain of ``requests`` in which each began after the previous one was answered."""
    ordered = sorted(requests, key=lambda r: r.began)
    chain: list[int] = []
    for i, request in enumerate(ordered):
        before = [chain[j] for j in range(i) if ordered[j].ended <= request.began]
        chain.append(1 + max(before, default=0))
    return max(chain, default=0)


def kind(method: str, query: str) -> str:
    """The kind a request is counted as: its method, or ``LIST`` for a GET of a bucket listing."""
    if method == "GET" and ("list-type" in query or "delimiter" in query or "prefix=" in query):
        return "LIST"
    return method


class DelayingProxy:
    """Forwards every request to ``upstream`` after ``delay`` seconds; counts requests by kind.

    It runs its own event loop in a daemon thread and binds 127.0.0.1 on a free port. ``delay`` may be
    changed while it runs; :meth:`counts` and :meth:`reset` are safe from any thread.
    """

    def __init__(self, upstream: str, delay: float = 0.02, trace: bool = False) -> None:
        self.upstream = upstream.rstrip("/")
        self.delay = delay
        self.trace = trace
        self._requests: list[Request] = []
        self.endpoint_url = ""
        self._counts: Counter[str] = Counter()
        self._in_flight = 0
        self.peak_in_flight = 0  # most requests held at once since the last reset
        self._mutex = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="delaying-proxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- counting --------------------------------------------------------------------------------
    def counts(self) -> Counter[str]:
        """Requests forwarded so far, by kind (a copy)."""
        with self._mutex:
            return Counter(self._counts)

    def reset(self) -> Counter[str]:
        """The counts so far; counting (and tracing) starts again from zero."""
        with self._mutex:
            counts, self._counts = self._counts, Counter()
            self._requests = []
            self.peak_in_flight = self._in_flight
            return counts

    def requests(self) -> list[Request]:
        """The requests answered since the last reset, in the order they were answered (``trace=True``)."""
        with self._mutex:
            return list(self._requests)

    def cpu(self) -> float:
        """CPU seconds the proxy's thread has used so far: a network costs its clients no CPU, this proxy
        takes it from the cores its clients run on."""
        return asyncio.run_coroutine_threadsafe(self._thread_time(), self._loop).result(timeout=30)

    @staticmethod
    async def _thread_time() -> float:
        return time.thread_time()

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> DelayingProxy:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=30)
        self.endpoint_url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        self._loop.close()

    def __enter__(self) -> DelayingProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- serving ---------------------------------------------------------------------------------
    async def _serve(self) -> int:
        # No pool limit: a request must never wait for another's connection, only for its own delay.
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        app = web.Application(client_max_size=1 << 31)
        app.router.add_get(_REQUESTS, self._answer_requests)
        app.router.add_route("*", "/{path:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        return int(self._runner.addresses[0][1])

    async def _answer_requests(self, request: web.Request) -> web.Response:
        """``GET /_proxy/requests``: :meth:`requests` as JSON; with ``?reset=1``, then :meth:`reset`."""
        with self._mutex:
            answered = [asdict(r) for r in self._requests]
        if request.query.get("reset"):
            self.reset()
        return web.json_response(answered)

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        began = time.time()
        counted = kind(request.method, request.query_string)
        with self._mutex:
            self._counts[counted] += 1
            self._in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self._in_flight)
        try:
            return await self._relay(request)
        finally:
            with self._mutex:
                self._in_flight -= 1
                if self.trace:
                    signed = _ACCESS_KEY.search(request.headers.get("Authorization", ""))
                    client = signed.group(1) if signed else ""
                    self._requests.append(Request(client, counted, request.path_qs, began, time.time()))

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        await asyncio.sleep(self.delay)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        assert self._session is not None
        async with self._session.request(
            request.method,
            self.upstream + request.rel_url.raw_path_qs,
            headers=headers,
            data=body,
            allow_redirects=False,
            skip_auto_headers=("Content-Type", "User-Agent", "Accept-Encoding"),
        ) as upstream:
            payload = await upstream.read()
            reply = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}
            if request.method != "HEAD":  # a HEAD's Content-Length is the object's size: keep it
                reply.pop("Content-Length", None)
            return web.Response(status=upstream.status, headers=reply, body=payload)


class ProxyProcess:
    """A :class:`DelayingProxy` (with ``trace=True``) in a process of its own, with the same
    :meth:`requests` and :meth:`reset` over HTTP; it exits with its parent (its stdin closes)."""

    def __init__(self, upstream: str, delay: float = 0.02) -> None:
        self.delay = delay
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.proxy", upstream, str(delay)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[1],  # where ``bench`` is a package
        )
        assert self._process.stdout is not None
        port = self._process.stdout.readline().strip()
        if not port.isdigit():
            self._process.kill()
            raise RuntimeError(f"the delaying proxy did not start (exit {self._process.wait()})")
        self.endpoint_url = f"http://127.0.0.1:{port}"

    def requests(self) -> list[Request]:
        return self._fetch("")

    def reset(self) -> list[Request]:
        """The requests since the last reset; tracing starts again from none."""
        return self._fetch("?reset=1")

    def _fetch(self, query: str) -> list[Request]:
        with urllib.request.urlopen(self.endpoint_url + _REQUESTS + query, timeout=30) as answer:
            return [Request(**r) for r in json.load(answer)]

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self._process.communicate(timeout=10)  # closes its stdin: the proxy stops
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.communicate()


def _serve(upstream: str, delay: float) -> None:
    """The proxy's own process: print the port, serve until stdin closes (the parent left or died)."""
    with DelayingProxy(upstream, delay, trace=True) as proxy:
        print(proxy.endpoint_url.rsplit(":", 1)[1], flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m bench.proxy UPSTREAM DELAY_SECONDS  (started by ProxyProcess)")
    _serve(sys.argv[1], float(sys.argv[2]))
