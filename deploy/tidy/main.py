#!/usr/bin/env python3
"""The deployment checks, one module each (in the way of rust-lang/rust's src/tools/tidy):
each `deploy/tidy/<check>.py` has `check(ctx) -> list[str]`, the problems it found in the
rendered compose file and overlays (common.Context). What scripts/generate writes from
services.toml is checked by `scripts/generate --check`, not here.

    python3 deploy/tidy/main.py --compose <docker-compose config> \\
        --k8s dev=<kubectl kustomize k8s/overlays/dev> --k8s prod=<...>

scripts/validate-deploy runs it. Needs python3 and PyYAML. Exit status 0 if no check found
a problem, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tidy import (  # noqa: E402
    compose, ingress, kafka_release, kafka_security, local_images, namespace, prometheus_variant,
    rendered_copies, service_pods, telemetry_releases, topics_job, workflows, workloads,
)
from tidy.common import ROOT, Context, load_yaml_docs  # noqa: E402

#: Every check, in the order they run.
CHECKS: tuple[ModuleType, ...] = (
    compose, namespace, workloads, service_pods, ingress, rendered_copies, prometheus_variant, topics_job,
    telemetry_releases, kafka_release, local_images, kafka_security, workflows,
)


def check_all(compose_doc: dict[str, Any], k8s: dict[str, list[dict[str, Any]]], root: Path = ROOT) -> list[str]:
    """Every check's problems, each prefixed with nothing but its own text."""
    empty = [f"{label}: the rendering holds no resources" for label, docs in k8s.items() if not docs]
    ctx = Context(compose=compose_doc, k8s={label: docs for label, docs in k8s.items() if docs}, root=root)
    return empty + [problem for check in CHECKS for problem in check.check(ctx)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compose", type=Path, required=True, help="output of `docker-compose config`")
    parser.add_argument("--k8s", action="append", default=[], metavar="LABEL=FILE",
                        help="output of `kubectl kustomize <overlay>`; repeatable")
    args = parser.parse_args(argv)
    k8s: dict[str, list[dict[str, Any]]] = {}
    for item in args.k8s:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            parser.error(f"--k8s expects LABEL=FILE, got {item!r}")
        k8s[label] = load_yaml_docs(Path(path))
    problems = check_all(yaml.safe_load(args.compose.read_text()) or {}, k8s)
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    print(f"tidy: {len(CHECKS)} checks, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
