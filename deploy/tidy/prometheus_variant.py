"""the dev overlay's prometheus.yml: the compose one's global settings and rule files (its
scrape jobs, one per service, are scripts/generate's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tidy.common import Context, OBSERVABILITY_DIR, Report, _configmap, each_overlay


def check_prometheus_variant(report: Report, label: str, docs: list[dict[str, Any]], root: Path) -> None:
    if label != "dev":
        return
    configmap = _configmap(docs, "prometheus-config")
    if configmap is None:
        return  # reported by check_rendered_copies
    k8s = yaml.safe_load((configmap.get("data") or {}).get("prometheus.yml", "")) or {}
    compose = yaml.safe_load((root / OBSERVABILITY_DIR / "prometheus" / "prometheus.yml").read_text()) or {}
    for key in ("global", "rule_files"):
        report.check(k8s.get(key) == compose.get(key), f"{label}: prometheus.yml: {key} differs from the compose config")


def check(ctx: Context) -> list[str]:
    return each_overlay(ctx, check_prometheus_variant, ctx.root)
