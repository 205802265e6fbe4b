set -e
cd /tmp/vc/w/caliber_jax
export CALIBER_JAX_CACHE=/tmp/vc/w/xla_cache
V=runs/headline_verify
W=$V/Anchor_scales_lp_verify_s1
.venv/bin/python -m caliber_jax.train --config=configs/headline.py:anchor,scales,verify --config.data.dir=$V/data_mined_scales_anchor_s0 --config.prepare.input=/work/shared/data/financebench/filings.jsonl.gz --config.model.init_dir=$V/Minednum_c1_scales_lp_verify_s0/hf --config.seed=1 --workdir=$W
.venv/bin/python -m caliber_jax.export --workdir=$W --output=$W/hf
.venv/bin/python -m caliber_jax.evaluate --model=$W/hf --label="Anchor scales lp verify s1" --financebench=data/sample/financebench_open_source.jsonl.gz --numgap=$V/data/numgap_test.jsonl --max_length=256 --tasks=financebench,numgap --output=$V/results/Anchor_scales_lp_verify_s1/financebench+numgap.json
echo DONE
