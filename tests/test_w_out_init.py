"""W_out's least-squares start: the ridge solution on hand-computed cases, the fit's report, I/O."""

import numpy as np
import pytest

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
    # The features are unit rows, the targets their normalised images: W = true_kernel up to the
    # per-row scale, which normalisation removes, so held-out rows are predicted almost exactly.
    tensors, report = w_out_init.fit(
        lambda batch: table[[int(t) for t in batch]], texts, targets, ridge=0.0
    )
    assert tensors["dense.kernel"].shape == (8, 12)
    np.testing.assert_array_equal(tensors["dense.bias"], np.zeros(12, np.float32))
    assert report["rows"] == 50 and report["heldout_rows"] == 5
    assert report["heldout_cos"] > 0.95 and report["train_cos"] > 0.95
    # Noise targets: no map explains held-out rows.
    noise = rng.normal(size=(50, 12))
    _, bad = w_out_init.fit(lambda batch: table[[int(t) for t in batch]], texts, noise, ridge=0.0)
    assert bad["heldout_cos"] < 0.5


def test_fit_rejects_mismatched_rows():
    with pytest.raises(ValueError, match="3 texts but 2 targets"):
        w_out_init.fit(lambda batch: np.zeros((3, 2)), ["a", "b", "c"], np.zeros((2, 4)), ridge=0)


def test_save_load_round_trip_keeps_the_report(tmp_path):
    tensors = {"dense.kernel": np.arange(6, dtype=np.float32).reshape(2, 3),
               "dense.bias": np.zeros(3, np.float32)}  # fmt: skip
    report = {"rows": 10, "heldout_cos": 0.75}
    path = tmp_path / "sub" / w_out_init.FILE
    w_out_init.save(path, tensors, report)
    loaded = w_out_init.load(path)
    for name, value in tensors.items():
        np.testing.assert_array_equal(loaded[name], value)
    assert w_out_init.read_report(path) == report
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
