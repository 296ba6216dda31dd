#!/bin/bash
# Slurm Prolog: torchwatch serve on this node while any job runs here, one for all of them.
#   slurm.conf:  Prolog=/etc/slurm/torchwatch-prolog.sh   Epilog=/etc/slurm/torchwatch-epilog.sh
#                TaskProlog=/etc/slurm/torchwatch-task-prolog.sh   PrologFlags=Alloc
# Runs as root (SlurmdUser) on every node of the job before it starts. A prolog that fails drains
# the node: this one always exits 0 (monitoring never costs a job its node). Without
# PrologFlags=Alloc it runs at a node's first job step instead, which is as good here.
#
# TORCHWATCH      the torchwatch command (default /opt/torchwatch/bin/torchwatch)
# TORCHWATCH_PORT where serve listens (default 9400)
# TORCHWATCH_SD   a directory Prometheus reads file_sd targets from (deploy/prometheus/prometheus.yml:
#                 /etc/prometheus/torchwatch.d on a shared filesystem); unset: no target file
set -u
TORCHWATCH=${TORCHWATCH:-/opt/torchwatch/bin/torchwatch}
PORT=${TORCHWATCH_PORT:-9400}
RUN=/run/torchwatch-serve
NODE=$(hostname -s)
{
    mkdir -p "$RUN" && chmod 755 "$RUN"
    exec 9>"$RUN/lock" && flock -w 30 9 || exit 0  # two jobs' prologs at once: one starts serve
    : >"$RUN/job.${SLURM_JOB_ID:-unknown}"
    if systemctl cat torchwatch-serve.service >/dev/null 2>&1; then
        systemctl start torchwatch-serve.service  # the unit of deploy/systemd/ (its own port setting)
    else
        pid=$(cat "$RUN/serve.pid" 2>/dev/null)
        if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
            setsid "$TORCHWATCH" serve --prometheus "0.0.0.0:$PORT" </dev/null >>"$RUN/serve.log" 2>&1 9>&- &  # not the lock
            echo $! >"$RUN/serve.pid"
        fi
    fi
    if [ -n "${TORCHWATCH_SD:-}" ] && [ -d "$TORCHWATCH_SD" ]; then
        printf '[{"targets": ["%s:%s"], "labels": {"cluster": "%s"}}]\n' \
            "$NODE" "$PORT" "${SLURM_CLUSTER_NAME:-slurm}" >"$TORCHWATCH_SD/.$NODE.json.tmp" &&
            mv "$TORCHWATCH_SD/.$NODE.json.tmp" "$TORCHWATCH_SD/$NODE.json"
    fi
} >/dev/null 2>&1
exit 0
