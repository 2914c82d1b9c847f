"""services.toml, the one list of services, read and checked for every Python tool:
deploy/tidy and its tests, scripts/lib/generate/ (scripts/generate),
scripts/lib/kafka_acls.py (Kafka's users, topics and ACLs), deploy/release_images.py, and
the shell scripts (scripts/lib/services.sh turns what it reads into bash arrays).

    from services_toml import load_services, backends
    specs = load_services()            # {name: Service}, in file (start) order

Needs python3 >= 3.11 (tomllib) and nothing else.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ServicePorts:
    http: int
    grpc: int | None


@dataclass(frozen=True)
class Database:
    suffix: str
    role: str


@dataclass(frozen=True)
class Service:
    """One [[service]] table of services.toml (its comments say what each field means)."""

    name: str
    kind: str
    ports: ServicePorts
    database: Database | None
    topics: tuple[str, ...]
    calls: tuple[str, ...]
    #: The topics (aggregates) it consumes, its consumer groups, whether it hosts the
    #: dead-letter operations (Kafka's ACLs: scripts/lib/kafka_acls.py).
    consumes: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    operates_dead_letters: bool = False
    #: Per callee, the gRPC methods it calls (the callee's allow-list, libs/mtls).
    rpcs: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False)


#: The one list of services, which the scripts (scripts/lib/services.sh) and
#: tests/system/deploy.rs read too.
SERVICES_TOML = Path(__file__).resolve().parent.parent.parent / "services.toml"
SERVICE_KINDS = ("backend", "gateway")
#: Linux's default ephemeral ports start here (net.ipv4.ip_local_port_range): the kernel
#: gives them to outgoing connections, so a fixed listening port at or above it can be taken
#: at the moment a service starts (a broker's connection held 50052 once). Every service port,
#: and its replicas' (scripts/lib/services.sh: +100 each, at most MAX_REPLICAS), stays below.
EPHEMERAL_PORTS_START = 32768
MAX_REPLICAS = 9
_SERVICE_KEYS = {
    "name", "kind", "http_port", "grpc_port", "database", "topics", "consumes", "groups", "operates_dead_letters", "calls",
    "rpcs",
}
_RPC_PATTERN = re.compile(r"[A-Z][A-Za-z0-9]*/([A-Z][A-Za-z0-9]*|\*)")


def _document(path: Path) -> dict:
    """The file as TOML; ValueError when it is not TOML."""
    with open(path, "rb") as f:
        try:
            return tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: {e}") from None


def load_services(path: Path = SERVICES_TOML) -> dict[str, Service]:
    """services.toml's services, in file (start) order. ValueError when it is not well formed:
    unknown keys, a name that is no crate name or repeats, a kind other than SERVICE_KINDS, a
    backend without a gRPC port or a gateway with one or with a database, a port, role or
    topic used twice, a call of a service not listed before the caller."""
    doc = _document(path)
    services: dict[str, Service] = {}
    seen_ports: dict[int, str] = {}
    if isinstance(doc.get("broker"), dict) and isinstance(doc["broker"].get("port"), int):
        seen_ports[doc["broker"]["port"]] = str(doc["broker"].get("name", "broker"))
    roles: set[str] = set()
    topics: set[str] = set()
    for raw in doc.get("service") or []:
        name = raw.get("name")
        where = f"{path}: service {name!r}"
        if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9]*", name) or name in services:
            raise ValueError(f"{where}: the name must be [a-z][a-z0-9]* and unique")
        if set(raw) - _SERVICE_KEYS:
            raise ValueError(f"{where}: unknown keys {sorted(set(raw) - _SERVICE_KEYS)}")
        kind, http, grpc, db = raw.get("kind"), raw.get("http_port"), raw.get("grpc_port"), raw.get("database")
        if kind not in SERVICE_KINDS:
            raise ValueError(f"{where}: kind must be one of {SERVICE_KINDS}, got {kind!r}")
        if (grpc is None) != (kind == "gateway") or (kind == "gateway" and db is not None):
            raise ValueError(f"{where}: a backend has a grpc_port, a gateway no grpc_port and no database")
        for port in (http,) if grpc is None else (http, grpc):
            if not isinstance(port, int) or not 0 < port < 65536 or port in seen_ports:
                raise ValueError(f"{where}: port {port!r} is no port or is used by {seen_ports.get(port)}")
            if port + 100 * (MAX_REPLICAS - 1) >= EPHEMERAL_PORTS_START:
                raise ValueError(f"{where}: port {port} (or a replica's, +100 each) reaches Linux's ephemeral "
                                 f"range ({EPHEMERAL_PORTS_START}-): an outgoing connection could hold it")
            seen_ports[port] = name
        database = None
        if db is not None:
            if not isinstance(db, dict) or set(db) != {"suffix", "role"} or db["role"] in roles:
                raise ValueError(f"{where}: database must be {{suffix, role}} with a role of its own")
            roles.add(db["role"])
            database = Database(suffix=db["suffix"], role=db["role"])
        for topic in raw.get("topics") or []:
            if topic in topics:
                raise ValueError(f"{where}: topic {topic!r} has another publisher")
            topics.add(topic)
        for callee in raw.get("calls") or []:
            if callee not in services or services[callee].ports.grpc is None:
                raise ValueError(f"{where}: calls {callee!r}, which is no gRPC service listed before it")
        # [service.rpcs]: the methods called per callee (the callee's allow-list, libs/mtls).
        rpcs = raw.get("rpcs") or {}
        if not isinstance(rpcs, dict) or set(rpcs) != set(raw.get("calls") or ()) or not all(
            isinstance(v, list) and v and all(isinstance(p, str) and _RPC_PATTERN.fullmatch(p) for p in v)
            for v in rpcs.values()
        ):
            raise ValueError(f"{where}: [service.rpcs] must name, for exactly each service it calls, "
                             "a list of \"Service/Method\" or \"Service/*\"")
        services[name] = Service(
            name=name, kind=kind, ports=ServicePorts(http=http, grpc=grpc), database=database,
            topics=tuple(raw.get("topics") or ()), calls=tuple(raw.get("calls") or ()),
            consumes=tuple(raw.get("consumes") or ()), groups=tuple(raw.get("groups") or ()),
            operates_dead_letters=bool(raw.get("operates_dead_letters")),
            rpcs={callee: tuple(methods) for callee, methods in rpcs.items()},
        )
    if not services:
        raise ValueError(f"{path}: no [[service]]")
    return services


def backends(services: dict[str, Service]) -> list[Service]:
    """The services of kind `backend` (a database, a gRPC port, a Kafka user), in file order."""
    return [s for s in services.values() if s.kind == "backend"]


def broker(path: Path = SERVICES_TOML) -> tuple[str, int]:
    """The `[broker]` name and port: the dev stack's Kafka, which no service port may take.
    ValueError when either is missing or malformed."""
    raw = _document(path).get("broker")
    name, port = (raw.get("name"), raw.get("port")) if isinstance(raw, dict) else (None, None)
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9]*", name) or not isinstance(port, int):
        raise ValueError(f"{path}: [broker] needs a name ([a-z][a-z0-9]*) and a port")
    return name, port


def broker_port(path: Path = SERVICES_TOML) -> int:
    """The `[broker]` port (see `broker`)."""
    return broker(path)[1]
