#!/bin/bash
# #37 polarity pilots (session 22): quantity-scope data (configs/headline.py:quantity) and the same
# with polarity drawn 3x; teacher vectors reused from the paper-scope data; 400 steps each like
# the earlier pilots; then exported and scored on both dev sets. Resumable; niced beside the LLM run.
cd /work/main
F=/work/shared/data/financebench/filings.jsonl.gz
P="nice -n 10 .venv/bin/python"
echo "commit $(git rev-parse HEAD) $(date -u +%FT%TZ)"
declare -A DATA=([q]=runs/headline_q/data [qp3]=runs/headline_qp3/data)
declare -A EXTRA=([q]="" [qp3]="--config.prepare.category_weights.polarity=3.0")
for v in q qp3; do
  d=${DATA[$v]}
  [ -f $d/stats.json ] || $P -m caliber_jax.prepare --config configs/headline.py:quantity --config.data.dir=$d --config.prepare.input=$F ${EXTRA[$v]}
  $P -m caliber_jax.embed_teacher --config configs/headline.py:quantity --config.data.dir=$d --reuse_from=runs/headline/data 2>&1 | grep -v "row/s"
  w=runs/headline_q/pilots/Pilot_$v
  [ -f $w/summary.json ] || $P -m caliber_jax.train --config configs/headline.py:quantity --config.data.dir=$d ${EXTRA[$v]} --config.prepare.input=$F --config.num_epochs=0.64 --config.seed=0 --workdir=$w 2>&1 | tr '\r' '\n' | grep -v "it/s\]$" | tail -5
  [ -f $w/hf/modules.json ] || $P -m caliber_jax.export --workdir=$w --output=$w/hf
  echo "PILOT_$v DONE $(date -u +%FT%TZ)"
done
for dev in runs/headline/data runs/headline_q/data; do
  tag=$(basename $(dirname $dev))
  for m in runs/headline_q/pilots/Pilot_q runs/headline_q/pilots/Pilot_qp3 runs/headline/pilots/Pilot_q0 runs/headline/pilots/Initial_lp_long_s0; do
    label=$(basename $m)
    out=runs/headline_q/pilots/results_$tag/$label/numgap.json
    [ -f $out ] || $P -m caliber_jax.evaluate --model=$m/hf --label="$label" --numgap=$dev/numgap_dev.jsonl --max_length=256 --tasks=numgap --output=$out 2>&1 | tail -1
  done
done
echo "PILOTS_DONE $(date -u +%FT%TZ)"
