"""Paper-shaped CPU study: all-mpnet-base-v2 teacher, full all-MiniLM-L6-v2 student.

    python scripts/fetch_mpnet.py        # once: assembles runs/models/all-mpnet-base-v2
    python scripts/study.py --preset mpnet --filings data/financebench/filings.jsonl.gz \
        --seeds 0,1

Like the paper, a strong teacher (MPNet, 110M parameters, 768 dims, mean pooling, encoded through
the PyTorch backend) is distilled into a smaller *pretrained* embedder (MiniLM-L6, 22M, 384 dims)
with a LEAF-style W_out 384 -> 768, started as the least-squares map from the student's pooled
vectors to the teacher's (`model.w_out_init = "lstsq"`; variant `xavier`: LEAF's random start).
Variant `configs/study_mpnet.py:trunc384` drops W_out and aligns to the teacher truncated to 384
dims and re-normalised (mpnet is not MRL-trained). Variant `configs/study_mpnet.py:numeric` trains
with the best numeric objective (the loss of `configs/numeric.py`: NumGap-aligned neighbour hinge +
similarity preservation) on the same passages, each with its BM25 topical neighbour among the
training passages (`data_nb`). Variant `configs/study_mpnet.py:long` is the same LEAF/Caliber pair
trained longer on more passages (20,000 passages x 3.2 epochs = 2,000 steps, its own data folder),
run by `scripts/study.py --preset mpnet-long`: on two CPU cores a day of background compute,
resumable across runs and machines.
Paper optimisation settings (AdamW 1e-4, batch 32, 5% warmup + linear decay,
lambda 0.5, m 0.05); the corpus is smaller than the paper's 606K passages because mpnet encodes
only ~0.3-0.45 passages/s on two shared CPU cores: 4,000 training passages x 4 epochs = 500 steps.
Runtime there: ~45 minutes per student, 7-8 hours for the whole study (resumable, recorded in
records/study_mpnet/ across machines; minutes on a GPU). The teacher also runs through the Flax MPNet
port (`--config.teacher.backend=flax`, vectors within 2e-7 of PyTorch's; on a GPU/TPU); the
study keeps PyTorch, with which its seed-0 teacher vectors were made.
Measured (docs/history.md): FinanceBench nDCG@10 Teacher 0.6609, Initial (MiniLM + W_out) 0.5507.
"""

import ml_collections

from configs import numeric, study

MPNET_DIR = "runs/models/all-mpnet-base-v2"  # written by scripts/fetch_mpnet.py


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = study.get_config()  # the CPU study's filings, held-out share and 128-token data
    config.prepare.max_passages = 4000
    config.prepare.numfine_items = 0
    config.prepare.numgap_quotas_test = {"magnitude": 200, "polarity": 200, "unit": 100}
    config.prepare.numgap_quotas_dev = {"magnitude": 50, "polarity": 50, "unit": 25}

    config.teacher.model_dir = MPNET_DIR
    config.teacher.backend = "torch"
    config.teacher.device = "auto"
    config.teacher.pooling = "mean"
    config.teacher.dtype = "float32"
    config.teacher.batch_size = 32
    config.teacher.chunk_rows = 256  # small chunks: a killed encode loses at most 256 rows

    config.data.dir = "runs/study_mpnet/data"

    config.model.num_layers = None  # the full pretrained student, as in the paper
    config.model.out_dim = 768  # LEAF's W_out: student 384 -> teacher 768
    # W_out starts as the least-squares map to the teacher (fitted on the training passages before
    # step 0): from a random W_out, LEAF lost 0.21 nDCG@10 in 500 steps (variant `xavier`).
    config.model.w_out_init = "lstsq"
    config.model.dtype = "float32"

    config.num_epochs = 4.0
    config.optim.lr = 1e-4  # the paper's (the student is pretrained, not a cut)
    config.loss.lam = 0.5
    config.loss.margin = 0.05
    config.eval_every = 100
    config.checkpoint_every = 25
    config.keep_checkpoints = 2
    if arg == "xavier":
        config.model.w_out_init = "xavier"  # LEAF's random start (the LEAF s0 of 2026-11-25)
    elif arg == "trunc384":
        config.model.out_dim = None
        config.data.dir = "runs/study_mpnet/data_384"
    elif arg == "numeric":
        recipe = numeric.get_config()
        config.loss = recipe.loss  # objective, lambda, margin, perturb and structure weights
        config.prepare.neighbour_k = recipe.prepare.neighbour_k
        config.data.dir = "runs/study_mpnet/data_nb"
    elif arg == "long":
        config.prepare.max_passages = 20000  # a seeded sample of the training filings' passages
        config.num_epochs = 3.2  # 625 steps per epoch at batch 32: 2,000 steps
        config.eval_every = 250
        config.eval_at_start = True  # the validation curves start at the fitted W_out
        config.data.dir = "runs/study_mpnet_long/data"
    elif arg:
        raise ValueError(
            f"configs/study_mpnet.py: unknown variant {arg!r} "
            "(known: xavier, trunc384, numeric, long)"
        )
    return config
