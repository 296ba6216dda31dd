#!/bin/bash
# Slurm Prolog: torchwatch serve on this node while any job runs here, one for all of them.
#   slurm.conf:  Prolog=/etc/slurm/torchwatch-prolog.sh   Epilog=/etc/slurm/torchwatch-epilog.sh
#                TaskProlog=/etc/slurm/torchwatch-task-prolog.sh   PrologFlags=Alloc
# Runs as root (SlurmdUser) on every node of the job before it starts. A prolog that fails drains
# the node: this one always exits 0 (monitoring never costs a job its node). Without
# PrologFlags=Alloc it runs at a node's first job step instead, which is as good here.
#
# TORCHWATCH      the torchwatch command (default /opt/torchwatch/bin/torchwatch)
# TORCHWATCH_PORT where serve listens (default 9400), on TORCHWATCH_ADDR (default the node's first
#                 address, hostname -i): the address Prometheus scrapes, not every address of the node
# TORCHWATCH_WEB  the web config of TLS and basic auth (default /etc/torchwatch/web.yml; docs/security.md),
#                 used when that file is there
# TORCHWATCH_SD   a directory Prometheus reads file_sd targets from (deploy/prometheus/prometheus.yml:
#                 /etc/prometheus/torchwatch.d on a shared filesystem); unset: no target file
# TORCHWATCH_RUN  serve's pid file, lock and log (default /run/torchwatch-serve)
#
# Every directory it writes in must be root's and writable by root alone (not a symbolic link):
# another user who can write there could plant a link that turns root's write into an overwrite of
# any file. A directory that is not is left alone and said to syslog (logger -t torchwatch-prolog);
# the target file is written under a fresh name (mktemp: never an existing file) and renamed.
set -u
set -o noclobber
TORCHWATCH=${TORCHWATCH:-/opt/torchwatch/bin/torchwatch}
PORT=${TORCHWATCH_PORT:-9400}
ADDR=${TORCHWATCH_ADDR:-$(hostname -i 2>/dev/null | awk '{print $1}')}
WEB=${TORCHWATCH_WEB:-/etc/torchwatch/web.yml}
RUN=${TORCHWATCH_RUN:-/run/torchwatch-serve}
NODE=$(hostname -s)
say() { logger -t torchwatch-prolog -- "$*" 2>/dev/null || true; }
# root_only DIR: DIR is a directory (not a link), owned by root, writable by no group and no other user
root_only() {
    [ -d "$1" ] && [ ! -L "$1" ] || return 1
    local owner mode
    owner=$(stat -c %u -- "$1") && mode=$(stat -c %a -- "$1") || return 1
    [ "$owner" = 0 ] && [ $((8#$mode & 8#022)) = 0 ]
}
{
    mkdir -m 755 "$RUN" 2>/dev/null
    if ! root_only "$RUN"; then
        say "$RUN is not a directory of root's writable by root alone: not starting torchwatch serve"
        exit 0
    fi
    exec 9>>"$RUN/lock" && flock -w 30 9 || exit 0  # two jobs' prologs at once: one starts serve
    : >>"$RUN/job.${SLURM_JOB_ID:-unknown}"
    if systemctl cat torchwatch-serve.service >/dev/null 2>&1; then
        systemctl start torchwatch-serve.service  # the unit of deploy/systemd/ (its own port setting)
    else
        pid=$(cat "$RUN/serve.pid" 2>/dev/null)
        if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
            web=()
            if [ -f "$WEB" ]; then web=(--web-config-file "$WEB"); fi
            setsid "$TORCHWATCH" serve --prometheus "${ADDR:-127.0.0.1}:$PORT" "${web[@]}" \
                </dev/null >>"$RUN/serve.log" 2>&1 9>&- &  # not the lock
            echo $! >|"$RUN/serve.pid"
        fi
    fi
    if [ -n "${TORCHWATCH_SD:-}" ]; then
        if root_only "$TORCHWATCH_SD"; then
            tmp=$(mktemp "$TORCHWATCH_SD/.$NODE.json.XXXXXX") &&
                printf '[{"targets": ["%s:%s"], "labels": {"cluster": "%s"}}]\n' \
                    "$NODE" "$PORT" "${SLURM_CLUSTER_NAME:-slurm}" >>"$tmp" &&
                chmod 644 "$tmp" && mv -f -T "$tmp" "$TORCHWATCH_SD/$NODE.json"
        else
            say "TORCHWATCH_SD=$TORCHWATCH_SD is not a directory of root's writable by root alone: no target file written"
        fi
    fi
} >/dev/null 2>&1
exit 0
