# shellcheck shell=bash
# Process checks for the scripts: source this, then call `sw_pid_runs <pid>`.
#
# Whether pid $1 runs. A process killed (kill -9, or it crashed) is a zombie until its
# parent reaps it, and the processes the scripts start outlive their parent shell, so PID 1
# reaps them, not at once: `kill -0` succeeds on a zombie, this does not.
sw_pid_runs() { local st; st="$(ps -o stat= -p "$1" 2>/dev/null)" && [ -n "$st" ] && [ "${st:0:1}" != Z ]; }
