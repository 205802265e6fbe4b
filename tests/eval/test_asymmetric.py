"""Tests for caliber_jax/eval/asymmetric.py: student queries against teacher documents."""

import numpy as np
import pytest

from caliber_jax.eval import asymmetric

CORPUS = {"d0": "revenue", "d1": "debt", "d2": "dividends"}
QUERIES = {"qa": "how much revenue?", "qb": "what dividends?"}
QRELS = {"qa": {"d0": 1}, "qb": {"d2": 1}}


def _unit(vector):
    vector = np.asarray(vector, np.float32)
    return vector / np.linalg.norm(vector)


def _encoder(table, seen):
    def encode_fn(texts):
        seen.extend(texts)
        return np.stack([table[text] for text in texts])

    return encode_fn


# A 4-D teacher whose first 2 dims (the student's space, an MRL prefix) carry the topic. The
# prefixes have different norms (d1's is .894, the others' .316), so they must be re-normalised
# after truncation: a plain dot product with the raw prefixes would rank d1 first for both.
TEACHER = {
    "revenue": _unit([1.0, 0.0, 0.0, 3.0]),
    "debt": _unit([0.6, 0.8, 0.5, 0.0]),
    "dividends": _unit([0.0, 1.0, 0.0, 3.0]),
}
STUDENT = {
    "Instruct: Find\nQuery:how much revenue?": _unit([0.9, 0.1]),
    "Instruct: Find\nQuery:what dividends?": _unit([0.1, 0.9]),
}


def test_student_queries_teacher_documents_truncated():
    student_seen, teacher_seen = [], []
    metrics = asymmetric.evaluate(
        _encoder(STUDENT, student_seen),
        _encoder(TEACHER, teacher_seen),
        queries=QUERIES,
        corpus=CORPUS,
        qrels=QRELS,
        query_task="Find",
        ks=(1, 3),
    )
    # Queries go to the student with the instruction; documents to the teacher without one.
    assert sorted(student_seen) == sorted(STUDENT)
    assert sorted(teacher_seen) == sorted(CORPUS.values())
    # Re-normalised prefixes: d0 [1, 0], d1 [.6, .8], d2 [0, 1]. qa -> d0 (.994) over d1
    # (.685); qb -> d2 (.994) over d1 (.861). Both at rank 1.
    assert metrics["mrr_at_1"] == 1.0
    assert metrics["ndcg_at_3"] == 1.0
    # Without re-normalising, d1 would win both: e.g. qa . raw prefix of d1 = .685 * .894.
    raw_prefix = np.stack([TEACHER[CORPUS[d]][:2] for d in CORPUS])
    student = np.stack(list(STUDENT.values()))
    assert list(np.argmax(student @ raw_prefix.T, axis=1)) == [1, 1]


def test_same_width_uses_full_teacher_vectors():
    # A student as wide as the teacher: no truncation, all 4 dims count. qa still finds d0
    # (.999 vs d2 .918), but qb's third dim now matches d1 (.651) over d2 (.091).
    wide_student = {
        "how much revenue?": _unit([0.9, 0.1, 0.0, 3.0]),
        "what dividends?": _unit([0.1, 0.9, 3.0, 0.0]),
    }
    metrics = asymmetric.evaluate(
        _encoder(wide_student, []),
        _encoder(TEACHER, []),
        queries=QUERIES,
        corpus=CORPUS,
        qrels=QRELS,
        ks=(1,),
    )
    assert metrics["mrr_at_1"] == 0.5


def test_teacher_narrower_than_student_fails():
    with pytest.raises(ValueError, match="teacher dim 2 < student dim 4"):
        asymmetric.evaluate(
            lambda texts: np.tile(_unit([1.0, 0.0, 0.0, 0.0]), (len(texts), 1)),
            lambda texts: np.tile(_unit([1.0, 0.0]), (len(texts), 1)),
            queries=QUERIES,
            corpus=CORPUS,
            qrels=QRELS,
        )
