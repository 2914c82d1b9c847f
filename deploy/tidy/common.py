"""What the checks of deploy/tidy/ share: services.toml's values, the Report, the loaders,
and the helpers reading compose services, pods and NetworkPolicies (a NetworkPolicy
evaluator: which peers reach which port).

Needs python3 and PyYAML.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

# services.toml's loader, shared with the scripts (scripts/lib/services_toml.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "lib"))
from services_toml import ServicePorts, load_services  # noqa: E402


SPECS = load_services()


#: Every service's ports.
SERVICES: dict[str, ServicePorts] = {name: spec.ports for name, spec in SPECS.items()}


#: The public edge (kind gateway), and the backends (Kafka clients, each with a database).
GATEWAYS = tuple(name for name, spec in SPECS.items() if spec.kind == "gateway")


KAFKA_CLIENTS = tuple(name for name, spec in SPECS.items() if spec.kind == "backend")


#: Compose ports that may be published on the host: (service, container port).
PUBLISHED_ALLOWED = {(name, SERVICES[name].http) for name in GATEWAYS} | {
    ("jaeger", 16686), ("prometheus", 9090), ("grafana", 3000),
}


#: Compose services on the `edge` network: those that publish a port.
EDGE_SERVICES = {service for service, _ in PUBLISHED_ALLOWED}


#: The user the images run as (deploy/Dockerfile).
UID = 10001


#: The repository root (the copies under k8s/ are compared with their originals there).
ROOT = Path(__file__).resolve().parents[2]


#: Workload kinds whose pods the k8s checks cover (Jobs: no probes, no PDB).
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")


#: Pod template annotation naming container ports (by name, comma-separated) that no
#: NetworkPolicy opens on purpose: reached by kubelet probes or `kubectl port-forward`
#: only, neither of which NetworkPolicy sees. Checked to stay closed.
CLOSED_PORTS = "sagaworks.io/closed-ports"


#: The services' preStop sleep, and the drain after SIGTERM that terminationGracePeriodSeconds
#: must cover on top of it (k8s/base/*/deployment.yaml: in-flight calls of up to 3 x 2 s,
#: Kafka clients closed within 5 s, spans flushed within the 10 s OTLP export timeout).
PRESTOP_SECONDS = 5


DRAIN_SECONDS = 22


#: At most this long for a service to answer /health/live: migrations run before, in the
#: `migrate` init container.
STARTUP_BUDGET_SECONDS = 30


#: Services with a database: their pods run `service migrate` in an init container first.
BACKENDS = tuple(name for name, spec in SPECS.items() if spec.database is not None)


MIGRATE_FLAG = "APP_DATABASE__MIGRATE"


#: The database owner's URL: only the `migrate` init container gets it.
OWNER_URL = "APP_DATABASE__OWNER_URL"


#: The dev overlay's telemetry (k8s/overlays/dev/infra/, hand-written): who may reach each
#: of its ports, and the services' HTTP ports (Prometheus only; the gateway's is open to the
#: cluster). The policies scripts/generate writes (the databases', Kafka's, the services'
#: gRPC ports) are held by `scripts/generate --check`.
DEV_INGRESS: dict[tuple[str, int], set[str]] = {
    ("otel-collector", 4317): set(SERVICES),
    ("jaeger", 4317): {"otel-collector"},
    ("jaeger", 16686): {"grafana"},
    ("prometheus", 9090): {"grafana"},
    **{(name, ports.http): {"prometheus"} for name, ports in SERVICES.items() if name not in GATEWAYS},
}


#: Ports that may be reached from outside the namespace, per overlay: the gateway (from
#: anywhere in dev, from the ingress controller's namespace in prod) and, in prod, the
#: services' HTTP ports for the monitoring namespace.
OUTSIDE_ALLOWED: dict[str, set[tuple[str, int]]] = {
    "dev": {(name, SERVICES[name].http) for name in GATEWAYS},
    "prod": {(name, ports.http) for name, ports in SERVICES.items()},
}


#: The paths an Ingress may route to the gateway (the public routes of
#: services/gateway/src/api/mod.rs), and prefixes no Ingress path may cover: the health
#: and metrics endpoints, the admin API and the admin UI.
PUBLIC_PATHS = {
    ("/v1/orders", "Prefix"), ("/v1/sagas", "Prefix"), ("/v1/products", "Prefix"),
    ("/v1/customers", "Prefix"), ("/openapi.json", "Exact"), ("/asyncapi.json", "Exact"),
}


NEVER_PUBLIC = ("/health", "/metrics", "/v1/admin", "/admin")


#: deploy/observability/: the files compose mounts, which the dev overlay's ConfigMaps
#: carry through the component deploy/observability/kustomization.yaml (checked rendered
#: in check_rendered_copies); prometheus.yml has a Kubernetes variant instead (checked
#: against the compose one in check_prometheus_variant).
OBSERVABILITY_DIR = Path("deploy/observability")


COPY_CONFIGMAPS: dict[str, dict[str, str]] = {
    "otel-collector-config": {"config.yaml": "otel-collector.yaml"},
    "jaeger-config": {"config.yaml": "jaeger.yaml"},
    "prometheus-config": {"alerts.yml": "prometheus/alerts.yml"},
    "grafana-datasources": {"datasources.yaml": "grafana/provisioning/datasources/datasources.yaml"},
    "grafana-dashboard-providers": {"dashboards.yaml": "grafana/provisioning/dashboards/dashboards.yaml"},
    "grafana-dashboards": {},  # every dashboard: filled in from the directory
}


@dataclass
class Report:
    """Collects check results; a failed check records what was wrong."""

    passed: int = 0
    failures: list[str] = field(default_factory=list)

    def check(self, ok: bool, what: str) -> bool:
        if ok:
            self.passed += 1
        else:
            self.failures.append(what)
        return ok

    @property
    def ok(self) -> bool:
        return not self.failures


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _compose_env(spec: dict[str, Any]) -> dict[str, str]:
    env = spec.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v).lower() if isinstance(v, bool) else str(v) for k, v in env.items()}


def _compose_ports(spec: dict[str, Any]) -> list[tuple[int | None, int]]:
    """(published, target) of every `ports:` entry, short or long syntax."""
    result: list[tuple[int | None, int]] = []
    for entry in spec.get("ports") or []:
        if isinstance(entry, dict):
            published = entry.get("published")
            result.append((int(published) if published not in (None, "") else None, int(entry["target"])))
            continue
        text = str(entry).split("/", 1)[0]
        parts = text.split(":")
        target = int(parts[-1])
        published = int(parts[-2]) if len(parts) >= 2 and parts[-2] else None
        result.append((published, target))
    return result


def _compose_networks(spec: dict[str, Any]) -> set[str]:
    networks = spec.get("networks") or {}
    return set(networks) if isinstance(networks, (dict, list)) else set()


def _by_kind(docs: Iterable[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == kind}


def _base_name(generated: str, names: Iterable[str]) -> str | None:
    """The generator name behind a hashed name (`order-config-abc123` -> `order-config`)."""
    for name in names:
        if generated == name or re.fullmatch(re.escape(name) + r"-[a-z0-9]{10}", generated):
            return name
    return None


def _container_env(container: dict[str, Any], configmaps: dict[str, dict[str, Any]]) -> tuple[dict[str, str], list[str]]:
    env: dict[str, str] = {}
    problems: list[str] = []
    for source in container.get("envFrom") or []:
        ref = (source.get("configMapRef") or {}).get("name")
        if ref is None:
            problems.append(f"envFrom other than a ConfigMap: {source}")
        elif ref not in configmaps:
            problems.append(f"envFrom ConfigMap {ref} is not in the rendering")
        else:
            env.update({k: str(v) for k, v in (configmaps[ref].get("data") or {}).items()})
    for item in container.get("env") or []:
        value_from = item.get("valueFrom")
        if value_from is not None and "secretKeyRef" not in value_from:
            problems.append(f"{item['name']} comes from neither a literal nor a Secret")
        env[item["name"]] = str(item.get("value", "<from secret>"))
    return env, problems


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector matches a pod with `labels`."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        present = key in labels
        if not {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[op]:
            return False
    return True


def _rule_ports(rule: dict[str, Any], pod: dict[str, Any]) -> list[tuple[int, int]] | None:
    """The (first, last) port ranges of a rule, named ports resolved on `pod`; None = all."""
    entries = rule.get("ports") or []
    if not entries:
        return None
    ranges: list[tuple[int, int]] = []
    for entry in entries:
        if "port" not in entry:
            return None
        first = _pod_port(entry["port"], pod)
        if first is not None:
            ranges.append((first, int(entry.get("endPort", first))))
    return ranges


def _pod_port(port: Any, pod: dict[str, Any]) -> int | None:
    """A port number or container port name of any container of `pod`."""
    if isinstance(port, int):
        return port
    for container in (pod.get("containers") or []) + (pod.get("initContainers") or []):
        for p in container.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
    return None


def _peers(
    policies: Iterable[dict[str, Any]],
    pod_labels: dict[str, str],
    pod: dict[str, Any],
    port: int,
    pods: Iterable[dict[str, str]] = (),
) -> set[str]:
    """Who the NetworkPolicies selecting a pod admit to its `port`.

    Same-namespace pods appear by their `app.kubernetes.io/name` (a selector on other labels
    is resolved against `pods`, the pod labels of every workload rendered); a peer in
    another namespace as `ns:<name>` (`ns:*` for a namespace selector on other labels);
    anyone (no `from`, an ipBlock) as `*`. Empty: the port is closed to every pod.
    """
    pods = list(pods)
    found: set[str] = set()
    for policy in policies:
        spec = policy["spec"]
        types = spec.get("policyTypes") or (["Ingress", "Egress"] if "egress" in spec else ["Ingress"])
        if "Ingress" not in types or not _selects(spec.get("podSelector") or {}, pod_labels):
            continue
        for rule in spec.get("ingress") or []:
            ranges = _rule_ports(rule, pod)
            if ranges is not None and not any(first <= port <= last for first, last in ranges):
                continue
            sources = rule.get("from")
            if not sources:
                found.add("*")
                continue
            for peer in sources:
                if "ipBlock" in peer:
                    found.add("*")
                elif "namespaceSelector" in peer:
                    labels = (peer["namespaceSelector"] or {}).get("matchLabels") or {}
                    name = labels.get("kubernetes.io/metadata.name")
                    found.add(f"ns:{name}" if name and len(labels) == 1 else "ns:*")
                else:
                    selector = peer.get("podSelector") or {}
                    labels = selector.get("matchLabels") or {}
                    if set(labels) == {"app.kubernetes.io/name"} and not selector.get("matchExpressions"):
                        found.add(labels["app.kubernetes.io/name"])
                    else:
                        found.update(p.get("app.kubernetes.io/name", "?") for p in pods if _selects(selector, p))
    return found


def _workloads(docs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") in WORKLOAD_KINDS]


def _pod_template_labels(workload: dict[str, Any]) -> dict[str, str]:
    return ((workload.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {}


def _configmap(docs: list[dict[str, Any]], base: str) -> dict[str, Any] | None:
    return next(
        (d for d in docs if d.get("kind") == "ConfigMap" and _base_name(d["metadata"]["name"], [base]) == base), None
    )


OTELCOL_IMAGE = "otel/opentelemetry-collector-contrib"


def _compose_mount(volume: Any) -> tuple[str, str]:
    """(target, source) of a compose volume, in the short (`src:target[:mode]`) or the long
    syntax (docker-compose v1 renders the first, v2 the second)."""
    if isinstance(volume, dict):
        return str(volume.get("target", "")), str(volume.get("source", ""))
    source, _, rest = str(volume).partition(":")
    return rest.split(":", 1)[0], source


@dataclass
class Context:
    """What the checks read: the rendered compose file, the rendered overlays (label ->
    resources), and the repository they come from."""

    compose: dict[str, Any]
    k8s: dict[str, list[dict[str, Any]]]
    root: Path = ROOT


def each_overlay(ctx: Context, check_one: Any, *extra: Any) -> list[str]:
    """The failures of `check_one(report, label, docs, *extra)` run on every rendered overlay:
    the `check` of a module whose check reads one overlay at a time."""
    report = Report()
    for label, docs in ctx.k8s.items():
        check_one(report, label, docs, *extra)
    return report.failures
