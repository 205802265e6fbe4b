"""Step 4 of paper 001: contrastive triples from judged (query, chunk, grade) records.

A triple (q, c_rel, c_irrel) pairs two chunks of the *same document* judged for the same query,
c_rel with grade > 3 and c_irrel with grade < 3. Triples the student already orders with the
margin ("already correct") are kept in a set ratio per (query, document) against catastrophic
forgetting; repeats of earlier iterations' triples are dropped before the ratio is set. No jax.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

POSITIVE_ABOVE = 3  # grade > 3: c_rel
NEGATIVE_BELOW = 3  # grade < 3: c_irrel


def extract_triples(judged: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """All same-document (positive, negative) pairs per query.

    Args:
      judged: records with `query_id`, `query`, `doc_name`, `chunk_id`, `grade` (int or None:
        an invalid judgment, never used) and `score` (the student's cosine at mining time).

    Returns:
      Triples {"query_id", "query", "doc_name", "pos_id", "neg_id", "pos_score", "neg_score"},
      ordered by first appearance of the query/document, then positive, then negative; a chunk
      judged twice for one query counts once (its first judgment).
    """
    groups: dict[tuple[str, str], dict[str, Mapping[str, Any]]] = {}
    for record in judged:
        group = groups.setdefault((record["query_id"], record["doc_name"]), {})
        group.setdefault(record["chunk_id"], record)
    triples = []
    for (query_id, doc_name), chunks in groups.items():
        graded = [r for r in chunks.values() if r.get("grade") is not None]
        positives = [r for r in graded if r["grade"] > POSITIVE_ABOVE]
        negatives = [r for r in graded if r["grade"] < NEGATIVE_BELOW]
        for pos in positives:
            for neg in negatives:
                triples.append(
                    {
                        "query_id": query_id,
                        "query": pos["query"],
                        "doc_name": doc_name,
                        "pos_id": pos["chunk_id"],
                        "neg_id": neg["chunk_id"],
                        "pos_score": pos.get("score"),
                        "neg_score": neg.get("score"),
                    }
                )
    return triples


def is_correct(pos_score: float, neg_score: float, *, margin: float, distance: str) -> bool:
    """Whether the student already satisfies d(q, c_rel) + margin <= d(q, c_irrel) (zero loss).

    Scores are cosines of unit vectors; d is 1 - cos or sqrt(2 - 2 cos) as in the loss.
    """
    if distance == "cosine":
        d_pos, d_neg = 1.0 - pos_score, 1.0 - neg_score
    elif distance == "euclidean":
        d_pos, d_neg = (float(np.sqrt(max(0.0, 2.0 - 2.0 * s))) for s in (pos_score, neg_score))
    else:
        raise ValueError(f"distance={distance!r}; expected 'cosine' or 'euclidean'")
    return d_pos + margin <= d_neg


def select_triples(
    triples: Sequence[Mapping[str, Any]],
    *,
    margin: float,
    distance: str,
    correct_ratio: float,
    max_per_group: int,
    seed: int,
) -> list[dict[str, Any]]:
    """Per (query, document): the hard triples and `correct_ratio` already-correct ones per hard
    one, drawn from the same group.

    Each triple gets `"correct"`. Per group at most `max_per_group` hard triples are kept (a
    seeded sample), so one query with many judged chunks cannot dominate, then
    `floor(correct_ratio * kept hard + 1/2)` already-correct triples of that group (all of them
    if it has fewer; none at ratio 0). Pass deduplicated triples (`deduplicate`), so the ratio
    holds for what is kept. Output keeps the input order.
    """
    rng = np.random.default_rng(seed)
    flagged = [
        dict(
            t, correct=is_correct(t["pos_score"], t["neg_score"], margin=margin, distance=distance)
        )
        for t in triples
    ]
    groups: dict[tuple[str, str], tuple[list[int], list[int]]] = {}
    for row, triple in enumerate(flagged):
        hard, correct = groups.setdefault((triple["query_id"], triple["doc_name"]), ([], []))
        (correct if triple["correct"] else hard).append(row)
    keep = set()
    for hard, correct in groups.values():
        if len(hard) > max_per_group:
            hard = rng.choice(hard, max_per_group, replace=False).tolist()
        keep.update(hard)
        num_correct = min(len(correct), int(np.floor(correct_ratio * len(hard) + 0.5)))
        if num_correct:
            keep.update(rng.choice(correct, num_correct, replace=False).tolist())
    return [flagged[row] for row in sorted(keep)]


def triple_key(triple: Mapping[str, Any]) -> tuple[str, str, str]:
    """Identity of a triple for deduplication: (query text, c_rel id, c_irrel id)."""
    return (triple["query"], triple["pos_id"], triple["neg_id"])


def deduplicate(
    triples: Iterable[Mapping[str, Any]], seen: set[tuple[str, str, str]]
) -> list[dict[str, Any]]:
    """Drops triples whose key is in `seen` or repeats within `triples` (`seen` is not
    changed)."""
    out, keys = [], set(seen)
    for triple in triples:
        key = triple_key(triple)
        if key not in keys:
            keys.add(key)
            out.append(dict(triple))
    return out
