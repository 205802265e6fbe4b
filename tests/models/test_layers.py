"""caliber_jax/models/layers.py: packed rows as cuDNN reads them (`packed_segments`)."""

import jax.numpy as jnp
import numpy as np
import pytest

from caliber_jax.models import layers


def _runs(row: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each run of equal ids in `row`, a plain-Python reference."""
    runs, start = [], 0
    for i in range(1, len(row) + 1):
        if i == len(row) or row[i] != row[start]:
            runs.append((start, i - start))
            start = i
    return runs


def test_packed_segments_are_the_runs_of_each_row_padded_with_minus_one():
    # Row 0: three sequences then padding (-1); row 1: one sequence filling the row; row 2:
    # two sequences, no padding. Slot ids are global, as the packer writes them.
    ids = np.array([[0, 0, 0, 1, 1, 2, -1, -1], [3, 3, 3, 3, 3, 3, 3, 3], [4, 4, 4, 4, 5, 5, 5, 5]])
    segments = layers.packed_segments(jnp.asarray(ids), max_segments=4)
    assert segments.seqlens_bm.shape == (3, 4) and segments.offsets_bm.shape == (3, 5)
    np.testing.assert_array_equal(
        segments.seqlens_bm, [[3, 2, 1, 2], [8, -1, -1, -1], [4, 4, -1, -1]]
    )
    np.testing.assert_array_equal(
        segments.offsets_bm, [[0, 3, 5, 6, -1], [0, -1, -1, -1, -1], [0, 4, -1, -1, -1]]
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_packed_segments_match_a_reference_on_random_packings(seed):
    rng = np.random.default_rng(seed)
    t = 64
    rows = []
    for r in range(6):
        row, slot = [], 100 * r
        while len(row) < t - 2 and rng.random() < 0.85:
            length = int(rng.integers(1, 20))
            row += [slot] * min(length, t - len(row))
            slot += 1
        rows.append(row + [-1] * (t - len(row)))
    ids = np.array(rows)
    segments = layers.packed_segments(jnp.asarray(ids), max_segments=t)
    for b, row in enumerate(ids):
        runs = _runs(row)
        k = len(runs)
        np.testing.assert_array_equal(segments.seqlens_bm[b, :k], [n for _, n in runs])
        np.testing.assert_array_equal(segments.offsets_bm[b, :k], [s for s, _ in runs])
        assert (np.asarray(segments.seqlens_bm[b, k:]) == -1).all()
        assert (np.asarray(segments.offsets_bm[b, k:]) == -1).all()
        assert sum(n for _, n in runs) == t  # every token, padding included, is in one run


def test_packed_rows_go_to_cudnn_as_segments_and_to_xla_as_a_mask():
    ids = jnp.asarray([[0, 0, 1, -1]])
    mask_bt = jnp.ones((1, 4), jnp.int32)
    xla_mask, positions = layers.packed_or_padded(
        mask_bt, ids, None, default_positions_fn=layers.positions_from_mask
    )
    assert xla_mask.shape == (1, 4, 4) and positions.shape == (1, 4)
    segments, _ = layers.packed_or_padded(
        mask_bt, ids, None, default_positions_fn=layers.positions_from_mask,
        implementation="cudnn",
    )  # fmt: skip
    assert isinstance(segments, layers.PackedSegments)
    np.testing.assert_array_equal(segments.seqlens_bm, [[2, 1, 1, -1]])
    padded, _ = layers.packed_or_padded(
        mask_bt, None, None, default_positions_fn=layers.positions_from_mask,
        implementation="cudnn",
    )  # fmt: skip
    assert padded is mask_bt  # right-padded rows keep the key mask (jax.nn's cuDNN call)
