#!/usr/bin/env bash
# One GPU (or one host with several: JAX uses every local device for data parallelism).
#   bash launch/single_gpu.sh configs/caliber.py runs/caliber [--config.field=value ...]
# Install first: pip install -e ".[cuda]"
# Exit status 75 (EX_TEMPFAIL): stopped by SIGTERM after saving a checkpoint; run the same command
# again (or let a scheduler requeue it) to resume. `exec`: a SIGTERM sent to this script reaches
# the training process itself.
set -euo pipefail
config=${1:?config file}; workdir=${2:?workdir}; shift 2
# Let XLA take GPU memory as it needs it rather than 75% up front (teacher and student share).
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}
exec python -m caliber_jax.train --config "$config" --workdir "$workdir" "$@"
