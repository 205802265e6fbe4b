#!/usr/bin/env bash
# Several JAX processes on this machine, joined by jax.distributed on localhost with gloo CPU
# collectives: the multi-host code path (per-process data, global arrays, Orbax and TensorStore
# across processes, preemption agreement) without a cluster.
#   bash launch/local_multiprocess.sh NUM_PROCESSES -- COMMAND...
#   bash launch/local_multiprocess.sh 2 -- python -m caliber_jax.train --config configs/demo.py \
#     --workdir runs/demo_mp
# Every process runs COMMAND with JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID
# set (read by sharding.initialize_distributed, which the entry points call), on the CPU, with
# LOCAL_DEVICES (default 2) CPU devices each. SIGTERM/SIGINT/SIGHUP are forwarded to every
# process. Each process's exit is reported as "local_multiprocess: process I exited with CODE".
# Exit status: 0 when every process exits 0; 75 (EX_TEMPFAIL, `train` stopped by SIGTERM with a
# checkpoint: requeue or rerun the same command to resume) when a process exits 75, after the
# others' own orderly stop (they agree on the step and checkpoint it together; killing one then
# could lose that checkpoint), which they get PREEMPT_GRACE_S seconds for before being killed;
# otherwise the first other non-zero status, which also ends the others at once (the survivors of
# a dead peer would only wait for it).
# Environment: LOCAL_DEVICES, JAX_COORDINATOR_PORT (default: a free port), PREEMPT_GRACE_S (120).
set -uo pipefail

usage() { echo "usage: $0 NUM_PROCESSES -- COMMAND..." >&2; exit 2; }
[[ $# -ge 3 && $1 =~ ^[1-9][0-9]*$ && $2 == "--" ]] || usage
num=$1; shift 2
devices=${LOCAL_DEVICES:-2}
[[ $devices =~ ^[1-9][0-9]*$ ]] || { echo "error: LOCAL_DEVICES=$devices: not a count" >&2; exit 2; }
grace=${PREEMPT_GRACE_S:-120}
[[ $grace =~ ^[0-9]+$ ]] || { echo "error: PREEMPT_GRACE_S=$grace: not seconds" >&2; exit 2; }
port=${JAX_COORDINATOR_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])')}

export JAX_COORDINATOR_ADDRESS="localhost:$port" JAX_NUM_PROCESSES="$num"
export JAX_PLATFORMS=cpu JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo
# Replace any device-count flag of the caller; keep its other XLA flags.
xla_flags=$(sed -E 's/--xla_force_host_platform_device_count=[0-9]+//g' <<<"${XLA_FLAGS:-}")
export XLA_FLAGS="$xla_flags --xla_force_host_platform_device_count=$devices"

declare -A live=()  # pid -> process index, while it runs
for ((i = 0; i < num; i++)); do
  JAX_PROCESS_ID=$i "$@" &
  live[$!]=$i
  echo "local_multiprocess: process $i pid $! ($JAX_COORDINATOR_ADDRESS, $devices devices)" >&2
done

forward() {
  for pid in "${!live[@]}"; do kill -s "$1" "$pid" 2>/dev/null; done
}
trap 'forward TERM' TERM
trap 'forward INT' INT
trap 'forward HUP' HUP

PREEMPTED=75  # caliber_jax.watchdog.EXIT_PREEMPTED, train's status when preempted
status=0
timer=  # pid of the grace-period sleep, once a process has exited 75
grace_over=  # set once the grace period ran out: the processes killed then are not failures
while ((${#live[@]} > 0)); do
  done_pid=
  # wait -n returns when any child ends, or when a trapped signal arrives (then loop again).
  wait -n -p done_pid "${!live[@]}" ${timer:+"$timer"}
  code=$?
  [[ -n ${done_pid:-} ]] || continue
  if [[ $done_pid == "$timer" ]]; then
    timer=
    grace_over=1
    echo "local_multiprocess: processes ${live[*]} still running ${grace} s after a preempted" \
      "exit; killing them (the last complete checkpoint resumes)" >&2
    forward KILL
    continue
  fi
  index=${live[$done_pid]}
  unset "live[$done_pid]"
  echo "local_multiprocess: process $index exited with $code" >&2
  if ((code == PREEMPTED)); then
    if ((status == 0)); then
      status=$PREEMPTED
      sleep "$grace" &
      timer=$!
      ((${#live[@]} == 0)) || echo "local_multiprocess: process $index was preempted" \
        "(checkpointed); waiting up to $grace s for the others' own orderly stop" >&2
    fi
  elif ((code != 0 && (status == 0 || status == PREEMPTED))) && [[ -z $grace_over ]]; then
    status=$code
    echo "local_multiprocess: process $index failed; stopping the others" >&2
    forward KILL
  fi
done
[[ -z $timer ]] || kill "$timer" 2>/dev/null
exit "$status"
