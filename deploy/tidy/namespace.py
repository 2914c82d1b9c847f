"""each overlay: a default-deny NetworkPolicy for the namespace; prod commits no Secret."""

from __future__ import annotations

from typing import Any

from tidy.common import Context, Report, _by_kind, each_overlay


def check_namespace(report: Report, label: str, docs: list[dict[str, Any]]) -> None:
    report.check(
        any(
            p["spec"].get("podSelector") == {} and set(p["spec"].get("policyTypes", [])) >= {"Ingress", "Egress"}
            and not p["spec"].get("ingress") and not p["spec"].get("egress")
            for p in _by_kind(docs, "NetworkPolicy").values()
        ),
        f"{label}: no default-deny NetworkPolicy",
    )
    if label == "prod":
        secrets = list(_by_kind(docs, "Secret"))
        report.check(not secrets, f"{label}: Secrets must come from outside the repository, found {secrets}")


def check(ctx: Context) -> list[str]:
    return each_overlay(ctx, check_namespace)
