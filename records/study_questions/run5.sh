#!/bin/bash
# Round 4's recipe through the library's own path (configs/headline.py:anchor,scales with
# teacher.passage_model_dir following model.init_dir), from the student shipped before it, to check
# that it reproduces anchor_q4 on the dev sets. Resumable.
set -euo pipefail
F=/work/shared/data/financebench/filings.jsonl.gz
PY=.venv/bin/python
OUT=runs/q76
START=$OUT/old_shipped
CFG="--config=configs/headline.py:anchor,scales --config.data.dir=$OUT/data_anchor_cfg \
  --config.prepare.input=$F --config.prepare.max_passages=2400 --config.model.init_dir=$START \
  --config.teacher.dtype=auto --config.model.dtype=auto"
log() { echo "[$(date -u +%H:%M:%S)] $*"; }
[ -f $OUT/data_anchor_cfg/stats.json ] || $PY -m caliber_jax.prepare $CFG
log "prepared"
$PY -m caliber_jax.embed_teacher $CFG --splits=train
log "embedded"
W=$OUT/anchor_cfg
if [ ! -f $W/hf/model.safetensors ]; then
  $PY -m caliber_jax.train $CFG --workdir=$W --config.checkpoint_every=25 \
    --config.eval_at_start=False --config.data.validate=False
  $PY -m caliber_jax.export --workdir=$W --output=$W/hf
fi
log "trained"
[ -f $OUT/dev/anchor_cfg/numgap.json ] || $PY -m caliber_jax.evaluate --model=$W/hf \
  --output=$OUT/dev/anchor_cfg/numgap.json --numgap=$OUT/data_filing/numgap_dev.jsonl \
  --max_length=256 --tasks=numgap
for style in filing plain; do
  out=$OUT/agree/r5_$style.json
  [ -f $out ] || $PY scripts/drift_report.py --teacher runs/models/all-mpnet-base-v2 \
    --student $W/hf --financebench $OUT/data_$style/mined_dev.jsonl --max_length 256 --output $out
done
log "all done"
