#!/usr/bin/env bash
# The main job on the bundled sample (data/sample/), offline on 2 CPU cores in about 3 minutes:
# prepare passages, perturbations and NumGap dev/test sets from a held-out filing -> teacher vectors
# (all-MiniLM-L6-v2) -> train two 3-layer students side by side, LEAF (distillation alone) and
# Numeric (distillation + the neighbour objective, configs/demo.py:numeric) -> export them to HF /
# sentence-transformers -> evaluate Initial, Teacher, LEAF and Numeric, and print the tables, the
# before/after table with its paired tests last (records/demo_record.json: a recorded run).
#   bash launch/demo.sh [RUN_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
python scripts/study.py --preset demo --output "${1:-runs/demo}"
