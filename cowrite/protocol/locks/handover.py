"""Handing a commit to a standing turn of the filesystem lock over a connection: where the turn listens
(``lock<id>.serves``), a waiter's exchange with it, and the turn's listening end. What the turn does with
a commit is :mod:`cowrite.protocol.standing`.

A waiter that finds the lock held by a turn that stands sends its holder the commit it would otherwise
hand over in its place in the queue (:mod:`cowrite.protocol.group`), and is answered at once: published,
with the notes of the turn's commits, or refused, and then it goes on waiting through the store.

**Who may hand a commit over.** ``lock<id>.serves`` holds the turn's address and a secret made for the
turn. A holder takes only messages that carry both the secret and its lock id: a process must be able to
read the table's lock directory to hand it a commit, and a waiter that reached another process on a
reused port is refused.

**Which addresses.** A holder listens on ``cowrite.lock.standing.address`` of its host (127.0.0.1 unless
set): writers on other hosts reach it only where that address routes to it. A loopback address is tried
only by writers on the host that the file names. A waiter that cannot connect within
:data:`CONNECT_WITHIN` goes on through the store and does not try that turn again.

**A waiter that is not answered** (within :data:`ANSWER_WITHIN`, or the connection broke), or is told
that the holder's create failed midway, may have had its commit published: it counts as having handed its
commit over (:attr:`~.base.TableLock.requested`), and learns what became of it from the notes of the turn
or from the timeline, as a waiter whose place in the queue held its commit does. Nothing here raises:
every failure leaves the waiter to the store.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial

from cowrite.errors import CowriteError
from cowrite.process import keep_mapping
from cowrite.protocol.locks.lock_files import remember_notes, serves_path
from cowrite.storage.backend import Storage

log = logging.getLogger(__name__)

CONNECT_WITHIN = 0.5  # seconds a waiter waits to connect to a standing turn
ANSWER_WITHIN = 5.0  # seconds it waits for the answer: a turn publishes one commit at a time, each a create
# Seconds each exchange with another process's turn is held, half before and half after it: 0 for real
# connections; a benchmark sets it to stand for the round trip between two hosts.
LATENCY = 0.0
_LARGEST = 1 << 26  # bytes of a message, at most (a commit's completed file)

COMMIT = "commit"  # a message's kinds: a request (:class:`cowrite.protocol.group.Request`) to publish
NOTES = "notes"  # the notes of the commits of requested times it published, separated by spaces
# An answer's first field: published, refused (it was not), or unknown (its create may have acted)
PUBLISHED, REFUSED, UNKNOWN = "P", "R", "U"


@dataclass(frozen=True)
class Address:
    """Where the holder of a standing turn listens, what host it is on, and the turn's secret."""

    host: str
    port: int
    node: str  # the host name of the holder's host
    secret: str

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Address | None:
        try:
            fields = json.loads(data)
            return cls(str(fields["host"]), int(fields["port"]), str(fields["node"]), str(fields["secret"]))
        except (ValueError, KeyError, TypeError, RecursionError):
            return None

    @property
    def reachable(self) -> bool:
        """Whether a writer of this host may try it: a loopback address only from the holder's host."""
        try:
            loopback = ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            loopback = self.host == "localhost"
        return not loopback or self.node == socket.gethostname()


# Per table: the standing turn this process last learned of (its id) and its address, None where it
# cannot be reached from here; and the turn that last published a commit of this process, with when.
_KNOWN: dict[str, tuple[int, Address | None]] = keep_mapping(
    "cowrite.protocol.locks.handover._KNOWN",
    {},
    "one standing turn per table this process handed commits to or listed",
    "the standing turn of each table's lock this process knows of, and where it listens",
)
_ANSWERED: dict[str, tuple[int, float]] = keep_mapping(
    "cowrite.protocol.locks.handover._ANSWERED",
    {},
    "one turn per table this process handed commits to",
    "the standing turn of each table that last published a commit of this process, and when it answered",
)
_OWN_PORTS: set[int] = set()  # the ports of this process's standing turns: no network in between


def learn(uri: str, lock_id: int, address: Address | None) -> None:
    """That turn ``lock_id`` of the table at ``uri`` stands, taking commits at ``address``."""
    _KNOWN[uri] = (lock_id, address if address is None or address.reachable else None)


def forget(uri: str, lock_id: int) -> None:
    """That turn ``lock_id`` no longer takes commits (it ended, or cannot be reached from here)."""
    if (known := _KNOWN.get(uri)) is not None and known[0] == lock_id:
        _KNOWN[uri] = (lock_id, None)


def standing_turn(uri: str) -> int | None:
    """The id of the standing turn of the table at ``uri`` this process last learned of and may reach."""
    known = _KNOWN.get(uri)
    return known[0] if known is not None and known[1] is not None else None


def answered(uri: str) -> tuple[int, float] | None:
    """(id, when: ``time.monotonic()``) of the standing turn that last published a commit of this
    process on the table at ``uri``: that turn was held then, so the one before it had ended."""
    return _ANSWERED.get(uri)


def offer(storage: Storage, lock_id: int, request: bytes) -> tuple[bool, str | None]:
    """Hand ``request`` to the standing turn ``lock_id`` of the table at ``storage``, reading where it
    listens unless this process knows: (whether it may have been published, the note that names its
    completed file if it was)."""
    address = _address(storage, lock_id)
    if address is None:
        return False, None
    try:
        answer = _exchange(address, lock_id, COMMIT, request)
    except Unreached:  # the turn ended and closed its port, or cannot be reached: nothing was sent
        forget(storage.uri, lock_id)
        return False, None
    except OSError as exc:
        log.info("no answer from standing turn %d of %s: %s", lock_id, storage.uri, exc)
        forget(storage.uri, lock_id)
        return True, None
    kind, *notes = answer.split("\t")
    if kind == PUBLISHED and notes:
        _ANSWERED[storage.uri] = (lock_id, time.monotonic())
        remember_notes(storage.uri, notes)
        return True, notes[0]
    if kind != REFUSED:  # unknown, or not a standing turn's answer (a port another process took since)
        forget(storage.uri, lock_id)
        return True, None
    log.debug("standing turn %d of %s refused a commit: %s", lock_id, storage.uri, "\t".join(notes))
    return False, None


def ask_notes(uri: str, requested_times: list[str]) -> int:
    """Learn from the standing turn of the table at ``uri`` this process knows of, if any, the notes of
    the commits of ``requested_times`` it published (:func:`~.lock_files.noted`); how many it told."""
    known = _KNOWN.get(uri)
    if known is None or known[1] is None or not requested_times:
        return 0
    try:
        answer = _exchange(known[1], known[0], NOTES, " ".join(requested_times).encode())
    except OSError:
        forget(uri, known[0])
        return 0
    kind, *notes = answer.split("\t")
    if kind != NOTES:
        return 0
    remember_notes(uri, notes)
    return len(notes)


def _address(storage: Storage, lock_id: int) -> Address | None:
    known = _KNOWN.get(storage.uri)
    if known is not None and known[0] == lock_id:
        return known[1]
    try:
        address = Address.from_bytes(storage.read(serves_path(lock_id)))
    except (FileNotFoundError, CowriteError):
        address = None  # collected: the turn ended long ago
    learn(storage.uri, lock_id, address)
    return _KNOWN[storage.uri][1]


class Unreached(OSError):
    """No connection was made: nothing was sent."""


def _exchange(address: Address, lock_id: int, kind: str, payload: bytes) -> str:
    """Send one message to the turn at ``address`` and return its answer's line; raises
    :class:`Unreached`, or another OSError once the message may have been sent."""
    held = 0.0 if address.port in _OWN_PORTS else LATENCY / 2
    try:
        connected = socket.create_connection((address.host, address.port), timeout=CONNECT_WITHIN)
    except OSError as exc:
        raise Unreached(str(exc)) from exc
    with connected as conn:
        conn.settimeout(ANSWER_WITHIN)
        time.sleep(held)
        message = f"{address.secret} {lock_id} {kind}\n".encode() + payload
        conn.sendall(struct.pack(">I", len(message)) + message)
        with conn.makefile("rb") as answer:
            line = answer.readline(_LARGEST)
        time.sleep(held)
    if not line.endswith(b"\n"):
        raise ConnectionAbortedError("the answer broke off")
    return line.decode(errors="replace").rstrip("\n")


Answer = Callable[[str], None]  # answers a message once, with one line


class Listener:
    """The listening end of standing turn ``lock_id``, on ``host``: each message carrying the turn's
    secret and id goes to ``take(kind, payload, answer)``, others are refused at once. ``take`` runs on
    the connection's own thread (a daemon); a message it never answers is answered when its connection
    is closed, by the waiter's timeout."""

    def __init__(self, host: str, lock_id: int, take: Callable[[str, bytes, Answer], None]) -> None:
        self._server = socket.create_server((host, 0))
        port = self._server.getsockname()[1]
        self.address = Address(host, port, socket.gethostname(), secrets.token_hex(16))
        self.lock_id, self._take = lock_id, take
        _OWN_PORTS.add(port)
        threading.Thread(target=self._accept, name=f"cowrite-standing-{port}", daemon=True).start()

    def close(self) -> None:
        """Take no more connections (those already taken are answered as ``take`` does)."""
        _OWN_PORTS.discard(self.address.port)
        try:
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept
        except OSError:
            pass
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(ANSWER_WITHIN)
            (size,) = struct.unpack(">I", _read_exactly(conn, 4))
            if size > _LARGEST:
                raise ConnectionAbortedError(f"a message of {size} bytes")
            head, _, payload = _read_exactly(conn, size).partition(b"\n")
            secret, lock_id, kind = head.decode().split(" ")
        except (OSError, ValueError, struct.error) as exc:
            log.debug("a connection to standing turn %d broke off: %s", self.lock_id, exc)
            conn.close()
            return
        answer = partial(_answer, conn)
        if not hmac.compare_digest(secret, self.address.secret) or lock_id != str(self.lock_id):
            answer(f"{REFUSED}\tnot this turn's secret")
            return
        self._take(kind, payload, answer)


def _answer(conn: socket.socket, line: str) -> None:
    try:
        conn.sendall(line.encode() + b"\n")
    except OSError as exc:  # the waiter gave up: it learns from the notes or the timeline
        log.debug("an answer of a standing turn was not delivered: %s", exc)
    finally:
        conn.close()


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise ConnectionAbortedError("closed early")
        data += chunk
    return bytes(data)
