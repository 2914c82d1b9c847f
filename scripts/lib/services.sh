# shellcheck shell=bash
# The scripts' reader of services.toml (the repository root): source it, then ask.
#
#   sw_services            every service, in start order (file order)
#   sw_backends            the services of kind "backend"
#   sw_gateways            the services of kind "gateway"
#   sw_db_services         the services that own a database
#   sw_has_db <svc>        whether it owns one (exit status)
#   sw_processes           what scripts/dev-up runs, in start order: the broker, then sw_services
#   sw_start_waves         one line per start wave, its services space-separated: a wave's
#                          services call only services of earlier waves
#   sw_port <svc> http|grpc, sw_port broker     a port (fails when there is none)
#   sw_db_name <svc> [prefix]   its database: <prefix>_<suffix> (prefix default sagaworks)
#   sw_db_role <svc>       its database login role (the runtime one: reads and writes the tables)
#   sw_db_owner <svc>      the role that owns its database and runs its migrations: <role>_owner
#   sw_topics              every aggregate (topic suffix) a service publishes
#   sw_calls <svc>         the services it calls (its `<callee>.url` settings)
#   sw_replicas <svc>      how many processes of it scripts/dev-up runs: SW_REPLICAS_<SVC>
#                          (e.g. SW_REPLICAS_ORDER=3), 1 to 9, default 1
#   sw_replica <svc> <r>   the process name of replica r (1: <svc>, then <svc>-2, ...)
#   sw_replica_port <svc> http|grpc <r>   its port: the service's + 100 x (r - 1)
#   sw_grpc_urls <svc>     the gRPC URLs of all its replicas, comma-separated (what a
#                          caller's `<svc>.url` gets: calls are balanced over them)
#
# The lists are also arrays (SW_SERVICES, SW_BACKENDS, SW_GATEWAYS, SW_DB_SERVICES,
# SW_PROCESSES, SW_START_WAVES, SW_TOPICS), the rest associative arrays (SW_PORTS keyed
# <svc>/http, <svc>/grpc and broker/; SW_DB_SUFFIX, SW_DB_ROLE keyed by service).
# The file is read once, when this is sourced, by the Python tools' loader
# (scripts/lib/services_toml.py: python3 >= 3.11), which checks it: a bad file stops the
# sourcing script. SW_SERVICES_TOML overrides the file's path.
SW_SERVICES_TOML="${SW_SERVICES_TOML:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/services.toml}"

_sw_vars="$(python3 - "$SW_SERVICES_TOML" "$(dirname "${BASH_SOURCE[0]}")" <<'PY'
import shlex, sys
from pathlib import Path

sys.path.insert(0, sys.argv[2])
from services_toml import broker, load_services

path = Path(sys.argv[1])
try:
    services = list(load_services(path).values())
    broker_name, broker_port = broker(path)
except (OSError, ValueError) as e:
    sys.exit(str(e))
# Started once everything it calls is ready (a service calls only those listed before it).
wave = {}
for s in services:
    wave[s.name] = 1 + max((wave[c] for c in s.calls), default=-1)

def arr(var, items):
    print(f"{var}=({' '.join(shlex.quote(str(i)) for i in items)})")

names = [s.name for s in services]
arr("SW_SERVICES", names)
arr("SW_BACKENDS", [s.name for s in services if s.kind == "backend"])
arr("SW_GATEWAYS", [s.name for s in services if s.kind == "gateway"])
arr("SW_DB_SERVICES", [s.name for s in services if s.database])
arr("SW_PROCESSES", [broker_name, *names])
arr("SW_START_WAVES", [" ".join(n for n in names if wave[n] == w) for w in sorted(set(wave.values()))])
arr("SW_TOPICS", [t for s in services for t in s.topics])
ports = {f"{broker_name}/": broker_port}
for s in services:
    ports[f"{s.name}/http"] = s.ports.http
    if s.ports.grpc is not None:
        ports[f"{s.name}/grpc"] = s.ports.grpc
print("declare -gA SW_PORTS=(" + " ".join(f"[{k}]={v}" for k, v in ports.items()) + ")")
dbs = [(s.name, s.database) for s in services if s.database]
print("declare -gA SW_DB_SUFFIX=(" + " ".join(f"[{n}]={d.suffix}" for n, d in dbs) + ")")
print("declare -gA SW_DB_ROLE=(" + " ".join(f"[{n}]={d.role}" for n, d in dbs) + ")")
print("declare -gA SW_CALLS=(" + " ".join(f"[{s.name}]={shlex.quote(' '.join(s.calls))}" for s in services) + ")")
PY
)" || { echo "scripts/lib/services.sh: cannot read $SW_SERVICES_TOML" >&2; exit 1; }
eval "$_sw_vars"
unset _sw_vars

_sw_lines() { [ $# -eq 0 ] || printf '%s\n' "$@"; }
sw_services() { _sw_lines "${SW_SERVICES[@]}"; }
sw_backends() { _sw_lines "${SW_BACKENDS[@]}"; }
sw_gateways() { _sw_lines "${SW_GATEWAYS[@]}"; }
sw_db_services() { _sw_lines "${SW_DB_SERVICES[@]}"; }
sw_processes() { _sw_lines "${SW_PROCESSES[@]}"; }
sw_start_waves() { _sw_lines "${SW_START_WAVES[@]}"; }
sw_topics() { _sw_lines "${SW_TOPICS[@]}"; }
sw_port() { # service, http|grpc (nothing for the broker)
    local port="${SW_PORTS[$1/${2:-}]:-}"
    [ -n "$port" ] || { echo "services.toml: $1 has no ${2:-} port" >&2; return 1; }
    echo "$port"
}
sw_has_db() { [[ -v "SW_DB_ROLE[$1]" ]]; }
sw_db_name() { # service, [prefix]
    local suffix="${SW_DB_SUFFIX[$1]:-}"
    [ -n "$suffix" ] || { echo "services.toml: $1 owns no database" >&2; return 1; }
    echo "${2:-sagaworks}_$suffix"
}
sw_db_role() { # service
    local role="${SW_DB_ROLE[$1]:-}"
    [ -n "$role" ] || { echo "services.toml: $1 owns no database" >&2; return 1; }
    echo "$role"
}
sw_db_owner() { # service
    local role
    role="$(sw_db_role "$1")" || return 1
    echo "${role}_owner"
}
sw_calls() { echo "${SW_CALLS[$1]:-}"; }
sw_replicas() { # service
    local var n
    var="SW_REPLICAS_$(echo "$1" | tr '[:lower:]-' '[:upper:]_')"
    n="${!var:-1}"
    [[ "$n" =~ ^[1-9]$ ]] || { echo "$var=$n: replicas must be 1 to 9" >&2; return 1; }
    echo "$n"
}
sw_replica() { # service, replica number (from 1)
    if [ "$2" -eq 1 ]; then echo "$1"; else echo "$1-$2"; fi
}
sw_replica_port() { # service, http|grpc, replica number (from 1)
    local port
    port="$(sw_port "$1" "$2")" || return 1
    echo $((port + 100 * ($3 - 1)))
}
sw_grpc_urls() { # service
    local n r urls=()
    n="$(sw_replicas "$1")" || return 1
    for r in $(seq 1 "$n"); do urls+=("https://127.0.0.1:$(sw_replica_port "$1" grpc "$r")"); done
    (IFS=,; echo "${urls[*]}")
}

# The build of what the scripts run, in the profile given: every service with its test hooks
# (fault injection, crash points; off unless set), the operator CLI and sagaworks-tools, in
# one cargo invocation. Every script builds this same set, so one feature resolution serves
# them all and a second call finds everything built.
sw_build_stack() { # profile, extra cargo arguments...
    local profile="$1"
    shift
    # shellcheck disable=SC2046 # one -p per service
    cargo build --locked --profile "$profile" $(printf -- '-p %s ' $(sw_services)) -p sagaworks-admin \
        -p sagaworks-tools --features "$(printf '%s/test-hooks ' $(sw_services))" "$@"
}
