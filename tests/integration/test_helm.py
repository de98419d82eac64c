"""The Helm chart (helm/cowrite-daemon) and the daemon image (Dockerfile), checked offline.

The chart is linted and rendered by the real Helm SDK (helm-python-sdk ships Helm's Go code as a shared
library, so no helm binary is needed) and every rendered manifest is validated against the Kubernetes
OpenAPI schemas of ``KUBE_VERSION`` in strict mode, where an unknown field fails. The Prometheus
Operator's ServiceMonitor and PodMonitor are CRDs without a bundled schema; their fields are checked
here. Docker cannot run here, so the Dockerfile is checked as text against pyproject and the chart.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Imported unguarded on purpose: without the SDK these tests must fail, not skip.
import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry
from support import ROOT

from cowrite.daemon.config import DaemonConfig
from cowrite.daemon.metrics import DaemonMetrics, TableStatus
from cowrite.daemon.overlay import DEFAULT_SNAPSHOT_EVERY

CHART_DIR = ROOT / "helm" / "cowrite-daemon"
CI_DIR = CHART_DIR / "ci"
KUBE_VERSION = "1.34.0"
RELEASE = "hudi"
NAMESPACE = "lake"
CRD_KINDS = {"ServiceMonitor", "PodMonitor"}
LINT_WARNING = 2  # helm lint severities: 1 info, 2 warning, 3 error


def load_values(path: Path) -> dict[str, Any]:
    """A values file parsed the way `helm -f` parses it."""
    return helm.values_from_yaml(path.read_text())


CI_VALUES = {
    path.name.removesuffix("-values.yaml"): load_values(path) for path in sorted(CI_DIR.glob("*.yaml"))
}
CASES = {"default": {}, **CI_VALUES}


@dataclass(frozen=True)
class Rendered:
    """The Kubernetes objects of one render, with the values they were rendered from."""

    values: dict[str, Any]
    objects: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [obj for obj in self.objects if obj["kind"] == kind]

    def one(self, kind: str, name_suffix: str = "") -> dict[str, Any]:
        found = [obj for obj in self.of_kind(kind) if obj["metadata"]["name"].endswith(name_suffix)]
        assert len(found) == 1, (
            f"expected one {kind}{name_suffix!r}, got {[o['metadata']['name'] for o in found]}"
        )
        return found[0]

    @property
    def kinds(self) -> set[str]:
        return {obj["kind"] for obj in self.objects}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


def render(chart: helm.Chart, values: dict[str, Any] | None = None) -> Rendered:
    """Render like `helm template hudi helm/cowrite-daemon -n lake -f ...` (schema-checked by Helm)."""
    manifests = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = [
        obj
        for path, text in sorted(manifests.items())
        if path.endswith((".yaml", ".yml"))
        for obj in yaml.safe_load_all(text)
        if obj
    ]
    return Rendered(chart.merge_values(values or {}), objects)


def validate_kubernetes(obj: dict[str, Any]) -> None:
    """Strict OpenAPI validation, failing with the object and the offending field."""
    try:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        where = ".".join(str(part) for part in error.path)
        raise AssertionError(f"{obj['kind']}/{obj['metadata']['name']}: {where}: {error.message}") from None


def daemon_container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = [*pod_spec.get("initContainers", []), *pod_spec["containers"]]
    (found,) = [c for c in containers if c["name"] == "cowrite-daemon"]
    return found


def daemon_toml(rendered: Rendered) -> dict[str, Any]:
    config_map = rendered.one("ConfigMap", "cowrite-daemon")
    return tomllib.loads(config_map["data"]["daemon.toml"])


def apply_strategic_patch(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Merge ``patch`` into ``target`` as a strategic-merge patch does for pod templates: maps merge key
    by key and lists of named objects (containers, volumes) merge by name. Enough for the sidecar patch;
    not a general implementation."""
    merged = copy.deepcopy(target)

    def merge(into: dict[str, Any], source: dict[str, Any]) -> None:
        for key, value in source.items():
            current = into.get(key)
            if isinstance(value, dict) and isinstance(current, dict):
                merge(current, value)
            elif isinstance(value, list) and isinstance(current, list) and all("name" in v for v in value):
                names = [item["name"] for item in current]
                for item in value:
                    if item["name"] in names:
                        current[names.index(item["name"])] = copy.deepcopy(item)
                    else:
                        current.append(copy.deepcopy(item))
            else:
                into[key] = copy.deepcopy(value)

    merge(merged, patch)
    return merged


HOST_DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "hudi-writer", "namespace": NAMESPACE},
    "spec": {
        "selector": {"matchLabels": {"app": "hudi-writer"}},
        "template": {
            "metadata": {"labels": {"app": "hudi-writer"}, "annotations": {"team": "lake"}},
            "spec": {
                "containers": [
                    {
                        "name": "writer",
                        "image": "hudi-writer:1.0",
                        "ports": [{"name": "http", "containerPort": 8080}],
                    }
                ],
                "volumes": [{"name": "scratch", "emptyDir": {}}],
            },
        },
    },
}


# --- lint and Kubernetes validity, for the defaults and every ci/ values file ----------------------------


def test_every_toggle_has_a_ci_values_file(chart: helm.Chart) -> None:
    """STYLE 14: one ci/<feature>-values.yaml per toggle, flipping it from its default."""

    def leaves(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
        for key, value in tree.items():
            if isinstance(value, dict) and value:
                yield from leaves(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    def lookup(tree: dict[str, Any], path: str) -> Any:
        for key in path.split("."):
            if not isinstance(tree, dict) or key not in tree:
                return None
            tree = tree[key]
        return tree

    defaults = chart.values
    toggles = {path: value for path, value in leaves(defaults) if path.endswith(".enabled")}
    toggles |= {"mode": "service", "sidecar.native": False, "scrapeAnnotations.target": "pod"}
    assert len(toggles) >= 10
    unflipped = [
        path
        for path, default in toggles.items()
        if not any(lookup(values, path) not in (None, default) for values in CI_VALUES.values())
    ]
    assert unflipped == []


@pytest.mark.parametrize("case", CASES)
def test_lint_is_clean(case: str) -> None:
    report = helm.lint(
        CHART_DIR, CASES[case], strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}"
    )
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= LINT_WARNING] == []


@pytest.mark.parametrize("case", CASES)
def test_manifests_are_valid_kubernetes(chart: helm.Chart, case: str) -> None:
    rendered = render(chart, CASES[case])
    assert rendered.objects
    for obj in rendered.objects:
        if obj["kind"] in CRD_KINDS:
            continue  # no bundled schema: see test_service_monitor and test_pod_monitor
        validate_kubernetes(obj)
        if obj["kind"] == "ConfigMap" and "patch.yaml" in obj["data"]:
            patched = apply_strategic_patch(HOST_DEPLOYMENT, yaml.safe_load(obj["data"]["patch.yaml"]))
            validate_kubernetes(patched)


@pytest.mark.parametrize("case", CASES)
def test_objects_carry_release_labels_and_namespace(chart: helm.Chart, case: str) -> None:
    rendered = render(chart, CASES[case])
    for obj in rendered.objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "cowrite-daemon"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "cowrite-daemon-0.2.0"
        if obj["kind"] not in CRD_KINDS:
            assert obj["metadata"]["namespace"] == NAMESPACE


# --- service mode ----------------------------------------------------------------------------------------


def test_service_mode_renders_the_daemon_and_its_service(chart: helm.Chart) -> None:
    rendered = render(chart)
    assert rendered.kinds == {"ConfigMap", "Deployment", "Service", "ServiceAccount"}
    deployment = rendered.one("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert pod["serviceAccountName"] == rendered.one("ServiceAccount")["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["terminationGracePeriodSeconds"] >= 30
    container = daemon_container(pod)
    assert container["image"] == "cowrite:0.1.0"
    assert container["args"] == ["daemon", "--config", "/etc/cowrite/daemon.toml"]
    service = rendered.one("Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 9464, "targetPort": "http", "protocol": "TCP"}
    ]


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c].get("mode", "service") == "service"])
def test_security_context_is_non_root_and_read_only(chart: helm.Chart, case: str) -> None:
    pod = render(chart, CASES[case]).one("Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = daemon_container(pod)["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == 10001
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}


def test_tmp_is_the_only_writable_mount(chart: helm.Chart) -> None:
    rendered = render(chart)
    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount for mount in daemon_container(pod)["volumeMounts"]}
    assert set(mounts) == {"/tmp", "/etc/cowrite"}
    assert volumes[mounts["/tmp"]["name"]]["emptyDir"] == {"sizeLimit": "256Mi"}
    assert mounts["/etc/cowrite"]["readOnly"] is True
    config_volume = volumes[mounts["/etc/cowrite"]["name"]]
    assert config_volume["configMap"]["name"] == rendered.one("ConfigMap")["metadata"]["name"]


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c].get("mode", "service") == "service"])
def test_probes_use_the_named_port(chart: helm.Chart, case: str) -> None:
    rendered = render(chart, CASES[case])
    container = daemon_container(rendered.one("Deployment")["spec"]["template"]["spec"])
    port = rendered.values["server"]["port"]
    assert container["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    paths = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    for probe, path in paths.items():
        if rendered.values[probe]["enabled"]:
            assert container[probe]["httpGet"] == {"path": path, "port": "http"}
        else:
            assert probe not in container


def test_probes_can_be_turned_off(chart: helm.Chart) -> None:
    container = daemon_container(
        render(chart, CI_VALUES["no-probes"]).one("Deployment")["spec"]["template"]["spec"]
    )
    assert not {"startupProbe", "livenessProbe", "readinessProbe"} & set(container)


# --- daemon.toml -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_daemon_toml_is_rendered_from_values(chart: helm.Chart, case: str) -> None:
    rendered = render(chart, CASES[case])
    config = daemon_toml(rendered)
    values = rendered.values
    assert config["server"] == {"host": "0.0.0.0", "port": values["server"]["port"]}
    assert config["cleaner"] == {
        "interval_seconds": values["cleaner"]["intervalSeconds"],
        "commits_retained": values["cleaner"]["commitsRetained"],
    }
    assert config["follow"] == {"poll_interval_seconds": values["follow"]["pollIntervalSeconds"]}
    assert config["overlay"] == {"snapshot_every": values["overlay"]["snapshotEvery"]}
    expected = [{"uri": t} if isinstance(t, str) else t for t in values["tables"]]
    assert config["tables"] == expected


def test_the_overlay_snapshot_setting_reaches_the_daemon(chart: helm.Chart, tmp_path: Path) -> None:
    """The daemon reads the rendered [overlay] section; the chart's default is the daemon's own."""
    assert chart.values["overlay"]["snapshotEvery"] == DEFAULT_SNAPSHOT_EVERY
    for values, expected in ((CASES["tables"], 20), ({}, DEFAULT_SNAPSHOT_EVERY)):
        path = tmp_path / "daemon.toml"
        config_map = render(chart, values).one("ConfigMap", "cowrite-daemon")
        path.write_text(config_map["data"]["daemon.toml"])
        assert DaemonConfig.load(str(path)).overlay_snapshot_every == expected


def test_table_objects_keep_their_keys_and_extra_config_stays_top_level(chart: helm.Chart) -> None:
    values = {
        "tables": [
            "s3://lake/orders",
            {"uri": "s3://lake/customers", "commits_retained": 20, "archive": False, "owner": "crm"},
        ],
        "extraConfig": 'log_level = "debug"\n\n[locks]\nstale_after_seconds = 120\n',
    }
    config = daemon_toml(render(chart, values))
    assert config["log_level"] == "debug"
    assert config["locks"] == {"stale_after_seconds": 120}
    assert config["tables"] == [
        {"uri": "s3://lake/orders"},
        {"uri": "s3://lake/customers", "commits_retained": 20, "archive": False, "owner": "crm"},
    ]


@pytest.mark.parametrize(
    "uri",
    [
        's3://b/with "quotes"',
        "s3://b/back\\slash",
        "s3://b/ünïcødé/表",
        "s3://b/<html>&amp;",
        "s3://b/tab\there",
    ],
)
def test_table_uris_survive_toml_quoting(chart: helm.Chart, uri: str) -> None:
    assert daemon_toml(render(chart, {"tables": [uri, {"uri": uri}]}))["tables"] == [{"uri": uri}] * 2


def test_config_change_rolls_the_pod(chart: helm.Chart) -> None:
    def checksum(values: dict[str, Any]) -> str:
        template = render(chart, values).one("Deployment")["spec"]["template"]
        return str(template["metadata"]["annotations"]["checksum/cowrite-config"])

    assert checksum({}) == checksum({})
    assert checksum({}) != checksum({"tables": ["s3://lake/other"]})


# --- metrics ---------------------------------------------------------------------------------------------


def scrape_annotations(obj: dict[str, Any]) -> dict[str, str]:
    annotations = obj["metadata"].get("annotations") or {}
    return {k: v for k, v in annotations.items() if k.startswith("prometheus.io/")}


@pytest.mark.parametrize(
    ("case", "on_pod", "on_service"),
    [("default", True, False), ("no-annotations", False, False), ("service-annotations", False, True)],
)
def test_scrape_annotations_go_to_one_place(
    chart: helm.Chart, case: str, on_pod: bool, on_service: bool
) -> None:
    rendered = render(chart, CASES[case])
    expected = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(rendered.values["server"]["port"]),
        "prometheus.io/path": "/metrics",
    }
    pod = scrape_annotations(rendered.one("Deployment")["spec"]["template"])
    service = scrape_annotations(rendered.one("Service"))
    assert pod == (expected if on_pod else {})
    assert service == (expected if on_service else {})


def test_service_monitor_is_off_by_default(chart: helm.Chart) -> None:
    assert "ServiceMonitor" not in render(chart).kinds


def test_service_monitor(chart: helm.Chart) -> None:
    rendered = render(chart, CI_VALUES["service-monitor"])
    monitor = rendered.one("ServiceMonitor")
    service = rendered.one("Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    spec = monitor["spec"]
    assert set(spec) == {"endpoints", "selector", "namespaceSelector"}
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] == "http"
    assert endpoint["path"] == "/metrics"
    assert endpoint["interval"] == "30s"
    assert endpoint["scrapeTimeout"] == "10s"
    assert endpoint["metricRelabelings"][0]["action"] == "drop"
    assert "http" in [port["name"] for port in service["spec"]["ports"]]
    assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}


def test_pod_monitor_selects_the_host_pods_on_the_sidecar_port(chart: helm.Chart) -> None:
    values = CI_VALUES["pod-monitor"]
    monitor = render(chart, values).one("PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    spec = monitor["spec"]
    assert set(spec) == {"podMetricsEndpoints", "selector", "namespaceSelector"}
    assert spec["selector"] == {"matchLabels": values["podMonitor"]["podSelector"]}
    assert spec["podMetricsEndpoints"] == [{"port": "cowrite-http", "path": "/metrics", "interval": "1m"}]
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}


# --- Grafana dashboard -----------------------------------------------------------------------------------

DASHBOARD = CHART_DIR / "dashboards" / "cowrite-daemon.json"
PROMQL_WORDS = {
    *("sum", "max", "min", "avg", "count", "rate", "increase", "histogram_quantile", "time", "vector"),
    *("by", "without", "or", "and", "unless", "on", "ignoring"),
}


def exported_metrics() -> dict[str, set[str]]:
    """Each metric family the daemon's metrics module registers, with the names of its samples as
    /metrics shows them (a counter's ``_total``, a histogram's ``_bucket``/``_sum``/``_count``)."""
    registry = CollectorRegistry()
    DaemonMetrics(registry, lambda: [TableStatus("orders", "/t", up=True)])
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    return {
        family.name: {family.name + suffix for suffix in suffixes.get(family.type, [""])}
        for family in registry.collect()
    }


def metrics_named(expr: str) -> set[str]:
    """The metric names in a PromQL expression: what is left once label matchers, strings, ranges,
    grouping labels, numbers and PromQL's own words are taken out."""
    bare = re.sub(r'"[^"]*"|\{[^}]*\}|\[[^]]*\]|\b(by|without)\s*\([^)]*\)', " ", expr)
    return {word for word in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare) if word not in PROMQL_WORDS}


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_dashboard_queries_name_only_metrics_the_daemon_exports_and_cover_them_all() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "cowrite-daemon"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    exported = exported_metrics()
    sample_names = set().union(*exported.values())
    used: set[str] = set()
    queries = dashboard_queries(dashboard)
    assert len(queries) >= len(exported)
    for expr in queries:
        named = metrics_named(expr)
        assert named, f"{expr!r} names no metric"
        assert named <= sample_names, f"{expr!r} names {sorted(named - sample_names)}, not exported"
        assert 'table=~"$table"' in expr, f"{expr!r} ignores the table selector"
        used |= named
    unused = [family for family, names in exported.items() if not names & used]
    assert unused == [], "metrics without a panel"
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["title"] and panel["description"]
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["table"]["query"]["query"] == "label_values(cowrite_table_up, table)"
    assert "cowrite_table_up" in sample_names


def test_metrics_named_reads_promql() -> None:
    expr = 'histogram_quantile(0.99, sum by (table, le) (rate(x_bucket{table=~"$table", a="b c"}[5m]))) or y'
    assert metrics_named(expr) == {"x_bucket", "y"}


def test_dashboard_config_map_is_off_by_default_and_carries_the_dashboard(chart: helm.Chart) -> None:
    assert not [o for o in render(chart).of_kind("ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    for values in (
        CI_VALUES["grafana-dashboard"],
        {**CI_VALUES["sidecar"], **CI_VALUES["grafana-dashboard"]},
    ):
        config_map = render(chart, values).one("ConfigMap", "-dashboard")
        validate_kubernetes(config_map)
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "Lakehouse"}
        assert config_map["metadata"]["namespace"] == NAMESPACE
        assert json.loads(config_map["data"]["cowrite-daemon.json"]) == json.loads(DASHBOARD.read_text())


def test_dashboard_label_and_namespace_follow_the_values(chart: helm.Chart) -> None:
    values = {
        "grafanaDashboard": {
            "enabled": True,
            "namespace": "monitoring",
            "label": "grafana.example.com/dashboard",
            "labelValue": "cowrite",
        }
    }
    config_map = render(chart, values).one("ConfigMap", "-dashboard")
    validate_kubernetes(config_map)
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana.example.com/dashboard"] == "cowrite"
    assert "grafana_dashboard" not in config_map["metadata"]["labels"]


# --- auth, env, service account --------------------------------------------------------------------------


def test_token_comes_from_the_existing_secret_only_when_enabled(chart: helm.Chart) -> None:
    def env(values: dict[str, Any]) -> list[dict[str, Any]]:
        pod = render(chart, values).one("Deployment")["spec"]["template"]["spec"]
        return list(daemon_container(pod).get("env", []))

    assert env({}) == []
    assert env(CI_VALUES["auth"]) == [
        {
            "name": "COWRITE_DAEMON_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "cowrite-daemon-token", "key": "daemon-token"}},
        }
    ]
    assert "Secret" not in render(chart, CI_VALUES["auth"]).kinds


def test_env_and_env_from_pass_through(chart: helm.Chart) -> None:
    values = CI_VALUES["s3-env"]
    rendered = render(chart, values)
    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    container = daemon_container(pod)
    assert container["env"] == values["env"]
    assert container["envFrom"] == values["envFrom"]
    assert values["extraVolumes"][0] in pod["volumes"]
    assert values["extraVolumeMounts"][0] in container["volumeMounts"]
    assert (
        rendered.one("ServiceAccount")["metadata"]["annotations"] == values["serviceAccount"]["annotations"]
    )


def test_existing_service_account(chart: helm.Chart) -> None:
    rendered = render(chart, CI_VALUES["no-service-account"])
    assert "ServiceAccount" not in rendered.kinds
    assert rendered.one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "hudi-writers"


# --- sidecar mode ----------------------------------------------------------------------------------------

SIDECAR_CASES = [c for c in CASES if CASES[c].get("mode") == "sidecar"]


@pytest.mark.parametrize("case", SIDECAR_CASES)
def test_sidecar_mode_renders_no_workload(chart: helm.Chart, case: str) -> None:
    rendered = render(chart, CASES[case])
    assert not rendered.kinds & {"Deployment", "Service", "ServiceAccount", "ServiceMonitor"}
    rendered.one("ConfigMap", "cowrite-daemon")


@pytest.mark.parametrize("case", ["sidecar", "sidecar-native"])
def test_sidecar_patch_adds_the_daemon_to_a_host_deployment(chart: helm.Chart, case: str) -> None:
    values = CI_VALUES[case]
    rendered = render(chart, values)
    patch = yaml.safe_load(rendered.one("ConfigMap", "-sidecar")["data"]["patch.yaml"])
    host = apply_strategic_patch(HOST_DEPLOYMENT, patch)
    validate_kubernetes(host)
    template = host["spec"]["template"]
    pod = template["spec"]
    assert [c["name"] for c in pod["containers"]][0] == "writer"
    assert template["metadata"]["annotations"]["team"] == "lake"
    assert "checksum/cowrite-config" in template["metadata"]["annotations"]
    native = values.get("sidecar", {}).get("native", False)
    port_name = values.get("sidecar", {}).get("portName", "cowrite-http")
    container = daemon_container(pod)
    assert container in pod["initContainers" if native else "containers"]
    assert container.get("restartPolicy") == ("Always" if native else None)
    assert container["ports"] == [{"name": port_name, "containerPort": 9464, "protocol": "TCP"}]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == port_name
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["runAsUser"] == 10001
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert {"scratch", "cowrite-config", "cowrite-tmp"} <= set(volumes)
    assert (
        volumes["cowrite-config"]["configMap"]["name"]
        == rendered.one("ConfigMap", "cowrite-daemon")["metadata"]["name"]
    )


def test_sidecar_patch_can_be_turned_off(chart: helm.Chart) -> None:
    assert [o["metadata"]["name"] for o in render(chart, CI_VALUES["sidecar-no-patch"]).objects] == [
        "hudi-cowrite-daemon"
    ]


PARENT_DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-writer
  namespace: {{ .Release.Namespace }}
spec:
  selector:
    matchLabels: {app: writer}
  template:
    metadata:
      labels: {app: writer}
      annotations:
        {{- include "cowrite-daemon.sidecarPodAnnotations" (index .Subcharts "cowrite-daemon") | nindent 8 }}
    spec:
      containers:
        - name: writer
          image: hudi-writer:1.0
          ports:
            - {name: http, containerPort: 8080}
        {{- include "cowrite-daemon.sidecarContainer" (index .Subcharts "cowrite-daemon") | nindent 8 }}
      volumes:
        {{- include "cowrite-daemon.sidecarVolumes" (index .Subcharts "cowrite-daemon") | nindent 8 }}
"""


def make_parent_chart(tmp_path: Path) -> Path:
    """A writer chart that depends on cowrite-daemon and embeds it with the public named templates."""
    parent = tmp_path / "hudi-writer"
    (parent / "templates").mkdir(parents=True)
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: hudi-writer\nversion: 1.0.0\n"
        "dependencies:\n  - name: cowrite-daemon\n    version: 0.2.0\n"
    )
    (parent / "values.yaml").write_text("cowrite-daemon:\n  mode: sidecar\n  tables: [s3://lake/orders]\n")
    (parent / "templates" / "deployment.yaml").write_text(PARENT_DEPLOYMENT)
    shutil.copytree(CHART_DIR, parent / "charts" / "cowrite-daemon", ignore=shutil.ignore_patterns("ci"))
    return parent


def test_sidecar_named_templates_embed_the_daemon_in_a_parent_chart(tmp_path: Path) -> None:
    parent = make_parent_chart(tmp_path)
    with helm.Chart.load(parent) as loaded:
        manifests = loaded.render({}, name=RELEASE, namespace=NAMESPACE)
    objects = [
        o for path, text in manifests.items() if path.endswith(".yaml") for o in yaml.safe_load_all(text) if o
    ]
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == ["ConfigMap", "ConfigMap", "Deployment"]  # daemon.toml, the patch, the writer
    for obj in objects:
        validate_kubernetes(obj)
    (writer,) = [o for o in objects if o["kind"] == "Deployment"]
    pod = writer["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["writer", "cowrite-daemon"]
    assert daemon_container(pod)["ports"][0]["name"] == "cowrite-http"
    config_maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    (config_volume,) = [v for v in pod["volumes"] if v["name"] == "cowrite-config"]
    config = tomllib.loads(config_maps[config_volume["configMap"]["name"]]["data"]["daemon.toml"])
    assert config["tables"] == [{"uri": "s3://lake/orders"}]
    assert "checksum/cowrite-config" in writer["spec"]["template"]["metadata"]["annotations"]


def test_sidecar_named_templates_refuse_service_mode(tmp_path: Path) -> None:
    parent = make_parent_chart(tmp_path)
    with helm.Chart.load(parent) as loaded, pytest.raises(helm.HelmRenderError, match="mode=sidecar"):
        loaded.render({"cowrite-daemon": {"mode": "service"}}, name=RELEASE, namespace=NAMESPACE)


# --- values.schema.json and cross-field checks -----------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"mode": "foo"}, "/mode"),
        ({"tables": []}, "/tables"),
        ({"tables": [""]}, "/tables/0"),
        ({"tables": [{"name": "orders"}]}, "/tables/0"),
        ({"tables": [{"uri": "s3://b/t", "nested": {"a": 1}}]}, "/tables/0"),
        ({"server": {"port": "9464"}}, "/server/port"),
        ({"server": {"port": 70000}}, "/server/port"),
        ({"auth": {"enabled": True}}, "/auth/existingSecret"),
        ({"podMonitor": {"enabled": True}}, "/podMonitor/podSelector"),
        ({"scrapeAnnotations": {"target": "both"}}, "/scrapeAnnotations/target"),
        ({"sidecar": {"portName": "cowrite-daemon-http"}}, "/sidecar/portName"),
        ({"serviceMonitor": {"interval": "often"}}, "/serviceMonitor/interval"),
        ({"grafanaDashboard": {"enabled": True, "labelValue": 1}}, "/grafanaDashboard/labelValue"),
        ({"grafanaDashboard": {"enabled": True, "label": "not a label"}}, "/grafanaDashboard/label"),
        ({"replicas": 2}, "replicas"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else None,
)
def test_schema_rejects_bad_values(chart: helm.Chart, values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(complaint)):
        render(chart, values)


@pytest.mark.parametrize("values", [{"mode": "foo"}, {"tables": []}], ids=["mode", "tables"])
def test_lint_reports_schema_errors(values: dict[str, Any]) -> None:
    assert helm.lint(CHART_DIR, values)["errors"]


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        (
            {"mode": "sidecar", "serviceMonitor": {"enabled": True}},
            "serviceMonitor.enabled needs mode=service",
        ),
        (
            {"podMonitor": {"enabled": True, "podSelector": {"app": "w"}}},
            "podMonitor.enabled needs mode=sidecar",
        ),
        (
            {"mode": "sidecar", "scrapeAnnotations": {"target": "service"}},
            "target=service needs mode=service",
        ),
    ],
    ids=[
        "service-monitor-in-sidecar-mode",
        "pod-monitor-in-service-mode",
        "service-annotations-in-sidecar-mode",
    ],
)
def test_mode_mismatches_fail_with_a_reason(
    chart: helm.Chart, values: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(complaint)):
        render(chart, values)


def test_every_value_is_commented_documented_and_in_the_schema(chart: helm.Chart) -> None:
    """STYLE 14: a comment on every value. A key is covered by a comment directly above it, or by a
    `# --` comment above an enclosing key that documents the whole object (securityContext, ...).
    Every `# --` value is in README.md's table and in values.schema.json."""
    readme = (CHART_DIR / "README.md").read_text()
    schema = chart.schema
    assert schema is not None
    documented: list[str] = []
    stack: list[tuple[int, str, bool]] = []  # (indent, key, documented as a whole)
    comment: list[str] = []  # the comment lines directly above the current line
    for line in (CHART_DIR / "values.yaml").read_text().splitlines():
        match = re.match(r"^( *)([A-Za-z][\w-]*):", line)
        if match:
            indent, key = len(match.group(1)), match.group(2)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            path = ".".join([k for _, k, _ in stack] + [key])
            inside_whole = any(whole for _, _, whole in stack)
            assert inside_whole or comment, f"values.yaml: {path} has no comment"
            whole = bool(comment) and comment[0].startswith("# --")
            if whole and not inside_whole:
                documented.append(path)
            stack.append((indent, key, whole))
        comment = [*comment, line.strip()] if line.strip().startswith("#") else []
    assert len(documented) > 50
    for path in documented:
        assert f"`{path}`" in readme, f"README.md does not document {path}"
        node = schema
        for key in path.split("."):
            node = node["properties"][key]


# --- Dockerfile ------------------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and continuation lines joined."""
    logical: list[str] = []
    pending = ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in logical]


def final_stage() -> list[tuple[str, str]]:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    return instructions[last_from:]


def test_dockerfile_runs_the_console_script_as_the_chart_user(chart: helm.Chart) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    stage = final_stage()
    froms = [args.split()[0] for op, args in dockerfile_instructions() if op == "FROM"]
    assert set(froms) == {"python:3.11-slim"}
    (user,) = [args for op, args in stage if op == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, (
        "USER must be a numeric non-root UID, so runAsNonRoot can check it"
    )
    assert int(uid) == chart.values["securityContext"]["runAsUser"] == 10001
    (entrypoint,) = [json.loads(args) for op, args in stage if op == "ENTRYPOINT"]
    assert entrypoint == ["cowrite"]
    assert entrypoint[0] in pyproject["project"]["scripts"]
    (cmd,) = [json.loads(args) for op, args in stage if op == "CMD"]
    rendered_args = daemon_container(render(chart).one("Deployment")["spec"]["template"]["spec"])["args"]
    assert cmd == rendered_args == ["daemon", "--config", "/etc/cowrite/daemon.toml"]
    (expose,) = [args for op, args in stage if op == "EXPOSE"]
    assert expose.split() == [str(chart.values["server"]["port"])]


def test_dockerfile_installs_the_daemon_extras_and_holds_no_secrets() -> None:
    instructions = dockerfile_instructions()
    runs = " ".join(args for op, args in instructions if op == "RUN")
    assert re.search(r"pip install \"?\.\[s3,zookeeper\]\"?", runs)
    assert "spark" not in runs.lower()
    secretish = re.compile(r"TOKEN|SECRET|PASSWORD|ACCESS_KEY|CREDENTIAL", re.IGNORECASE)
    for op, args in instructions:
        if op in {"ENV", "ARG", "LABEL"}:
            assert not secretish.search(args), f"{op} {args}"


def test_dockerignore_admits_only_what_the_build_copies() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*"
    admitted = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied = {
        source.rstrip("/")
        for op, args in dockerfile_instructions()
        if op == "COPY" and not args.startswith("--from")
        for source in args.split()[:-1]
    }
    assert copied == admitted == {"pyproject.toml", "README.md", "cowrite"}


def test_chart_app_version_is_the_package_version(chart: helm.Chart) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert chart.metadata["appVersion"] == pyproject["project"]["version"]
