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
        np.mean([1, 2, 2]) / np.std([1, 2, 2], ddof=1))
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
        [{"financebench_id": "f1", "question": "What were net sales?", "doc_name": "D",
          "evidence": [{"evidence_text": evidence, "doc_name": "D"}]},
         {"financebench_id": "f2", "question": "Elsewhere?", "doc_name": "E", "evidence": []}],
        {"D": [{"id": f"D:{i}", "text": t} for i, t in enumerate(chunks)]},
        ngram=5, min_fraction=1 / 3,
    )  # fmt: skip
    assert [(i["id"], i["labels"]) for i in items] == [("f1", [1, 0, 0])]

    def encode(texts):  # the question lands next to chunk 2, then chunk 0
        table = {"What were net sales?": [1, 0, 0], chunks[0]: [0.6, 0.8, 0],
                 chunks[1]: [0, 0, 1], chunks[2]: [0.8, 0.6, 0]}  # fmt: skip
        return np.array([table[t] for t in texts], np.float32)

    scores = within_doc.financebench_scores(encode, items, k=5)
    assert scores["mrr"] == [0.5] and scores["mrr_at_5"] == [0.5]
    assert scores["ndcg"] == [pytest.approx(1 / math.log2(3))]
