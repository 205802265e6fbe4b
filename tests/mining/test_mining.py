"""Stage caches record which judge produced them (issue #38): evaluation grades per judge,
a judging stage resumed by another judge refused; held-out rankings keyed by query id."""

import numpy as np
import pytest

from caliber_jax.data import corpus
from caliber_jax.mining import mining


class FixedJudge:
    """Grades every pair `value`; records what it was asked."""

    def __init__(self, identity, value):
        self.identity = identity
        self.value = value
        self.asked = []

    def grade(self, queries, chunks):
        self.asked += [(q, c["id"]) for q, c in zip(queries, chunks, strict=True)]
        return [self.value] * len(chunks)


CHUNKS = {f"D:{i}": {"id": f"D:{i}", "doc_name": "D", "text": f"chunk {i}"} for i in range(4)}
QUERIES = [{"id": "q1", "text": "text of q1"}]


def test_eval_grades_are_cached_per_judge(tmp_path):
    rankings = {"base": {("q1", "D"): ["D:0", "D:1"]}, "exp": {("q1", "D"): ["D:1", "D:0"]}}
    cache = tmp_path / "eval_judgments.jsonl"
    first = FixedJudge("judge A", 4)
    assert mining.judged_eval(rankings, first, CHUNKS, cache, k=2, queries=QUERIES)["base"][
        "mrr_at_2"
    ] == [1.0]
    assert len(first.asked) == 2
    # Another judge: its own grades, not judge A's from the cache.
    second = FixedJudge("judge B", 1)
    assert mining.judged_eval(rankings, second, CHUNKS, cache, k=2, queries=QUERIES)["base"][
        "mrr_at_2"
    ] == [0.0]
    assert len(second.asked) == 2
    # Judge A again: its grades are still cached, nothing is asked.
    again = FixedJudge("judge A", 4)
    assert mining.judged_eval(rankings, again, CHUNKS, cache, k=2, queries=QUERIES)["exp"][
        "mrr_at_2"
    ] == [1.0]
    assert again.asked == []
    assert {r["judge"] for r in corpus.load_jsonl(cache)} == {"judge A", "judge B"}


def test_judging_resumed_by_another_judge_is_refused(tmp_path):
    candidates = [
        {"query_id": "q", "query": "q", "doc_name": "D", "chunk_id": f"D:{i}"} for i in range(4)
    ]
    args = dict(batch_size=2, log_fn=lambda m: None)
    mining.judge_candidates(
        FixedJudge("judge A", 4), candidates, CHUNKS, tmp_path / "a.jsonl", **args
    )
    lines = (tmp_path / "a.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "b.partial.jsonl").write_text("".join(lines[:2]))
    with pytest.raises(ValueError, match="judge A.*judge B"):
        mining.judge_candidates(
            FixedJudge("judge B", 1), candidates, CHUNKS, tmp_path / "b.jsonl", **args
        )
    with pytest.raises(ValueError, match="judge A.*judge B"):
        mining.judge_candidates(
            FixedJudge("judge B", 1), candidates, CHUNKS, tmp_path / "a.jsonl", **args
        )


def test_heldout_rankings_are_keyed_by_query_id(tmp_path):
    """Two test queries with one text (a template question generated from two chunks of one
    document) are two (query, document) pairs, not one overwriting the other."""
    queries = [
        {"id": "q:D:0", "text": "What was revenue in 2020?"},
        {"id": "q:D:2", "text": "What was revenue in 2020?"},
        {"id": "q:D:3", "text": "What were leases?"},
    ]
    chunks = list(CHUNKS.values())
    chunk_vecs = np.eye(4, dtype=np.float32)
    query_vecs = np.array([[1, 0.5, 0, 0], [1, 0.5, 0, 0], [0, 0, 0.5, 1]], np.float32)
    rankings = mining.eval_rankings(
        queries,
        {"base": query_vecs, "exp": query_vecs[:, ::-1].copy()},
        chunks,
        {"base": chunk_vecs, "exp": chunk_vecs},
        top_k_corpus=2,
        max_docs=1,
    )
    assert rankings["base"] == {
        ("q:D:0", "D"): ["D:0", "D:1", "D:2", "D:3"],
        ("q:D:2", "D"): ["D:0", "D:1", "D:2", "D:3"],
        ("q:D:3", "D"): ["D:3", "D:2", "D:0", "D:1"],
    }
    # Grade 4 for D:0 and D:3 only: base ranks one of them first for every query. One grade
    # per (text, chunk): the repeated text is not judged twice.
    grader = FixedJudge("judge A", None)
    grader.grade = lambda qs, cs: [4 if c["id"] in ("D:0", "D:3") else 1 for c in cs]
    per_model = mining.judged_eval(
        rankings, grader, CHUNKS, tmp_path / "eval.jsonl", k=1, queries=queries
    )
    assert per_model["base"]["mrr_at_1"] == [1.0, 1.0, 1.0]
    assert per_model["exp"]["mrr_at_1"] == [1.0, 1.0, 1.0]  # D:3 / D:0 first, reversed
    assert len(corpus.load_jsonl(tmp_path / "eval.jsonl")) == 4  # (2 texts) x (D:0, D:3)
