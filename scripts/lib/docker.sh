# shellcheck shell=bash
# Docker and Compose v2 on this machine: source this, then
#
#   sw_docker_ensure     a Docker daemon that answers: Debian's docker.io (and debootstrap,
#                        for scripts/images' base image) installed when no daemon answers,
#                        dockerd started when it does not run; a running daemon is left
#                        alone. Its log: /var/log/sagaworks-dockerd.log
#   sw_compose_ensure    `docker compose` (v2): the CLI plugin, built from the Go module
#                        proxy once per machine when no v2 plugin is installed
#   sw_compose_bin       path of the pinned plugin binary (built when missing)
#
# Progress goes to stderr; each function returns non-zero, saying why, when it fails.
#
# What is built: Docker Compose v5.6.0 (github.com/docker/compose/v5), through the
# wrapper module deploy/containers/compose/ (go.mod + go.sum pin every dependency and
# repeat compose's `exclude` block, which `go install pkg@version` refuses), with the
# machine's Go (GOTOOLCHAIN=local), CGO_ENABLED=0, -trimpath, its version stamped as
# upstream's release does. Kept in ${XDG_CACHE_HOME:-$HOME/.cache}/sagaworks/bin/ as
# docker-compose-<version>-<hash of go.mod and go.sum> and installed as
# /usr/local/lib/docker/cli-plugins/docker-compose, where every docker CLI looks.

SW_DOCKER_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/lib/tracing.sh
. "$SW_DOCKER_ROOT/scripts/lib/tracing.sh"
# shellcheck source=scripts/lib/apt.sh
. "$SW_DOCKER_ROOT/scripts/lib/apt.sh"

SW_COMPOSE_VERSION=v5.6.0
SW_COMPOSE_MODULE=github.com/docker/compose/v5
SW_COMPOSE_BUILD="$SW_DOCKER_ROOT/deploy/containers/compose"
SW_COMPOSE_PLUGIN=/usr/local/lib/docker/cli-plugins/docker-compose
SW_DOCKERD_LOG=/var/log/sagaworks-dockerd.log

sw_docker_say() { printf '==> %s\n' "$*" >&2; }
sw_docker_err() { printf 'docker: %s\n' "$*" >&2; }

sw_docker_answers() { docker info >/dev/null 2>&1; }

sw_docker_ensure() {
    sw_docker_answers && return 0
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    if [ ${#missing[@]} -gt 0 ]; then
        sw_docker_say "apt-get install ${missing[*]}"
        sw_apt_install "${missing[@]}" || { sw_docker_err "apt-get install ${missing[*]} failed"; return 1; }
    fi
    command -v docker >/dev/null || { sw_docker_err "no docker CLI after installing docker.io"; return 1; }
    if ! pgrep -x dockerd >/dev/null; then
        [ "$(id -u)" = 0 ] || { sw_docker_err "no Docker daemon answers, and starting one needs root"; return 1; }
        sw_docker_say "starting dockerd (log: $SW_DOCKERD_LOG)"
        # Its own session, so that it outlives the script that started it (as PostgreSQL does).
        setsid dockerd >>"$SW_DOCKERD_LOG" 2>&1 </dev/null &
    fi
    local waited=0
    until sw_docker_answers; do
        if [ $waited -ge 60 ]; then
            sw_docker_err "dockerd does not answer after 60 s; the end of $SW_DOCKERD_LOG:"
            tail -n 20 "$SW_DOCKERD_LOG" >&2 2>/dev/null
            return 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    sw_docker_say "Docker $(docker version --format '{{.Server.Version}}' 2>/dev/null) answers"
}

# Called by sw_tracing_build_once under its lock.
sw_tracing_build_compose() { # scratch dir, output binary
    (cd "$SW_COMPOSE_BUILD" && GOTOOLCHAIN=local CGO_ENABLED=0 \
        go build -mod=readonly -trimpath -buildvcs=false -o "$2" \
        -ldflags "-s -w -X $SW_COMPOSE_MODULE/internal.Version=$SW_COMPOSE_VERSION" \
        "$SW_COMPOSE_MODULE/cmd") >&2
}

sw_compose_bin() {
    local mod="$SW_COMPOSE_BUILD/go.mod" sum="$SW_COMPOSE_BUILD/go.sum" bin
    grep -Eq "^require $SW_COMPOSE_MODULE $SW_COMPOSE_VERSION\$" "$mod" || {
        sw_docker_err "$mod does not require $SW_COMPOSE_MODULE $SW_COMPOSE_VERSION: change SW_COMPOSE_VERSION with it"
        return 1
    }
    bin="$(sw_tracing_bin_dir)/docker-compose-$SW_COMPOSE_VERSION-$(sw_tracing_hash "$mod" "$sum")"
    if [ ! -x "$bin" ]; then
        sw_tracing_need_go || return 1
        sw_tracing_build_once "$bin" compose "Docker Compose $SW_COMPOSE_VERSION (from the Go module proxy)" || return 1
    fi
    printf '%s\n' "$bin"
}

sw_compose_ensure() {
    local have bin
    have="$(docker compose version --short 2>/dev/null || true)"
    case "$have" in
    # A plugin that someone else installed (Docker's own packages, say) is theirs to keep.
    2.* | 5.* | v2.* | v5.*) [ ! -L "$SW_COMPOSE_PLUGIN" ] && return 0 ;;
    esac
    bin="$(sw_compose_bin)" || return 1
    if [ "$(readlink "$SW_COMPOSE_PLUGIN" 2>/dev/null)" != "$bin" ]; then
        if ! { mkdir -p "$(dirname "$SW_COMPOSE_PLUGIN")" && ln -sfn "$bin" "$SW_COMPOSE_PLUGIN"; }; then
            sw_docker_err "cannot install $SW_COMPOSE_PLUGIN"
            return 1
        fi
        sw_docker_say "installed $SW_COMPOSE_PLUGIN -> $bin"
    fi
    docker compose version >/dev/null 2>&1 || { sw_docker_err "docker compose version fails after installing the plugin"; return 1; }
}
