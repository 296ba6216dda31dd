#!/bin/bash
# Slurm TaskProlog: torchwatch's hook pre-loaded in every task of every job (slurmd runs it as the
# job's user before each task; each "export NAME=value" line it prints is set in the task's
# environment). The ranks then publish their steps for the node's serve, and their job key is
# torchrun's TORCHELASTIC_RUN_ID or MASTER_ADDR:MASTER_PORT, else slurm:SLURM_JOB_ID.SLURM_STEP_ID.
# A job opts out with TORCHWATCH_HOOK=0 in its environment.
# The boot directory of the torchwatch installed beside serve (adjust to your install):
BOOT=${TORCHWATCH_BOOT:-/opt/torchwatch/lib/python3.12/site-packages/torchwatch/hook/boot}
if [ "${TORCHWATCH_HOOK:-1}" != 0 ] && [ -f "$BOOT/sitecustomize.py" ]; then
    echo "export PYTHONPATH=$BOOT${PYTHONPATH:+:$PYTHONPATH}"
    echo "export TORCHWATCH_HOOK=1"
fi
