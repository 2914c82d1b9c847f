"""the dev overlay's kafka-topics Job: the compose kafka-init's topic prefix."""

from __future__ import annotations

from typing import Any

from tidy.common import BACKENDS, Context, Report, _by_kind, _container_env, each_overlay


def check_topics_job(report: Report, label: str, docs: list[dict[str, Any]]) -> None:
    """The topics Job creates the topics under the prefix the services use."""
    job = _by_kind(docs, "Job").get("kafka-topics")
    if job is None:
        return
    container = job["spec"]["template"]["spec"]["containers"][0]
    prefix = {e["name"]: e.get("value") for e in container.get("env") or []}.get("TOPIC_PREFIX")
    configmaps = _by_kind(docs, "ConfigMap")
    for service in BACKENDS:
        deployment = _by_kind(docs, "Deployment").get(service)
        if deployment is None:
            continue
        env, _ = _container_env(deployment["spec"]["template"]["spec"]["containers"][0], configmaps)
        report.check(
            env.get("APP_KAFKA__TOPIC_PREFIX") == prefix,
            f"{label}/Job/kafka-topics: TOPIC_PREFIX {prefix!r} differs from {service}'s "
            f"APP_KAFKA__TOPIC_PREFIX {env.get('APP_KAFKA__TOPIC_PREFIX')!r}",
        )


def check(ctx: Context) -> list[str]:
    return each_overlay(ctx, check_topics_job)
