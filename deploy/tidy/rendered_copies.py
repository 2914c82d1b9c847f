"""the dev overlay's ConfigMaps carry deploy/observability/'s files unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tidy.common import COPY_CONFIGMAPS, Context, OBSERVABILITY_DIR, Report, _configmap, each_overlay


def check_rendered_copies(report: Report, label: str, docs: list[dict[str, Any]], root: Path) -> None:
    """The dev overlay's ConfigMaps carry the compose stack's observability files unchanged."""
    if label != "dev":
        return
    originals = root / OBSERVABILITY_DIR
    dashboards = sorted((originals / "grafana" / "dashboards").glob("*.json"))
    for base, keys in COPY_CONFIGMAPS.items():
        configmap = _configmap(docs, base)
        if not report.check(configmap is not None, f"{label}: ConfigMap {base} is not rendered"):
            continue
        data = configmap.get("data") or {}
        if base == "grafana-dashboards":
            keys = {f.name: str(f.relative_to(originals)) for f in dashboards}
            report.check(
                set(data) == set(keys),
                f"{label}: ConfigMap {base} holds {sorted(data)}, deploy/observability has {sorted(keys)}",
            )
        for key, rel in keys.items():
            report.check(
                data.get(key) == (originals / rel).read_text(),
                f"{label}: ConfigMap {base} key {key} differs from {OBSERVABILITY_DIR / rel}",
            )


def check(ctx: Context) -> list[str]:
    return each_overlay(ctx, check_rendered_copies, ctx.root)
