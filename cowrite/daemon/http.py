"""The daemon's HTTP endpoint: metrics, health, a read-only JSON view of each table, and a page of them.

=====================================  ===============================================================
``GET /``                              a page drawing each table's recent timeline (polls the JSON API)
``GET /page/<file>``                   its script and style sheet
``GET /metrics``                       Prometheus metrics
``GET /healthz``                       200 while the daemon runs
``GET /readyz``                        200 once every table has been polled, else 503
``GET /api/tables``                    every table's status
``GET /api/tables/<name>/timeline``    its instants
``GET /api/tables/<name>/heartbeats``  pending writes, heartbeat ages, failed (and stale) or not
``GET /api/tables/<name>/recent``      the last instants, what rollbacks undid, why writers gave up;
                                       ``?limit=<1-500>`` (default 60)
``GET /api/tables/<name>/locks``       the current filesystem lock holder
``GET /api/tables/<name>/watermark``   watermark (completion time) and fence (requested time)
``GET /api/tables/<name>/overlay``     END_COMMIT_TIME entries after ``?since=<completion time>``, read
                                       from the log as a consumer does (410 when commits after it
                                       were archived)
``POST /api/tables/<name>/rollback``   roll back failed writes now (token)
``POST /api/tables/<name>/clean``      clean now (token)
=====================================  ===============================================================

Binds 127.0.0.1 unless told otherwise. Tables are looked up by the names the daemon was configured with,
never turned into paths. Endpoints that change anything need ``Authorization: Bearer <token>`` with the
token from ``COWRITE_DAEMON_TOKEN``; without a configured token they answer 403.

The page is three files of this package (``page/``), no build step and nothing fetched from elsewhere
(its Content-Security-Policy allows this origin only); its requests are relative, so it also works
behind a path prefix (``kubectl proxy``, an ingress).
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import asdict
from functools import cache
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from cowrite.daemon.config import DaemonConfig
from cowrite.daemon.metrics import TableStatus
from cowrite.daemon.recent import RollbackTargets, parse_limit, recent
from cowrite.errors import CheckpointArchivedError, CowriteError
from cowrite.format.instant import check_time
from cowrite.format.overlay import read_since
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.protocol.locks.holders import current_lock

log = logging.getLogger(__name__)
MAX_BODY = 4096
PAGE_FILES = {
    "index.html": "text/html; charset=utf-8",
    "page.js": "text/javascript; charset=utf-8",
    "page.css": "text/css; charset=utf-8",
}
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


class TableService(Protocol):
    """What the endpoint reads of a served table (the daemon's :class:`~.service.TableService`)."""

    @property
    def status(self) -> TableStatus: ...
    @property
    def table(self) -> Table | None: ...
    @property
    def timeline(self) -> Timeline | None: ...
    @property
    def recent_timeline(self) -> Timeline | None: ...
    def poll(self) -> None: ...
    def clean(self) -> None: ...
    def abort_reason(self, instant: str) -> str | None: ...


class Daemon(Protocol):
    """What the endpoint reads of the daemon (:class:`~.service.Daemon`, which starts the endpoint)."""

    @property
    def config(self) -> DaemonConfig: ...
    @property
    def registry(self) -> CollectorRegistry: ...
    @property
    def ready(self) -> bool: ...
    @property
    def services(self) -> Sequence[TableService]: ...

    def service(self, name: str) -> TableService | None: ...


def _status_json(service: TableService) -> dict[str, Any]:
    status = service.status
    return {
        "name": status.name,
        "uri": status.uri,
        "up": status.up,
        "error": status.error,
        "corrupt": status.corrupt,
        "instants": status.instants_by_state,
        "pending": len(status.pending),
        "failed": sum(1 for p in status.pending if p.failed),
        "garbage_files": status.garbage_files,
        "garbage_bytes": status.garbage_bytes,
        "watermark": status.watermark,
        "fence": status.fence,
    }


@cache
def _page_file(name: str) -> bytes:
    """One of :data:`PAGE_FILES`, read from the package once."""
    return (resources.files("cowrite.daemon") / "page" / name).read_bytes()


class _Handler(BaseHTTPRequestHandler):
    daemon: Daemon  # set on the class made by serve(), with:
    rollback_targets: RollbackTargets
    server_version = "cowrite-daemon"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s", format % args)

    # -- responses -------------------------------------------------------------------------------
    def _send(
        self,
        status: HTTPStatus,
        body: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, value: Any, status: HTTPStatus = HTTPStatus.OK) -> None:
        self._send(status, json.dumps(value, default=str).encode())

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._json({"error": message}, status)

    # -- routing ---------------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        url = urlsplit(self.path)
        parts = [p for p in url.path.split("/") if p]
        try:
            if parts == [] or (len(parts) == 2 and parts[0] == "page" and parts[1] in PAGE_FILES):
                name = parts[1] if parts else "index.html"
                self._send(HTTPStatus.OK, _page_file(name), PAGE_FILES[name], PAGE_HEADERS)
            elif parts == ["metrics"]:
                self._send(HTTPStatus.OK, generate_latest(self.daemon.registry), CONTENT_TYPE_LATEST)
            elif parts == ["healthz"]:
                self._json({"status": "ok"})
            elif parts == ["readyz"]:
                ready = self.daemon.ready
                self._json({"ready": ready}, HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE)
            elif parts == ["api", "tables"]:
                self._json([_status_json(s) for s in self.daemon.services])
            elif len(parts) == 4 and parts[:2] == ["api", "tables"]:
                self._table_view(parts[2], parts[3], parse_qs(url.query))
            else:
                self._error(HTTPStatus.NOT_FOUND, f"no such endpoint {url.path}")
        except CowriteError as exc:
            self._error(HTTPStatus.BAD_REQUEST, str(exc))

    def _service(self, name: str) -> TableService | None:
        service = self.daemon.service(name)
        if service is None:
            self._error(HTTPStatus.NOT_FOUND, f"no table named {name!r} is served here")
        return service

    def _table_view(self, name: str, view: str, query: dict[str, list[str]]) -> None:
        service = self._service(name)
        if service is None:
            return
        timeline, table = service.recent_timeline, service.table
        if view == "status":
            self._json(_status_json(service))
        elif timeline is None or table is None:
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, f"table {name} is not loaded: {service.status.error}")
        elif view == "timeline" and (timeline := service.timeline) is not None:  # unpacked for this request
            self._json(
                [
                    {
                        "requested_time": i.requested_time,
                        "action": i.action.value,
                        "state": i.state.name,
                        "completion_time": i.completion_time,
                    }
                    for i in timeline
                ]
            )
        elif view == "heartbeats":
            self._json(
                [
                    {
                        "instant": p.instant.requested_time,
                        "action": p.instant.action.value,
                        "state": p.instant.state.name,
                        "heartbeat_age_seconds": p.heartbeat_age,
                        "idle_seconds": p.idle,
                        "failed": p.failed,
                        "stale": p.stale,
                        "aborted": p.aborted,
                    }
                    for p in service.status.pending
                ]
            )
        elif view == "locks":
            lock = current_lock(table.storage)
            holder = lock.holder if lock is not None else None
            self._json(
                None
                if lock is None
                else {
                    "id": lock.lock_id,
                    "owner": holder.owner if holder else None,
                    "instant": holder.instant if holder else None,
                    "acquired_at": lock.acquired_at,
                }
            )
        elif view == "recent":
            limit = parse_limit(query.get("limit", [None])[0])
            self._json(
                recent(
                    table,
                    timeline,
                    service.status.pending,
                    service.abort_reason,
                    self.rollback_targets,
                    limit,
                )
            )
        elif view == "watermark":
            self._json({"watermark": service.status.watermark, "fence": service.status.fence})
        elif view == "overlay":
            since = query.get("since", [None])[0]
            try:
                overlay = read_since(table.storage, check_time(since) if since else None)
            except CheckpointArchivedError as exc:
                self._error(HTTPStatus.GONE, str(exc))
                return
            self._json(
                {
                    "watermark": overlay.watermark if overlay else None,
                    "entries": [asdict(e) for e in overlay.entries] if overlay else [],
                }
            )
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no view {view!r}")

    def do_POST(self) -> None:  # noqa: N802
        parts = [p for p in urlsplit(self.path).path.split("/") if p]
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self._error(HTTPStatus.BAD_REQUEST, "Content-Length is not a number")
            return
        if length > MAX_BODY:
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request body too large")
            return
        if not self._authorized():
            return
        if len(parts) != 4 or parts[:2] != ["api", "tables"] or parts[3] not in ("rollback", "clean"):
            self._error(HTTPStatus.NOT_FOUND, "POST /api/tables/<name>/rollback or /clean")
            return
        service = self._service(parts[2])
        if service is None:
            return
        (service.poll if parts[3] == "rollback" else service.clean)()
        self._json(_status_json(service))

    def _authorized(self) -> bool:
        token = self.daemon.config.token
        if not token:
            self._error(
                HTTPStatus.FORBIDDEN, "changes over HTTP are off: set COWRITE_DAEMON_TOKEN to allow them"
            )
            return False
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            self._error(HTTPStatus.UNAUTHORIZED, "missing or wrong bearer token")
            return False
        return True


def serve(daemon: Daemon, host: str, port: int) -> ThreadingHTTPServer:
    """Start serving in a background thread; returns the server (``server_address`` has the port)."""
    handler = type("Handler", (_Handler,), {"daemon": daemon, "rollback_targets": RollbackTargets()})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="cowrite-http", daemon=True).start()
    log.info("http on %s:%d", *server.server_address[:2])
    return server
