#!/usr/bin/env python3
"""The Kafka users and ACLs of services.toml, for scripts/kafka's secure mode.

    python3 scripts/lib/kafka_acls.py users <services.toml>
        one line per backend service: its Kafka user (the service's name)
    python3 scripts/lib/kafka_acls.py topics <services.toml> <topic prefix>
        one line per topic to create beforehand: every aggregate's and its `.dlq`
    python3 scripts/lib/kafka_acls.py acls <services.toml> <topic prefix>
        one line per AclCommand call: principal, resource type (topic|group),
        pattern type (literal|prefixed), the operations (comma-separated), the resources
        (space-separated), all separated by `|`

What each service may do (topics are `<prefix>.<aggregate>`; every topic and its
dead-letter topic `<topic>.dlq` exist beforehand: the init step of compose and k8s, and
scripts/kafka, create them as admin, so no service may create a topic):
  * write (and describe) the topics of the aggregates it publishes (`topics`);
  * read (and describe) the topics it consumes (`consumes`), and write (and describe,
    read) their dead-letter topics `<topic>.dlq`;
  * its consumer groups (`groups`), by their literal names `<prefix>.<group>`: no name
    that merely starts with one;
  * the operations host (`operates_dead_letters = true`: order) also reads every topic
    and its dead-letter topic, and writes every topic: a replay re-reads a dead letter's
    original record on its topic and sends only that (libs/outbox dead_letters), so what
    it writes on another service's topic is what that service wrote there.
Nothing else: the broker denies what no ACL allows (allow.everyone.if.no.acl.found=false).
"""

import sys
from pathlib import Path

# services.toml's loader, beside this file (also when another tool loads this one by path).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from services_toml import Service, load_services  # noqa: E402
from services_toml import backends as _backends  # noqa: E402


def backends(path: str) -> list[Service]:
    """The backends of the services.toml at `path`, in file order."""
    return _backends(load_services(Path(path)))


def acls(services: list[Service], prefix: str) -> list[str]:
    every_topic = [f"{prefix}.{t}" for s in services for t in s.topics]
    lines = []
    for s in services:
        user = f"User:{s.name}"
        own = [f"{prefix}.{t}" for t in s.topics]
        consumed = [f"{prefix}.{t}" for t in s.consumes]
        dlqs = [f"{t}.dlq" for t in consumed]
        if s.operates_dead_letters:
            own = sorted(set(own) | set(every_topic))
            consumed = sorted(set(consumed) | set(every_topic))
            dlqs = sorted(set(dlqs) | {f"{t}.dlq" for t in every_topic})
        if own:
            lines.append(f"{user}|topic|literal|Write,Describe,DescribeConfigs|{' '.join(own)}")
        if consumed:
            lines.append(f"{user}|topic|literal|Read,Describe|{' '.join(consumed)}")
        if dlqs:
            lines.append(f"{user}|topic|literal|Write,Describe,Read|{' '.join(dlqs)}")
        groups = [f"{prefix}.{g}" for g in s.groups]
        if groups:
            lines.append(f"{user}|group|literal|Read,Describe|{' '.join(groups)}")
    return lines


def topics(services: list[Service], prefix: str) -> list[str]:
    """Every topic of services.toml and its dead-letter topic, which exist beforehand."""
    return [f"{prefix}.{t}{dlq}" for s in services for t in s.topics for dlq in ("", ".dlq")]


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "users":
        for s in backends(sys.argv[2]):
            print(s.name)
    elif len(sys.argv) == 4 and sys.argv[1] == "acls":
        print("\n".join(acls(backends(sys.argv[2]), sys.argv[3])))
    elif len(sys.argv) == 4 and sys.argv[1] == "topics":
        print("\n".join(topics(backends(sys.argv[2]), sys.argv[3])))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
