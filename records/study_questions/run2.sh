#!/bin/bash
# Round 2 (designed after the round-1 candidate lost on FinanceBench): question alignment without
# the in-batch contrastive term, from the shipped student, on the filing data. Resumable.
set -euo pipefail
F=/work/shared/data/financebench/filings.jsonl.gz
PY=.venv/bin/python
STEPS=${STEPS:-100}
OUT=runs/q76
SHIPPED=models/minilm-l6-caliber-finance
COMMON="--config.prepare.input=$F --config.prepare.max_passages=2400"
log() { echo "[$(date -u +%H:%M:%S)] $*"; }
arm() {  # name variant extra...
  local name=$1 variant=$2 work=$OUT/$1; shift 2
  if [ ! -f $work/hf/model.safetensors ]; then
    $PY -m caliber_jax.train --config=configs/headline.py:$variant --workdir=$work \
      --config.data.dir=$OUT/data_filing $COMMON --config.model.init_dir=$SHIPPED \
      --config.total_steps=$STEPS --config.checkpoint_every=25 \
      --config.eval_at_start=False --config.data.validate=False \
      --config.model.dtype=auto --config.teacher.dtype=auto "$@"
    $PY -m caliber_jax.export --workdir=$work --output=$work/hf
  fi
  log "$name trained and exported"
  for style in filing plain; do
    local out=$OUT/dev/$name/$style.json
    [ -f $out ] || $PY -m caliber_jax.evaluate --model=$work/hf --output=$out \
      --financebench=$OUT/data_$style/mined_dev.jsonl --numgap=$OUT/data_filing/numgap_dev.jsonl \
      --max_length=256 --tasks=financebench,numgap
  done
  log "$name scored on dev"
}
arm qalign_c0 minednum,c0,scales,filing,qalign
arm qalign4_c0 minednum,c0,scales,filing,qalign --config.loss.query_align_weight=4.0
log "all done"
