#!/bin/bash
# Slurm Epilog: stop this node's torchwatch serve once its last job ended (prolog.sh started it).
# Runs as root on every node of the job after it ends; always exits 0 (a failing epilog drains the node).
# The pid file is believed only in a directory of root's that root alone can write (prolog.sh).
set -u
RUN=${TORCHWATCH_RUN:-/run/torchwatch-serve}
NODE=$(hostname -s)
root_only() {
    [ -d "$1" ] && [ ! -L "$1" ] || return 1
    local owner mode
    owner=$(stat -c %u -- "$1") && mode=$(stat -c %a -- "$1") || return 1
    [ "$owner" = 0 ] && [ $((8#$mode & 8#022)) = 0 ]
}
{
    root_only "$RUN" || exit 0
    exec 9>>"$RUN/lock" && flock -w 30 9 || exit 0
    rm -f "$RUN/job.${SLURM_JOB_ID:-unknown}"
    if ! compgen -G "$RUN/job.*" >/dev/null; then
        if systemctl cat torchwatch-serve.service >/dev/null 2>&1; then
            systemctl stop torchwatch-serve.service
        fi
        pid=$(cat "$RUN/serve.pid" 2>/dev/null)
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid"  # serve stops its sessions and its server, then ends (a few seconds)
            for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
            kill -KILL "$pid" 2>/dev/null
        fi
        rm -f "$RUN/serve.pid"
        if [ -n "${TORCHWATCH_SD:-}" ] && root_only "$TORCHWATCH_SD"; then rm -f "$TORCHWATCH_SD/$NODE.json"; fi
    fi
} >/dev/null 2>&1
exit 0
