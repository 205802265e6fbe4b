#!/usr/bin/env bash
# The main job on the bundled sample (data/sample/), offline on a CPU in minutes: prepare passages,
# perturbations and a NumGap test set from a held-out filing -> teacher vectors (all-MiniLM-L6-v2)
# -> train LEAF and Caliber 3-layer students -> export them to HF / sentence-transformers ->
# evaluate Initial, Teacher, LEAF and Caliber, and print the table.
#   bash launch/demo.sh [RUN_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
python scripts/study.py --preset demo --output "${1:-runs/demo}"
