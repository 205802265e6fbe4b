#!/usr/bin/env bash
# The CPU train benchmark on the host CPU of a GPU machine (the ratio is asked for
# on AVX-512 machines too; the device hosts are other x86 CPUs), pinned to 2 cores like the
# development machines, JAX and PyTorch both on the CPU.
#
#   bash benchmarks/cpu_on_device.sh prepare   # here: wheels, MiniLM config + tokenizer, filings
#   # then, through the device tool, carrying .whl and runs/device_cpu:
#   bash benchmarks/cpu_on_device.sh run [extra train_throughput.py flags]   # = setup, then bench
#
# The device image has jax, flax, optax, orbax, tensorstore, transformers and torch but neither the
# MiniLM package (90 MB of weights, above what a device run carries) nor the filings next to the
# repo. So `prepare` keeps MiniLM's config and tokenizer and every 18th filing (the benchmark's own
# `--record-stride`), and `run` gives MiniLM random weights (timing does not depend on their values;
# `CALIBER_MINILM_DIR` points configs/demo.py and the benchmarks at them).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=runs/device_cpu
STRIDE=18
# prepare: the repo's .venv (it has the MiniLM package); run: the device image's python3.
DEFAULT_PYTHON=python3
[[ "${1:-}" == prepare && -x .venv/bin/python ]] && DEFAULT_PYTHON=.venv/bin/python
PYTHON=${PYTHON:-$DEFAULT_PYTHON}

case "${1:-}" in
prepare)
  bash ../shared/tools/device-wheels.sh
  mkdir -p "$OUT/minilm"
  "$PYTHON" - "$OUT" "$STRIDE" <<'EOF'
import gzip, itertools, shutil, sys
from pathlib import Path
from configs import demo
out, stride = Path(sys.argv[1]), int(sys.argv[2])
source = Path(demo.minilm_dir())
for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
             "vocab.txt", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json"):
    (out / "minilm" / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / name, out / "minilm" / name)
filings = Path("../shared/data/financebench/filings.jsonl.gz")
with gzip.open(filings, "rt") as f, gzip.open(out / "filings.jsonl.gz.tmp", "wt") as g:
    g.writelines(itertools.islice(f, 0, None, stride))
(out / "filings.jsonl.gz.tmp").rename(out / "filings.jsonl.gz")
EOF
  du -sh .whl "$OUT"
  ;;
setup|run)
  # setup: the missing wheels into /tmp/site and MiniLM with random weights (the 2026-11-26 run's
  # benchmarks/gpu_on_device.sh called it, then `bench` beside its GPU work); run: setup, then
  # bench.
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  PYTHONPATH=/tmp/site:$PWD "$PYTHON" - "$OUT/minilm" <<'EOF'
import sys
import torch
from transformers import BertConfig, BertModel
torch.manual_seed(0)
BertModel(BertConfig.from_pretrained(sys.argv[1])).save_pretrained(sys.argv[1])
EOF
  [[ "$1" == setup ]] && exit 0
  ;&
bench)
  shift
  export PYTHONPATH=/tmp/site:$PWD
  export CALIBER_MINILM_DIR=$PWD/$OUT/minilm JAX_PLATFORMS=cpu CUDA_VISIBLE_DEVICES=
  grep -m1 "model name" /proc/cpuinfo
  grep -m1 -o -w "avx512[a-z_0-9]*" /proc/cpuinfo | head -1 || echo "no avx512"
  for round in 1 2; do
    taskset -c 0,1 "$PYTHON" benchmarks/train_throughput.py --preset cpu-minilm \
      --filings "$OUT/filings.jsonl.gz" --record-stride 1 "$@"
  done
  ;;
*)
  echo "usage: bash benchmarks/cpu_on_device.sh prepare|run|setup|bench [train_throughput flags]" >&2
  exit 2
  ;;
esac
