"""compose and the dev overlay run the Kafka release the clients are tested with."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tidy.common import Context, Report, _workloads


#: The pom scripts/kafka runs Apache Kafka from (its kafka.version), and Kafka's image.
KAFKA_POM = Path("scripts/lib/kafka/pom.xml")


KAFKA_IMAGE = "apache/kafka"


def check_kafka_release(report: Report, compose: dict[str, Any], k8s: dict[str, list[dict[str, Any]]], root: Path) -> None:
    """Every apache/kafka image of compose and the k8s overlays is the Kafka release the
    tests run (scripts/lib/kafka/pom.xml's kafka.version)."""
    match = re.search(r"<kafka\.version>([0-9][0-9.]*)</kafka\.version>", (root / KAFKA_POM).read_text())
    if not report.check(match is not None, f"no <kafka.version> in {KAFKA_POM}"):
        return
    want = f"{KAFKA_IMAGE}:{match.group(1)}"
    images = [(f"compose/{name}", str(spec.get("image", ""))) for name, spec in (compose.get("services") or {}).items()]
    for label, docs in k8s.items():
        for workload in _workloads(docs):
            pod = workload["spec"].get("template", {}).get("spec") or workload["spec"].get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec", {})
            for c in (pod.get("containers") or []) + (pod.get("initContainers") or []):
                images.append((f"{label}/{workload.get('kind')}/{workload['metadata']['name']}", str(c.get("image", ""))))
    kafka = [(where, image) for where, image in images if image.split(":", 1)[0] == KAFKA_IMAGE]
    report.check(bool(kafka), "compose and k8s run no apache/kafka image")
    for where, image in kafka:
        report.check(image == want, f"{where}: image must be {want} (the Kafka the tests run, {KAFKA_POM}), got {image}")


def check(ctx: Context) -> list[str]:
    r = Report()
    check_kafka_release(r, ctx.compose, ctx.k8s, ctx.root)
    return r.failures
