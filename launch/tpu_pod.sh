#!/usr/bin/env bash
# Cloud TPU pod slice: the same command on every worker; jax.distributed.initialize() finds the
# slice's topology by itself. Install on all workers first:
#   gcloud compute tpus tpu-vm ssh $TPU --zone $ZONE --worker=all \
#     --command 'pip install -e "caliber_jax[tpu]"'
#   bash launch/tpu_pod.sh $TPU $ZONE configs/caliber.py gs://bucket/runs/caliber [--config.x=y]
# Data (passages + teacher stores) must be readable from every worker (e.g. a copy on each, or a
# shared mount); checkpoints go to the workdir (Orbax writes gs:// paths directly).
set -euo pipefail
tpu=${1:?TPU name}; zone=${2:?zone}; config=${3:?config file}; workdir=${4:?workdir}; shift 4
gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all --command \
  "cd caliber_jax && python -m caliber_jax.train --config $config --workdir $workdir \
   --config.multihost=True $*"
