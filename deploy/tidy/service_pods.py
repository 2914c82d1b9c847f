"""the services' pods: preStop, grace period, start-up budget, the image's user on a read-only
root filesystem, the migrate init container."""

from __future__ import annotations

from typing import Any

from tidy.common import (
    BACKENDS, Context, DRAIN_SECONDS, MIGRATE_FLAG, OWNER_URL, PRESTOP_SECONDS, Report, SERVICES,
    STARTUP_BUDGET_SECONDS, UID, _base_name, _by_kind, each_overlay,
)


def check_service_pods(report: Report, label: str, docs: list[dict[str, Any]]) -> None:
    deployments = _by_kind(docs, "Deployment")
    for service in SERVICES:
        deployment = deployments.get(service)
        if deployment is None:
            report.check(False, f"{where}: no Deployment")
            continue
        where = f"{label}/{service}"
        pod = deployment["spec"]["template"]["spec"]
        main = next((c for c in pod.get("containers") or [] if c.get("name") == service), None)
        if not report.check(main is not None, f"{where}: no container named {service}"):
            continue
        security = main.get("securityContext") or {}
        report.check(
            security.get("runAsUser") == UID and security.get("readOnlyRootFilesystem") is True,
            f"{where}: the container must run as {UID} (deploy/Dockerfile's user) on a read-only root filesystem",
        )
        sleep = (((main.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}).get("seconds")
        report.check(
            isinstance(sleep, int) and sleep >= PRESTOP_SECONDS,
            f"{where}: the container needs lifecycle.preStop.sleep.seconds >= {PRESTOP_SECONDS}, got {sleep!r}",
        )
        grace = pod.get("terminationGracePeriodSeconds", 30)
        need = (sleep if isinstance(sleep, int) else PRESTOP_SECONDS) + DRAIN_SECONDS
        report.check(
            grace >= need,
            f"{where}: terminationGracePeriodSeconds {grace} < preStop + drain ({need})",
        )
        startup = main.get("startupProbe") or {}
        if startup:
            budget = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)
            report.check(
                budget <= STARTUP_BUDGET_SECONDS,
                f"{where}: startupProbe allows {budget} s, more than {STARTUP_BUDGET_SECONDS} s",
            )
        inits = pod.get("initContainers") or []
        if service not in BACKENDS:
            report.check(not inits, f"{where}: unexpected init containers {[c.get('name') for c in inits]}")
            continue
        env = {e["name"]: e for e in main.get("env") or []}
        report.check(
            str((env.get(MIGRATE_FLAG) or {}).get("value")).lower() == "false",
            f"{where}: the service container must set {MIGRATE_FLAG}=false (its init container migrates)",
        )
        migrate = next((c for c in inits if c.get("name") == "migrate"), None)
        if not report.check(migrate is not None, f"{where}: no `migrate` init container"):
            continue
        report.check(
            migrate.get("image") == main.get("image") and migrate.get("args") == ["migrate"]
            and not migrate.get("command"),
            f"{where}: init container migrate must run the service's image with args [migrate], got "
            f"{migrate.get('image')} {migrate.get('command')} {migrate.get('args')}",
        )
        report.check(
            migrate.get("envFrom") == main.get("envFrom")
            and [e for e in migrate.get("env") or [] if e["name"] not in (MIGRATE_FLAG, OWNER_URL)]
            == [e for e in main.get("env") or [] if e["name"] != MIGRATE_FLAG],
            f"{where}: init container migrate must have the service container's env and envFrom",
        )
        # Migrations run as the database's owner; the service as the runtime role only.
        owner = next((e for e in migrate.get("env") or [] if e["name"] == OWNER_URL), {})
        ref = (owner.get("valueFrom") or {}).get("secretKeyRef") or {}
        secret = f"{service}-database-owner"
        report.check(
            _base_name(str(ref.get("name")), [secret]) == secret and ref.get("key") == "url",
            f"{where}: init container migrate must take {OWNER_URL} from Secret {service}-database-owner key url",
        )
        report.check(
            OWNER_URL not in env,
            f"{where}: the service container must not get {OWNER_URL} (the owner's credentials)",
        )
        report.check(
            MIGRATE_FLAG not in {e["name"] for e in migrate.get("env") or []},
            f"{where}: init container migrate must not set {MIGRATE_FLAG}",
        )
        report.check(
            migrate.get("securityContext") == main.get("securityContext"),
            f"{where}: init container migrate must have the service container's securityContext",
        )


def check(ctx: Context) -> list[str]:
    return each_overlay(ctx, check_service_pods)
