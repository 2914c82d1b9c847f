#!/usr/bin/env python3
"""The Kafka users and ACLs of services.toml, for scripts/kafka's secure mode.

    python3 scripts/lib/kafka_acls.py users <services.toml>
        one line per backend service: its Kafka user (the service's name)
    python3 scripts/lib/kafka_acls.py acls <services.toml> <topic prefix>
        one line per AclCommand call: principal, resource type (topic|group),
        pattern type (literal|prefixed), the operations (comma-separated), the resources
        (space-separated), all separated by `|`

What each service may do (topics are `<prefix>.<aggregate>`):
  * write (and create, describe) the topics of the aggregates it publishes (`topics`);
  * read (and describe, and create: a consumer may start before the topic's publisher
    made it) the topics it consumes (`consumes`), and write (and create, describe, read)
    their dead-letter topics `<topic>.dlq`;
  * its consumer groups: `<prefix>.<service>` and the names that start with it;
  * the operations host (`operates_dead_letters = true`: order) also reads and writes
    every dead-letter topic and writes every topic (a replay puts a message back on it).
Nothing else: the broker denies what no ACL allows (allow.everyone.if.no.acl.found=false).
"""

import sys
import tomllib


def backends(path: str) -> list[dict]:
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    return [s for s in doc.get("service") or [] if s.get("kind") == "backend"]


def acls(services: list[dict], prefix: str) -> list[str]:
    every_topic = [f"{prefix}.{t}" for s in services for t in s.get("topics") or []]
    lines = []
    for s in services:
        user = f"User:{s['name']}"
        own = [f"{prefix}.{t}" for t in s.get("topics") or []]
        consumed = [f"{prefix}.{t}" for t in s.get("consumes") or []]
        dlqs = [f"{t}.dlq" for t in consumed]
        if s.get("operates_dead_letters"):
            own = sorted(set(own) | set(every_topic))
            dlqs = sorted(set(dlqs) | {f"{t}.dlq" for t in every_topic})
        if own:
            lines.append(f"{user}|topic|literal|Write,Create,Describe,DescribeConfigs|{' '.join(own)}")
        if consumed:
            lines.append(f"{user}|topic|literal|Read,Describe,Create|{' '.join(consumed)}")
        if dlqs:
            lines.append(f"{user}|topic|literal|Write,Create,Describe,Read|{' '.join(dlqs)}")
        lines.append(f"{user}|group|prefixed|Read,Describe|{prefix}.{s['name']}")
    return lines


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "users":
        for s in backends(sys.argv[2]):
            print(s["name"])
    elif len(sys.argv) == 4 and sys.argv[1] == "acls":
        print("\n".join(acls(backends(sys.argv[2]), sys.argv[3])))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
