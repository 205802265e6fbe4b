#!/usr/bin/env bash
# Cloud TPU pod slice: the same command on every worker; jax.distributed.initialize() finds the
# slice's topology by itself. Install on all workers first:
#   gcloud compute tpus tpu-vm ssh $TPU --zone $ZONE --worker=all \
#     --command 'pip install -e "caliber_jax[tpu]"'
#   bash launch/tpu_pod.sh $TPU $ZONE configs/caliber.py gs://bucket/runs/caliber [--config.x=y]
# The workdir and --config.data.dir may be gs:// URLs (etils.epath + gcsfs for files, Orbax and
# TensorStore's own GCS drivers for arrays); pip install gcsfs on every worker for that. A
# maintenance-event SIGTERM reaches each worker; JAX's preemption service agrees on one step,
# every worker checkpoints it and exits 75 (EX_TEMPFAIL). Exit status: a worker's failure status
# if any failed (124: stalled, caliber_jax/watchdog.py; running this script again resumes from
# the last checkpoint), else 75 if they were preempted (run this script again to resume), else 0.
# Every argument reaches the workers' bash as given (quoted with printf %q), spaces included.
set -uo pipefail
tpu=${1:?TPU name}; zone=${2:?zone}; config=${3:?config file}; workdir=${4:?workdir}; shift 4
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# The workers' shell parses --command again: each argument goes in quoted, so none splits.
train=$(printf ' %q' python -m caliber_jax.train --config "$config" --workdir "$workdir" \
  --config.multihost=True "$@")
# Each worker reports its own status; gcloud's own says only whether the ssh sessions worked.
gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all --command \
  "cd caliber_jax &&$train; echo \"caliber_jax exit status \$?\"" 2>&1 | tee "$log"
ssh_status=${PIPESTATUS[0]}
codes=$(grep -o 'caliber_jax exit status [0-9]*' "$log" | awk '{print $4}' | sort -un)
failed=$(grep -vxE '0|75' <<<"$codes" | tail -n 1)
if [[ -n $failed ]]; then
  exit "$failed"
elif grep -qx 75 <<<"$codes"; then
  echo "tpu_pod.sh: preempted with a checkpoint; run the same command again to resume" >&2
  exit 75
elif [[ -z $codes ]]; then
  exit $((ssh_status ? ssh_status : 1))  # no worker reported: the ssh sessions failed
fi
exit "$ssh_status"
