#!/usr/bin/env python3
"""Tests of scripts/generate (scripts/lib/generate/): the committed generated files and
regions are what services.toml and the templates give, `--check` names each file that a
hand edit or a changed services.toml leaves behind, and the template language behaves.

Run from anywhere: `python3 deploy/test_generate.py` (scripts/validate-deploy does).
Needs python3 >= 3.11 only.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

from generate import cli, targets  # noqa: E402
from generate.engine import GenerateError, render  # noqa: E402


def copy_inputs(root: Path) -> None:
    """Into `root`: services.toml, the templates, the files with regions and the generated files."""
    paths = ["services.toml", *targets.REGION_FILES]
    paths += [str(p.relative_to(ROOT)) for g in targets.GENERATED_GLOBS for p in ROOT.glob(g)]
    for rel in paths:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, root / rel)
    shutil.copytree(ROOT / targets.TEMPLATES, root / targets.TEMPLATES)


def named(problems: list[str]) -> list[str]:
    return sorted(p.split(" ", 1)[0] for p in problems)


class CommittedTest(unittest.TestCase):
    def test_the_committed_files_are_what_generate_writes(self) -> None:
        self.assertEqual(cli.diffs(ROOT), [])

    def test_check_exits_0_on_the_committed_tree(self) -> None:
        done = subprocess.run([str(ROOT / "scripts" / "generate"), "--check"], capture_output=True, text=True)
        self.assertEqual(done.returncode, 0, done.stderr)


class CheckTest(unittest.TestCase):
    """--check on a copy of the inputs, after each kind of drift."""

    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="sw-generate-")
        self.root = Path(self.tmp.name)
        copy_inputs(self.root)
        self.assertEqual(cli.diffs(self.root), [], "a fresh copy checks clean")

    def tearDown(self) -> None:
        self.tmp.cleanup()

    def edit(self, rel: str, old: str, new: str) -> None:
        path = self.root / rel
        text = path.read_text()
        self.assertIn(old, text)
        path.write_text(text.replace(old, new, 1))

    def test_a_hand_edit_of_a_generated_file_is_named_with_its_diff(self) -> None:
        self.edit("k8s/base/payment/service.yaml", "port: 8083", "port: 8093")
        problems = cli.diffs(self.root)
        self.assertEqual(named(problems), ["k8s/base/payment/service.yaml"])
        self.assertIn("-      port: 8093", problems[0])
        self.assertIn("+      port: 8083", problems[0])

    def test_a_hand_edit_inside_a_region_is_named(self) -> None:
        self.edit("docker-compose.yml", "APP_GRPC__PORT: 7082", "APP_GRPC__PORT: 7092")
        self.assertEqual(named(cli.diffs(self.root)), ["docker-compose.yml"])

    def test_a_hand_edit_of_a_per_service_piece_is_named(self) -> None:
        """Each breakage of a per-service piece: --check names the file it is in. (These are
        the pieces generation writes, so no deploy/tidy check compares them with services.toml.)"""
        edits = {
            # compose: a published gRPC port, the image, the build, the healthcheck, a port, an
            # unknown key, a plaintext client URL, mutual TLS, the database role, the Kafka user.
            "gRPC published": ("docker-compose.yml", "    depends_on: *backend-depends\n",
                               "    depends_on: *backend-depends\n    ports: [\"127.0.0.1:7083:7083\"]\n"),
            "compose image": ("docker-compose.yml", "image: sagaworks/order:", "image: acme/order:"),
            "compose build": ("docker-compose.yml", "SERVICE: payment", "SERVICE: order"),
            "healthcheck": ("docker-compose.yml", '"http-probe", "8080"', '"http-probe", "7081"'),
            "compose port": ("docker-compose.yml", "APP_GRPC__PORT: 7083", "APP_GRPC__PORT: 7082"),
            "unknown key": ("docker-compose.yml", "APP_GRPC__PORT: 7083", "APP_GRPC__PORTT: 7083"),
            "client URL": ("docker-compose.yml", "APP_PAYMENT__URL: https://payment:7083", "APP_PAYMENT__URL: http://payment:7083"),
            "no TLS key": ("docker-compose.yml", "      APP_TLS__KEY_FILE: /certs/payment-key.pem\n", ""),
            "superuser": ("docker-compose.yml", "postgres://order_svc:", "postgres://postgres:"),
            "SCRAM users": ("docker-compose.yml", "SCRAM_USERS: inventory payment order", "SCRAM_USERS: inventory payment"),
            "Kafka password": ("docker-compose.yml", "APP_KAFKA__SASL_PASSWORD: ${INVENTORY_KAFKA_PASSWORD",
                               "APP_KAFKA__SASL_PASSWORD: ${ORDER_KAFKA_PASSWORD"),
            # the k8s base: the image, container ports, a probe, the Service, the HPA, the
            # ConfigMap, the callers a gRPC port admits, the gateway's open HTTP port.
            "k8s image": ("k8s/base/order/deployment.yaml", "image: sagaworks/order:latest", "image: acme/order:latest"),
            "container port": ("k8s/base/payment/deployment.yaml", "containerPort: 7083", "containerPort: 7082"),
            "probe on gRPC": ("k8s/base/inventory/deployment.yaml", "path: /health/ready\n              port: http",
                              "path: /health/ready\n              port: grpc"),
            "Service port": ("k8s/base/gateway/service.yaml", "port: 8080", "port: 80"),
            "HPA target": ("k8s/base/order/hpa.yaml", "    name: order\n", "    name: orders\n"),
            "ConfigMap URL": ("k8s/base/order/kustomization.yaml", "APP_PAYMENT__URL=https://payment:7083",
                              "APP_PAYMENT__URL=https://payment:7082"),
            "extra caller": ("k8s/base/order/network-policy.yaml", "app.kubernetes.io/name: gateway",
                             "app.kubernetes.io/name: payment"),
            "gateway closed": ("k8s/base/gateway/network-policy.yaml", "    - ports:\n        - protocol: TCP\n          port: 8080\n", ""),
            # the overlays: a database Secret's role, a Kafka user's Secret, SCRAM users, a
            # database or Kafka open to another service, a Prometheus job and its Service.
            "dev database URL": ("k8s/overlays/dev/kustomization.yaml", "url=postgres://order_svc:", "url=postgres://postgres:"),
            "dev Kafka user": ("k8s/overlays/dev/kustomization.yaml", "APP_KAFKA__SASL_USERNAME=payment",
                               "APP_KAFKA__SASL_USERNAME=order"),
            "dev Kafka password": ("k8s/overlays/dev/kafka-credentials.yaml", "name: payment-kafka", "name: order-kafka"),
            "dev SCRAM users": ("k8s/overlays/dev/infra/kafka.yaml", "value: inventory payment order", "value: inventory payment"),
            "database policy": ("k8s/overlays/dev/infra/network-policies.yaml", "app.kubernetes.io/name: order\n      ports:\n        - protocol: TCP\n          port: 5432",
                                "app.kubernetes.io/name: inventory\n      ports:\n        - protocol: TCP\n          port: 5432"),
            "Kafka policy": ("k8s/overlays/dev/infra/network-policies.yaml", "        - podSelector:\n            matchLabels:\n              app.kubernetes.io/name: payment\n        - podSelector:",
                             "        - podSelector: {}\n        - podSelector:"),
            "Prometheus job": ("k8s/overlays/dev/infra/observability/prometheus/prometheus.yml", "port: 8081", "port: 7081"),
            "headless Service": ("k8s/overlays/dev/infra/prometheus.yaml", "clusterIP: None", "clusterIP: 10.0.0.9"),
        }
        for what, (rel, old, new) in edits.items():
            with self.subTest(what):
                before = (self.root / rel).read_text()
                self.edit(rel, old, new)
                self.assertEqual(named(cli.diffs(self.root)), [rel])
                (self.root / rel).write_text(before)
        (self.root / "k8s/base/payment/pdb.yaml").unlink()
        self.assertEqual(cli.diffs(self.root)[0].split(":")[0],
                         "k8s/base/payment/pdb.yaml is missing from what services.toml and the templates give")

    def test_a_hand_edit_outside_the_regions_is_not_generate_s_business(self) -> None:
        self.edit("docker-compose.yml", "retries: 20", "retries: 21")
        self.assertEqual(cli.diffs(self.root), [])

    def test_a_changed_services_toml_without_generate_names_every_file_it_changes(self) -> None:
        self.edit("services.toml", "http_port = 8083", "http_port = 8093")
        got = named(cli.diffs(self.root))
        for rel in ("docker-compose.yml", "k8s/base/payment/deployment.yaml", "k8s/base/payment/kustomization.yaml",
                    "k8s/base/payment/service.yaml", "deploy/observability/prometheus/prometheus.yml",
                    "k8s/overlays/dev/infra/prometheus.yaml", "docs/design.md"):
            self.assertIn(rel, got)
        self.assertNotIn("k8s/base/order/deployment.yaml", got)
        cli.write(self.root)
        self.assertEqual(cli.diffs(self.root), [], "generate then check is clean")
        self.assertIn("containerPort: 8093", (self.root / "k8s/base/payment/deployment.yaml").read_text())

    def test_a_new_call_opens_the_callee_s_port_to_the_caller(self) -> None:
        self.edit("services.toml", 'consumes = []\ncalls = []',
                  'consumes = []\ncalls = ["inventory"]\n[service.rpcs]\ninventory = ["InventoryService/GetStock"]')
        self.assertIn("k8s/base/inventory/network-policy.yaml", named(cli.diffs(self.root)))
        cli.write(self.root)
        policy = (self.root / "k8s/base/inventory/network-policy.yaml").read_text()
        self.assertIn("# inventory: gRPC from payment and order and gateway", policy)
        egress = (self.root / "k8s/base/payment/network-policy.yaml").read_text()
        self.assertIn("policyTypes: [Ingress, Egress]", egress)
        self.assertIn("app.kubernetes.io/name: inventory", egress)

    def test_the_gateway_s_deployment_follows_its_entry(self) -> None:
        self.edit("services.toml", "http_port = 8080", "http_port = 8090")
        got = named(cli.diffs(self.root))
        for rel in ("docker-compose.yml", "k8s/base/gateway/deployment.yaml", "k8s/base/gateway/kustomization.yaml",
                    "k8s/base/gateway/network-policy.yaml", "k8s/base/gateway/service.yaml"):
            self.assertIn(rel, got)
        cli.write(self.root)
        self.assertIn('"127.0.0.1:${GATEWAY_PORT:-8090}:8090"', (self.root / "docker-compose.yml").read_text())
        self.assertIn("port: 8090", (self.root / "k8s/base/gateway/network-policy.yaml").read_text())

    def test_a_generated_file_of_a_service_no_longer_listed_is_named_and_deleted(self) -> None:
        stale = self.root / "k8s/base/gone/service.yaml"
        stale.parent.mkdir()
        shutil.copyfile(self.root / "k8s/base/payment/service.yaml", stale)
        self.assertEqual(cli.diffs(self.root), ["k8s/base/gone/service.yaml is generated for a service services.toml "
                                                "does not list"])
        cli.write(self.root)
        self.assertFalse(stale.parent.exists())

    def test_a_region_without_its_end_is_an_error(self) -> None:
        self.edit("k8s/base/kustomization.yaml", "  # END generated\n", "")
        with self.assertRaisesRegex(GenerateError, "no END"):
            cli.diffs(self.root)


class TemplateTest(unittest.TestCase):
    def test_placeholders_lists_and_conditionals(self) -> None:
        ctx = {"name": "a", "items": ["x: 1", "y: 2"], "none": [], "yes": True}
        text = "n: {{name}}\n  {{items}}\n  {{none}}\n{{#if yes}}\nyes\n{{#else}}\nno\n{{/if}}\n{{#if none}}\nsome\n{{#else}}\nnone\n{{/if}}\n"
        self.assertEqual(render(text, ctx), "n: a\n  x: 1\n  y: 2\nyes\nnone\n")

    def test_an_unknown_placeholder_is_an_error(self) -> None:
        with self.assertRaisesRegex(GenerateError, r"unknown placeholder \{\{nme\}\}"):
            render("{{nme}}\n", {"name": "a"})

    def test_a_list_inside_a_line_is_an_error(self) -> None:
        with self.assertRaisesRegex(GenerateError, "stand alone"):
            render("x: {{items}}\n", {"items": ["a"]})


if __name__ == "__main__":
    unittest.main(verbosity=2)
