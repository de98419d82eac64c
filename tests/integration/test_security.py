"""Security: where the daemon listens, who may change things, what paths may name, what is never executed.

- the daemon binds 127.0.0.1 unless told otherwise (its configuration's default and the real socket);
- endpoints that change anything answer 403 while no token is configured, 401 to a missing or wrong
  token, and act only on the right one;
- a path read from storage (plans, overlays, write stats) never leads outside the table: ``Storage``
  refuses it, and rollback, clean and the daemon leave a file beside the table alone whatever a forged
  plan says — nor do they delete committed files a forged plan names;
- table names in the HTTP API are looked up among the configured tables, never used as paths;
- nothing stored is unpickled or evaluated, and a conflict strategy (a dotted path, imported and called)
  comes only from a writer's own options, never from the table's ``hoodie.properties``;
- the helm chart runs the daemon non-root, read-only, without privilege escalation: ``test_helm.py``
  checks the service-mode pod of every values file
  (``test_security_context_is_non_root_and_read_only``); the sidecar patch is checked here.
"""

from __future__ import annotations

import ast
import http.client
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from support import ROOT
from support.tables import new_table, rows

from cowrite.cleaner import clean, rollback_failed, service_lock
from cowrite.daemon.config import DaemonConfig, TableEntry
from cowrite.daemon.service import Daemon
from cowrite.errors import StorageError
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.fs_view import list_base_files
from cowrite.format.instant import Action, Instant, State, from_millis, to_millis
from cowrite.format.overlay import CommitEntry, Kind, LogFile, LogRecord
from cowrite.format.service_metadata import CleanPlan, RollbackPlan
from cowrite.format.table import Table
from cowrite.format.timeline import TIMELINE_DIR
from cowrite.local import read
from cowrite.local.writer import LocalWriter
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.transaction import Transaction, WriteOptions
from cowrite.storage.backend import Storage

SOURCE = ROOT / "cowrite"
SETTINGS = {
    keys.HEARTBEAT_INTERVAL_MS.key: "200",
    keys.HEARTBEAT_TOLERABLE_MISSES.key: "2",
    keys.LEASE_SAFETY_MARGIN_MS.key: "100",
}
POLICY = HeartbeatPolicy(0.2, 2)




@pytest.fixture
def table(tmp_path: Path) -> Table:
    return new_table(tmp_path / "table", name="orders", properties=SETTINGS)


@pytest.fixture
def sentinel(tmp_path: Path) -> Path:
    """A file beside the table, which nothing done to the table may touch."""
    path = tmp_path / "sentinel"
    path.write_text("outside the table")
    return path


def escaping_paths(sentinel: Path) -> list[str]:
    return [
        "../sentinel",
        "p0/../../sentinel",
        str(sentinel),
        "p0\\..\\..\\sentinel",
        "../sentinel\0.parquet",
    ]


# -- where the daemon listens --------------------------------------------------------------------------


def test_the_daemon_binds_localhost_unless_told_otherwise(
    table: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert DaemonConfig(tables=()).host == "127.0.0.1"
    assert DaemonConfig.load(None, [table.uri]).host == "127.0.0.1"
    assert DaemonConfig.load(None, [table.uri], host=None).host == "127.0.0.1"  # the CLI passes None
    daemon = Daemon(
        DaemonConfig(tables=(TableEntry(table.uri),), port=0, poll_interval=3600),
        registry=CollectorRegistry(),
    )
    daemon.start(serve_http=True)
    try:
        host, port = daemon.http.server_address[:2]  # type: ignore[attr-defined]
        assert host == "127.0.0.1"
        assert _request(port, "/healthz")[0] == 200
    finally:
        daemon.stop()


# -- who may change things -----------------------------------------------------------------------------


def _request(
    port: int, path: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@pytest.fixture
def writer_to_fail(table: Table) -> Iterator[Transaction]:
    """A table with one commit and a live writer; ``_fail`` stops its heartbeat for good."""
    LocalWriter(table).insert(rows(["a"]))
    writer = Transaction.begin(table, "insert", options=WriteOptions(config=table.config))
    yield writer
    assert writer.heartbeat is not None
    writer.heartbeat.stop(delete=False)


def _fail(writer: Transaction) -> str:
    """Stop the writer's heartbeat and wait until it is failed: rollback has work from then on."""
    assert writer.heartbeat is not None
    writer.heartbeat.stop(delete=False)
    time.sleep(POLICY.tolerance + 0.1)
    return writer.instant_time


def _serving(table: Table, token: str | None) -> Daemon:
    config = DaemonConfig(
        tables=(TableEntry(table.uri, "orders", SETTINGS),),
        port=0,
        poll_interval=3600,
        clean_interval=3600,
        token=token,
    )
    daemon = Daemon(config, registry=CollectorRegistry())
    daemon.start(serve_http=True)
    deadline = time.monotonic() + 30
    while not daemon.ready and time.monotonic() < deadline:  # polled once: the table is loaded
        time.sleep(0.01)
    assert daemon.ready, "the daemon's first poll did not end within 30 s"
    return daemon


def test_changes_are_off_without_a_configured_token(table: Table, writer_to_fail: Transaction) -> None:
    daemon = _serving(table, token=None)  # polled once while the writer lived; then only on request
    failed_writer = _fail(writer_to_fail)
    try:
        port = daemon.http.server_address[1]  # type: ignore[attr-defined]
        for action in ("rollback", "clean"):
            for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer anything"}):
                assert _request(port, f"/api/tables/orders/{action}", "POST", headers)[0] == 403
        assert _request(port, "/api/tables/orders/timeline")[0] == 200  # reading needs no token
    finally:
        daemon.stop()
    assert table.timeline().get(failed_writer) is not None  # nothing was rolled back


@pytest.mark.parametrize(
    "given",
    [
        None,
        "",
        "s3cret",
        "Bearer",
        "Bearer s3cre",
        "Bearer s3cret ",
        "bearer s3cret",
        "Bearer  s3cret",
        "Basic s3cret",
        "Bearer s3cretX",
        "Bearer S3CRET",
    ],
)
def test_changes_need_exactly_the_configured_token(
    table: Table, writer_to_fail: Transaction, given: str | None
) -> None:
    daemon = _serving(table, token="s3cret")
    failed_writer = _fail(writer_to_fail)
    try:
        port = daemon.http.server_address[1]  # type: ignore[attr-defined]
        headers = {} if given is None else {"Authorization": given}
        assert _request(port, "/api/tables/orders/rollback", "POST", headers)[0] == 401
        assert _request(port, "/api/tables/orders/clean", "POST", headers)[0] == 401
        assert table.timeline().get(failed_writer) is not None
        status, _ = _request(port, "/api/tables/orders/rollback", "POST", {"Authorization": "Bearer s3cret"})
        assert status == 200
        assert table.timeline().get(failed_writer) is None  # the right token does act
    finally:
        daemon.stop()


@pytest.mark.parametrize(
    "path",
    [
        "/api/tables/..%2F..%2Fetc/timeline",
        "/api/tables/../timeline",
        "/api/tables/%2Fetc%2Fpasswd/timeline",
        "/api/tables/orders%00/timeline",
        "/api/tables/..%2Forders/status",
    ],
)
def test_table_names_are_looked_up_never_used_as_paths(table: Table, path: str) -> None:
    daemon = _serving(table, token="s3cret")
    try:
        port = daemon.http.server_address[1]  # type: ignore[attr-defined]
        assert _request(port, path)[0] == 404
        changing = path.rsplit("/", 1)[0] + "/rollback"
        assert _request(port, changing, "POST", {"Authorization": "Bearer s3cret"})[0] == 404
    finally:
        daemon.stop()


# -- paths never leave the table -----------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["local", "memory"])
@pytest.mark.parametrize("path", ["..", "../x", "a/../../x", "a/..", "/etc/passwd", "a\\..\\x", "a\0b"])
def test_storage_refuses_paths_that_leave_the_root(backend: str, path: str, tmp_path: Path) -> None:
    storage = Storage.for_uri(
        str(tmp_path / "root") if backend == "local" else f"memory://sec-{time.time_ns()}"
    )
    for operation in (
        lambda: storage.full_path(path),
        lambda: storage.read(path),
        lambda: storage.write(path, b"x"),
        lambda: storage.create_if_absent(path, b"x"),
        lambda: storage.delete(path),
        lambda: storage.exists(path),
        lambda: storage.list(path),
        lambda: storage.stat(path),
    ):
        with pytest.raises(StorageError, match="refusing path"):
            operation()
    assert storage.full_path("p0/..hidden/a..b").endswith("p0/..hidden/a..b")  # dots inside names are fine


def _failed_write_planning(table: Table, paths: list[str]) -> str:
    """A failed write whose .inflight plan names ``paths`` (a forged or damaged plan)."""
    dead = Transaction.begin(table, "insert", options=WriteOptions(config=table.config))
    assert dead.heartbeat is not None
    stats = tuple(WriteStat(f"f{i}-0", path, "p0", "null", 1, 1, 0, 0, 1) for i, path in enumerate(paths))
    dead.plan(CommitMetadata("insert", stats))
    dead.heartbeat.stop(delete=False)
    return dead.instant_time


def _later(table: Table, step: int = 1000) -> str:
    latest = max((i.requested_time for i in table.timeline()), default="20260101000000000")
    return from_millis(to_millis(latest) + step)


def test_a_plan_naming_paths_outside_the_table_deletes_nothing_there(table: Table, sentinel: Path) -> None:
    LocalWriter(table).insert(rows(["a"]))
    committed = {b.path for b in list_base_files(table)}
    dead = _failed_write_planning(table, escaping_paths(sentinel))
    time.sleep(POLICY.tolerance + 0.1)
    [done] = rollback_failed(table, service_lock(table), POLICY)
    assert done.target == dead and done.deleted == ()  # the rollback finished; it deleted nothing
    assert sentinel.read_text() == "outside the table"
    assert {b.path for b in list_base_files(table)} == committed


def test_forged_rollback_and_clean_plans_delete_nothing_outside_and_nothing_committed(
    table: Table, sentinel: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = LocalWriter(table)
    first = writer.insert(rows(["a", "b"]))
    writer.upsert(rows(["a"], ts=2))
    committed = sorted(b.path for b in list_base_files(table))
    latest_files = [b.path for b in read_latest(table)]
    before = read.snapshot(table).to_pylist()
    forged_rollback = RollbackPlan(first.requested_time, "commit", (*escaping_paths(sentinel), *committed))
    table.storage.write(f"{TIMELINE_DIR}/{_later(table)}.rollback.requested", forged_rollback.to_bytes())
    with caplog.at_level(logging.WARNING):
        rollback_failed(table, service_lock(table), POLICY)
    assert "which completed; deleting nothing" in caplog.text
    forged_clean = CleanPlan(first.requested_time, (*escaping_paths(sentinel), *latest_files))
    table.storage.write(f"{TIMELINE_DIR}/{_later(table)}.clean.requested", forged_clean.to_bytes())
    with caplog.at_level(logging.WARNING):
        done = clean(table, service_lock(table), commits_retained=10)
    assert done is not None and done.deleted == ()
    assert "which cleaning never deletes" in caplog.text
    assert sentinel.read_text() == "outside the table"
    assert sorted(b.path for b in list_base_files(table)) == committed
    assert read.snapshot(table).to_pylist() == before
    assert not table.timeline().pending()  # both forged services were completed as no-ops, not left to wedge


def read_latest(table: Table) -> list[Any]:
    from cowrite.format.fs_view import FileSystemView

    return FileSystemView.build(table).latest_base_files()


def test_the_daemon_deletes_nothing_outside_whatever_the_plans_say(table: Table, sentinel: Path) -> None:
    LocalWriter(table).insert(rows(["a"]))
    _failed_write_planning(table, escaping_paths(sentinel))
    table.storage.write(
        f"{TIMELINE_DIR}/{_later(table)}.rollback.requested",
        RollbackPlan(_later(table, 1), "commit", tuple(escaping_paths(sentinel))).to_bytes(),
    )
    table.storage.write(
        f"{TIMELINE_DIR}/{_later(table)}.clean.requested",
        CleanPlan(_later(table), tuple(escaping_paths(sentinel))).to_bytes(),
    )
    daemon = Daemon(
        DaemonConfig(
            tables=(TableEntry(table.uri, "orders", SETTINGS),),
            port=0,
            poll_interval=0.05,
            clean_interval=0.05,
        ),
        registry=CollectorRegistry(),
    )
    daemon.start(serve_http=False)
    try:
        deadline = time.monotonic() + 20
        while table.timeline().pending() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        daemon.stop()
    assert not table.timeline().pending(), table.timeline()
    assert sentinel.read_text() == "outside the table"


def test_readers_never_read_outside_the_table(table: Table, sentinel: Path) -> None:
    """A forged overlay or write stat naming a file beside the table is refused, not read."""
    done = LocalWriter(table).insert(rows(["a"]))
    sentinel.write_bytes(
        (Path(table.uri) / next(iter(list_base_files(table))).path).read_bytes()
    )  # readable parquet
    for path in escaping_paths(sentinel):
        forged = CommitEntry(
            done.requested_time, done.completion_time or "", "commit", (("p0", "f-0", path),), ()
        )
        snapshot = LogFile(done.completion_time, 0, None, Kind.SNAPSHOT)
        table.storage.write(snapshot.path, LogRecord(snapshot, None, None, (forged,)).to_bytes())
        with pytest.raises(StorageError, match="refusing path"):
            read.pull(table, None, read.PullMode.OVERLAY)
    stat = WriteStat("f-0", "../sentinel", "p0", "null", 1, 1, 0, 0, 1)
    forged_commit = Instant(_later(table), Action.COMMIT, State.COMPLETED, _later(table, 2000))
    table.storage.write(
        table.instant_path(forged_commit), CommitMetadata("insert", (stat,)).to_bytes(Action.COMMIT)
    )
    with pytest.raises(StorageError, match="refusing path"):
        read.incremental(table, since=done.completion_time)


# -- nothing stored is executed ------------------------------------------------------------------------

FORBIDDEN_CALLS = {
    ("pickle", "load"),
    ("pickle", "loads"),
    ("marshal", "load"),
    ("marshal", "loads"),
    ("shelve", "open"),
    ("dill", "load"),
    ("dill", "loads"),
    ("cloudpickle", "load"),
    ("cloudpickle", "loads"),
    ("yaml", "load"),
    ("yaml", "unsafe_load"),
    ("yaml", "full_load"),
}
FORBIDDEN_NAMES = {"eval", "exec", "compile", "__import__"}
FORBIDDEN_MODULES = {"pickle", "marshal", "shelve", "dill", "cloudpickle", "yaml", "jsonpickle"}


def _sources() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(SOURCE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def test_nothing_stored_is_unpickled_or_evaluated() -> None:
    found = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                found += [
                    f"{path}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in FORBIDDEN_MODULES
                ]
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Name) and func.id in FORBIDDEN_NAMES:
                    found.append(f"{path}:{node.lineno} calls {func.id}")
                if (
                    isinstance(func, ast.Attribute)
                    and isinstance(func.value, ast.Name)
                    and (func.value.id, func.attr) in FORBIDDEN_CALLS
                ):
                    found.append(f"{path}:{node.lineno} calls {func.value.id}.{func.attr}")
    assert found == []


def test_only_the_conflict_strategy_is_ever_imported_by_name() -> None:
    """``importlib.import_module`` has one caller, ``strategy_named``, which has one: the writer's options."""
    imports, strategy_calls = [], []
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
                if name == "import_module":
                    imports.append(path.relative_to(SOURCE).as_posix())
                if name == "strategy_named":
                    strategy_calls.append((path.relative_to(SOURCE).as_posix(), ast.unparse(node)))
    assert imports == ["protocol/conflict.py"]
    assert strategy_calls == [
        ("protocol/transaction.py", "strategy_named(options.config.get(keys.CONFLICT_STRATEGY))")
    ]


@pytest.fixture
def marker_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An importable module that records being imported (what an attacker's strategy would run)."""
    directory = tmp_path / "modules"
    directory.mkdir()
    mark = tmp_path / "imported"
    (directory / "cowrite_sec_strategy.py").write_text(
        f"with open({str(mark)!r}, 'w') as stream:\n    stream.write('imported')\n"
        "def no_conflicts(mine, candidates):\n    return []\n"
    )
    monkeypatch.syspath_prepend(str(directory))
    yield mark
    sys.modules.pop("cowrite_sec_strategy", None)


def test_a_strategy_stored_in_hoodie_properties_is_ignored(
    tmp_path: Path, marker_module: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = str(tmp_path / "t")
    Table.create(uri, name="t", record_key_fields=["id"], partition_fields=["part"], ordering_fields=["ts"])
    properties = Path(uri) / ".hoodie" / "hoodie.properties"
    with properties.open("a") as stream:
        stream.write(f"{keys.CONFLICT_STRATEGY.key}=cowrite_sec_strategy.no_conflicts\n")
    with caplog.at_level(logging.WARNING):
        table = Table.load(uri)
    assert keys.CONFLICT_STRATEGY.key not in table.config
    assert "taken from write options only" in caplog.text
    LocalWriter(table).insert(rows(["a"]))
    assert not marker_module.exists(), "a strategy named by the table's files was imported"
    # a writer that names one in its own options gets it
    options = WriteOptions(
        config=table.config.with_values({keys.CONFLICT_STRATEGY.key: "cowrite_sec_strategy.no_conflicts"})
    )
    LocalWriter(table, options).insert(rows(["b"]))
    assert marker_module.exists()


@pytest.mark.parametrize(
    "name",
    ["file-group", "org.apache.hudi.client.transaction.SimpleConcurrentFileWritesConflictResolutionStrategy"],
)
def test_built_in_strategy_names_in_hoodie_properties_still_count(tmp_path: Path, name: str) -> None:
    uri = str(tmp_path / "t")
    Table.create(uri, name="t", record_key_fields=["id"], properties={keys.CONFLICT_STRATEGY.key: name})
    assert Table.load(uri).config.get(keys.CONFLICT_STRATEGY) == name


# -- helm ----------------------------------------------------------------------------------------------


def test_the_sidecar_patch_runs_the_daemon_non_root_read_only_without_escalation() -> None:
    """Service mode is covered by test_helm.py for every values file; here: the patch for host pods."""
    import helm_python as helm
    from test_helm import CHART_DIR, CI_VALUES, render

    checked = 0
    with helm.Chart.load(CHART_DIR) as chart:
        for case, values in CI_VALUES.items():
            patches = [
                o for o in render(chart, values).of_kind("ConfigMap") if "patch.yaml" in o.get("data", {})
            ]
            for config_map in patches:
                pod = yaml.safe_load(config_map["data"]["patch.yaml"])["spec"]["template"]["spec"]
                containers = [*pod.get("initContainers", []), *pod.get("containers", [])]
                (daemon,) = [c for c in containers if c["name"] == "cowrite-daemon"]
                context = daemon["securityContext"]
                assert context["runAsNonRoot"] is True, case
                assert context["readOnlyRootFilesystem"] is True, case
                assert context["allowPrivilegeEscalation"] is False, case
                assert context["capabilities"] == {"drop": ["ALL"]}, case
                checked += 1
    assert checked >= 2  # the sidecar values files render a patch
