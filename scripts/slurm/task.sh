#!/usr/bin/env bash
# One Slurm task = one worker; scripts/slurm/train.sbatch runs it on every task with srun.
#
#   1. With 2+ tasks in the step (SLURM_NTASKS > 1), TF_CONFIG from Slurm's node list
#      (scripts/slurm/tf_config.py: task I is worker I, on port WORKER_PORT + its index on the node).
#      With one task, no TF_CONFIG: the training stays on this host (one GPU or MirroredStrategy).
#   2. The batch script's probe file (TRAIN_SHARED_PROBE, written into OUTPUT_DIR on the first node)
#      must be visible here: OUTPUT_DIR is the same shared storage on every node, or exit 2.
#   3. exec python -m train fit: its exit code is the task's (0 done, 1 failed, 2 bad input,
#      42 stopped after saving, 75 run directory busy).
#
# PYTHON: the interpreter (default: the repository's .venv/bin/python if present, else python3).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
where="[slurm task ${SLURM_PROCID:-0}/${SLURM_NTASKS:-1} on ${SLURMD_NODENAME:-$(hostname)}]"

if (( ${SLURM_NTASKS:-1} > 1 )); then
    TF_CONFIG="$("$PYTHON" "$REPO/scripts/slurm/tf_config.py")" || exit 2   # it printed the one-line error
    export TF_CONFIG
    echo "$where TF_CONFIG=$TF_CONFIG" >&2
else
    unset TF_CONFIG   # one exported in the submitting shell would make this task wait for workers that never come
fi

if [[ -n "${TRAIN_SHARED_PROBE:-}" && ! -f "$TRAIN_SHARED_PROBE" ]]; then
    echo "error: $where OUTPUT_DIR=${OUTPUT_DIR:-} is not the storage the batch script wrote to: $TRAIN_SHARED_PROBE" \
        "is not here; OUTPUT_DIR must be shared storage (NFS, Lustre, GPFS, ...) mounted at the same path on every node" >&2
    exit 2
fi

exec "$PYTHON" -m train fit
