#!/bin/bash
# #37 session 22: "separate late" on the polarity-weighted quantity data (runs/headline_qp3/data):
# 400 steps of the numeric recipe from Distill lp long s0, scored on both dev sets. Resumable.
cd /work/main
P="nice -n 5 .venv/bin/python"
echo "commit $(git rev-parse HEAD) $(date -u +%FT%TZ)"
D=runs/headline/Distill_lp_long_s0
d=runs/headline_qp3/data
w=runs/headline_q/pilots/Pilot_late_qp3
[ -f $w/summary.json ] || $P -m caliber_jax.train --config configs/headline.py:quantity --config.data.dir=$d --config.prepare.category_weights.polarity=3.0 --config.model.init_dir=$D/hf --config.num_epochs=0.64 --config.seed=0 --workdir=$w 2>&1 | tr '\r' '\n' | grep -v "it/s\]$" | tail -5
[ -f $w/hf/modules.json ] || $P -m caliber_jax.export --workdir=$w --output=$w/hf
for dev in runs/headline/data runs/headline_q/data; do
  tag=$(basename $(dirname $dev))
  out=runs/headline_q/pilots/results_$tag/Pilot_late_qp3/numgap.json
  [ -f $out ] || $P -m caliber_jax.evaluate --model=$w/hf --label="Pilot_late_qp3" --numgap=$dev/numgap_dev.jsonl --max_length=256 --tasks=numgap --output=$out 2>&1 | tail -1
done
echo "LATE3_DONE $(date -u +%FT%TZ)"
