#!/usr/bin/env python3
"""Cross-checks docker-compose.yml and the rendered k8s overlays against one another and
against the service contract in docs/design.md.

Usage (scripts/validate-deploy runs it):

    consistency.py --keys deploy/config-keys.txt --compose <docker-compose config output> \
        --k8s dev=<kubectl kustomize k8s/overlays/dev output> --k8s prod=<...>

What it asserts, per service (gateway, order, inventory, payment):

* the image is `sagaworks/<service>:<tag>` everywhere, built from deploy/Dockerfile with
  SERVICE=<service>, and the repository is the same in compose and every overlay;
* the ports are those of the design table (HTTP 8080..8083, gRPC 50051..50053), in the
  APP_*__PORT settings, the container ports and the k8s Services; gRPC URLs point at them;
* every APP_* variable is listed in config-keys.txt for that service (other variables:
  only those in EXTRA_ENV); servers bind 0.0.0.0;
* compose publishes only the gateway's 8080 and the UIs of Jaeger (16686), Prometheus
  (9090) and Grafana (3000), never a gRPC port, and keeps everything else on the
  `internal: true` network;
* k8s probes hit the HTTP port (readiness /health/ready, liveness /health/live), the
  containers carry the restricted security context, every service has an HPA, a PDB and
  a NetworkPolicy whose gRPC ingress admits exactly the expected callers, and the prod
  overlay carries no Secret.

Needs python3 and PyYAML. Exit status 0 if every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlsplit

import yaml


@dataclass(frozen=True)
class ServicePorts:
    http: int
    grpc: int | None


#: docs/design.md, "Services, ports, config".
SERVICES: dict[str, ServicePorts] = {
    "gateway": ServicePorts(http=8080, grpc=None),
    "order": ServicePorts(http=8081, grpc=50051),
    "inventory": ServicePorts(http=8082, grpc=50052),
    "payment": ServicePorts(http=8083, grpc=50053),
}
#: Which services may call a service's gRPC port.
GRPC_CALLERS: dict[str, set[str]] = {
    "order": {"gateway"},
    "inventory": {"order", "gateway"},
    "payment": {"order", "gateway"},
}
#: `<service>.url` settings a service has, keyed by the service they point at.
CLIENT_URLS: dict[str, tuple[str, ...]] = {
    "gateway": ("order", "inventory", "payment"),
    "order": ("inventory", "payment"),
    "inventory": (),
    "payment": (),
}
#: Compose ports that may be published on the host: (service, container port).
PUBLISHED_ALLOWED = {("gateway", 8080), ("jaeger", 16686), ("prometheus", 9090), ("grafana", 3000)}
#: Compose services on the `edge` network: those that publish a port.
EDGE_SERVICES = {service for service, _ in PUBLISHED_ALLOWED}
#: Variables outside the APP_* namespace that the deployment files may set.
EXTRA_ENV = {"OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_ENDPOINT", "RUST_LOG"}
IMAGE_RE = re.compile(r"^(?P<repo>sagaworks/(?P<service>[a-z][a-z0-9-]*)):(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127})$")
DOCKERFILE = "deploy/Dockerfile"
UID = 10001


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
    """Parses config-keys.txt into {env name: services that read it}."""
    keys: dict[str, set[str]] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, *services = line.split()
        unknown = set(services) - SERVICES.keys()
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
            _port_of_url(url) == want and urlsplit(url).hostname == target,
            f"{where}: {name} must be http://{target}:{want}, got {url!r}",
        )
    if service == "gateway":
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


def _admitted(
    policies: Iterable[dict[str, Any]], pod_labels: dict[str, str], container: dict[str, Any], port: int
) -> set[str] | None:
    """App names that the policies selecting this pod admit to `port`; None = anyone."""
    callers: set[str] = set()
    for policy in policies:
        spec = policy["spec"]
        if not _selects(spec.get("podSelector") or {}, pod_labels):
            continue
        for rule in spec.get("ingress") or []:
            rule_ports = [_resolve_port(p.get("port"), container) for p in rule.get("ports") or []]
            if rule_ports and port not in rule_ports:
                continue
            peers = rule.get("from")
            if not peers:
                return None
            for peer in peers:
                labels = (peer.get("podSelector") or {}).get("matchLabels") or {}
                if "namespaceSelector" in peer or "ipBlock" in peer or "app.kubernetes.io/name" not in labels:
                    return None
                callers.add(labels["app.kubernetes.io/name"])
    return callers


def check_k8s(report: Report, label: str, docs: list[dict[str, Any]], keys: dict[str, set[str]]) -> dict[str, str]:
    """Returns {service: image repository} as found in this rendering."""
    deployments = _by_kind(docs, "Deployment")
    configmaps = _by_kind(docs, "ConfigMap")
    services = _by_kind(docs, "Service")
    hpas = _by_kind(docs, "HorizontalPodAutoscaler")
    pdbs = _by_kind(docs, "PodDisruptionBudget")
    policies = list(_by_kind(docs, "NetworkPolicy").values())
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
            callers = _admitted(policies, pod_labels, container, ports.grpc)
            report.check(
                callers == GRPC_CALLERS[service],
                f"{where}: gRPC ingress must admit exactly {sorted(GRPC_CALLERS[service])}, admits "
                f"{'anyone' if callers is None else sorted(callers)}",
            )
        else:
            report.check(
                _admitted(policies, pod_labels, container, ports.http) is None,
                f"{where}: the gateway's HTTP port must be reachable from anywhere",
            )
    return repos


def check_repositories_agree(report: Report, found: dict[str, dict[str, str]]) -> None:
    for service in SERVICES:
        repos = {where: by_service[service] for where, by_service in found.items() if service in by_service}
        report.check(
            len(set(repos.values())) == 1 and len(repos) == len(found),
            f"{service}: image repository differs between {sorted(found)}: {repos}",
        )


def check_all(keys: dict[str, set[str]], compose: dict[str, Any], k8s: dict[str, list[dict[str, Any]]]) -> Report:
    """Every check, on already-parsed documents (`k8s` maps an overlay label to its resources)."""
    report = Report()
    found = {"compose": check_compose(report, compose, keys)}
    for label, docs in k8s.items():
        if report.check(bool(docs), f"{label}: the rendering holds no resources"):
            found[label] = check_k8s(report, label, docs, keys)
    check_repositories_agree(report, found)
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
