#!/bin/bash
# Round 3 (designed after round 1's candidate lost on FinanceBench): the dev signal is the
# question side's agreement with the teacher and the passage side under teacher questions
# (scripts/drift_report.py on both mined dev forms), not retrieval of generated questions by the
# student's own question vectors. New arms: plain_qalign (contrastive + question alignment on the
# plain-form questions) and weight blends (alpha 0.5) of two arms with the shipped student.
# Resumable. Run from the repo root.
set -euo pipefail
F=/work/shared/data/financebench/filings.jsonl.gz
PY=.venv/bin/python
STEPS=${STEPS:-100}
SEED=${SEED:-0}
OUT=runs/q76
SHIPPED=models/minilm-l6-caliber-finance
COMMON="--config.prepare.input=$F --config.prepare.max_passages=2400"
log() { echo "[$(date -u +%H:%M:%S)] $*"; }
arm() {  # name variant data extra...
  local name=$1 variant=$2 data=$3 work=$OUT/$1; shift 3
  if [ ! -f $work/hf/model.safetensors ]; then
    $PY -m caliber_jax.train --config=configs/headline.py:$variant --workdir=$work \
      --config.data.dir=$OUT/$data $COMMON --config.model.init_dir=$SHIPPED \
      --config.total_steps=$STEPS --config.checkpoint_every=25 --config.seed=$SEED \
      --config.eval_at_start=False --config.data.validate=False \
      --config.model.dtype=auto --config.teacher.dtype=auto "$@"
    $PY -m caliber_jax.export --workdir=$work --output=$work/hf
  fi
  log "$name trained and exported"
}
blend() {  # name run
  [ -f $OUT/$1/hf/model.safetensors ] || \
    $PY -m caliber_jax.export --workdir=$OUT/$2 --interpolate 0.5 --output=$OUT/$1/hf
  log "$1 exported"
}
numgap_dev() {  # name model
  local out=$OUT/dev/$1/numgap.json
  [ -f $out ] || [ -f $OUT/dev/$1/plain.json ] || $PY -m caliber_jax.evaluate --model=$2 \
    --output=$out --numgap=$OUT/data_filing/numgap_dev.jsonl --max_length=256 --tasks=numgap
  log "$1 NumGap dev done"
}
agree() {  # tag students...
  local tag=$1; shift
  for style in filing plain; do
    local out=$OUT/agree/${tag}_$style.json
    [ -f $out ] || $PY scripts/drift_report.py --teacher runs/models/all-mpnet-base-v2 \
      --student "$@" --financebench $OUT/data_$style/mined_dev.jsonl --max_length 256 --output $out
  done
  log "agreement $tag done"
}
blend b50_filing_qalign filing_qalign
blend b50_qalign_c0 qalign_c0
arm plain_qalign minednum,c1,scales,qalign data_plain
for name in b50_filing_qalign b50_qalign_c0 plain_qalign; do numgap_dev $name $OUT/$name/hf; done
agree r3 $OUT/b50_filing_qalign/hf $OUT/b50_qalign_c0/hf $OUT/plain_qalign/hf
log "all done"
