"""Caliber, as in the paper: Qwen3-Embedding-0.6B student, Qwen3-Embedding-8B teacher vectors.

    python -m caliber_jax.prepare --config configs/caliber.py
    python -m caliber_jax.embed_teacher --config configs/caliber.py      # GPU/TPU: 8B teacher
    python -m caliber_jax.train --config configs/caliber.py --workdir runs/caliber
    python -m caliber_jax.export --workdir runs/caliber --output runs/caliber/hf

Paths point at local Hugging Face directories and your own corpus (override on the command line,
e.g. --config.prepare.input=/data/edgar.jsonl.gz). Paper setup (section 5.1): AdamW lr 1e-4,
batch 32, max length 512, bf16, linear decay with 5% warmup, m = 0.05, lambda = 0.5, 1 epoch; one
epoch over 606K passages took 6,946 s on one GPU. Expected (paper, Table 1): FinanceBenchRetrieval
nDCG@10 0.464, NumGap-D overall 0.045.

Run here so far only on one NVIDIA H200 with random Qwen3-shaped weights and random teacher
vectors, to time it: 0.0860 s a step over the FinanceBench filings' 144,696 training passages, one
epoch projected at 529 s launch to exit (BENCHMARKS.md). No score of this config exists yet.
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    del arg
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.multihost = False

    config.prepare = ml_collections.ConfigDict()
    config.prepare.input = "data/edgar.jsonl.gz"
    config.prepare.text_field = "text"
    config.prepare.min_chars = 200
    config.prepare.max_chars = 1200
    config.prepare.include_eval_docs = False
    config.prepare.categories = ("magnitude", "polarity", "period", "unit", "currency")
    config.prepare.heldout_fraction = 0.1  # share of whole documents kept for val + NumGap
    config.prepare.max_passages = 0  # cap on training passages; 0 = all
    config.prepare.max_val_passages = 2000
    config.prepare.numgap = True
    config.prepare.numgap_quotas_test = {"magnitude": 500, "polarity": 500, "unit": 300}
    config.prepare.numgap_quotas_dev = {"magnitude": 125, "polarity": 125, "unit": 75, "period": 26}
    config.prepare.bm25_k = 10
    config.prepare.neighbour_k = 0  # BM25 neighbours searched per training passage; 0 = none
    # A training question per passage (offline generator; the query-geometry term).
    config.prepare.queries = False
    # With queries: keep only the training passages that get a question (the mined phase's
    # data), and write mined_dev.jsonl, up to this many held-out (question, passage)
    # pairs in FinanceBench's format (the retrieval dev set; 0 = none).
    config.prepare.queries_only = False
    config.prepare.mined_dev = 0
    # The offline questions' form: "plain" (the line item and the period the text states) or
    # "filing" (also the filing's company and fiscal period, as a reader of filings asks).
    config.prepare.query_style = "plain"
    # Redraw the training perturbations so each rule of a category is about equally common.
    config.prepare.balance_rules = False
    # Where direction words may be swapped: "paper" (Appendix D.3, within 50 characters of any
    # numeric span, years included) or "quantity" (only words that govern an amount, at most 4
    # words away in the same sentence; caliber_jax/data/perturb.py).
    config.prepare.polarity_scope = "paper"
    # Which scale words a unit edit swaps: "paper" (Appendix D.2: million -> billion or thousand,
    # billion -> million, thousand -> million) or "all" (every scale for every other, both ways;
    # perturb.SCALE_SETS), for training, validation and NumGap alike.
    config.prepare.scale_swaps = "paper"
    # With balance_rules: the training category drawn in proportion to these weights among those
    # that fire on a passage (--config.prepare.category_weights.polarity=3); all equal: uniform.
    config.prepare.category_weights = dict.fromkeys(config.prepare.categories, 1.0)
    config.prepare.numfine_items = 1000  # NumFinE units from held-out documents; 0 = none

    config.teacher = ml_collections.ConfigDict()
    config.teacher.model_dir = "models/Qwen3-Embedding-8B"
    config.teacher.pooling = "mean"  # the paper's choice (Appendix A)
    config.teacher.dtype = "bfloat16"
    config.teacher.batch_size = 64
    config.teacher.max_length = 512
    # Token slots per teacher batch (Embedder.encode_ids; 0 = batch_size rows): batches of a
    # length rung L hold 32768 // L passages, so the 512 rung keeps 64 rows and the filings'
    # short passages (median 93 tokens, rung 128) come 256 to a batch instead of making 64-row
    # matmuls. One program per rung either way; the PyTorch backend batches the same way.
    config.teacher.tokens_per_batch = 32768
    config.teacher.chunk_rows = 4096
    # "flax": our Embedder (Qwen3/BERT/MPNet, GPU/TPU); "torch": any local sentence-transformers or
    # transformers directory through PyTorch (black-box teachers of any architecture).
    config.teacher.backend = "flax"
    config.teacher.device = "auto"  # torch backend only: "auto", "cpu", "cuda", "cuda:1", ...
    # flax backend: matrices in bfloat16 (an 8B teacher in 16 GB), each batch split over every
    # local device, attention "xla" or "cudnn" (GPU, bf16 only).
    config.teacher.param_dtype = "bfloat16"
    config.teacher.data_parallel = True
    config.teacher.attention = "xla"
    # Another model for the passages and their perturbations ("" = model_dir for every store):
    # `embed_teacher` encodes x and pi(x) with it and the questions with model_dir, so a phase
    # can hold its passages where a start model put them while its questions move to the
    # teacher's (configs/headline.py variant `anchor`). Same backend, pooling and dtype.
    config.teacher.passage_model_dir = ""

    config.data = ml_collections.ConfigDict()
    config.data.dir = "runs/caliber/data"  # prepare's output; teacher stores go inside
    config.data.max_length = 512
    # Training packs every x and pi(x) end to end into rows of pack_length >= max_length tokens
    # (docs/training_path.md), each batch's row count one of a short fixed ladder (pack_rungs).
    # One epoch of the shared filings (144,696 passages, Qwen3 tokenizer, batch 32, plain
    # shuffled order): 3 step programs, 12.8% of the token slots padding, against 10 programs
    # and 38.6% for the padded rows this config had (benchmarks/shape_count.py). No length
    # grouping: grouped batches vary ~10x in tokens, which a fixed row count pays in padding.
    config.data.pack_length = 512
    config.data.length_group_window = 1
    # Row counts: a multiple of this (and of the process's devices, which train adds).
    config.data.pack_rows_multiple = 1
    # Packed row counts (pipeline.make_batch_fn): the pack_rungs counts that pad epoch 0's
    # batches least, then a fallback of one sequence per row (2 x the batch's passages per
    # process), which any batch fits. Each batch keeps its batch_size passages and takes the
    # smallest rung that holds it: an epoch compiles at most pack_rungs step programs (a later
    # epoch's batch that needs more rows than any of epoch 0's takes the fallback).
    config.data.pack_rungs = 3
    # Epoch 0 starts with this many batches of about its most common row count, in the same
    # order on any devices or processes (the others follow in their shuffled order), so that
    # compile-ahead builds the other counts' programs while those steps run rather than a step
    # waiting for one (pipeline.make_batch_fn). On one NVIDIA H200
    # (2026-11-29, 4a6f2a7, plain order): the epoch's second batch waited ~47 s for its program;
    # the shared filings' epoch has 2,823 batches of 11 rows, 1,470 of 13 and 228 of 17, and
    # 800 steps are ~60 s at that run's mean of 0.086 s a step.
    config.data.pack_first_steps = 800
    # Right-padded batches, for the PyTorch side of benchmarks/train_throughput.py and the
    # padded reference of the tests (not a training path): lengths on the ladder 32, 64, 96,
    # 160, 256, 384, 512 (x 1.5); pi(x) of the perturbed rows only, their count rounded up to 16.
    config.data.pad_to_multiple = 32
    config.data.bucket_growth = 1.5
    config.data.pert_rows_multiple = 16
    config.data.drop_remainder = True
    config.data.worker_count = 0
    config.data.read_threads = 4
    config.data.validate = True
    config.data.query_length = 32  # training queries' padded token length (loss.query_weight)

    config.model = ml_collections.ConfigDict()
    config.model.init_dir = "models/Qwen3-Embedding-0.6B"
    config.model.tokenizer_dir = ""  # "" = init_dir
    config.model.pooling = "mean"  # the paper; "last" (Qwen3-Embedding's own) or "cls" (BGE-style)
    config.model.dtype = "bfloat16"  # compute dtype; params stay float32
    config.model.num_layers = ml_collections.FieldReference(None, field_type=int)
    config.model.out_dim = ml_collections.FieldReference(None, field_type=int)
    # A new W_out (out_dim set, none in init_dir) starts "xavier" (random, LEAF) or "lstsq": ridge
    # regression of the teacher vectors of w_out_fit_rows training passages (drawn with `seed`
    # from the whole split; a fit on 90% of them is scored on the other 10%) on the student's
    # pooled vectors, fitted once before step 0 (`caliber_jax/w_out_init.py`).
    config.model.w_out_init = "xavier"
    config.model.w_out_fit_rows = 4096
    config.model.w_out_ridge = 1e-4
    # Per-layer rematerialisation: "none", "full" (recompute each layer) or "dots" (keep matmul
    # outputs); attention: "xla" or "cudnn" (GPU, bf16: cuDNN's fused attention, on packed rows
    # through sequence offsets, not yet run on a GPU: docs/training_path.md). "dots" because
    # of the epoch's 512-token batches: XLA:CPU's buffer assignment of this step (batch 32 x 512
    # + 16 pi(x) rows, layers scanned) is 6.7 GiB of state + 39.7 GiB of temporaries with it,
    # + 145 GiB with "none" (beyond an 80 GB GPU: "xla" attention keeps every layer's [B, N, T, T]
    # probabilities) and + 12.0 GiB with "full" (BENCHMARKS.md; benchmarks/compile_real_shape.py).
    # Unrolled, XLA:CPU gave 131 GiB with or without remat; gpu_on_device.sh checks the GPU's.
    config.model.remat = "dots"
    config.model.attention = "xla"
    # True runs the layers as one lax.scan (`layers.apply_layers`): one layer traced and compiled
    # instead of L. At this config's real step (28 layers, batch 32 x 512 + 16 pi(x) rows) the
    # scanned program is half the size (39.7K vs 79.9K HLO instructions) but XLA:CPU compiled it
    # in more CPU time, not less (50.0 vs 25.0 s with remat "full", 34.2 vs 22.2 s without;
    # BENCHMARKS.md, benchmarks/compile_real_shape.py), and at 3 or 6 layers it also stepped
    # slower. Off until a GPU measurement (benchmarks/gpu_on_device.sh) shows it pays there.
    config.model.scan_layers = False

    config.batch_size = 32
    config.tensorboard = True  # TensorBoard scalars beside metrics.jsonl
    config.num_epochs = 1.0
    config.total_steps = 0  # 0 = num_epochs over the training passages

    config.optim = ml_collections.ConfigDict()
    config.optim.lr = 1e-4
    config.optim.weight_decay = 0.01
    config.optim.warmup_frac = 0.05
    config.optim.schedule = "linear"
    config.optim.cycles = 1
    # End of each decay as a fraction of lr. The paper (sec. 5.1) says "linear decay with 5%
    # warmup": HF's get_linear_schedule_with_warmup, to 0. (The authors' released script floors
    # it at 0.1 * lr, per optim.make_schedule: --config.optim.end_lr_frac=0.1.)
    config.optim.end_lr_frac = 0.0
    # "cyclic_linear" only: each cycle lowered in this many equal constant stages (LEAF's own
    # recipe: 10, once per epoch; configs/leaf.py:paper); None = every step.
    config.optim.epochs_per_cycle = ml_collections.config_dict.placeholder(int)
    config.optim.b1 = 0.9
    config.optim.b2 = 0.999
    config.optim.eps = 1e-8
    config.optim.clip_norm = 1.0
    # Tokens per optimizer step: the paper's batch_size = 32 passages carries ~5.3K real tokens
    # per step (x and pi(x), Qwen3 tokenizer, the shared filings). A big GPU that wants >= 16K
    # real tokens per update either raises batch_size (e.g. --config.batch_size=96: 3x the
    # passages per step and per program, the loss of eq. 4 over all of them) or keeps the
    # paper's batch per step and sums accum_steps of them into one update (accum_steps = 3: the
    # update of the 96-passage batch only for per-row terms, reduction "batch" without padding
    # rows; the structure, query, contrastive and question-alignment terms and "per_term" differ,
    # tests/test_accumulation.py). Accumulation does not raise tokens per program. total_steps,
    # logging and checkpoints count batches; the lr schedule counts updates.
    config.optim.accum_steps = 1

    config.loss = ml_collections.ConfigDict()
    config.loss.lam = 0.5
    config.loss.margin = 0.05
    config.loss.reduction = "batch"  # eq. 4 as written; "per_term" = the authors' code
    # "caliber" = eq. 4 exactly; "absolute" = max(0, m - Delta_s); "neighbour" = max(0,
    # cos(s x, s pi x) - cos(t x, t x_nb) + m), x_nb mined by prepare (prepare.neighbour_k > 0).
    config.loss.objective = "caliber"
    # Weight of ||s(pi x) - t(pi x)|| (the authors' perturb_weight); eq. 4 has 1.
    config.loss.perturb_weight = 1.0
    # Weight of losses.structure_loss: in-batch similarity preservation (0 = off).
    config.loss.structure_weight = 0.0
    # Weight of losses.query_geometry_loss: (cos(s q, s p) - cos(t q, t p))^2 of the training
    # queries (prepare.queries) against the batch's x and pi(x) (0 = off).
    config.loss.query_weight = 0.0
    # The passages it covers: "both" (x and pi(x)) or "x" (pi(x) free to move; the headline pilots).
    config.loss.query_passages = "both"
    # Weight of the in-batch contrastive loss (losses.contrastive_loss, InfoNCE) of each row's mined
    # question (prepare.queries) against the batch's passages, its own the positive
    # (0 = off), its temperature, and its judge: "teacher" keeps a question only where the teacher
    # ranks its passage first in the batch, "none" keeps every question.
    config.loss.contrastive_weight = 0.0
    config.loss.contrastive_temperature = 0.05
    config.loss.contrastive_judge = "none"
    # Weight of ||s(q) - t(q)|| for each row's training question (prepare.queries): LEAF's
    # alignment applied to the questions as well as the passages (0 = off).
    config.loss.query_align_weight = 0.0

    config.mesh = ml_collections.ConfigDict()
    config.mesh.fsdp = 1

    # Compile each row count's train-step program on background threads before the step that
    # needs it (caliber_jax/compile_ahead.py): the first step's alone, then the ladder's others
    # side by side; False compiles on first use, as plain jax.jit.
    config.compile_ahead = True
    # Step watchdog (caliber_jax/watchdog.py): when no step completes within watchdog_factor x
    # the slowest step so far (at least watchdog_min_s; factor x watchdog_min_s in start-up, in a
    # step whose batch shape is new, during validation or a checkpoint save and while closing),
    # every process dumps all its threads' stacks to stderr and, unless a step completes in the
    # grace period after that, exits 124, so a deadlocked run ends and a scheduler can requeue it
    # (resuming from the last checkpoint). 0 turns it off.
    config.watchdog_factor = 20.0
    config.watchdog_min_s = 120.0

    config.log_every = 50
    config.eval_every = 1000
    config.eval_at_start = False  # also validate before the first step (fresh runs, not resumes)
    config.checkpoint_every = 1000
    config.keep_checkpoints = 3
    # Also keep every checkpoint whose step is a multiple of this (0: only the latest ones).
    config.keep_period = 0
    return config
