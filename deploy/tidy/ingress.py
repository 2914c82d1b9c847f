"""prod's Ingress: only the gateway's public paths."""

from __future__ import annotations

from typing import Any

from tidy.common import (
    Context, NEVER_PUBLIC, PUBLIC_PATHS, Report, SERVICES, _by_kind, _peers, _pod_template_labels,
    _workloads, each_overlay,
)


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


def check(ctx: Context) -> list[str]:
    return each_overlay(ctx, check_ingress)
