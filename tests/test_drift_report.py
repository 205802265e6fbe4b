"""scripts/drift_report.py: residual statistics by hand."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("drift_report", REPO / "scripts/drift_report.py")
drift_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(drift_report)


def test_drift_stats_by_hand():
    teacher = np.eye(3, dtype=np.float64)
    # Two coherent moves towards e3, the third passage already there:
    # s0 = (0.8, 0, 0.6), s1 = (0, 0.8, 0.6), s2 = e3 (unchanged).
    student = np.array([[0.8, 0.0, 0.6], [0.0, 0.8, 0.6], [0.0, 0.0, 1.0]])
    stats = drift_report.drift_stats(teacher, student)
    r = np.sqrt(0.2**2 + 0.6**2)
    np.testing.assert_allclose(stats["residual_norm_mean"], 2 * r / 3)
    np.testing.assert_allclose(stats["cos_to_teacher_mean"], (0.8 + 0.8 + 1.0) / 3)
    # Residuals (-.2, 0, .6), (0, -.2, .6), 0: the two real ones have cosine .36 / .4 = .9;
    # the zero residual has cosine 0 with both.
    np.testing.assert_allclose(stats["residual_pairwise_cos_mean"], (2 * 0.9) / 6)
    # Off-diagonal similarities: teacher all 0; student s0.s1 = .36, s0.s2 = s1.s2 = .6.
    np.testing.assert_allclose(stats["similarity_mean_teacher"], 0.0)
    np.testing.assert_allclose(stats["similarity_mean_student"], (0.36 + 0.6 + 0.6) / 3)
    np.testing.assert_allclose(stats["similarity_sq_change_mean"], (0.36**2 + 2 * 0.36) / 3)


def test_drift_stats_of_a_rotation_keeps_the_structure():
    rng = np.random.default_rng(0)
    teacher = rng.standard_normal((20, 8))
    teacher /= np.linalg.norm(teacher, axis=1, keepdims=True)
    rotation, _ = np.linalg.qr(rng.standard_normal((8, 8)))
    stats = drift_report.drift_stats(teacher, teacher @ rotation)
    np.testing.assert_allclose(stats["similarity_corr"], 1.0, atol=1e-12)
    np.testing.assert_allclose(stats["similarity_sq_change_mean"], 0.0, atol=1e-12)
    assert stats["residual_norm_mean"] > 0.5  # it moved, but kept every similarity


def test_drift_stats_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        drift_report.drift_stats(np.eye(3), np.eye(4))


def test_ndcg10_of_perfect_and_reversed_rankings():
    docs = np.eye(3)
    qrels = {"q0": {"d0": 1}, "q1": {"d1": 1}}
    assert drift_report.ndcg10(docs[:2], docs, qrels, ["q0", "q1"], ["d0", "d1", "d2"]) == 1.0
    queries = np.array([[0.0, 0.1, 0.9], [0.9, 0.0, 0.1]])  # relevant doc ranked last
    assert drift_report.ndcg10(queries, docs, qrels, ["q0", "q1"], ["d0", "d1", "d2"]) == 0.5


def test_report_has_query_residuals_and_the_four_one_side_rankings():
    docs, queries = np.eye(3), np.eye(3)[:2]
    moved = np.array([[0.6, 0.8, 0.0], [0.0, 1.0, 0.0]])  # the student's q0 leans towards d1
    vectors = {("teacher", "d"): docs, ("student", "d"): docs,
               ("teacher", "q"): queries, ("student", "q"): moved}  # fmt: skip
    qrels = {"q0": {"d0": 1}, "q1": {"d1": 1}}
    stats = drift_report.report(vectors, qrels, ["q0", "q1"], ["d0", "d1", "d2"])
    np.testing.assert_allclose(stats["query_cos_to_teacher_mean"], (0.6 + 1.0) / 2)
    np.testing.assert_allclose(stats["cos_to_teacher_mean"], 1.0)
    assert stats["ndcg_at_10_teacher_queries_student_docs"] == 1.0
    # q0 ranks d1 (0.8) above d0 (0.6): nDCG 1/log2(3) for q0, 1 for q1.
    np.testing.assert_allclose(stats["ndcg_at_10_student_queries_teacher_docs"],
                               (1 / np.log2(3) + 1.0) / 2, atol=1e-5)  # 5 decimals, as MTEB
