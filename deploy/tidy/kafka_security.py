"""Kafka secured like scripts/kafka's secure mode: SASL_SSL, ACLs, a CA of its own. (Its
SCRAM users and the backends' Kafka users and passwords are scripts/generate's.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tidy.common import (
    Context, KAFKA_CLIENTS, Report, _by_kind, _compose_env, _compose_mount, _configmap, _container_env,
)


KAFKA_DIR = Path("deploy/kafka")


def _env_ref(item: dict[str, Any]) -> tuple[str | None, str | None]:
    ref = (item.get("valueFrom") or {}).get("secretKeyRef") or {}
    return ref.get("name"), ref.get("key")


def check_kafka_security(
    report: Report, compose: dict[str, Any], k8s: dict[str, list[dict[str, Any]]], root: Path
) -> None:
    """compose and the dev overlay run Kafka like scripts/kafka's secure mode: the start
    script deploy/kafka/start.sh, SASL_SSL clients that verify the broker with the Kafka CA,
    the ACLs of deploy/kafka/acls.txt applied by the init step."""
    want_acls = (root / KAFKA_DIR / "acls.txt").read_text()
    start = (root / KAFKA_DIR / "start.sh").read_text()
    for setting in ("listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SSL",
                    "listener.name.controller.ssl.client.auth=required", "ssl.keystore.type=PEM",
                    "ssl.truststore.type=PEM", "allow.everyone.if.no.acl.found=false",
                    "super.users=User:admin;User:CN=kafka",
                    "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                    "--add-scram", "--ignore-formatted"):
        report.check(setting in start, f"{KAFKA_DIR / 'start.sh'}: no {setting}")

    # compose
    services = compose.get("services") or {}
    kafka, init = services.get("kafka") or {}, services.get("kafka-init") or {}
    env = _compose_env(kafka)
    entrypoint = kafka.get("entrypoint") or []
    entrypoint = entrypoint.split() if isinstance(entrypoint, str) else list(entrypoint)
    mounts = dict(_compose_mount(v) for v in kafka.get("volumes") or [])
    report.check(
        entrypoint[-1:] == ["/etc/sagaworks/kafka/start.sh"]
        and Path(mounts.get("/etc/sagaworks/kafka/start.sh", "")).as_posix().endswith(f"{KAFKA_DIR.as_posix()}/start.sh"),
        f"compose/kafka: must run {KAFKA_DIR / 'start.sh'}, mounted at /etc/sagaworks/kafka/start.sh",
    )
    for name in ("ADMIN_KAFKA_PASSWORD", "TLS_CERT_FILE", "TLS_KEY_FILE", "TLS_CA_FILE"):
        report.check(bool(env.get(name)), f"compose/kafka: {name} is not set")
    test = " ".join(map(str, (kafka.get("healthcheck") or {}).get("test") or []))
    report.check("--command-config" in test, "compose/kafka: the healthcheck must authenticate (--command-config)")
    # The nodes' CA (the controller listener's only trusted CA, CN=kafka a super user) is not
    # the services' CA, and Kafka's clients verify the broker with it.
    kafka_ca = Path(mounts.get(env.get("TLS_CA_FILE", ""), "")).as_posix()
    report.check(bool(kafka_ca) and kafka_ca != ".", "compose/kafka: TLS_CA_FILE (the Kafka CA) must be mounted")
    for name, spec in services.items():
        senv, smounts = _compose_env(spec), dict(_compose_mount(v) for v in spec.get("volumes") or [])
        tls_ca = senv.get("APP_TLS__CA_FILE")
        if tls_ca and smounts.get(tls_ca):
            report.check(
                Path(smounts[tls_ca]).as_posix() != kafka_ca,
                f"compose/{name}: APP_TLS__CA_FILE is the Kafka nodes' CA ({kafka_ca}): the services' "
                "certificates must come from a CA apart from the one that issues CN=kafka",
            )
    ienv_ca = _compose_env(init).get("CA_FILE", "")
    report.check(
        Path(dict(_compose_mount(v) for v in init.get("volumes") or []).get(ienv_ca, "")).as_posix() == kafka_ca,
        f"compose/kafka-init: CA_FILE must be the broker's TLS_CA_FILE ({kafka_ca}), mounted",
    )
    for user in KAFKA_CLIENTS:
        spec = services.get(user) or {}
        senv = _compose_env(spec)
        where = f"compose/{user}"
        report.check(senv.get("APP_KAFKA__SECURITY_PROTOCOL") == "sasl_ssl", f"{where}: APP_KAFKA__SECURITY_PROTOCOL must be sasl_ssl")
        smounts = dict(_compose_mount(v) for v in spec.get("volumes") or [])
        report.check(
            Path(smounts.get(senv.get("APP_KAFKA__SSL_CA_FILE", ""), "")).as_posix() == kafka_ca,
            f"{where}: APP_KAFKA__SSL_CA_FILE must be the broker's TLS_CA_FILE, the Kafka CA ({kafka_ca}), mounted",
        )
    ienv = _compose_env(init)
    imounts = dict(_compose_mount(v) for v in init.get("volumes") or [])
    report.check(
        Path(imounts.get(ienv.get("ACL_FILE", ""), "")).as_posix().endswith(f"{KAFKA_DIR.as_posix()}/acls.txt"),
        f"compose/kafka-init: ACL_FILE must be {KAFKA_DIR / 'acls.txt'}, mounted",
    )
    report.check(
        ienv.get("ADMIN_KAFKA_PASSWORD") == env.get("ADMIN_KAFKA_PASSWORD"),
        "compose/kafka-init: ADMIN_KAFKA_PASSWORD must be the broker's",
    )
    script = " ".join(map(str, init.get("command") or []))
    for needle in ("kafka-acls.sh", "--command-config", "SASL_SSL"):
        report.check(needle in script, f"compose/kafka-init: the script has no {needle}")

    # the dev overlay
    docs = k8s.get("dev")
    if not docs:
        return
    configmaps = _by_kind(docs, "ConfigMap")
    for base, key, want in (("kafka-start", "start.sh", start), ("kafka-acls", "acls.txt", want_acls)):
        configmap = _configmap(docs, base)
        report.check(
            configmap is not None and (configmap.get("data") or {}).get(key) == want,
            f"dev: ConfigMap {base} key {key} differs from {KAFKA_DIR / key}",
        )
    statefulset = _by_kind(docs, "StatefulSet").get("kafka")
    if not report.check(statefulset is not None, "dev: no StatefulSet kafka"):
        return
    pod = statefulset["spec"]["template"]["spec"]
    container = next((c for c in pod.get("containers") or [] if c.get("name") == "kafka"), {})
    items = {e["name"]: e for e in container.get("env") or []}
    report.check(
        (container.get("command") or [])[-1:] == ["/etc/sagaworks/kafka/start.sh"]
        and any(m.get("mountPath") == "/etc/sagaworks/kafka" for m in container.get("volumeMounts") or []),
        "dev/StatefulSet/kafka: must run the ConfigMap kafka-start's start.sh (/etc/sagaworks/kafka/start.sh)",
    )
    report.check(_env_ref(items.get("ADMIN_KAFKA_PASSWORD") or {})[0] is not None,
                 "dev/StatefulSet/kafka: ADMIN_KAFKA_PASSWORD must come from a Secret")
    deployments = _by_kind(docs, "Deployment")
    for user in KAFKA_CLIENTS:
        where = f"dev/{user}"
        deployment = deployments.get(user)
        if deployment is None:
            continue  # reported by service_pods
        main = deployment["spec"]["template"]["spec"]["containers"][0]
        senv, _ = _container_env(main, configmaps)
        report.check(senv.get("APP_KAFKA__SECURITY_PROTOCOL") == "sasl_ssl", f"{where}: APP_KAFKA__SECURITY_PROTOCOL must be sasl_ssl")
        report.check(
            _mounted_secret_key(deployment["spec"]["template"]["spec"], main, senv.get("APP_KAFKA__SSL_CA_FILE", ""))
            == (_kafka_tls_secret(docs), "ca.crt"),
            f"{where}: APP_KAFKA__SSL_CA_FILE must be ca.crt (the Kafka CA) of the Secret of Certificate kafka, mounted",
        )
    certificate = next((d for d in docs if d.get("kind") == "Certificate" and d["metadata"]["name"] == "kafka"), None)
    if report.check(certificate is not None, "dev: no Certificate kafka"):
        spec, namespace = certificate["spec"], certificate["metadata"].get("namespace", "default")
        names = set(spec.get("dnsNames") or [])
        want_names = {"kafka", f"kafka.{namespace}.svc", f"kafka-0.kafka-headless.{namespace}.svc", "localhost"}
        report.check(want_names <= names, f"dev/Certificate/kafka: dnsNames must include {sorted(want_names)}, got {sorted(names)}")
        report.check(spec.get("commonName") == "kafka", "dev/Certificate/kafka: commonName must be kafka (User:CN=kafka)")
        _check_kafka_issuer(report, docs, spec)
        report.check((spec.get("privateKey") or {}).get("encoding") == "PKCS8",
                     "dev/Certificate/kafka: the key must be PKCS8 (Kafka's PEM keystore)")
        report.check(
            any((v.get("secret") or {}).get("secretName") == spec.get("secretName") for v in pod.get("volumes") or []),
            f"dev/StatefulSet/kafka: must mount the Secret {spec.get('secretName')} of Certificate kafka",
        )


def _kafka_tls_secret(docs: list[dict[str, Any]]) -> str | None:
    """The Secret of the broker's Certificate `kafka`."""
    certificate = _by_kind(docs, "Certificate").get("kafka") or {}
    return (certificate.get("spec") or {}).get("secretName")


def _mounted_secret_key(pod: dict[str, Any], container: dict[str, Any], path: str) -> tuple[str | None, str | None]:
    """(Secret, key) that the file `path` of `container` is, through a Secret volume."""
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    for mount in container.get("volumeMounts") or []:
        prefix = str(mount.get("mountPath", "")).rstrip("/") + "/"
        if not path.startswith(prefix):
            continue
        secret = (volumes.get(mount.get("name")) or {}).get("secret") or {}
        relative = path[len(prefix):]
        items = secret.get("items")
        key = relative if items is None else next((i.get("key") for i in items if i.get("path") == relative), None)
        return secret.get("secretName"), key
    return None, None


def _check_kafka_issuer(report: Report, docs: list[dict[str, Any]], spec: dict[str, Any]) -> None:
    """The broker's Certificate comes from a CA Issuer of Kafka's own: not the Issuer of any
    service's Certificate, not the services' CA Secret, and issuing nothing but `kafka`
    (CN=kafka is a super user; its controller listener trusts that CA only)."""
    where = "dev/Certificate/kafka"
    issuers, certificates = _by_kind(docs, "Issuer"), _by_kind(docs, "Certificate")
    issuer_name = (spec.get("issuerRef") or {}).get("name")
    issuer = issuers.get(issuer_name)
    ca_secret = ((issuer or {}).get("spec") or {}).get("ca", {}).get("secretName") if issuer else None
    if not report.check(ca_secret is not None, f"{where}: issuerRef must name a CA Issuer of the overlay, got {issuer_name!r}"):
        return
    ca_certificate = next((c for c in certificates.values() if c["spec"].get("secretName") == ca_secret), None)
    report.check(
        ca_certificate is not None and ca_certificate["spec"].get("isCA") is True,
        f"{where}: the Issuer {issuer_name}'s Secret {ca_secret} must be an isCA Certificate of the overlay",
    )
    for name, other in certificates.items():
        if name == "kafka" or other["spec"].get("isCA"):
            continue
        other_issuer = (other["spec"].get("issuerRef") or {}).get("name")
        other_secret = (((issuers.get(other_issuer) or {}).get("spec") or {}).get("ca") or {}).get("secretName")
        report.check(
            other_issuer != issuer_name and other_secret != ca_secret,
            f"{where}: its Issuer {issuer_name} (CA {ca_secret}) also issues Certificate {name}: the Kafka "
            "nodes' CA must issue nothing else (CN=kafka is a super user of the broker)",
        )


def check(ctx: Context) -> list[str]:
    r = Report()
    check_kafka_security(r, ctx.compose, ctx.k8s, ctx.root)
    return r.failures
