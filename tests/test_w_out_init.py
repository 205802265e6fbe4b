"""W_out's least-squares start: the ridge solution on hand-computed cases, the fit's report, I/O."""

import json

import numpy as np
import pytest
from safetensors import safe_open

from caliber_jax import w_out_init


def test_ridge_projection_recovers_an_exact_linear_map():
    features = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    kernel = np.array([[1.0, 2.0, 0.0], [0.0, 1.0, -1.0]])
    got = w_out_init.ridge_projection(features, features @ kernel, ridge=0.0)
    np.testing.assert_allclose(got, kernel, atol=1e-6)
    assert got.dtype == np.float32 and got.shape == (2, 3)


def test_ridge_projection_hand_value():
    # One feature: W = sum(f t) / (sum(f^2) + ridge * N) = (1*2 + 2*4) / (1 + 4 + 0.5 * 2) = 10 / 6.
    got = w_out_init.ridge_projection(np.array([[1.0], [2.0]]), np.array([[2.0], [4.0]]), 0.5)
    np.testing.assert_allclose(got, [[10.0 / 6.0]], rtol=1e-6)


def test_ridge_projection_rejects_bad_shapes_and_penalties():
    with pytest.raises(ValueError, match="same N"):
        w_out_init.ridge_projection(np.zeros((3, 2)), np.zeros((2, 4)), 0.0)
    with pytest.raises(ValueError, match="ridge must be >= 0"):
        w_out_init.ridge_projection(np.zeros((3, 2)), np.zeros((3, 4)), -1.0)


def test_mean_cosine_hand_value():
    features = np.array([[1.0, 0.0], [0.0, 1.0]])
    kernel = np.eye(2)
    targets = np.array([[2.0, 0.0], [1.0, 1.0]])  # cos 1 and cos 45 degrees
    assert w_out_init.mean_cosine(features, kernel, targets) == pytest.approx(
        (1.0 + np.sqrt(0.5)) / 2
    )


def test_fit_finds_the_map_and_scores_held_out_rows():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(50, 8)).astype(np.float32)
    table /= np.linalg.norm(table, axis=1, keepdims=True)
    true_kernel = rng.normal(size=(8, 12))
    targets = table @ true_kernel
    targets /= np.linalg.norm(targets, axis=1, keepdims=True)
    texts = [str(i) for i in range(50)]

    def encode_fn(batch):
        return table[[int(t) for t in batch]]

    # The features are unit rows, the targets their normalised images: W = true_kernel up to the
    # per-row scale, which normalisation removes, so held-out rows are predicted almost exactly.
    tensors, report = w_out_init.fit(encode_fn, texts, targets, heldout_rows=5, ridge=0.0)
    assert tensors["dense.kernel"].shape == (8, 12)
    np.testing.assert_array_equal(tensors["dense.bias"], np.zeros(12, np.float32))
    assert report["rows"] == 50 and report["heldout_rows"] == 5
    assert report["heldout_cos"] > 0.95 and report["train_cos"] > 0.95
    # The held-out rows score a fit that never saw them; the kernel kept is refitted on all rows.
    partial = w_out_init.ridge_projection(table[:45], targets[:45].astype(np.float32), 0.0)
    assert report["heldout_cos"] == pytest.approx(
        w_out_init.mean_cosine(table[45:], partial, targets[45:]), abs=1e-6
    )
    np.testing.assert_allclose(
        tensors["dense.kernel"],
        w_out_init.ridge_projection(table, targets.astype(np.float32), 0.0),
        atol=1e-6,
    )  # fmt: skip
    # Noise targets: no map explains held-out rows.
    noise = rng.normal(size=(50, 12))
    _, bad = w_out_init.fit(encode_fn, texts, noise, heldout_rows=5, ridge=0.0)
    assert bad["heldout_cos"] < 0.5


def test_split_rows_is_a_seeded_sample_of_the_whole_corpus():
    fitted, scored = w_out_init.split_rows(1000, fit_rows=100, seed=0)
    assert len(fitted) == 90 and len(scored) == 10
    assert not set(fitted) & set(scored)
    assert fitted.min() >= 0 and max(fitted.max(), scored.max()) < 1000
    assert list(fitted) == sorted(fitted) and list(scored) == sorted(scored)
    # Not the first rows: both halves of the corpus are drawn.
    assert 20 < np.sum(fitted >= 500) < 70 and 0 < np.sum(scored >= 500) < 10
    again = w_out_init.split_rows(1000, fit_rows=100, seed=0)
    np.testing.assert_array_equal(again[0], fitted)
    np.testing.assert_array_equal(again[1], scored)
    assert not np.array_equal(w_out_init.split_rows(1000, fit_rows=100, seed=1)[0], fitted)
    # A corpus smaller than fit_rows: all of it, a tenth to score.
    fitted, scored = w_out_init.split_rows(64, fit_rows=4096, seed=0)
    assert (len(fitted), len(scored)) == (58, 6)
    assert sorted([*fitted, *scored]) == list(range(64))
    with pytest.raises(ValueError, match="at least 2"):
        w_out_init.split_rows(1, fit_rows=10, seed=0)
    with pytest.raises(ValueError, match="fit_rows"):
        w_out_init.split_rows(10, fit_rows=1, seed=0)


def test_a_fit_on_the_sample_covers_filings_the_first_rows_miss():
    """A corpus in filing order: the first 100 passages (filing A) use feature dims 0-3 only,
    the next 100 (filing B) dims 4-7; one map sends both to the teacher. A fit on the first rows
    knows nothing of B (its vectors point nowhere); the seeded sample fits both."""
    rng = np.random.default_rng(1)
    table = np.zeros((200, 8), np.float32)
    table[:100, :4] = rng.normal(size=(100, 4))
    table[100:, 4:] = rng.normal(size=(100, 4))
    table /= np.linalg.norm(table, axis=1, keepdims=True)
    targets = table @ rng.normal(size=(8, 6))
    texts = [str(i) for i in range(200)]

    def encode_fn(batch):
        return table[[int(t) for t in batch]]

    def fit_rows(rows, heldout_rows):
        kernel = w_out_init.fit(
            encode_fn, [texts[i] for i in rows], targets[rows], heldout_rows=heldout_rows,
            ridge=1e-4,
        )[0]["dense.kernel"]  # fmt: skip
        return w_out_init.mean_cosine(table, kernel, targets)

    first = fit_rows(np.arange(44), heldout_rows=4)  # corpus order: filing A only
    fitted, scored = w_out_init.split_rows(200, fit_rows=44, seed=0)
    sample = fit_rows(np.concatenate([fitted, scored]), heldout_rows=len(scored))
    assert first < 0.6 and sample > 0.99, (first, sample)


def test_fit_rejects_mismatched_rows():
    with pytest.raises(ValueError, match="3 texts but 2 targets"):
        w_out_init.fit(
            lambda batch: np.zeros((3, 2)), ["a", "b", "c"], np.zeros((2, 4)), heldout_rows=1,
            ridge=0,
        )  # fmt: skip
    with pytest.raises(ValueError, match="heldout_rows"):
        w_out_init.fit(lambda batch: np.zeros((2, 2)), ["a", "b"], np.zeros((2, 4)),
                       heldout_rows=2, ridge=0)  # fmt: skip


def test_save_load_round_trip_keeps_the_report(tmp_path):
    tensors = {"dense.kernel": np.arange(6, dtype=np.float32).reshape(2, 3),
               "dense.bias": np.zeros(3, np.float32)}  # fmt: skip
    report = {"rows": 10, "heldout_cos": 0.75}
    path = tmp_path / "sub" / w_out_init.FILE
    w_out_init.save(path, tensors, report)
    loaded = w_out_init.load(path)
    for name, value in tensors.items():
        np.testing.assert_array_equal(loaded[name], value)
    # The report travels as safetensors metadata, readable by safetensors' own reader.
    with safe_open(path, framework="np") as opened:
        assert json.loads(opened.metadata()["report"]) == report
    assert [p.name for p in path.parent.iterdir()] == [w_out_init.FILE]  # no temp file left


def test_fit_once_fits_on_process_0_only_and_every_process_reads_its_file(tmp_path):
    """Two processes as threads meeting at a barrier: one fit, both get the saved bytes, and a
    process that gets there first waits for the file (it would fail to read it otherwise)."""
    import threading
    import time

    path = tmp_path / w_out_init.FILE
    calls = []
    meeting = threading.Barrier(2, timeout=30)
    tensors = {"dense.kernel": np.arange(6, dtype=np.float32).reshape(2, 3),
               "dense.bias": np.zeros(3, np.float32)}  # fmt: skip

    def fit_fn():
        calls.append(threading.get_ident())
        time.sleep(0.3)  # process 1 reaches the barrier long before the file exists
        return tensors, {"rows": 2}

    results = {}

    def process(index):
        results[index] = w_out_init.fit_once(path, fit_fn, process_index=index,
                                             barrier=meeting.wait)  # fmt: skip

    threads = [threading.Thread(target=process, args=(i,)) for i in (1, 0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert results[0][1] == {"rows": 2} and results[1][1] is None
    for index in (0, 1):
        for name, value in tensors.items():
            np.testing.assert_array_equal(results[index][0][name], value)
    assert w_out_init.digest(results[0][0]) == w_out_init.digest(results[1][0])
    # Resumed: the file is there, nobody fits, everybody still meets at the barrier.
    again = w_out_init.fit_once(path, lambda: pytest.fail("refitted"), process_index=0,
                                barrier=lambda: calls.append("barrier"))  # fmt: skip
    assert again[1] is None and calls[-1] == "barrier"
    assert w_out_init.digest(again[0]) == w_out_init.digest(tensors)
