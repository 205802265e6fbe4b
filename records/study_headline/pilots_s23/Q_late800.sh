#!/bin/bash
# #37 session 23 pilot: separate late for 800 steps (1.28 epochs) instead of 400, otherwise
# configs/headline.py:late (quantity rule, polarity x3) from Distill lp long s0; scored on both
# NumGap dev sets (chosen on dev only). Waits for the verify run. Resumable.
cd /work/main
while kill -0 "$(cat runs/V_verify2.pid)" 2>/dev/null; do sleep 20; done
P=".venv/bin/python"
echo "commit $(git rev-parse HEAD) $(date -u +%FT%TZ)"
D=runs/headline/Distill_lp_long_s0
d=runs/headline/data_late
w=runs/headline_q/pilots/Pilot_late_qp3_800
[ -f $w/summary.json ] || $P -m caliber_jax.train --config configs/headline.py:late --config.data.dir=$d --config.model.init_dir=$D/hf --config.num_epochs=1.28 --config.seed=0 --workdir=$w 2>&1 | tr '\r' '\n' | grep -v "it/s\]$" | tail -5
[ -f $w/hf/modules.json ] || $P -m caliber_jax.export --workdir=$w --output=$w/hf
for dev in runs/headline/data runs/headline_q/data; do
  tag=$(basename $(dirname $dev))
  out=runs/headline_q/pilots/results_$tag/Pilot_late_qp3_800/numgap.json
  [ -f $out ] || $P -m caliber_jax.evaluate --model=$w/hf --label="Pilot_late_qp3_800" --numgap=$dev/numgap_dev.jsonl --max_length=256 --tasks=numgap --output=$out 2>&1 | tail -1
done
echo "LATE800_DONE $(date -u +%FT%TZ)"
