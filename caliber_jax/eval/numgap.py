"""NumGap (paper Sec. 4): does a numeric perturbation break cosine more than a topical distractor.

NumGap-D = mean 1[s_p < s_d] and NumGap-M = mean(s_d - s_p), with s_p = cos(x, pi(x)) and
s_d = cos(x, x_dist), overall and per perturbation category. No jax.
"""

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from caliber_jax.data import corpus
from caliber_jax.eval import PER_QUERY, EncodeFn, encode_texts

FIELDS = ("category", "anchor", "perturbed", "distractor")


def _row_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.sum(a * b, axis=1) / np.maximum(norms, 1e-12)


def record_gaps(
    anchor_vecs: np.ndarray, pert_vecs: np.ndarray, dist_vecs: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each record's NumGap outcome: `(1[s_p < s_d], s_d - s_p)`, two `[N]` arrays (bool, float64).

    Cosines are computed in float64 from the vectors as given (divided by their norms).
    """
    if not anchor_vecs.shape == pert_vecs.shape == dist_vecs.shape or anchor_vecs.ndim != 2:
        raise ValueError(
            f"expected three [N, D] arrays, got {anchor_vecs.shape}, {pert_vecs.shape}, "
            f"{dist_vecs.shape}"
        )
    if anchor_vecs.shape[0] == 0:
        raise ValueError("NumGap needs at least one record")
    s_p = _row_cosine(anchor_vecs, pert_vecs)
    s_d = _row_cosine(anchor_vecs, dist_vecs)
    return s_p < s_d, s_d - s_p


def numgap_scores(
    anchor_vecs: np.ndarray, pert_vecs: np.ndarray, dist_vecs: np.ndarray
) -> tuple[float, float]:
    """NumGap-D and NumGap-M of `[N, D]` anchor, perturbation and distractor vectors.

    Returns:
      `(D, M)`: D = mean 1[s_p < s_d] (strict; random = 0.5), M = mean(s_d - s_p).
    """
    hits, gaps = record_gaps(anchor_vecs, pert_vecs, dist_vecs)
    return float(np.mean(hits)), float(np.mean(gaps))


def load_numgap(path: str | Path) -> list[dict[str, str]]:
    """Reads NumGap JSONL: one record per line with non-empty string fields FIELDS.

    Extra fields are kept; blank lines are skipped. A bad record raises ValueError naming
    `path:line` and the field.
    """
    records = []
    for line_number, record in corpus.iter_jsonl(path):
        for field in FIELDS:
            value = record.get(field)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(
                    f"{path}:{line_number}: field {field!r} must be a non-empty string"
                )
        records.append(record)
    if not records:
        raise ValueError(f"{path}: no records")
    return records


def record_id(index: int, record: dict[str, str]) -> str:
    """`<position>:<hash of the three texts>`: unique within a file, and two results files scored
    on different NumGap files do not share ids (a paired test of them is refused)."""
    texts = "\x00".join(record[field] for field in FIELDS[1:])
    return f"{index}:{hashlib.sha1(texts.encode()).hexdigest()[:8]}"


def evaluate(
    encode_fn: EncodeFn, records: Sequence[dict[str, str]], *, per_record: bool = False
) -> dict[str, dict]:
    """NumGap-D/M overall and per category; each unique text is encoded once.

    Args:
      encode_fn: `texts -> [n, D]` vectors.
      records: NumGap records (`load_numgap`).
      per_record: also return each record's outcome under "per_query" (paired tests,
        `significance`): {"D": {id: 0 | 1}, "M": {id: s_d - s_p (6 decimals)}} (`record_id`).

    Returns:
      {"overall": {"D", "M", "n"}, "<category>": {"D", "M", "n"}, ...}, categories sorted.
    """
    if not records:
        raise ValueError("NumGap needs at least one record")
    texts = list(dict.fromkeys(r[field] for r in records for field in FIELDS[1:]))
    vectors = encode_texts(encode_fn, texts, "NumGap texts")
    row_of = {text: row for row, text in enumerate(texts)}
    anchor, pert, dist = (vectors[[row_of[r[field]] for r in records]] for field in FIELDS[1:])
    hits, gaps = record_gaps(anchor, pert, dist)

    def scores(rows: np.ndarray) -> dict[str, float]:
        return {"D": float(np.mean(hits[rows])), "M": float(np.mean(gaps[rows])), "n": len(rows)}

    results: dict[str, dict] = {"overall": scores(np.arange(len(records)))}
    categories = np.array([r["category"] for r in records])
    for category in sorted(set(categories)):
        if category == "overall":
            raise ValueError("a NumGap category may not be called 'overall'")
        results[str(category)] = scores(np.flatnonzero(categories == category))
    if per_record:
        ids = [record_id(index, r) for index, r in enumerate(records)]
        results[PER_QUERY] = {
            "D": {i: int(hit) for i, hit in zip(ids, hits, strict=True)},
            "M": {i: round(float(gap), 6) for i, gap in zip(ids, gaps, strict=True)},
        }
    return results
