# shellcheck shell=bash
# The local PostgreSQL server that the tests and scripts/dev-up use: source this, then
# call `sw_pg_ensure`. Used by scripts/install-deps.
#
# What it does, in order (docs/testing.md, "The PostgreSQL server"):
#   * a server that already answers at $SW_PG_HOST:5432 (default 127.0.0.1) is used as it
#     is: never reconfigured, never restarted. It must let `postgres` log in without a
#     password (or with one from PGPASSWORD / ~/.pgpass); if not, this stops and says so.
#   * SW_PG_HOST naming another machine: nothing is installed, the server is only checked.
#   * otherwise, on this machine: Debian's PostgreSQL server is installed when it is not
#     (apt-get install postgresql), the cluster on port 5432 is created when there is none,
#     configured (a conf.d drop-in and a marked block at the top of pg_hba.conf, both
#     rewritten the same way every time) and started with pg_ctlcluster.
#
# The configuration, and why:
#   * pg_hba: trust for local sockets and for 127.0.0.1/::1. The tests connect as
#     `postgres` and dev-up's services as their own roles, without passwords. The server
#     listens on loopback only, so this opens it to the users of this machine and nobody
#     else: a development and CI machine's setting, never a production one (k8s/ and
#     compose use passwords).
#   * postgresql.conf (conf.d/sagaworks.conf): loopback only; max_connections 300 (the
#     tests run several whole systems at once, each with its pools); shared_buffers 512MB.
#     Durability and maintenance stay at PostgreSQL's defaults (fsync, synchronous_commit,
#     full_page_writes and autovacuum on), so the commit ceiling that scripts/load prints
#     is the one a real deployment has.

# shellcheck source=scripts/lib/apt.sh
. "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

SW_PG_PORT=5432
SW_PG_CONF_MARK="# sagaworks: scripts/install-deps"

sw_pg_say() { printf '==> %s\n' "$*" >&2; }
sw_pg_die() { printf 'install-deps: %s\n' "$*" >&2; exit 1; }

# Whether postgres can log in at host $1.
sw_pg_login() { psql -h "$1" -p "$SW_PG_PORT" -U postgres -d postgres -Atqc 'SELECT 1' >/dev/null 2>&1; }

# "<version> <cluster> <status>" of the cluster on our port, if there is one.
sw_pg_cluster() {
    pg_lsclusters -h 2>/dev/null | awk -v p="$SW_PG_PORT" '$3 == p { print $1, $2, $4; exit }'
}

sw_pg_configure() { # version cluster
    local dir="/etc/postgresql/$1/$2"
    [ -f "$dir/pg_hba.conf" ] || sw_pg_die "no $dir/pg_hba.conf: is cluster $1/$2 a Debian cluster?"
    sw_as_root mkdir -p "$dir/conf.d"
    sw_as_root tee "$dir/conf.d/sagaworks.conf" >/dev/null <<CONF
$SW_PG_CONF_MARK (docs/testing.md, "The PostgreSQL server").
# A development and test server. Delete this file to return to Debian's defaults.
listen_addresses = 'localhost'
port = $SW_PG_PORT
max_connections = 300
shared_buffers = 512MB
CONF
    # Our block goes first (pg_hba.conf is read top down, the first match wins); an older
    # copy of it is replaced, everything else is kept as it was.
    local tmp
    tmp="$(mktemp)"
    {
        echo "$SW_PG_CONF_MARK: begin (docs/testing.md, \"The PostgreSQL server\")"
        echo "local   all   all                 trust"
        echo "host    all   all   127.0.0.1/32  trust"
        echo "host    all   all   ::1/128       trust"
        echo "$SW_PG_CONF_MARK: end"
        # shellcheck disable=SC2016 # an awk program: its $0 is awk's
        sw_as_root awk -v m="$SW_PG_CONF_MARK" \
            'index($0, m ": begin") == 1 { skip = 1; next }
             index($0, m ": end") == 1 { skip = 0; next }
             !skip' "$dir/pg_hba.conf"
    } >"$tmp"
    sw_as_root cp "$tmp" "$dir/pg_hba.conf"
    rm -f "$tmp"
}

sw_pg_ensure() {
    local host="${SW_PG_HOST:-127.0.0.1}"
    if ! command -v pg_isready >/dev/null || ! command -v psql >/dev/null; then
        sw_pg_say "apt-get install postgresql-client"
        sw_apt_install postgresql-client || sw_pg_die "apt-get install postgresql-client failed (are Debian's packages reachable?)"
    fi

    if pg_isready -q -h "$host" -p "$SW_PG_PORT"; then
        sw_pg_login "$host" || sw_pg_die "a PostgreSQL server answers at $host:$SW_PG_PORT, but postgres cannot \
log in without a password. It is left as it is: allow it (trust for loopback in pg_hba.conf, \
or PGPASSWORD / ~/.pgpass), or point SW_PG_HOST and SW_TEST_PG_URL at another server."
        sw_pg_say "PostgreSQL answers at $host:$SW_PG_PORT (left as it is)"
        return 0
    fi
    case "$host" in
        127.0.0.1 | localhost | ::1) ;;
        *) sw_pg_die "PostgreSQL is not accepting connections at $host:$SW_PG_PORT (SW_PG_HOST names another \
machine: nothing is installed for it)" ;;
    esac

    local fresh=0
    if ! command -v pg_lsclusters >/dev/null || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
        fresh=1
        sw_pg_say "apt-get install postgresql (Debian's server)"
        # The package creates a cluster and may start it: it is configured and restarted below.
        sw_apt_install postgresql postgresql-contrib || sw_pg_die "apt-get install postgresql failed (are Debian's packages reachable?)"
    fi

    local cluster version name status
    cluster="$(sw_pg_cluster)"
    if [ -z "$cluster" ]; then
        version="$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -n | tail -n 1)"
        name=main
        pg_lsclusters -h 2>/dev/null | awk -v v="$version" '$1 == v && $2 == "main" { found = 1 } END { exit !found }' \
            && name=sagaworks
        fresh=1
        sw_pg_say "pg_createcluster $version $name --port $SW_PG_PORT"
        sw_as_root pg_createcluster "$version" "$name" --port "$SW_PG_PORT" >/dev/null \
            || sw_pg_die "pg_createcluster $version $name failed"
        cluster="$(sw_pg_cluster)"
    fi
    read -r version name status <<<"$cluster"
    if [ "$status" = online ] && [ "$fresh" = 0 ]; then
        sw_pg_die "cluster $version/$name runs but does not answer at $host:$SW_PG_PORT; it is left as it is \
(see /var/log/postgresql/postgresql-$version-$name.log)"
    fi
    sw_pg_configure "$version" "$name"
    sw_pg_say "starting PostgreSQL $version/$name on 127.0.0.1:$SW_PG_PORT"
    local action=start
    [ "$status" = online ] && action=restart # one this script has just installed or created
    sw_as_root pg_ctlcluster "$version" "$name" "$action" \
        || sw_pg_die "pg_ctlcluster $version $name $action failed (see /var/log/postgresql/postgresql-$version-$name.log)"
    local i
    for i in $(seq 1 100); do
        pg_isready -q -h "$host" -p "$SW_PG_PORT" && break
        [ "$i" = 100 ] && sw_pg_die "PostgreSQL $version/$name started but does not answer at $host:$SW_PG_PORT"
        sleep 0.1
    done
    sw_pg_login "$host" || sw_pg_die "PostgreSQL $version/$name answers, but postgres cannot log in at $host"
}
