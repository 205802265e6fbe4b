"""The padding ladder shared by the train loader and the encoders."""

import numpy as np
import pytest

from caliber_jax.data import padding


def test_ladder_hand_computed():
    assert padding.bucket_lengths(512, multiple=16, growth=1.5) == (
        16, 32, 48, 80, 128, 192, 288, 432, 512,
    )  # fmt: skip
    assert padding.bucket_lengths(512, multiple=32, growth=1.5) == (32, 64, 96, 160, 256, 384, 512)
    assert padding.bucket_lengths(64, multiple=16, growth=1.0) == (16, 32, 48, 64)
    assert padding.bucket_lengths(100, multiple=16, growth=1.0)[-2:] == (96, 100)
    assert padding.bucket_lengths(8, multiple=16, growth=1.5) == (8,)


def test_bucket_for_is_the_smallest_rung_that_fits():
    ladder = (16, 32, 48, 80)
    assert [padding.bucket_for(n, ladder) for n in (1, 16, 17, 48, 49, 80, 500)] == [
        16, 16, 32, 48, 80, 80, 80,
    ]  # fmt: skip


def test_every_length_gets_a_fitting_rung_and_rungs_are_few():
    ladder = padding.bucket_lengths(512, multiple=32, growth=1.5)
    for length in range(1, 513):
        rung = padding.bucket_for(length, ladder)
        assert length <= rung <= 512 and rung < max(2 * length, 64)
    assert len(ladder) <= 8


def test_pad_rows():
    ids, mask = padding.pad_rows([[5, 6, 7], [8]], rows=3, length=4, pad_id=0)
    np.testing.assert_array_equal(ids, [[5, 6, 7, 0], [8, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    with pytest.raises(ValueError, match="row 0: 5 tokens do not fit in length 4"):
        padding.pad_rows([[1] * 5], rows=1, length=4, pad_id=0)
    with pytest.raises(ValueError, match="growth >= 1"):
        padding.bucket_lengths(64, multiple=16, growth=0.5)


def test_pack_bins_first_fit_decreasing():
    assert padding.pack_bins([5, 3, 4, 2, 6], capacity=8) == [[4, 3], [0, 1], [2]]
    assert padding.pack_bins([], capacity=8) == []
    with pytest.raises(ValueError, match="sequence 1: 9 tokens do not fit in a row of 8"):
        padding.pack_bins([1, 9], capacity=8)


def test_pack_rows_places_every_sequence():
    ids, slots, positions = padding.pack_rows(
        [[7, 8, 9], [4, 5], [1, 2, 3, 4, 5, 6]], [10, 11, 12], rows=3, length=8, pad_id=0,
        pad_slot=99,
    )  # fmt: skip
    np.testing.assert_array_equal(ids[0], [1, 2, 3, 4, 5, 6, 4, 5])
    np.testing.assert_array_equal(slots[0], [12] * 6 + [11] * 2)
    np.testing.assert_array_equal(positions[0], [0, 1, 2, 3, 4, 5, 0, 1])
    np.testing.assert_array_equal(ids[1], [7, 8, 9, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(slots[1], [10] * 3 + [99] * 5)
    assert np.all(slots[2] == 99) and np.all(ids[2] == 0)
    with pytest.raises(ValueError, match="need 2 packed rows, above 1"):
        padding.pack_rows([[1] * 5, [2] * 5], [0, 1], rows=1, length=8, pad_id=0, pad_slot=9)
