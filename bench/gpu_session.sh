#!/usr/bin/env bash
# One GPU session in one call: everything torchwatch needs recorded on a real NVIDIA GPU, within a
# deadline, each step bounded and independent (a failing step is logged and the next one runs).
#
#   bash bench/gpu_session.sh OUTDIR [SECONDS]      # default budget 480 s
#
# Writes OUTDIR/gpu_session.tar.gz (reports, NVML recordings, logs, metrics, probes; the device name,
# driver and CUDA versions in info.txt) and OUTDIR/gpu_traces.tar.gz (the bursts' traces), plus
# OUTDIR/session.log. Needs python3 with torch (CUDA), psutil and nvidia-ml-py; anything else
# torchwatch needs (textual, py-spy) is installed first from ./.whl/*.whl when that folder exists.
# What it runs, in order of priority (later steps are skipped when the budget runs short):
#   the demos gpu_bound, launch_bound (plain and --relieve) and dataloader_bound under
#   `torchwatch run --headless` with a burst and bench/record_gpu.py beside each; the overhead ratio on
#   gpu_bound (bench/overhead.py --within-run --toggle); launch_bound pinned to one core beside a CPU
#   hog; two trainings on one GPU; bench/gpu_probe.py oom, flops and compile.
set -u
OUT=${1:?usage: bench/gpu_session.sh OUTDIR [SECONDS]}
BUDGET=${2:-480}
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
START=$(date +%s)
W=$(mktemp -d /tmp/gpu_session.XXXXXX)
mkdir -p "$OUT"
exec > >(tee "$OUT/session.log") 2>&1
left() { echo $((START + BUDGET - $(date +%s))); }
say() { echo "[$(($(date +%s) - START))s] $*"; }

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || say "wheel install failed"
    export PYTHONPATH=/tmp/site:$REPO PATH=/tmp/site/bin:$PATH
else
    export PYTHONPATH=$REPO
fi
export PYTHONUNBUFFERED=1
# Not installed: rules/ ships as the package torchwatch.rules only through an install; from a plain
# source tree on PYTHONPATH a link stands in for it for the session (removed at the end).
LINKED=""
if ! python3 -c 'import importlib.metadata as m; m.version("torchwatch")' 2>/dev/null && [ ! -e torchwatch/rules ]; then
    ln -s ../rules torchwatch/rules && LINKED=1
fi
SKIP=${SKIP:-}  # steps to leave out, by name (e.g. "flops compile")
PAIRS=${PAIRS:-5}  # the overhead's toggled pairs
DEV=${DEV:-cuda}  # DEV=cpu: a dry run of the plumbing on a machine without a GPU

{
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm,pci.bus_id --format=csv
    nvidia-smi | head -5
    python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.get_device_capability())'
    python3 -c 'import pynvml; print("nvidia-ml-py", getattr(pynvml, "__version__", "?"))'
    py-spy --version
    uname -r; nproc; cat /proc/1/cgroup | head -3
} > "$W/info.txt" 2>&1
cat "$W/info.txt"

training_pid() { # the newest process whose command line starts "python3 MATCH" (not torchwatch's own)
    pgrep -n -f "^python3 $1" 2>/dev/null
}

# watched NAME DURATION BURST_AT MATCH -- COMMAND...: torchwatch run --headless on COMMAND for DURATION
# s, bench/record_gpu.py on the training's tree beside it
watched() {
    local name=$1 dur=$2 burst=$3 match=$4
    shift 5
    if [ "$(left)" -lt $((dur + 20)) ]; then say "SKIP $name (budget)"; return; fi
    case " $SKIP " in *" $name "*) say "SKIP $name"; return ;; esac
    say "watch $name: $*"
    local extra=()
    [ "$name" = gpu_bound ] && extra=(--prometheus 127.0.0.1:9464)
    TORCHWATCH_TRACE_DIR="$W/traces/$name" timeout -k 5 $((dur + 40)) python3 -m torchwatch run --headless \
        --duration "$dur" --json "$W/$name.json" --trace "$W/$name.trace.jsonl" --burst-at "$burst" "${extra[@]}" \
        -- "$@" > "$W/$name.txt" 2> "$W/$name.err" &
    local tw=$!
    local pid="" rec=""
    for _ in $(seq 40); do sleep 0.5; pid=$(training_pid "$match") && [ -n "$pid" ] && break; done
    if [ -n "$pid" ]; then
        timeout -k 5 $((dur + 10)) python3 bench/record_gpu.py --pid "$pid" --warmup 6 --seconds $((dur - 10)) \
            --interval 1 --what "$name: $*" --out "$W/$name.nvml.json" > "$W/$name.record.txt" 2>&1 &
        rec=$!
    fi
    if [ "$name" = gpu_bound ]; then
        sleep $((dur - 6))
        python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:9464/metrics", timeout=5).read().decode())' \
            > "$W/gpu_bound.metrics.txt" 2>&1
        nvidia-smi --query-gpu=utilization.gpu,power.draw,clocks.sm,memory.used --format=csv > "$W/gpu_bound.smi.txt" 2>&1
        nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv >> "$W/gpu_bound.smi.txt" 2>&1
    fi
    wait "$tw"; echo "exit $?" >> "$W/$name.txt"
    [ -n "$rec" ] && wait "$rec"
    sed -n '1,40p' "$W/$name.txt"
    tail -3 "$W/$name.record.txt" 2>/dev/null
}

D=22
watched gpu_bound 26 150,600 demo/gpu_bound.py -- python3 demo/gpu_bound.py --device $DEV --seconds 120
watched launch_bound $D 150,600 demo/launch_bound.py -- python3 demo/launch_bound.py --device $DEV --seconds 120
watched gpu_bound_relieve $D 150,600 demo/gpu_bound.py -- python3 demo/gpu_bound.py --device $DEV --relieve --seconds 120
watched launch_bound_relieve $D 150,600 demo/launch_bound.py -- python3 demo/launch_bound.py --device $DEV --relieve --seconds 120
watched dataloader_bound $D 40,200 demo/dataloader_bound.py -- python3 demo/dataloader_bound.py --device $DEV --seconds 120

if [ "$(left)" -gt $((45 + 12 * PAIRS)) ]; then
    say "overhead: gpu_bound on cuda, toggled"
    timeout -k 5 $(($(left) - 15)) python3 bench/overhead.py --within-run --toggle --pairs $PAIRS --steady-window 6 \
        --demos gpu_bound --device $DEV --json "$W/overhead.json" > "$W/overhead.txt" 2>&1
    cat "$W/overhead.txt"
else
    say "SKIP overhead (budget)"
fi

watched dataloader_bound_relieve $D 40,200 demo/dataloader_bound.py -- python3 demo/dataloader_bound.py --device $DEV --relieve --seconds 120

# issue 29: the launch path beside a CPU hog on the same core
if [ "$(left)" -gt 45 ]; then
    taskset -c 0 python3 -c 'while True: pass' & hog=$!
    watched launch_bound_hog $D 150 demo/launch_bound.py -- taskset -c 0 python3 demo/launch_bound.py --device $DEV --seconds 120
    kill $hog; wait $hog 2>/dev/null
fi
# issue 29: two trainings on one GPU, the other one named from NVML's process list
if [ "$(left)" -gt 45 ]; then
    python3 demo/gpu_bound.py --device $DEV --relieve --seconds 60 > "$W/other_training.err" 2>&1 & other=$!
    watched shared_gpu $D 150 demo/launch_bound.py -- python3 demo/launch_bound.py --device $DEV --seconds 120
    echo "the other training: PID $other" >> "$W/shared_gpu.txt"
    kill -INT $other; wait $other 2>/dev/null
fi

probe() {
    local name=$1 need=$2
    shift 2
    if [ "$(left)" -lt "$need" ]; then say "SKIP $name (budget)"; return; fi
    case " $SKIP " in *" $name "*) say "SKIP $name"; return ;; esac
    say "probe $name"
    timeout -k 5 $(($(left) - 8)) "$@" > "$W/$name.out" 2> "$W/$name.err"
    echo "exit $?" >> "$W/$name.out"
    tail -c 3000 "$W/$name.out"
}
probe flops 30 python3 bench/gpu_probe.py flops
probe oom 40 python3 -m torchwatch run --headless --json "$W/oom.json" -- python3 bench/gpu_probe.py oom
probe compile 40 python3 bench/gpu_probe.py compile

[ -n "$LINKED" ] && rm -f torchwatch/rules
say "packing"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$W/info.txt" 2>&1
(cd "$W" && tar czf "$OUT/gpu_traces.tar.gz" traces 2>/dev/null; rm -rf traces; tar czf "$OUT/gpu_session.tar.gz" .)
ls -la "$OUT"
say "done"
