"""Three yardsticks for ``bench/objectstore.py``: how many commits/s writers sharing one table could make on
this server and these cores if a commit made only the requests that every commit of a Hudi table on an
object store needs, with the completed files of all writers created one after another, each once the one
before it exists, so that completion times grow in the order commits become visible (README, *How a write
commits*).

None is a commit protocol. Nothing is checked (no conflicts, no lease, no schema), no timeline is
listed, nothing survives a crash, and the lock below is not one: a failed turn is never expired. What they
keep is the order of a commit's files, each request through the same proxy, and a writer's own part: its
requested instant, then its base file (parquet, as delta-rs writes it), then the handover of its commit, then
learning that it shows. Each writer process makes its requests through cowrite's obstore client. (The
server's time a commit counts their listings of ``queue/`` and ``turns/`` as ``LIST data``.)

- ``sequencer``: a thread of writer 0's process publishes every writer's commits and never hands the job
  on: it lists the handed-over commits, reads them at once, creates their completed files one after
  another and deletes what it served in the background, and lists again at once. A writer hands its commit
  over in ``queue/`` and lists the timeline after its instant until the completed file shows.
- ``turns``: the writers take turns instead. A writer that handed its commit over lists ``turns/``, the
  lock's files: a released turn names the commits it published. Its own published: done. The newest turn
  released: it creates the next one's ``.acquired`` and, if that create won, publishes every commit
  handed over as the sequencer does, then creates ``<turn>.released.<names>``.
- ``channel``: the sequencer, reached not through the store but over a connection to it, as a writer
  could reach the holder of a table's lock whose turn stands while commits come: a writer hands its commit
  over in a message and is answered once its completed file exists. A handover is held ``HANDOVER``
  seconds, a request's round trip; the publisher's address is the one object ``channel``, read once per
  process. No place, no ask, no listing: the yardstick of a publisher that neither polls the store nor
  is polled.

The first two ask after their commit at once and then every ``ASK_EVERY`` seconds: the eagerest asking
tried, which ``turns`` needs most, since a turn begins with a writer's ask (asking first after 0.1 s and then
every 0.05 made it about a fifth slower, and the sequencer no faster).
"""

from __future__ import annotations

import io
import os
import queue
import socket
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from bench.bucket import cowrite_options
from bench.commit_throughput import WriterResult, batch, timed_writes

ASK_EVERY = 0.02
HANDOVER = 0.02  # seconds ``channel`` holds a handover's round trip: as long as a request to the store
_COMMIT = os.urandom(1500)  # about a completed commit's size
_IDLE = 1.0  # seconds the sequencer goes on after its process's own writes, for the others' commits


def ceiling_worker(
    yardstick: str,
    uri: str,
    endpoint: str,
    index: int,
    commits: int,
    mode: str,
    ready: Any,
    go: Any,
    results: Any,
) -> None:
    """Writer ``index`` of ``yardstick`` (``sequencer`` or ``turns``) in the bucket of ``uri``, in the
    ``disjoint`` workload (``mode``), as ``bench.objectstore`` runs its workers."""
    result = WriterResult()
    try:
        import obstore

        store = _store(uri, endpoint, f"{yardstick}{index}")
        batches = [batch(index, f"p{index}", b) for b in range(commits)]
        published = _Published()
        write = _Writer(obstore, store, index, yardstick, published)
        inbox = _Inbox(obstore, store) if yardstick == "channel" and index == 0 else None
        ready.put(index)
        go.wait()
        # writer 0's process publishes every writer's commits, but in ``turns``
        serve = inbox.serve if inbox is not None else _sequence if yardstick == "sequencer" else None
        publisher = None
        if serve is not None and index == 0:
            publisher = threading.Thread(target=serve, args=(obstore, store, published), daemon=True)
            publisher.start()
        if yardstick == "channel":
            write.channel = _Channel(obstore, store)
        timed_writes(result, batches, write)
        if publisher is not None:
            published.own_writes_ended = time.monotonic()
            publisher.join()
        published.pool.shutdown()  # its last deletes of served places, before the process reports
    except BaseException:
        result.errors["crash: " + traceback.format_exc().strip().splitlines()[-1]] += 1
        ready.put(index)
    results.put((index, result, None))


YARDSTICKS = {name: partial(ceiling_worker, name) for name in ("sequencer", "turns", "channel")}


def _store(uri: str, endpoint: str, client: str) -> Any:
    """cowrite's own obstore client (:func:`cowrite.storage.s3.object_store`) for the bucket of ``uri``,
    signed as ``client``: the yardstick has the bucket to itself, and keeps its keys at its root."""
    from cowrite.storage.backend import Storage
    from cowrite.storage.s3 import object_store

    options = cowrite_options(endpoint, client)
    bucket = uri.removeprefix("s3://").partition("/")[0]
    return object_store(Storage.for_uri(f"s3://{bucket}", **options).fs, options, bucket)


class _Published:
    """What a process's publisher knows: the last completion time it gave, the places it served."""

    def __init__(self) -> None:
        self.completion = 0
        self.served: set[str] = set()
        self.own_writes_ended: float | None = None
        self.pool = ThreadPoolExecutor(16)

    def publish(self, obstore: Any, store: Any, done: frozenset[str] = frozenset()) -> list[str]:
        """Publish, in the order of the queue, every commit handed over that is not served yet nor among the
        instants ``done`` (places served by another process may show until its delete arrives); their
        instants."""
        places = sorted(o["path"] for o in obstore.list_with_delimiter(store, "queue")["objects"])
        places = [p for p in places if p not in self.served and p.rsplit("-", 1)[1] not in done]
        bodies = list(self.pool.map(lambda p: bytes(obstore.get(store, p).bytes()), places))
        instants = []
        for place, body in zip(places, bodies, strict=True):
            self.completion = max(self.completion + 1, int(time.time() * 1000))
            instant = place.rsplit("-", 1)[1]
            obstore.put(store, f"timeline/{instant}_{self.completion}.commit", body, mode="create")
            instants.append(instant)
        self.served.update(places)
        if places:
            self.pool.submit(obstore.delete, store, places)
        return instants


def _sequence(obstore: Any, store: Any, published: _Published) -> None:
    idle_since = None
    while True:
        if published.publish(obstore, store):
            idle_since = None
        elif published.own_writes_ended is not None:
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since > _IDLE:
                return


class _Writer:
    """One write call: the requested instant, the base file, the handover, then asking until published."""

    def __init__(self, obstore: Any, store: Any, index: int, yardstick: str, published: _Published) -> None:
        self.obstore, self.store, self.published = obstore, store, published
        self.index, self.yardstick, self.count = index, yardstick, 0
        self.channel: _Channel | None = None

    def __call__(self, data: Any) -> None:
        import pyarrow.parquet as pq

        ob, store = self.obstore, self.store
        self.count += 1
        instant = f"{int(time.time() * 1000)}{self.index:02d}{self.count:03d}"
        ob.put(store, f"timeline/{instant}.commit.requested", b"", mode="create")
        out = io.BytesIO()
        pq.write_table(data, out)
        ob.put(store, f"p{self.index}/{instant}.parquet", out.getvalue())
        if self.channel is not None:
            self.channel.hand_over(instant)
            return
        ob.put(store, f"queue/{time.time():.6f}-{instant}", _COMMIT)
        while not (self._shown(instant) if self.yardstick == "sequencer" else self._turn(instant)):
            time.sleep(ASK_EVERY)

    def _shown(self, instant: str) -> bool:
        page = next(iter(self.obstore.list(self.store, "timeline", offset=f"timeline/{instant}")), [])
        return any(o["path"].startswith(f"timeline/{instant}_") for o in page)

    def _turn(self, instant: str) -> bool:
        from obstore.exceptions import AlreadyExistsError

        ob, store = self.obstore, self.store
        names = [o["path"].removeprefix("turns/") for o in ob.list_with_delimiter(store, "turns")["objects"]]
        released = [n for n in names if ".released" in n]
        done = frozenset(i for n in released for i in n.split(".")[2:])
        if instant in done:
            return True
        newest = max((int(n.split(".")[0]) for n in names), default=0)
        if newest and not any(n.startswith(f"{newest}.released") for n in released):
            return False
        try:
            ob.put(store, f"turns/{newest + 1}.acquired", b"", mode="create")
        except AlreadyExistsError:
            return False
        instants = self.published.publish(ob, store, done)
        ob.put(store, f"turns/{newest + 1}.released." + ".".join(instants or ["nothing"]), b"", mode="create")
        return instant in instants


class _Inbox:
    """``channel``'s publisher: commits handed over on connections to it, published in the order they came,
    each answered once its completed file exists. Its address is the one object ``channel``."""

    def __init__(self, obstore: Any, store: Any) -> None:
        self.queue: queue.Queue[tuple[str, socket.socket]] = queue.Queue()
        self.server = socket.create_server(("127.0.0.1", 0))
        host, port = self.server.getsockname()
        obstore.put(store, "channel", f"{host}:{port}".encode())
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self.server.accept()
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        for line in conn.makefile("rb"):
            self.queue.put((line.decode().strip(), conn))

    def serve(self, obstore: Any, store: Any, published: _Published) -> None:
        """Publish what comes until its process's own writes ended and nothing came for ``_IDLE`` s."""
        last = time.monotonic()
        while True:
            try:
                instant, conn = self.queue.get(timeout=ASK_EVERY)
            except queue.Empty:
                ended = published.own_writes_ended
                if ended is not None and time.monotonic() - max(ended, last) > _IDLE:
                    return
                continue
            published.completion = max(published.completion + 1, int(time.time() * 1000))
            obstore.put(store, f"timeline/{instant}_{published.completion}.commit", _COMMIT, mode="create")
            last = time.monotonic()
            conn.sendall(b"published\n")


class _Channel:
    """A writer's connection to ``channel``'s publisher: a handover is one round trip, held as long as a
    request to the store is (``HANDOVER``), answered once the commit is published."""

    def __init__(self, obstore: Any, store: Any) -> None:
        host, port = bytes(obstore.get(store, "channel").bytes()).decode().split(":")
        self.conn = socket.create_connection((host, int(port)))
        self.answers = self.conn.makefile("rb")

    def hand_over(self, instant: str) -> None:
        time.sleep(HANDOVER / 2)
        self.conn.sendall(instant.encode() + b"\n")
        self.answers.readline()
        time.sleep(HANDOVER / 2)
