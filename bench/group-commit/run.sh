#!/usr/bin/env bash
# How much PostgreSQL CPU per saga transition batching would save: see README.md.
set -euo pipefail
cd "$(dirname "$0")"
HERE="$PWD"
ROUNDS=3 SECS=15
[ "$SECS" -ge 6 ] || SECS=6
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS="$2"; shift 2 ;;
        --secs) SECS="$2"; shift 2 ;;
        *) echo "usage: run.sh [--rounds N] [--secs S]" >&2; exit 2 ;;
    esac
done
PG="${SW_PG_HOST:-127.0.0.1}"
DB=sagaworks_group_commit
CLIENTS=8 PER_CLIENT=20000
psql() { command psql -h "$PG" -U postgres -v ON_ERROR_STOP=1 -qAt "$@"; }
psql -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"
for f in ../../libs/saga/migrations/*.sql; do psql -d "$DB" -f "$f" >/dev/null; done
# Instances 1..CLIENTS*PER_CLIENT, leased by 'w', each with its first step running.
psql -d "$DB" -c "
    INSERT INTO saga_instances (id, saga_type, key, status, current_step, data, lease_owner, lease_expires_at, version)
    SELECT ('00000000-0000-0000-0000-' || lpad(i::text, 12, '0'))::uuid, 'order', i::text, 'RUNNING', 's1',
           '{}'::jsonb, 'w', now() + interval '1 hour', 2
    FROM generate_series(1, $((CLIENTS * PER_CLIENT))) i;
    INSERT INTO saga_instance_steps (saga_id, name, status, attempts)
    SELECT id, 's1', 'RUNNING', 1 FROM saga_instances;"
psql -d "$DB" -c "VACUUM ANALYZE"

# One transition of instance :i (finish s1, start s2; s2's row is new, later rounds update it).
transition() { # the id expression
    cat <<SQL
WITH saga_s AS (
    UPDATE saga_instances SET updated_at = now(), progressed_at = now(), current_step = 's2',
           lease_expires_at = now() + make_interval(secs => 30)
    WHERE id = $1 AND lease_owner = 'w' RETURNING id),
saga_done AS (
    INSERT INTO saga_instance_steps (saga_id, name, status, attempts, error, finished_at, history, output)
    SELECT saga_s.id, 's1', 'SUCCEEDED', 1, NULL, now(), '[]'::jsonb, '{"reservation": 1}'::jsonb FROM saga_s
    ON CONFLICT (saga_id, name) DO UPDATE SET status = EXCLUDED.status, error = EXCLUDED.error,
        finished_at = EXCLUDED.finished_at, output = COALESCE(EXCLUDED.output, saga_instance_steps.output)
    RETURNING 1),
saga_next AS (
    INSERT INTO saga_instance_steps (saga_id, name, status, attempts)
    SELECT saga_s.id, 's2', 'RUNNING', 1 FROM saga_s
    ON CONFLICT (saga_id, name) DO UPDATE SET attempts = saga_instance_steps.attempts + 1,
        status = 'RUNNING', attempt_started_at = now()
    RETURNING attempts, started_at)
SQL
}
uuid() { echo "('00000000-0000-0000-0000-' || lpad(($1)::text, 12, '0'))::uuid"; }
base='\set b (:client_id * '"$PER_CLIENT"') + random(0, '"$((PER_CLIENT / 8 - 1))"') * 8'
{
    echo "$base"
    echo "\\set i :b + 1"
    transition "$(uuid ':i')"
    echo "SELECT now(), (SELECT attempts FROM saga_next), (SELECT started_at FROM saga_next) FROM saga_s, (SELECT set_config('synchronous_commit', 'off', true)) nfw;"
} >"$HERE/one.sql"
{
    echo "$base"
    echo "BEGIN;"
    echo "SET LOCAL synchronous_commit = off;"
    for k in 1 2 3 4 5 6 7 8; do
        echo "\\set i$k :b + $k"
        transition "$(uuid ":i$k")"
        echo "SELECT now(), (SELECT attempts FROM saga_next), (SELECT started_at FROM saga_next) FROM saga_s;"
    done
    echo "COMMIT;"
} >"$HERE/txn8.sql"
{
    echo "$base"
    ids="$(for k in 1 2 3 4 5 6 7 8; do printf '%s%s' "$([ $k = 1 ] || echo ', ')" "$(uuid ":b + $k")"; done)"
    transition "ANY (ARRAY[$ids])" | sed 's/WHERE id = ANY/WHERE id = ANY/'
    echo "SELECT now(), s.id, n.attempts FROM saga_s s LEFT JOIN saga_next n ON true, (SELECT set_config('synchronous_commit', 'off', true)) nfw;"
} >"$HERE/unnest8.sql"
# The per-statement RETURNING of saga_next has no saga id in `transition`; for the
# unnest variant that is fine for cost (each row's attempt is written either way).

pg_ticks() { # user+system ticks of every PostgreSQL process of the server
    local t=0 pid stat f
    for pid in $(pgrep -f '^postgres' || true); do
        stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || continue
        # After the name: state (field 3) ... utime (14), stime (15).
        read -r -a f <<<"${stat##*) }"
        t=$((t + f[11] + f[12]))
    done
    echo "$t"
}
run() { # variant, transitions per pgbench transaction
    # PostgreSQL's CPU is read inside the run (pgbench's backends exist only while it
    # runs): from 2 s after its start to 2 s before its end.
    local before after out tps window=$((SECS - 4))
    pgbench -h "$PG" -U postgres -n -M prepared -c "$CLIENTS" -j 2 -T "$SECS" -f "$HERE/$1.sql" "$DB" \
        >"$HERE/.pgbench.out" 2>&1 &
    local pid=$!
    sleep 2
    before="$(pg_ticks)"
    sleep "$window"
    after="$(pg_ticks)"
    wait "$pid"
    out="$(cat "$HERE/.pgbench.out")"
    tps="$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out" | tail -n 1)"
    awk -v v="$1" -v tps="$tps" -v k="$2" -v ticks="$((after - before))" -v secs="$window" 'BEGIN {
        t = tps * k; printf "  %-8s %9.0f transitions/s  %6.1f us of PostgreSQL CPU per transition\n", v, t, 1e6 * ticks / 100 / (t * secs) }'
}
echo "commit ceiling reference: see scripts/load; $CLIENTS clients, $SECS s per variant, $ROUNDS rounds"
for r in $(seq 1 "$ROUNDS"); do
    echo "round $r"
    if [ $((r % 2)) = 1 ]; then order=(one txn8 unnest8); else order=(unnest8 txn8 one); fi
    for v in "${order[@]}"; do
        case "$v" in one) run one 1 ;; *) run "$v" 8 ;; esac
    done
done
psql -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)"
