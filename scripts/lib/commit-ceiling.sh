# shellcheck shell=bash
# The PostgreSQL commit ceiling of a server: how many one-row INSERT transactions per second
# it commits (pgbench, 16 clients, 10 s, database sagaworks_pgbench), the bound on anything
# that commits per saga step. scripts/load and scripts/bench-peer print it beside their runs.

# Prints the ceiling in tps; pgbench's output goes to <state dir>/pgbench.log.
sw_commit_ceiling() { # pg host, state dir
    local pg="$1" state="$2"
    psql -h "$pg" -U postgres -d postgres -qAt \
        -c "SELECT 'CREATE DATABASE sagaworks_pgbench' WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'sagaworks_pgbench')" \
        | psql -h "$pg" -U postgres -d postgres -qAt
    psql -h "$pg" -U postgres -d sagaworks_pgbench -qAt -c "CREATE TABLE IF NOT EXISTS commit_probe (id BIGSERIAL PRIMARY KEY, v INT)" \
        -c "TRUNCATE commit_probe"
    echo "INSERT INTO commit_probe (v) VALUES (1);" >"$state/pgbench.sql"
    pgbench -h "$pg" -U postgres -n -c 16 -j 2 -T 10 -f "$state/pgbench.sql" sagaworks_pgbench >"$state/pgbench.log" 2>&1
    sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$state/pgbench.log" | tail -n 1
}
