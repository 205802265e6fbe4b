#!/usr/bin/env bash
# Cloud TPU pod slice: the same command on every worker; jax.distributed.initialize() finds the
# slice's topology by itself. Install on all workers first:
#   gcloud compute tpus tpu-vm ssh $TPU --zone $ZONE --worker=all \
#     --command 'pip install -e "caliber_jax[tpu]"'
#   bash launch/tpu_pod.sh $TPU $ZONE configs/caliber.py gs://bucket/runs/caliber [--config.x=y]
# The workdir and --config.data.dir may be gs:// URLs (etils.epath + gcsfs for files, Orbax and
# TensorStore's own GCS drivers for arrays); pip install gcsfs on every worker for that. A
# maintenance-event SIGTERM reaches each worker; JAX's preemption service agrees on one step.
set -euo pipefail
tpu=${1:?TPU name}; zone=${2:?zone}; config=${3:?config file}; workdir=${4:?workdir}; shift 4
gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all --command \
  "cd caliber_jax && python -m caliber_jax.train --config $config --workdir $workdir \
   --config.multihost=True $*"
