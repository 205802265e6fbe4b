#!/bin/bash
# #37 "separate late" pilot (session 22): the numeric recipe (configs/headline.py:quantity) for
# 400 steps starting from the distilled twin's final weights (Distill lp long s0: 2,000 steps of
# LEAF), against Pilot_q (the same from the fitted start). Resumable; waits for runs/Q_pilots.sh.
cd /work/main
P="nice -n 10 .venv/bin/python"
until grep -q PILOTS_DONE runs/Q_pilots.log 2>/dev/null; do sleep 20; done
echo "commit $(git rev-parse HEAD) $(date -u +%FT%TZ)"
D=runs/headline/Distill_lp_long_s0
[ -f $D/hf/modules.json ] || $P -m caliber_jax.export --workdir=$D --output=$D/hf
w=runs/headline_q/pilots/Pilot_late_q
[ -f $w/summary.json ] || $P -m caliber_jax.train --config configs/headline.py:quantity --config.model.init_dir=$D/hf --config.num_epochs=0.64 --config.seed=0 --workdir=$w 2>&1 | tr '\r' '\n' | grep -v "it/s\]$" | tail -5
[ -f $w/hf/modules.json ] || $P -m caliber_jax.export --workdir=$w --output=$w/hf
for dev in runs/headline/data runs/headline_q/data; do
  tag=$(basename $(dirname $dev))
  for m in $w $D; do
    label=$(basename $m)
    out=runs/headline_q/pilots/results_$tag/$label/numgap.json
    [ -f $out ] || $P -m caliber_jax.evaluate --model=$m/hf --label="$label" --numgap=$dev/numgap_dev.jsonl --max_length=256 --tasks=numgap --output=$out 2>&1 | tail -1
  done
done
echo "LATE_DONE $(date -u +%FT%TZ)"
