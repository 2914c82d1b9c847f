# shellcheck shell=bash
# Source this to find the tools that scripts/install-deps installs with pip: their
# console scripts land in the Python installation's scripts directory, which is not
# always on PATH (pyenv keeps it behind shims; pip --user uses ~/.local/bin).
if command -v python3 >/dev/null; then
    SW_PY_SCRIPTS="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
    case ":$PATH:" in *":$SW_PY_SCRIPTS:"*) ;; *) PATH="$SW_PY_SCRIPTS:$PATH" ;; esac
    export PATH
fi
