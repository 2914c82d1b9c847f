"""docker-compose.yml (rendered): the internal network, and what is published: only the
gateway's and the telemetry UIs' ports, on 127.0.0.1, from the edge network."""

from __future__ import annotations

from typing import Any

from tidy.common import Context, EDGE_SERVICES, PUBLISHED_ALLOWED, Report, _compose_networks, _compose_ports


def check_compose(report: Report, compose: dict[str, Any]) -> None:
    services: dict[str, Any] = compose.get("services") or {}
    networks: dict[str, Any] = compose.get("networks") or {}
    report.check(
        (networks.get("internal") or {}).get("internal") is True,
        "compose: network `internal` must have internal: true",
    )
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


def check(ctx: Context) -> list[str]:
    r = Report()
    check_compose(r, ctx.compose)
    return r.failures
