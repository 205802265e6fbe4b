"""Within-document metrics (MRR, DCG, nDCG, Cohen's d) and evidence labels by hand."""

import math

import numpy as np
import pytest

from caliber_jax.eval import within_doc


def test_rank_metrics_by_hand():
    rel = [0, 1, 0, 1, 0, 1]
    assert within_doc.mrr(rel) == 0.5
    assert within_doc.mrr(rel, 1) == 0.0
    assert within_doc.dcg(rel, 5) == pytest.approx(1 / math.log2(3) + 1 / math.log2(5))
    ideal = 1 + 1 / math.log2(3) + 1 / math.log2(4)
    full = 1 / math.log2(3) + 1 / math.log2(5) + 1 / math.log2(7)
    assert within_doc.ndcg(rel) == pytest.approx(full / ideal)
    assert within_doc.ndcg([0, 0]) == 0.0


def test_cohens_d_by_hand():
    # means 2 and 4, sample variances 1 and 1: d = 2 / 1.
    assert within_doc.cohens_d([1, 2, 3], [3, 4, 5]) == pytest.approx(2.0)
    # pooled sd sqrt((1 + 4) / 2)
    assert within_doc.cohens_d([1, 2, 3], [2, 4, 6]) == pytest.approx(2 / math.sqrt(2.5))
    assert within_doc.paired_d([1, 2, 3], [2, 4, 5]) == pytest.approx(
        np.mean([1, 2, 2]) / np.std([1, 2, 2], ddof=1)
    )
    summary = within_doc.compare({"m": [1, 2, 3]}, {"m": [3, 4, 5]})["m"]
    assert summary["base"] == 2 and summary["exp"] == 4 and summary["count"] == 3
    assert summary["base_se"] == pytest.approx(1 / math.sqrt(3))


def test_judged_at_k_judges_each_pair_once():
    rankings = {
        "base": {("q", "D"): ["c1", "c2", "c3"]},
        "exp": {("q", "D"): ["c3", "c1", "c2"]},
    }
    asked = []

    def grade_fn(pairs):
        asked.append(pairs)
        return [{"c1": 1, "c2": 2, "c3": 4}[chunk] for _, chunk in pairs]

    per_model, grades = within_doc.judged_at_k(rankings, grade_fn, k=2)
    assert asked == [[("q", "c1"), ("q", "c2"), ("q", "c3")]]
    assert per_model["base"] == {"mrr_at_2": [0.0], "dcg_at_2": [0.0]}
    assert per_model["exp"] == {"mrr_at_2": [1.0], "dcg_at_2": [1.0]}
    with pytest.raises(ValueError, match="other"):
        within_doc.judged_at_k({"a": {("q", "D"): []}, "b": {("q", "E"): []}}, grade_fn, k=2)


def test_evidence_labels_section_vi_b():
    """Relevant when the shared words exceed a third of the shorter text (in words)."""
    evidence = "Net sales were 32.8 billion in 2019 up 4 percent from the prior year driven by"
    chunks = [
        "Intro words here. Net sales were 32.8 billion in 2019 up 4 percent from the prior year",
        "Completely different text about leases and other commitments of the company in 2019",
        # Only 5 shared words out of 20: a "minor" intersection (5 <= 20 / 3 is false: 5 < 6.7).
        "driven by strong demand. " + " ".join(f"w{i}" for i in range(16)) + " from the prior year",
    ]
    assert within_doc.evidence_labels(chunks, [evidence], ngram=5, min_fraction=1 / 3) == [1, 0, 0]
    items = within_doc.financebench_items(
        [
            {
                "financebench_id": "f1",
                "question": "What were net sales?",
                "doc_name": "D",
                "evidence": [{"evidence_text": evidence, "doc_name": "D"}],
            },
            {"financebench_id": "f2", "question": "Elsewhere?", "doc_name": "E", "evidence": []},
        ],
        {"D": [{"id": f"D:{i}", "text": t} for i, t in enumerate(chunks)]},
        ngram=5,
        min_fraction=1 / 3,
    )
    assert [(i["id"], i["labels"]) for i in items] == [("f1", [1, 0, 0])]

    def encode(texts):  # the question lands next to chunk 2, then chunk 0
        table = {
            "What were net sales?": [1, 0, 0],
            chunks[0]: [0.6, 0.8, 0],
            chunks[1]: [0, 0, 1],
            chunks[2]: [0.8, 0.6, 0],
        }
        return np.array([table[t] for t in texts], np.float32)

    scores = within_doc.financebench_scores(encode, items, k=5)
    assert scores["mrr"] == [0.5] and scores["mrr_at_5"] == [0.5]
    assert scores["ndcg"] == [pytest.approx(1 / math.log2(3))]


def _bag_of_words(texts):
    """A deterministic toy encoder: hashed word counts, L2-normalised."""
    vecs = np.zeros((len(texts), 256), np.float32)
    for row, text in enumerate(texts):
        for word in within_doc.words(text):
            vecs[row, sum(map(ord, word)) % 256] += 1.0
    return vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-9)


def test_load_items_and_the_evaluate_task(tmp_path):
    """An evidence filing rebuilt from FinanceBench full pages plus filler from a real filing:
    the evidence chunks are found, and `evaluate.run_evaluation` runs task within_doc."""
    import gzip
    import json

    from caliber_jax import evaluate
    from caliber_jax.data import corpus

    questions = within_doc.load_questions("data/sample/financebench_open_source.jsonl.gz")
    doc = "3M_2018_10K"
    pages = [e["evidence_text_full_page"] for q in questions if q["doc_name"] == doc
             for e in q["evidence"]]  # fmt: skip
    filler = next(iter(corpus.load_records("data/sample/filings.jsonl.gz")))["text"][:60_000]
    half = len(filler) // 2
    text = filler[:half] + "\n\n" + "\n\n".join(pages) + "\n\n" + filler[half:]
    filings = tmp_path / "filings.jsonl.gz"
    with gzip.open(filings, "wt", encoding="utf-8") as handle:
        handle.write(json.dumps({"doc_name": doc, "text": text}) + "\n")
    items = within_doc.load_items("data/sample/financebench_open_source.jsonl.gz", str(filings),
                                  min_chars=500, max_chars=1000, ngram=5, min_fraction=1 / 3,
                                  max_docs=0)  # fmt: skip
    assert [item["doc_name"] for item in items] == [doc, doc]
    for item in items:
        assert 0 < sum(item["labels"]) < len(item["labels"]) / 4
    inputs = evaluate.EvalInputs(within_doc_items=items, within_doc_baseline=_bag_of_words)
    results = evaluate.run_evaluation(_bag_of_words, ["within_doc"], inputs)["within_doc"]
    assert results["count"] == 2 and 0 < results["mrr"] <= 1
    assert results["vs_baseline"]["mrr"]["cohens_d"] == 0.0  # the same model on both sides
