"""Iterative mining of paper 001, end to end: the entry point.

    python -m caliber_jax.mine --config configs/mine.py --workdir runs/mine    # one iteration
    python -m caliber_jax.mine --config configs/mine.py --workdir runs/mine --iterations 2

Iteration i (a folder `iter_<i>` in the workdir): generate queries over train/val chunks, retrieve
with bi-enc(i), sample chunks by rank, judge them, mine same-document triples, retrain on the
triples of iterations 0..i (triplet loss), export bi-enc(i+1) to `iter_<i>/model`, and evaluate it
against bi-enc(i) (judged within-document MRR@5/DCG@5 on held-out test documents) and, when
configured, on FinanceBench within-document ranking against bi-enc(0), with Cohen's d. Every stage
is skipped when its output exists, so a killed run resumes where it stopped. `--stop_after` ends
after a stage ("candidates", "judgments", "triples", "train").
"""

import json
import time
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from caliber_jax import cli, mine_final
from caliber_jax.data import corpus
from caliber_jax.eval import within_doc
from caliber_jax.mining import chunking, mining, querygen, trainer
from caliber_jax.mining import client as client_lib
from caliber_jax.mining import judge as judge_lib

STAGES = ("candidates", "judgments", "triples", "train")


def log(message: str) -> None:
    print(f"[mine] {time.strftime('%H:%M:%S')} {message}", flush=True)


def load_chunks(config: ml_collections.ConfigDict, path: Path) -> list[dict[str, Any]]:
    """Chunk records of the configured filings (cached in `path`)."""

    def build() -> list[dict[str, Any]]:
        data = config.data
        if not Path(data.filings).is_file():
            raise FileNotFoundError(f"{data.filings}: no such file (config.data.filings)")
        records, eval_records = [], []
        for record in corpus.load_records(data.filings):
            if corpus.is_eval_doc(record):
                if data.eval_docs:
                    eval_records.append(record)
            else:
                records.append(record)
        if data.max_docs and len(records) > data.max_docs:
            # Evenly spaced through the file: more companies and filing types than the first N.
            rows = np.linspace(0, len(records) - 1, data.max_docs).round().astype(int)
            records = [records[row] for row in rows]
        if config.eval.financebench:
            eval_records = select_eval_docs(
                eval_records,
                _question_counts(config.eval.financebench),
                max_docs=data.max_eval_docs,
                max_chars=data.max_eval_chars,
            )
        else:
            eval_records = []
        chunks = list(
            chunking.make_chunks(
                records + eval_records,
                seed=config.chunk.seed,
                min_chars=config.chunk.min_chars,
                max_chars=config.chunk.max_chars,
                val_fraction=config.chunk.val_fraction,
                test_fraction=config.chunk.test_fraction,
            )
        )
        if data.max_chunks_per_doc:
            chunks = subsample_chunks(chunks, data.max_chunks_per_doc)
        return chunks

    return mining.cached_jsonl(path, build)


def subsample_chunks(chunks: list[dict[str, Any]], per_doc: int) -> list[dict[str, Any]]:
    """At most `per_doc` chunks of each mining document, evenly spaced through it (front matter,
    risk factors, MD&A and notes alike). Evaluation filings stay whole: FinanceBench ranks every
    chunk of the filing."""
    out = []
    for doc_chunks in mining.group_by_doc(chunks).values():
        if doc_chunks[0]["split"] == chunking.EVAL_SPLIT or len(doc_chunks) <= per_doc:
            out += doc_chunks
        else:
            rows = np.unique(np.linspace(0, len(doc_chunks) - 1, per_doc).round().astype(int))
            out += [doc_chunks[row] for row in rows]
    return out


def select_eval_docs(
    records: list[dict[str, Any]], counts: dict[str, int], *, max_docs: int, max_chars: int
) -> list[dict[str, Any]]:
    """FinanceBench evidence filings with the most questions per character first, up to
    `max_docs` filings and `max_chars` characters (0: no limit); filings without questions go."""
    ranked = sorted(
        (r for r in records if counts.get(r["doc_name"], 0)),
        key=lambda r: (-counts[r["doc_name"]] / max(len(r["text"]), 1), r["doc_name"]),
    )
    out, chars = [], 0
    for record in ranked:
        if (max_docs and len(out) >= max_docs) or (
            max_chars and chars + len(record["text"]) > max_chars
        ):
            break
        out.append(record)
        chars += len(record["text"])
    return out


def _question_counts(path: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, record in corpus.iter_jsonl(path):
        counts[record["doc_name"]] = counts.get(record["doc_name"], 0) + 1
    return counts


def make_client(config: ml_collections.ConfigDict, workdir: Path) -> client_lib.OpenAIClient:
    llm = config.llm
    return client_lib.OpenAIClient(
        base_url=llm.base_url,
        model=llm.model,
        api_key_env=llm.api_key_env or None,
        cache_dir=llm.cache_dir or workdir / "llm_cache",
        max_retries=llm.max_retries,
        backoff_seconds=llm.backoff_seconds,
        max_backoff_seconds=llm.max_backoff_seconds,
        concurrency=llm.concurrency,
        timeout_seconds=llm.timeout_seconds,
    )


def load_student(config: ml_collections.ConfigDict, workdir: Path, iteration: int):
    """bi-enc(iteration): the configured base, or the model exported by the previous iteration."""
    from caliber_jax.embedder import Embedder

    student = config.student
    if iteration == 0:
        return Embedder.from_pretrained(
            student.init_dir,
            pooling=student.pooling,
            dtype=student.dtype,
            num_layers=student.num_layers,
        )
    return Embedder.from_pretrained(model_dir(workdir, iteration - 1), dtype=student.dtype)


def model_dir(workdir: Path, iteration: int) -> Path:
    """Where iteration `iteration` exports bi-enc(iteration + 1)."""
    return workdir / f"iter_{iteration}" / "model"


def export_student(train_dir: Path, output: Path) -> None:
    """Exports the trained student to `output` unless a finished export is there: the file
    `export.export` writes last marks it (a crash mid-export leaves config.json without it)."""
    from caliber_jax import export

    if not (output / export.DONE_FILE).exists():
        export.export(train_dir, output)


class Run:
    """One mining run: the config, the workdir and everything the iterations share."""

    def __init__(self, config: ml_collections.ConfigDict, workdir: Path):
        self.config = config
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "config.json").write_text(config.to_json_best_effort(indent=2) + "\n")
        self.chunks = load_chunks(config, workdir / "chunks.jsonl")
        self.chunk_by_id = {chunk["id"]: chunk for chunk in self.chunks}
        self.split_of_doc = {chunk["doc_name"]: chunk["split"] for chunk in self.chunks}
        self.tv_chunks = [c for c in self.chunks if c["split"] in ("train", "val")]
        self.test_chunks = [c for c in self.chunks if c["split"] == "test"]
        self.eval_chunks = [c for c in self.chunks if c["split"] == chunking.EVAL_SPLIT]
        counts = {s: sum(c["split"] == s for c in self.chunks) for s in (*chunking.SPLITS, "eval")}
        log(f"chunks: {len(self.chunks)} ({counts}) from {len(self.split_of_doc)} documents")
        if not any(c["split"] == "train" for c in self.chunks):
            raise ValueError(
                f"{config.data.filings}: no document landed in the train split; "
                "change config.chunk.seed or the fractions"
            )
        needs_llm = "openai" in (config.queries.backend, config.judge.backend)
        self.client = make_client(config, workdir) if needs_llm else None
        q = config.queries
        self.generator = querygen.make_generator(
            q.backend,
            self.client,
            **(
                {}
                if q.backend == "offline"
                else dict(
                    endpoint=q.endpoint,
                    max_tokens=q.max_tokens,
                    temperature=q.temperature,
                    max_document_chars=q.max_document_chars,
                )
            ),
        )
        self._judge = None
        self._judge_embedder = None

    # ------------------------------------------------------------------ shared pieces

    def encode_fn(self, embedder, *, queries: bool):
        student = self.config.student
        if queries:
            return embedder.encode_fn(
                batch_size=student.encode_batch_size,
                max_length=student.query_max_length,
                query_task=student.query_instruction,
            )
        return embedder.encode_fn(
            batch_size=student.encode_batch_size, max_length=student.max_length
        )

    def queries(self, chunks, path: Path, *, per_doc: int, seed: int) -> list[dict[str, Any]]:
        q = self.config.queries

        def build():
            sample = mining.sample_chunks_per_doc(chunks, per_doc=q.chunks_per_doc, seed=seed)
            return mining.generate_queries(
                self.generator, sample, per_doc=per_doc, batch_size=q.batch_size
            )

        return mining.cached_jsonl(path, build)

    def judge(self, calibration_queries) -> judge_lib.Judge:
        """The configured judge (the embedding judge calibrated once, stored in the workdir)."""
        if self._judge is not None:
            return self._judge
        config = self.config.judge
        if config.backend == "openai":
            self._judge = judge_lib.OpenAIJudge(
                self.client,
                max_tokens=config.max_tokens,
                max_passage_chars=config.max_passage_chars,
            )
        elif config.backend == "embedding":
            from caliber_jax.embedder import Embedder

            embedder = Embedder.from_pretrained(
                config.model_dir, num_layers=config.num_layers, dtype=self.config.student.dtype
            )
            encode_fn = embedder.encode_fn(
                batch_size=self.config.student.encode_batch_size,
                max_length=self.config.student.max_length,
            )
            path = self.workdir / "judge_calibration.json"
            made_by = {
                "judge_model": config.model_dir,
                "judge_num_layers": config.num_layers,
                "positive_quantile": config.positive_quantile,
                "negative_quantile": config.negative_quantile,
            }
            name = f"{config.model_dir} layers={config.num_layers}"
            if path.exists():
                calibration = judge_lib.load_calibration(path, expect=made_by)
            else:
                uncalibrated = judge_lib.EmbeddingJudge(encode_fn, [0.0, 0.0, 0.0], name=name)
                calibration = mining.calibrate_embedding_judge(
                    uncalibrated,
                    calibration_queries,
                    self.tv_chunks,
                    positive_quantile=config.positive_quantile,
                    negative_quantile=config.negative_quantile,
                    seed=self.config.seed,
                )
                judge_lib.save_calibration(path, {**calibration, **made_by})
            log(f"judge: embedding, thresholds {np.round(calibration['thresholds'], 4).tolist()}")
            self._judge = judge_lib.EmbeddingJudge(encode_fn, calibration["thresholds"], name=name)
        else:
            raise ValueError(
                f"config.judge.backend={config.backend!r}: expected 'embedding' or 'openai'"
            )
        return self._judge

    def seen_triples(self, iteration: int) -> set[tuple[str, str, str]]:
        seen = set()
        for earlier in range(iteration):
            for triple in corpus.load_jsonl(self.workdir / f"iter_{earlier}" / "triples.jsonl"):
                seen.add((triple["query"], triple["pos_id"], triple["neg_id"]))
        return seen

    # ------------------------------------------------------------------ one iteration

    def iteration(self, i: int, stop_after: str | None) -> dict[str, Any] | None:
        config, it = self.config, self.workdir / f"iter_{i}"
        if (it / "summary.json").exists():
            log(f"iteration {i}: done already")
            return json.loads((it / "summary.json").read_text())
        it.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        student = load_student(config, self.workdir, i)
        queries = self.queries(
            self.tv_chunks,
            it / "queries.jsonl",
            per_doc=config.queries.per_doc,
            seed=config.seed * 1000 + i,
        )
        queries = self.add_synthetic(queries, student, it)
        log(f"iteration {i}: {len(queries)} queries")
        if getattr(self.generator, "unusable", None):
            log(f"iteration {i}: chunks without a query by reason {dict(self.generator.unusable)}")

        def build_candidates():
            chunk_vecs = mining.encode_chunks(
                self.encode_fn(student, queries=False),
                [c["text"] for c in self.tv_chunks],
                it / "vectors" / "chunks",
                model_name=f"bi-enc({i})",
                dim=student.dim,
                batch_rows=256,
                chunk_rows=1024,
            )
            query_vecs = self.encode_fn(student, queries=True)([q["text"] for q in queries])
            m = config.mining
            return mining.retrieve_candidates(
                queries,
                query_vecs,
                self.tv_chunks,
                chunk_vecs,
                top_k_corpus=m.top_k_corpus,
                max_docs=m.max_docs_per_query,
                k=m.k,
                omega=m.omega,
                seed=config.seed + i,
            )

        candidates = mining.cached_jsonl(it / "candidates.jsonl", build_candidates)
        log(f"iteration {i}: {len(candidates)} candidates")
        if stop_after == "candidates":
            return None
        judged = mining.judge_candidates(
            self.judge(queries),
            candidates,
            self.chunk_by_id,
            it / "judgments.jsonl",
            batch_size=config.judge.batch_size,
            log_fn=log,
        )
        grades = [j["grade"] for j in judged]
        histogram = {g: grades.count(g) for g in (1, 2, 3, 4, None)}
        # Failed requests are in the None count for this run; judgments.jsonl marks them
        # "failed" and the next run of this stage asks again.
        failed = mining.failed_count(judged)
        log(
            f"iteration {i}: judged {len(judged)}, grades {histogram}, {failed} of the None "
            "failed requests (no grade saved: asked again if this stage runs again)"
        )
        if getattr(self.judge(queries), "unusable", None):
            log(f"iteration {i}: ungraded pairs by reason {dict(self.judge(queries).unusable)}")
        if self.client is not None and self.client.failure_examples:
            log(f"iteration {i}: failed requests, e.g. {self.client.failure_examples}")
        if stop_after == "judgments":
            return None

        def build_triples():
            m, loss = config.mining, config.loss
            split = mining.mine_triples(
                judged,
                self.split_of_doc,
                self.seen_triples(i),
                margin=loss.margin,
                distance=loss.distance,
                correct_ratio=m.correct_ratio,
                max_per_group=m.max_triples_per_group,
                seed=config.seed + i,
            )
            return [{**t, "split": s} for s in ("train", "val") for t in split[s]]

        new = mining.cached_jsonl(it / "triples.jsonl", build_triples)
        counts = {s: sum(t["split"] == s for t in new) for s in ("train", "val")}
        hard = {s: sum(t["split"] == s and not t["correct"] for t in new) for s in counts}
        log(f"iteration {i}: new triples {counts} (hard {hard})")
        if stop_after == "triples":
            return None

        # Step 5: the triples of iterations 0..i together.
        all_triples = [
            t
            for j in range(i + 1)
            for t in corpus.load_jsonl(self.workdir / f"iter_{j}" / "triples.jsonl")
        ]
        train = [t for t in all_triples if t["split"] == "train"]
        val = [t for t in all_triples if t["split"] == "val"]
        if not train:
            raise ValueError(
                f"iteration {i}: no training triples were mined; judge more "
                "chunks (config.queries.per_doc, config.mining.*)"
            )
        init_dir = config.student.init_dir if i == 0 else str(model_dir(self.workdir, i - 1))
        student_cfg = config.student
        summary = trainer.train_triplets(
            mining.triple_texts(train, self.chunk_by_id),
            mining.triple_texts(val, self.chunk_by_id),
            workdir=it / "train",
            init_dir=init_dir,
            num_layers=student_cfg.num_layers if i == 0 else None,
            pooling=student_cfg.pooling if i == 0 else None,
            dtype=student_cfg.dtype,
            batch_size=config.train.batch_size,
            max_length=student_cfg.max_length,
            query_max_length=student_cfg.query_max_length,
            query_instruction=student_cfg.query_instruction,
            num_epochs=config.train.num_epochs,
            max_steps=config.train.max_steps,
            margin=config.loss.margin,
            distance=config.loss.distance,
            optim_config=config.optim.to_dict(),
            seed=config.seed + i,
            checkpoint_every=config.train.checkpoint_every,
            log_every=config.train.log_every,
            log_fn=log,
        )
        export_student(it / "train", model_dir(self.workdir, i))
        log(f"iteration {i}: exported bi-enc({i + 1}) to {model_dir(self.workdir, i)}")
        if stop_after == "train":
            return None
        result = {
            "iteration": i,
            "queries": len(queries),
            "candidates": len(candidates),
            "grades": {str(k): v for k, v in histogram.items()},
            "new_triples": counts,
            "new_hard_triples": hard,
            "train_triples": len(train),
            "val_triples": len(val),
            "train": summary,
            "eval": self.evaluate(i),
            "seconds": round(time.perf_counter() - started, 1),
        }
        corpus.save_json(it / "summary.json", result)
        return result

    def add_synthetic(self, queries, student, it: Path) -> list[dict[str, Any]]:
        """Step 1a (IV-D): few-shot synthetic queries, exemplars from distinct clusters."""
        q = self.config.queries
        if q.synthetic_num <= 0:
            return queries
        if self.client is None:
            raise ValueError(
                "config.queries.synthetic_num > 0 needs an LLM (config.llm and "
                "queries.backend='openai')"
            )

        def build():
            texts = [query["text"] for query in queries]
            vecs = self.encode_fn(student, queries=True)(texts)
            clusters = kmeans(vecs, q.synthetic_clusters, seed=self.config.seed)
            made = querygen.synthesize_queries(
                self.client,
                texts,
                clusters,
                num_queries=q.synthetic_num,
                doc_class=q.doc_class,
                per_prompt=q.synthetic_per_prompt,
                min_words=q.synthetic_min_words,
                max_prompts=q.synthetic_max_prompts,
                seed=self.config.seed,
                temperature=q.synthetic_temperature,
            )
            return [
                {
                    "id": f"s:{it.name}:{n}",
                    "text": text,
                    "doc_name": None,
                    "chunk_id": None,
                    "score": None,
                    "kind": "synthetic",
                }
                for n, text in enumerate(made)
            ]

        return queries + mining.cached_jsonl(it / "synthetic_queries.jsonl", build)

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, i: int) -> dict[str, Any]:
        """bi-enc(i) (base) vs bi-enc(i+1) (exp): judged within-document @k on the test
        documents; FinanceBench within-document ranking vs bi-enc(i) and vs bi-enc(0)."""
        config, it = self.config, self.workdir / f"iter_{i}"
        out: dict[str, Any] = {}
        models = {
            "base": load_student(self.config, self.workdir, i),
            "exp": load_student(self.config, self.workdir, i + 1),
        }
        if self.test_chunks:
            test_queries = self.queries(
                self.test_chunks,
                self.workdir / "test_queries.jsonl",
                per_doc=config.queries.test_per_doc,
                seed=10**6,
            )
            if test_queries:
                texts = [q["text"] for q in test_queries]
                query_vecs, chunk_vecs = {}, {}
                for name, embedder in models.items():
                    query_vecs[name] = self.encode_fn(embedder, queries=True)(texts)
                    chunk_vecs[name] = mining.encode_chunks(
                        self.encode_fn(embedder, queries=False),
                        [c["text"] for c in self.test_chunks],
                        it / "vectors" / f"test_{name}",
                        model_name=name,
                        dim=embedder.dim,
                        batch_rows=256,
                        chunk_rows=1024,
                    )
                rankings = mining.eval_rankings(
                    test_queries,
                    query_vecs,
                    self.test_chunks,
                    chunk_vecs,
                    top_k_corpus=config.eval.top_k_corpus,
                    max_docs=config.eval.max_docs_per_query,
                )
                per_model = mining.judged_eval(
                    rankings,
                    self.judge(test_queries),
                    self.chunk_by_id,
                    self.workdir / "eval_judgments.jsonl",
                    k=config.eval.k,
                    queries=test_queries,
                    log_fn=lambda message: log(f"iteration {i}: {message}"),
                )
                out["heldout_judged"] = within_doc.compare(per_model["base"], per_model["exp"])
                log(f"iteration {i}: held-out " + _line(out["heldout_judged"]))
        if config.eval.financebench and self.eval_chunks:
            items = within_doc.financebench_items(
                within_doc.load_questions(config.eval.financebench),
                mining.group_by_doc(self.eval_chunks),
                ngram=config.eval.ngram,
                min_fraction=config.eval.min_fraction,
            )
            scores = {}
            for name, index in (("bi-enc(0)", 0), ("base", i), ("exp", i + 1)):
                path = self.workdir / "financebench_scores" / f"bi-enc{index}.json"
                if not path.exists():
                    if index == i + 1:
                        embedder = models["exp"]
                    elif index == i:
                        embedder = models["base"]
                    else:
                        embedder = load_student(self.config, self.workdir, index)
                    encode = self.encode_fn(embedder, queries=False)
                    result = within_doc.financebench_scores(
                        encode,
                        items,
                        k=config.eval.k,
                        query_instruction=config.student.query_instruction,
                    )
                    corpus.save_json(path, result)
                scores[name] = json.loads(path.read_text())
            out["financebench_within_doc"] = {
                "questions": len(items),
                "documents": len({item["doc_name"] for item in items}),
                "vs_previous": within_doc.compare(scores["base"], scores["exp"]),
                "vs_base": within_doc.compare(scores["bi-enc(0)"], scores["exp"]),
            }
            log(
                f"iteration {i}: FinanceBench vs bi-enc(0) "
                + _line(out["financebench_within_doc"]["vs_base"])
            )
        if config.eval.validation_6a:
            train_judge = self.judge(corpus.load_jsonl(it / "queries.jsonl"))
            step_6a = mine_final.validation_6a(self, i, models["exp"], train_judge)
            out["validation_6a_pairs"] = step_6a["pairs"]
            if step_6a["compare"] is not None:
                out["validation_6a"] = step_6a["compare"]
                log(f"iteration {i}: validation (6a) " + _line(out["validation_6a"]))
        return out


def _line(comparison: dict[str, dict[str, float]]) -> str:
    return ", ".join(
        f"{m} {v['base']:.4f} -> {v['exp']:.4f} (d {v['cohens_d']:+.3f})"
        for m, v in comparison.items()
    )


def kmeans(vectors: np.ndarray, k: int, *, seed: int, steps: int = 20) -> np.ndarray:
    """Cluster ids `[n]` of unit vectors by spherical k-means (k-means++-free: seeded rows)."""
    rng = np.random.default_rng(seed)
    k = max(1, min(k, len(vectors)))
    centers = vectors[rng.choice(len(vectors), k, replace=False)]
    for _ in range(steps):
        labels = np.argmax(vectors @ centers.T, axis=1)
        for c in range(k):
            members = vectors[labels == c]
            if len(members):
                center = members.sum(0)
                centers[c] = center / max(np.linalg.norm(center), 1e-12)
    return np.argmax(vectors @ centers.T, axis=1)


def run(
    config: ml_collections.ConfigDict,
    workdir: str | Path,
    *,
    iterations: int,
    stop_after: str | None = None,
) -> list[dict[str, Any]]:
    """Runs (or resumes) `iterations` iterations; returns the finished iterations' summaries."""
    if stop_after is not None and stop_after not in STAGES:
        raise ValueError(f"--stop_after={stop_after!r}, expected one of {STAGES}")
    if iterations < 1:
        raise ValueError(f"--iterations={iterations} must be >= 1")
    mine_run = Run(config, Path(workdir))
    results = []
    for i in range(iterations):
        result = mine_run.iteration(i, stop_after)
        if result is None:
            break
        results.append(result)
    if results:
        corpus.save_json(Path(workdir) / "results.json", results)
        # Which code, config, filings and machine produced these results.
        corpus.save_json(Path(workdir) / "provenance.json", mine_final.run_provenance(config))
        text = format_markdown(results)
        if config.final_eval.enabled and len(results) == iterations:
            final = mine_final.final_evaluation(
                mine_run,
                iterations,
                lambda j: load_student(config, Path(workdir), j),
                mine_run.judge(corpus.load_jsonl(Path(workdir) / "iter_0" / "queries.jsonl")),
            )
            text += "\n" + mine_final.format_markdown(final)
        (Path(workdir) / "results.md").write_text(text, encoding="utf-8")
    return results


def format_markdown(results: list[dict[str, Any]]) -> str:
    """Tables of the iterations' summaries: triples, held-out and FinanceBench comparisons."""
    lines = [
        "## Triples",
        "",
        "| iteration | queries | judged | grades 1/2/3/4 | new train "
        "(hard) | new val (hard) | trained on | val acc before -> after | seconds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        g, t = r["grades"], r["train"]
        lines.append(
            f"| {r['iteration']} | {r['queries']} | {r['candidates']} | "
            f"{g['1']}/{g['2']}/{g['3']}/{g['4']} | {r['new_triples']['train']} "
            f"({r['new_hard_triples']['train']}) | {r['new_triples']['val']} "
            f"({r['new_hard_triples']['val']}) | {r['train_triples']} | "
            f"{t.get('val/accuracy_before', float('nan')):.4f} -> "
            f"{t.get('val/accuracy_after', float('nan')):.4f} | {r['seconds']:.0f} |"
        )
    sections = (
        (
            "heldout_judged",
            "Held-out test documents, judged top 5 (base = bi-enc(i), exp = bi-enc(i+1))",
            None,
        ),
        (
            "validation_6a",
            "Validation documents, step 6a: judged top 5 of bi-enc(i) and bi-enc(i+1)",
            None,
        ),
        (
            "financebench_within_doc",
            "FinanceBench within-document, bi-enc(i) -> bi-enc(i+1)",
            "vs_previous",
        ),
        (
            "financebench_within_doc",
            "FinanceBench within-document, bi-enc(0) -> bi-enc(i+1)",
            "vs_base",
        ),
    )
    for key, title, sub in sections:
        rows = []
        for r in results:
            block = r["eval"].get(key)
            if block is None:
                continue
            block = block[sub] if sub else block
            for metric, v in block.items():
                rows.append(
                    f"| {r['iteration']} | {metric} | {v['count']} | {v['base']:.4f} "
                    f"+- {v['base_se']:.4f} | {v['exp']:.4f} +- {v['exp_se']:.4f} | "
                    f"{v['cohens_d']:+.3f} | {v['paired_d']:+.3f} |"
                )
        if rows:
            lines += [
                "",
                f"## {title}",
                "",
                "| iteration | metric | count | base | exp | Cohen's d | paired d_z |",
                "|---|---|---|---|---|---|---|",
                *rows,
            ]
    return "\n".join(lines) + "\n"


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    values = flags.FLAGS
    config = values.config
    started = time.perf_counter()
    results = run(
        config,
        values.workdir,
        iterations=values.iterations or config.iterations,
        stop_after=values.stop_after,
    )
    log(f"finished {len(results)} iteration(s) in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
    flags.DEFINE_string("workdir", None, "Run directory.", required=True)
    flags.DEFINE_integer("iterations", None, "Iterations to run (default: config.iterations).")
    flags.DEFINE_string("stop_after", None, f"End after this stage of the iteration: {STAGES}.")
    flags.mark_flag_as_required("config")
    cli.run(main)
