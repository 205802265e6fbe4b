#!/usr/bin/env bash
# One short device session (issues #13 and #14): the GPU tests, the Qwen3-0.6B train benchmark on
# the GPU with XLA and with cuDNN attention, and meanwhile the CPU train benchmark on two host cores.
#
#   bash benchmarks/cpu_on_device.sh prepare     # here, once: .whl, runs/device_cpu
#   # through the device tool, carrying .whl and runs/device_cpu:
#   bash benchmarks/gpu_on_device.sh [SECONDS]   # SECONDS: the device call's limit (default 540)
#
# The GPU work runs on host cores 2.. and the CPU benchmark on cores 0,1, so the two do not share
# cores (they do share the host's caches and memory bandwidth; the CPU benchmark alternates its two
# frameworks step by step, so both see the same). Each part has its own time limit, sized to end
# before the device call's, and writes its log under $OUT (or runs/device_out) as it goes: a part
# that runs out of time leaves what it printed and the parts after it still run.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/device_out}
PYTHON=${PYTHON:-python3}
LIMIT=${1:-540}
mkdir -p "$OUT"
start=$SECONDS

bash benchmarks/cpu_on_device.sh setup > "$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
DATA=runs/device_cpu  # what `cpu_on_device.sh prepare` wrote
export PYTHONPATH=/tmp/site:$PWD CALIBER_MINILM_DIR=$PWD/$DATA/minilm
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
head -12 "$OUT/nvidia-smi.txt"
"$PYTHON" -c "import jax, torch; print('jax', jax.__version__, jax.devices(), 'torch', torch.__version__)"

# $PARTS: which parts; $GPU_TESTS: which GPU tests; $TRAIN_FLAGS: more train_throughput.py flags.
PARTS=${PARTS:-cpu_bench gpu_tests train_xla train_cudnn}
wants() { [[ " $PARTS " == *" $1 "* ]]; }
cpu_pid=
if wants cpu_bench; then
  # The whole call (less a margin); timeout stops the benchmark's process group.
  timeout "$((LIMIT - 15))" bash benchmarks/cpu_on_device.sh bench > "$OUT/cpu_bench.log" 2>&1 &
  cpu_pid=$!
fi

gpu_cores="2-$(($(nproc) - 1))"
part() {  # part NAME SECONDS COMMAND...: COMMAND on the GPU cores, at most SECONDS, log in $OUT
  local name=$1 limit=$2
  shift 2
  local left=$((LIMIT - 20 - (SECONDS - start)))
  ((limit > left)) && limit=$left
  ((limit < 30)) && { echo "== $name: no time left"; return; }
  echo "== $name (limit ${limit}s)"
  local t0=$SECONDS
  JAX_PLATFORMS=cuda,cpu timeout "$limit" taskset -c "$gpu_cores" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "rc=$rc wall=$((SECONDS - t0))s" | tee -a "$OUT/$name.log"
  tail -4 "$OUT/$name.log"
}

read -ra train_flags <<< "${TRAIN_FLAGS:-}"
# Two batch shapes, 10 timed steps each: on session 16's H100, four shapes of the unrolled 28-layer
# step had not got past compiling and warming up after 2.5 minutes (BENCHMARKS.md).
train=(benchmarks/train_throughput.py --preset gpu-qwen3-0.6b --num-batches 2 --repeats 5
  --filings "$DATA/filings.jsonl.gz" --record-stride 1 --compile-cache "" "${train_flags[@]}")
wants gpu_tests && part gpu_tests 150 "$PYTHON" -m pytest -q \
  -p no:cacheprovider -m gpu -rs ${GPU_TESTS:-tests/models/test_attention_gpu.py tests/models/test_qwen3_gpu.py}
wants train_xla && part train_xla "${TRAIN_LIMIT:-190}" "$PYTHON" "${train[@]}" --jax-attention xla
wants train_cudnn && part train_cudnn "${TRAIN_LIMIT:-190}" "$PYTHON" "${train[@]}" --jax-attention cudnn

if [[ -n "$cpu_pid" ]]; then
  wait "$cpu_pid"
  echo "== cpu_bench rc=$?"
  grep -E "model name|avx512|ratio_jax_over_torch|seq/s" "$OUT/cpu_bench.log" | tail -12
fi
