# shellcheck shell=bash
# The Temporal CLI (`temporal server start-dev`: the dev server the Temporal peer of
# scripts/bench-peer runs against), built from the Go module proxy once per machine: source
# this, then
#
#   sw_temporal_bin    path of the pinned `temporal` binary (built when missing)
#
# Progress goes to stderr, the path to stdout; non-zero, saying why on stderr, when it fails.
#
# Which version: CLI 1.5.1 (module github.com/temporalio/cli v1.5.1; Temporal server 1.29.1
# inside), built with `go install github.com/temporalio/cli/cmd/temporal@v1.5.1`: its go.mod
# has no replace directive, and every module it needs is served by the proxy. The newest the
# proxy lists here, v1.9.1, does not build that way: its go.mod requires
# github.com/temporalio/cli/cliext v0.0.0 with `replace ... => ./cliext`, so
# `go install ...@v1.9.1` refuses it ("The go.mod file for the module providing named
# packages contains one or more replace directives"), the nested module cliext is not in the
# cli module's zip, and the proxy answers 403 (not available) for cliext@v0.0.0.
#
# Built with the machine's Go (GOTOOLCHAIN=local), CGO_ENABLED=0, -trimpath, the version
# stamped as upstream's release does (-X .../temporalcli.Version). Kept in
# ${XDG_CACHE_HOME:-$HOME/.cache}/sagaworks/bin/ as temporal-<version>-<hash>, the hash being
# that of the build recipe (module, version, flags): a change of either builds anew. Built
# under the bin dir's lock into a temporary name, then renamed (scripts/lib/tracing.sh's
# sw_tracing_build_once). The first build on a fresh machine takes minutes; afterwards
# none.

SW_TEMPORAL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/lib/tracing.sh
. "$SW_TEMPORAL_ROOT/scripts/lib/tracing.sh"

SW_TEMPORAL_VERSION=1.5.1
SW_TEMPORAL_MODULE=github.com/temporalio/cli

sw_temporal_recipe() {
    printf '%s\n' "GOTOOLCHAIN=local CGO_ENABLED=0 go install -trimpath -buildvcs=false" \
        "-ldflags=-s -w -X $SW_TEMPORAL_MODULE/temporalcli.Version=$SW_TEMPORAL_VERSION" \
        "$SW_TEMPORAL_MODULE/cmd/temporal@v$SW_TEMPORAL_VERSION"
}

# Called by sw_tracing_build_once under its lock.
sw_tracing_build_temporal() { # scratch dir, output binary
    # `go install pkg@version`: the CLI's own go.mod and go.sum pin its dependencies (checked
    # against the checksum database); GOBIN is the scratch dir.
    (cd "$1" && GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$1/gobin" \
        go install -trimpath -buildvcs=false \
        -ldflags "-s -w -X $SW_TEMPORAL_MODULE/temporalcli.Version=$SW_TEMPORAL_VERSION" \
        "$SW_TEMPORAL_MODULE/cmd/temporal@v$SW_TEMPORAL_VERSION") >&2 || return 1
    mv -f "$1/gobin/temporal" "$2"
}

sw_temporal_bin() {
    local bin
    bin="$(sw_tracing_bin_dir)/temporal-$SW_TEMPORAL_VERSION-$(sw_temporal_recipe | sha256sum | cut -c1-12)"
    if [ ! -x "$bin" ]; then
        command -v go >/dev/null || { sw_tracing_err "go is missing: building the Temporal CLI needs Go >= 1.25 on PATH (its go.mod says go 1.25.0)"; return 1; }
        sw_tracing_build_once "$bin" temporal "the Temporal CLI $SW_TEMPORAL_VERSION ($SW_TEMPORAL_MODULE@v$SW_TEMPORAL_VERSION)" ||
            return 1
    fi
    printf '%s\n' "$bin"
}
