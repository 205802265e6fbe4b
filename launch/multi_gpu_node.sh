#!/usr/bin/env bash
# One node, all its GPUs, one process: the batch is split over a ("data", "fsdp") mesh of every
# local device. For students too big to replicate, add --config.mesh.fsdp=N (N divides #GPUs).
#   bash launch/multi_gpu_node.sh configs/caliber.py runs/caliber [--config.batch_size=256 ...]
# Exit status 75 (EX_TEMPFAIL): stopped by SIGTERM after saving a checkpoint; run the same command
# again (or let a scheduler requeue it) to resume. `exec`: a SIGTERM sent to this script reaches
# the training process itself.
set -euo pipefail
config=${1:?config file}; workdir=${2:?workdir}; shift 2
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}
nvidia-smi -L || true
exec python -m caliber_jax.train --config "$config" --workdir "$workdir" "$@"
