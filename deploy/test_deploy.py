#!/usr/bin/env python3
"""Tests of the deployment files that can run without a container engine.

* services.toml names exactly the directories under services/ and is well formed (what
  is generated from it, docs/design.md's table among them: deploy/test_generate.py);
* deploy/tidy/ passes on the real compose file and overlays, and catches each kind of
  drift it is meant to catch (every negative case breaks one real rendering);
* deploy/http-probe against a real HTTP server (2xx, 503, 404, hung server, no server);
* deploy/postgres/init.sql in a throw-away PostgreSQL cluster: roles, passwords, one
  database each and no cross access; the same for the dev overlay's per-service
  init-service-role.sql, fed the URLs of the overlay's own database Secrets;
* the kafka-init script in docker-compose.yml is valid bash, and the dev overlay's
  kafka-topics Job creates the same topics and applies the same ACL file, as admin over
  SASL_SSL; the Kafka security checks of deploy/tidy/ catch their drift;
* the prod overlay's managed-services example component still renders and passes the checks;
* the CI pipelines: a workflow per service of services.toml and none for another (the
  checker's negatives), and the release's kustomization (deploy/release_images.py) pinning
  every image by digest;
* scripts/new-service in a copy of the repository: the service's workflow and the
  deployment scripts/generate writes for it pass deploy/tidy/, and scripts/remove-service
  leaves the copy byte for byte as it was (scripts/test-new-service also builds it and runs it in dev-up);
* the Docker build context that .dockerignore leaves is a complete cargo workspace, with
  everything the build reads (proto/, migrations/, deploy/http-probe) and nothing else.
* deploy/image_pins.py lists every registry image reference without a digest (and only
  those), and docs/security.md's Open list names each one the repository has;
* scripts/lib/advisories.sh's guards on the RustSec snapshot, on snapshots made here: a
  copy whose SHA-256 is not the pinned one fails (and is not unpacked), one older than the
  maximum age fails, and `scripts/advisories --pin` re-pins.

Run from the repository root: `python3 deploy/test_deploy.py` (scripts/validate-deploy
does). Needs docker-compose, kubectl (or $SW_KUSTOMIZE), PyYAML, the `docker` Python
package (for its .dockerignore matcher), cargo and PostgreSQL's initdb/pg_ctl/psql.
"""

from __future__ import annotations

import base64
import copy
import glob
import hashlib
import re
import http.server
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from pathlib import Path
from types import ModuleType
from urllib.parse import urlsplit

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "deploy"))

from tidy import (  # noqa: E402
    common, ingress, kafka_release, kafka_security, local_images, namespace, prometheus_variant, rendered_copies,
    service_pods, telemetry_releases, topics_job, workloads,
)
from tidy import compose as tidy_compose  # noqa: E402
from tidy import main as tidy_main  # noqa: E402
from tidy import workflows as tidy_workflows  # noqa: E402

PROBE = ROOT / "deploy" / "http-probe"
#: services.toml (via deploy/tidy/common.py): the services, those with a database, every topic.
SERVICES = common.SPECS
DB_SERVICES = {name: spec.database for name, spec in SERVICES.items() if spec.database is not None}
AGGREGATES = [topic for spec in SERVICES.values() for topic in spec.topics]
INIT_SQL = ROOT / "deploy" / "postgres" / "init.sql"
K8S_INIT_SQL = ROOT / "k8s" / "overlays" / "dev" / "infra" / "postgres" / "init-service-role.sql"


def render_compose() -> dict:
    out = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config"],
        check=True, capture_output=True, text=True, cwd=ROOT,
    ).stdout
    return yaml.safe_load(out)


def render_overlay(name: str) -> list[dict]:
    # scripts/validate-deploy passes the kustomize it found (`kubectl kustomize` or `kustomize build`).
    kustomize = os.environ.get("SW_KUSTOMIZE", "kubectl kustomize").split()
    out = subprocess.run(
        [*kustomize, str(ROOT / "k8s" / "overlays" / name)],
        check=True, capture_output=True, text=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


class TidyCase(unittest.TestCase):
    """The committed compose file and overlays, rendered once, and what a test of one
    deploy/tidy module needs: CHECK (the module) run on a broken copy of them."""

    CHECK: ModuleType = tidy_main
    _rendered: tuple[dict, dict[str, list[dict]]] | None = None

    @classmethod
    def setUpClass(cls) -> None:
        if TidyCase._rendered is None:
            TidyCase._rendered = (render_compose(), {"dev": render_overlay("dev"), "prod": render_overlay("prod")})
        cls.compose, cls.k8s = TidyCase._rendered

    def failures(self, compose=None, k8s=None) -> list[str]:
        ctx = common.Context(compose=compose if compose is not None else self.compose,
                             k8s=k8s if k8s is not None else self.k8s)
        return self.CHECK.check(ctx)

    def assert_fails(self, failures: list[str], needle: str) -> None:
        self.assertTrue(any(needle in f for f in failures), f"expected a failure with {needle!r}, got {failures}")

    def doc(self, docs: list[dict], kind: str, name: str) -> dict:
        return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)

    def pod(self, docs: list[dict], kind: str, name: str) -> dict:
        return self.doc(docs, kind, name)["spec"]["template"]["spec"]


class TidyTest(TidyCase):
    """deploy/tidy/main.py: every check on the committed files."""

    def test_real_files_are_consistent(self) -> None:
        self.assertEqual(tidy_main.check_all(self.compose, self.k8s), [])


class ComposeTest(TidyCase):
    """deploy/tidy/compose.py."""

    CHECK = tidy_compose

    def test_publishing_a_grpc_port_fails(self) -> None:
        compose = copy.deepcopy(self.compose)
        compose["services"]["order"]["ports"] = ["7081:7081"]
        self.assert_fails(self.failures(compose=compose), "compose: order publishes container port 7081")

    def test_a_port_published_beyond_loopback_fails(self) -> None:
        compose = copy.deepcopy(self.compose)
        compose["services"]["gateway"]["ports"] = ["8080:8080"]
        self.assert_fails(self.failures(compose=compose), "compose: gateway publishes '8080:8080' beyond 127.0.0.1")


class NamespaceTest(TidyCase):
    """deploy/tidy/namespace.py."""

    CHECK = namespace

    def test_missing_default_deny_or_committed_prod_secret_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        k8s["prod"] = [d for d in k8s["prod"] if d["metadata"]["name"] != "default-deny"]
        k8s["prod"].append({"kind": "Secret", "metadata": {"name": "order-database"}})
        failures = self.failures(k8s=k8s)
        self.assert_fails(failures, "prod: no default-deny NetworkPolicy")
        self.assert_fails(failures, "prod: Secrets must come from outside the repository")


class WorkloadsTest(TidyCase):
    """deploy/tidy/workloads.py: every workload, the dev overlay's data stores and telemetry included."""

    CHECK = workloads

    def test_workload_without_probes_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        del self.pod(k8s["dev"], "StatefulSet", "kafka")["containers"][0]["readinessProbe"]
        del self.pod(k8s["dev"], "Deployment", "otel-collector")["containers"][0]["livenessProbe"]
        failures = self.failures(k8s=k8s)
        self.assert_fails(failures, "dev/StatefulSet/kafka: container kafka has no readinessProbe")
        self.assert_fails(failures, "dev/Deployment/otel-collector: container otel-collector has no livenessProbe")

    def test_container_without_resources_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        del self.pod(k8s["dev"], "Deployment", "grafana")["containers"][0]["resources"]
        del self.pod(k8s["prod"], "Deployment", "order")["initContainers"][0]["resources"]["requests"]
        del self.pod(k8s["dev"], "Job", "kafka-topics")["containers"][0]["resources"]["limits"]
        failures = self.failures(k8s=k8s)
        self.assert_fails(failures, "dev/Deployment/grafana: container grafana needs cpu+memory requests")
        self.assert_fails(failures, "prod/Deployment/order: container migrate needs cpu+memory requests")
        self.assert_fails(failures, "dev/Job/kafka-topics: container kafka-topics needs cpu+memory requests")

    def test_relaxed_pod_security_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        self.pod(k8s["dev"], "StatefulSet", "payment-db")["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
        job = self.pod(k8s["dev"], "Job", "kafka-topics")
        del job["securityContext"]["runAsNonRoot"], job["containers"][0]["securityContext"]["runAsNonRoot"]
        self.pod(k8s["dev"], "Deployment", "jaeger")["containers"][0]["securityContext"]["capabilities"] = {"add": ["NET_ADMIN"]}
        self.pod(k8s["prod"], "Deployment", "inventory")["initContainers"][0]["securityContext"]["runAsUser"] = 0
        failures = self.failures(k8s=k8s)
        self.assert_fails(failures, "dev/StatefulSet/payment-db: container postgres: not the restricted Pod Security profile: allowPrivilegeEscalation")
        self.assert_fails(failures, "dev/Job/kafka-topics: container kafka-topics: not the restricted Pod Security profile: runAsNonRoot")
        self.assert_fails(failures, "dev/Deployment/jaeger: container jaeger: not the restricted Pod Security profile: capabilities")
        self.assert_fails(failures, "prod/Deployment/inventory: container migrate: not the restricted Pod Security profile: no non-zero runAsUser")

    def test_workload_without_pdb_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        k8s["dev"] = [d for d in k8s["dev"] if not (d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] in ("jaeger", "order-db"))]
        failures = self.failures(k8s=k8s)
        self.assert_fails(failures, "dev/Deployment/jaeger: no PodDisruptionBudget selects its pods")
        self.assert_fails(failures, "dev/StatefulSet/order-db: no PodDisruptionBudget selects its pods")

    def test_workload_without_network_policy_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        k8s["dev"] = [d for d in k8s["dev"] if not (d["kind"] == "NetworkPolicy" and d["metadata"]["name"] in ("prometheus", "kafka-topics"))]
        failures = self.failures(k8s=k8s)
        self.assert_fails(failures, "dev/Deployment/prometheus: no NetworkPolicy admits port http (9090)")
        self.assert_fails(failures, "dev/Deployment/prometheus: no NetworkPolicy selects its pods")
        self.assert_fails(failures, "dev/Job/kafka-topics: no NetworkPolicy selects its pods")

    def test_opening_a_closed_port_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        k8s["dev"].append({
            "kind": "NetworkPolicy", "metadata": {"name": "grafana-open"},
            "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "grafana"}},
                     "policyTypes": ["Ingress"], "ingress": [{"ports": [{"port": 3000}]}]},
        })
        annotations = self.doc(k8s["dev"], "Deployment", "jaeger")["spec"]["template"]["metadata"]["annotations"]
        annotations["sagaworks.io/closed-ports"] = "healthz"
        failures = self.failures(k8s=k8s)
        self.assert_fails(failures, "dev/Deployment/grafana: port http (3000) is listed as closed, but admits ['*']")
        self.assert_fails(failures, "dev/Deployment/jaeger: sagaworks.io/closed-ports names 'healthz'")
        self.assert_fails(failures, "dev/Deployment/jaeger: no NetworkPolicy admits port health (13133)")

    def test_grpc_open_to_everyone_through_another_policy_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        k8s["prod"].append({
            "kind": "NetworkPolicy",
            "metadata": {"name": "too-open"},
            "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/component": "service"}},
                     "ingress": [{"ports": [{"port": 7082}]}]},
        })
        self.assert_fails(self.failures(k8s=k8s), "prod/Deployment/inventory: port 7082 is reachable from outside the namespace (['*'])")

    def test_telemetry_or_a_database_open_to_others_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        # A selector on another label: resolved against the rendered pods.
        jaeger = self.doc(k8s["dev"], "NetworkPolicy", "jaeger")
        jaeger["spec"]["ingress"][0]["from"] = [{"podSelector": {"matchLabels": {"app.kubernetes.io/component": "service"}}}]
        payment_db = self.doc(k8s["dev"], "NetworkPolicy", "payment-db")
        payment_db["spec"]["ingress"][0]["from"].append({"namespaceSelector": {}})
        failures = self.failures(k8s=k8s)
        self.assert_fails(failures, "dev/Deployment/jaeger: port 4317 must admit exactly ['otel-collector'], admits "
                                    f"{sorted(common.SERVICES)}")
        self.assert_fails(failures, "dev/StatefulSet/payment-db: port 5432 is reachable from outside the namespace (['ns:*'])")

    def test_scraping_from_elsewhere_in_dev_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        policy = self.doc(k8s["dev"], "NetworkPolicy", "allow-monitoring-ingress")
        policy["spec"]["ingress"][0]["from"] = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
        failures = self.failures(k8s=k8s)
        self.assert_fails(failures, "dev/Deployment/order: port 8081 is reachable from outside the namespace (['ns:monitoring'])")


class ServicePodsTest(TidyCase):
    """deploy/tidy/service_pods.py: graceful shutdown, migrations before readiness."""

    CHECK = service_pods

    def test_relaxed_security_context_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        container = self.pod(k8s["prod"], "Deployment", "payment")["containers"][0]
        container["securityContext"]["readOnlyRootFilesystem"] = False
        self.assert_fails(self.failures(k8s=k8s), "prod/payment: the container must run as 10001 (deploy/Dockerfile's user) on a read-only")

    def test_missing_prestop_or_short_grace_period_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        del self.pod(k8s["prod"], "Deployment", "order")["containers"][0]["lifecycle"]
        self.pod(k8s["dev"], "Deployment", "gateway")["terminationGracePeriodSeconds"] = 10
        failures = self.failures(k8s=k8s)
        self.assert_fails(failures, "prod/order: the container needs lifecycle.preStop.sleep.seconds >= 5")
        self.assert_fails(failures, "dev/gateway: terminationGracePeriodSeconds 10 < preStop + drain (27)")

    def test_missing_or_wrong_migrate_init_container_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        del self.pod(k8s["dev"], "Deployment", "inventory")["initContainers"]
        payment = self.pod(k8s["prod"], "Deployment", "payment")
        payment["containers"][0]["env"] = [e for e in payment["containers"][0]["env"] if e["name"] != "APP_DATABASE__MIGRATE"]
        order = self.pod(k8s["prod"], "Deployment", "order")
        order["initContainers"][0]["args"] = []
        order["initContainers"][0]["envFrom"] = []
        failures = self.failures(k8s=k8s)
        self.assert_fails(failures, "dev/inventory: no `migrate` init container")
        self.assert_fails(failures, "prod/payment: the service container must set APP_DATABASE__MIGRATE=false")
        self.assert_fails(failures, "prod/order: init container migrate must run the service's image with args [migrate]")
        self.assert_fails(failures, "prod/order: init container migrate must have the service container's env and envFrom")

    def test_owner_credentials_outside_the_migrate_init_container_fail(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        order = self.pod(k8s["prod"], "Deployment", "order")
        owner = next(e for e in order["initContainers"][0]["env"] if e["name"] == "APP_DATABASE__OWNER_URL")
        order["containers"][0]["env"].append(owner)
        inventory = self.pod(k8s["dev"], "Deployment", "inventory")
        inventory["initContainers"][0]["env"] = [
            e for e in inventory["initContainers"][0]["env"] if e["name"] != "APP_DATABASE__OWNER_URL"]
        failures = self.failures(k8s=k8s)
        self.assert_fails(failures, "prod/order: the service container must not get APP_DATABASE__OWNER_URL")
        self.assert_fails(failures, "dev/inventory: init container migrate must take APP_DATABASE__OWNER_URL")

    def test_long_startup_probe_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        self.pod(k8s["dev"], "Deployment", "payment")["containers"][0]["startupProbe"]["failureThreshold"] = 30
        self.assert_fails(self.failures(k8s=k8s), "dev/payment: startupProbe allows 60 s")


class IngressTest(TidyCase):
    """deploy/tidy/ingress.py: prod's Ingress and the gateway's reach."""

    CHECK = ingress

    def test_ingress_exposing_health_metrics_or_admin_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        paths = self.doc(k8s["prod"], "Ingress", "gateway")["spec"]["rules"][0]["http"]["paths"]
        backend = paths[0]["backend"]
        paths.append({"path": "/", "pathType": "Prefix", "backend": backend})
        paths.append({"path": "/v1/admin/dlq", "pathType": "Exact", "backend": backend})
        failures = self.failures(k8s=k8s)
        self.assert_fails(failures, "prod/Ingress/gateway: must route exactly")
        self.assert_fails(failures, "prod/Ingress/gateway: / (Prefix) exposes /health")
        self.assert_fails(failures, "prod/Ingress/gateway: / (Prefix) exposes /metrics")
        self.assert_fails(failures, "prod/Ingress/gateway: /v1/admin/dlq (Exact) exposes /v1/admin")

    def test_prod_gateway_open_to_anyone_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        self.doc(k8s["prod"], "NetworkPolicy", "gateway")["spec"]["ingress"] = [{"ports": [{"port": 8080}]}]
        self.assert_fails(self.failures(k8s=k8s), "prod/gateway: port 8080 must admit the ingress controller's namespace, not anyone")


class RenderedCopiesTest(TidyCase):
    """deploy/tidy/rendered_copies.py."""

    CHECK = rendered_copies

    def test_rendered_configmap_drift_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        configmaps = {d["metadata"]["name"].rsplit("-", 1)[0]: d for d in k8s["dev"] if d["kind"] == "ConfigMap"}
        configmaps["otel-collector-config"]["data"]["config.yaml"] += "# edited\n"
        del configmaps["grafana-dashboards"]["data"]["sagaworks-red.json"]
        failures = self.failures(k8s=k8s)
        self.assert_fails(failures, "dev: ConfigMap otel-collector-config key config.yaml differs from deploy/observability/otel-collector.yaml")
        self.assert_fails(failures, "dev: ConfigMap grafana-dashboards holds ['sagaworks-overview.json']")


class PrometheusVariantTest(TidyCase):
    """deploy/tidy/prometheus_variant.py."""

    CHECK = prometheus_variant

    def test_prometheus_variant_drift_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        configmap = next(d for d in k8s["dev"] if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("prometheus-config-"))
        config = yaml.safe_load(configmap["data"]["prometheus.yml"])
        config["global"]["scrape_interval"] = "30s"
        configmap["data"]["prometheus.yml"] = yaml.safe_dump(config)
        self.assert_fails(self.failures(k8s=k8s), "dev: prometheus.yml: global differs from the compose config")


class TopicsJobTest(TidyCase):
    """deploy/tidy/topics_job.py."""

    CHECK = topics_job

    def test_topic_prefix_mismatch_fails(self) -> None:
        k8s = copy.deepcopy(self.k8s)
        env = self.pod(k8s["dev"], "Job", "kafka-topics")["containers"][0]["env"]
        next(e for e in env if e["name"] == "TOPIC_PREFIX")["value"] = "other"
        self.assert_fails(self.failures(k8s=k8s), "dev/Job/kafka-topics: TOPIC_PREFIX 'other' differs from order's")


class TelemetryReleasesTest(TidyCase):
    """deploy/tidy/telemetry_releases.py."""

    CHECK = telemetry_releases

    def test_untested_telemetry_release_or_config_fails(self) -> None:
        compose = copy.deepcopy(self.compose)
        compose["services"]["jaeger"]["image"] = "jaegertracing/jaeger:2.14.1"
        compose["services"]["jaeger"]["command"] = []
        compose["services"]["otel-collector"]["image"] = "otel/opentelemetry-collector-contrib:0.143.0"
        k8s = copy.deepcopy(self.k8s)
        jaeger = self.pod(k8s["dev"], "Deployment", "jaeger")
        jaeger["volumes"] = [v for v in jaeger["volumes"] if "configMap" not in v]
        self.pod(k8s["dev"], "Deployment", "otel-collector")["containers"][0]["image"] = (
            "otel/opentelemetry-collector-contrib:0.165")
        failures = self.failures(compose=compose, k8s=k8s)
        releases = telemetry_releases.tested_releases(ROOT)
        self.assertEqual(set(releases), {"jaeger", "otel-collector"})
        self.assert_fails(failures, "compose/jaeger: image must be jaegertracing/jaeger:" + releases["jaeger"])
        self.assert_fails(failures, "compose/jaeger: must run --config=/etc/jaeger/config.yaml")
        self.assert_fails(failures, "compose/otel-collector: image must be otel/opentelemetry-collector-contrib:"
                          + releases["otel-collector"] + ".<patch>")
        self.assert_fails(failures, "dev/Deployment/jaeger: must mount the ConfigMap of deploy/observability/jaeger.yaml")
        self.assert_fails(failures, "dev/Deployment/otel-collector: image must be")


class KafkaReleaseTest(TidyCase):
    """deploy/tidy/kafka_release.py."""

    CHECK = kafka_release

    def test_an_untested_kafka_release_fails(self) -> None:
        compose = copy.deepcopy(self.compose)
        compose["services"]["kafka-init"]["image"] = "apache/kafka:3.9.1"
        k8s = copy.deepcopy(self.k8s)
        self.pod(k8s["dev"], "StatefulSet", "kafka")["containers"][0]["image"] = "apache/kafka:4.3.0"
        failures = self.failures(compose=compose, k8s=k8s)
        self.assert_fails(failures, "compose/kafka-init: image must be apache/kafka:4.4.0")
        self.assert_fails(failures, "dev/StatefulSet/kafka: image must be apache/kafka:4.4.0")
        self.assertFalse([f for f in failures if f.startswith("compose/kafka:")], failures)


class LocalImagesTest(TidyCase):
    """deploy/tidy/local_images.py."""

    CHECK = local_images

    def test_a_local_image_of_another_release_or_a_pulled_one_fails(self) -> None:
        local = yaml.safe_load((ROOT / local_images.LOCAL_COMPOSE).read_text())
        report = common.Report()
        local_images.check_local_images(report, self.compose, ROOT, local)
        self.assertEqual(report.failures, [])
        services = local["services"]
        services["postgres"]["image"] = "sagaworks-local/postgres:15"
        services["kafka-init"]["image"] = "sagaworks-local/kafka:4.3.0"
        services["jaeger"]["image"] = "jaegertracing/jaeger:2.12.0"
        services["otel-collector"]["image"] = "sagaworks-local/otel-collector:0.164.0"
        del services["payment"]["pull_policy"]
        del services["prometheus"]
        services["grafana"] = {"image": "sagaworks-local/grafana:12"}
        compose = copy.deepcopy(self.compose)
        del compose["services"]["grafana"]["profiles"]
        report = common.Report()
        local_images.check_local_images(report, compose, ROOT, local)
        failures = report.failures
        self.assert_fails(failures, "local.yml/postgres: image must be sagaworks-local/postgres:17")
        self.assert_fails(failures, "local.yml/kafka-init: image must be sagaworks-local/kafka:4.4.0")
        self.assert_fails(failures, "local.yml/jaeger: image must be one of scripts/images'")
        self.assert_fails(failures, "local.yml/otel-collector: image must be sagaworks-local/otel-collector:")
        self.assert_fails(failures, "local.yml/payment: pull_policy must be never")
        self.assert_fails(failures, "local.yml: no entry for compose's prometheus")
        self.assert_fails(failures, "local.yml: grafana has no image built here")
        self.assert_fails(failures, "compose/grafana: must sit behind a profile")


class KafkaSecurityTest(TidyCase):
    """deploy/tidy/kafka_security.py."""

    CHECK = kafka_security

    def test_unsecured_kafka_or_drifted_acls_fail(self) -> None:
        compose = copy.deepcopy(self.compose)
        services = compose["services"]
        services["order"]["environment"]["APP_KAFKA__SECURITY_PROTOCOL"] = "plaintext"
        services["kafka"]["healthcheck"]["test"] = ["CMD-SHELL", "kafka-broker-api-versions.sh --bootstrap-server localhost:9092"]
        k8s = copy.deepcopy(self.k8s)
        certificate = self.doc(k8s["dev"], "Certificate", "kafka")
        certificate["spec"]["dnsNames"] = ["kafka"]
        del certificate["spec"]["privateKey"]["encoding"]
        acls = next(d for d in k8s["dev"] if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("kafka-acls-"))
        acls["data"]["acls.txt"] += "User:inventory|topic|prefixed|All|@PREFIX@\n"
        failures = self.failures(compose=compose, k8s=k8s)
        self.assert_fails(failures, "compose/order: APP_KAFKA__SECURITY_PROTOCOL must be sasl_ssl")
        self.assert_fails(failures, "compose/kafka: the healthcheck must authenticate (--command-config)")
        self.assert_fails(failures, "dev/Certificate/kafka: dnsNames must include")
        self.assert_fails(failures, "dev/Certificate/kafka: the key must be PKCS8")
        self.assert_fails(failures, "dev: ConfigMap kafka-acls key acls.txt differs from deploy/kafka/acls.txt")

    def test_kafka_nodes_certificate_from_the_services_ca_fails(self) -> None:
        services_ca = next(v for v in self.compose["services"]["order"]["volumes"] if common._compose_mount(v)[0] == "/certs/ca.pem")
        # The broker trusts (and its certificate comes from) the services' CA file.
        compose = copy.deepcopy(self.compose)
        compose["services"]["kafka"]["environment"]["TLS_CA_FILE"] = "/certs/ca.pem"
        compose["services"]["kafka"]["volumes"].append(copy.deepcopy(services_ca))
        self.assert_fails(self.failures(compose=compose), "compose/order: APP_TLS__CA_FILE is the Kafka nodes' CA")
        # A client verifies the broker with the services' CA.
        compose = copy.deepcopy(self.compose)
        compose["services"]["payment"]["environment"]["APP_KAFKA__SSL_CA_FILE"] = "/certs/ca.pem"
        compose["services"]["kafka-init"]["environment"]["CA_FILE"] = "/certs/ca.pem"
        compose["services"]["kafka-init"]["volumes"].append(copy.deepcopy(services_ca))
        failures = self.failures(compose=compose)
        self.assert_fails(failures, "compose/payment: APP_KAFKA__SSL_CA_FILE must be the broker's TLS_CA_FILE")
        self.assert_fails(failures, "compose/kafka-init: CA_FILE must be the broker's TLS_CA_FILE")
        self.assertFalse([f for f in failures if f.startswith("compose/order:")], failures)
        # The dev overlay: the broker's Certificate from the services' Issuer, a client on the services' CA.
        k8s = copy.deepcopy(self.k8s)
        self.doc(k8s["dev"], "Certificate", "kafka")["spec"]["issuerRef"]["name"] = "sagaworks-ca"
        config = next(d for d in k8s["dev"] if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("inventory-config-"))
        config["data"]["APP_KAFKA__SSL_CA_FILE"] = "/etc/sagaworks/tls/ca.crt"
        failures = self.failures(k8s=k8s)
        self.assert_fails(failures, "dev/Certificate/kafka: its Issuer sagaworks-ca (CA sagaworks-ca) also issues Certificate order")
        self.assert_fails(failures, "dev/inventory: APP_KAFKA__SSL_CA_FILE must be ca.crt (the Kafka CA)")
        self.assertFalse([f for f in failures if f.startswith("dev/order:") or f.startswith("dev/payment:")], failures)

    def test_kafka_files_drifting_from_their_sources_fail(self) -> None:
        with tempfile.TemporaryDirectory(prefix="sw-kafka-") as tmp:
            root = Path(tmp)
            for rel in ("deploy/kafka", "scripts/lib"):
                shutil.copytree(ROOT / rel, root / rel)
            shutil.copy2(ROOT / "services.toml", root / "services.toml")
            report = common.Report()
            kafka_security.check_kafka_security(report, self.compose, {}, root)
            self.assertEqual(report.failures, [], "the real files agree")
            start = root / "deploy/kafka/start.sh"
            start.write_text(start.read_text().replace("allow.everyone.if.no.acl.found=false", "allow.everyone.if.no.acl.found=true"))
            report = common.Report()
            kafka_security.check_kafka_security(report, self.compose, {}, root)
            self.assert_fails(report.failures, "deploy/kafka/start.sh: no allow.everyone.if.no.acl.found=false")


class ServicesFileTest(unittest.TestCase):
    """services.toml, the one list of services the scripts, these checks and tests/system/deploy.rs read."""

    def test_services_toml_names_exactly_the_service_directories(self) -> None:
        directories = {p.name for p in (ROOT / "services").iterdir() if p.is_dir()}
        listed = set(common.load_services(ROOT / "services.toml"))
        self.assertEqual(
            sorted(directories - listed), [],
            "directories under services/ that services.toml does not name (add a [[service]] table)",
        )
        self.assertEqual(
            sorted(listed - directories), [], "services.toml names services without a directory under services/"
        )

    def test_malformed_services_toml_is_rejected(self) -> None:
        good = (ROOT / "services.toml").read_text()
        cases = {
            "unknown keys": good.replace('kind = "gateway"', 'kind = "gateway"\ngrcp_port = 1'),
            "used by": good.replace("http_port = 8080", "http_port = 8081"),
            "listed before it": good + '\n[[service]]\nname = "x"\nkind = "gateway"\nhttp_port = 1\ncalls = ["y"]\n',
            "a backend has a grpc_port": good.replace("grpc_port = 7083\n", ""),
            "ephemeral": good.replace("grpc_port = 7083", "grpc_port = 50053"),
            "a replica's": good.replace("http_port = 8080", "http_port = 32000"),
            "the name must be": good + '\n[[service]]\nname = "order"\nkind = "gateway"\nhttp_port = 2\n',
            "another publisher": good.replace('topics = ["order"]', 'topics = ["order", "payment"]'),
        }
        for needle, text in cases.items():
            with self.subTest(needle), tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
                self.assertNotEqual(text, good)
                f.write(text)
                f.flush()
                with self.assertRaisesRegex(ValueError, needle):
                    common.load_services(Path(f.name))


class WorkflowsTest(unittest.TestCase):
    """The CI pipelines of .github/workflows/: one per service of services.toml (deploy/tidy/'s
    check_workflows), and scripts/new-service renders the new service's from the template."""

    def copy(self, tmp: str) -> Path:
        root = Path(tmp)
        shutil.copytree(ROOT / tidy_workflows.WORKFLOWS_DIR, root / tidy_workflows.WORKFLOWS_DIR)
        return root

    def failures(self, root: Path, services=None) -> list[str]:
        report = common.Report()
        tidy_workflows.check_workflows(report, root, services)
        return report.failures

    def assert_fails(self, failures: list[str], needle: str) -> None:
        self.assertTrue(any(needle in f for f in failures), f"expected a failure with {needle!r}, got {failures}")

    def test_real_workflows_pass(self) -> None:
        self.assertEqual(self.failures(ROOT), [])

    def test_a_service_without_its_workflow_fails(self) -> None:
        with tempfile.TemporaryDirectory(prefix="sw-workflows-") as tmp:
            root = self.copy(tmp)
            (root / tidy_workflows.WORKFLOWS_DIR / "order.yml").unlink()
            self.assert_fails(self.failures(root), "order: no workflow .github/workflows/order.yml")
            # A service services.toml gains without a workflow.
            self.assert_fails(self.failures(ROOT, [*SERVICES, "shipping"]), "shipping: no workflow")

    def test_a_workflow_of_a_service_that_does_not_exist_fails(self) -> None:
        with tempfile.TemporaryDirectory(prefix="sw-workflows-") as tmp:
            root = self.copy(tmp)
            workflows = root / tidy_workflows.WORKFLOWS_DIR
            (workflows / "shipping.yml").write_text((workflows / "payment.yml").read_text().replace("payment", "shipping"))
            failures = self.failures(root)
            self.assert_fails(failures, ".github/workflows/shipping.yml names a service that does not exist")
            self.assert_fails(failures, "runs the pipeline of 'shipping', which services.toml does not name")
            # A service removed from services.toml whose workflow stayed.
            self.assert_fails(
                self.failures(ROOT, [s for s in SERVICES if s != "inventory"]),
                ".github/workflows/inventory.yml names a service that does not exist",
            )

    def test_a_workflow_off_its_paths_or_calling_another_service_fails(self) -> None:
        with tempfile.TemporaryDirectory(prefix="sw-workflows-") as tmp:
            root = self.copy(tmp)
            workflows = root / tidy_workflows.WORKFLOWS_DIR
            payment = workflows / "payment.yml"
            payment.write_text(payment.read_text().replace('"services/payment/**"', '"services/paymnt/**"', 1))
            inventory = workflows / "inventory.yml"
            inventory.write_text(inventory.read_text().replace('service: "inventory"', 'service: "order"'))
            gateway = workflows / "gateway.yml"
            gateway.write_text(gateway.read_text().replace("branches: [main]", "branches: [develop]"))
            failures = self.failures(root)
            self.assert_fails(failures, ".github/workflows/payment.yml: on.push.paths must include services/payment/**")
            self.assert_fails(failures, ".github/workflows/inventory.yml: must call .github/workflows/service-pipeline.yml once, with service: inventory")
            self.assert_fails(failures, ".github/workflows/gateway.yml: on.push.branches must include main")
            (workflows / "libs.yml").unlink()
            self.assert_fails(self.failures(root), ".github/workflows/libs.yml is missing")

    def test_a_service_named_like_a_shared_workflow_fails(self) -> None:
        self.assert_fails(self.failures(ROOT, [*SERVICES, "libs"]), "libs: its workflow would be .github/workflows/libs.yml, a shared workflow")

    def test_a_release_that_could_publish_before_its_tests_or_advisories_pass_fails(self) -> None:
        release_rel = tidy_workflows.WORKFLOWS_DIR / tidy_workflows.RELEASE
        original = (ROOT / release_rel).read_text()
        self.assertIn("needs: [services, tests, advisories]", original)
        self.assertIn("needs: [image, tests, advisories]", original)
        cases = {
            # The image job pushes to GHCR: without the advisories job among its needs.
            "image without advisories": (
                original.replace("needs: [services, tests, advisories]", "needs: [services, tests]"),
                "job image (attestations: write, id-token: write, packages: write) does not need the job "
                "calling .github/workflows/advisories.yml (advisories)"),
            # Both publishing jobs as they were: only the services' list before the image.
            "the jobs' needs without the checks": (
                original.replace("needs: [services, tests, advisories]", "needs: services")
                .replace("needs: [image, tests, advisories]", "needs: image"),
                "job publish (contents: write) does not need the job calling .github/workflows/rust-tests.yml (tests)"),
            "publish on always()": (
                original.replace("needs: [image, tests, advisories]", "needs: [image, tests, advisories]\n    if: ${{ always() }}"),
                "job publish (contents: write) runs on `if: ${{ always() }}`"),
            "no tests job": (
                original.replace("uses: ./.github/workflows/rust-tests.yml", "uses: ./.github/workflows/libs.yml"),
                "no job calls .github/workflows/rust-tests.yml"),
        }
        for case, (text, needle) in cases.items():
            with self.subTest(case), tempfile.TemporaryDirectory(prefix="sw-workflows-") as tmp:
                root = self.copy(tmp)
                (root / release_rel).write_text(text)
                self.assert_fails(self.failures(root), needle)
        with tempfile.TemporaryDirectory(prefix="sw-workflows-") as tmp:
            root = self.copy(tmp)
            advisories = root / tidy_workflows.WORKFLOWS_DIR / tidy_workflows.ADVISORIES
            advisories.write_text(advisories.read_text().replace("scripts/advisories --online", "scripts/advisories")
                                  .replace("  schedule:\n", "  unscheduled:\n"))
            failures = self.failures(root)
            self.assert_fails(failures, "advisories.yml: no step runs scripts/advisories --online")
            self.assert_fails(failures, "advisories.yml: must run on schedule")

    def test_the_template_renders_the_real_services_workflows(self) -> None:
        # The template renders the real services' workflows too: they differ only by name.
        template = (ROOT / "deploy" / "template" / "workflow.yml").read_text()
        for name in SERVICES:
            self.assertEqual(
                (ROOT / tidy_workflows.WORKFLOWS_DIR / f"{name}.yml").read_text(),
                template.replace("{{name}}", name),
                f"{name}.yml is deploy/template/workflow.yml rendered for {name}",
            )


def repository_files(root: Path) -> dict[str, bytes]:
    """The files of the working tree git would see (tracked, and untracked but not ignored):
    what scripts/new-service and scripts/remove-service may change."""
    out = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=root, check=True,
                         capture_output=True).stdout
    files = {}
    for rel in sorted(set(out.decode().split("\0")) - {""}):
        path = root / rel
        if path.is_file():
            files[rel] = path.read_bytes()
    return files


def copy_repository(root: Path, to: Path) -> None:
    """A copy of `repository_files(root)`, a git repository of its own (one commit)."""
    for rel, content in repository_files(root).items():
        (to / rel).parent.mkdir(parents=True, exist_ok=True)
        (to / rel).write_bytes(content)
        if os.access(root / rel, os.X_OK):
            (to / rel).chmod(0o755)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@localhost"]
    subprocess.run(["git", "init", "-q"], cwd=to, check=True)
    subprocess.run([*git, "add", "-A"], cwd=to, check=True)
    subprocess.run([*git, "commit", "-qm", "copy"], cwd=to, check=True)


def fresh_name(base: str = "sample") -> str:
    """A service name services.toml does not hold yet (this may run in a copy that has one)."""
    name, n = base, 1
    while name in SERVICES:
        n += 1
        name = f"{base}{n}"
    return name


class NewServiceTest(unittest.TestCase):
    """scripts/new-service in a copy of the repository: the service it adds passes every check
    of deploy/tidy/ and the copy's own deploy files render; scripts/remove-service then
    leaves the copy byte for byte as it was. (No build here: tests/system/deploy.rs builds and
    tests the crate; scripts/test-new-service runs the service in dev-up and validates it with
    every tool of scripts/validate-deploy.)"""

    def test_new_service_wires_a_consistent_deployment_and_remove_service_takes_it_back(self) -> None:
        name = fresh_name()
        with tempfile.TemporaryDirectory(prefix="sw-new-service-") as tmp:
            root = Path(tmp)
            copy_repository(ROOT, root)
            before = repository_files(root)
            subprocess.run([str(root / "scripts" / "new-service"), name], check=True, capture_output=True, cwd=root)
            after = repository_files(root)
            added = sorted(set(after) - set(before))
            self.assertIn(f".github/workflows/{name}.yml", added)
            self.assertIn(f"k8s/base/{name}/deployment.yaml", added)
            self.assertIn(f"k8s/overlays/dev/infra/postgres/{name}-db.yaml", added)
            workflow = (root / tidy_workflows.WORKFLOWS_DIR / f"{name}.yml").read_text()
            self.assertNotIn("{{name}}", workflow)
            services = common.load_services(root / "services.toml")
            self.assertIn(name, services)
            report = common.Report()
            tidy_workflows.check_workflows(report, root, list(services))
            self.assertEqual(report.failures, [])

            # The copy's compose file and overlays, checked by the copy's deploy/tidy/ (it
            # reads the copy's services.toml).
            env = {**os.environ, "GATEWAY_JWT_SECRET": "test"} | {
                f"{user.upper()}_KAFKA_PASSWORD": f"{user}-test"
                for user in ["admin", *(n for n, s in services.items() if s.kind == "backend")]
            }
            compose = subprocess.run(["docker-compose", "-f", "docker-compose.yml", "config"], cwd=root, env=env,
                                     check=True, capture_output=True, text=True).stdout
            (root / ".dev").mkdir()
            (root / ".dev" / "compose.yml").write_text(compose)
            kustomize = os.environ.get("SW_KUSTOMIZE", "kubectl kustomize").split()
            args = []
            for overlay in ("dev", "prod"):
                out = subprocess.run([*kustomize, f"k8s/overlays/{overlay}"], cwd=root, check=True,
                                     capture_output=True, text=True).stdout
                (root / ".dev" / f"{overlay}.yaml").write_text(out)
                args += ["--k8s", f"{overlay}=.dev/{overlay}.yaml"]
            checked = subprocess.run(
                [sys.executable, "deploy/tidy/main.py", "--compose", ".dev/compose.yml", *args],
                cwd=root, capture_output=True, text=True)
            self.assertEqual(checked.returncode, 0, checked.stdout + checked.stderr)
            self.assertIn(name, yaml.safe_load(compose)["services"])
            shutil.rmtree(root / ".dev")

            subprocess.run([str(root / "scripts" / "remove-service"), name], check=True, capture_output=True, cwd=root)
            back = repository_files(root)
            self.assertEqual(sorted(set(back) ^ set(before)), [], "remove-service leaves exactly the files there were")
            changed = [rel for rel in before if before[rel] != back[rel]]
            self.assertEqual(changed, [], "remove-service leaves every file as it was")
            status = subprocess.run(["git", "status", "--porcelain"], cwd=root, check=True, capture_output=True,
                                    text=True).stdout
            self.assertEqual(status, "", "git status is clean after new-service + remove-service")


class ReleaseImagesTest(unittest.TestCase):
    """deploy/release_images.py: the release's kustomization pins every service's image by digest."""

    REPOSITORY = "ghcr.io/example/sagaworks"

    @staticmethod
    def digest(name: str) -> str:
        return "sha256:" + hashlib.sha256(name.encode()).hexdigest()

    def refs(self, names) -> list[str]:
        return [f"{name} {self.REPOSITORY}/{name}@{self.digest(name)}" for name in names]

    def test_the_release_overlay_renders_every_image_pinned_by_digest(self) -> None:
        import release_images

        names = list(SERVICES)
        text = release_images.kustomization(release_images.pinned_images(self.refs(names), names), names, "../prod", "v9.9.9")
        with tempfile.TemporaryDirectory(prefix="sw-release-") as tmp:
            shutil.copytree(ROOT / "k8s", Path(tmp) / "k8s")
            overlay = Path(tmp) / "k8s" / "overlays" / "release"
            overlay.mkdir()
            (overlay / "kustomization.yaml").write_text(text)
            kustomize = os.environ.get("SW_KUSTOMIZE", "kubectl kustomize").split()
            out = subprocess.run([*kustomize, str(overlay)], check=True, capture_output=True, text=True).stdout
        images = set()
        for doc in yaml.safe_load_all(out):
            if doc and doc.get("kind") in common.WORKLOAD_KINDS:
                spec = doc["spec"]["template"]["spec"]
                images |= {c["image"] for c in spec.get("containers", []) + spec.get("initContainers", [])}
        self.assertEqual(images, {f"{self.REPOSITORY}/{name}@{self.digest(name)}" for name in names})

    def test_a_missing_unknown_repeated_or_unpinned_image_is_refused(self) -> None:
        import release_images

        names = list(SERVICES)
        cases = {
            "no image reference for": self.refs(names[1:]),
            "not a service of services.toml": self.refs(names) + self.refs(["shipping"]),
            "more than one image reference": self.refs(names) + self.refs(names[:1]),
            "not `<service> <repository>@sha256:<digest>`": self.refs(names[1:]) + [f"{names[0]} {self.REPOSITORY}/{names[0]}:v1"],
        }
        for needle, lines in cases.items():
            with self.subTest(needle), self.assertRaisesRegex(ValueError, re.escape(needle)):
                release_images.pinned_images(lines, names)


class ServiceReplicasTest(unittest.TestCase):
    """scripts/lib/services.sh's replica helpers, which scripts/dev-up uses for
    SW_REPLICAS_<SERVICE> (scripts/load --replicas)."""

    def sh(self, script: str, **env: str) -> subprocess.CompletedProcess:
        lib = ROOT / "scripts" / "lib" / "services.sh"
        return subprocess.run(["bash", "-c", f". {lib} && {script}"], capture_output=True, text=True,
                              env={**os.environ, **env}, timeout=30)

    def out(self, script: str, **env: str) -> str:
        done = self.sh(script, **env)
        self.assertEqual(done.returncode, 0, done.stderr)
        return done.stdout.strip()

    def test_callers_get_every_replicas_url_on_ports_a_hundred_apart(self) -> None:
        grpc = SERVICES["order"].ports.grpc
        self.assertEqual(self.out("sw_grpc_urls order", SW_REPLICAS_ORDER="3"),
                         ",".join(f"https://127.0.0.1:{grpc + 100 * r}" for r in range(3)))
        self.assertEqual(self.out("sw_grpc_urls order"), f"https://127.0.0.1:{grpc}", "one replica by default")
        self.assertEqual(self.out("sw_replica order 1; sw_replica order 2"), "order\norder-2")
        self.assertEqual(self.out("sw_replica_port order http 3"), str(SERVICES["order"].ports.http + 200))
        self.assertEqual(self.out("sw_calls gateway").split(), ["order", "inventory", "payment"])
        self.assertEqual(self.out("sw_calls inventory"), "")

    def test_no_replica_port_is_another_services_port(self) -> None:
        fixed = {s.ports.http for s in SERVICES.values()} | {s.ports.grpc for s in SERVICES.values() if s.ports.grpc}
        from services_toml import broker_port
        fixed.add(broker_port(ROOT / "services.toml"))
        for name, spec in SERVICES.items():
            for port in (spec.ports.http, spec.ports.grpc):
                if port:
                    extra = {port + 100 * r for r in range(1, 9)}
                    self.assertFalse(extra & fixed, f"{name}: a replica port collides: {sorted(extra & fixed)}")

    def test_a_bad_services_toml_stops_the_sourcing_script_with_the_loaders_reason(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            bad = Path(tmp) / "services.toml"
            text = (ROOT / "services.toml").read_text()
            for broken, reason in [
                (text.replace('kind = "gateway"', 'kind = "frontend"'), "kind must be one of"),
                (text.replace("[broker]", "[brokers]"), "[broker] needs a name"),
            ]:
                with self.subTest(reason):
                    self.assertNotEqual(text, broken)
                    bad.write_text(broken)
                    done = self.sh("echo sourced", SW_SERVICES_TOML=str(bad))
                    self.assertNotEqual(done.returncode, 0)
                    self.assertNotIn("sourced", done.stdout)
                    self.assertIn(reason, done.stderr)

    def test_a_replica_count_out_of_range_is_an_error(self) -> None:
        for bad in ("0", "10", "x", "-1"):
            with self.subTest(bad):
                done = self.sh("sw_replicas order", SW_REPLICAS_ORDER=bad)
                self.assertNotEqual(done.returncode, 0)
                self.assertIn("replicas must be 1 to 9", done.stderr)


class ImagePinsTest(unittest.TestCase):
    """deploy/image_pins.py lists every registry image reference without a digest, and
    docs/security.md's Open list names each of them."""

    PINNED = "sha256:" + "0" * 63 + "1"

    def tree(self, tmp: str) -> Path:
        root = Path(tmp)
        (root / "deploy" / "containers" / "x").mkdir(parents=True)
        (root / "k8s" / "base").mkdir(parents=True)
        (root / ".github" / "workflows").mkdir(parents=True)
        (root / "docker-compose.yml").write_text(
            "services:\n"
            "  db:\n    image: postgres:17-bookworm\n"
            f"  broker:\n    image: \"apache/kafka:4.4.0@{self.PINNED}\"\n"
            "  order:\n    image: sagaworks/order:${SAGAWORKS_TAG:-dev}\n"
            "  other:\n    image: ${OTHER_IMAGE}\n")
        (root / "deploy" / "Dockerfile").write_text(
            "ARG RUST_IMAGE=rust:1.95-slim-bookworm\n"
            f"ARG DEBIAN_IMAGE=debian:bookworm-slim@{self.PINNED}\n"
            "FROM ${RUST_IMAGE} AS chef\nFROM chef AS builder\nFROM scratch AS empty\n"
            "FROM busybox:1.37 AS tools\nFROM ${DEBIAN_IMAGE} AS runtime\n")
        (root / "deploy" / "containers" / "x" / "Dockerfile").write_text(
            "ARG BASE_IMAGE=sagaworks-local/debian:bookworm\nFROM ${BASE_IMAGE}\n")
        (root / "k8s" / "base" / "db.yaml").write_text(
            "spec:\n  containers:\n    - image: grafana/grafana:12.3.1 # a comment\n"
            "    - name: app\n      image: sagaworks/gateway:latest\n"
            "    - name: dns\n      image: sagaworks.local/coredns:v1.14.7\n")
        (root / ".github" / "workflows" / "a.yml").write_text(
            "jobs:\n  a:\n    container: node:24-bookworm\n  b:\n    container:\n      image: rust:1.95-bookworm\n"
            "    steps:\n      - name: image name\n        id: name\n")
        return root

    def test_every_unpinned_registry_reference_is_listed_and_nothing_else(self) -> None:
        import image_pins

        with tempfile.TemporaryDirectory(prefix="sw-image-pins-") as tmp:
            root = self.tree(tmp)
            listed = [(ref.path, ref.line, ref.ref) for ref in image_pins.unpinned(root)]
            self.assertEqual(listed, [
                ("docker-compose.yml", 3, "postgres:17-bookworm"),
                ("deploy/Dockerfile", 1, "rust:1.95-slim-bookworm"),
                ("deploy/Dockerfile", 6, "busybox:1.37"),
                ("k8s/base/db.yaml", 3, "grafana/grafana:12.3.1"),
                (".github/workflows/a.yml", 3, "node:24-bookworm"),
                (".github/workflows/a.yml", 6, "rust:1.95-bookworm"),
            ])
            pinned = [ref.ref for ref in image_pins.image_refs(root) if ref.pinned]
            self.assertEqual(pinned, [f"apache/kafka:4.4.0@{self.PINNED}", f"debian:bookworm-slim@{self.PINNED}"])

    def test_strict_mode_fails_until_every_reference_is_pinned(self) -> None:
        script = ROOT / "deploy" / "image_pins.py"
        with tempfile.TemporaryDirectory(prefix="sw-image-pins-") as tmp:
            root = self.tree(tmp)
            report = subprocess.run([sys.executable, str(script), "--root", str(root)], capture_output=True, text=True)
            self.assertEqual(report.returncode, 0, report.stderr)
            self.assertIn("UNPINNED docker-compose.yml:3: postgres:17-bookworm", report.stdout)
            self.assertIn("8 registry image references, 2 pinned by digest, 6 not", report.stdout)
            strict = subprocess.run([sys.executable, str(script), "--root", str(root), "--strict"],
                                    capture_output=True, text=True)
            self.assertEqual(strict.returncode, 1, strict.stdout)
            for path in (root / "docker-compose.yml", root / "deploy" / "Dockerfile", root / "k8s" / "base" / "db.yaml",
                         root / ".github" / "workflows" / "a.yml"):
                path.write_text(re.sub(r"(postgres:17-bookworm|rust:1\.95-slim-bookworm|busybox:1\.37|grafana/grafana:12\.3\.1"
                                       r"|node:24-bookworm|rust:1\.95-bookworm)\b", rf"\1@{self.PINNED}", path.read_text()))
            strict = subprocess.run([sys.executable, str(script), "--root", str(root), "--strict"],
                                    capture_output=True, text=True)
            self.assertEqual(strict.returncode, 0, strict.stdout)
            self.assertIn("8 pinned by digest, 0 not", strict.stdout)

    def test_the_repositorys_unpinned_references_are_each_in_the_open_list(self) -> None:
        import image_pins

        refs = image_pins.unpinned(ROOT)
        paths = {ref.path for ref in refs}
        for expected in ("docker-compose.yml", "deploy/Dockerfile", ".github/workflows/rust-tests.yml",
                         "k8s/overlays/dev/infra/kafka.yaml"):
            self.assertIn(expected, paths)
        self.assertFalse([ref for ref in image_pins.image_refs(ROOT) if ref.ref.startswith(image_pins.OWN_PREFIXES)])
        security = (ROOT / "docs" / "security.md").read_text()
        open_list = security[security.index("\n## Open\n"):]
        missing = sorted({ref.ref for ref in refs if f"`{ref.ref}`" not in open_list})
        self.assertEqual(missing, [], "docs/security.md's Open list must name every image not pinned by digest")


class AdvisorySnapshotTest(unittest.TestCase):
    """scripts/lib/advisories.sh's guards on the RustSec snapshot, on a snapshot made here (a
    git repository with one commit of a known date, packed as the real one is): its SHA-256
    must be the pinned one, and its commit at most SW_RUSTSEC_MAX_AGE_DAYS old on the day
    SW_ADVISORIES_TODAY names. cargo-deny's database directory is under a CARGO_HOME of the
    test's own."""

    LIB = ROOT / "scripts" / "lib" / "advisories.sh"
    COMMITTED = "2026-01-10"

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = Path(tempfile.mkdtemp(prefix="sw-advisories-"))
        cls.snapshot = cls.pack("good", "advisory-db")
        cls.pinned = hashlib.sha256(cls.snapshot.read_bytes()).hexdigest()

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def pack(cls, name: str, content: str) -> Path:
        """A snapshot: a git repository whose one commit is of COMMITTED, 00:00 UTC."""
        repo = cls.tmp / f"{name}-repo"
        (repo / "crates" / "smallvec").mkdir(parents=True)
        (repo / "crates" / "smallvec" / "RUSTSEC-2021-0003.md").write_text(content)
        when = f"{cls.COMMITTED}T00:00:00+0000"
        env = {**os.environ, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when, "GIT_AUTHOR_NAME": "t",
               "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@example.invalid"}
        for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "snapshot"]):
            subprocess.run(["git", "-C", str(repo), *args], check=True, env=env, capture_output=True)
        tarball = cls.tmp / f"{name}.tar.gz"
        subprocess.run(["tar", "czf", str(tarball), "-C", str(repo), "."], check=True)
        return tarball

    def setUp(self) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="cargo-home-", dir=self.tmp))
        self.pin_file = self.home / "rustsec-snapshot.sha256"
        self.pin_file.write_text(f"# the pin\n{self.pinned}\n")
        self.db = self.home / "advisory-dbs" / "advisory-db-3157b0e258782691"

    def sh(self, script: str, snapshot: Path | None = None, **env: str) -> subprocess.CompletedProcess:
        env = {"SW_RUSTSEC_SNAPSHOT": str(snapshot or self.snapshot), "SW_RUSTSEC_PIN_FILE": str(self.pin_file),
               "CARGO_HOME": str(self.home), "SW_RUSTSEC_MAX_AGE_DAYS": "90", "SW_ADVISORIES_TODAY": "2026-02-01",
               **env}
        return subprocess.run(["bash", "-c", f". {self.LIB} && {script}"], capture_output=True, text=True,
                              env={**os.environ, **env}, timeout=60)

    def test_the_pinned_snapshot_within_its_age_is_unpacked_with_its_date_and_age(self) -> None:
        done = self.sh("sw_advisories_db")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.split(), [self.COMMITTED, "22"])
        self.assertTrue((self.db / "crates" / "smallvec" / "RUSTSEC-2021-0003.md").is_file())

    def test_a_tampered_snapshot_fails_on_its_hash_and_is_not_unpacked(self) -> None:
        tampered = self.tmp / "tampered.tar.gz"
        tampered.write_bytes(self.snapshot.read_bytes() + b"\0")
        other = self.pack("other", "another advisory-db")
        for snapshot in (tampered, other):
            with self.subTest(snapshot.name):
                done = self.sh("sw_advisories_db", snapshot)
                self.assertNotEqual(done.returncode, 0)
                self.assertIn(f"has SHA-256 {hashlib.sha256(snapshot.read_bytes()).hexdigest()}", done.stderr)
                self.assertIn(f"pins {self.pinned}", done.stderr)
                self.assertIn("re-pin it with `scripts/advisories --pin`", done.stderr)
                self.assertFalse(self.db.exists(), "a snapshot that failed its pin was unpacked")
        # The whole check, through its command, stops there too.
        env = {"SW_RUSTSEC_SNAPSHOT": str(tampered), "SW_RUSTSEC_PIN_FILE": str(self.pin_file),
               "CARGO_HOME": str(self.home)}
        done = subprocess.run([str(ROOT / "scripts" / "advisories")], capture_output=True, text=True,
                              env={**os.environ, **env}, timeout=60)
        self.assertEqual(done.returncode, 1, done.stderr)
        self.assertIn("is not the snapshot this repository accepts", done.stderr)
        self.assertNotIn("cargo deny check advisories", done.stdout)

    def test_a_snapshot_older_than_the_max_age_fails_saying_so(self) -> None:
        # 2026-01-10 to 2026-04-10: 90 days, the most allowed; a day later is one too many.
        self.assertEqual(self.sh("sw_advisories_db", SW_ADVISORIES_TODAY="2026-04-10").returncode, 0)
        done = self.sh("sw_advisories_db", SW_ADVISORIES_TODAY="2026-04-11")
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("the RustSec snapshot is 91 days old (its commit is of 2026-01-10, today is 2026-04-11)",
                      done.stderr)
        self.assertIn("more than the 90 days allowed (SW_RUSTSEC_MAX_AGE_DAYS)", done.stderr)
        self.assertEqual(done.stdout, "")
        # The setting moves the limit.
        self.assertEqual(self.sh("sw_advisories_db", SW_ADVISORIES_TODAY="2026-04-11",
                                 SW_RUSTSEC_MAX_AGE_DAYS="91").returncode, 0)

    def test_bad_settings_are_errors(self) -> None:
        for env, message in (({"SW_ADVISORIES_TODAY": "tomorrow"}, "is not a date"),
                             ({"SW_ADVISORIES_TODAY": "2026-02-30"}, "is not a date"),
                             ({"SW_RUSTSEC_MAX_AGE_DAYS": "ninety"}, "is not a number of days")):
            with self.subTest(env):
                done = self.sh("sw_advisories_db", **env)
                self.assertNotEqual(done.returncode, 0)
                self.assertIn(message, done.stderr)
        self.pin_file.write_text("# no hash here\n")
        done = self.sh("sw_advisories_db")
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("holds no SHA-256", done.stderr)

    def test_re_pinning_accepts_the_new_snapshot_and_keeps_the_comments(self) -> None:
        other = self.pack("repinned", "a newer advisory-db")
        self.assertNotEqual(self.sh("sw_advisories_db", other).returncode, 0)
        done = self.sh("sw_advisories_pin", other)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(self.pin_file.read_text(),
                         f"# the pin\n{hashlib.sha256(other.read_bytes()).hexdigest()}\n")
        self.assertEqual(self.sh("sw_advisories_db", other).returncode, 0)
        self.assertNotEqual(self.sh("sw_advisories_db").returncode, 0, "the old snapshot still passes")

    def test_the_committed_pin_is_a_sha256(self) -> None:
        done = self.sh("sw_advisories_pinned", SW_RUSTSEC_PIN_FILE=str(ROOT / "scripts/lib/rustsec-snapshot.sha256"))
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertRegex(done.stdout.strip(), r"^[0-9a-f]{64}$")


class _StatusHandler(http.server.BaseHTTPRequestHandler):
    routes = {"/health/ready": 200, "/health/live": 204, "/not-ready": 503}

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path == "/hang":
            time.sleep(5)
        self.send_response(self.routes.get(self.path, 404))
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpProbeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StatusHandler)
        cls.server.daemon_threads = True
        cls.port = cls.server.server_address[1]
        threading.Thread(target=cls.server.serve_forever, daemon=True).start()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.shutdown()
        cls.server.server_close()

    def probe(self, *args: str, timeout: str = "3") -> subprocess.CompletedProcess:
        env = dict(os.environ, HTTP_PROBE_TIMEOUT_SECONDS=timeout)
        return subprocess.run([str(PROBE), *args], capture_output=True, text=True, env=env, timeout=20)

    def test_2xx_is_healthy(self) -> None:
        self.assertEqual(self.probe(str(self.port)).returncode, 0)
        self.assertEqual(self.probe(str(self.port), "/health/live").returncode, 0)

    def test_non_2xx_is_unhealthy(self) -> None:
        for path, status in (("/not-ready", "503"), ("/missing", "404")):
            result = self.probe(str(self.port), path)
            self.assertEqual(result.returncode, 1, path)
            self.assertIn(status, result.stderr)

    def test_no_server_is_unhealthy(self) -> None:
        result = self.probe(str(free_port()))
        self.assertEqual(result.returncode, 1)
        self.assertIn("cannot connect", result.stderr)

    def test_hung_server_times_out(self) -> None:
        started = time.monotonic()
        result = self.probe(str(self.port), "/hang", timeout="1")
        self.assertEqual(result.returncode, 1)
        self.assertLess(time.monotonic() - started, 4)

    def test_bad_arguments_are_usage_errors(self) -> None:
        for args in ((), ("http",), ("0",), ("70000",), (str(self.port), "no-slash"), ("1", "/a", "extra")):
            self.assertEqual(self.probe(*args).returncode, 2, args)


def pg_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise RuntimeError(f"{name} not found: install PostgreSQL (apt-get install postgresql)")
    return found


class PostgresClusterCase(unittest.TestCase):
    """A private PostgreSQL cluster on a free port for each test (no tests of its own)."""

    SUPERUSER_PASSWORD = "super-secret"

    def setUp(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sw-pg-init-"))
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.port = free_port()
        # initdb and postgres refuse to run as root.
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.dir, "postgres")
        pwfile = self.dir / "pw"
        pwfile.write_text(self.SUPERUSER_PASSWORD + "\n")
        if self.as_user:
            shutil.chown(pwfile, "postgres")
        data = self.dir / "data"
        self.run_as([pg_bin("initdb"), "-D", str(data), "-U", "postgres", f"--pwfile={pwfile}",
                     "--auth=scram-sha-256"])
        self.run_as([pg_bin("pg_ctl"), "-D", str(data), "-w", "-l", str(self.dir / "log"), "-o",
                     f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1", "start"])
        self.addCleanup(self.run_as, [pg_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "stop"])

    def run_as(self, cmd: list[str]) -> None:
        subprocess.run(self.as_user + cmd, check=True, capture_output=True, timeout=120)

    def psql(self, user: str, password: str, db: str, *args: str, env: dict | None = None):
        return subprocess.run(
            [pg_bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", str(self.port),
             "-U", user, "-d", db, *args],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, **(env or {}), "PGPASSWORD": password, "PGCONNECT_TIMEOUT": "10"},
        )



class PostgresInitTest(PostgresClusterCase):
    """Runs init.sql the way the postgres image does, in a private cluster on a free port."""

    #: init.sql reads <SERVICE>_DB_PASSWORD and <SERVICE>_DB_OWNER_PASSWORD for each service
    #: with a database.
    PASSWORDS = {f"{name.upper()}_DB_PASSWORD": f"{name}-secret" for name in DB_SERVICES} | {
        f"{name.upper()}_DB_OWNER_PASSWORD": f"{name}-owner-secret" for name in DB_SERVICES}

    def init(self, passwords: dict[str, str]):
        env = {k: v for k, v in os.environ.items() if k not in self.PASSWORDS} | passwords
        return self.psql("postgres", self.SUPERUSER_PASSWORD, "postgres", "-f", str(INIT_SQL), env=env)

    def test_each_service_has_an_owner_and_a_dml_only_role_that_reach_only_its_own_database(self) -> None:
        result = self.init(self.PASSWORDS)
        self.assertEqual(result.returncode, 0, result.stderr)
        for svc, database in DB_SERVICES.items():
            role, own_db = database.role, f"sagaworks_{database.suffix}"
            owner, password, owner_password = f"{role}_owner", f"{svc}-secret", f"{svc}-owner-secret"
            own = self.psql(owner, owner_password, own_db, "-tAc",
                            "CREATE TABLE migrations_can_run (id int); SELECT current_database()")
            self.assertEqual(own.returncode, 0, own.stderr)
            self.assertEqual(own.stdout.strip(), own_db)
            dml = self.psql(role, password, own_db, "-tAc",
                            "INSERT INTO migrations_can_run VALUES (1); SELECT count(*) FROM migrations_can_run")
            self.assertEqual((dml.returncode, dml.stdout.strip()), (0, "1"), dml.stderr)
            for ddl in ("CREATE TABLE intruder (id int)", "DROP TABLE migrations_can_run",
                        "ALTER TABLE migrations_can_run ADD COLUMN x int"):
                refused = self.psql(role, password, own_db, "-c", ddl)
                self.assertNotEqual(refused.returncode, 0, f"{role}: {ddl}")
                self.assertRegex(refused.stderr, "permission denied|must be owner", ddl)
            for db in ["postgres"] + [f"sagaworks_{d.suffix}" for other, d in DB_SERVICES.items() if other != svc]:
                for who, pw in ((role, password), (owner, owner_password)):
                    denied = self.psql(who, pw, db, "-c", "SELECT 1")
                    self.assertNotEqual(denied.returncode, 0, f"{who} reached {db}")
                    self.assertIn("permission denied for database", denied.stderr)
            wrong = self.psql(role, "wrong", own_db, "-c", "SELECT 1")
            self.assertIn("password authentication failed", wrong.stderr)
        attrs = self.psql("postgres", self.SUPERUSER_PASSWORD, "postgres", "-tAc",
                          "SELECT count(*), bool_or(rolsuper OR rolcreatedb OR rolcreaterole) FROM pg_roles "
                          "WHERE rolname LIKE '%\\_svc' OR rolname LIKE '%\\_svc\\_owner'")
        self.assertEqual(attrs.stdout.strip(), f"{2 * len(DB_SERVICES)}|f", "service roles must be unprivileged")

    def test_missing_or_empty_password_aborts_before_creating_anything(self) -> None:
        first, last = list(self.PASSWORDS)[0], list(self.PASSWORDS)[-1]
        for passwords in ({k: v for k, v in self.PASSWORDS.items() if k != first},
                          {**self.PASSWORDS, last: ""}):
            result = self.init(passwords)
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("must be set to a non-empty password", result.stderr)
        roles = self.psql("postgres", self.SUPERUSER_PASSWORD, "postgres", "-tAc",
                          "SELECT count(*) FROM pg_roles WHERE rolname LIKE '%\\_svc%'")
        self.assertEqual(roles.stdout.strip(), "0")


class PostgresK8sInitTest(PostgresClusterCase):
    """The dev overlay's per-service init script (k8s/overlays/dev/infra/postgres/), run the way
    the postgres image runs it, with the URLs of the very Secrets the service uses."""

    def urls(self) -> dict[str, tuple[str, str]]:
        """Per service: (runtime URL, owner URL)."""
        secrets = {d["metadata"]["name"].rsplit("-", 1)[0]: d for d in render_overlay("dev") if d["kind"] == "Secret"}
        url = lambda name: base64.b64decode(secrets[name]["data"]["url"]).decode()  # noqa: E731
        return {svc: (url(f"{svc}-database"), url(f"{svc}-database-owner")) for svc in DB_SERVICES}

    def init(self, url: str, owner_url: str):
        return self.psql("postgres", self.SUPERUSER_PASSWORD, "postgres", "-f", str(K8S_INIT_SQL),
                         env={"SERVICE_DATABASE_URL": url, "SERVICE_OWNER_URL": owner_url})

    def test_each_service_secret_pair_creates_an_owner_and_a_dml_only_role_for_its_own_database(self) -> None:
        # One cluster for all (the overlay runs one server each): also shows no cross access.
        urls = self.urls()
        for svc, (url, owner_url) in urls.items():
            result = self.init(url, owner_url)
            self.assertEqual(result.returncode, 0, f"{svc}: {result.stderr}")
        for svc, (url, owner_url) in urls.items():
            parts, owner = urlsplit(url), urlsplit(owner_url)
            self.assertEqual(parts.hostname, f"{svc}-db", "the URL names the in-namespace Service")
            role, password, db = parts.username, parts.password, parts.path.lstrip("/")
            own = self.psql(owner.username, owner.password, db, "-tAc",
                            "CREATE TABLE migrations_can_run (id int); SELECT current_database()")
            self.assertEqual(own.returncode, 0, own.stderr)
            self.assertEqual(own.stdout.strip(), db)
            dml = self.psql(role, password, db, "-tAc",
                            "INSERT INTO migrations_can_run VALUES (1); SELECT count(*) FROM migrations_can_run")
            self.assertEqual((dml.returncode, dml.stdout.strip()), (0, "1"), dml.stderr)
            ddl = self.psql(role, password, db, "-c", "CREATE TABLE intruder (id int)")
            self.assertIn("permission denied", ddl.stderr)
            drop = self.psql(role, password, db, "-c", "DROP TABLE migrations_can_run")
            self.assertIn("must be owner", drop.stderr)
            for other in ["postgres"] + [urlsplit(u).path.lstrip("/") for s, (u, _) in urls.items() if s != svc]:
                for who, pw in ((role, password), (owner.username, owner.password)):
                    denied = self.psql(who, pw, other, "-c", "SELECT 1")
                    self.assertNotEqual(denied.returncode, 0, f"{who} reached {other}")
                    self.assertIn("permission denied for database", denied.stderr)
            wrong = self.psql(role, "wrong", db, "-c", "SELECT 1")
            self.assertIn("password authentication failed", wrong.stderr)
        attrs = self.psql("postgres", self.SUPERUSER_PASSWORD, "postgres", "-tAc",
                          "SELECT count(*), bool_or(rolsuper OR rolcreatedb OR rolcreaterole OR rolreplication "
                          "OR rolbypassrls) FROM pg_roles WHERE rolname LIKE '%\\_svc%'")
        self.assertEqual(attrs.stdout.strip(), f"{2 * len(DB_SERVICES)}|f", "two unprivileged roles per service")

    def test_unusable_urls_abort_before_creating_anything(self) -> None:
        owner = "postgres://order_svc_owner:secret@order-db:5432/sagaworks_order"
        for url, owner_url in (("", owner),
                               ("postgres://order_svc@order-db:5432/sagaworks_order", owner),  # no password
                               ("postgres://order_svc:p%40ss@order-db:5432/sagaworks_order", owner),  # needs decoding
                               ("postgres://postgres:secret@order-db:5432/sagaworks_order", owner),  # the superuser
                               ("postgres://order_svc:secret@order-db:5432/template1", owner),
                               ("mysql://order_svc:secret@order-db:3306/sagaworks_order", owner),
                               ("postgres://order_svc:secret@order-db:5432/sagaworks_order", ""),
                               ("postgres://order_svc:secret@order-db:5432/sagaworks_order",
                                "postgres://order_svc_owner:secret@order-db:5432/sagaworks_other"),
                               ("postgres://order_svc:secret@order-db:5432/sagaworks_order",
                                "postgres://order_svc:secret@order-db:5432/sagaworks_order")):
            result = self.init(url, owner_url)
            self.assertNotEqual(result.returncode, 0, (url, owner_url))
            self.assertRegex(result.stderr, "SERVICE_DATABASE_URL|SERVICE_OWNER_URL", (url, owner_url))
        roles = self.psql("postgres", self.SUPERUSER_PASSWORD, "postgres", "-tAc",
                          "SELECT count(*) FROM pg_roles WHERE rolname LIKE '%\\_svc%'")
        self.assertEqual(roles.stdout.strip(), "0")


class KafkaInitTest(unittest.TestCase):
    def test_topic_script_is_valid_bash_covering_every_aggregate(self) -> None:
        raw = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
        script = raw["services"]["kafka-init"]["command"][0].replace("$$", "$")
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)
        # docs/design.md, "Events": the topics are <prefix>.<aggregate_type>; services.toml
        # says which services publish which.
        self.assertTrue(AGGREGATES)
        for aggregate in AGGREGATES:
            self.assertRegex(script, rf"\b{aggregate}\b")
        self.assertIn(".dlq", script)

    def test_start_script_is_valid_bash(self) -> None:
        subprocess.run(["bash", "-n", str(ROOT / "deploy/kafka/start.sh")], check=True)

    def test_k8s_topics_job_creates_the_same_topics(self) -> None:
        compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["kafka-init"]["command"][0]
        job = next(d for d in render_overlay("dev") if d["kind"] == "Job" and d["metadata"]["name"] == "kafka-topics")
        container = job["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(container["command"], ["/bin/bash", "-c"])
        script = container["args"][0]
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)
        self.assertNotIn("$(", script, "Kubernetes would expand $(VAR) in args")

        def shape(text: str) -> tuple:
            text = text.replace("$$", "$")
            return (re.findall(r"for aggregate in ([a-z ]+);", text),
                    re.findall(r"--partitions (\d+) --replication-factor (\d+)", text),
                    ".dlq" in text, "--if-not-exists" in text,
                    # As admin over SASL_SSL, every tool call; then the ACL file's lines.
                    text.count("--command-config"), "security.protocol=SASL_SSL" in text,
                    re.findall(r"/kafka-acls\.sh [^\n]*", text), re.findall(r"\$\{names//@PREFIX@/[^}]*\}", text))

        self.assertEqual(shape(script), shape(compose))
        self.assertEqual(shape(script)[6], ['/kafka-acls.sh "${admin[@]}" "${args[@]}" >/dev/null'])
        self.assertEqual(shape(script)[4], 1, "one admin=(... --command-config ...) array")
        self.assertEqual(container["image"], yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["kafka"]["image"])


class ManagedServicesExampleTest(unittest.TestCase):
    """k8s/overlays/prod/managed-services (a Component the prod overlay leaves disabled)
    still renders onto prod, and the result passes the workload checks."""

    def test_component_renders_onto_prod(self) -> None:
        with tempfile.TemporaryDirectory(prefix="sw-managed-") as tmp:
            shutil.copytree(ROOT / "k8s", Path(tmp) / "k8s")
            kustomization = Path(tmp) / "k8s" / "overlays" / "prod" / "kustomization.yaml"
            text = kustomization.read_text()
            self.assertIn("# components:\n#   - managed-services\n", text, "the commented-out line to enable it")
            kustomization.write_text(text.replace("# components:\n#   - managed-services\n", "components:\n  - managed-services\n"))
            kustomize = os.environ.get("SW_KUSTOMIZE", "kubectl kustomize").split()
            out = subprocess.run([*kustomize, str(kustomization.parent)], check=True, capture_output=True, text=True).stdout
        docs = [d for d in yaml.safe_load_all(out) if d]
        report = common.Report()
        workloads.check_workloads(report, "prod", docs)
        service_pods.check_service_pods(report, "prod", docs)
        ingress.check_ingress(report, "prod", docs)
        self.assertEqual(report.failures, [])
        for svc in DB_SERVICES:
            pod = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == svc)["spec"]["template"]["spec"]
            for container in pod["containers"] + pod["initContainers"]:
                mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
                self.assertEqual(mounts.get("kafka-client"), "/etc/sagaworks/kafka", f"{svc}/{container['name']}")
            config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(f"{svc}-config-"))
            self.assertEqual(config["data"]["APP_CONFIG_FILE"], "/etc/sagaworks/kafka/kafka.toml")
            data = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == f"{svc}-data")
            self.assertTrue(all("ipBlock" in peer for rule in data["spec"]["egress"] for peer in rule["to"]))


class BuildContextTest(unittest.TestCase):
    """What `docker build .` would send, per .dockerignore (docker-py's matcher)."""

    @classmethod
    def setUpClass(cls) -> None:
        from docker.utils.build import exclude_paths

        patterns = [
            line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        ]
        cls.context = {Path(p) for p in exclude_paths(str(ROOT), patterns)}

    def test_context_is_a_complete_workspace(self) -> None:
        with tempfile.TemporaryDirectory(prefix="sw-docker-context-") as tmp:
            for rel in sorted(self.context):
                src, dst = ROOT / rel, Path(tmp) / rel
                if src.is_file() and not src.is_symlink():
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, dst)
            # Every workspace member (and so every internal path dependency) is there.
            result = subprocess.run(
                ["cargo", "metadata", "--no-deps", "--offline", "--format-version", "1"],
                cwd=tmp, capture_output=True, text=True, timeout=300,
            )
            self.assertEqual(result.returncode, 0, result.stderr)
            members = {p["name"] for p in yaml.safe_load(result.stdout)["packages"]}
            self.assertLessEqual(set(SERVICES), members)

    def test_context_has_what_the_build_reads(self) -> None:
        wanted = [Path("Cargo.lock"), Path("deploy/http-probe")]
        wanted += [p.relative_to(ROOT) for p in (ROOT / "proto").glob("*.proto")]
        # Directories embedded at compile time by sqlx::migrate!("...").
        for source in ROOT.glob("services/*/src/**/*.rs"):
            for rel in re.findall(r'sqlx::migrate!\("([^"]+)"\)', source.read_text()):
                crate = ROOT / "services" / source.relative_to(ROOT).parts[1]
                wanted.append((crate / rel).resolve().relative_to(ROOT))
        # Files compiled in by include_str!/include_bytes! (relative to the source file), e.g.
        # libs/mtls's copy of services.toml, in every crate an image builds.
        for source in [*ROOT.glob("services/*/src/**/*.rs"), *ROOT.glob("libs/*/src/**/*.rs")]:
            for rel in re.findall(r'include_(?:str|bytes)!\("([^"]+)"\)', source.read_text()):
                wanted.append((source.parent / rel).resolve().relative_to(ROOT))
        for path in wanted:
            self.assertTrue(path in self.context, f"{path} is excluded from the build context")

    def test_context_leaves_out_what_the_build_does_not_read(self) -> None:
        for path in (".git", ".github", "target", "k8s", "docs", "docker-compose.yml", "deploy/Dockerfile"):
            self.assertFalse(Path(path) in self.context, f"{path} is sent to the build")


if __name__ == "__main__":
    unittest.main(verbosity=2)
