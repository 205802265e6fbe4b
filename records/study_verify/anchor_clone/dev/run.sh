set -e
cd /work/main
.venv/bin/python scripts/drift_report.py --teacher runs/models/all-mpnet-base-v2 --student /tmp/vc/w/caliber_jax/runs/headline_verify/Distill_lp_verify_s0/hf /tmp/vc/w/caliber_jax/runs/headline_verify/Minednum_c1_scales_lp_verify_s0/hf /tmp/vc/w/caliber_jax/runs/headline_verify/Anchor_scales_lp_verify_s0/hf --financebench /tmp/vc/w/caliber_jax/runs/headline_verify/data_mined_scales/mined_dev.jsonl --max_length 256 --output records/study_verify/anchor_clone/dev/agree_mined_dev.json
for m in Minednum_c1_scales_lp_verify_s0 Anchor_scales_lp_verify_s0; do
.venv/bin/python -m caliber_jax.evaluate --model=/tmp/vc/w/caliber_jax/runs/headline_verify/$m/hf --label=$m --numgap=/tmp/vc/w/caliber_jax/runs/headline_verify/data/numgap_dev.jsonl --max_length=256 --tasks=numgap --output=records/study_verify/anchor_clone/dev/$m/numgap_dev.json
done
echo DONE
