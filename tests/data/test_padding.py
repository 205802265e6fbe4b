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


def test_row_ladder_pads_least_and_ends_with_the_worst_case():
    # 6 batches need 3 rows, 3 need 5, 1 needs 7; two rungs: 3 and 7 pad 3 x 2 = 6 rows, 5 and
    # 7 pad 6 x 2 = 12; 3 and 5 cannot hold 7, so the top rung is the sample's most. Then the
    # fallback, 16 rows, for a batch outside the sample that needs more than 7.
    assert padding.row_ladder([3] * 6 + [5] * 3 + [7], rungs=2, worst=16, multiple=1) == (3, 7, 16)
    assert padding.row_ladder([3] * 4 + [5] * 6 + [7], rungs=2, worst=16, multiple=1) == (5, 7, 16)
    assert padding.row_ladder([3] * 4 + [5] * 6 + [7], rungs=3, worst=16, multiple=1) == (
        3, 5, 7, 16,
    )  # fmt: skip
    # rounded up to the multiple; a sample reaching the worst case needs no fallback
    assert padding.row_ladder([3, 5, 16], rungs=3, worst=15, multiple=4) == (4, 8, 16)
    assert padding.row_ladder([3, 5, 16], rungs=2, worst=15, multiple=4) == (8, 16)
    assert padding.row_ladder([1, 2], rungs=1, worst=10, multiple=2) == (2, 10)
    assert padding.row_ladder([2, 2, 2], rungs=3, worst=10, multiple=1) == (2, 10)


def test_row_ladder_dynamic_programme_matches_brute_force():
    import itertools

    rng = np.random.default_rng(0)
    for _ in range(20):
        needed = rng.integers(1, 20, size=30).tolist()
        ladder = padding.row_ladder(needed, rungs=2, worst=40, multiple=1)
        assert len(ladder) == 3 and ladder[-1] == 40 and max(needed) in ladder

        def padded(rungs, needed=needed):
            return sum(padding.bucket_for(n, rungs) - n for n in needed)

        best = min(
            padded((*pair, 40))
            for pair in itertools.combinations(sorted(set(needed)), 2)
            if max(needed) in pair
        )
        assert padded(ladder) == best


def test_row_ladder_checks():
    with pytest.raises(ValueError, match="rungs"):
        padding.row_ladder([1], rungs=0, worst=4, multiple=1)


def test_central_first_order_leads_with_batches_of_about_the_most_common_size():
    sizes = [13, 11, 17, 11, 13, 11, 17, 11]
    order, leaders = padding.central_first_order(sizes, 3, ladder=(11, 13, 17))
    # The first three 11s (positions 1, 3, 5), then everything else in its order.
    np.testing.assert_array_equal(order, [1, 3, 5, 0, 2, 4, 6, 7])
    assert leaders == 3 and [sizes[i] for i in order[:3]] == [11, 11, 11]
    # More steps than the common rung has batches: all of them lead, and no other.
    order, leaders = padding.central_first_order(sizes, 9, ladder=(11, 13, 17))
    np.testing.assert_array_equal(order, [1, 3, 5, 7, 0, 2, 4, 6])
    assert leaders == 4
    # A rung holds several sizes: the leaders are its batches closest to its most common size,
    # the smaller of two as close first (9 before 13, both in rung 13); 15 is another rung's.
    sizes = [13, 11, 9, 11, 13, 11, 15, 15]
    order, leaders = padding.central_first_order(sizes, 4, ladder=(13, 15))
    np.testing.assert_array_equal(order, [1, 2, 3, 5, 0, 4, 6, 7])
    assert leaders == 4
    order, leaders = padding.central_first_order(sizes, 9, ladder=(13, 15))
    np.testing.assert_array_equal(order, [0, 1, 2, 3, 4, 5, 6, 7])
    assert leaders == 6
    # A tie goes to the rung met first; 0 steps keep the order.
    assert padding.central_first_order([2, 1, 1, 2], 1, ladder=(1, 2))[0].tolist() == [0, 1, 2, 3]
    assert padding.central_first_order([2, 1, 1, 2], 2, ladder=(1, 2))[0].tolist() == [0, 3, 1, 2]
    order, leaders = padding.central_first_order(sizes, 0, ladder=(13, 15))
    np.testing.assert_array_equal(order, np.arange(8))
    assert leaders == 0
    with pytest.raises(ValueError, match="steps=-1"):
        padding.central_first_order(sizes, -1, ladder=(13, 15))
