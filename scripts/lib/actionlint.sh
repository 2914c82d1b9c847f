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
# build leaves no half binary (as scripts/lib/tracing.sh does for Jaeger). First build on a
# fresh machine: about 15 s.

SW_ACTIONLINT_MODULE=github.com/rhysd/actionlint
SW_ACTIONLINT_VERSION=v1.7.12

sw_actionlint_err() { printf 'actionlint: %s\n' "$*" >&2; }

sw_actionlint_bin() {
    local dir bin
    dir="${XDG_CACHE_HOME:-$HOME/.cache}/sagaworks/bin"
    bin="$dir/actionlint-$SW_ACTIONLINT_VERSION"
    if [ -x "$bin" ]; then
        printf '%s\n' "$bin"
        return 0
    fi
    command -v go >/dev/null || { sw_actionlint_err "go is missing: building actionlint needs Go >= 1.24 on PATH"; return 1; }
    mkdir -p "$dir" || { sw_actionlint_err "cannot create $dir"; return 1; }
    (
        if command -v flock >/dev/null; then
            exec 9>"$dir/.build.lock"
            flock 9 || exit 1
            # Under the lock, whatever temporary files are left were left by a killed build.
            rm -rf "$dir"/.build.*.tmp
        fi
        [ -x "$bin" ] && exit 0
        scratch="$(mktemp -d "$dir/.build.XXXXXX.tmp")" || exit 1
        trap 'rm -rf "$scratch"' EXIT
        trap 'exit 130' INT TERM
        printf '==> building actionlint %s from the Go module proxy (once per machine)\n' "$SW_ACTIONLINT_VERSION" >&2
        started=$SECONDS
        # Outside any module (the scratch dir), so no go.mod of this repository is consulted.
        (cd "$scratch" && GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$scratch/gobin" \
            GOFLAGS="${GOFLAGS:+$GOFLAGS }-buildvcs=false" \
            go install -trimpath -ldflags "-s -w -X $SW_ACTIONLINT_MODULE.version=$SW_ACTIONLINT_VERSION" \
            "$SW_ACTIONLINT_MODULE/cmd/actionlint@$SW_ACTIONLINT_VERSION") >&2 || exit 1
        [ -x "$scratch/gobin/actionlint" ] || { sw_actionlint_err "go install left no binary"; exit 1; }
        version="$("$scratch/gobin/actionlint" -version | head -n 1)"
        [ "$version" = "$SW_ACTIONLINT_VERSION" ] ||
            { sw_actionlint_err "the binary says it is '$version', not $SW_ACTIONLINT_VERSION"; exit 1; }
        mv -f "$scratch/gobin/actionlint" "$bin" || exit 1
        printf '==> built %s in %ss\n' "$bin" "$((SECONDS - started))" >&2
    ) || { sw_actionlint_err "building $SW_ACTIONLINT_MODULE@$SW_ACTIONLINT_VERSION failed (see above; is the Go module proxy reachable?)"; return 1; }
    printf '%s\n' "$bin"
}
