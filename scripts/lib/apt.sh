# shellcheck shell=bash
# Debian's packages for the scripts: source this, then `sw_apt_install [OPTION...] PKG...`.
# The package lists are updated once per process, before the first install. Both
# functions return non-zero on failure and print why, so a caller can say what it needed.

# Runs a command as root: directly when this is root, else through sudo.
sw_as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else printf 'need root (or sudo) to run: %s\n' "$*" >&2; return 1
    fi
}

SW_APT_UPDATED="${SW_APT_UPDATED:-0}"
sw_apt_install() { # [apt-get install option...] PKG...
    command -v apt-get >/dev/null || { printf 'need %s and there is no apt-get\n' "$*" >&2; return 1; }
    if [ "$SW_APT_UPDATED" = 0 ]; then
        sw_as_root apt-get update -qq || return 1
        SW_APT_UPDATED=1
    fi
    sw_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
