# shellcheck shell=bash
# Jaeger v2 and the OpenTelemetry Collector on this machine, built from the Go module
# proxy once per machine: source this, then
#
#   sw_jaeger_bin                 path of the pinned Jaeger binary (built when missing)
#   sw_otelcol_bin                path of the pinned collector binary (built when missing)
#   sw_tracing_start <state-dir>  Jaeger, then the collector, as processes on loopback;
#                                 prints the collector's OTLP gRPC URL (for
#                                 APP_TELEMETRY__OTLP_ENDPOINT) once both are healthy
#   sw_tracing_stop <state-dir>   stops what sw_tracing_start started there
#   (and the pieces: sw_jaeger_start, sw_otelcol_start, sw_tracing_stop_one)
#
# Progress goes to stderr, the one result (a path, a URL) to stdout. Every function
# returns non-zero, saying why on stderr, when it fails.
#
# What is built, and how (deploy/observability/build/):
#   * Jaeger 2.12.0 = Go module github.com/jaegertracing/jaeger v1.75.0 (the v2 releases
#     keep the v1 module numbering): `go build` of its cmd/jaeger in the wrapper module
#     build/jaeger/ (go.mod + go.sum pin every dependency, and repeat upstream's `replace`
#     of github.com/Shopify/sarama, which `go install pkg@version` would refuse).
#   * the collector `otelcol-sagaworks` 0.165.0: the OpenTelemetry Collector Builder
#     (go run go.opentelemetry.io/collector/cmd/builder@v0.165.0) on the manifest
#     build/otelcol-builder.yaml, exactly the components of otel-collector.yaml.
# Both with the machine's Go (GOTOOLCHAIN=local: builder 0.165.0 and Jaeger need Go >= 1.26
# and >= 1.24.6), CGO_ENABLED=0, -trimpath, -buildvcs=false: the same bytes on every machine
# with the same Go. The binaries are kept per machine in
# ${XDG_CACHE_HOME:-$HOME/.cache}/sagaworks/bin/ as jaeger-<version>-<hash> and
# otelcol-sagaworks-<version>-<hash>, the hash being that of the build inputs (go.mod and
# go.sum; the manifest): a version bump or a manifest edit builds anew, anything else
# reuses the binary. A build goes to a temporary name first and is renamed when complete,
# under a lock (flock), so an interrupted or concurrent build leaves no half binary.
# Go's caches stay where Go keeps them (GOMODCACHE, GOCACHE). The first build on a fresh
# machine takes a few minutes each (docs/testing.md); afterwards none.
#
# The local run (sw_tracing_start), on 127.0.0.1 only, with the committed configs
# deploy/observability/jaeger.yaml and deploy/observability/otel-collector.yaml (the
# same files compose and the k8s dev overlay run; their listeners come from the
# environment variables these functions set). Ports, each overridable by setting the
# variable before calling:
#
#   variable                   default  what
#   SW_OTELCOL_OTLP_GRPC_PORT  4317     collector: OTLP gRPC in (the services send here)
#   SW_OTELCOL_OTLP_HTTP_PORT  4318     collector: OTLP HTTP in
#   SW_OTELCOL_HEALTH_PORT     13133    collector: health_check, GET /
#   SW_OTELCOL_METRICS_PORT    8888     collector: own metrics, GET /metrics
#   SW_JAEGER_OTLP_PORT        4417     Jaeger: OTLP gRPC in (from the collector only)
#   SW_JAEGER_QUERY_PORT       16686    Jaeger: UI and HTTP API (/api/v3/services, ...)
#   SW_JAEGER_QUERY_GRPC_PORT  16685    Jaeger: gRPC query API
#   SW_JAEGER_HEALTH_PORT      13134    Jaeger: healthcheckv2, GET /status
#   SW_JAEGER_METRICS_PORT     8889     Jaeger: own metrics, GET /metrics
#
# None of them is a port of services.toml (HTTP 8080-8083 and gRPC 7081-7083, +100 per
# extra replica), Kafka's (9092 and the few after it) or PostgreSQL's (5432). SW_TRACING_READY_SECS (default 30):
# how long to wait for each to be healthy. A port already taken by another process stops
# sw_tracing_start with a message instead of starting something that cannot listen.
#
# The Jaeger built here serves the HTTP APIs but not the UI's pages: the UI's assets are
# built from the jaeger-ui repository (npm) in upstream's release, and the Go module
# carries a placeholder page only. The jaegertracing/jaeger image has the UI.

SW_TRACING_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/lib/proc.sh
. "$SW_TRACING_ROOT/scripts/lib/proc.sh"
SW_TRACING_BUILD="$SW_TRACING_ROOT/deploy/observability/build"

# Jaeger's v2 release and the module version that carries it (both must change together;
# sw_jaeger_bin checks the second against build/jaeger/go.mod).
SW_JAEGER_VERSION=2.12.0
SW_JAEGER_MODULE=github.com/jaegertracing/jaeger
SW_JAEGER_MODULE_VERSION=v1.75.0
SW_OTELCOL_BUILDER=go.opentelemetry.io/collector/cmd/builder@v0.165.0

SW_OTELCOL_OTLP_GRPC_PORT="${SW_OTELCOL_OTLP_GRPC_PORT:-4317}"
SW_OTELCOL_OTLP_HTTP_PORT="${SW_OTELCOL_OTLP_HTTP_PORT:-4318}"
SW_OTELCOL_HEALTH_PORT="${SW_OTELCOL_HEALTH_PORT:-13133}"
SW_OTELCOL_METRICS_PORT="${SW_OTELCOL_METRICS_PORT:-8888}"
SW_JAEGER_OTLP_PORT="${SW_JAEGER_OTLP_PORT:-4417}"
SW_JAEGER_QUERY_PORT="${SW_JAEGER_QUERY_PORT:-16686}"
SW_JAEGER_QUERY_GRPC_PORT="${SW_JAEGER_QUERY_GRPC_PORT:-16685}"
SW_JAEGER_HEALTH_PORT="${SW_JAEGER_HEALTH_PORT:-13134}"
SW_JAEGER_METRICS_PORT="${SW_JAEGER_METRICS_PORT:-8889}"

sw_tracing_say() { printf '==> %s\n' "$*" >&2; }
sw_tracing_err() { printf 'tracing: %s\n' "$*" >&2; }

sw_tracing_bin_dir() { printf '%s\n' "${XDG_CACHE_HOME:-$HOME/.cache}/sagaworks/bin"; }

# The first 12 hex digits of the SHA-256 of the files given.
sw_tracing_hash() { cat "$@" | sha256sum | cut -c1-12; }

sw_tracing_need_go() {
    command -v go >/dev/null && return 0
    sw_tracing_err "go is missing: building Jaeger and the OpenTelemetry Collector needs Go >= 1.26 on PATH"
    return 1
}

# Runs `sw_tracing_build_<what> <scratch dir> <temporary binary>` under $1's own lock
# unless $1 (the binary) exists by then, and renames its result to $1. The scratch dir and
# the temporary binary live in the bin dir (one filesystem: the rename is atomic) and are
# removed however the build ends. One lock per binary, not one for the directory: the
# cluster's build runs at the lowest priority beside install-deps, and a lock they shared
# would leave install-deps' builds waiting for it (priority inversion).
sw_tracing_build_once() { # binary, what, label
    local bin="$1" what="$2" label="$3" dir name
    dir="$(dirname "$bin")"
    name="$(basename "$bin")"
    mkdir -p "$dir" || { sw_tracing_err "cannot create $dir"; return 1; }
    (
        if command -v flock >/dev/null; then
            exec 9>"$dir/.build-$name.lock"
            flock 9 || exit 1
            # Under the lock, this binary's temporary files left were left by a killed build.
            rm -rf "$dir/.build-$name".*.tmp
        fi
        [ -x "$bin" ] && exit 0
        scratch="$(mktemp -d "$dir/.build-$name.XXXXXX.tmp")" || exit 1
        trap 'rm -rf "$scratch"' EXIT
        trap 'exit 130' INT TERM
        sw_tracing_say "building $label (once per machine; progress below)"
        started=$SECONDS
        "sw_tracing_build_$what" "$scratch" "$scratch/bin" || exit 1
        [ -x "$scratch/bin" ] || { sw_tracing_err "the build left no binary"; exit 1; }
        mv -f "$scratch/bin" "$bin" || exit 1
        sw_tracing_say "built $bin in $((SECONDS - started))s ($(du -h "$bin" | cut -f1))"
    ) || { sw_tracing_err "building $label failed (see above)"; return 1; }
}

sw_tracing_build_jaeger() { # scratch dir, output binary
    local commit
    # The commit of the tag, for `jaeger version` (upstream's release sets it the same way).
    commit="$(cd "$SW_TRACING_BUILD/jaeger" && GOTOOLCHAIN=local go mod download -json \
        "$SW_JAEGER_MODULE@$SW_JAEGER_MODULE_VERSION" | sed -n 's/^[[:space:]]*"Hash": "\([0-9a-f]*\)".*/\1/p')"
    local pkg=github.com/jaegertracing/jaeger/internal/version
    (cd "$SW_TRACING_BUILD/jaeger" && GOTOOLCHAIN=local CGO_ENABLED=0 \
        go build -mod=readonly -trimpath -buildvcs=false -o "$2" \
        -ldflags "-s -w -X $pkg.latestVersion=v$SW_JAEGER_VERSION -X $pkg.commitSHA=$commit" \
        "$SW_JAEGER_MODULE/cmd/jaeger") >&2
}

sw_tracing_build_otelcol() { # scratch dir, output binary
    local name
    name="$(sw_otelcol_manifest_field name)" || return 1
    # The manifest's output_path is relative: the builder writes its sources (main.go,
    # components.go, go.mod, go.sum) and the binary under the scratch dir.
    # -buildvcs=false: no version-control stamp, wherever the scratch dir is (as for Jaeger,
    # whose wrapper module sits in this repository: the binary must not depend on its state).
    (cd "$1" && GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false" \
        go run "$SW_OTELCOL_BUILDER" --config="$SW_TRACING_BUILD/otelcol-builder.yaml") >&2 || return 1
    local out
    out="$(cd "$1" && find . -type f -name "$name" -perm -u+x | head -n 1)"
    [ -n "$out" ] || { sw_tracing_err "the builder left no $name under $1"; return 1; }
    mv -f "$1/$out" "$2"
}

# A `dist:` field of the builder manifest (name, version).
sw_otelcol_manifest_field() {
    local value
    value="$(awk -v k="$1" '/^dist:/ { d = 1; next } /^[^ #]/ { d = 0 }
        d && $1 == k ":" { print $2; exit }' "$SW_TRACING_BUILD/otelcol-builder.yaml")"
    [ -n "$value" ] || { sw_tracing_err "no dist.$1 in $SW_TRACING_BUILD/otelcol-builder.yaml"; return 1; }
    printf '%s\n' "$value"
}

sw_jaeger_bin() {
    local mod="$SW_TRACING_BUILD/jaeger/go.mod" sum="$SW_TRACING_BUILD/jaeger/go.sum" bin
    if [ ! -f "$mod" ] || [ ! -f "$sum" ]; then sw_tracing_err "$mod or go.sum is missing"; return 1; fi
    if ! grep -Eq "^[[:space:]]*(require[[:space:]]+)?${SW_JAEGER_MODULE}[[:space:]]+${SW_JAEGER_MODULE_VERSION}([[:space:]]|\$)" "$mod"; then
        sw_tracing_err "$mod does not require $SW_JAEGER_MODULE $SW_JAEGER_MODULE_VERSION: change SW_JAEGER_VERSION and SW_JAEGER_MODULE_VERSION in scripts/lib/tracing.sh together with it"
        return 1
    fi
    bin="$(sw_tracing_bin_dir)/jaeger-$SW_JAEGER_VERSION-$(sw_tracing_hash "$mod" "$sum")"
    if [ ! -x "$bin" ]; then
        sw_tracing_need_go || return 1
        sw_tracing_build_once "$bin" jaeger "Jaeger $SW_JAEGER_VERSION ($SW_JAEGER_MODULE@$SW_JAEGER_MODULE_VERSION)" ||
            return 1
    fi
    printf '%s\n' "$bin"
}

sw_otelcol_bin() {
    local manifest="$SW_TRACING_BUILD/otelcol-builder.yaml" name version bin
    [ -f "$manifest" ] || { sw_tracing_err "$manifest is missing"; return 1; }
    name="$(sw_otelcol_manifest_field name)" || return 1
    version="$(sw_otelcol_manifest_field version)" || return 1
    bin="$(sw_tracing_bin_dir)/$name-$version-$(sw_tracing_hash "$manifest")"
    if [ ! -x "$bin" ]; then
        sw_tracing_need_go || return 1
        sw_tracing_build_once "$bin" otelcol "the OpenTelemetry Collector $name $version (${SW_OTELCOL_BUILDER#*/cmd/})" ||
            return 1
    fi
    printf '%s\n' "$bin"
}

# --- running them -------------------------------------------------------------------------

# Whether something accepts TCP connections on 127.0.0.1:$1.
sw_tracing_port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

sw_tracing_running() { # state dir, name
    [ -f "$1/pids/$2.pid" ] && sw_pid_runs "$(cat "$1/pids/$2.pid")"
}

# Waits until $3 answers 2xx, or the process $2 exits, or SW_TRACING_READY_SECS pass.
sw_tracing_wait_http() { # state dir, name, url
    for _ in $(seq 1 $((${SW_TRACING_READY_SECS:-30} * 5))); do
        curl -fs -o /dev/null "$3" && return 0
        if ! sw_tracing_running "$1" "$2"; then
            sw_tracing_err "$2 exited; last lines of $1/logs/$2.log:"
            tail -n 20 "$1/logs/$2.log" >&2
            return 1
        fi
        sleep 0.2
    done
    sw_tracing_err "$2 not healthy at $3 after ${SW_TRACING_READY_SECS:-30}s; last lines of $1/logs/$2.log:"
    tail -n 20 "$1/logs/$2.log" >&2
    return 1
}

# Starts `name` (command: the rest) in the background with its pid and log under the state
# dir, unless it already runs there; refuses when one of the ports (SW_TRACING_PORTS) is
# taken by another process.
sw_tracing_spawn() { # state dir, name, command...
    local state="$1" name="$2" port
    shift 2
    if sw_tracing_running "$state" "$name"; then
        sw_tracing_say "$name already running (pid $(cat "$state/pids/$name.pid"))"
        return 0
    fi
    for port in $SW_TRACING_PORTS; do
        if sw_tracing_port_busy "$port"; then
            sw_tracing_err "cannot start $name: 127.0.0.1:$port is taken by another process (set the SW_*_PORT variables of scripts/lib/tracing.sh to move it)"
            return 1
        fi
    done
    mkdir -p "$state/pids" "$state/logs" || return 1
    nohup "$@" >"$state/logs/$name.log" 2>&1 &
    echo $! >"$state/pids/$name.pid"
    sw_tracing_say "$name started (pid $!, log $state/logs/$name.log)"
}

sw_jaeger_start() { # state dir
    local bin
    bin="$(sw_jaeger_bin)" || return 1
    SW_TRACING_PORTS="$SW_JAEGER_OTLP_PORT $SW_JAEGER_QUERY_PORT $SW_JAEGER_QUERY_GRPC_PORT $SW_JAEGER_HEALTH_PORT $SW_JAEGER_METRICS_PORT" \
        sw_tracing_spawn "$1" jaeger env \
        JAEGER_LISTEN_HOST=127.0.0.1 \
        JAEGER_OTLP_GRPC_PORT="$SW_JAEGER_OTLP_PORT" \
        JAEGER_QUERY_HTTP_PORT="$SW_JAEGER_QUERY_PORT" \
        JAEGER_QUERY_GRPC_PORT="$SW_JAEGER_QUERY_GRPC_PORT" \
        JAEGER_HEALTH_PORT="$SW_JAEGER_HEALTH_PORT" \
        JAEGER_METRICS_PORT="$SW_JAEGER_METRICS_PORT" \
        "$bin" --config="$SW_TRACING_ROOT/deploy/observability/jaeger.yaml" || return 1
    sw_tracing_wait_http "$1" jaeger "http://127.0.0.1:$SW_JAEGER_HEALTH_PORT/status" || return 1
    sw_tracing_wait_http "$1" jaeger "http://127.0.0.1:$SW_JAEGER_QUERY_PORT/api/v3/services"
}

sw_otelcol_start() { # state dir
    local bin
    bin="$(sw_otelcol_bin)" || return 1
    SW_TRACING_PORTS="$SW_OTELCOL_OTLP_GRPC_PORT $SW_OTELCOL_OTLP_HTTP_PORT $SW_OTELCOL_HEALTH_PORT $SW_OTELCOL_METRICS_PORT" \
        sw_tracing_spawn "$1" otelcol env \
        OTELCOL_LISTEN_HOST=127.0.0.1 \
        OTELCOL_OTLP_GRPC_PORT="$SW_OTELCOL_OTLP_GRPC_PORT" \
        OTELCOL_OTLP_HTTP_PORT="$SW_OTELCOL_OTLP_HTTP_PORT" \
        OTELCOL_HEALTH_PORT="$SW_OTELCOL_HEALTH_PORT" \
        OTELCOL_METRICS_PORT="$SW_OTELCOL_METRICS_PORT" \
        JAEGER_OTLP_ENDPOINT="127.0.0.1:$SW_JAEGER_OTLP_PORT" \
        "$bin" --config="$SW_TRACING_ROOT/deploy/observability/otel-collector.yaml" || return 1
    sw_tracing_wait_http "$1" otelcol "http://127.0.0.1:$SW_OTELCOL_HEALTH_PORT/"
}

sw_tracing_start() { # state dir
    [ -n "${1:-}" ] || { sw_tracing_err "usage: sw_tracing_start <state-dir>"; return 1; }
    command -v curl >/dev/null || { sw_tracing_err "curl is missing (the health checks use it)"; return 1; }
    sw_jaeger_start "$1" || return 1
    sw_otelcol_start "$1" || return 1
    sw_tracing_say "tracing: services send OTLP to http://127.0.0.1:$SW_OTELCOL_OTLP_GRPC_PORT," \
        "traces at http://127.0.0.1:$SW_JAEGER_QUERY_PORT/api/v3/services"
    printf 'http://127.0.0.1:%s\n' "$SW_OTELCOL_OTLP_GRPC_PORT"
}

# SIGTERM, then SIGKILL after 10 s; removes the pid file.
sw_tracing_stop_one() { # state dir, name
    local f="$1/pids/$2.pid" pid
    [ -f "$f" ] || return 0
    pid="$(cat "$f")"
    if sw_pid_runs "$pid"; then
        kill -TERM "$pid"
        for _ in $(seq 1 100); do sw_pid_runs "$pid" || break; sleep 0.1; done
        if sw_pid_runs "$pid"; then kill -KILL "$pid"; fi
        sw_tracing_say "stopped $2 (pid $pid)"
    fi
    rm -f "$f"
}

# The collector first: on SIGTERM it flushes what it holds to Jaeger.
sw_tracing_stop() { # state dir
    [ -n "${1:-}" ] || { sw_tracing_err "usage: sw_tracing_stop <state-dir>"; return 1; }
    sw_tracing_stop_one "$1" otelcol
    sw_tracing_stop_one "$1" jaeger
}
