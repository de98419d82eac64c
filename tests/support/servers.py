"""Real servers for tests, each on 127.0.0.1 on a free port: moto's S3 server (in a process of its own), a
ZooKeeper server and a Spark standalone cluster (a master and one worker).

Both are context managers; leaving the ``with`` block stops the server and removes what it left on disk.
A missing prerequisite raises :class:`RuntimeError` saying how to install it: tests fail, never skip.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import boto3
from moto.core import DEFAULT_ACCOUNT_ID
from moto.moto_server.werkzeug_app import create_backend_app
from moto.s3.models import s3_backends
from moto.server import ThreadedMotoServer

_HOST = "127.0.0.1"

# Any key works against moto; these only have to be consistent between clients.
_ACCESS_KEY = "cowrite-test"
_SECRET_KEY = "cowrite-test-secret"
_REGION = "us-east-1"
SLOW = 1.0  # seconds: the S3 server reports a request it spent longer on


class _Serialised:
    """A WSGI app that handles one request at a time, answers ``GET /_listings`` with its counts, ``GET
    /_busy`` with the time it spent on requests by kind and ``GET /_cpu`` with its process's CPU seconds,
    and stores the objects of a ``POST /_load`` (:meth:`S3Server.load`).

    Moto checks ``If-None-Match: *`` and then stores the object as two steps, so two concurrent conditional
    PUTs can both succeed; real S3 decides them atomically. Serialising requests restores the guarantee the
    storage contract relies on.
    """

    LISTINGS = "/_listings"  # not valid bucket names, so no S3 request can mean them
    BUSY = "/_busy"
    REQUESTS = "/_requests"
    CPU = "/_cpu"
    LOAD = "/_load"

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()
        self.listings: Counter[str] = Counter()  # prefix -> ListObjectsV2 requests
        self.busy: Counter[str] = Counter()  # kind of request (_kind) -> seconds spent on them
        self.requests: Counter[str] = Counter()  # kind of request (_kind) -> how many

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
        with self._lock:
            answers = {
                self.LISTINGS: self.listings,
                self.BUSY: self.busy,
                self.REQUESTS: self.requests,
                self.CPU: {"cpu": time.process_time()},
            }
            counts = answers.get(environ.get("PATH_INFO", ""))
            if counts is not None:
                start_response("200 OK", [("Content-Type", "application/json")])
                return [json.dumps(counts).encode()]
            if environ.get("PATH_INFO") == self.LOAD:
                _store(json.loads(environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))))
                start_response("204 No Content", [])
                return []
            if environ["REQUEST_METHOD"] == "GET" and "list-type" in query:
                self.listings[query.get("prefix", [""])[0]] += 1
            started = time.monotonic()
            response = self._app(environ, start_response)
            try:
                return list(response)
            finally:
                close = getattr(response, "close", None)
                if close is not None:
                    close()
                took = time.monotonic() - started
                kind = _kind(environ["REQUEST_METHOD"], query)
                self.busy[kind] += took
                self.requests[kind] += 1
                if took > SLOW:  # every other request waited as long: say which one held them up
                    print(
                        f"S3 server: {environ['REQUEST_METHOD']} {environ.get('PATH_INFO')}?"
                        f"{environ.get('QUERY_STRING', '')} took {took:.1f} s",
                        file=sys.stderr,
                    )


def _kind(method: str, query: dict[str, list[str]]) -> str:
    """What a request's time is charged to: its method, and for a listing what it lists — a directory
    under ``.hoodie/`` or ``_delta_log/``, or else the table's data."""
    if method != "GET" or "list-type" not in query:
        return method
    prefix = query.get("prefix", [""])[0]
    for metadata in (".hoodie/", "_delta_log/"):
        if metadata in prefix:
            return f"LIST {metadata}{prefix.split(metadata, 1)[1]}"
    return "LIST data"


def _store(load: dict[str, Any]) -> None:
    """Put a :meth:`S3Server.load`'s objects straight into moto's store, as a PUT of each would."""
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    for key, data in load["objects"].items():
        backend.put_object(load["bucket"], key, base64.b64decode(data))


def _serve_s3() -> None:
    """The S3 server's own process: print the port, serve until stdin closes (the parent left or died)."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request would bury a failure
    moto = ThreadedMotoServer(ip_address=_HOST, port=0, verbose=False)
    moto.start()
    # The server object exists only once started; replace its app before any request arrives. Moto's own
    # app looks up, for every request, which of its services the request is for (listing its package
    # directory each time); every request here is for S3, so S3's app serves them directly.
    server = moto._server
    assert server is not None
    server.app = _Serialised(create_backend_app("s3"))
    print(moto.get_host_and_port()[1], flush=True)
    sys.stdin.read()
    moto.stop()


class S3Server:
    """Moto's S3 server in a process of its own, with one bucket.

    Its own process, so that a busy client process (a chaos harness, a benchmark) cannot hold the server up
    with its interpreter lock: a stalled server would look like a slow object store. The server exits when
    this object stops it or when the process that started it dies (its stdin closes).
    """

    def __init__(self, bucket: str = "cowrite-test") -> None:
        self.bucket = bucket
        self.endpoint_url = ""
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> S3Server:
        self._process = subprocess.Popen(
            [sys.executable, __file__, "s3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self._process.stdout is not None
        port = self._process.stdout.readline().strip()
        if not port.isdigit():
            self.stop()
            raise RuntimeError("the S3 server (moto) did not start; its error is above")
        # Port 0: the OS picked a free port when the server bound, so there was no race for it.
        self.endpoint_url = f"http://{_HOST}:{port}"
        self.create_bucket(self.bucket)
        return self

    def stop(self) -> None:
        if self._process is None:
            return
        try:
            self._process.communicate(timeout=10)  # closes its stdin: the server stops
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.communicate()
        self._process = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _counts(self, path: str) -> Counter[str]:
        with urllib.request.urlopen(self.endpoint_url + path, timeout=30) as response:
            return Counter(json.load(response))

    def _listings(self) -> Counter[str]:
        return self._counts(_Serialised.LISTINGS)

    def busy(self) -> Counter[str]:
        """Seconds the server spent answering requests so far, by kind: the method, and for a listing
        ``LIST <directory under .hoodie/ or _delta_log/>`` or ``LIST data``. It answers one request at a
        time, so this is how much of its time each kind took."""
        return self._counts(_Serialised.BUSY)

    def requests(self) -> Counter[str]:
        """Requests answered so far, by kind (as :meth:`busy` names them)."""
        return self._counts(_Serialised.REQUESTS)

    def cpu(self) -> float:
        """CPU seconds the server's process has used so far, all its threads: what it takes from the
        machine's cores, where its clients run too."""
        return self._counts(_Serialised.CPU)["cpu"]

    def listings(self, prefix: str) -> int:
        """ListObjectsV2 requests so far for keys starting with ``prefix`` (a bucket-relative path)."""
        return sum(n for listed, n in self._listings().items() if listed.startswith(prefix))

    def listed(self, prefix: str) -> Counter[str]:
        """ListObjectsV2 requests so far by the prefix they listed, of prefixes starting with ``prefix``."""
        return Counter({listed: n for listed, n in self._listings().items() if listed.startswith(prefix)})

    def new_uri(self, name: str = "t") -> str:
        """``s3://<bucket>/<name>-<random hex>``: a place in the bucket that no other test uses."""
        return f"s3://{self.bucket}/{name}-{uuid.uuid4().hex}"

    def storage_options(self) -> dict[str, Any]:
        """Options for ``fsspec.filesystem("s3", ...)`` / ``Storage.for_uri``."""
        return {
            "key": _ACCESS_KEY,
            "secret": _SECRET_KEY,
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": _REGION},
        }

    def env(self) -> dict[str, str]:
        """AWS variables that point a subprocess (boto3, s3fs, the cowrite CLI) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": _ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": _SECRET_KEY,
            "AWS_DEFAULT_REGION": _REGION,
        }

    def load(self, bucket: str, objects: dict[str, bytes]) -> None:
        """Store ``objects`` (key -> content) in ``bucket`` at once, without a request each: for a
        benchmark's history of hundreds of thousands of files, which PUTs to moto would take half an hour
        to make. What is measured reads them back through the S3 API as usual."""
        body = json.dumps(
            {"bucket": bucket, "objects": {k: base64.b64encode(v).decode() for k, v in objects.items()}}
        ).encode()
        request = urllib.request.Request(self.endpoint_url + _Serialised.LOAD, body, method="POST")
        with urllib.request.urlopen(request, timeout=600):
            pass

    def create_bucket(self, name: str) -> None:
        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=_ACCESS_KEY,
            aws_secret_access_key=_SECRET_KEY,
            region_name=_REGION,
        )
        client.create_bucket(Bucket=name)
        client.close()


# Debian's zookeeper.jar names its dependencies (jute, netty, metrics, ...) in its manifest Class-Path;
# slf4j-nop silences logging, which would otherwise go nowhere useful with a warning per start.
_ZOOKEEPER_JARS = ("zookeeper.jar", "zookeeper-jute.jar", "slf4j-api.jar", "slf4j-nop.jar")
_JAVA_DIR = Path("/usr/share/java")
_INSTALL_HINT = "run `apt-get install zookeeper` (it brings java and the jars in /usr/share/java)"


class ZooKeeperServer:
    """A standalone ZooKeeper server (Debian's ``zookeeper`` package) in a child process."""

    def __init__(self, start_timeout: float = 30.0) -> None:
        self.start_timeout = start_timeout
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None

    @property
    def hosts(self) -> str:
        return f"{_HOST}:{self.port}"

    @staticmethod
    def classpath() -> str:
        jars = [_JAVA_DIR / jar for jar in _ZOOKEEPER_JARS]
        missing = [str(jar) for jar in jars if not jar.is_file()]
        if missing:
            raise RuntimeError(f"ZooKeeper jars missing ({', '.join(missing)}); {_INSTALL_HINT}")
        return os.pathsep.join(str(jar) for jar in jars)

    def start(self) -> ZooKeeperServer:
        java = shutil.which("java")
        if java is None:
            raise RuntimeError(f"no `java` on PATH; {_INSTALL_HINT}")
        classpath = self.classpath()
        self._dir = Path(tempfile.mkdtemp(prefix="cowrite-zk-"))
        # ZooKeeper cannot report a port it chose itself, so pick one and retry if another process took it.
        errors = []
        for _ in range(3):
            self.port = _free_port()
            config = self._write_config()
            with open(self._dir / "server.log", "wb") as log:
                self._process = subprocess.Popen(
                    [java, "-cp", classpath, "org.apache.zookeeper.server.ZooKeeperServerMain", str(config)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            try:
                self._wait_ready()
                return self
            except RuntimeError as exc:
                errors.append(str(exc))
                self._stop_process()
        self.stop()
        raise RuntimeError("ZooKeeper did not start:\n" + "\n".join(errors))

    def _write_config(self) -> Path:
        assert self._dir is not None
        data = self._dir / "data"
        data.mkdir(exist_ok=True)
        config = self._dir / "zoo.cfg"
        config.write_text(
            "\n".join(
                [
                    "tickTime=500",
                    f"dataDir={data}",
                    f"clientPort={self.port}",
                    f"clientPortAddress={_HOST}",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=*",
                    "",
                ]
            )
        )
        return config

    def _wait_ready(self) -> None:
        """Poll ``srvr`` until the server says its mode: ``ruok`` answers before it serves sessions."""
        assert self._process is not None and self._dir is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                log = (self._dir / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"exited with {self._process.returncode} on port {self.port}:\n{log}")
            if "Mode:" in self.four_letter_word("srvr"):
                return
            time.sleep(0.1)
        raise RuntimeError(f"not ready on port {self.port} after {self.start_timeout} s")

    def four_letter_word(self, command: str) -> str:
        """The server's answer to a four-letter command, or "" if it does not answer."""
        try:
            with socket.create_connection((_HOST, self.port), timeout=2) as conn:
                conn.sendall(command.encode())
                chunks = []
                while chunk := conn.recv(4096):
                    chunks.append(chunk)
                return b"".join(chunks).decode(errors="replace")
        except OSError:
            return ""

    def _stop_process(self) -> None:
        if self._process is not None:
            _terminate(self._process)
        self._process = None

    def stop(self) -> None:
        self._stop_process()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class SparkCluster:
    """A Spark standalone cluster: a master and one worker, each a process started with pyspark's own
    ``bin/spark-class``. The worker (and so every executor) starts without the AWS variables: whatever an
    executor needs to reach S3 must come with the job."""

    def __init__(self, cores: int = 2, memory: str = "2g", start_timeout: float = 90.0) -> None:
        self.cores = cores
        self.memory = memory
        self.start_timeout = start_timeout
        self.port = 0
        self.ui_port = 0
        self._processes: list[subprocess.Popen[bytes]] = []
        self._dir: Path | None = None

    @property
    def master_url(self) -> str:
        return f"spark://{_HOST}:{self.port}"

    def start(self) -> SparkCluster:
        import pyspark

        spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
        if shutil.which("java") is None or not spark_class.is_file():
            raise RuntimeError(f"a Spark cluster needs `java` and {spark_class}; run `make setup`")
        self._dir = Path(tempfile.mkdtemp(prefix="cowrite-spark-cluster-"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(SPARK_LOCAL_IP=_HOST, SPARK_LOG_DIR=str(self._dir), SPARK_WORKER_DIR=str(self._dir))
        # the master and the worker start as drivers do (make test's JVM flags: they live as briefly)
        env.setdefault("SPARK_DAEMON_JAVA_OPTS", os.environ.get("SPARK_SUBMIT_OPTS", ""))
        self.port, self.ui_port = _free_port(), _free_port()
        deploy = "org.apache.spark.deploy"
        self._spawn(env, "master", [str(spark_class), f"{deploy}.master.Master", "--host", _HOST,
                                    "--port", str(self.port), "--webui-port", str(self.ui_port)])  # fmt: skip
        self._spawn(env, "worker", [str(spark_class), f"{deploy}.worker.Worker", self.master_url,
                                    "--host", _HOST, "--webui-port", str(_free_port()), "--cores",
                                    str(self.cores), "--memory", self.memory])  # fmt: skip
        try:
            self._wait_ready()
        except RuntimeError:
            self.stop()
            raise
        return self

    def _spawn(self, env: dict[str, str], name: str, argv: list[str]) -> None:
        assert self._dir is not None
        with open(self._dir / f"{name}.log", "wb") as log:
            out = {"stdout": log, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL}
            self._processes.append(subprocess.Popen(argv, env=env, **out))

    def _wait_ready(self) -> None:
        """Poll the master's status page until the worker has registered."""
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            exited = [p for p in self._processes if p.poll() is not None]
            if exited:
                code = exited[0].returncode
                raise RuntimeError(f"a Spark cluster process exited with {code}:\n{self.logs()}")
            try:
                with urllib.request.urlopen(f"http://{_HOST}:{self.ui_port}/json/", timeout=2) as answer:
                    if json.load(answer).get("aliveworkers", 0) >= 1:
                        return
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the Spark cluster was not ready after {self.start_timeout} s:\n{self.logs()}")

    def logs(self) -> str:
        """The tail of each process's log, for a failure message."""
        if self._dir is None:
            return ""
        logs = sorted(self._dir.glob("*.log"))
        return "\n".join(f"{log.name}: {log.read_text(errors='replace')[-1500:]}" for log in logs)

    def stop(self) -> None:
        for process in reversed(self._processes):
            _terminate(process)
        self._processes = []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _terminate(process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM, and SIGKILL if the process has not exited ``timeout`` seconds later."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((_HOST, 0))
        return int(probe.getsockname()[1])


if __name__ == "__main__":
    if sys.argv[1:] != ["s3"]:
        raise SystemExit("usage: servers.py s3  (started by S3Server)")
    _serve_s3()
