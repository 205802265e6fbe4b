#!/bin/bash
# #37 session 23: the verify-size late phase at 150 steps (3 epochs) instead of 60, from the verify
# run's Distill lp verify s0; scored on the verify data's NumGap dev set (65 records) with the
# 60-step run beside it, val/align_x from metrics. Chosen on dev only. Resumable.
cd /tmp/hv
P="nice -n 3 .venv/bin/python"
R=runs/headline_verify
echo "commit $(git rev-parse HEAD) $(date -u +%FT%TZ)"
w=$R/Pilot_late_verify_150
[ -f $w/summary.json ] || $P -m caliber_jax.train --config configs/headline.py:late,verify --config.data.dir=$R/data_late --config.model.init_dir=$R/Distill_lp_verify_s0/hf --config.num_epochs=3.0 --config.seed=0 --workdir=$w 2>&1 | tr '\r' '\n' | grep -v "it/s\]$" | tail -3
[ -f $w/hf/modules.json ] || $P -m caliber_jax.export --workdir=$w --output=$w/hf
for m in Late_lp_verify_s0 Pilot_late_verify_150 Distill_lp_verify_s0; do
  out=$R/dev/$m/numgap.json
  [ -f $out ] || $P -m caliber_jax.evaluate --model=$R/$m/hf --label=$m --numgap=$R/data/numgap_dev.jsonl --max_length=256 --tasks=numgap --output=$out 2>&1 | tail -1
done
echo "LATE150_DONE $(date -u +%FT%TZ)"
