#!/bin/bash
# Session 21 (#37), post hoc: the blend between shares 0.5 and 0.75 on NumGap dev + FinanceBench.
cd /work/main
H=runs/headline
for a in 0.6 0.65 0.7; do
  d=$H/soup_fine/Soup_a${a}_s0
  [ -f $d/hf/caliber_export.json ] || .venv/bin/python -m caliber_jax.export --workdir=$H/Headline_lp_long_s0 \
      --blend_with=$H/Distill_lp_long_s0 --interpolate=$a --output=$d/hf
  [ -f $d/financebench+numgap.json ] || .venv/bin/python -m caliber_jax.evaluate --model=$d/hf --label="Soup a$a s0" \
      --financebench=data/sample/financebench_open_source.jsonl.gz --numgap=$H/data/numgap_dev.jsonl \
      --max_length=256 --tasks=financebench,numgap --output=$d/financebench+numgap.json
done
echo FINE_DONE $(date -u +%FT%TZ)
