#!/usr/bin/env python3
"""The deployment wiring of a service made by scripts/new-service, added and taken back.

    python3 scripts/lib/wiring.py add <name>      (scripts/new-service runs it)
    python3 scripts/lib/wiring.py remove <name>   (scripts/remove-service runs it)
    python3 scripts/lib/wiring.py list <name>     the files it edits or creates
    python3 scripts/lib/wiring.py acls            rewrite deploy/kafka/acls.txt

Both read the service's [[service]] entry in services.toml (its ports, database, topics and
the services it calls): `add` after new-service appended it, `remove` before
remove-service deletes it. Run from anywhere; paths are relative to the repository root.

What reads services.toml at use time needs nothing here: scripts/dev-up (processes,
databases, roles, ports, certificates, Kafka users and ACLs), scripts/compose-env (.env
passwords, certificates), deploy/release_images.py, libs/mtls (the gRPC allow-list, compiled
in), the Grafana dashboards (every panel is per `service`/`job` label, none names a service).
What must list the service in a static file is written here, from deploy/template/wiring/
(whole files) and the fragments below, and checked by deploy/consistency.py and
deploy/test_deploy.py like the hand-written entries of the other services:

* whole files: k8s/base/<name>/ (Deployment with the migrate init container, Service, HPA,
  PDB, NetworkPolicies, Certificate, ConfigMap) and the dev overlay's PostgreSQL
  k8s/overlays/dev/infra/postgres/<name>-db.yaml;
* blocks between `>>> new-service <name>` and `<<< new-service <name>` comment lines:
  docker-compose.yml (the service, its database passwords, its Kafka user) and its override
  for the images built here (deploy/containers/local.yml), the postgres
  init (deploy/postgres/init.sql), the overlays (images, ConfigMaps, Secrets, Kafka
  credentials, the database's and Kafka's NetworkPolicies, the Prometheus metrics Service,
  the managed-services example), the callees' gRPC ingress, both Prometheus configs,
  tests/system/deploy.rs and the Cargo manifests;
* single words in lists that cannot hold a comment (SCRAM_USERS, the topics loops of the
  Kafka init steps, deploy/config-keys.txt's callers, the dev PDB selector), a row of
  docs/design.md's table, and deploy/kafka/acls.txt (regenerated from services.toml).

`remove` deletes exactly what `add` wrote, so add + remove leaves the tree as it was
(deploy/test_deploy.py and scripts/test-new-service check it byte for byte). It reads the
entry as it is then: when you change `calls` or `topics` of a generated service, run
`remove` with the old entry, or rewire by hand (deploy/consistency.py names what is off).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent.parent
# services.toml's loader, beside this file.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from services_toml import load_services  # noqa: E402

TEMPLATE = ROOT / "deploy" / "template" / "wiring"


class WiringError(Exception):
    pass


@dataclass
class Entry:
    name: str
    http: int
    grpc: int
    role: str
    suffix: str
    topics: list[str]
    calls: list[str]
    ports: dict[str, int]  # every service's gRPC port (the callees')


def load_entry(name: str, path: Path | None = None) -> Entry:
    try:
        services = load_services(path or ROOT / "services.toml")
    except ValueError as e:
        raise WiringError(str(e)) from None
    spec = services.get(name)
    if spec is None:
        raise WiringError(f"services.toml has no service {name!r}")
    if spec.kind != "backend" or spec.database is None or spec.ports.grpc is None:
        raise WiringError(f"{name}: only a backend with a database (what scripts/new-service makes) is wired here")
    return Entry(
        name=name, http=spec.ports.http, grpc=spec.ports.grpc, role=spec.database.role,
        suffix=spec.database.suffix, topics=list(spec.topics), calls=list(spec.calls),
        ports={n: s.ports.grpc for n, s in services.items() if s.ports.grpc is not None},
    )


# --- rendering ---------------------------------------------------------------------------


def values(e: Entry) -> dict[str, str | list[str]]:
    """The placeholders: a str replaces `{{key}}` anywhere; a list replaces a line that holds
    only `{{key}}`, one line per item at that line's indentation."""
    return {
        "name": e.name, "Name": e.name[:1].upper() + e.name[1:], "NAME": e.name.upper(),
        "http_port": str(e.http), "grpc_port": str(e.grpc), "role": e.role, "db": f"sagaworks_{e.suffix}",
        "calls_text": " and ".join(e.calls) or "nothing",
        "client_urls": [f"- APP_{c.upper()}__URL=https://{c}:{e.ports[c]}" for c in e.calls],
        "compose_client_urls": [f"APP_{c.upper()}__URL: https://{c}:{e.ports[c]}" for c in e.calls],
        "compose_depends": [line for c in e.calls for line in (f"{c}:", "  condition: service_healthy")],
        "egress_to_callees": [
            line for c in e.calls for line in (
                "- to:", "    - podSelector:", "        matchLabels:", f"          app.kubernetes.io/name: {c}",
                "  ports:", "    - protocol: TCP", f"      port: {e.ports[c]}")
        ],
    }


def render(text: str, e: Entry) -> str:
    vals = values(e)
    out = []
    for line in text.splitlines(keepends=True):
        m = re.fullmatch(r"( *)\{\{(\w+)\}\}\n?", line)
        if m and isinstance(vals.get(m[2]), list):
            out.extend(f"{m[1]}{item}\n" for item in vals[m[2]])
            continue
        out.append(line)
    text = "".join(out)
    for key, value in vals.items():
        if isinstance(value, str):
            text = text.replace("{{" + key + "}}", value)
    left = re.search(r"\{\{\w+\}\}", text)
    if left:
        raise WiringError(f"unreplaced placeholder {left[0]}")
    return text


# --- edits ------------------------------------------------------------------------------


def _find(lines: list[str], walk: tuple[str, ...], path: str) -> int:
    """The index of the line reached by matching each regex of `walk` in turn (each from
    the line the previous one matched on, inclusive for the first, exclusive after)."""
    i = 0
    for n, pattern in enumerate(walk):
        start = i if n == 0 else i + 1
        for j in range(start, len(lines)):
            if re.search(pattern, lines[j]):
                i = j
                break
        else:
            raise WiringError(f"{path}: no line matching {pattern!r} (after {walk[:n]})")
    return i


def _markers(comment: str, name: str) -> tuple[str, str]:
    return (f"{comment} >>> new-service {name} (scripts/remove-service takes it back)",
            f"{comment} <<< new-service {name}")


@dataclass
class Block:
    """A rendered fragment between marker comments, inserted before the line `walk` reaches
    (at the end of the file when `walk` is empty)."""

    path: str
    walk: tuple[str, ...]
    fragment: str
    comment: str = "#"
    indent: str = ""
    #: A blank line after the end marker (part of the block: removed with it).
    blank_after: bool = False

    def add(self, text: str, e: Entry) -> str:
        begin, end = _markers(self.comment, e.name)
        block = f"{self.indent}{begin}\n{render(self.fragment, e)}{self.indent}{end}\n"
        if self.blank_after:
            block += "\n"
        lines = text.splitlines(keepends=True)
        if not self.walk:
            return text + ("" if text.endswith("\n") or not text else "\n") + block
        at = _find(lines, self.walk, self.path)
        return "".join(lines[:at]) + block + "".join(lines[at:])

    def remove(self, text: str, e: Entry) -> str:
        begin, end = _markers(self.comment, e.name)
        lines = text.splitlines(keepends=True)
        out, inside, skip_blank = [], False, False
        for line in lines:
            stripped = line.strip()
            if skip_blank:
                skip_blank = False
                if not stripped:
                    continue
            if stripped == begin:
                inside = True
            elif inside and stripped == end:
                inside, skip_blank = False, self.blank_after
            elif not inside:
                out.append(line)
        if inside:
            raise WiringError(f"{self.path}: `{begin}` without its end marker")
        return "".join(out)


@dataclass
class Words:
    """Words added to a list on one line: the line `walk` reaches, the list being group 1 of
    `pattern` on it, its items separated by `sep`."""

    path: str
    walk: tuple[str, ...]
    pattern: str
    words: Callable[[Entry], list[str]]
    sep: str = " "

    def _edit(self, text: str, e: Entry, change: Callable[[list[str], list[str]], list[str]]) -> str:
        lines = text.splitlines(keepends=True)
        at = _find(lines, self.walk, self.path)
        m = re.search(self.pattern, lines[at])
        if not m:
            raise WiringError(f"{self.path}:{at + 1}: no {self.pattern!r} in {lines[at]!r}")
        items = [w for w in m[1].split(self.sep.strip() or None) if w.strip()]
        items = [w.strip() for w in items]
        joined = self.sep.join(change(items, self.words(e)))
        lines[at] = lines[at][: m.start(1)] + joined + lines[at][m.end(1):]
        return "".join(lines)

    def add(self, text: str, e: Entry) -> str:
        def change(items: list[str], words: list[str]) -> list[str]:
            clash = [w for w in words if w in items]
            if clash:
                raise WiringError(f"{self.path}: {clash} already listed")
            return items + words
        return self._edit(text, e, change)

    def remove(self, text: str, e: Entry) -> str:
        return self._edit(text, e, lambda items, words: [w for w in items if w not in words])


@dataclass
class Line:
    """One whole line (no room for markers: a Markdown table row), inserted before the line
    `walk` reaches; removed by its exact text."""

    path: str
    walk: tuple[str, ...]
    fragment: str

    def add(self, text: str, e: Entry) -> str:
        row = render(self.fragment, e)
        lines = text.splitlines(keepends=True)
        if row in lines:
            raise WiringError(f"{self.path} already holds {row.strip()!r}")
        at = _find(lines, self.walk, self.path)
        return "".join(lines[:at]) + row + "".join(lines[at:])

    def remove(self, text: str, e: Entry) -> str:
        row = render(self.fragment, e)
        return "".join(line for line in text.splitlines(keepends=True) if line != row)


# --- the fragments ------------------------------------------------------------------------

COMPOSE_SERVICE = """\
  {{name}}:
    <<: *service
    image: sagaworks/{{name}}:${SAGAWORKS_TAG:-dev}
    build:
      context: .
      dockerfile: deploy/Dockerfile
      args:
        SERVICE: {{name}}
    environment:
      <<: *backend-env
      APP_HTTP__PORT: {{http_port}}
      APP_GRPC__PORT: {{grpc_port}}
      APP_DATABASE__URL: postgres://{{role}}:${{{NAME}}_DB_PASSWORD:-{{name}}-dev-password}@postgres:5432/{{db}}
      # The migrations at start-up run as the database's owner; the service serves as {{role}}.
      APP_DATABASE__OWNER_URL: postgres://{{role}}_owner:${{{NAME}}_DB_OWNER_PASSWORD:-{{name}}-owner-dev-password}@postgres:5432/{{db}}
      {{compose_client_urls}}
      APP_KAFKA__SASL_USERNAME: {{name}}
      APP_KAFKA__SASL_PASSWORD: ${{{NAME}}_KAFKA_PASSWORD:?run scripts/compose-env first (it writes .env)}
      APP_TLS__CERT_FILE: /certs/{{name}}.pem
      APP_TLS__KEY_FILE: /certs/{{name}}-key.pem
      OTEL_SERVICE_NAME: {{name}}
    volumes:
      - ./.dev/compose/certs/ca.pem:/certs/ca.pem:ro
      - ./.dev/compose/certs/kafka-ca.pem:/certs/kafka-ca.pem:ro
      - ./.dev/compose/certs/{{name}}.pem:/certs/{{name}}.pem:ro
      - ./.dev/compose/certs/{{name}}-key.pem:/certs/{{name}}-key.pem:ro
    depends_on:
      <<: *backend-depends
      {{compose_depends}}
    healthcheck:
      <<: *healthcheck
      test: ["CMD", "http-probe", "{{http_port}}", "/health/ready"]
"""

COMPOSE_LOCAL_SERVICE = """\
  {{name}}:
    <<: *local
    depends_on:
      otel-collector:
        condition: service_healthy
"""

COMPOSE_DB_PASSWORDS = """\
      {{NAME}}_DB_PASSWORD: ${{{NAME}}_DB_PASSWORD:-{{name}}-dev-password}
      {{NAME}}_DB_OWNER_PASSWORD: ${{{NAME}}_DB_OWNER_PASSWORD:-{{name}}-owner-dev-password}
"""

COMPOSE_KAFKA_PASSWORD = """\
      {{NAME}}_KAFKA_PASSWORD: ${{{NAME}}_KAFKA_PASSWORD:?run scripts/compose-env first (it writes .env)}
"""

INIT_SQL_PASSWORDS = """\
\\getenv {{name}}_password {{NAME}}_DB_PASSWORD
\\if :{?{{name}}_password}
\\else
    \\set {{name}}_password ''
\\endif
SELECT :'{{name}}_password' = '' AS missing_password \\gset
\\if :missing_password
    DO $$ BEGIN RAISE EXCEPTION '{{NAME}}_DB_PASSWORD must be set to a non-empty password'; END $$;
\\endif

\\getenv {{name}}_owner_password {{NAME}}_DB_OWNER_PASSWORD
\\if :{?{{name}}_owner_password}
\\else
    \\set {{name}}_owner_password ''
\\endif
SELECT :'{{name}}_owner_password' = '' AS missing_password \\gset
\\if :missing_password
    DO $$ BEGIN RAISE EXCEPTION '{{NAME}}_DB_OWNER_PASSWORD must be set to a non-empty password'; END $$;
\\endif

"""

INIT_SQL_DATABASE = """\

CREATE ROLE {{role}}_owner LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD :'{{name}}_owner_password';
CREATE ROLE {{role}} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD :'{{name}}_password';
CREATE DATABASE {{db}} OWNER {{role}}_owner;
REVOKE CONNECT, TEMPORARY ON DATABASE {{db}} FROM PUBLIC;
GRANT CONNECT ON DATABASE {{db}} TO {{role}};
\\connect {{db}}
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO {{role}};
ALTER DEFAULT PRIVILEGES FOR ROLE {{role}}_owner IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {{role}};
ALTER DEFAULT PRIVILEGES FOR ROLE {{role}}_owner IN SCHEMA public GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO {{role}};
\\connect postgres
"""

COMPOSE_PROMETHEUS_JOB = """\
  - job_name: {{name}}
    metrics_path: /metrics
    static_configs:
      - targets: ["{{name}}:{{http_port}}"]
"""

K8S_PROMETHEUS_JOB = """\
  - job_name: {{name}}
    metrics_path: /metrics
    dns_sd_configs:
      - names: [{{name}}-metrics]
        type: A
        port: {{http_port}}
        refresh_interval: 15s
"""

IMAGE = """\
  - name: sagaworks/{{name}}
    newTag: {tag}
"""

DEV_CONFIG = """\
  - name: {{name}}-config
    behavior: merge
    literals:
      - APP_ENVIRONMENT=development
      - APP_TELEMETRY__LOG_LEVEL=debug
      - APP_TELEMETRY__OTLP_ENDPOINT=http://otel-collector:4317
      - APP_KAFKA__BROKERS=kafka:9092
      - APP_KAFKA__SECURITY_PROTOCOL=sasl_ssl
      - APP_KAFKA__SASL_USERNAME={{name}}
      - APP_KAFKA__SSL_CA_FILE=/etc/sagaworks/kafka-ca/ca.crt
"""

DEV_DATABASE_SECRETS = """\
  - name: {{name}}-database
    literals:
      - url=postgres://{{role}}:dev-only-{{name}}-password@{{name}}-db:5432/{{db}}
  - name: {{name}}-database-owner
    literals:
      - url=postgres://{{role}}_owner:dev-only-{{name}}-owner-password@{{name}}-db:5432/{{db}}
"""

DEV_KAFKA_SECRET = """\
  - name: {{name}}-kafka
    literals:
      - password=dev-only-{{name}}-kafka-password
"""

DEV_DATA_PEERS = """\
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{name}}-data
spec:
  egress:
    - to:
        - podSelector:
            matchLabels:
              app.kubernetes.io/name: {{name}}-db
      ports:
        - protocol: TCP
          port: 5432
    - to:
        - podSelector:
            matchLabels:
              app.kubernetes.io/name: kafka
      ports:
        - protocol: TCP
          port: 9092
"""

DEV_KAFKA_CREDENTIALS = """\
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{name}}
spec:
  template:
    spec:
      initContainers:
        - name: migrate
          env:
            - name: APP_KAFKA__SASL_PASSWORD
              valueFrom:
                secretKeyRef:
                  name: {{name}}-kafka
                  key: password
      containers:
        - name: {{name}}
          env:
            - name: APP_KAFKA__SASL_PASSWORD
              valueFrom:
                secretKeyRef:
                  name: {{name}}-kafka
                  key: password
          volumeMounts:
            - name: kafka-ca
              mountPath: /etc/sagaworks/kafka-ca
              readOnly: true
      volumes:
        # The Kafka CA (ca.crt of the broker's Secret kafka-tls, not its key), which
        # APP_KAFKA__SSL_CA_FILE names: the broker's certificate is of the Kafka CA, not of
        # the services' CA in the service's own TLS Secret.
        - name: kafka-ca
          secret:
            secretName: kafka-tls
            items:
              - key: ca.crt
                path: ca.crt
            defaultMode: 0440 # group: the pod's fsGroup
"""

DEV_DB_POLICY = """\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{name}}-db
spec:
  podSelector:
    matchLabels:
      app.kubernetes.io/name: {{name}}-db
  policyTypes: [Ingress]
  ingress:
    - from:
        - podSelector:
            matchLabels:
              app.kubernetes.io/name: {{name}}
      ports:
        - protocol: TCP
          port: 5432
---
"""

POD_SELECTOR = """\
        - podSelector:
            matchLabels:
              app.kubernetes.io/name: {{name}}
"""

DEV_PROMETHEUS_EGRESS = """\
        - protocol: TCP
          port: {{http_port}}
"""

DEV_KAFKA_PASSWORD_ENV = """\
            - name: {{NAME}}_KAFKA_PASSWORD
              valueFrom:
                secretKeyRef:
                  name: {{name}}-kafka
                  key: password
"""

DEV_METRICS_SERVICE = """\
apiVersion: v1
kind: Service
metadata:
  name: {{name}}-metrics
  labels:
    app.kubernetes.io/name: {{name}}
    app.kubernetes.io/component: telemetry
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector:
    app.kubernetes.io/name: {{name}}
  ports:
    - name: http
      port: {{http_port}}
      targetPort: http
      protocol: TCP
---
"""

PROD_CONFIG = """\
  - name: {{name}}-config
    behavior: merge
    literals:
      - APP_ENVIRONMENT=production
"""

MANAGED_CONFIG = """\
  - name: {{name}}-config
    behavior: merge
    literals:
      - APP_KAFKA__BROKERS=b-1.sagaworks.abc123.c2.kafka.eu-west-1.amazonaws.com:9096,b-2.sagaworks.abc123.c2.kafka.eu-west-1.amazonaws.com:9096
      - APP_CONFIG_FILE=/etc/sagaworks/kafka/kafka.toml
"""

MANAGED_KAFKA_CLIENT = """\
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{name}}
spec:
  template:
    spec:
      initContainers:
        - name: migrate
          volumeMounts:
            - name: kafka-client
              mountPath: /etc/sagaworks/kafka
              readOnly: true
      containers:
        - name: {{name}}
          volumeMounts:
            - name: kafka-client
              mountPath: /etc/sagaworks/kafka
              readOnly: true
      volumes:
        - name: kafka-client
          secret:
            secretName: {{name}}-kafka
            # Readable by the pod's group (fsGroup 10001) only.
            defaultMode: 0440
"""

MANAGED_EGRESS = """\
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{name}}-data
spec:
  egress:
    # The managed PostgreSQL instance of {{name}} (its private endpoint's subnet).
    - to:
        - ipBlock:
            cidr: 10.20.0.0/24
      ports:
        - protocol: TCP
          port: 5432
    # The managed Kafka brokers.
    - to:
        - ipBlock:
            cidr: 10.20.8.0/22
      ports:
        - protocol: TCP
          port: 9096
"""

DEPLOY_RS_SETTINGS = """\
            "{{name}}" => Service::of::<{{name}}::config::Settings>(name, http, grpc),
"""

CARGO_WORKSPACE_DEP = """\
{{name}} = { path = "services/{{name}}" }
"""

CARGO_TESTS_DEP = """\
{{name}} = { workspace = true, features = ["test-hooks"] }
"""

DESIGN_ROW = "| {{name}} | {{grpc_port}} | {{http_port}} | `{{db}}` | `{{role}}` |\n"

K8S = "k8s/overlays/dev"
INFRA = f"{K8S}/infra"
PROD = "k8s/overlays/prod"
COMPOSE = "docker-compose.yml"


def topics(e: Entry) -> list[str]:
    return e.topics


def name_only(e: Entry) -> list[str]:
    return [e.name]


def edits(e: Entry) -> list[Block | Words | Line]:
    """Every edit of an existing file, in the order `add` applies them."""
    out: list[Block | Words | Line] = [
        # docker-compose.yml
        Block(COMPOSE, (r"^services:$", r"^  postgres:$", r"^    volumes:$"), COMPOSE_DB_PASSWORDS, indent="      "),
        Words(COMPOSE, (r"^services:$", r"^  kafka:$", r"^      SCRAM_USERS: "), r"SCRAM_USERS: (.*)$", name_only),
        Block(COMPOSE, (r"^services:$", r"^  kafka:$", r"^    volumes:$"), COMPOSE_KAFKA_PASSWORD, indent="      "),
        Words(COMPOSE, (r"^services:$", r"^  kafka-init:$", r"for aggregate in "), r"for aggregate in ([a-z0-9 ]+);", topics),
        Block(COMPOSE, (r"^networks:$",), COMPOSE_SERVICE, indent="  ", blank_after=True),
        Block("deploy/observability/prometheus/prometheus.yml", (), COMPOSE_PROMETHEUS_JOB, indent="  "),
        # compose's override for the images built here (scripts/images builds every service)
        Block("deploy/containers/local.yml", (), COMPOSE_LOCAL_SERVICE, indent="  "),
        # the postgres init of compose
        Block("deploy/postgres/init.sql", (r"^-- Nobody but the superuser",), INIT_SQL_PASSWORDS, comment="--"),
        Block("deploy/postgres/init.sql", (), INIT_SQL_DATABASE, comment="--"),
        # the k8s base: its directory (created_files) in the resources
        Block("k8s/base/kustomization.yaml", (), "  - {{name}}\n", indent="  "),
    ]
    for callee in e.calls:
        out += [
            # the callee admits it to its gRPC port (its first ingress rule)
            Block(f"k8s/base/{callee}/network-policy.yaml", (r"^  ingress:$", r"^      ports:$"), POD_SELECTOR,
                  indent="        "),
            Words("deploy/config-keys.txt", (rf"^APP_{callee.upper()}__URL\s",), rf"^APP_{callee.upper()}__URL\s+(.*)$",
                  name_only),
        ]
    out += [
        # the dev overlay
        Block(f"{K8S}/kustomization.yaml", (r"^images:$", r"^# Debug logs"), IMAGE.replace("{tag}", "dev"), indent="  "),
        Block(f"{K8S}/kustomization.yaml", (r"^configMapGenerator:$", r"^# The services' database URLs"), DEV_CONFIG,
              indent="  "),
        Block(f"{K8S}/kustomization.yaml", (r"^secretGenerator:$", r"^  - name: gateway-auth$"), DEV_DATABASE_SECRETS,
              indent="  "),
        Block(f"{K8S}/kustomization.yaml", (r"^secretGenerator:$", r"^patches:$"), DEV_KAFKA_SECRET, indent="  "),
        Words(f"{K8S}/kustomization.yaml", (r"^  - target:$", r"labelSelector: app.kubernetes.io/name in \("),
              r"in \(([a-z0-9,]+)\)", name_only, sep=","),
        Block(f"{K8S}/in-namespace-peers.yaml", (r"^  name: allow-otlp-egress$", r"^---$"), DEV_DATA_PEERS),
        Block(f"{K8S}/kafka-credentials.yaml", (), DEV_KAFKA_CREDENTIALS),
        Block(f"{INFRA}/kustomization.yaml", (r"^resources:$", r"^  - kafka.yaml$"), "  - postgres/{{name}}-db.yaml\n",
              indent="  "),
        Block(f"{INFRA}/network-policies.yaml", (r"^  name: kafka$", r"^apiVersion:"), DEV_DB_POLICY),
        Block(f"{INFRA}/network-policies.yaml", (r"^  name: kafka$", r"^      ports:$"), POD_SELECTOR, indent="        "),
        Block(f"{INFRA}/network-policies.yaml", (r"^  name: prometheus$", r"^---$"), DEV_PROMETHEUS_EGRESS,
              indent="        "),
        Words(f"{INFRA}/kafka.yaml", (r"- name: SCRAM_USERS$", r"value: "), r"value: (.*)$", name_only),
        Block(f"{INFRA}/kafka.yaml", (r"- name: SCRAM_USERS$", r"# server.properties, the keystore"),
              DEV_KAFKA_PASSWORD_ENV, indent="            "),
        Words(f"{INFRA}/kafka-topics.yaml", (r"for aggregate in ",), r"for aggregate in ([a-z0-9 ]+);", topics),
        Block(f"{INFRA}/prometheus.yaml", (r"^apiVersion: apps/v1$",), DEV_METRICS_SERVICE),
        Block(f"{INFRA}/observability/prometheus/prometheus.yml", (), K8S_PROMETHEUS_JOB, indent="  "),
        # the prod overlay and its managed-services example
        Block(f"{PROD}/kustomization.yaml", (r"^images:$", r"^configMapGenerator:$"), IMAGE.replace("{tag}", "0.1.0"),
              indent="  "),
        Block(f"{PROD}/kustomization.yaml", (r"^configMapGenerator:$", r"^patches:$"), PROD_CONFIG, indent="  "),
        Block(f"{PROD}/managed-services/kustomization.yaml", (r"^configMapGenerator:$", r"^patches:$"), MANAGED_CONFIG,
              indent="  "),
        Block(f"{PROD}/managed-services/kafka-client-config.yaml", (), MANAGED_KAFKA_CLIENT),
        Block(f"{PROD}/managed-services/managed-egress.yaml", (), MANAGED_EGRESS),
        # people's table of the services (deploy/test_deploy.py holds it to services.toml)
        Line("docs/design.md", (r"^## Services, ports, config", r"^\| Kafka "), DESIGN_ROW),
        # tests/system/deploy.rs: its Settings type (the env test covers every service); the
        # crate as a dependency
        Block("tests/system/deploy.rs", (r"^fn services\(\)", r"^            other => "), DEPLOY_RS_SETTINGS,
              comment="//", indent="            "),
        Block("Cargo.toml", (r"^\[workspace.dependencies\]$", r"^$"), CARGO_WORKSPACE_DEP),
        Block("tests/Cargo.toml", (r"^\[dependencies\]$", r"^rdkafka"), CARGO_TESTS_DEP),
    ]
    return out


def created_files(e: Entry) -> dict[str, str]:
    """deploy/template/wiring/ rendered: {repository path: content}."""
    files = {}
    for src in sorted(TEMPLATE.rglob("*")):
        if src.is_file():
            rel = str(src.relative_to(TEMPLATE)).replace("{{name}}", e.name)
            files[rel] = render(src.read_text(), e)
    return files


# --- Kafka ACLs: deploy/kafka/acls.txt, from services.toml ----------------------------------

ACL_FILES = ("deploy/kafka/acls.txt",)


def write_acls(root: Path) -> None:
    """What `deploy/consistency.py --write-kafka-acls` writes (its header, kept from the file,
    and scripts/lib/kafka_acls.py's lines), without needing PyYAML."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kafka_acls", root / "scripts" / "lib" / "kafka_acls.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines = module.acls(module.backends(str(root / "services.toml")), "@PREFIX@")
    for rel in ACL_FILES:
        path = root / rel
        header = "".join(l for l in path.read_text().splitlines(keepends=True) if l.startswith("#"))
        path.write_text(header + "\n".join(lines) + "\n")


# --- the commands ----------------------------------------------------------------------------


def add(name: str, root: Path = ROOT) -> list[str]:
    e = load_entry(name, root / "services.toml")
    changed: dict[str, str] = {}
    for rel, content in created_files(e).items():
        if (root / rel).exists():
            raise WiringError(f"{rel} already exists")
        changed[rel] = content
    for edit in edits(e):
        text = changed.get(edit.path)
        if text is None:
            text = (root / edit.path).read_text()
            if f">>> new-service {e.name} " in text:
                raise WiringError(f"{edit.path} already holds wiring of {e.name}: scripts/remove-service {e.name} first")
        changed[edit.path] = edit.add(text, e)
    # Nothing is written unless every edit applied.
    for rel, content in changed.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content)
    write_acls(root)
    return sorted(changed) + list(ACL_FILES)


def remove(name: str, root: Path = ROOT, acls: bool = True) -> list[str]:
    """Takes back what `add` wrote. The ACL files are regenerated by the caller once the
    entry is gone from services.toml (`acls`)."""
    e = load_entry(name, root / "services.toml")
    changed: dict[str, str] = {}
    for edit in reversed(edits(e)):
        text = changed.get(edit.path)
        if text is None:
            path = root / edit.path
            if not path.exists():
                continue
            text = path.read_text()
        changed[edit.path] = edit.remove(text, e)
    for rel, content in changed.items():
        (root / rel).write_text(content)
    removed = []
    for rel in created_files(e):
        path = root / rel
        if path.exists():
            path.unlink()
            removed.append(rel)
            parent = path.parent
            while parent != root and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent
    return sorted(changed) + removed


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 2 and argv[0] == "add":
            for rel in add(argv[1]):
                print(rel)
        elif len(argv) == 2 and argv[0] == "remove":
            for rel in remove(argv[1]):
                print(rel)
        elif len(argv) == 1 and argv[0] == "acls":
            write_acls(ROOT)
        elif len(argv) == 2 and argv[0] == "list":
            e = load_entry(argv[1])
            for rel in sorted({edit.path for edit in edits(e)} | set(created_files(e)) | set(ACL_FILES)):
                print(rel)
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except (WiringError, OSError, KeyError, ValueError) as err:
        print(f"wiring: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
