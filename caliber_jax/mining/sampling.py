"""Step 3a of paper 001: which chunks of a document go to the judge.

Per (query, document): the top-k chunks under the current student, plus 2k chunks drawn without
replacement from the rest, rank r (0-based, r >= k) with unnormalised weight exp(-omega (r - k)).
No jax.
"""

import numpy as np


def rank_probabilities(num_chunks: int, k: int, omega: float) -> np.ndarray:
    """`[max(0, n - k)]` probabilities of ranks k..n-1: exp(-omega (r - k)), normalised to 1."""
    if k < 0 or omega < 0:
        raise ValueError(f"need k >= 0 and omega >= 0, got {k=} {omega=}")
    weights = np.exp(-omega * np.arange(max(0, num_chunks - k), dtype=np.float64))
    return weights / weights.sum() if weights.size else weights


def sample_ranks(
    num_chunks: int, k: int, omega: float, num_samples: int, rng: np.random.Generator
) -> np.ndarray:
    """`min(num_samples, n - k)` distinct ranks >= k, drawn without replacement by weight.

    Gumbel top-m (Efraimidis-Spirakis): the first draw is rank r with probability
    `rank_probabilities(...)[r - k]`, each next draw the same among the ranks still left, exactly
    as sequential weighted sampling without replacement. Returned in draw order.
    """
    probabilities = rank_probabilities(num_chunks, k, omega)
    count = min(num_samples, probabilities.size)
    if count <= 0:
        return np.zeros((0,), np.int64)
    keys = np.log(probabilities) + rng.gumbel(size=probabilities.size)
    return k + np.argsort(-keys, kind="stable")[:count].astype(np.int64)


def select_candidates(
    ranked_chunk_ids: list[str], *, k: int, omega: float, rng: np.random.Generator
) -> list[tuple[str, int, bool]]:
    """C_d(q, i): the top k chunk ids plus 2k sampled by rank, as (chunk id, rank, in top k).

    Args:
      ranked_chunk_ids: the document's chunk ids, best first under the current student.
      k: chunks kept from the top (the RAG context size; the paper's k = 5).
      omega: decay of the rank weights (0: uniform over the rest).
      rng: the draw's generator.
    """
    top = [(chunk_id, rank, True) for rank, chunk_id in enumerate(ranked_chunk_ids[:k])]
    ranks = sample_ranks(len(ranked_chunk_ids), k, omega, 2 * k, rng)
    return top + [(ranked_chunk_ids[r], int(r), False) for r in ranks]
