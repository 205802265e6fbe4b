"""Tests for caliber_jax/eval/mteb_adapter.py: offline mteb runs match our own evaluator."""

import os
from pathlib import Path

import numpy as np
import pytest

from caliber_jax.eval import mteb_adapter, retrieval

REPO = Path(__file__).resolve().parents[2]
FINANCEBENCH_SAMPLE = REPO / "data" / "sample" / "financebench_open_source.jsonl.gz"


def _subset(num_queries):
    queries, corpus, qrels = retrieval.load_financebench(FINANCEBENCH_SAMPLE)
    kept = list(queries)[:num_queries]
    doc_ids = sorted({doc for qid in kept for doc in qrels[qid]})
    return (
        {qid: queries[qid] for qid in kept},
        {doc: corpus[doc] for doc in doc_ids},
        {qid: qrels[qid] for qid in kept},
    )


class RecordingEncoder:
    """Deterministic toy embedder recording (text, query_task) pairs."""

    dim = 8

    def __init__(self):
        self.calls = []

    def encode(self, texts, batch_size, max_length, *, query_task):
        self.calls.append((list(texts), query_task, batch_size))
        rng = np.random.default_rng([sum(map(ord, t)) for t in texts] or [0])
        vectors = rng.normal(size=(len(texts), self.dim)).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


TOY = {
    "queries": {"q1": "alpha?", "q2": "beta?"},
    "corpus": {"d1": "alpha doc", "d2": "beta doc", "d3": "gamma doc"},
    "qrels": {"q1": {"d1": 1}, "q2": {"d2": 1}},
}


@pytest.mark.parametrize(
    ("options", "expected_task"),
    [
        ({}, None),
        ({"query_task": "Fixed"}, "Fixed"),
        ({"use_task_prompt": True}, "From task"),
    ],
)
def test_instruction_goes_to_queries_only(options, expected_task):
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    embedder = RecordingEncoder()
    task = mteb_adapter.make_retrieval_task(name="ToyRetrieval", query_prompt="From task", **TOY)
    scores = mteb_adapter.evaluate(
        mteb_adapter.EmbedderEncoder(embedder, **options), [task], batch_size=5
    )
    by_texts = {tuple(sorted(texts)): (task, size) for texts, task, size in embedder.calls}
    assert by_texts[("alpha?", "beta?")] == (expected_task, 5)
    assert by_texts[("alpha doc", "beta doc", "gamma doc")] == (None, 5)
    assert 0.0 <= scores["ToyRetrieval"]["test"]["ndcg_at_10"] <= 1.0


def test_both_instruction_sources_fail():
    with pytest.raises(ValueError, match="either query_task or use_task_prompt"):
        mteb_adapter.EmbedderEncoder(RecordingEncoder(), query_task="a", use_task_prompt=True)


def test_qrels_query_missing_fails():
    with pytest.raises(ValueError, match="not in queries"):
        mteb_adapter.make_retrieval_task(
            name="Bad", queries={"q1": "a"}, corpus={"d": "b"}, qrels={"q9": {"d": 1}}
        )


def test_mteb_matches_our_evaluator_on_financebench_minilm(minilm_dir):
    from caliber_jax.embedder import Embedder

    queries, corpus, qrels = _subset(24)
    embedder = Embedder.from_pretrained(minilm_dir)
    task = mteb_adapter.make_retrieval_task(
        name="FinanceBenchSubset",
        queries=queries,
        corpus=corpus,
        qrels=qrels,
        query_prompt=retrieval.FINANCEBENCH_INSTRUCTION,
    )
    encoder = mteb_adapter.EmbedderEncoder(embedder, max_length=256, use_task_prompt=True)
    theirs = mteb_adapter.evaluate(encoder, [task], batch_size=16)["FinanceBenchSubset"]["test"]
    ours = retrieval.evaluate(
        embedder.encode_fn(batch_size=16, max_length=256),
        queries=queries,
        corpus=corpus,
        qrels=qrels,
        query_prompt=retrieval.FINANCEBENCH_INSTRUCTION,
    )
    for name in ("ndcg_at_10", "recall_at_10", "map_at_10", "mrr_at_10", "ndcg_at_100"):
        assert theirs[name] == pytest.approx(ours[name], abs=1e-4), name
    # A real model on its own evidence passages: far from chance, not perfect.
    assert 0.3 < ours["ndcg_at_10"] < 1.0
