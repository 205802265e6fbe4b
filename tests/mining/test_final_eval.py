"""Final evaluation (paper 001 IV-E) and step 6a against hand-computed values."""

import math

import numpy as np
import pytest

from caliber_jax.mining import final_eval


def _unit(degrees):
    return np.array([math.cos(math.radians(degrees)), math.sin(math.radians(degrees))])


class TableJudge:
    """Grades from a {chunk id: grade} table; records every (query, chunk id) it was asked."""

    def __init__(self, table, default=1):
        self.table, self.default, self.asked = table, default, []

    def grade(self, queries, chunks):
        self.asked += [(q, c["id"]) for q, c in zip(queries, chunks, strict=True)]
        return [self.table.get(c["id"], self.default) for c in chunks]


def test_modified_hausdorff_by_hand():
    # 1-D, euclidean: A = {0, 1}, B = {0, 3}. A->B: mean(min(0, 3), min(1, 2)) = 0.5;
    # B->A: mean(min(0, 1), min(3, 2)) = 1.0; MHD = max = 1.0.
    a, b = np.array([[0.0], [1.0]]), np.array([[0.0], [3.0]])
    assert final_eval.modified_hausdorff(a, b, distance="euclidean") == pytest.approx(1.0)
    assert final_eval.modified_hausdorff(b, a, distance="euclidean") == pytest.approx(1.0)
    assert final_eval.modified_hausdorff(a, a, distance="euclidean") == 0.0
    # Cosine: A = {e1, e2}, B = {e1}: A->B mean(0, 1) = 0.5, B->A 0 -> 0.5.
    e1, e2 = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    assert final_eval.modified_hausdorff(
        np.stack([e1, e2]), e1[None], distance="cosine"
    ) == pytest.approx(0.5)
    # The classical Hausdorff distance would be 1 here (e2's distance to B); the modified one
    # averages instead of taking the max.
    with pytest.raises(ValueError, match="non-empty"):
        final_eval.modified_hausdorff(a[:0], b, distance="cosine")


def test_document_score_and_selection():
    assert final_eval.document_score(0.5, 0.3, similarity=0.8) == pytest.approx(0.25)
    assert final_eval.document_score(0.5, 0.9, similarity=0.8) == 0.0  # relu
    scores = {("q1", "a"): 0.1, ("q1", "b"): 0.7, ("q2", "a"): 0.7, ("q2", "b"): 0.0,
              ("q3", "a"): 0.3}  # fmt: skip
    # ceil(5 / 2) = 3 kept; the tie at 0.7 breaks by pair.
    assert final_eval.select_top_fraction(scores, fraction_p=2) == [
        ("q1", "b"), ("q2", "a"), ("q3", "a")
    ]  # fmt: skip
    assert len(final_eval.select_top_fraction(scores, fraction_p=1)) == 5


def test_confidence_interval_and_stopping_rule():
    # [0, 1, 0, 1]: mean 0.5, sd sqrt(1/3), se sqrt(1/3)/2 = 0.288675, z(0.95) = 1.959964.
    mean, low, high = final_eval.confidence_interval([0, 1, 0, 1], level=0.95)
    half = 1.959964 * math.sqrt(1 / 3) / 2
    assert mean == 0.5
    assert (low, high) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-6)
    assert final_eval.confidence_interval([0.3], level=0.95)[1:] == (-math.inf, math.inf)
    # width 2 * 0.565798 = 1.1316: narrow enough for 1.2, not for 1.1.
    rule = dict(level=0.95, min_count=4)
    assert final_eval.intervals_narrow({"m": [0, 1, 0, 1]}, width=1.2, **rule)
    assert not final_eval.intervals_narrow({"m": [0, 1, 0, 1]}, width=1.1, **rule)
    # Every metric must pass, and the minimum count holds even for constant values.
    assert not final_eval.intervals_narrow(
        {"m": [0, 1, 0, 1], "n": [1, 1, 1, 1]}, width=1.1, **rule
    )
    assert not final_eval.intervals_narrow({"n": [1, 1, 1]}, width=1.0, **rule)
    assert final_eval.intervals_narrow({"n": [1, 1, 1, 1]}, width=0.0, **rule)
    # Padded with 0 and R = 1: [1, 1, 1, 1, 0, 1], m = 6 values, one 0: sample variance 1/m,
    # se 1/m, width 2 * 1.959964 / 6 = 0.6533: all-equal values no longer stop at once.
    padded = dict(rule, ranges={"n": 1.0})
    assert not final_eval.intervals_narrow({"n": [1, 1, 1, 1]}, width=0.65, **padded)
    assert final_eval.intervals_narrow({"n": [1, 1, 1, 1]}, width=0.66, **padded)
    assert not final_eval.intervals_narrow({"n": [0, 0, 0, 0]}, width=0.65, **padded)


def _toy():
    """Two documents, query q0 = (1, 0) under both models. Model 0 ranks doc A's a0 (0 deg)
    first, model 1 ranks a1 first (model 1 puts a1 at 0 deg, a0 at 90 deg); both rank b0 (30
    deg) first in doc B."""
    chunks = [{"id": f"{d}{n}", "doc_name": d, "text": f"{d}{n}"} for d, n in
              (("A", 0), ("A", 1), ("A", 2), ("B", 0), ("B", 1))]  # fmt: skip
    model0 = np.stack([_unit(0), _unit(90), _unit(60), _unit(30), _unit(120)])
    model1 = np.stack([_unit(90), _unit(0), _unit(60), _unit(30), _unit(120)])
    queries = [{"id": "q0", "text": "query zero"}]
    query_vecs = [np.stack([_unit(0)]), np.stack([_unit(0)])]
    return chunks, queries, query_vecs, [model0, model1]


def _run(tmp_path, judge, *, fraction_p, similarity=0.5, **overrides):
    chunks, queries, query_vecs, chunk_vecs = _toy()
    params = dict(k=1, top_k_corpus=5, max_docs=0, similarity=similarity, fraction_p=fraction_p,
                  ci_width=0.5, ci_level=0.95, min_pairs=2, batch_pairs=1, distance="cosine",
                  seed=0, log_fn=lambda _: None)  # fmt: skip
    params.update(overrides)
    cache = final_eval.GradeCache(tmp_path / "grades.jsonl", final_eval.judge_key(name="table"))
    return final_eval.final_evaluation(
        queries, chunks, query_vecs, chunk_vecs, {"A": "10k", "B": "8k"},
        judge=judge, cache=cache, **params,
    )  # fmt: skip


def test_final_evaluation_by_hand(tmp_path):
    # Doc A: top-1 sets {a0} vs {a1}, MHD in model 0's space 1 - cos 90 = 1; top-1 distance
    # min(0, 0) = 0; score 1 * relu(0.5 - 0) = 0.5. Doc B: same top 1 (b0), MHD 0, score 0.
    # P = 2 keeps ceil(2 / 2) = 1 pair: (q0, A). a1 is relevant, a0 not: MRR@1 0 -> 1.
    judge = TableJudge({"A1": 4, "B0": 4})
    [result] = _run(tmp_path, judge, fraction_p=2)
    assert (result["pairs_in_scope"], result["pairs_selected"], result["pairs_judged"]) == (2, 1, 1)
    assert result["stopped"] == "exhausted"
    assert sorted(judge.asked) == [("query zero", "A0"), ("query zero", "A1")]
    overall = result["overall"]["mrr_at_1"]
    assert (overall["base"], overall["exp"], overall["count"]) == (0.0, 1.0, 1)
    assert list(result["by_type"]) == ["10k"]
    # P = 1: both pairs; doc B's b0 is relevant under both models. Grades of A come from the
    # cache (the same judge key): only b0 is judged anew.
    judge = TableJudge({"A1": 4, "B0": 4})
    [result] = _run(tmp_path, judge, fraction_p=1)
    assert judge.asked == [("query zero", "B0")]
    assert result["pairs_judged"] == 2
    assert result["overall"]["dcg_at_1"]["base"] == pytest.approx(0.5)  # (0 + 1) / 2
    assert result["overall"]["dcg_at_1"]["exp"] == pytest.approx(1.0)
    by_type = result["by_type"]
    assert by_type["8k"]["mrr_at_1"]["base"] == by_type["8k"]["mrr_at_1"]["exp"] == 1.0
    assert by_type["10k"]["mrr_at_1"]["exp"] == 1.0
    # Base MRR@1 values [0, 1]: 0.5 +- 1.96 * 0.7071 / sqrt(2) = 0.5 +- 0.98.
    assert result["overall"]["mrr_at_1"]["base_ci"] == pytest.approx([-0.48, 1.48], abs=1e-3)
    assert by_type["8k"]["mrr_at_1"]["base_ci"] is None  # one pair: no interval
    # A small S makes every score 0 (relu): selection falls back to the pair order, (q0, A).
    [result] = _run(tmp_path, TableJudge({}), fraction_p=2, similarity=0.0)
    assert result["pairs_selected"] == 1


def test_final_evaluation_stops_when_intervals_are_narrow(tmp_path):
    # 12 queries that all see both documents; a judge grading everything 4 gives MRR@1 =
    # DCG@1 = 1 for every pair. Padded with 0 and R = 1, n pairs give m = n + 2 values with one
    # 0: width 2 * 1.96 / m <= 0.5 once m >= 8. Batches of 3, min_pairs 5: after the second
    # batch, n = 6, m = 8, width 0.49: 6 of 24 pairs judged.
    chunks, _, _, chunk_vecs = _toy()
    queries = [{"id": f"q{n}", "text": f"query {n}"} for n in range(12)]
    query_vecs = [np.stack([_unit(0)] * 12)] * 2
    params = dict(k=1, top_k_corpus=5, max_docs=0, similarity=0.5, fraction_p=1, ci_width=0.5,
                  ci_level=0.95, min_pairs=5, batch_pairs=3, distance="cosine", seed=0,
                  log_fn=lambda _: None)  # fmt: skip
    cache = final_eval.GradeCache(tmp_path / "g.jsonl", final_eval.judge_key(name="all4"))
    [result] = final_eval.final_evaluation(
        queries, chunks, query_vecs, chunk_vecs, {}, judge=TableJudge({}, default=4),
        cache=cache, **params,
    )  # fmt: skip
    assert (result["pairs_selected"], result["pairs_judged"], result["stopped"]) == (24, 6, "ci")
    # A judge whose grades vary keeps base's interval wide (12 zeros and 12 ones: width ~0.39
    # > 0.1): every selected pair is judged.
    params["ci_width"] = 0.1
    cache = final_eval.GradeCache(tmp_path / "h.jsonl", final_eval.judge_key(name="mixed"))
    [result] = final_eval.final_evaluation(
        queries, chunks, query_vecs, chunk_vecs, {}, judge=TableJudge({"A1": 4, "B0": 4}),
        cache=cache, **params,
    )  # fmt: skip
    assert (result["pairs_judged"], result["stopped"]) == (24, "exhausted")


def test_grade_cache_keys_by_judge_and_survives_a_torn_line(tmp_path):
    path = tmp_path / "grades.jsonl"
    chunk = {"id": "d:0", "text": "t"}
    judge = TableJudge({"d:0": 3})
    assert final_eval.GradeCache(path, "judge-a").grade(judge, [("q", "text", chunk)]) == [3]
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"judge": "judge-a", "query_id": "q", "chu')  # killed mid-write
    cache = final_eval.GradeCache(path, "judge-a")
    assert cache.grade(judge, [("q", "text", chunk)]) == [3]
    assert len(judge.asked) == 1  # answered from the file
    # Another judge never sees judge-a's grades.
    other = TableJudge({"d:0": 1})
    assert final_eval.GradeCache(path, "judge-b").grade(other, [("q", "text", chunk)]) == [1]
    assert len(other.asked) == 1
    assert path.read_text().count("\n") == 2


def test_validation_6a_judges_only_the_new_top_k(tmp_path):
    # Val doc V with chunks v0..v2, test doc T (ignored). bi-enc(i) judged v0 (top, grade 1),
    # v1 (top, grade 4). bi-enc(i+1) ranks v2 then v1: v2 is new and must be judged.
    chunks_by_doc = {
        "V": [{"id": f"V:{n}", "doc_name": "V", "text": f"v{n}"} for n in range(3)],
        "T": [{"id": "T:0", "doc_name": "T", "text": "t0"}],
    }
    judged = [
        {"query_id": "q", "query": "Q?", "doc_name": "V", "chunk_id": "V:0", "rank": 0,
         "top": True, "grade": 1},
        {"query_id": "q", "query": "Q?", "doc_name": "V", "chunk_id": "V:1", "rank": 1,
         "top": True, "grade": 4},
        {"query_id": "q", "query": "Q?", "doc_name": "T", "chunk_id": "T:0", "rank": 0,
         "top": True, "grade": 4},
    ]  # fmt: skip
    vectors = {"Q?": _unit(0), "v0": _unit(90), "v1": _unit(40), "v2": _unit(10), "t0": _unit(0)}

    def encode(texts):
        return np.stack([vectors[t] for t in texts])

    judge = TableJudge({"V:2": 4})
    cache = final_eval.GradeCache(tmp_path / "6a.jsonl", "table")
    result = final_eval.validation_6a(
        judged, {"V": "val", "T": "test"}, chunks_by_doc, encode_queries=encode,
        encode_chunks=encode, judge=judge, cache=cache, k=2,
    )  # fmt: skip
    assert judge.asked == [("Q?", "V:2")]
    assert (result["pairs"], result["newly_judged"]) == (1, 1)
    # base top 2 = [v0 (1), v1 (4)]: MRR@2 1/2, DCG@2 1/log2(3); exp top 2 = [v2 (4), v1 (4)]:
    # MRR@2 1, DCG@2 1 + 1/log2(3).
    mrr, dcg = result["compare"]["mrr_at_2"], result["compare"]["dcg_at_2"]
    assert (mrr["base"], mrr["exp"]) == (0.5, 1.0)
    assert dcg["base"] == pytest.approx(1 / math.log2(3))
    assert dcg["exp"] == pytest.approx(1 + 1 / math.log2(3))
    cache = final_eval.GradeCache(tmp_path / "6a.jsonl", "table")
    again = final_eval.validation_6a(
        judged, {"V": "val", "T": "test"}, chunks_by_doc, encode_queries=encode,
        encode_chunks=encode, judge=judge, cache=cache, k=2,
    )  # fmt: skip
    assert (again["newly_judged"], len(judge.asked)) == (0, 1)


def test_judge_agreement_by_hand():
    # Pairs graded by both: (4, 4), (1, 1), (2, 3). p_o = 2/3; marginals a {1, 2, 4}, b
    # {1, 3, 4}, each 1/3: p_e = 2/9, kappa = (2/3 - 2/9) / (7/9) = 4/7. Binarised (>= 4):
    # [1, 0, 0] both: agreement 1, kappa 1.
    out = final_eval.judge_agreement([4, 1, 2, None], [4, 1, 3, 4])
    assert (out["pairs"], out["graded_by_both"]) == (4, 3)
    assert out["agreement"] == pytest.approx(2 / 3)
    assert out["kappa"] == pytest.approx(4 / 7)
    assert (out["binary_agreement"], out["binary_kappa"]) == (1.0, 1.0)
    assert math.isnan(final_eval.judge_agreement([1, 1], [1, 1])["kappa"])
