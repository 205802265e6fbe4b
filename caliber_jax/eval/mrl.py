"""Matryoshka (MRL) truncation and quantization study on a retrieval task (LEAF Sec. 4.4).

Queries and corpus are encoded once; each variant then re-ranks the corpus and is scored with
`retrieval.retrieval_metrics`: `dim_<k>` truncates both sides to the first k dimensions and
re-normalises, `int8` scalar-quantizes both sides with per-dimension ranges calibrated on the
corpus and ranks by the integer dot product, `binary` keeps sign bits and ranks by Hamming
distance. Quantization is sentence-transformers' `quantize_embeddings`. No jax.
"""

from collections.abc import Mapping, Sequence

import numpy as np

from caliber_jax.eval import EncodeFn, encode_texts, retrieval

# Truncation dims tried besides the full one; those >= the model's dim are skipped.
DIMS = (1024, 768, 512, 256, 128, 64)


def truncate(vectors: np.ndarray, dim: int) -> np.ndarray:
    """First `dim` dimensions of `[n, D]` vectors, L2-normalised again (MRL)."""
    if vectors.ndim != 2 or not 1 <= dim <= vectors.shape[1]:
        raise ValueError(f"cannot truncate vectors of shape {vectors.shape} to dim={dim}")
    head = np.asarray(vectors[:, :dim], np.float32)
    norms = np.linalg.norm(head, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise ValueError(f"a vector is all zeros in its first {dim} dimensions")
    return head / norms


def _quantize(vectors: np.ndarray, precision: str, **kwargs) -> np.ndarray:
    # Imported here: sentence-transformers pulls in torch (seconds), only this study needs it.
    from sentence_transformers import quantize_embeddings

    return quantize_embeddings(np.asarray(vectors, np.float32), precision=precision, **kwargs)


def quantize_int8(vectors: np.ndarray, calibration: np.ndarray) -> np.ndarray:
    """`[n, D]` float -> `[n, D]` int8 codes, each dimension's [min, max] over `calibration`
    mapped onto 256 buckets (values outside are clipped)."""
    return _quantize(vectors, "int8", calibration_embeddings=np.asarray(calibration, np.float32))


def quantize_binary(vectors: np.ndarray) -> np.ndarray:
    """`[n, D]` float -> `[n, ceil(D / 8)]` uint8: the bits `x > 0`, packed."""
    return _quantize(vectors, "ubinary")


def hamming_distances(query_bits: np.ndarray, doc_bits: np.ndarray) -> np.ndarray:
    """`[Q, B]` x `[N, B]` packed bits -> `[Q, N]` int32 Hamming distances."""
    if query_bits.dtype != np.uint8 or doc_bits.dtype != np.uint8:
        raise ValueError(f"packed bits must be uint8, got {query_bits.dtype}, {doc_bits.dtype}")
    if query_bits.shape[1:] != doc_bits.shape[1:]:
        raise ValueError(f"query bits {query_bits.shape} and doc bits {doc_bits.shape} differ")
    # One query at a time keeps the XOR temporary at [N, B] bytes.
    distances = np.zeros((query_bits.shape[0], doc_bits.shape[0]), np.int32)
    for row, bits in enumerate(query_bits):
        distances[row] = np.bitwise_count(np.bitwise_xor(bits, doc_bits)).sum(axis=-1)
    return distances


def variant_runs(
    query_vecs: np.ndarray,
    doc_vecs: np.ndarray,
    query_ids: Sequence[str],
    doc_ids: Sequence[str],
    *,
    dims: Sequence[int],
    top_k: int,
) -> dict[str, dict[str, dict[str, float]]]:
    """Runs of every variant from `[Q, D]` query and `[N, D]` doc vectors (unit length).

    Returns:
      {"dim_<D>": run, "dim_<k>": run for each k in dims below D, "int8": run, "binary": run};
      int8 and binary use all D dimensions. Scores: cosine, integer dot product of the int8
      codes, and minus the Hamming distance.
    """
    full = query_vecs.shape[1]
    variants = {}
    for dim in [full, *sorted({d for d in dims if d < full}, reverse=True)]:
        query_part, doc_part = truncate(query_vecs, dim), truncate(doc_vecs, dim)
        variants[f"dim_{dim}"] = retrieval.rank_run(
            query_ids, doc_ids, lambda rows, q=query_part, d=doc_part: q[rows] @ d.T, top_k
        )
    # Both sides use the corpus ranges, as sentence-transformers' int8 search does.
    # float64 holds the integer dot products (|sum| <= 128^2 * D) exactly and uses BLAS.
    query_codes = quantize_int8(query_vecs, doc_vecs).astype(np.float64)
    doc_codes = quantize_int8(doc_vecs, doc_vecs).astype(np.float64)
    variants["int8"] = retrieval.rank_run(
        query_ids, doc_ids, lambda rows: query_codes[rows] @ doc_codes.T, top_k
    )
    query_bits, doc_bits = quantize_binary(query_vecs), quantize_binary(doc_vecs)
    variants["binary"] = retrieval.rank_run(
        query_ids, doc_ids, lambda rows: -hamming_distances(query_bits[rows], doc_bits), top_k
    )
    return variants


def evaluate(
    encode_fn: EncodeFn,
    *,
    queries: Mapping[str, str],
    corpus: Mapping[str, str],
    qrels: Mapping[str, Mapping[str, int]],
    query_prompt: str | None = None,
    dims: Sequence[int] = DIMS,
    ks: Sequence[int] = (10, 100),
) -> dict[str, dict[str, float]]:
    """Retrieval metrics at each truncation dim, with int8 codes and with binary codes.

    Args:
      encode_fn: `texts -> [n, D]` L2-normalised vectors.
      queries: {qid: text}.
      corpus: {doc id: text}.
      qrels: {qid: {doc id: grade}}.
      query_prompt: task instruction for queries, as in `retrieval.evaluate`.
      dims: truncation dims; those >= D are skipped and D itself is always included.
      ks: metric cutoffs.

    Returns:
      {"dim_<D>": metrics, "dim_<k>": metrics, ..., "int8": metrics, "binary": metrics}, each
      as `retrieval.retrieval_metrics` returns them, dims in decreasing order.
    """
    query_ids, doc_ids = list(queries), list(corpus)
    texts = [
        retrieval.format_query(queries[q], query_prompt) if query_prompt else queries[q]
        for q in query_ids
    ]
    query_vecs = encode_texts(encode_fn, texts, "queries")
    doc_vecs = encode_texts(encode_fn, [corpus[d] for d in doc_ids], "corpus")
    runs = variant_runs(query_vecs, doc_vecs, query_ids, doc_ids, dims=dims, top_k=max(ks))
    return {name: retrieval.retrieval_metrics(qrels, run, ks) for name, run in runs.items()}
