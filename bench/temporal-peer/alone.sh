#!/usr/bin/env bash
# The Temporal peer alone, on fake participants (cmd/fake-participants: canned answers, no
# storage) and without the dev stack: what the orchestration itself (the Temporal dev server,
# the Go worker and its HTTP front) costs and does on this machine. Not the side-by-side
# comparison (scripts/bench-peer --peer temporal is), and it publishes no events.
#
#   bench/temporal-peer/alone.sh [--concurrency N] [--duration SECS]
#
# Uses none of the dev stack's ports (Temporal 17233/17243/17244, the front 19090, the fake
# participants 17082), all on 127.0.0.1; PostgreSQL at 127.0.0.1:5432 only for the load
# tool's commit counter. Env: DB=memory runs the dev server without its SQLite file;
# WORKFLOW_POLLERS, ACTIVITY_POLLERS go to the peer; DYNAMIC_CONFIG (KEY=VALUE ...) to the
# server. Builds sagaworks-tools (release) in CARGO_TARGET_DIR and the Go programs into
# .dev/temporal-alone/, which also holds the logs and the server's data (removed every run).
# Stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
CONCURRENCY=32 DURATION=30
while [ $# -gt 0 ]; do
    case "$1" in
        --concurrency) CONCURRENCY="$2"; shift 2 ;;
        --duration) DURATION="$2"; shift 2 ;;
        *) echo "usage: $0 [--concurrency N] [--duration SECS]" >&2; exit 2 ;;
    esac
done
S="$ROOT/.dev/temporal-alone"
rm -rf "$S" && mkdir -p "$S/data"
# shellcheck source=scripts/lib/temporal.sh
. scripts/lib/temporal.sh
T="$(sw_temporal_bin)"
(cd bench/temporal-peer && GOTOOLCHAIN=local CGO_ENABLED=0 go build -trimpath -o "$S/temporal-peer" . &&
    GOTOOLCHAIN=local CGO_ENABLED=0 go build -trimpath -o "$S/fake-participants" ./cmd/fake-participants)
cargo build --locked --release -p sagaworks-tools
TOOLS="${CARGO_TARGET_DIR:-$ROOT/target}/release/sagaworks-tools"

python3 -c '
import json, uuid
products = [{"id": str(uuid.uuid4()), "price_cents": 1000, "initial_stock": 10**6} for _ in range(200)]
customers = [{"id": str(uuid.uuid4()), "initial_credit_cents": 10**11} for _ in range(200)]
print(json.dumps({"products": products, "customers": customers}))' >"$S/fixture.json"

DB_ARGS=(--db-filename "$S/data/temporal.db")
[ "${DB:-}" = memory ] && DB_ARGS=()
DYN=()
for kv in ${DYNAMIC_CONFIG:-}; do DYN+=(--dynamic-config-value "$kv"); done
TP="" FP="" PP=""
cleanup() {
    local p
    for p in $PP $FP $TP; do kill -TERM "$p" 2>/dev/null || true; done
    sleep 2
    for p in $PP $FP $TP; do kill -KILL "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
"$T" server start-dev --headless --ip 127.0.0.1 --port 17233 --http-port 17243 --metrics-port 17244 \
    "${DB_ARGS[@]}" "${DYN[@]}" --log-level warn >"$S/temporal-server.log" 2>&1 &
TP=$!
"$S/fake-participants" -addr 127.0.0.1:17082 >"$S/fake-participants.log" 2>&1 &
FP=$!
for _ in $(seq 1 150); do "$T" operator cluster health --address 127.0.0.1:17233 >/dev/null 2>&1 && break; sleep 0.2; done
PEER_PORT=19090 TEMPORAL_ADDRESS=127.0.0.1:17233 KAFKA_BROKERS="" INVENTORY_URL=127.0.0.1:17082 \
    PAYMENT_URL=127.0.0.1:17082 "$S/temporal-peer" >"$S/peer.log" 2>&1 &
PP=$!
for _ in $(seq 1 150); do curl -fs -o /dev/null http://127.0.0.1:19090/health && break; sleep 0.2; done

export SW_JWT_SECRET="${SW_JWT_SECRET:-dev-only-insecure-jwt-secret}"
TARGET="temporal=http://127.0.0.1:19090/OrderSaga/{order_id}/place"
PG="postgres://postgres@${SW_PG_HOST:-127.0.0.1}:5432/postgres"
echo "==> warm-up (5 s, $CONCURRENCY workers)"
timeout 120 "$TOOLS" load --fixture "$S/fixture.json" --concurrency "$CONCURRENCY" --duration-secs 5 \
    --pg-admin "$PG" --target "$TARGET" >/dev/null
ticks() { local stat; stat="$(cat "/proc/$1/stat" 2>/dev/null)" || { echo 0; return; }; echo "${stat##*) }" | awk '{print $12 + $13}'; }
b_t="$(ticks "$TP")" b_p="$(ticks "$PP")" b_f="$(ticks "$FP")"
echo "==> load ($CONCURRENCY workers, $DURATION s; load average before: $(cut -d' ' -f1-3 /proc/loadavg))"
timeout $((DURATION + 120)) "$TOOLS" load --fixture "$S/fixture.json" --concurrency "$CONCURRENCY" \
    --duration-secs "$DURATION" --pg-admin "$PG" --target "$TARGET"
hz="$(getconf CLK_TCK)"
printf '  CPU seconds during the run: temporal-server %.1f s, peer(go) %.1f s, fake-participants %.1f s\n' \
    "$(echo "($(ticks "$TP") - $b_t) / $hz" | bc -l)" "$(echo "($(ticks "$PP") - $b_p) / $hz" | bc -l)" \
    "$(echo "($(ticks "$FP") - $b_f) / $hz" | bc -l)"
