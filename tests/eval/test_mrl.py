"""Tests for caliber_jax/eval/mrl.py: truncation math, int8 and binary rankings on toy vectors."""

import math

import numpy as np
import pytest

from caliber_jax.eval import mrl, retrieval


def test_truncate_renormalises():
    vectors = np.array([[3.0, 4.0, 12.0], [0.0, 2.0, 1.0]], np.float32) / 13.0
    np.testing.assert_allclose(mrl.truncate(vectors, 2), [[0.6, 0.8], [0.0, 1.0]], atol=1e-7)
    np.testing.assert_allclose(mrl.truncate(vectors, 3), vectors / np.linalg.norm(vectors, axis=1,
                               keepdims=True), atol=1e-7)  # fmt: skip
    with pytest.raises(ValueError, match="dim=4"):
        mrl.truncate(vectors, 4)
    with pytest.raises(ValueError, match="all zeros"):
        mrl.truncate(np.array([[0.0, 0.0, 1.0]]), 2)


def test_int8_codes_use_corpus_ranges():
    # Corpus ranges: dim 0 [0, 255/128], dim 1 [-1, -1/256], so the steps (range / 255) are
    # exactly 1/128 and 1/256 and the codes floor((x - min) / step) - 128 are exact.
    corpus = np.array([[0.0, -1.0], [255 / 128, -1 / 256], [1.0, -0.5]], np.float32)
    codes = mrl.quantize_int8(corpus, corpus)
    assert codes.dtype == np.int8
    np.testing.assert_array_equal(codes, [[-128, -128], [127, 127], [0, 0]])
    # Queries use the corpus ranges; values outside are clipped.
    queries = np.array([[3.0, -2.0], [0.5, -0.75]], np.float32)
    np.testing.assert_array_equal(mrl.quantize_int8(queries, corpus), [[127, -128], [-64, -64]])


def test_binary_bits_and_hamming():
    vectors = np.array([[0.5, -0.1, 0.2, -0.3, 0.1, 0.1, -0.2, 0.3, -0.9]], np.float32)
    bits = mrl.quantize_binary(vectors)
    # x > 0 -> 1, packed big-endian into bytes; 9 dims -> 2 bytes.
    np.testing.assert_array_equal(bits, [[0b10101101, 0b00000000]])
    rng = np.random.default_rng(0)
    queries = rng.normal(size=(5, 70)).astype(np.float32)
    docs = rng.normal(size=(9, 70)).astype(np.float32)
    distances = mrl.hamming_distances(mrl.quantize_binary(queries), mrl.quantize_binary(docs))
    expected = ((queries[:, None, :] > 0) != (docs[None, :, :] > 0)).sum(-1)
    np.testing.assert_array_equal(distances, expected)


# Unit vectors in 4-D whose rankings change with truncation and binarisation.
DOCS = {
    "d0": [1.0, 0.0, 0.0, 0.0],
    "d1": [0.0, 1.0, 0.0, 0.0],
    "d2": [0.6, 0.48, 0.64, 0.0],
    "d3": [-0.6, 0.0, 0.0, 0.8],
}


def _normalised(vector):
    vector = np.asarray(vector, np.float32)
    return vector / np.linalg.norm(vector)


def test_variant_rankings_hand_checked():
    doc_ids = list(DOCS)
    doc_vecs = np.stack([_normalised(v) for v in DOCS.values()])
    query_vecs = np.stack([_normalised([0.6, 0.0, 0.8, 0.0]), _normalised([0.1, -0.2, 0.0, 0.9])])
    qrels = {"qa": {"d2": 1}, "qb": {"d0": 1}}
    runs = mrl.variant_runs(query_vecs, doc_vecs, ["qa", "qb"], doc_ids, dims=(8, 2), top_k=4)
    assert list(runs) == ["dim_4", "dim_2", "int8", "binary"]

    # Full cosine: qa.d2 = .36 + .512 = .872 > qa.d0 = .6; qb ranks d3 (.712) before d0 (.108).
    assert runs["dim_4"]["qa"]["d2"] == pytest.approx(0.872, abs=1e-6)
    full = retrieval.retrieval_metrics(qrels, runs["dim_4"], ks=(1, 2))
    assert (full["mrr_at_1"], full["mrr_at_2"]) == (0.5, 0.75)

    # Two dims: qa -> [1, 0] and d2 -> [.6, .48] / sqrt(.5904), so d0 (1) now beats d2 (.781);
    # qb -> [1, -2] / sqrt(5) puts d0 first (.447).
    assert runs["dim_2"]["qa"]["d2"] == pytest.approx(0.6 / math.sqrt(0.5904), abs=1e-6)
    assert runs["dim_2"]["qb"]["d0"] == pytest.approx(1 / math.sqrt(5), abs=1e-6)
    dim_2 = retrieval.retrieval_metrics(qrels, runs["dim_2"], ks=(1, 2))
    assert (dim_2["mrr_at_1"], dim_2["mrr_at_2"]) == (0.5, 0.75)

    # Binary (bit = x > 0): d0 1000, d1 0100, d2 1110, d3 0001; qa 1010, qb 1001.
    # Hamming qa: d0 1, d1 3, d2 1, d3 3 -> d0/d2 tie, d2 wins by doc id (descending).
    # Hamming qb: d0 1, d1 3, d2 3, d3 1 -> d0/d3 tie, d3 wins, so d0 is at rank 2.
    assert runs["binary"]["qa"] == {"d0": -1.0, "d1": -3.0, "d2": -1.0, "d3": -3.0}
    assert runs["binary"]["qb"] == {"d0": -1.0, "d1": -3.0, "d2": -3.0, "d3": -1.0}
    binary = retrieval.retrieval_metrics(qrels, runs["binary"], ks=(1, 2))
    assert (binary["mrr_at_1"], binary["mrr_at_2"]) == (0.5, 0.75)
    assert binary["ndcg_at_1"] == 0.5


def test_int8_ranking_follows_integer_dot_product():
    rng = np.random.default_rng(3)
    docs = rng.normal(size=(30, 16)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries = docs[:4] + 0.05 * rng.normal(size=(4, 16)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    runs = mrl.variant_runs(queries, docs, list("abcd"), [f"d{i:02d}" for i in range(30)],
                            dims=(), top_k=5)  # fmt: skip
    # Independent recomputation: min/max buckets from the corpus, integer dot products.
    low, high = docs.min(0), docs.max(0)
    step = (high - low) / 255

    def codes(x):
        return (np.clip(np.floor((x - low) / step), 0, 255) - 128).astype(np.int64)

    scores = codes(queries) @ codes(docs).T
    for row, qid in enumerate("abcd"):
        top = np.argsort(-scores[row], kind="stable")[:5]
        assert {f"d{j:02d}" for j in top} <= set(runs["int8"][qid])
        assert runs["int8"][qid][f"d{top[0]:02d}"] == scores[row, top[0]]
        # Each query is a small perturbation of its own document, which stays on top.
        assert top[0] == row


def test_evaluate_with_toy_encoder():
    corpus = {f"d{i}": f"doc {i}" for i in range(4)}
    table = {f"doc {i}": _normalised(v) for i, v in enumerate(DOCS.values())}
    table["Instruct: Find\nQuery:qa"] = _normalised(DOCS["d2"])
    seen = []

    def encode_fn(texts):
        seen.extend(texts)
        return np.stack([table[t] for t in texts])

    results = mrl.evaluate(
        encode_fn,
        queries={"qa": "qa"},
        corpus=corpus,
        qrels={"qa": {"d2": 1}},
        query_prompt="Find",
        dims=(2,),
        ks=(1, 3),
    )
    assert list(results) == ["dim_4", "dim_2", "int8", "binary"]
    assert "Instruct: Find\nQuery:qa" in seen
    # The query is d2 itself, which stays first under every variant (dim 2: d0 .78 < d2 1;
    # binary: distance 0 to d2, 1 to d0; int8: the same codes as d2, whose dot product wins).
    for name, metrics in results.items():
        assert metrics["ndcg_at_1"] == 1.0, name
    assert set(results["int8"]) == {f"{m}_at_{k}" for m in ("ndcg", "recall", "mrr", "map")
                                    for k in (1, 3)}  # fmt: skip
