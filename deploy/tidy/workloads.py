"""every workload of each overlay: probes, resources, the restricted security context, a
PodDisruptionBudget and NetworkPolicy ports."""

from __future__ import annotations

from typing import Any

from tidy.common import (
    CLOSED_PORTS, Context, DEV_INGRESS, OUTSIDE_ALLOWED, Report, _by_kind, _peers, _pod_template_labels,
    _selects, _workloads, each_overlay,
)


def _restricted_problems(container: dict[str, Any], pod: dict[str, Any]) -> list[str]:
    """What keeps a container from the "restricted" Pod Security Standard."""
    ctx = container.get("securityContext") or {}
    pod_ctx = pod.get("securityContext") or {}
    problems = []
    if ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) is not True:
        problems.append("runAsNonRoot is not true")
    if ctx.get("runAsUser", pod_ctx.get("runAsUser")) in (0, None):
        problems.append("no non-zero runAsUser")
    if ctx.get("allowPrivilegeEscalation") is not False:
        problems.append("allowPrivilegeEscalation is not false")
    caps = ctx.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []) or set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
        problems.append(f"capabilities must drop ALL and add nothing: {caps}")
    if ctx.get("privileged"):
        problems.append("privileged")
    seccomp = (ctx.get("seccompProfile") or pod_ctx.get("seccompProfile") or {}).get("type")
    if seccomp not in ("RuntimeDefault", "Localhost"):
        problems.append(f"seccompProfile is {seccomp}, not RuntimeDefault")
    return problems


def _resources_ok(container: dict[str, Any]) -> bool:
    resources = container.get("resources") or {}
    return {"cpu", "memory"} <= set(resources.get("requests") or {}) and "memory" in (resources.get("limits") or {})


def check_workloads(report: Report, label: str, docs: list[dict[str, Any]]) -> None:
    """What every Deployment, StatefulSet and Job must have, whatever it runs."""
    policies = list(_by_kind(docs, "NetworkPolicy").values())
    pdbs = list(_by_kind(docs, "PodDisruptionBudget").values())
    workloads = _workloads(docs)
    all_pods = [_pod_template_labels(w) for w in workloads]
    report.check(bool(workloads), f"{label}: no workload rendered")
    for workload in workloads:
        kind, name = workload["kind"], workload["metadata"]["name"]
        where = f"{label}/{kind}/{name}"
        template = workload["spec"]["template"]
        pod = template["spec"]
        labels = template.get("metadata", {}).get("labels") or {}
        containers = pod.get("containers") or []
        inits = pod.get("initContainers") or []
        for container in containers + inits:
            cwhere = f"{where}: container {container.get('name')}"
            report.check(_resources_ok(container), f"{cwhere} needs cpu+memory requests and a memory limit")
            for problem in _restricted_problems(container, pod):
                report.check(False, f"{cwhere}: not the restricted Pod Security profile: {problem}")
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            report.check(not pod.get(key), f"{where}: {key} breaks the restricted profile")
        for volume in pod.get("volumes") or []:
            report.check("hostPath" not in volume, f"{where}: hostPath volume {volume.get('name')}")
        if kind != "Job":
            for container in containers:
                for probe in ("readinessProbe", "livenessProbe"):
                    report.check(
                        bool(container.get(probe)), f"{where}: container {container.get('name')} has no {probe}"
                    )
            report.check(
                any(_selects(pdb["spec"].get("selector") or {}, labels) for pdb in pdbs),
                f"{where}: no PodDisruptionBudget selects its pods",
            )
        # NetworkPolicy: a policy of its own (not only the namespace-wide ones), and every
        # declared port admitted by some policy, or closed on purpose and really closed.
        report.check(
            any(
                (p["spec"].get("podSelector") or {}) != {} and _selects(p["spec"].get("podSelector") or {}, labels)
                for p in policies
            ),
            f"{where}: no NetworkPolicy selects its pods (beyond the namespace-wide ones)",
        )
        declared = {
            port.get("name"): int(port["containerPort"])
            for container in containers + inits
            for port in container.get("ports") or []
        }
        closed_names = {
            n.strip() for n in (template.get("metadata", {}).get("annotations") or {}).get(CLOSED_PORTS, "").split(",")
            if n.strip()
        }
        for unknown in sorted(closed_names - set(declared)):
            report.check(False, f"{where}: {CLOSED_PORTS} names {unknown!r}, which is no declared port")
        for port_name, number in sorted(declared.items(), key=lambda item: item[1]):
            peers = _peers(policies, labels, pod, number, all_pods)
            if port_name in closed_names:
                report.check(
                    not peers, f"{where}: port {port_name} ({number}) is listed as closed, but admits {sorted(peers)}"
                )
                continue
            report.check(
                bool(peers),
                f"{where}: no NetworkPolicy admits port {port_name} ({number}); open it or list it in {CLOSED_PORTS}",
            )
            outside = sorted(p for p in peers if p == "*" or p.startswith("ns:"))
            report.check(
                not outside or (name, number) in OUTSIDE_ALLOWED.get(label, set()),
                f"{where}: port {number} is reachable from outside the namespace ({outside}); only the gateway may be",
            )
            want = DEV_INGRESS.get((name, number)) if label == "dev" else None
            if want is not None:
                report.check(
                    peers == want,
                    f"{where}: port {number} must admit exactly {sorted(want)}, admits {sorted(peers)}",
                )
    if label == "dev":
        names = {w["metadata"]["name"] for w in workloads}
        for workload, port in sorted(DEV_INGRESS):
            report.check(workload in names, f"{label}: {workload} (port {port}) is not rendered")


def check(ctx: Context) -> list[str]:
    return each_overlay(ctx, check_workloads)
