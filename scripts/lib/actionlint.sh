# shellcheck shell=bash
# actionlint, the checker of GitHub Actions workflows, built from the Go module proxy once
# per machine: source this, then
#
#   sw_actionlint_bin     path of the pinned actionlint binary (built when missing)
#
# Progress goes to stderr, the path to stdout; it returns non-zero, saying why on stderr,
# when the build fails. scripts/validate-deploy runs the binary over .github/workflows/.
#
# What is built: `go install github.com/rhysd/actionlint/cmd/actionlint@v1.7.12` with the
# machine's Go (GOTOOLCHAIN=local; v1.7.12 needs Go >= 1.24), CGO_ENABLED=0, -trimpath,
# -buildvcs=false, its version stamped as upstream's release does (`actionlint -version`).
# `go install pkg@version` checks every module it downloads against go.sum of the module
# and the checksum database, so the pin is the version. The binary is kept in
# ${XDG_CACHE_HOME:-$HOME/.cache}/sagaworks/bin/actionlint-<version>: a version bump builds
# anew, anything else reuses it. The build goes to a temporary directory in that directory
# first and is renamed when complete, under a lock (flock), so an interrupted or concurrent
# build leaves no half binary: scripts/lib/tracing.sh's sw_tracing_build_once, which builds
# Jaeger, the Collector and the Temporal CLI the same way. The first build on a fresh
# machine takes seconds.

SW_ACTIONLINT_MODULE=github.com/rhysd/actionlint
SW_ACTIONLINT_VERSION=v1.7.12

SW_ACTIONLINT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/lib/tracing.sh
. "$SW_ACTIONLINT_ROOT/scripts/lib/tracing.sh"

sw_actionlint_err() { printf 'actionlint: %s\n' "$*" >&2; }

# Called by sw_tracing_build_once under its lock.
sw_tracing_build_actionlint() { # scratch dir, output binary
    local version
    # Outside any module (the scratch dir), so no go.mod of this repository is consulted.
    (cd "$1" && GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$1/gobin" \
        GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false" \
        go install -trimpath -ldflags "-s -w -X $SW_ACTIONLINT_MODULE.version=$SW_ACTIONLINT_VERSION" \
        "$SW_ACTIONLINT_MODULE/cmd/actionlint@$SW_ACTIONLINT_VERSION") >&2 || return 1
    [ -x "$1/gobin/actionlint" ] || { sw_actionlint_err "go install left no binary"; return 1; }
    version="$("$1/gobin/actionlint" -version | head -n 1)"
    [ "$version" = "$SW_ACTIONLINT_VERSION" ] ||
        { sw_actionlint_err "the binary says it is '$version', not $SW_ACTIONLINT_VERSION"; return 1; }
    mv -f "$1/gobin/actionlint" "$2"
}

sw_actionlint_bin() {
    local bin
    bin="$(sw_tracing_bin_dir)/actionlint-$SW_ACTIONLINT_VERSION"
    if [ ! -x "$bin" ]; then
        command -v go >/dev/null || { sw_actionlint_err "go is missing: building actionlint needs Go >= 1.24 on PATH"; return 1; }
        sw_tracing_build_once "$bin" actionlint "actionlint $SW_ACTIONLINT_VERSION ($SW_ACTIONLINT_MODULE, from the Go module proxy)" ||
            return 1
    fi
    printf '%s\n' "$bin"
}
