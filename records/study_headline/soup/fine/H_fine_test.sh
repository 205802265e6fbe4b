#!/bin/bash
# Session 21 (#37), post hoc: blends 0.6 and 0.7 of seed 0 on the recorded NumGap test set (reported as a curve; 0.7 is the fine grid's dev choice).
cd /work/main
H=runs/headline
for a in 0.6 0.7; do
  o=$H/results/Soup_a${a}_s0/financebench+numgap.json
  [ -f $o ] || .venv/bin/python -m caliber_jax.evaluate --model=$H/soup_fine/Soup_a${a}_s0/hf --label="Soup a$a s0" \
      --financebench=data/sample/financebench_open_source.jsonl.gz --numgap=docs/study_mpnet_long/data/numgap_test.jsonl \
      --max_length=256 --tasks=financebench,numgap --output=$o
done
echo FINE_TEST_DONE $(date -u +%FT%TZ)
