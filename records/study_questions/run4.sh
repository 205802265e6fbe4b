#!/bin/bash
# Round 4: move the question side, anchor the passage side. The passages' (and their edits')
# targets are the shipped student's own vectors (data_anchor: `embed_teacher` with the shipped
# student as the "teacher" at 128 tokens), the questions' the teacher's (data_plain's q store);
# LEAF's alignment on both (objective caliber, lambda 0, no structure or contrastive term) plus
# question alignment at weight W. From the shipped student, 100 steps, seed 0. Resumable.
set -euo pipefail
F=/work/shared/data/financebench/filings.jsonl.gz
PY=.venv/bin/python
STEPS=${STEPS:-100}
SEED=${SEED:-0}
OUT=runs/q76
# The student shipped before round 4. Since 6ee7d6f models/ holds round 4's own student, so a later
# seed names the earlier one: SHIPPED=runs/q76/old_shipped (`git show 6ee7d6f^:models/...`).
SHIPPED=${SHIPPED:-models/minilm-l6-caliber-finance}
COMMON="--config.prepare.input=$F --config.prepare.max_passages=2400"
log() { echo "[$(date -u +%H:%M:%S)] $*"; }
if [ ! -f $OUT/data_anchor/teacher_train/x/done ] && [ ! -d $OUT/data_anchor/teacher_train/x ]; then
  D=$OUT/data_anchor; mkdir -p $D
  for f in mined_dev.jsonl numgap_dev.jsonl numgap_test.jsonl passages.jsonl stats.json train.jsonl \
           val.jsonl token_lengths teacher_val; do cp -r $OUT/data_plain/$f $D/; done
  $PY -m caliber_jax.embed_teacher --config=configs/headline.py:minednum,c0,scales,qalign \
    --config.data.dir=$D $COMMON --config.teacher.model_dir=$SHIPPED --config.teacher.backend=flax \
    --config.teacher.dtype=float32 --splits=train
  rm -rf $D/teacher_train/q && cp -r $OUT/data_plain/teacher_train/q $D/teacher_train/q
fi
arm() {  # name weight
  local name=$1 w=$2 work=$OUT/$1
  if [ ! -f $work/hf/model.safetensors ]; then
    $PY -m caliber_jax.train --config=configs/headline.py:minednum,c0,scales,qalign --workdir=$work \
      --config.data.dir=$OUT/data_anchor $COMMON --config.model.init_dir=$SHIPPED \
      --config.loss.objective=caliber --config.loss.lam=0.0 --config.loss.perturb_weight=1.0 \
      --config.loss.structure_weight=0.0 --config.loss.contrastive_weight=0.0 \
      --config.loss.query_align_weight=$w \
      --config.total_steps=$STEPS --config.checkpoint_every=25 --config.seed=$SEED \
      --config.eval_at_start=False --config.data.validate=False \
      --config.model.dtype=auto --config.teacher.dtype=auto
    $PY -m caliber_jax.export --workdir=$work --output=$work/hf
  fi
  local out=$OUT/dev/$name/numgap.json
  [ -f $out ] || $PY -m caliber_jax.evaluate --model=$work/hf --output=$out \
    --numgap=$OUT/data_filing/numgap_dev.jsonl --max_length=256 --tasks=numgap
  log "$name trained, exported, NumGap dev scored"
}
if [ "$SEED" != 0 ]; then  # the candidate's next seed (round 3's rule, step 3)
  arm anchor_q4_s$SEED 4.0
  log "seed $SEED done"
  exit 0
fi
arm anchor_q1 1.0
arm anchor_q4 4.0
for style in filing plain; do
  out=$OUT/agree/r4_$style.json
  [ -f $out ] || $PY scripts/drift_report.py --teacher runs/models/all-mpnet-base-v2 \
    --student $OUT/anchor_q1/hf $OUT/anchor_q4/hf --financebench $OUT/data_$style/mined_dev.jsonl \
    --max_length 256 --output $out
done
log "all done"
