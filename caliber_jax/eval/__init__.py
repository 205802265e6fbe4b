"""Evaluations, one per module (`retrieval`, `numgap`), each `evaluate(encode_fn, ...)`.

An `encode_fn(texts: list[str]) -> np.ndarray [n, D]` returns L2-normalised vectors; this file
holds the check every evaluation applies to its output. No jax.
"""

from collections.abc import Callable, Sequence

import numpy as np

EncodeFn = Callable[[list[str]], np.ndarray]
# Where a task's results carry each query's (record's) values for paired tests (`significance`).
PER_QUERY = "per_query"


def encode_texts(encode_fn: EncodeFn, texts: Sequence[str], what: str) -> np.ndarray:
    """Calls `encode_fn` and checks it returned `[len(texts), D]` finite unit vectors.

    Args:
      encode_fn: the model's encoder.
      texts: texts to encode.
      what: name used in error messages ("queries", "corpus").

    Returns:
      `[n, D]` float32 array.
    """
    vectors = np.asarray(encode_fn(list(texts)), dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(texts):
        raise ValueError(f"encode_fn gave shape {vectors.shape} for {len(texts)} {what}")
    if not np.all(np.isfinite(vectors)):
        raise ValueError(f"encode_fn gave non-finite values for {what}")
    norms = np.linalg.norm(vectors, axis=1)
    if len(norms) and np.max(np.abs(norms - 1.0)) > 1e-2:
        raise ValueError(
            f"encode_fn must return L2-normalised vectors; {what} norms span "
            f"[{norms.min():.4f}, {norms.max():.4f}]"
        )
    return vectors
