"""the Collector and Jaeger releases the configs are tested with."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tidy.common import (
    COPY_CONFIGMAPS, Context, OBSERVABILITY_DIR, OTELCOL_IMAGE, Report, _base_name, _by_kind,
    _compose_mount,
)


#: Where the tested releases are named (scripts/validate-observability builds them).
TRACING_LIB = Path("scripts/lib/tracing.sh")


OTELCOL_MANIFEST = OBSERVABILITY_DIR / "build" / "otelcol-builder.yaml"


JAEGER_IMAGE = "jaegertracing/jaeger"


#: service / Deployment name -> the committed config it must run and where it mounts it.
TELEMETRY_CONFIGS = {
    "jaeger": ("jaeger.yaml", "/etc/jaeger/config.yaml"),
    "otel-collector": ("otel-collector.yaml", "/etc/otelcol-contrib/config.yaml"),
}


def tested_releases(root: Path) -> dict[str, str]:
    """{"jaeger": "2.12.0", "otel-collector": "0.165"}: Jaeger's exact version, the
    collector's release (major.minor: the contrib image may carry a patch of its own)."""
    found: dict[str, str] = {}
    match = re.search(r"^SW_JAEGER_VERSION=([0-9][0-9.]*)$", (root / TRACING_LIB).read_text(), re.M)
    if match:
        found["jaeger"] = match.group(1)
    manifest = yaml.safe_load((root / OTELCOL_MANIFEST).read_text()) or {}
    version = str((manifest.get("dist") or {}).get("version", ""))
    if re.fullmatch(r"\d+\.\d+\.\d+", version):
        found["otel-collector"] = version.rsplit(".", 1)[0]
    return found


def _image_ok(name: str, image: str, releases: dict[str, str]) -> bool:
    if name == "jaeger":
        return image == f"{JAEGER_IMAGE}:{releases['jaeger']}"
    return re.fullmatch(re.escape(f"{OTELCOL_IMAGE}:{releases['otel-collector']}.") + r"\d+", image) is not None


def check_telemetry_releases(
    report: Report, compose: dict[str, Any], k8s: dict[str, list[dict[str, Any]]], root: Path
) -> None:
    """compose's and the dev overlay's Jaeger and collector: the tested releases, each
    started on its committed config."""
    releases = tested_releases(root)
    if not report.check(
        set(releases) == set(TELEMETRY_CONFIGS),
        f"no SW_JAEGER_VERSION in {TRACING_LIB} or no dist.version x.y.z in {OTELCOL_MANIFEST}",
    ):
        return
    want = {"jaeger": f"{JAEGER_IMAGE}:{releases['jaeger']}",
            "otel-collector": f"{OTELCOL_IMAGE}:{releases['otel-collector']}.<patch>"}
    services = compose.get("services") or {}
    for name, (config, target) in TELEMETRY_CONFIGS.items():
        spec = services.get(name)
        if not report.check(spec is not None, f"compose: no service {name}"):
            continue
        image = str(spec.get("image", ""))
        report.check(_image_ok(name, image, releases), f"compose/{name}: image must be {want[name]} (the tested release), got {image}")
        command = spec.get("command") or []
        command = command.split() if isinstance(command, str) else command
        report.check(f"--config={target}" in command, f"compose/{name}: must run --config={target}")
        mounts = dict(_compose_mount(v) for v in spec.get("volumes") or [])
        report.check(
            Path(mounts.get(target, "")).as_posix().endswith(f"{OBSERVABILITY_DIR.as_posix()}/{config}"),
            f"compose/{name}: must mount {OBSERVABILITY_DIR / config} at {target}",
        )
    docs = k8s.get("dev")
    if not docs:
        return
    deployments = _by_kind(docs, "Deployment")
    for name, (config, target) in TELEMETRY_CONFIGS.items():
        workload = deployments.get(name)
        if not report.check(workload is not None, f"dev: no Deployment {name}"):
            continue
        pod = workload["spec"]["template"]["spec"]
        container = next((c for c in pod.get("containers") or [] if c.get("name") == name), None)
        if not report.check(container is not None, f"dev/Deployment/{name}: no container {name}"):
            continue
        image = str(container.get("image", ""))
        report.check(_image_ok(name, image, releases), f"dev/Deployment/{name}: image must be {want[name]} (the tested release), got {image}")
        report.check(
            f"--config={target}" in (container.get("args") or []) + (container.get("command") or []),
            f"dev/Deployment/{name}: must run --config={target}",
        )
        mount_dir = str(Path(target).parent)
        volume = next((m.get("name") for m in container.get("volumeMounts") or [] if m.get("mountPath") == mount_dir), None)
        source = next((v for v in pod.get("volumes") or [] if v.get("name") == volume), {}) if volume else {}
        configmap = str((source.get("configMap") or {}).get("name", ""))
        base = next((b for b, keys in COPY_CONFIGMAPS.items() if keys.get(Path(target).name) == config), None)
        report.check(
            base is not None and _base_name(configmap, [base]) == base,
            f"dev/Deployment/{name}: must mount the ConfigMap of {OBSERVABILITY_DIR / config} at {mount_dir}",
        )


def check(ctx: Context) -> list[str]:
    r = Report()
    check_telemetry_releases(r, ctx.compose, ctx.k8s, ctx.root)
    return r.failures
