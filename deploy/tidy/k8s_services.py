"""each overlay's services: images, ports, ConfigMap keys (deploy/config-keys.txt), client
URLs, database URLs and roles, and the NetworkPolicies evaluated: who reaches which port."""

from __future__ import annotations

import base64
import binascii
from typing import Any, Iterable

from tidy.common import (
    BACKENDS, Context, GRPC_CALLERS, IMAGE_RE, Report, SERVICES, UID, _by_kind, _container_env, _peers,
    _pod_template_labels, _resolve_port, _workloads, check_database_roles, check_env,
)


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


def check(ctx: Context) -> list[str]:
    r = Report()
    for label, docs in ctx.k8s.items():
        check_k8s(r, label, docs, ctx.keys)
    return r.failures
