"""The values templates use, computed from services.toml (scripts/lib/services_toml.py).

Per service (`for each service`/`for each backend` regions and the per-service files):
its fields and what follows from the other entries (who calls it). For `once` regions:
lists over all services.
"""

from __future__ import annotations

import kafka_acls
from services_toml import Service, backends

from .engine import Context


def service_context(s: Service, services: dict[str, Service]) -> Context:
    grpc = {n: o.ports.grpc for n, o in services.items() if o.ports.grpc is not None}
    callers = [o.name for o in services.values() if s.name in o.calls]
    db = s.database
    return {
        "name": s.name, "Name": s.name[:1].upper() + s.name[1:], "NAME": s.name.upper(), "kind": s.kind,
        "is_backend": s.kind == "backend", "http_port": str(s.ports.http),
        "grpc_port": str(s.ports.grpc) if s.ports.grpc is not None else "-",
        "role": db.role if db else "-", "db": f"sagaworks_{db.suffix}" if db else "-",
        "calls": list(s.calls), "calls_text": " and ".join(s.calls) or "nothing",
        "callers": callers, "callers_text": " and ".join(callers) or "nothing",
        "callers_words": " ".join(callers),
        "url_key": f"APP_{s.name.upper()}__URL".ljust(36),
        "client_urls": [f"- APP_{c.upper()}__URL=https://{c}:{grpc[c]}" for c in s.calls],
        "compose_client_urls": [f"APP_{c.upper()}__URL: https://{c}:{grpc[c]}" for c in s.calls],
        "compose_depends": [line for c in s.calls for line in (f"{c}:", "  condition: service_healthy")],
        "egress_to_callees": [
            line for c in s.calls for line in (
                "- to:", "    - podSelector:", "        matchLabels:", f"          app.kubernetes.io/name: {c}",
                "  ports:", "    - protocol: TCP", f"      port: {grpc[c]}")
        ],
        "ingress_from_callers": [
            line for c in callers for line in (
                "- podSelector:", "    matchLabels:", f"      app.kubernetes.io/name: {c}")
        ],
    }


def global_context(services: dict[str, Service]) -> Context:
    names = list(services)
    backend_names = [s.name for s in backends(services)]
    return {
        "service_names": " ".join(names), "service_names_comma": ",".join(names),
        "backend_names": " ".join(backend_names), "backend_names_comma": ",".join(backend_names),
        "topics": " ".join(t for s in backends(services) for t in s.topics),
        "design_rows": [_design_row(s) for s in services.values()],
        "kafka_acls": kafka_acls.acls(backends(services), "@PREFIX@"),
    }


def _design_row(s: Service) -> str:
    """docs/design.md's row of a service."""
    if s.database is None:
        return f"| {s.name} | - | {s.ports.http} | - | - |"
    return (f"| {s.name} | {s.ports.grpc} | {s.ports.http} | `sagaworks_{s.database.suffix}` | "
            f"`{s.database.role}` |")
