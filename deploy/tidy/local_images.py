"""deploy/containers/local.yml: each image built here is the release compose pulls."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tidy.common import Context, OTELCOL_IMAGE, Report


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


def check(ctx: Context) -> list[str]:
    r = Report()
    check_local_images(r, ctx.compose, ctx.root)
    return r.failures
