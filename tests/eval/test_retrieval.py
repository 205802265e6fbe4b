"""Tests for caliber_jax/eval/retrieval.py: hand-computed metrics, MTEB parity, FinanceBench."""

import gzip
import json
import math

import numpy as np
import pytest
from mteb._evaluators.retrieval_metrics import calculate_retrieval_scores

from caliber_jax.eval import retrieval
from tests.conftest import SAMPLE_FINANCEBENCH as FINANCEBENCH

# q1: relevant a, c. Ranked b, a, d, c.
# q2: graded x=2, y=1. x and y tie at .5; trec_eval/MTEB break ties by doc id descending, so
#     y ranks first although x was inserted first. Ranked y, x, z.
# q3: relevant m, never retrieved.
# q4: in qrels only; like MTEB, left out of every mean.
QRELS = {
    "q1": {"a": 1, "c": 1, "e": 0},
    "q2": {"x": 2, "y": 1},
    "q3": {"m": 1},
    "q4": {"a": 1},
}
RUN = {
    "q1": {"b": 0.9, "a": 0.8, "d": 0.7, "c": 0.6},
    "q2": {"x": 0.5, "y": 0.5, "z": 0.1},
    "q3": {"n": 0.3, "o": 0.2},
}


def test_hand_computed_metrics():
    metrics = retrieval.retrieval_metrics(QRELS, RUN, ks=(2, 4))
    g3, g5 = 1 / math.log2(3), 1 / math.log2(5)  # discounts at ranks 2 and 4
    # nDCG (linear gain): q1@2 = (0 + g3) / (1 + g3); q1@4 = (g3 + g5) / (1 + g3);
    # q2@2 = q2@4 = (1 + 2 * g3) / (2 + g3); q3 = 0.
    q2_ndcg = (1 + 2 * g3) / (2 + g3)
    expected = {
        "ndcg_at_2": (g3 / (1 + g3) + q2_ndcg + 0) / 3,
        "ndcg_at_4": ((g3 + g5) / (1 + g3) + q2_ndcg + 0) / 3,
        # Recall: q1 1/2 then 2/2; q2 2/2; q3 0.
        "recall_at_2": (0.5 + 1 + 0) / 3,
        "recall_at_4": (1 + 1 + 0) / 3,
        # MRR: first relevant at rank 2 for q1, rank 1 for q2, none for q3.
        "mrr_at_2": (0.5 + 1 + 0) / 3,
        "mrr_at_4": (0.5 + 1 + 0) / 3,
        # MAP@k: sum of precision at relevant ranks <= k, over all relevant docs of the query.
        # q1@2 = (1/2) / 2; q1@4 = (1/2 + 2/4) / 2; q2 = (1/1 + 2/2) / 2; q3 = 0.
        "map_at_2": (0.25 + 1 + 0) / 3,
        "map_at_4": (0.5 + 1 + 0) / 3,
    }
    assert set(metrics) == set(expected)
    for name, value in expected.items():
        rounded = name.startswith("mrr") is False
        assert metrics[name] == pytest.approx(round(value, 5) if rounded else value, abs=1e-9), name


def test_per_query_metrics_hand_computed_and_averaged():
    per_query = retrieval.per_query_metrics(QRELS, RUN, ks=(2, 4))
    g3, g5 = 1 / math.log2(3), 1 / math.log2(5)
    expected = {
        "ndcg_at_4": {"q1": (g3 + g5) / (1 + g3), "q2": (1 + 2 * g3) / (2 + g3), "q3": 0.0},
        "recall_at_2": {"q1": 0.5, "q2": 1.0, "q3": 0.0},
        "mrr_at_2": {"q1": 0.5, "q2": 1.0, "q3": 0.0},
        "map_at_4": {"q1": 0.5, "q2": 1.0, "q3": 0.0},
    }
    for metric, values in expected.items():
        assert per_query[metric] == pytest.approx(values, abs=1e-12), metric
    # q4 (in qrels, not in the run) has no value, like MTEB leaves it out of the mean.
    assert all(set(values) == {"q1", "q2", "q3"} for values in per_query.values())
    assert retrieval.mean_metrics(per_query) == retrieval.retrieval_metrics(QRELS, RUN, (2, 4))
    # No query with a relevant document: one line saying so, not a division by zero.
    with pytest.raises(ValueError, match="no query has a relevant document"):
        retrieval.mean_metrics({"ndcg_at_4": {}})


def test_ties_follow_doc_id_not_insertion_order():
    reordered = {**RUN, "q2": {"y": 0.5, "x": 0.5, "z": 0.1}}
    assert retrieval.retrieval_metrics(QRELS, reordered, ks=(1,)) == retrieval.retrieval_metrics(
        QRELS, RUN, ks=(1,)
    )
    # At k=1 q2 retrieves y (grade 1) not x (grade 2): nDCG@1 of q2 = 1/2.
    only_q2 = retrieval.retrieval_metrics(QRELS, {"q2": RUN["q2"]}, ks=(1,))
    assert only_q2["ndcg_at_1"] == 0.5
    assert only_q2["mrr_at_1"] == 1.0


def test_run_query_without_qrels_fails():
    with pytest.raises(ValueError, match="no qrels"):
        retrieval.retrieval_metrics(QRELS, {**RUN, "q9": {"a": 1.0}}, ks=(2,))


def test_matches_mteb_on_random_runs():
    rng = np.random.default_rng(0)
    docs = [f"d{i}" for i in range(40)]
    qrels, run = {}, {}
    for q in range(12):
        relevant = rng.choice(docs, size=rng.integers(1, 5), replace=False)
        qrels[f"q{q}"] = {doc: int(rng.integers(0, 3)) for doc in relevant}
        qrels[f"q{q}"][str(relevant[0])] = 1  # at least one relevant doc
        scores = np.round(rng.random(len(docs)), 1)  # rounding makes plenty of ties
        chosen = rng.choice(len(docs), size=25, replace=False)
        run[f"q{q}"] = {docs[i]: float(scores[i]) for i in chosen}
    ks = (1, 3, 10, 20)
    ours = retrieval.retrieval_metrics(qrels, run, ks=ks)
    theirs = calculate_retrieval_scores(run, qrels, list(ks))
    for k in ks:
        assert ours[f"ndcg_at_{k}"] == theirs.ndcg[f"NDCG@{k}"]
        assert ours[f"recall_at_{k}"] == theirs.recall[f"Recall@{k}"]
        assert ours[f"map_at_{k}"] == theirs.map[f"MAP@{k}"]
        assert ours[f"mrr_at_{k}"] == pytest.approx(theirs.mrr[f"MRR@{k}"], abs=1e-12)


def test_rank_run_is_the_exact_top_k_across_chunks(monkeypatch):
    monkeypatch.setattr(retrieval, "RANK_CHUNK", 3)
    rng = np.random.default_rng(1)
    queries = rng.normal(size=(7, 5)).astype(np.float32)
    docs = rng.normal(size=(20, 5)).astype(np.float32)
    full = queries @ docs.T
    ids = [f"d{j:02d}" for j in range(20)]
    run = retrieval.rank_run([f"q{i}" for i in range(7)], ids, lambda rows: full[rows], 4)
    for i, row in enumerate(full):
        best = np.argsort(-row)[:4]
        assert run[f"q{i}"] == {ids[j]: pytest.approx(float(row[j])) for j in best}
    assert all(len(docs) == 20 for docs in
               retrieval.rank_run(["a"], ids, lambda rows: full[:1], 100).values())  # fmt: skip
    with pytest.raises(ValueError, match="top_k=0 must be >= 1"):
        retrieval.rank_run(["a"], ids, lambda rows: full[:1], 0)


def test_rank_run_keeps_ties_at_the_cut():
    scores = np.array([[3.0, 1.0, 2.0, 2.0, 0.0]])
    run = retrieval.rank_run(["q"], list("abcde"), lambda rows: scores[rows], top_k=2)
    # a is first; c and d tie for second, both kept so retrieval_metrics breaks the tie.
    assert run == {"q": {"a": 3.0, "c": 2.0, "d": 2.0}}


def test_a_relevant_doc_tied_at_the_cut_counts_as_the_tie_rule_places_it():
    """120 docs tie; the relevant one is 115th by the tie rule (doc id descending), so it is not
    in the top 100: a partial sort kept it (recall@100 1.0) or not, as it happened."""
    ids = [f"doc{j:05d}" for j in range(120)]
    qrels = {"q": {"doc00005": 1}}
    vectors = {text: np.full(4, 0.5, np.float32) for text in ["question", *ids]}
    metrics = retrieval.evaluate(
        _lookup_encoder(vectors, []), queries={"q": "question"},
        corpus={doc: doc for doc in ids}, qrels=qrels, ks=(10, 100),
    )  # fmt: skip
    assert metrics["recall_at_100"] == 0.0
    qrels = {"q": {"doc00025": 1}}  # 95th by the tie rule: inside
    metrics = retrieval.evaluate(
        _lookup_encoder(vectors, []), queries={"q": "question"},
        corpus={doc: doc for doc in ids}, qrels=qrels, ks=(10, 100),
    )  # fmt: skip
    assert metrics["recall_at_100"] == 1.0 and metrics["mrr_at_100"] == pytest.approx(1 / 95)


def _lookup_encoder(table, seen):
    def encode_fn(texts):
        seen.extend(texts)
        return np.stack([table[text] for text in texts])

    return encode_fn


def test_evaluate_with_prompt_and_toy_encoder():
    corpus = {"d1": "revenue 2022", "d2": "dividends", "d3": "buybacks"}
    queries = {"q1": "what was revenue?", "q2": "buyback size?"}
    qrels = {"q1": {"d1": 1}, "q2": {"d3": 1}}
    prompt = "Find it"
    e = np.eye(3, dtype=np.float32)
    table = {
        "revenue 2022": e[0],
        "dividends": e[1],
        "buybacks": e[2],
        # q1 points at d1; q2 is closer to d2 (.8) than to its relevant d3 (.6).
        "Instruct: Find it\nQuery:what was revenue?": e[0],
        "Instruct: Find it\nQuery:buyback size?": np.array([0.0, 0.8, 0.6], np.float32),
    }
    seen = []
    metrics = retrieval.evaluate(
        _lookup_encoder(table, seen),
        queries=queries,
        corpus=corpus,
        qrels=qrels,
        query_prompt=prompt,
        ks=(1, 2),
    )
    assert "Instruct: Find it\nQuery:what was revenue?" in seen
    assert "revenue 2022" in seen  # documents carry no instruction
    # q1 hits at rank 1; q2 at rank 2: MRR@1 = 1/2, MRR@2 = (1 + 1/2) / 2.
    assert metrics["mrr_at_1"] == 0.5
    assert metrics["mrr_at_2"] == 0.75
    assert metrics["recall_at_2"] == 1.0
    assert metrics["ndcg_at_2"] == round((1 + 1 / math.log2(3)) / 2, 5)


def test_evaluate_rejects_unnormalised_vectors():
    with pytest.raises(ValueError, match="L2-normalised"):
        retrieval.evaluate(
            lambda texts: np.full((len(texts), 2), 3.0),
            queries={"q": "a"},
            corpus={"d": "b"},
            qrels={"q": {"d": 1}},
        )


def test_format_query_is_qwen3_style():
    assert retrieval.format_query("Q?", "Do X") == "Instruct: Do X\nQuery:Q?"


def test_load_financebench_real_file():
    queries, corpus, qrels = retrieval.load_financebench(FINANCEBENCH)
    with gzip.open(FINANCEBENCH, "rt", encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    unique = {e["evidence_text"] for r in records for e in r["evidence"]}
    assert len(queries) == 150
    assert len(corpus) == len(unique) == 180
    assert set(corpus.values()) == unique
    assert set(qrels) == set(queries)
    assert all(len(docs) >= 1 and set(docs.values()) == {1} for docs in qrels.values())
    for record in records:
        relevant = {corpus[d] for d in qrels[record["financebench_id"]]}
        assert relevant == {e["evidence_text"] for e in record["evidence"]}
    # Ids follow first appearance: the first evidence of the first question is doc00000.
    assert corpus["doc00000"] == records[0]["evidence"][0]["evidence_text"]


def test_load_financebench_bad_record(tmp_path):
    path = tmp_path / "fb.jsonl"
    good = {"financebench_id": "a", "question": "q?", "evidence": [{"evidence_text": "t"}]}
    path.write_text(
        json.dumps(good) + "\n" + json.dumps({**good, "financebench_id": "b", "evidence": []})
    )
    with pytest.raises(ValueError, match=f"{path}:2: field evidence"):
        retrieval.load_financebench(path)


def test_bm25_run_on_toy_and_financebench():
    corpus = {"d1": "the cat sat on the mat", "d2": "revenue grew in fiscal 2022", "d3": "dogs"}
    run = retrieval.bm25_run({"q": "revenue growth 2022", "s": "of the"}, corpus, top_k=2)
    # "revenue" and "2022" match d2 ("growth" is not stemmed to "grew"); the others score 0 and
    # tie at the cut, so both are kept; a query of stopwords alone ties every doc at 0.
    assert run["q"]["d2"] > 0 and run["q"] == {**run["q"], "d1": 0.0, "d3": 0.0}
    assert run["s"] == {"d1": 0.0, "d2": 0.0, "d3": 0.0}

    queries, corpus, qrels = retrieval.load_financebench(FINANCEBENCH)
    metrics = retrieval.retrieval_metrics(qrels, retrieval.bm25_run(queries, corpus, 100))
    # A lexical baseline is far above chance (about 10 / 180 docs) on these questions.
    assert metrics["ndcg_at_10"] > 0.2
    assert metrics["recall_at_100"] > metrics["recall_at_10"]
