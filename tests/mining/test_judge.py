"""Judges: strict grade parsing, the calibrated embedding judge and its stored calibration."""

import numpy as np
import pytest

from caliber_jax.mining import judge, mining


@pytest.mark.parametrize(
    "text, grade",
    [
        ("4", 4),
        (" 3\n", 3),
        ("Score: 2", 2),
        ("**4**", 4),
        ("grade=1.", 1),
        ("5", None),
        ("3 or 4", None),
        ("I think 4", None),
        ("", None),
        ("0", None),
        ("44", None),
    ],
)
def test_parse_grade_is_strict(text, grade):
    assert judge.parse_grade(text) == grade


def test_grades_from_cosine_and_calibration(tmp_path):
    np.testing.assert_array_equal(
        judge.grades_from_cosine(np.array([0.1, 0.3, 0.45, 0.6, 0.3]), [0.3, 0.4, 0.5]),
        [1, 2, 3, 4, 2],
    )
    with pytest.raises(ValueError, match="non-decreasing"):
        judge.grades_from_cosine(np.zeros(1), [0.5, 0.4, 0.6])
    calibration = judge.calibrate_thresholds(
        np.array([0.5, 0.6, 0.7, 0.8, 0.9]),
        np.linspace(0.0, 0.4, 101),
        positive_quantile=0.5,
        negative_quantile=0.95,
    )
    np.testing.assert_allclose(calibration["thresholds"], [0.38, 0.54, 0.7])
    path = tmp_path / "calibration.json"
    judge.save_calibration(path, calibration)
    assert judge.load_calibration(path, expect={})["thresholds"] == calibration["thresholds"]
    # Overlapping distributions collapse t2 = t3 = t4 to the midpoint.
    collapsed = judge.calibrate_thresholds(
        np.array([0.3]), np.array([0.5]), positive_quantile=0.5, negative_quantile=0.5
    )
    np.testing.assert_allclose(collapsed["thresholds"], [0.4, 0.4, 0.4])


def _encode(texts):
    """A toy encoder: 2-D unit vectors at angle len(text) / 10 radians."""
    angles = np.array([len(t) / 10 for t in texts])
    return np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)


def test_embedding_judge_grades_cosine_and_calibrates():
    calls = []

    def encode(texts):
        calls.append(list(texts))
        return _encode(texts)

    emb = judge.EmbeddingJudge(encode, [0.5, 0.8, 0.95], name="toy")
    # Query "abcd" (0.4 rad); chunks at 0.4, 0.9, 1.4 and 2.4 rad: cos 1, .878, .540, -.416.
    chunks = [{"text": "x" * n} for n in (4, 9, 14, 24)]
    assert emb.grade(["abcd"] * 4, chunks) == [4, 3, 2, 1]
    assert emb.grade(["abcd"], chunks[:1]) == [4]
    assert calls == [["abcd", "x" * 4, "x" * 9, "x" * 14, "x" * 24]]  # encoded once, cached
    queries = [{"text": "q" * 4, "doc_name": "A", "chunk_id": "A:0"}]
    pool = [
        {"id": "A:0", "doc_name": "A", "text": "y" * 4},
        {"id": "B:0", "doc_name": "B", "text": "y" * 30},
    ]
    calibration = mining.calibrate_embedding_judge(
        judge.EmbeddingJudge(_encode, [0, 0, 0], name="toy"),
        queries,
        pool,
        positive_quantile=0.5,
        negative_quantile=0.5,
        seed=0,
    )
    assert calibration["positive_mean"] == pytest.approx(1.0)
    assert calibration["negative_mean"] == pytest.approx(np.cos(2.6), abs=1e-6)


def test_calibration_of_another_judge_is_refused(tmp_path):
    """judge_calibration.json records the judge it calibrated; another judge refuses it."""
    path = tmp_path / "judge_calibration.json"
    made_by = {
        "judge_model": "/models/a",
        "judge_num_layers": None,
        "positive_quantile": 0.5,
        "negative_quantile": 0.95,
    }
    judge.save_calibration(path, {"thresholds": [0.1, 0.2, 0.3], **made_by})
    assert judge.load_calibration(path, expect=made_by)["thresholds"] == [0.1, 0.2, 0.3]
    with pytest.raises(ValueError, match="judge_num_layers=None.*judge_num_layers=6"):
        judge.load_calibration(path, expect={**made_by, "judge_num_layers": 6})
    with pytest.raises(ValueError, match="judge_model='/models/a'.*judge_model='/models/b'"):
        judge.load_calibration(path, expect={**made_by, "judge_model": "/models/b"})
    judge.save_calibration(path, {"thresholds": [0.1, 0.2, 0.3]})  # a file of unknown origin
    with pytest.raises(ValueError, match="judge_model=None"):
        judge.load_calibration(path, expect=made_by)
