"""Paper 001's final evaluation (IV-E) and step 6a for a `caliber_jax.mine` run.

`validation_6a(run, i, ...)` judges bi-enc(i+1)'s top k on iteration i's validation documents with
the training judge; `final_evaluation(run, iterations, ...)` generates Q_test on the held-out test
documents and compares bi-enc(i) with bi-enc(i+1) for every finished iteration, judged by
`config.final_eval.judge`, which must differ from the training judge. Both resume from their
grade caches. `run` is a `mine.Run` (config, workdir, chunks, judge, encoders).
"""

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from caliber_jax import provenance
from caliber_jax.data import corpus
from caliber_jax.mining import client as client_lib
from caliber_jax.mining import final_eval, mining
from caliber_jax.mining import judge as judge_lib

# Where the filing type of a document is read from (the shared filings carry `doc_type`).
TYPE_FIELD = "doc_type"


def log(message: str) -> None:
    print(f"[mine] {time.strftime('%H:%M:%S')} {message}", flush=True)


def judge_identity(judge: judge_lib.Judge) -> str:
    """What the grade caches are keyed by: the judge's `identity` (backend, model, thresholds)."""
    identity = getattr(judge, "identity", None)
    if not identity:
        raise ValueError(f"judge {type(judge).__name__} has no identity; grade caches need one")
    return identity


def validation_6a(run, i: int, exp_model, train_judge: judge_lib.Judge) -> dict[str, Any]:
    """Step 6a for iteration i: bi-enc(i) vs `exp_model` = bi-enc(i+1) on judged validation
    chunks (grades of chunks step 3 did not judge go to `iter_<i>/validation_6a_grades.jsonl`)."""
    it = run.workdir / f"iter_{i}"
    cache = final_eval.GradeCache(it / "validation_6a_grades.jsonl", judge_identity(train_judge))
    result = final_eval.validation_6a(
        corpus.load_jsonl(it / "judgments.jsonl"),
        run.split_of_doc,
        mining.group_by_doc([c for c in run.tv_chunks if c["split"] == "val"]),
        encode_queries=run.encode_fn(exp_model, queries=True),
        encode_chunks=run.encode_fn(exp_model, queries=False),
        judge=train_judge,
        cache=cache,
        k=run.config.mining.k,
    )
    log(f"iteration {i}: step 6a on {result['pairs']} validation pairs, "
        f"{result['newly_judged']} chunks judged anew, {result['failed_grades']} grades failed "
        "(not relevant here; not cached: asked again if step 6a runs again)")  # fmt: skip
    return result


def doc_types(path: str, names: set[str]) -> dict[str, str]:
    """Filing type (`doc_type`) of the named documents in the filings file ("unknown" if none)."""
    out = {}
    for record in corpus.load_records(path):
        if record["doc_name"] in names:
            out[record["doc_name"]] = str(record.get(TYPE_FIELD) or "unknown")
    return out


def make_final_judge(run, queries: list[dict[str, Any]]) -> judge_lib.Judge:
    """`config.final_eval.judge`: an embedding judge (calibrated on Q_test against the test
    chunks, stored in `final_judge_calibration.json`) or an LLM judge on `config.llm`'s server
    with its own model name."""
    config = run.config.final_eval.judge
    if config.backend == "openai":
        llm = run.config.llm
        client = client_lib.OpenAIClient(
            base_url=config.base_url or llm.base_url,
            model=config.model or llm.model,
            api_key_env=llm.api_key_env or None,
            cache_dir=llm.cache_dir or run.workdir / "llm_cache",
            max_retries=llm.max_retries,
            backoff_seconds=llm.backoff_seconds,
            max_backoff_seconds=llm.max_backoff_seconds,
            concurrency=llm.concurrency,
            timeout_seconds=llm.timeout_seconds,
        )
        return judge_lib.OpenAIJudge(
            client, max_tokens=run.config.judge.max_tokens,
            max_passage_chars=run.config.judge.max_passage_chars,
        )  # fmt: skip
    if config.backend != "embedding":
        raise ValueError(
            f"config.final_eval.judge.backend={config.backend!r}: expected 'embedding' or 'openai'"
        )
    from caliber_jax.embedder import Embedder

    embedder = Embedder.from_pretrained(
        config.model_dir, num_layers=config.num_layers, dtype=run.config.student.dtype
    )
    encode_fn = embedder.encode_fn(
        batch_size=run.config.student.encode_batch_size, max_length=run.config.student.max_length
    )
    name = f"{config.model_dir} layers={config.num_layers}"
    made_by = {
        "judge_model": config.model_dir,
        "judge_num_layers": config.num_layers,
        "positive_quantile": config.positive_quantile,
        "negative_quantile": config.negative_quantile,
    }
    path = run.workdir / "final_judge_calibration.json"
    if path.exists():
        calibration = judge_lib.load_calibration(path, expect=made_by)
    else:
        calibration = mining.calibrate_embedding_judge(
            judge_lib.EmbeddingJudge(encode_fn, [0.0, 0.0, 0.0], name=name),
            queries,
            run.test_chunks,
            positive_quantile=config.positive_quantile,
            negative_quantile=config.negative_quantile,
            seed=run.config.final_eval.seed,
        )
        judge_lib.save_calibration(path, {**calibration, **made_by})
    return judge_lib.EmbeddingJudge(encode_fn, calibration["thresholds"], name=name)


def run_provenance(config) -> dict[str, Any]:
    """`provenance.stamp` of a mining run: its resolved config and its filings."""
    return provenance.stamp(
        config=provenance.config_hash(config), data=provenance.data_hash([config.data.filings])
    )


def final_evaluation(
    run, iterations: int, load_model: Callable[[int], Any], train_judge: judge_lib.Judge
) -> dict[str, Any]:
    """IV-E for bi-enc(0..iterations): new queries on the test documents, a judge other than
    `train_judge`, Hausdorff-scored pairs judged until the intervals are narrow; saved to
    `final_eval.json` (and resumed from `final_eval/grades.jsonl`) unless a judge request
    failed (those pairs count as not relevant in the result returned; a rerun asks again)."""
    config, out_path = run.config.final_eval, run.workdir / "final_eval.json"
    if out_path.exists():
        return json.loads(out_path.read_text())
    if not run.test_chunks:
        raise ValueError("final evaluation needs test documents (config.chunk.test_fraction > 0)")
    started = time.perf_counter()
    queries = run.queries(
        run.test_chunks,
        run.workdir / "final_queries.jsonl",
        per_doc=config.queries_per_doc,
        seed=config.seed,
    )
    if not queries:
        raise ValueError("final evaluation: the generator gave no query on the test documents")
    judge = make_final_judge(run, queries)
    if judge_identity(judge) == judge_identity(train_judge):
        raise ValueError(
            f"config.final_eval.judge is the training judge ({judge_identity(judge)}); "
            "the final evaluation needs another (paper 001 IV-E)"
        )
    texts = [query["text"] for query in queries]
    chunk_texts = [chunk["text"] for chunk in run.test_chunks]
    query_vecs, chunk_vecs = [], []
    for j in range(iterations + 1):
        model = load_model(j)
        query_vecs.append(np.asarray(run.encode_fn(model, queries=True)(texts)))
        chunk_vecs.append(
            mining.encode_chunks(
                run.encode_fn(model, queries=False),
                chunk_texts,
                run.workdir / "final_eval" / "vectors" / f"bi-enc{j}",
                model_name=f"bi-enc({j})",
                dim=model.dim,
                batch_rows=256,
                chunk_rows=1024,
            )
        )
    types = doc_types(run.config.data.filings, {c["doc_name"] for c in run.test_chunks})
    grades_path = run.workdir / "final_eval" / "grades.jsonl"
    cache = final_eval.GradeCache(grades_path, judge_identity(judge))
    results = final_eval.final_evaluation(
        queries, run.test_chunks, query_vecs, chunk_vecs, types,
        judge=judge, cache=cache, k=config.k, top_k_corpus=config.top_k_corpus,
        max_docs=config.max_docs_per_query, similarity=config.similarity,
        fraction_p=config.fraction_p, ci_width=config.ci_width, ci_level=config.ci_level,
        min_pairs=config.min_pairs, batch_pairs=config.batch_pairs, distance=config.distance,
        seed=config.seed, log_fn=log,
    )  # fmt: skip
    out = {
        "judge": judge_identity(judge),
        "train_judge": judge_identity(train_judge),
        "queries": len(queries),
        "test_documents": len(types),
        "doc_types": dict(sorted(types.items())),
        "unusable_grades": dict(getattr(judge, "unusable", {})),
        "iterations": results,
        "seconds": round(time.perf_counter() - started, 1),
        provenance.KEY: run_provenance(run.config),
    }
    failed = sum(result["failed_grades"] for result in results)
    if failed:
        # A result missing grades is this run's only: unsaved, so a rerun asks for them again
        # (the grades that came back are in grades.jsonl and cost nothing then).
        log(f"final eval: {failed} grades failed; {out_path.name} not saved, rerun to ask again")
    else:
        corpus.save_json(out_path, out)
    return out


def format_markdown(final: dict[str, Any]) -> str:
    """The final evaluation's tables: per iteration, overall and per filing type."""
    lines = [
        "## Final evaluation (IV-E): bi-enc(i) vs bi-enc(i+1) on new test queries",
        "",
        f"Judge: {final['judge']}; {final['queries']} queries on {final['test_documents']} "
        "test documents. Means with 95% CI (or the configured level), Cohen's d (pooled) and "
        "paired d_z per (query, document).",
        "",
        "| iteration | type | metric | pairs | base [CI] | exp [CI] | Cohen's d | paired d_z |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in final["iterations"]:
        blocks = [("all", result["overall"])] + list(result["by_type"].items())
        for doc_type, block in blocks:
            for metric, v in block.items():
                lines.append(
                    f"| {result['iteration']} | {doc_type} | {metric} | {v['count']} | "
                    f"{v['base']:.4f} {_interval(v['base_ci'])} | "
                    f"{v['exp']:.4f} {_interval(v['exp_ci'])} | "
                    f"{v['cohens_d']:+.3f} | {v['paired_d']:+.3f} |"
                )
    lines.append("")
    for result in final["iterations"]:
        lines.append(
            f"- iteration {result['iteration']}: {result['pairs_judged']} of "
            f"{result['pairs_selected']} selected pairs judged ({result['pairs_in_scope']} in "
            f"scope), {result['judged_chunks']} (query, chunk) grades "
            f"({result.get('failed_grades', 0)} failed requests, counted as not relevant), "
            f"stopped: {result['stopped']}"
        )
    return "\n".join(lines) + "\n"


def _interval(bounds: list[float] | None) -> str:
    return f"[{bounds[0]:.3f}, {bounds[1]:.3f}]" if bounds else "[n/a]"
