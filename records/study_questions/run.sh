#!/bin/bash
# The question-side study: three arms from the shipped student, each STEPS steps, then dev scoring.
# Resumable: every stage skips what is done. Run from the repo root.
set -euo pipefail
F=/work/shared/data/financebench/filings.jsonl.gz
PY=.venv/bin/python
STEPS=${STEPS:-100}
OUT=runs/q76
SHIPPED=models/minilm-l6-caliber-finance
COMMON="--config.prepare.input=$F --config.prepare.max_passages=2400"
log() { echo "[$(date -u +%H:%M:%S)] $*"; }
# teacher vectors: the filing data, then the plain data reusing its vectors of equal texts
$PY -m caliber_jax.embed_teacher --config=configs/headline.py:minednum,c1,scales,filing \
  --config.data.dir=$OUT/data_filing $COMMON --config.teacher.dtype=auto
log "filing vectors done"
$PY -m caliber_jax.embed_teacher --config=configs/headline.py:minednum,c1,scales \
  --config.data.dir=$OUT/data_plain $COMMON --config.teacher.dtype=auto --reuse_from=$OUT/data_filing
log "plain vectors done"
arm() {  # name variant data
  local name=$1 variant=$2 data=$3 work=$OUT/$1
  if [ ! -f $work/hf/model.safetensors ]; then
    $PY -m caliber_jax.train --config=configs/headline.py:$variant --workdir=$work \
      --config.data.dir=$OUT/$data $COMMON --config.model.init_dir=$SHIPPED \
      --config.total_steps=$STEPS --config.checkpoint_every=25 \
      --config.eval_at_start=False --config.data.validate=False \
      --config.model.dtype=auto --config.teacher.dtype=auto
    $PY -m caliber_jax.export --workdir=$work --output=$work/hf
  fi
  log "$name trained and exported"
}
score() {  # name model
  local name=$1 model=$2
  for style in filing plain; do
    local out=$OUT/dev/$name/$style.json
    [ -f $out ] || $PY -m caliber_jax.evaluate --model=$model --output=$out \
      --financebench=$OUT/data_$style/mined_dev.jsonl --numgap=$OUT/data_filing/numgap_dev.jsonl \
      --max_length=256 --tasks=financebench,numgap
  done
  log "$name scored on dev"
}
score shipped $SHIPPED
arm plain minednum,c1,scales data_plain
score plain $OUT/plain/hf
arm filing minednum,c1,scales,filing data_filing
score filing $OUT/filing/hf
arm filing_qalign minednum,c1,scales,filing,qalign data_filing
score filing_qalign $OUT/filing_qalign/hf
log "all done"
