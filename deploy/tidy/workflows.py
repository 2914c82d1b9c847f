"""the CI pipelines: one workflow per service of services.toml, none for another, the
release gated on the tests and advisories."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import yaml

from tidy.common import Context, Report, SPECS


WORKFLOWS_DIR = Path(".github/workflows")


#: The reusable pipeline every service's workflow calls.
SERVICE_PIPELINE = "service-pipeline.yml"


#: The workflows that are no service's: the reusable ones, the libraries', the release.
RUST_TESTS = "rust-tests.yml"


ADVISORIES = "advisories.yml"


RELEASE = "release.yml"


SHARED_WORKFLOWS = (SERVICE_PIPELINE, RUST_TESTS, "libs.yml", RELEASE, ADVISORIES)


#: What a job's `if:` may not call: each runs the job although a job it needs failed.
_BYPASSING_STATUS = ("always()", "failure()", "cancelled()")


def _workflow_triggers(doc: dict[str, Any]) -> dict[str, Any]:
    # YAML 1.1 (PyYAML) reads the key `on` as the boolean true.
    triggers = doc.get("on", doc.get(True))
    return triggers if isinstance(triggers, dict) else {}


def _pipeline_calls(doc: dict[str, Any]) -> list[tuple[str, Any]]:
    """(job id, its `with.service`) of every job that calls service-pipeline.yml."""
    jobs = doc.get("jobs") if isinstance(doc.get("jobs"), dict) else {}
    return [
        (job_id, (job.get("with") or {}).get("service"))
        for job_id, job in jobs.items()
        if isinstance(job, dict) and job.get("uses") == f"./{WORKFLOWS_DIR}/{SERVICE_PIPELINE}"
    ]


def check_workflows(report: Report, root: Path, services: Iterable[str] | None = None) -> None:
    """Every service of services.toml has its workflow `<service>.yml` (as scripts/new-service
    renders deploy/template/workflow.yml): named after it, run on pushes to main and on pull
    requests that touch services/<service>/, calling service-pipeline.yml with its name; every
    other workflow is one of SHARED_WORKFLOWS, and no workflow passes service-pipeline.yml a
    service that services.toml does not name."""
    names = list(SPECS if services is None else services)
    directory = root / WORKFLOWS_DIR
    if not report.check(directory.is_dir(), f"{WORKFLOWS_DIR} is missing"):
        return
    for shared in SHARED_WORKFLOWS:
        report.check((directory / shared).is_file(), f"{WORKFLOWS_DIR / shared} is missing")
    for name in names:
        report.check(
            f"{name}.yml" not in SHARED_WORKFLOWS,
            f"{name}: its workflow would be {WORKFLOWS_DIR / (name + '.yml')}, a shared workflow: rename the service",
        )
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.iterdir()):
        if path.suffix not in (".yml", ".yaml") or not path.is_file():
            continue
        rel = WORKFLOWS_DIR / path.name
        try:
            doc = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            report.check(False, f"{rel}: not YAML ({e})")
            continue
        if not report.check(isinstance(doc, dict), f"{rel}: not a workflow (a mapping)"):
            continue
        docs[path.name] = doc
        if path.name not in SHARED_WORKFLOWS:
            report.check(
                path.suffix == ".yml" and path.stem in names,
                f"{rel} names a service that does not exist: services.toml has no {path.stem!r} "
                f"(remove the workflow with the service; name it <service>.yml; or, if it is no service's, "
                f"list it in SHARED_WORKFLOWS of deploy/tidy/workflows.py)",
            )
        for job_id, service in _pipeline_calls(doc):
            if isinstance(service, str) and "${{" not in service:
                report.check(
                    service in names,
                    f"{rel}: job {job_id} runs the pipeline of {service!r}, which services.toml does not name",
                )
    for name in names:
        rel = WORKFLOWS_DIR / f"{name}.yml"
        doc = docs.get(f"{name}.yml")
        if not report.check(
            doc is not None, f"{name}: no workflow {rel} (scripts/new-service renders deploy/template/workflow.yml)"
        ):
            continue
        report.check(doc.get("name") == name, f"{rel}: its name must be {name!r}, got {doc.get('name')!r}")
        triggers = _workflow_triggers(doc)
        for event in ("push", "pull_request"):
            spec = triggers.get(event) if isinstance(triggers.get(event), dict) else {}
            report.check(
                f"services/{name}/**" in (spec.get("paths") or []),
                f"{rel}: on.{event}.paths must include services/{name}/**",
            )
        push = triggers.get("push") if isinstance(triggers.get("push"), dict) else {}
        report.check("main" in (push.get("branches") or []), f"{rel}: on.push.branches must include main")
        calls = _pipeline_calls(doc)
        report.check(
            [service for _, service in calls] == [name],
            f"{rel}: must call {WORKFLOWS_DIR / SERVICE_PIPELINE} once, with service: {name} (got {calls})",
        )
    check_release_gates(report, root)


def _needs(job: dict[str, Any]) -> list[str]:
    needs = job.get("needs") or []
    return [needs] if isinstance(needs, str) else [n for n in needs if isinstance(n, str)]


def _writes(job: dict[str, Any]) -> list[str]:
    """The write permissions a job asks for (an empty list: it can publish nothing)."""
    permissions = job.get("permissions")
    if permissions == "write-all":
        return ["write-all"]
    if not isinstance(permissions, dict):
        return []
    return sorted(f"{scope}: write" for scope, level in permissions.items() if level == "write")


def check_release_gates(report: Report, root: Path) -> None:
    """release.yml pushes and publishes nothing before the tests and the advisory check pass:
    it has a job calling rust-tests.yml and one calling advisories.yml, and every job that asks
    for a write permission needs both (directly, or through the jobs it needs) and runs only
    when they succeeded (no always(), failure() or cancelled() in its `if:`). advisories.yml
    runs `scripts/advisories --online`, when called and every day."""
    rel = WORKFLOWS_DIR / RELEASE
    try:
        doc = yaml.safe_load((root / rel).read_text())
    except (OSError, yaml.YAMLError) as e:
        report.check(False, f"{rel}: cannot read it ({e})")
        return
    jobs = doc.get("jobs") if isinstance(doc, dict) and isinstance(doc.get("jobs"), dict) else {}
    jobs = {job_id: job for job_id, job in jobs.items() if isinstance(job, dict)}
    gates = {
        workflow: {job_id for job_id, job in jobs.items() if job.get("uses") == f"./{WORKFLOWS_DIR}/{workflow}"}
        for workflow in (RUST_TESTS, ADVISORIES)
    }
    for workflow, ids in gates.items():
        report.check(bool(ids), f"{rel}: no job calls {WORKFLOWS_DIR / workflow}, so nothing holds the release back on it")

    def upstream(job_id: str) -> set[str]:
        seen: set[str] = set()
        todo = list(_needs(jobs.get(job_id, {})))
        while todo:
            need = todo.pop()
            if need not in seen:
                seen.add(need)
                todo.extend(_needs(jobs.get(need, {})))
        return seen

    for job_id, job in jobs.items():
        writes = _writes(job)
        if not writes or any(job_id in ids for ids in gates.values()):
            continue
        before = upstream(job_id)
        for workflow, ids in gates.items():
            if ids:
                report.check(
                    bool(before & ids),
                    f"{rel}: job {job_id} ({', '.join(writes)}) does not need the job calling "
                    f"{WORKFLOWS_DIR / workflow} ({', '.join(sorted(ids))}): it would publish after a red check",
                )
        condition = str(job.get("if", ""))
        report.check(
            not any(status in condition.replace(" ", "") for status in _BYPASSING_STATUS),
            f"{rel}: job {job_id} ({', '.join(writes)}) runs on `if: {condition}`, also when a job it needs failed",
        )

    rel = WORKFLOWS_DIR / ADVISORIES
    try:
        doc = yaml.safe_load((root / rel).read_text())
    except (OSError, yaml.YAMLError) as e:
        report.check(False, f"{rel}: cannot read it ({e})")
        return
    triggers = _workflow_triggers(doc) if isinstance(doc, dict) else {}
    for event in ("workflow_call", "schedule"):
        report.check(event in triggers, f"{rel}: must run on {event}")
    runs = [
        step.get("run", "")
        for job in ((doc or {}).get("jobs") or {}).values() if isinstance(job, dict)
        for step in (job.get("steps") or []) if isinstance(step, dict)
    ]
    report.check(
        any("scripts/advisories --online" in str(run) for run in runs),
        f"{rel}: no step runs scripts/advisories --online",
    )


def check(ctx: Context) -> list[str]:
    r = Report()
    check_workflows(r, ctx.root)
    return r.failures
