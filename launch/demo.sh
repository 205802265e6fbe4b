#!/usr/bin/env bash
# The offline CPU demo, end to end on the bundled sample (data/sample/), in a few minutes:
# prepare passages + perturbations + NumGap -> teacher vectors (all-MiniLM-L6-v2) -> train a
# 3-layer student (Caliber) -> export to HF / sentence-transformers -> evaluate.
#   bash launch/demo.sh [RUN_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
run=${1:-runs/demo}
common=(--config configs/demo.py --config.data.dir="$run/data")
python -m caliber_jax.prepare "${common[@]}"
python -m caliber_jax.embed_teacher "${common[@]}"
python -m caliber_jax.train "${common[@]}" --workdir "$run/caliber"
python -m caliber_jax.export --workdir "$run/caliber" --output "$run/caliber/hf"
python -m caliber_jax.evaluate --model "$run/caliber/hf" --tasks financebench,numgap \
  --financebench data/sample/financebench_open_source.jsonl.gz \
  --numgap "$run/data/numgap_test.jsonl" --output "$run/caliber/results.json"
cat "$run/caliber/results.md"
