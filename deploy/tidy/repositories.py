"""compose and the overlays name the same image repositories per service."""

from __future__ import annotations

from tidy.common import Context, Report, SERVICES
from tidy.compose import check_compose
from tidy.k8s_services import check_k8s


def check_repositories_agree(report: Report, found: dict[str, dict[str, str]]) -> None:
    for service in SERVICES:
        repos = {where: by_service[service] for where, by_service in found.items() if service in by_service}
        report.check(
            len(set(repos.values())) == 1 and len(repos) == len(found),
            f"{service}: image repository differs between {sorted(found)}: {repos}",
        )


def check(ctx: Context) -> list[str]:
    found = {"compose": check_compose(Report(), ctx.compose, ctx.keys)}
    for label, docs in ctx.k8s.items():
        found[label] = check_k8s(Report(), label, docs, ctx.keys)
    r = Report()
    check_repositories_agree(r, found)
    return r.failures
