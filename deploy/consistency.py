#!/usr/bin/env python3
"""Cross-checks docker-compose.yml and the rendered k8s overlays against one another and
against the list of services in services.toml (names, kinds, ports, databases, who calls
whom; docs/design.md has the same table for people).

Usage (scripts/validate-deploy runs it):

    consistency.py --keys deploy/config-keys.txt --compose <docker-compose config output> \
        --k8s dev=<kubectl kustomize k8s/overlays/dev output> --k8s prod=<...>

What it asserts, per service of services.toml:

* the image is `sagaworks/<service>:<tag>` everywhere, built from deploy/Dockerfile with
  SERVICE=<service>, and the repository is the same in compose and every overlay;
* the ports are those of services.toml, in the APP_*__PORT settings, the container ports
  and the k8s Services; gRPC URLs (one per service it `calls`) point at them;
* every APP_* variable is listed in config-keys.txt for that service (other variables:
  only those in EXTRA_ENV); servers bind 0.0.0.0;
* compose publishes only the gateway's 8080 and the UIs of Jaeger (16686), Prometheus
  (9090) and Grafana (3000), never a gRPC port, and keeps everything else on the
  `internal: true` network;
* k8s probes hit the HTTP port (readiness /health/ready, liveness /health/live), the
  containers carry the restricted security context, every service has an HPA, a PDB and
  a NetworkPolicy whose gRPC ingress admits exactly the expected callers, and the prod
  overlay carries no Secret;
* every workload of every overlay (Deployment, StatefulSet, Job; the data stores and the
  telemetry of the dev overlay too): resources on every container, init containers
  included, and the restricted Pod Security profile; readiness and liveness probes and a
  PodDisruptionBudget (not Jobs); each declared port admitted by a NetworkPolicy, or
  listed as closed (`sagaworks.io/closed-ports`) and really closed; nothing reachable from
  outside the namespace but the gateway (and, in prod, the HTTP ports for monitoring);
  the dev overlay's ingress matrix (DEV_INGRESS);
* every backend's APP_DATABASE__URL (compose; k8s when its Secret is in the rendering,
  i.e. dev) names a login role of its own: not the `postgres` superuser, not a role
  another service uses;
* the services' pods: preStop sleep and a grace period covering it plus the drain; the
  backends' `migrate` init container (same image, settings and security context,
  `args: [migrate]`) and APP_DATABASE__MIGRATE=false in the service container; a short
  startup probe;
* prod's Ingress routes exactly the public paths (never /health, /metrics or admin), and
  the gateway admits the ingress controller's namespace, not anyone;
* the dev overlay's ConfigMaps carry deploy/observability/'s files unchanged (its
  component deploy/observability/kustomization.yaml generates them from the files compose
  mounts); its Prometheus config differs from compose's only in
  how it finds the targets; the topics Job uses the services' topic prefix;
* compose and the dev overlay run the Jaeger and OpenTelemetry Collector releases that
  scripts/validate-observability builds and checks the configs with (Jaeger's version in
  scripts/lib/tracing.sh, the collector's release in deploy/observability/build/
  otelcol-builder.yaml), each on the committed config (deploy/observability/jaeger.yaml,
  otel-collector.yaml);
* the CI pipelines: every service of services.toml has its workflow
  .github/workflows/<service>.yml (named after it, on its services/<service>/** paths, calling
  service-pipeline.yml with its name), and no workflow names a service that does not exist
  (check_workflows); release.yml pushes and publishes only after its jobs calling
  rust-tests.yml and advisories.yml passed (check_release_gates);
* Kafka runs secured like scripts/kafka's secure mode (check_kafka_security):
  deploy/kafka/start.sh with SASL_SSL, an SSL controller listener
  with client certificates, the StandardAuthorizer and no access without an ACL; a SCRAM
  user per backend whose password is the one the backend uses; the backends on
  sasl_ssl as themselves; deploy/kafka/acls.txt (scripts/generate writes it from
  scripts/lib/kafka_acls.py) applied by the init step; the broker's Certificate
  (CN=kafka, a super user) from a Kafka CA apart from the services' CA: in compose the
  broker's TLS_CA_FILE is no service's APP_TLS__CA_FILE, and the backends and the init
  step verify the broker with it; in the dev overlay its Issuer is a CA Issuer of its own
  that issues no other Certificate, and the backends' APP_KAFKA__SSL_CA_FILE is ca.crt of
  the broker's Secret.

Needs python3 and PyYAML. Exit status 0 if every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import parse_qs, urlsplit

import yaml


# services.toml's loader, shared with the scripts (scripts/lib/services_toml.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts" / "lib"))
from services_toml import SERVICES_TOML, Service, ServicePorts, load_services  # noqa: E402


SPECS = load_services()
#: Every service's ports.
SERVICES: dict[str, ServicePorts] = {name: spec.ports for name, spec in SPECS.items()}
#: Which services may call a service's gRPC port: those whose `calls` name it.
GRPC_CALLERS: dict[str, set[str]] = {
    name: {caller for caller, other in SPECS.items() if name in other.calls}
    for name, spec in SPECS.items() if spec.ports.grpc is not None
}
#: `<service>.url` settings a service has, keyed by the service they point at: its `calls`.
CLIENT_URLS: dict[str, tuple[str, ...]] = {name: spec.calls for name, spec in SPECS.items()}
#: The public edge (kind gateway), and the backends (Kafka clients, each with a database).
GATEWAYS = tuple(name for name, spec in SPECS.items() if spec.kind == "gateway")
KAFKA_CLIENTS = tuple(name for name, spec in SPECS.items() if spec.kind == "backend")
#: config-keys.txt may name these groups instead of services.
KEY_GROUPS: dict[str, set[str]] = {"@all": set(SERVICES), "@backends": set(KAFKA_CLIENTS)}
#: Compose ports that may be published on the host: (service, container port).
PUBLISHED_ALLOWED = {(name, SERVICES[name].http) for name in GATEWAYS} | {
    ("jaeger", 16686), ("prometheus", 9090), ("grafana", 3000),
}
#: Compose services on the `edge` network: those that publish a port.
EDGE_SERVICES = {service for service, _ in PUBLISHED_ALLOWED}
#: Variables outside the APP_* namespace that the deployment files may set.
EXTRA_ENV = {"OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_ENDPOINT", "RUST_LOG"}
IMAGE_RE = re.compile(r"^(?P<repo>sagaworks/(?P<service>[a-z][a-z0-9-]*)):(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127})$")
DOCKERFILE = "deploy/Dockerfile"
UID = 10001

#: The repository root (the copies under k8s/ are compared with their originals there).
ROOT = Path(__file__).resolve().parent.parent
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
#: Roles no service may connect as: PostgreSQL's bootstrap superuser (the images' default).
SUPERUSER_ROLES = {"postgres"}
#: The dev overlay's in-namespace data stores and telemetry (k8s/overlays/dev/infra/): who
#: may reach each of their ports, and the services' HTTP ports (Prometheus only; the
#: gateway's is open to the cluster, the gRPC ports are checked against GRPC_CALLERS).
DEV_INGRESS: dict[tuple[str, int], set[str]] = {
    **{(f"{name}-db", 5432): {name} for name in BACKENDS},
    ("kafka", 9092): set(KAFKA_CLIENTS) | {"kafka-topics"},
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


def load_keys(path: Path) -> dict[str, set[str]]:
    """Parses config-keys.txt into {env name: services that read it} (a group of KEY_GROUPS
    stands for its services)."""
    keys: dict[str, set[str]] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, *words = line.split()
        services = {service for word in words for service in KEY_GROUPS.get(word, {word})}
        unknown = services - SERVICES.keys()
        if not re.fullmatch(r"APP_[A-Z0-9_]+", name) or not services or unknown:
            raise ValueError(f"{path}:{number}: expected `APP_NAME service...`, got {raw!r}")
        if name in keys:
            raise ValueError(f"{path}:{number}: {name} listed twice")
        keys[name] = set(services)
    return keys


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _port_of_url(url: str) -> int | None:
    try:
        return urlsplit(url).port
    except ValueError:
        return None


def check_env(report: Report, where: str, service: str, env: dict[str, str], keys: dict[str, set[str]]) -> None:
    """The settings every deployment of `service` must agree on, whatever the platform."""
    ports = SERVICES[service]
    for name in sorted(env):
        if name.startswith("APP_"):
            report.check(name in keys, f"{where}: {name} is not a known config key (deploy/config-keys.txt)")
            if name in keys:
                report.check(service in keys[name], f"{where}: {service} has no setting {name}")
        else:
            report.check(name in EXTRA_ENV, f"{where}: unexpected non-APP variable {name}")
    report.check(env.get("APP_HTTP__HOST") == "0.0.0.0", f"{where}: APP_HTTP__HOST must be 0.0.0.0")
    report.check(
        env.get("APP_HTTP__PORT") == str(ports.http), f"{where}: APP_HTTP__PORT must be {ports.http}"
    )
    if ports.grpc is not None:
        report.check(env.get("APP_GRPC__HOST") == "0.0.0.0", f"{where}: APP_GRPC__HOST must be 0.0.0.0")
        report.check(
            env.get("APP_GRPC__PORT") == str(ports.grpc), f"{where}: APP_GRPC__PORT must be {ports.grpc}"
        )
        report.check("APP_DATABASE__URL" in env, f"{where}: APP_DATABASE__URL is not set")
        report.check("APP_KAFKA__BROKERS" in env, f"{where}: APP_KAFKA__BROKERS is not set")
    for target in CLIENT_URLS[service]:
        name = f"APP_{target.upper()}__URL"
        url = env.get(name, "")
        want = SERVICES[target].grpc
        report.check(
            _port_of_url(url) == want and urlsplit(url).hostname == target and urlsplit(url).scheme == "https",
            f"{where}: {name} must be https://{target}:{want}, got {url!r}",
        )
    # Mutual TLS (libs/mtls): the CA, its certificate and key, all three.
    tls = [key for key in ("APP_TLS__CA_FILE", "APP_TLS__CERT_FILE", "APP_TLS__KEY_FILE") if not env.get(key)]
    report.check(not tls, f"{where}: {', '.join(tls)} not set (mutual TLS between the services)")
    if service in GATEWAYS:
        report.check(
            "APP_AUTH__JWT_SECRET" in env or "APP_AUTH__JWKS_URL" in env,
            f"{where}: the gateway needs APP_AUTH__JWT_SECRET or APP_AUTH__JWKS_URL",
        )
    report.check(env.get("OTEL_SERVICE_NAME") == service, f"{where}: OTEL_SERVICE_NAME must be {service}")


# --- compose -------------------------------------------------------------------------


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


def check_compose(report: Report, compose: dict[str, Any], keys: dict[str, set[str]]) -> dict[str, str]:
    """Returns {service: image repository} as found in compose."""
    services: dict[str, Any] = compose.get("services") or {}
    networks: dict[str, Any] = compose.get("networks") or {}
    report.check(
        (networks.get("internal") or {}).get("internal") is True,
        "compose: network `internal` must have internal: true",
    )
    repos: dict[str, str] = {}
    for name, spec in sorted(services.items()):
        for entry in spec.get("ports") or []:
            host_ip = entry.get("host_ip") if isinstance(entry, dict) else (
                str(entry).split(":")[0] if str(entry).count(":") == 2 else None)
            report.check(host_ip == "127.0.0.1", f"compose: {name} publishes {entry!r} beyond 127.0.0.1")
        for published, target in _compose_ports(spec):
            report.check(
                (name, target) in PUBLISHED_ALLOWED,
                f"compose: {name} publishes container port {target} (only {sorted(PUBLISHED_ALLOWED)} may be)",
            )
            report.check(
                published is None or (name, published) in PUBLISHED_ALLOWED,
                f"compose: {name} publishes host port {published}",
            )
        on_edge = "edge" in _compose_networks(spec)
        report.check(
            on_edge == (name in EDGE_SERVICES),
            f"compose: only {', '.join(sorted(EDGE_SERVICES))} belong on the edge network ({name})",
        )
    for service, ports in SERVICES.items():
        where = f"compose/{service}"
        spec = services.get(service)
        if not report.check(spec is not None, f"{where}: service missing"):
            continue
        match = IMAGE_RE.match(str(spec.get("image", "")))
        if report.check(
            bool(match) and match["service"] == service,
            f"{where}: image must be sagaworks/{service}:<tag>, got {spec.get('image')!r}",
        ):
            repos[service] = match["repo"]
        build = spec.get("build") or {}
        report.check(
            isinstance(build, dict)
            and str(build.get("dockerfile", "")).endswith(DOCKERFILE)
            and (build.get("args") or {}).get("SERVICE") == service,
            f"{where}: must build {DOCKERFILE} with SERVICE={service}",
        )
        report.check("internal" in _compose_networks(spec), f"{where}: must be on the internal network")
        if ports.grpc is not None:
            report.check(
                all(target != ports.grpc for _, target in _compose_ports(spec)),
                f"{where}: gRPC port {ports.grpc} must not be published",
            )
        test = (spec.get("healthcheck") or {}).get("test") or []
        report.check(
            list(map(str, test)) == ["CMD", "http-probe", str(ports.http), "/health/ready"],
            f"{where}: healthcheck must be http-probe {ports.http} /health/ready, got {test!r}",
        )
        check_env(report, where, service, _compose_env(spec), keys)
    check_database_roles(report, "compose", {
        service: _compose_env(services[service]).get("APP_DATABASE__URL")
        for service in BACKENDS if service in services
    })
    return repos


# --- kubernetes ----------------------------------------------------------------------


def _by_kind(docs: Iterable[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == kind}


def _base_name(generated: str, names: Iterable[str]) -> str | None:
    """The generator name behind a hashed name (`order-config-abc123` -> `order-config`)."""
    for name in names:
        if generated == name or re.fullmatch(re.escape(name) + r"-[a-z0-9]{10}", generated):
            return name
    return None


def _resolve_port(port: Any, container: dict[str, Any]) -> int | None:
    if isinstance(port, int):
        return port
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
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
    for container in (pod.get("containers") or []) + (pod.get("initContainers") or []):
        number = _resolve_port(port, container)
        if number is not None:
            return number
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


def _admitted(
    policies: Iterable[dict[str, Any]],
    pod_labels: dict[str, str],
    pod: dict[str, Any],
    port: int,
    pods: Iterable[dict[str, str]] = (),
) -> set[str] | None:
    """App names that the policies selecting this pod admit to `port`; None = anyone or
    anything outside the namespace."""
    peers = _peers(policies, pod_labels, pod, port, pods)
    if any(p == "*" or p.startswith("ns:") for p in peers):
        return None
    return peers


def check_k8s(report: Report, label: str, docs: list[dict[str, Any]], keys: dict[str, set[str]]) -> dict[str, str]:
    """Returns {service: image repository} as found in this rendering."""
    deployments = _by_kind(docs, "Deployment")
    configmaps = _by_kind(docs, "ConfigMap")
    services = _by_kind(docs, "Service")
    hpas = _by_kind(docs, "HorizontalPodAutoscaler")
    pdbs = _by_kind(docs, "PodDisruptionBudget")
    policies = list(_by_kind(docs, "NetworkPolicy").values())
    all_pods = [_pod_template_labels(w) for w in _workloads(docs)]
    report.check(
        any(
            p["spec"].get("podSelector") == {} and set(p["spec"].get("policyTypes", [])) >= {"Ingress", "Egress"}
            and not p["spec"].get("ingress") and not p["spec"].get("egress")
            for p in policies
        ),
        f"{label}: no default-deny NetworkPolicy",
    )
    if label == "prod":
        secrets = list(_by_kind(docs, "Secret"))
        report.check(not secrets, f"{label}: Secrets must come from outside the repository, found {secrets}")
    secrets = _by_kind(docs, "Secret")
    database_urls: dict[str, str | None] = {}
    repos: dict[str, str] = {}
    for service, ports in SERVICES.items():
        where = f"{label}/{service}"
        deployment = deployments.get(service)
        if not report.check(deployment is not None, f"{where}: Deployment missing"):
            continue
        pod = deployment["spec"]["template"]["spec"]
        containers = pod.get("containers") or []
        if not report.check(len(containers) == 1, f"{where}: expected one container"):
            continue
        container = containers[0]
        match = IMAGE_RE.match(str(container.get("image", "")))
        if report.check(
            bool(match) and match["service"] == service,
            f"{where}: image must be sagaworks/{service}:<tag>, got {container.get('image')!r}",
        ):
            repos[service] = match["repo"]
        declared = {p.get("name"): int(p["containerPort"]) for p in container.get("ports") or []}
        want = {"http": ports.http} | ({"grpc": ports.grpc} if ports.grpc else {})
        report.check(declared == want, f"{where}: container ports must be {want}, got {declared}")
        for probe, path in (("readinessProbe", "/health/ready"), ("livenessProbe", "/health/live")):
            get = (container.get(probe) or {}).get("httpGet") or {}
            report.check(
                get.get("path") == path and _resolve_port(get.get("port"), container) == ports.http,
                f"{where}: {probe} must GET {path} on the HTTP port {ports.http}, got {get}",
            )
        startup = (container.get("startupProbe") or {}).get("httpGet")
        if startup is not None:
            report.check(
                _resolve_port(startup.get("port"), container) == ports.http,
                f"{where}: startupProbe must use the HTTP port",
            )
        ctx = container.get("securityContext") or {}
        pod_ctx = pod.get("securityContext") or {}
        report.check(
            ctx.get("runAsNonRoot") is True
            and ctx.get("runAsUser") == UID
            and ctx.get("readOnlyRootFilesystem") is True
            and ctx.get("allowPrivilegeEscalation") is False
            and (ctx.get("capabilities") or {}).get("drop") == ["ALL"]
            and not (ctx.get("capabilities") or {}).get("add")
            and ((ctx.get("seccompProfile") or pod_ctx.get("seccompProfile") or {}).get("type") == "RuntimeDefault"),
            f"{where}: container securityContext is not the restricted one: {ctx}",
        )
        resources = container.get("resources") or {}
        report.check(
            {"cpu", "memory"} <= set(resources.get("requests") or {})
            and {"memory"} <= set(resources.get("limits") or {}),
            f"{where}: resources need cpu+memory requests and a memory limit",
        )
        env, problems = _container_env(container, configmaps)
        for problem in problems:
            report.check(False, f"{where}: {problem}")
        check_env(report, where, service, env, keys)
        if service in BACKENDS:
            database_urls[service] = _database_url(container, configmaps, secrets)
        svc = services.get(service)
        if report.check(svc is not None, f"{where}: Service missing"):
            report.check(svc["spec"].get("type", "ClusterIP") == "ClusterIP", f"{where}: Service must be ClusterIP")
            svc_ports = {p.get("name"): (int(p["port"]), _resolve_port(p.get("targetPort"), container))
                         for p in svc["spec"].get("ports") or []}
            report.check(
                svc_ports == {name: (port, port) for name, port in want.items()},
                f"{where}: Service ports must be {want}, got {svc_ports}",
            )
        hpa = hpas.get(service)
        report.check(
            hpa is not None and hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": service},
            f"{where}: HorizontalPodAutoscaler missing or not targeting the Deployment",
        )
        report.check(service in pdbs, f"{where}: PodDisruptionBudget missing")
        pod_labels = deployment["spec"]["template"]["metadata"].get("labels") or {}
        if ports.grpc is not None:
            callers = _admitted(policies, pod_labels, pod, ports.grpc, all_pods)
            report.check(
                callers == GRPC_CALLERS[service],
                f"{where}: gRPC ingress must admit exactly {sorted(GRPC_CALLERS[service])}, admits "
                f"{'anyone' if callers is None else sorted(callers)}",
            )
        else:
            report.check(
                _admitted(policies, pod_labels, pod, ports.http, all_pods) is None,
                f"{where}: the gateway's HTTP port must be reachable from outside the namespace",
            )
    check_database_roles(report, label, database_urls)
    return repos


# --- database roles ----------------------------------------------------------------------


def _database_url(
    container: dict[str, Any], configmaps: dict[str, dict[str, Any]], secrets: dict[str, dict[str, Any]]
) -> str | None:
    """The container's APP_DATABASE__URL: a literal, from a ConfigMap, or from a Secret in the
    rendering; None when it comes from a Secret made outside the repository (prod)."""
    env, _ = _container_env(container, configmaps)
    for item in container.get("env") or []:
        if item["name"] != "APP_DATABASE__URL":
            continue
        ref = (item.get("valueFrom") or {}).get("secretKeyRef")
        if ref is None:
            return str(item.get("value", ""))
        secret = secrets.get(ref.get("name"))
        if secret is None:
            return None
        if ref.get("key") in (secret.get("stringData") or {}):
            return str(secret["stringData"][ref["key"]])
        try:
            return base64.b64decode((secret.get("data") or {}).get(ref.get("key"), "")).decode()
        except (binascii.Error, UnicodeDecodeError):
            return ""
    return env.get("APP_DATABASE__URL")


def _database_role(url: str) -> str:
    """The role a libpq URL logs in as (`?user=` wins over the userinfo); '' when none."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    users = parse_qs(parts.query).get("user")
    return users[-1] if users else parts.username or ""


def check_database_roles(report: Report, label: str, urls: dict[str, str | None]) -> None:
    """Each backend logs in as a role of its own (a least-privilege login that owns just its
    database, see deploy/postgres/init.sql): never the superuser, never another service's."""
    services_of: dict[str, list[str]] = {}
    for service, url in sorted(urls.items()):
        if url is None:
            continue  # the Secret comes from outside the repository
        where = f"{label}/{service}"
        role = _database_role(url)
        if not report.check(bool(role), f"{where}: APP_DATABASE__URL names no role (libpq would pick the OS user)"):
            continue
        report.check(
            role not in SUPERUSER_ROLES,
            f"{where}: APP_DATABASE__URL connects as the superuser {role!r}, not the service's own role",
        )
        services_of.setdefault(role, []).append(service)
    for role, services in sorted(services_of.items()):
        report.check(len(services) == 1, f"{label}: {', '.join(services)} share the database role {role!r}")


# --- every workload: probes, resources, security, PDB, NetworkPolicy ---------------------


def _workloads(docs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") in WORKLOAD_KINDS]


def _pod_template_labels(workload: dict[str, Any]) -> dict[str, str]:
    return ((workload.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {}


def _restricted_problems(container: dict[str, Any], pod: dict[str, Any]) -> list[str]:
    """What keeps a container from the "restricted" Pod Security Standard."""
    ctx = container.get("securityContext") or {}
    pod_ctx = pod.get("securityContext") or {}
    problems = []
    if ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) is not True:
        problems.append("runAsNonRoot is not true")
    if ctx.get("runAsUser", pod_ctx.get("runAsUser")) in (0, None):
        problems.append("no non-zero runAsUser")
    if ctx.get("allowPrivilegeEscalation") is not False:
        problems.append("allowPrivilegeEscalation is not false")
    caps = ctx.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []) or set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
        problems.append(f"capabilities must drop ALL and add nothing: {caps}")
    if ctx.get("privileged"):
        problems.append("privileged")
    seccomp = (ctx.get("seccompProfile") or pod_ctx.get("seccompProfile") or {}).get("type")
    if seccomp not in ("RuntimeDefault", "Localhost"):
        problems.append(f"seccompProfile is {seccomp}, not RuntimeDefault")
    return problems


def _resources_ok(container: dict[str, Any]) -> bool:
    resources = container.get("resources") or {}
    return {"cpu", "memory"} <= set(resources.get("requests") or {}) and "memory" in (resources.get("limits") or {})


def check_workloads(report: Report, label: str, docs: list[dict[str, Any]]) -> None:
    """What every Deployment, StatefulSet and Job must have, whatever it runs."""
    policies = list(_by_kind(docs, "NetworkPolicy").values())
    pdbs = list(_by_kind(docs, "PodDisruptionBudget").values())
    workloads = _workloads(docs)
    all_pods = [_pod_template_labels(w) for w in workloads]
    report.check(bool(workloads), f"{label}: no workload rendered")
    for workload in workloads:
        kind, name = workload["kind"], workload["metadata"]["name"]
        where = f"{label}/{kind}/{name}"
        template = workload["spec"]["template"]
        pod = template["spec"]
        labels = template.get("metadata", {}).get("labels") or {}
        containers = pod.get("containers") or []
        inits = pod.get("initContainers") or []
        for container in containers + inits:
            cwhere = f"{where}: container {container.get('name')}"
            report.check(_resources_ok(container), f"{cwhere} needs cpu+memory requests and a memory limit")
            for problem in _restricted_problems(container, pod):
                report.check(False, f"{cwhere}: not the restricted Pod Security profile: {problem}")
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            report.check(not pod.get(key), f"{where}: {key} breaks the restricted profile")
        for volume in pod.get("volumes") or []:
            report.check("hostPath" not in volume, f"{where}: hostPath volume {volume.get('name')}")
        if kind != "Job":
            for container in containers:
                for probe in ("readinessProbe", "livenessProbe"):
                    report.check(
                        bool(container.get(probe)), f"{where}: container {container.get('name')} has no {probe}"
                    )
            report.check(
                any(_selects(pdb["spec"].get("selector") or {}, labels) for pdb in pdbs),
                f"{where}: no PodDisruptionBudget selects its pods",
            )
        # NetworkPolicy: a policy of its own (not only the namespace-wide ones), and every
        # declared port admitted by some policy, or closed on purpose and really closed.
        report.check(
            any(
                (p["spec"].get("podSelector") or {}) != {} and _selects(p["spec"].get("podSelector") or {}, labels)
                for p in policies
            ),
            f"{where}: no NetworkPolicy selects its pods (beyond the namespace-wide ones)",
        )
        declared = {
            port.get("name"): int(port["containerPort"])
            for container in containers + inits
            for port in container.get("ports") or []
        }
        closed_names = {
            n.strip() for n in (template.get("metadata", {}).get("annotations") or {}).get(CLOSED_PORTS, "").split(",")
            if n.strip()
        }
        for unknown in sorted(closed_names - set(declared)):
            report.check(False, f"{where}: {CLOSED_PORTS} names {unknown!r}, which is no declared port")
        for port_name, number in sorted(declared.items(), key=lambda item: item[1]):
            peers = _peers(policies, labels, pod, number, all_pods)
            if port_name in closed_names:
                report.check(
                    not peers, f"{where}: port {port_name} ({number}) is listed as closed, but admits {sorted(peers)}"
                )
                continue
            report.check(
                bool(peers),
                f"{where}: no NetworkPolicy admits port {port_name} ({number}); open it or list it in {CLOSED_PORTS}",
            )
            outside = sorted(p for p in peers if p == "*" or p.startswith("ns:"))
            report.check(
                not outside or (name, number) in OUTSIDE_ALLOWED.get(label, set()),
                f"{where}: port {number} is reachable from outside the namespace ({outside}); only the gateway may be",
            )
            want = DEV_INGRESS.get((name, number)) if label == "dev" else None
            if want is not None:
                report.check(
                    peers == want,
                    f"{where}: port {number} must admit exactly {sorted(want)}, admits {sorted(peers)}",
                )
    if label == "dev":
        names = {w["metadata"]["name"] for w in workloads}
        for workload, port in sorted(DEV_INGRESS):
            report.check(workload in names, f"{label}: {workload} (port {port}) is not rendered")


# --- the services' pods: graceful shutdown, migrations -----------------------------------


def check_service_pods(report: Report, label: str, docs: list[dict[str, Any]]) -> None:
    deployments = _by_kind(docs, "Deployment")
    for service in SERVICES:
        deployment = deployments.get(service)
        if deployment is None:
            continue  # reported by check_k8s
        where = f"{label}/{service}"
        pod = deployment["spec"]["template"]["spec"]
        main = next((c for c in pod.get("containers") or [] if c.get("name") == service), None)
        if not report.check(main is not None, f"{where}: no container named {service}"):
            continue
        sleep = (((main.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}).get("seconds")
        report.check(
            isinstance(sleep, int) and sleep >= PRESTOP_SECONDS,
            f"{where}: the container needs lifecycle.preStop.sleep.seconds >= {PRESTOP_SECONDS}, got {sleep!r}",
        )
        grace = pod.get("terminationGracePeriodSeconds", 30)
        need = (sleep if isinstance(sleep, int) else PRESTOP_SECONDS) + DRAIN_SECONDS
        report.check(
            grace >= need,
            f"{where}: terminationGracePeriodSeconds {grace} < preStop + drain ({need})",
        )
        startup = main.get("startupProbe") or {}
        if startup:
            budget = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)
            report.check(
                budget <= STARTUP_BUDGET_SECONDS,
                f"{where}: startupProbe allows {budget} s, more than {STARTUP_BUDGET_SECONDS} s",
            )
        inits = pod.get("initContainers") or []
        if service not in BACKENDS:
            report.check(not inits, f"{where}: unexpected init containers {[c.get('name') for c in inits]}")
            continue
        env = {e["name"]: e for e in main.get("env") or []}
        report.check(
            str((env.get(MIGRATE_FLAG) or {}).get("value")).lower() == "false",
            f"{where}: the service container must set {MIGRATE_FLAG}=false (its init container migrates)",
        )
        migrate = next((c for c in inits if c.get("name") == "migrate"), None)
        if not report.check(migrate is not None, f"{where}: no `migrate` init container"):
            continue
        report.check(
            migrate.get("image") == main.get("image") and migrate.get("args") == ["migrate"]
            and not migrate.get("command"),
            f"{where}: init container migrate must run the service's image with args [migrate], got "
            f"{migrate.get('image')} {migrate.get('command')} {migrate.get('args')}",
        )
        report.check(
            migrate.get("envFrom") == main.get("envFrom")
            and [e for e in migrate.get("env") or [] if e["name"] not in (MIGRATE_FLAG, OWNER_URL)]
            == [e for e in main.get("env") or [] if e["name"] != MIGRATE_FLAG],
            f"{where}: init container migrate must have the service container's env and envFrom",
        )
        # Migrations run as the database's owner; the service as the runtime role only.
        owner = next((e for e in migrate.get("env") or [] if e["name"] == OWNER_URL), {})
        ref = (owner.get("valueFrom") or {}).get("secretKeyRef") or {}
        secret = f"{service}-database-owner"
        report.check(
            _base_name(str(ref.get("name")), [secret]) == secret and ref.get("key") == "url",
            f"{where}: init container migrate must take {OWNER_URL} from Secret {service}-database-owner key url",
        )
        report.check(
            OWNER_URL not in env,
            f"{where}: the service container must not get {OWNER_URL} (the owner's credentials)",
        )
        report.check(
            MIGRATE_FLAG not in {e["name"] for e in migrate.get("env") or []},
            f"{where}: init container migrate must not set {MIGRATE_FLAG}",
        )
        report.check(
            migrate.get("securityContext") == main.get("securityContext"),
            f"{where}: init container migrate must have the service container's securityContext",
        )


# --- prod Ingress ------------------------------------------------------------------------


def check_ingress(report: Report, label: str, docs: list[dict[str, Any]]) -> None:
    ingresses = list(_by_kind(docs, "Ingress").values())
    if label == "prod":
        report.check(bool(ingresses), f"{label}: no Ingress for the gateway")
    for ingress in ingresses:
        where = f"{label}/Ingress/{ingress['metadata']['name']}"
        spec = ingress["spec"]
        report.check("defaultBackend" not in spec, f"{where}: a defaultBackend exposes every path")
        paths = [
            (p.get("path", "/"), p.get("pathType"), ((p.get("backend") or {}).get("service") or {}).get("name"))
            for rule in spec.get("rules") or []
            for p in (rule.get("http") or {}).get("paths") or []
        ]
        routed = {(path, kind) for path, kind, _ in paths}
        report.check(
            routed == PUBLIC_PATHS,
            f"{where}: must route exactly {sorted(PUBLIC_PATHS)}, routes {sorted(routed)}",
        )
        for path, kind, backend in paths:
            report.check(backend == "gateway", f"{where}: {path} goes to {backend}, not the gateway")
            for private in NEVER_PUBLIC:
                # A Prefix path exposes everything below it; an Exact one only itself.
                below = kind == "Prefix" and private.startswith(path.rstrip("/") + "/")
                exposes = below or path == private or path.startswith(private)
                report.check(not exposes, f"{where}: {path} ({kind}) exposes {private}")
    if label == "prod":
        gateway = _by_kind(docs, "Deployment").get("gateway")
        if gateway is not None:
            pod = gateway["spec"]["template"]["spec"]
            peers = _peers(
                _by_kind(docs, "NetworkPolicy").values(), _pod_template_labels(gateway), pod,
                SERVICES["gateway"].http, [_pod_template_labels(w) for w in _workloads(docs)],
            )
            report.check(
                bool(peers) and "*" not in peers and "ns:*" not in peers,
                f"{label}/gateway: port {SERVICES['gateway'].http} must admit the ingress controller's namespace, "
                f"not anyone: admits {sorted(peers)}",
            )


# --- the dev overlay's ConfigMaps of deploy/observability/ --------------------------------


def _configmap(docs: list[dict[str, Any]], base: str) -> dict[str, Any] | None:
    return next(
        (d for d in docs if d.get("kind") == "ConfigMap" and _base_name(d["metadata"]["name"], [base]) == base), None
    )


def check_rendered_copies(report: Report, label: str, docs: list[dict[str, Any]], root: Path) -> None:
    """The dev overlay's ConfigMaps carry the compose stack's observability files unchanged."""
    if label != "dev":
        return
    originals = root / OBSERVABILITY_DIR
    dashboards = sorted((originals / "grafana" / "dashboards").glob("*.json"))
    for base, keys in COPY_CONFIGMAPS.items():
        configmap = _configmap(docs, base)
        if not report.check(configmap is not None, f"{label}: ConfigMap {base} is not rendered"):
            continue
        data = configmap.get("data") or {}
        if base == "grafana-dashboards":
            keys = {f.name: str(f.relative_to(originals)) for f in dashboards}
            report.check(
                set(data) == set(keys),
                f"{label}: ConfigMap {base} holds {sorted(data)}, deploy/observability has {sorted(keys)}",
            )
        for key, rel in keys.items():
            report.check(
                data.get(key) == (originals / rel).read_text(),
                f"{label}: ConfigMap {base} key {key} differs from {OBSERVABILITY_DIR / rel}",
            )


def check_prometheus_variant(report: Report, label: str, docs: list[dict[str, Any]], root: Path) -> None:
    """The dev Prometheus config is the compose one but for the targets: one job per service
    (same names, path, intervals, rules), each finding every pod of that service through a
    headless Service on the service's HTTP port."""
    if label != "dev":
        return
    configmap = _configmap(docs, "prometheus-config")
    if configmap is None:
        return  # reported by check_rendered_copies
    k8s = yaml.safe_load((configmap.get("data") or {}).get("prometheus.yml", "")) or {}
    compose = yaml.safe_load((root / OBSERVABILITY_DIR / "prometheus" / "prometheus.yml").read_text()) or {}
    where = f"{label}: prometheus.yml"
    for key in ("global", "rule_files"):
        report.check(k8s.get(key) == compose.get(key), f"{where}: {key} differs from the compose config")
    jobs = {job["job_name"]: job for job in k8s.get("scrape_configs") or []}
    compose_jobs = {job["job_name"]: job for job in compose.get("scrape_configs") or []}
    report.check(
        set(jobs) == set(compose_jobs) == set(SERVICES),
        f"{where}: jobs {sorted(jobs)}, compose has {sorted(compose_jobs)}, want one per service",
    )
    services = _by_kind(docs, "Service")
    deployments = _by_kind(docs, "Deployment")
    for name, job in sorted(jobs.items()):
        if name not in SERVICES:
            continue
        report.check(
            job.get("metrics_path") == (compose_jobs.get(name) or {}).get("metrics_path") == "/metrics",
            f"{where}: job {name} must scrape /metrics like compose",
        )
        sd = job.get("dns_sd_configs") or []
        ok = len(sd) == 1 and sd[0].get("type") == "A" and sd[0].get("port") == SERVICES[name].http
        if not report.check(ok, f"{where}: job {name} must find its pods by DNS (type A, port {SERVICES[name].http})"):
            continue
        for host in sd[0].get("names") or []:
            svc = services.get(host)
            pods = _pod_template_labels(deployments[name]) if name in deployments else {}
            report.check(
                svc is not None and svc["spec"].get("clusterIP") == "None"
                and svc["spec"].get("publishNotReadyAddresses") is True
                and bool(svc["spec"].get("selector")) and _selects({"matchLabels": svc["spec"]["selector"]}, pods),
                f"{where}: job {name} resolves {host}, which must be a headless Service (publishNotReadyAddresses) "
                f"selecting the {name} pods",
            )


def check_topics_job(report: Report, label: str, docs: list[dict[str, Any]]) -> None:
    """The topics Job creates the topics under the prefix the services use."""
    job = _by_kind(docs, "Job").get("kafka-topics")
    if job is None:
        return
    container = job["spec"]["template"]["spec"]["containers"][0]
    prefix = {e["name"]: e.get("value") for e in container.get("env") or []}.get("TOPIC_PREFIX")
    configmaps = _by_kind(docs, "ConfigMap")
    for service in BACKENDS:
        deployment = _by_kind(docs, "Deployment").get(service)
        if deployment is None:
            continue
        env, _ = _container_env(deployment["spec"]["template"]["spec"]["containers"][0], configmaps)
        report.check(
            env.get("APP_KAFKA__TOPIC_PREFIX") == prefix,
            f"{label}/Job/kafka-topics: TOPIC_PREFIX {prefix!r} differs from {service}'s "
            f"APP_KAFKA__TOPIC_PREFIX {env.get('APP_KAFKA__TOPIC_PREFIX')!r}",
        )


def check_repositories_agree(report: Report, found: dict[str, dict[str, str]]) -> None:
    for service in SERVICES:
        repos = {where: by_service[service] for where, by_service in found.items() if service in by_service}
        report.check(
            len(set(repos.values())) == 1 and len(repos) == len(found),
            f"{service}: image repository differs between {sorted(found)}: {repos}",
        )


# --- the telemetry releases: the ones the configs are tested with --------------------------

#: Where the tested releases are named (scripts/validate-observability builds them).
TRACING_LIB = Path("scripts/lib/tracing.sh")
OTELCOL_MANIFEST = OBSERVABILITY_DIR / "build" / "otelcol-builder.yaml"
JAEGER_IMAGE = "jaegertracing/jaeger"
OTELCOL_IMAGE = "otel/opentelemetry-collector-contrib"
#: service / Deployment name -> the committed config it must run and where it mounts it.
TELEMETRY_CONFIGS = {
    "jaeger": ("jaeger.yaml", "/etc/jaeger/config.yaml"),
    "otel-collector": ("otel-collector.yaml", "/etc/otelcol-contrib/config.yaml"),
}


#: The pom scripts/kafka runs Apache Kafka from (its kafka.version), and Kafka's image.
KAFKA_POM = Path("scripts/lib/kafka/pom.xml")
KAFKA_IMAGE = "apache/kafka"


def check_kafka_release(report: Report, compose: dict[str, Any], k8s: dict[str, list[dict[str, Any]]], root: Path) -> None:
    """Every apache/kafka image of compose and the k8s overlays is the Kafka release the
    tests run (scripts/lib/kafka/pom.xml's kafka.version)."""
    match = re.search(r"<kafka\.version>([0-9][0-9.]*)</kafka\.version>", (root / KAFKA_POM).read_text())
    if not report.check(match is not None, f"no <kafka.version> in {KAFKA_POM}"):
        return
    want = f"{KAFKA_IMAGE}:{match.group(1)}"
    images = [(f"compose/{name}", str(spec.get("image", ""))) for name, spec in (compose.get("services") or {}).items()]
    for label, docs in k8s.items():
        for workload in _workloads(docs):
            pod = workload["spec"].get("template", {}).get("spec") or workload["spec"].get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec", {})
            for c in (pod.get("containers") or []) + (pod.get("initContainers") or []):
                images.append((f"{label}/{workload.get('kind')}/{workload['metadata']['name']}", str(c.get("image", ""))))
    kafka = [(where, image) for where, image in images if image.split(":", 1)[0] == KAFKA_IMAGE]
    report.check(bool(kafka), "compose and k8s run no apache/kafka image")
    for where, image in kafka:
        report.check(image == want, f"{where}: image must be {want} (the Kafka the tests run, {KAFKA_POM}), got {image}")


# --- the images built here (scripts/images, deploy/containers/local.yml) -------------------

#: compose's override that selects the images scripts/images builds on this machine.
LOCAL_COMPOSE = Path("deploy/containers/local.yml")
LOCAL_POSTGRES_DOCKERFILE = Path("deploy/containers/postgres/Dockerfile")
LOCAL_PREFIX = "sagaworks-local/"
#: compose services that have no local image, and why: Grafana's source is AGPL-3.0.
NO_LOCAL_IMAGE = {"grafana"}


def check_local_images(
    report: Report, compose: dict[str, Any], root: Path, local_compose: dict[str, Any] | None = None
) -> None:
    """deploy/containers/local.yml (or `local_compose`, parsed) gives every infrastructure
    service of compose a local image of the upstream image's release (PostgreSQL's major
    version, Kafka's, Jaeger's and the collector's version), never pulled; the services keep
    their own images."""
    if local_compose is None:
        path = root / LOCAL_COMPOSE
        if not report.check(path.is_file(), f"{LOCAL_COMPOSE} is missing"):
            return
        local_compose = yaml.safe_load(path.read_text()) or {}
    local = local_compose.get("services") or {}
    upstream = compose.get("services") or {}
    for name in sorted(set(local) - set(upstream)):
        report.check(False, f"{LOCAL_COMPOSE}: {name} is no service of docker-compose.yml")
    for name, spec in upstream.items():
        image = str(spec.get("image", ""))
        if name in NO_LOCAL_IMAGE:
            report.check(name not in local, f"{LOCAL_COMPOSE}: {name} has no image built here (AGPL-3.0 source)")
            report.check(bool(spec.get("profiles")), f"compose/{name}: must sit behind a profile (no image of it is built here)")
            continue
        override = local.get(name)
        if not report.check(override is not None, f"{LOCAL_COMPOSE}: no entry for compose's {name}"):
            continue
        report.check(override.get("pull_policy") == "never", f"{LOCAL_COMPOSE}/{name}: pull_policy must be never")
        if image.startswith("sagaworks/"):
            report.check("image" not in override, f"{LOCAL_COMPOSE}/{name}: keeps compose's image {image} (scripts/images builds it)")
            continue
        mine = str(override.get("image", ""))
        repository, _, tag = image.partition(":")
        local_repo, _, local_tag = mine.partition(":")
        report.check(mine.startswith(LOCAL_PREFIX), f"{LOCAL_COMPOSE}/{name}: image must be one of scripts/images' ({LOCAL_PREFIX}...), got {mine!r}")
        base = repository.rsplit("/", 1)[-1]
        if base == "postgres":
            major = tag.split("-", 1)[0].split(".", 1)[0]
            report.check(local_tag == major, f"{LOCAL_COMPOSE}/{name}: image must be {LOCAL_PREFIX}postgres:{major} (compose's {image}), got {mine}")
            dockerfile = (root / LOCAL_POSTGRES_DOCKERFILE).read_text()
            report.check(
                re.search(rf"^ARG PG_MAJOR={re.escape(major)}$", dockerfile, re.M) is not None,
                f"{LOCAL_POSTGRES_DOCKERFILE}: must install PostgreSQL {major} (ARG PG_MAJOR={major}), compose's {image}",
            )
        elif base in ("kafka", "jaeger"):
            report.check(mine == f"{LOCAL_PREFIX}{base}:{tag}", f"{LOCAL_COMPOSE}/{name}: image must be {LOCAL_PREFIX}{base}:{tag} (compose's {image}), got {mine}")
        elif repository == OTELCOL_IMAGE:
            report.check(mine == f"{LOCAL_PREFIX}otel-collector:{tag}", f"{LOCAL_COMPOSE}/{name}: image must be {LOCAL_PREFIX}otel-collector:{tag} (compose's {image}), got {mine}")
        else:
            # Debian's package (Prometheus): its own release, named by the Debian suite.
            report.check(local_repo == f"{LOCAL_PREFIX}{base}", f"{LOCAL_COMPOSE}/{name}: image must be {LOCAL_PREFIX}{base}:<suite>, got {mine}")


# --- Kafka's security: SASL_SSL, users, ACLs (deploy/kafka/) ------------------------------

KAFKA_DIR = Path("deploy/kafka")
#: The ACL file's stand-in for the topic prefix (the init step substitutes TOPIC_PREFIX).
ACL_PREFIX = "@PREFIX@"


def _kafka_acls_module(root: Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("kafka_acls", root / "scripts" / "lib" / "kafka_acls.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kafka_users(root: Path = ROOT) -> list[str]:
    """The SCRAM users besides admin: scripts/lib/kafka_acls.py's `users`."""
    module = _kafka_acls_module(root)
    return [s.name for s in module.backends(str(root / "services.toml"))]


def _env_ref(item: dict[str, Any]) -> tuple[str | None, str | None]:
    ref = (item.get("valueFrom") or {}).get("secretKeyRef") or {}
    return ref.get("name"), ref.get("key")


def check_kafka_security(
    report: Report, compose: dict[str, Any], k8s: dict[str, list[dict[str, Any]]], root: Path
) -> None:
    """compose and the dev overlay run Kafka like scripts/kafka's secure mode: the start
    script deploy/kafka/start.sh, a SCRAM user per backend with the password the backend
    uses, SASL_SSL clients, the ACLs of scripts/lib/kafka_acls.py applied by the init step."""
    users = kafka_users(root)
    # Its lines are scripts/lib/kafka_acls.py's for services.toml (scripts/generate --check).
    want_acls = (root / KAFKA_DIR / "acls.txt").read_text()
    start = (root / KAFKA_DIR / "start.sh").read_text()
    for setting in ("listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SSL",
                    "listener.name.controller.ssl.client.auth=required", "ssl.keystore.type=PEM",
                    "ssl.truststore.type=PEM", "allow.everyone.if.no.acl.found=false",
                    "super.users=User:admin;User:CN=kafka",
                    "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                    "--add-scram", "--ignore-formatted"):
        report.check(setting in start, f"{KAFKA_DIR / 'start.sh'}: no {setting}")

    # compose
    services = compose.get("services") or {}
    kafka, init = services.get("kafka") or {}, services.get("kafka-init") or {}
    env = _compose_env(kafka)
    entrypoint = kafka.get("entrypoint") or []
    entrypoint = entrypoint.split() if isinstance(entrypoint, str) else list(entrypoint)
    mounts = dict(_compose_mount(v) for v in kafka.get("volumes") or [])
    report.check(
        entrypoint[-1:] == ["/etc/sagaworks/kafka/start.sh"]
        and Path(mounts.get("/etc/sagaworks/kafka/start.sh", "")).as_posix().endswith(f"{KAFKA_DIR.as_posix()}/start.sh"),
        f"compose/kafka: must run {KAFKA_DIR / 'start.sh'}, mounted at /etc/sagaworks/kafka/start.sh",
    )
    report.check(
        sorted(env.get("SCRAM_USERS", "").split()) == sorted(users),
        f"compose/kafka: SCRAM_USERS must be the backends of services.toml {users}, got {env.get('SCRAM_USERS')!r}",
    )
    for name in ("ADMIN_KAFKA_PASSWORD", "TLS_CERT_FILE", "TLS_KEY_FILE", "TLS_CA_FILE"):
        report.check(bool(env.get(name)), f"compose/kafka: {name} is not set")
    test = " ".join(map(str, (kafka.get("healthcheck") or {}).get("test") or []))
    report.check("--command-config" in test, "compose/kafka: the healthcheck must authenticate (--command-config)")
    # The nodes' CA (the controller listener's only trusted CA, CN=kafka a super user) is not
    # the services' CA, and Kafka's clients verify the broker with it.
    kafka_ca = Path(mounts.get(env.get("TLS_CA_FILE", ""), "")).as_posix()
    report.check(bool(kafka_ca) and kafka_ca != ".", "compose/kafka: TLS_CA_FILE (the Kafka CA) must be mounted")
    for name, spec in services.items():
        senv, smounts = _compose_env(spec), dict(_compose_mount(v) for v in spec.get("volumes") or [])
        tls_ca = senv.get("APP_TLS__CA_FILE")
        if tls_ca and smounts.get(tls_ca):
            report.check(
                Path(smounts[tls_ca]).as_posix() != kafka_ca,
                f"compose/{name}: APP_TLS__CA_FILE is the Kafka nodes' CA ({kafka_ca}): the services' "
                "certificates must come from a CA apart from the one that issues CN=kafka",
            )
    ienv_ca = _compose_env(init).get("CA_FILE", "")
    report.check(
        Path(dict(_compose_mount(v) for v in init.get("volumes") or []).get(ienv_ca, "")).as_posix() == kafka_ca,
        f"compose/kafka-init: CA_FILE must be the broker's TLS_CA_FILE ({kafka_ca}), mounted",
    )
    for user in users:
        spec = services.get(user) or {}
        senv = _compose_env(spec)
        where = f"compose/{user}"
        report.check(senv.get("APP_KAFKA__SECURITY_PROTOCOL") == "sasl_ssl", f"{where}: APP_KAFKA__SECURITY_PROTOCOL must be sasl_ssl")
        report.check(senv.get("APP_KAFKA__SASL_USERNAME") == user, f"{where}: APP_KAFKA__SASL_USERNAME must be {user}")
        password = env.get(f"{user.upper()}_KAFKA_PASSWORD")
        report.check(
            bool(password) and senv.get("APP_KAFKA__SASL_PASSWORD") == password,
            f"{where}: APP_KAFKA__SASL_PASSWORD must be the broker's {user.upper()}_KAFKA_PASSWORD",
        )
        smounts = dict(_compose_mount(v) for v in spec.get("volumes") or [])
        report.check(
            Path(smounts.get(senv.get("APP_KAFKA__SSL_CA_FILE", ""), "")).as_posix() == kafka_ca,
            f"{where}: APP_KAFKA__SSL_CA_FILE must be the broker's TLS_CA_FILE, the Kafka CA ({kafka_ca}), mounted",
        )
    ienv = _compose_env(init)
    imounts = dict(_compose_mount(v) for v in init.get("volumes") or [])
    report.check(
        Path(imounts.get(ienv.get("ACL_FILE", ""), "")).as_posix().endswith(f"{KAFKA_DIR.as_posix()}/acls.txt"),
        f"compose/kafka-init: ACL_FILE must be {KAFKA_DIR / 'acls.txt'}, mounted",
    )
    report.check(
        ienv.get("ADMIN_KAFKA_PASSWORD") == env.get("ADMIN_KAFKA_PASSWORD"),
        "compose/kafka-init: ADMIN_KAFKA_PASSWORD must be the broker's",
    )
    script = " ".join(map(str, init.get("command") or []))
    for needle in ("kafka-acls.sh", "--command-config", "SASL_SSL"):
        report.check(needle in script, f"compose/kafka-init: the script has no {needle}")

    # the dev overlay
    docs = k8s.get("dev")
    if not docs:
        return
    configmaps = _by_kind(docs, "ConfigMap")
    for base, key, want in (("kafka-start", "start.sh", start), ("kafka-acls", "acls.txt", want_acls)):
        configmap = _configmap(docs, base)
        report.check(
            configmap is not None and (configmap.get("data") or {}).get(key) == want,
            f"dev: ConfigMap {base} key {key} differs from {KAFKA_DIR / key}",
        )
    statefulset = _by_kind(docs, "StatefulSet").get("kafka")
    if not report.check(statefulset is not None, "dev: no StatefulSet kafka"):
        return
    pod = statefulset["spec"]["template"]["spec"]
    container = next((c for c in pod.get("containers") or [] if c.get("name") == "kafka"), {})
    items = {e["name"]: e for e in container.get("env") or []}
    report.check(
        (container.get("command") or [])[-1:] == ["/etc/sagaworks/kafka/start.sh"]
        and any(m.get("mountPath") == "/etc/sagaworks/kafka" for m in container.get("volumeMounts") or []),
        "dev/StatefulSet/kafka: must run the ConfigMap kafka-start's start.sh (/etc/sagaworks/kafka/start.sh)",
    )
    report.check(
        sorted(str((items.get("SCRAM_USERS") or {}).get("value", "")).split()) == sorted(users),
        f"dev/StatefulSet/kafka: SCRAM_USERS must be the backends of services.toml {users}",
    )
    report.check(_env_ref(items.get("ADMIN_KAFKA_PASSWORD") or {})[0] is not None,
                 "dev/StatefulSet/kafka: ADMIN_KAFKA_PASSWORD must come from a Secret")
    deployments = _by_kind(docs, "Deployment")
    for user in users:
        where = f"dev/{user}"
        deployment = deployments.get(user)
        if deployment is None:
            continue  # reported by check_k8s
        main = deployment["spec"]["template"]["spec"]["containers"][0]
        senv, _ = _container_env(main, configmaps)
        report.check(senv.get("APP_KAFKA__SECURITY_PROTOCOL") == "sasl_ssl", f"{where}: APP_KAFKA__SECURITY_PROTOCOL must be sasl_ssl")
        report.check(senv.get("APP_KAFKA__SASL_USERNAME") == user, f"{where}: APP_KAFKA__SASL_USERNAME must be {user}")
        report.check(
            _mounted_secret_key(deployment["spec"]["template"]["spec"], main, senv.get("APP_KAFKA__SSL_CA_FILE", ""))
            == (_kafka_tls_secret(docs), "ca.crt"),
            f"{where}: APP_KAFKA__SSL_CA_FILE must be ca.crt (the Kafka CA) of the Secret of Certificate kafka, mounted",
        )
        theirs = _env_ref(next((e for e in main.get("env") or [] if e["name"] == "APP_KAFKA__SASL_PASSWORD"), {}))
        broker = _env_ref(items.get(f"{user.upper()}_KAFKA_PASSWORD") or {})
        report.check(
            theirs[0] is not None and theirs == broker,
            f"{where}: APP_KAFKA__SASL_PASSWORD must come from the Secret the broker's "
            f"{user.upper()}_KAFKA_PASSWORD comes from ({broker}), got {theirs}",
        )
    certificate = next((d for d in docs if d.get("kind") == "Certificate" and d["metadata"]["name"] == "kafka"), None)
    if report.check(certificate is not None, "dev: no Certificate kafka"):
        spec, namespace = certificate["spec"], certificate["metadata"].get("namespace", "default")
        names = set(spec.get("dnsNames") or [])
        want_names = {"kafka", f"kafka.{namespace}.svc", f"kafka-0.kafka-headless.{namespace}.svc", "localhost"}
        report.check(want_names <= names, f"dev/Certificate/kafka: dnsNames must include {sorted(want_names)}, got {sorted(names)}")
        report.check(spec.get("commonName") == "kafka", "dev/Certificate/kafka: commonName must be kafka (User:CN=kafka)")
        _check_kafka_issuer(report, docs, spec)
        report.check((spec.get("privateKey") or {}).get("encoding") == "PKCS8",
                     "dev/Certificate/kafka: the key must be PKCS8 (Kafka's PEM keystore)")
        report.check(
            any((v.get("secret") or {}).get("secretName") == spec.get("secretName") for v in pod.get("volumes") or []),
            f"dev/StatefulSet/kafka: must mount the Secret {spec.get('secretName')} of Certificate kafka",
        )


def _kafka_tls_secret(docs: list[dict[str, Any]]) -> str | None:
    """The Secret of the broker's Certificate `kafka`."""
    certificate = _by_kind(docs, "Certificate").get("kafka") or {}
    return (certificate.get("spec") or {}).get("secretName")


def _mounted_secret_key(pod: dict[str, Any], container: dict[str, Any], path: str) -> tuple[str | None, str | None]:
    """(Secret, key) that the file `path` of `container` is, through a Secret volume."""
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    for mount in container.get("volumeMounts") or []:
        prefix = str(mount.get("mountPath", "")).rstrip("/") + "/"
        if not path.startswith(prefix):
            continue
        secret = (volumes.get(mount.get("name")) or {}).get("secret") or {}
        relative = path[len(prefix):]
        items = secret.get("items")
        key = relative if items is None else next((i.get("key") for i in items if i.get("path") == relative), None)
        return secret.get("secretName"), key
    return None, None


def _check_kafka_issuer(report: Report, docs: list[dict[str, Any]], spec: dict[str, Any]) -> None:
    """The broker's Certificate comes from a CA Issuer of Kafka's own: not the Issuer of any
    service's Certificate, not the services' CA Secret, and issuing nothing but `kafka`
    (CN=kafka is a super user; its controller listener trusts that CA only)."""
    where = "dev/Certificate/kafka"
    issuers, certificates = _by_kind(docs, "Issuer"), _by_kind(docs, "Certificate")
    issuer_name = (spec.get("issuerRef") or {}).get("name")
    issuer = issuers.get(issuer_name)
    ca_secret = ((issuer or {}).get("spec") or {}).get("ca", {}).get("secretName") if issuer else None
    if not report.check(ca_secret is not None, f"{where}: issuerRef must name a CA Issuer of the overlay, got {issuer_name!r}"):
        return
    ca_certificate = next((c for c in certificates.values() if c["spec"].get("secretName") == ca_secret), None)
    report.check(
        ca_certificate is not None and ca_certificate["spec"].get("isCA") is True,
        f"{where}: the Issuer {issuer_name}'s Secret {ca_secret} must be an isCA Certificate of the overlay",
    )
    for name, other in certificates.items():
        if name == "kafka" or other["spec"].get("isCA"):
            continue
        other_issuer = (other["spec"].get("issuerRef") or {}).get("name")
        other_secret = (((issuers.get(other_issuer) or {}).get("spec") or {}).get("ca") or {}).get("secretName")
        report.check(
            other_issuer != issuer_name and other_secret != ca_secret,
            f"{where}: its Issuer {issuer_name} (CA {ca_secret}) also issues Certificate {name}: the Kafka "
            "nodes' CA must issue nothing else (CN=kafka is a super user of the broker)",
        )


def tested_releases(root: Path) -> dict[str, str]:
    """{"jaeger": "2.12.0", "otel-collector": "0.165"}: Jaeger's exact version, the
    collector's release (major.minor: the contrib image may carry a patch of its own)."""
    found: dict[str, str] = {}
    match = re.search(r"^SW_JAEGER_VERSION=([0-9][0-9.]*)$", (root / TRACING_LIB).read_text(), re.M)
    if match:
        found["jaeger"] = match.group(1)
    manifest = yaml.safe_load((root / OTELCOL_MANIFEST).read_text()) or {}
    version = str((manifest.get("dist") or {}).get("version", ""))
    if re.fullmatch(r"\d+\.\d+\.\d+", version):
        found["otel-collector"] = version.rsplit(".", 1)[0]
    return found


def _image_ok(name: str, image: str, releases: dict[str, str]) -> bool:
    if name == "jaeger":
        return image == f"{JAEGER_IMAGE}:{releases['jaeger']}"
    return re.fullmatch(re.escape(f"{OTELCOL_IMAGE}:{releases['otel-collector']}.") + r"\d+", image) is not None


def _compose_mount(volume: Any) -> tuple[str, str]:
    """(target, source) of a compose volume, in the short (`src:target[:mode]`) or the long
    syntax (docker-compose v1 renders the first, v2 the second)."""
    if isinstance(volume, dict):
        return str(volume.get("target", "")), str(volume.get("source", ""))
    source, _, rest = str(volume).partition(":")
    return rest.split(":", 1)[0], source


def check_telemetry_releases(
    report: Report, compose: dict[str, Any], k8s: dict[str, list[dict[str, Any]]], root: Path
) -> None:
    """compose's and the dev overlay's Jaeger and collector: the tested releases, each
    started on its committed config."""
    releases = tested_releases(root)
    if not report.check(
        set(releases) == set(TELEMETRY_CONFIGS),
        f"no SW_JAEGER_VERSION in {TRACING_LIB} or no dist.version x.y.z in {OTELCOL_MANIFEST}",
    ):
        return
    want = {"jaeger": f"{JAEGER_IMAGE}:{releases['jaeger']}",
            "otel-collector": f"{OTELCOL_IMAGE}:{releases['otel-collector']}.<patch>"}
    services = compose.get("services") or {}
    for name, (config, target) in TELEMETRY_CONFIGS.items():
        spec = services.get(name)
        if not report.check(spec is not None, f"compose: no service {name}"):
            continue
        image = str(spec.get("image", ""))
        report.check(_image_ok(name, image, releases), f"compose/{name}: image must be {want[name]} (the tested release), got {image}")
        command = spec.get("command") or []
        command = command.split() if isinstance(command, str) else command
        report.check(f"--config={target}" in command, f"compose/{name}: must run --config={target}")
        mounts = dict(_compose_mount(v) for v in spec.get("volumes") or [])
        report.check(
            Path(mounts.get(target, "")).as_posix().endswith(f"{OBSERVABILITY_DIR.as_posix()}/{config}"),
            f"compose/{name}: must mount {OBSERVABILITY_DIR / config} at {target}",
        )
    docs = k8s.get("dev")
    if not docs:
        return
    deployments = _by_kind(docs, "Deployment")
    for name, (config, target) in TELEMETRY_CONFIGS.items():
        workload = deployments.get(name)
        if not report.check(workload is not None, f"dev: no Deployment {name}"):
            continue
        pod = workload["spec"]["template"]["spec"]
        container = next((c for c in pod.get("containers") or [] if c.get("name") == name), None)
        if not report.check(container is not None, f"dev/Deployment/{name}: no container {name}"):
            continue
        image = str(container.get("image", ""))
        report.check(_image_ok(name, image, releases), f"dev/Deployment/{name}: image must be {want[name]} (the tested release), got {image}")
        report.check(
            f"--config={target}" in (container.get("args") or []) + (container.get("command") or []),
            f"dev/Deployment/{name}: must run --config={target}",
        )
        mount_dir = str(Path(target).parent)
        volume = next((m.get("name") for m in container.get("volumeMounts") or [] if m.get("mountPath") == mount_dir), None)
        source = next((v for v in pod.get("volumes") or [] if v.get("name") == volume), {}) if volume else {}
        configmap = str((source.get("configMap") or {}).get("name", ""))
        base = next((b for b, keys in COPY_CONFIGMAPS.items() if keys.get(Path(target).name) == config), None)
        report.check(
            base is not None and _base_name(configmap, [base]) == base,
            f"dev/Deployment/{name}: must mount the ConfigMap of {OBSERVABILITY_DIR / config} at {mount_dir}",
        )


# --- the CI pipelines (.github/workflows/) ---------------------------------------------------

WORKFLOWS_DIR = Path(".github/workflows")
#: The reusable pipeline every service's workflow calls.
SERVICE_PIPELINE = "service-pipeline.yml"
#: The workflows that are no service's: the reusable ones, the libraries', the release.
RUST_TESTS = "rust-tests.yml"
ADVISORIES = "advisories.yml"
RELEASE = "release.yml"
SHARED_WORKFLOWS = (SERVICE_PIPELINE, RUST_TESTS, "libs.yml", RELEASE, ADVISORIES)
#: What a job's `if:` may not call: each runs the job although a job it needs failed.
_BYPASSING_STATUS = ("always()", "failure()", "cancelled()")


def _workflow_triggers(doc: dict[str, Any]) -> dict[str, Any]:
    # YAML 1.1 (PyYAML) reads the key `on` as the boolean true.
    triggers = doc.get("on", doc.get(True))
    return triggers if isinstance(triggers, dict) else {}


def _pipeline_calls(doc: dict[str, Any]) -> list[tuple[str, Any]]:
    """(job id, its `with.service`) of every job that calls service-pipeline.yml."""
    jobs = doc.get("jobs") if isinstance(doc.get("jobs"), dict) else {}
    return [
        (job_id, (job.get("with") or {}).get("service"))
        for job_id, job in jobs.items()
        if isinstance(job, dict) and job.get("uses") == f"./{WORKFLOWS_DIR}/{SERVICE_PIPELINE}"
    ]


def check_workflows(report: Report, root: Path, services: Iterable[str] | None = None) -> None:
    """Every service of services.toml has its workflow `<service>.yml` (as scripts/new-service
    renders deploy/template/workflow.yml): named after it, run on pushes to main and on pull
    requests that touch services/<service>/, calling service-pipeline.yml with its name; every
    other workflow is one of SHARED_WORKFLOWS, and no workflow passes service-pipeline.yml a
    service that services.toml does not name."""
    names = list(SPECS if services is None else services)
    directory = root / WORKFLOWS_DIR
    if not report.check(directory.is_dir(), f"{WORKFLOWS_DIR} is missing"):
        return
    for shared in SHARED_WORKFLOWS:
        report.check((directory / shared).is_file(), f"{WORKFLOWS_DIR / shared} is missing")
    for name in names:
        report.check(
            f"{name}.yml" not in SHARED_WORKFLOWS,
            f"{name}: its workflow would be {WORKFLOWS_DIR / (name + '.yml')}, a shared workflow: rename the service",
        )
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.iterdir()):
        if path.suffix not in (".yml", ".yaml") or not path.is_file():
            continue
        rel = WORKFLOWS_DIR / path.name
        try:
            doc = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            report.check(False, f"{rel}: not YAML ({e})")
            continue
        if not report.check(isinstance(doc, dict), f"{rel}: not a workflow (a mapping)"):
            continue
        docs[path.name] = doc
        if path.name not in SHARED_WORKFLOWS:
            report.check(
                path.suffix == ".yml" and path.stem in names,
                f"{rel} names a service that does not exist: services.toml has no {path.stem!r} "
                f"(remove the workflow with the service; name it <service>.yml; or, if it is no service's, "
                f"list it in SHARED_WORKFLOWS of deploy/consistency.py)",
            )
        for job_id, service in _pipeline_calls(doc):
            if isinstance(service, str) and "${{" not in service:
                report.check(
                    service in names,
                    f"{rel}: job {job_id} runs the pipeline of {service!r}, which services.toml does not name",
                )
    for name in names:
        rel = WORKFLOWS_DIR / f"{name}.yml"
        doc = docs.get(f"{name}.yml")
        if not report.check(
            doc is not None, f"{name}: no workflow {rel} (scripts/new-service renders deploy/template/workflow.yml)"
        ):
            continue
        report.check(doc.get("name") == name, f"{rel}: its name must be {name!r}, got {doc.get('name')!r}")
        triggers = _workflow_triggers(doc)
        for event in ("push", "pull_request"):
            spec = triggers.get(event) if isinstance(triggers.get(event), dict) else {}
            report.check(
                f"services/{name}/**" in (spec.get("paths") or []),
                f"{rel}: on.{event}.paths must include services/{name}/**",
            )
        push = triggers.get("push") if isinstance(triggers.get("push"), dict) else {}
        report.check("main" in (push.get("branches") or []), f"{rel}: on.push.branches must include main")
        calls = _pipeline_calls(doc)
        report.check(
            [service for _, service in calls] == [name],
            f"{rel}: must call {WORKFLOWS_DIR / SERVICE_PIPELINE} once, with service: {name} (got {calls})",
        )
    check_release_gates(report, root)


def _needs(job: dict[str, Any]) -> list[str]:
    needs = job.get("needs") or []
    return [needs] if isinstance(needs, str) else [n for n in needs if isinstance(n, str)]


def _writes(job: dict[str, Any]) -> list[str]:
    """The write permissions a job asks for (an empty list: it can publish nothing)."""
    permissions = job.get("permissions")
    if permissions == "write-all":
        return ["write-all"]
    if not isinstance(permissions, dict):
        return []
    return sorted(f"{scope}: write" for scope, level in permissions.items() if level == "write")


def check_release_gates(report: Report, root: Path) -> None:
    """release.yml pushes and publishes nothing before the tests and the advisory check pass:
    it has a job calling rust-tests.yml and one calling advisories.yml, and every job that asks
    for a write permission needs both (directly, or through the jobs it needs) and runs only
    when they succeeded (no always(), failure() or cancelled() in its `if:`). advisories.yml
    runs `scripts/advisories --online`, when called and every day."""
    rel = WORKFLOWS_DIR / RELEASE
    try:
        doc = yaml.safe_load((root / rel).read_text())
    except (OSError, yaml.YAMLError) as e:
        report.check(False, f"{rel}: cannot read it ({e})")
        return
    jobs = doc.get("jobs") if isinstance(doc, dict) and isinstance(doc.get("jobs"), dict) else {}
    jobs = {job_id: job for job_id, job in jobs.items() if isinstance(job, dict)}
    gates = {
        workflow: {job_id for job_id, job in jobs.items() if job.get("uses") == f"./{WORKFLOWS_DIR}/{workflow}"}
        for workflow in (RUST_TESTS, ADVISORIES)
    }
    for workflow, ids in gates.items():
        report.check(bool(ids), f"{rel}: no job calls {WORKFLOWS_DIR / workflow}, so nothing holds the release back on it")

    def upstream(job_id: str) -> set[str]:
        seen: set[str] = set()
        todo = list(_needs(jobs.get(job_id, {})))
        while todo:
            need = todo.pop()
            if need not in seen:
                seen.add(need)
                todo.extend(_needs(jobs.get(need, {})))
        return seen

    for job_id, job in jobs.items():
        writes = _writes(job)
        if not writes or any(job_id in ids for ids in gates.values()):
            continue
        before = upstream(job_id)
        for workflow, ids in gates.items():
            if ids:
                report.check(
                    bool(before & ids),
                    f"{rel}: job {job_id} ({', '.join(writes)}) does not need the job calling "
                    f"{WORKFLOWS_DIR / workflow} ({', '.join(sorted(ids))}): it would publish after a red check",
                )
        condition = str(job.get("if", ""))
        report.check(
            not any(status in condition.replace(" ", "") for status in _BYPASSING_STATUS),
            f"{rel}: job {job_id} ({', '.join(writes)}) runs on `if: {condition}`, also when a job it needs failed",
        )

    rel = WORKFLOWS_DIR / ADVISORIES
    try:
        doc = yaml.safe_load((root / rel).read_text())
    except (OSError, yaml.YAMLError) as e:
        report.check(False, f"{rel}: cannot read it ({e})")
        return
    triggers = _workflow_triggers(doc) if isinstance(doc, dict) else {}
    for event in ("workflow_call", "schedule"):
        report.check(event in triggers, f"{rel}: must run on {event}")
    runs = [
        step.get("run", "")
        for job in ((doc or {}).get("jobs") or {}).values() if isinstance(job, dict)
        for step in (job.get("steps") or []) if isinstance(step, dict)
    ]
    report.check(
        any("scripts/advisories --online" in str(run) for run in runs),
        f"{rel}: no step runs scripts/advisories --online",
    )


def check_all(
    keys: dict[str, set[str]],
    compose: dict[str, Any],
    k8s: dict[str, list[dict[str, Any]]],
    root: Path = ROOT,
) -> Report:
    """Every check, on already-parsed documents (`k8s` maps an overlay label to its
    resources); `root` is the repository the copies are compared in."""
    report = Report()
    found = {"compose": check_compose(report, compose, keys)}
    for label, docs in k8s.items():
        if report.check(bool(docs), f"{label}: the rendering holds no resources"):
            found[label] = check_k8s(report, label, docs, keys)
            check_workloads(report, label, docs)
            check_service_pods(report, label, docs)
            check_ingress(report, label, docs)
            check_rendered_copies(report, label, docs, root)
            check_prometheus_variant(report, label, docs, root)
            check_topics_job(report, label, docs)
    check_telemetry_releases(report, compose, k8s, root)
    check_kafka_release(report, compose, k8s, root)
    check_local_images(report, compose, root)
    check_kafka_security(report, compose, k8s, root)
    check_repositories_agree(report, found)
    check_workflows(report, root)
    return report


def run(keys_path: Path, compose_path: Path, k8s: dict[str, Path]) -> Report:
    compose = yaml.safe_load(compose_path.read_text()) or {}
    return check_all(load_keys(keys_path), compose, {label: load_yaml_docs(path) for label, path in k8s.items()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=Path, required=True, help="deploy/config-keys.txt")
    parser.add_argument("--compose", type=Path, required=True, help="output of `docker-compose config`")
    parser.add_argument("--k8s", action="append", default=[], metavar="LABEL=FILE",
                        help="output of `kubectl kustomize <overlay>`; repeatable")
    args = parser.parse_args(argv)
    k8s: dict[str, Path] = {}
    for item in args.k8s:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            parser.error(f"--k8s expects LABEL=FILE, got {item!r}")
        k8s[label] = Path(path)
    report = run(args.keys, args.compose, k8s)
    for failure in report.failures:
        print(f"FAIL {failure}", file=sys.stderr)
    print(f"consistency: {report.passed} passed, {len(report.failures)} failed")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
