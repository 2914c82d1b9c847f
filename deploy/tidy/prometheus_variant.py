"""the dev overlay's prometheus.yml: the compose one with Kubernetes service discovery."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tidy.common import (
    Context, OBSERVABILITY_DIR, Report, SERVICES, _by_kind, _configmap, _pod_template_labels, _selects,
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


def check(ctx: Context) -> list[str]:
    r = Report()
    for label, docs in ctx.k8s.items():
        check_prometheus_variant(r, label, docs, ctx.root)
    return r.failures
