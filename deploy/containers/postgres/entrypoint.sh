#!/usr/bin/env bash
# The local PostgreSQL image's entrypoint (deploy/containers/postgres/Dockerfile): the
# official image's contract, the parts docker-compose.yml uses. Runs as `postgres`.
set -euo pipefail
die() { echo "postgres entrypoint: $*" >&2; exit 1; }

: "${PGDATA:?}"
POSTGRES_USER="${POSTGRES_USER:-postgres}"
POSTGRES_DB="${POSTGRES_DB:-$POSTGRES_USER}"
[ -n "${POSTGRES_PASSWORD:-}" ] || die "POSTGRES_PASSWORD must be set (every TCP connection needs a password)"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    echo "postgres entrypoint: initialising $PGDATA"
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=peer \
        --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$pwfile"
    # Every TCP client, from any address of the container's networks, logs in with a password.
    printf 'host all all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
    # The init scripts run against a server on the Unix socket only.
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=/var/run/postgresql" -w start >/dev/null
    psql=(psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --host /var/run/postgresql)
    if [ "$POSTGRES_DB" != postgres ]; then
        "${psql[@]}" --dbname postgres -c "CREATE DATABASE \"$POSTGRES_DB\"" >/dev/null
    fi
    for f in /docker-entrypoint-initdb.d/*; do
        case "$f" in
        *.sql) echo "postgres entrypoint: running $f"; "${psql[@]}" --dbname "$POSTGRES_DB" -f "$f" ;;
        *.sh) echo "postgres entrypoint: running $f"; bash "$f" ;;
        *) [ -e "$f" ] && echo "postgres entrypoint: ignoring $f" ;;
        esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    echo "postgres entrypoint: initialised"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/var/run/postgresql "$@"
