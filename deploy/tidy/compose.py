"""docker-compose.yml (rendered): every service's image, build, ports, networks, env keys
(deploy/config-keys.txt), client URLs, database URLs and roles, healthchecks."""

from __future__ import annotations

from typing import Any

from tidy.common import (
    BACKENDS, Context, DOCKERFILE, EDGE_SERVICES, IMAGE_RE, PUBLISHED_ALLOWED, Report, SERVICES,
    _compose_env, _compose_networks, _compose_ports, check_database_roles, check_env,
)


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


def check(ctx: Context) -> list[str]:
    r = Report()
    check_compose(r, ctx.compose, ctx.keys)
    return r.failures
