"""FinanceBenchRetrieval: exact dense search and IR metrics computed as MTEB computes them.

nDCG@k, Recall@k and MAP@k come from `pytrec_eval` (trec_eval's `ndcg_cut`, `recall`,
`map_cut`) and MRR@k from the ranked list, as in mteb `_evaluators/retrieval_metrics.py`
(`calculate_retrieval_scores`, `mrr`). No jax.
"""

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pytrec_eval

from caliber_jax.data import corpus as jsonl
from caliber_jax.eval import EncodeFn, encode_texts

# The query instruction of MTEB's FinanceBenchRetrieval task (`metadata.prompt["query"]`).
FINANCEBENCH_INSTRUCTION = (
    "Given a financial question, retrieve relevant financial information that best answers the "
    "question"
)


def format_query(query: str, instruction: str) -> str:
    """Qwen3-Embedding query format, as MTEB's `qwen3_models.instruction_template` builds it.

    Note there is no space after "Query:"; documents get no instruction.
    """
    return f"Instruct: {instruction}\nQuery:{query}"


def _ranked(doc_scores: Mapping[str, float]) -> list[str]:
    """Doc ids best first; ties broken by doc id descending, as trec_eval and MTEB do."""
    return [doc for doc, _ in sorted(doc_scores.items(), key=lambda i: (i[1], i[0]), reverse=True)]


def retrieval_metrics(
    qrels: Mapping[str, Mapping[str, int]],
    run: Mapping[str, Mapping[str, float]],
    ks: Sequence[int] = (10, 100),
) -> dict[str, float]:
    """nDCG, Recall, MRR and MAP at each k, averaged over queries exactly as MTEB does.

    Definitions (trec_eval, which MTEB calls through pytrec_eval; a doc is relevant when its
    qrels grade is > 0; ties in the run are broken by doc id, descending):
    - ndcg_at_k: sum over the top k of grade / log2(rank + 1), over the same for the ideal
      ordering of all judged docs (linear gain, not 2^grade - 1).
    - recall_at_k: relevant docs in the top k / all relevant docs of the query.
    - map_at_k: sum of precision@rank at each relevant rank <= k / all relevant docs of the
      query (not min(k, #relevant)).
    - mrr_at_k: 1 / rank of the first relevant doc in the top k, else 0.

    Like MTEB, queries of `qrels` missing from `run` are left out of every mean (pytrec_eval
    skips them), nDCG/Recall/MAP means are rounded to 5 decimals and MRR is not.

    Args:
      qrels: query id -> {doc id: relevance grade}.
      run: query id -> {doc id: score}; every query id must be in `qrels`.
      ks: cutoffs.

    Returns:
      {"ndcg_at_k", "recall_at_k", "mrr_at_k", "map_at_k"} for each k in ks.
    """
    return mean_metrics(per_query_metrics(qrels, run, ks))


def per_query_metrics(
    qrels: Mapping[str, Mapping[str, int]],
    run: Mapping[str, Mapping[str, float]],
    ks: Sequence[int] = (10, 100),
) -> dict[str, dict[str, float]]:
    """The metrics of `retrieval_metrics` for each query, before the mean (for paired tests).

    Returns:
      {metric: {query id: value}} over the queries of `run`, metrics as `retrieval_metrics`.
    """
    unknown = sorted(set(run) - set(qrels))
    if unknown:
        raise ValueError(f"{len(unknown)} run queries have no qrels, e.g. {unknown[:3]}")
    evaluated = [qid for qid in run if qid in qrels]
    if not evaluated:
        raise ValueError("no query of the run is in qrels")
    cut = ",".join(str(k) for k in ks)
    evaluator = pytrec_eval.RelevanceEvaluator(
        {qid: dict(docs) for qid, docs in qrels.items()},
        {f"ndcg_cut.{cut}", f"recall.{cut}", f"map_cut.{cut}"},
    )
    trec = evaluator.evaluate({qid: dict(docs) for qid, docs in run.items()})
    ranked = {qid: _ranked(run[qid])[: max(ks)] for qid in evaluated}

    per_query: dict[str, dict[str, float]] = {}
    for k in ks:
        for name, trec_name in (("ndcg", "ndcg_cut"), ("recall", "recall"), ("map", "map_cut")):
            per_query[f"{name}_at_{k}"] = {qid: trec[qid][f"{trec_name}_{k}"] for qid in trec}
        reciprocal_ranks = {}
        for qid in evaluated:
            relevant = {doc for doc, grade in qrels[qid].items() if grade > 0}
            hits = [rank for rank, doc in enumerate(ranked[qid][:k], 1) if doc in relevant]
            reciprocal_ranks[qid] = 1.0 / hits[0] if hits else 0.0
        per_query[f"mrr_at_{k}"] = reciprocal_ranks
    return per_query


def mean_metrics(per_query: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """`per_query_metrics`' values averaged as `retrieval_metrics` reports them (MTEB's rounding:
    5 decimals, MRR unrounded)."""
    means = {}
    for metric, values in per_query.items():
        if not values:  # pytrec_eval scores only queries with a relevant document
            raise ValueError(f"{metric}: no query has a relevant document (every qrels is empty)")
        mean = sum(values.values()) / len(values)
        means[metric] = mean if metric.startswith("mrr_") else round(mean, 5)
    return means


# Queries scored per block, bounding memory to RANK_CHUNK * N scores.
RANK_CHUNK = 256


def rank_run(
    query_ids: Sequence[str],
    doc_ids: Sequence[str],
    score_fn: Callable[[slice], np.ndarray],
    top_k: int,
) -> dict[str, dict[str, float]]:
    """A trec run with each query's `top_k` best docs plus every doc tied with the k-th.

    Scores tie (identical texts, BM25's zeros, quantized vectors): keeping the whole tie at the
    cut lets `retrieval_metrics` break it by doc id, as trec_eval and MTEB do, rather than by the
    order a partial sort happens to leave (which kept or dropped a relevant doc at the @100 cut).

    Args:
      query_ids: Q query ids.
      doc_ids: N doc ids.
      score_fn: a slice of query rows -> `[rows, N]` scores, higher is better.
      top_k: docs kept per query (before ties), capped at N.

    Returns:
      {qid: {doc id: score}}.
    """
    if top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1")
    k = min(top_k, len(doc_ids))
    run = {}
    for start in range(0, len(query_ids), RANK_CHUNK):
        scores = np.asarray(score_fn(slice(start, start + RANK_CHUNK)), np.float64)
        kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1 : k]
        for qid, row, cut in zip(query_ids[start : start + RANK_CHUNK], scores, kth, strict=True):
            kept = np.flatnonzero(row >= cut)
            run[qid] = {doc_ids[j]: float(row[j]) for j in kept}
    return run


def load_financebench(
    path: str | Path,
) -> tuple[dict[str, str], dict[str, str], dict[str, dict[str, int]]]:
    """Builds FinanceBenchRetrieval from `financebench_open_source.jsonl` (or a `.jsonl.gz`).

    Queries are the questions, keyed by `financebench_id`; the corpus is the set of unique
    `evidence_text` strings with ids "doc00000", "doc00001", ... in order of first appearance;
    each question is relevant (grade 1) to its own evidence passages.

    Returns:
      `(queries, corpus, qrels)`: {qid: question}, {doc id: passage}, {qid: {doc id: 1}}.
    """
    queries, corpus, qrels = {}, {}, {}
    doc_id_of_text = {}
    for line_number, record in jsonl.iter_jsonl(path):
        where = f"{path}:{line_number}"
        qid, question = record.get("financebench_id"), record.get("question")
        evidence = record.get("evidence")
        if not isinstance(qid, str) or not isinstance(question, str) or not question:
            raise ValueError(f"{where}: needs string fields financebench_id and question")
        if qid in queries:
            raise ValueError(f"{where}: duplicate financebench_id {qid!r}")
        if not isinstance(evidence, list) or not evidence:
            raise ValueError(f"{where}: field evidence must be a non-empty list")
        relevant = {}
        for item in evidence:
            text = item.get("evidence_text") if isinstance(item, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"{where}: every evidence needs a non-empty evidence_text")
            if text not in doc_id_of_text:
                doc_id_of_text[text] = f"doc{len(doc_id_of_text):05d}"
                corpus[doc_id_of_text[text]] = text
            relevant[doc_id_of_text[text]] = 1
        queries[qid] = question
        qrels[qid] = relevant
    if not queries:
        raise ValueError(f"{path}: no records")
    return queries, corpus, qrels


def bm25_run(
    queries: Mapping[str, str], corpus: Mapping[str, str], top_k: int
) -> dict[str, dict[str, float]]:
    """BM25 (bm25s defaults: Lucene variant, k1=1.5, b=0.75) over lowercased word tokens.

    English stopwords are removed; unlike MTEB's BM25 model there is no Snowball stemmer
    (PyStemmer is not a dependency), so scores can differ slightly from MTEB's BM25 row.

    Returns:
      A run {qid: {doc id: score}} with min(top_k, len(corpus)) docs per query and the docs tied
      with the last (`rank_run`).
    """
    import bm25s  # here, not at the top: every `caliber_jax.evaluate` launch would pay ~0.2 s

    doc_ids = list(corpus)
    retriever = bm25s.BM25()
    corpus_tokens = bm25s.tokenize(
        [corpus[d] for d in doc_ids], stopwords="en", show_progress=False
    )
    retriever.index(corpus_tokens, show_progress=False)
    query_ids = list(queries)
    tokens = bm25s.tokenize(
        [queries[q] for q in query_ids], stopwords="en", show_progress=False, return_ids=False
    )

    def scores(rows: slice) -> np.ndarray:  # a query of stopwords alone ties every doc at 0
        return np.stack([retriever.get_scores(query) if query else np.zeros(len(doc_ids))
                         for query in tokens[rows]])  # fmt: skip

    return rank_run(query_ids, doc_ids, scores, top_k)


def evaluate(
    encode_fn: EncodeFn,
    *,
    queries: Mapping[str, str],
    corpus: Mapping[str, str],
    qrels: Mapping[str, Mapping[str, int]],
    query_prompt: str | None = None,
    ks: Sequence[int] = (10, 100),
) -> dict[str, float]:
    """Encodes queries and corpus, searches exactly and scores the run with `retrieval_metrics`.

    Args:
      encode_fn: `texts -> [n, D]` L2-normalised vectors (dot product = cosine).
      queries: {qid: text}.
      corpus: {doc id: text}.
      qrels: {qid: {doc id: grade}}.
      query_prompt: task instruction; when given, each query is encoded as
        `f"Instruct: {query_prompt}\\nQuery:{query}"` (Qwen3-Embedding / MTEB style, see
        `format_query`, e.g. FINANCEBENCH_INSTRUCTION). Documents are encoded as they are.
      ks: metric cutoffs; max(ks) docs are retrieved per query.

    Returns:
      The metrics of `retrieval_metrics`, e.g. {"ndcg_at_10": ..., "mrr_at_100": ...}.
    """
    run = dense_run(encode_fn, queries=queries, corpus=corpus, query_prompt=query_prompt,
                    top_k=max(ks))  # fmt: skip
    return retrieval_metrics(qrels, run, ks)


def dense_run(
    encode_fn: EncodeFn,
    *,
    queries: Mapping[str, str],
    corpus: Mapping[str, str],
    query_prompt: str | None = None,
    top_k: int = 100,
) -> dict[str, dict[str, float]]:
    """The trec run of `evaluate`: each query's `top_k` documents by cosine (see `evaluate`)."""
    query_ids, doc_ids = list(queries), list(corpus)
    texts = [queries[q] for q in query_ids]
    if query_prompt:
        texts = [format_query(text, query_prompt) for text in texts]
    query_vecs = encode_texts(encode_fn, texts, "queries")
    doc_vecs = encode_texts(encode_fn, [corpus[d] for d in doc_ids], "corpus")
    doc_vecs = np.asarray(doc_vecs, np.float32)
    return rank_run(
        query_ids, doc_ids, lambda rows: np.asarray(query_vecs[rows], np.float32) @ doc_vecs.T,
        top_k,
    )  # fmt: skip
