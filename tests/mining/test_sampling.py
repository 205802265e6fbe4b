"""Step 3a: top k plus 2k chunks drawn by rank with weight exp(-omega (r - k))."""

import numpy as np

from caliber_jax.mining import sampling


def test_first_draw_follows_the_rank_weights():
    n, k, omega = 30, 5, 0.2
    rng = np.random.default_rng(0)
    draws = np.array([sampling.sample_ranks(n, k, omega, 1, rng)[0] for _ in range(40_000)])
    assert draws.min() >= k
    frequencies = np.bincount(draws - k, minlength=n - k) / draws.size
    expected = np.exp(-omega * np.arange(n - k))
    expected /= expected.sum()
    np.testing.assert_allclose(sampling.rank_probabilities(n, k, omega), expected)
    # 40k draws: the standard error of p = 0.18 is 0.002; allow 4 of them.
    np.testing.assert_allclose(frequencies, expected, atol=0.008)


def test_second_draw_is_weighted_sampling_without_replacement():
    """P(second = r2 | first = r1) = w(r2) / (1 - w(r1)): checked for the first rank."""
    n, k, omega = 12, 2, 0.5
    p = sampling.rank_probabilities(n, k, omega)
    rng = np.random.default_rng(1)
    pairs = np.array([sampling.sample_ranks(n, k, omega, 2, rng) for _ in range(40_000)])
    assert np.all(pairs[:, 0] != pairs[:, 1])
    given_first = pairs[pairs[:, 0] == k][:, 1]
    observed = np.bincount(given_first - k, minlength=n - k) / given_first.size
    expected = p / (1 - p[0])
    expected[0] = 0.0
    np.testing.assert_allclose(observed, expected, atol=0.015)


def test_select_candidates_top_k_plus_2k_distinct():
    ids = [f"c{i}" for i in range(40)]
    picked = sampling.select_candidates(ids, k=5, omega=0.1, rng=np.random.default_rng(0))
    assert [p[0] for p in picked[:5]] == ids[:5] and all(p[2] for p in picked[:5])
    assert len(picked) == 15 and len({p[0] for p in picked}) == 15
    assert all(p[1] >= 5 and not p[2] and ids[p[1]] == p[0] for p in picked[5:])
    # Short documents: all that is left, no error.
    short = sampling.select_candidates(ids[:7], k=5, omega=0.1, rng=np.random.default_rng(0))
    assert sorted(p[0] for p in short) == sorted(ids[:7])
    # omega = 0 is uniform.
    np.testing.assert_allclose(sampling.rank_probabilities(10, 4, 0.0), np.full(6, 1 / 6))
