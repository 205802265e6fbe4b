"""NumGap construction (paper section 4, Appendix D.1, D.4, D.5).

A record pairs an anchor passage with one numeric perturbation of it and a BM25 distractor: a
topical neighbour from the same corpus whose numeric tokens barely overlap the anchor's.
"""

import os
import random
from collections.abc import Mapping, Sequence
from typing import Any

import bm25s
import numpy as np

from caliber_jax import paths
from caliber_jax.data import corpus, perturb

RECORD_FIELDS = ("category", "anchor", "perturbed", "distractor", "anchor_id", "distractor_id")
SPLITS = ("dev", "test")
# Released v1 sizes (Appendix D.5); period got 26 dev records because it rarely fired there.
PAPER_QUOTAS_TEST: Mapping[str, int] = {"magnitude": 500, "polarity": 500, "unit": 300}
PAPER_QUOTAS_DEV: Mapping[str, int] = {"magnitude": 125, "polarity": 125, "unit": 75, "period": 26}
_SENTENCE_TERMINATOR_CHARS = ".!?"
# Appendix D.1 anchor filter.
ANCHOR_MIN_CHARS = 200
ANCHOR_MAX_CHARS = 1200
ANCHOR_MIN_NUMERIC_TOKENS = 2


def is_eligible(text: str, *, min_chars: int, max_chars: int, min_numeric_tokens: int) -> bool:
    """Appendix D.1 filter: length bounds, enough numeric tokens, a sentence terminator."""
    return (
        min_chars <= len(text) <= max_chars
        and any(char in text for char in _SENTENCE_TERMINATOR_CHARS)
        and len(perturb.numeric_spans(text)) >= min_numeric_tokens
    )


def numeric_tokens(text: str) -> set[str]:
    """The set of NUM_RE token strings in `text`."""
    return {text[start:end] for start, end in perturb.numeric_spans(text)}


def numeric_jaccard(a: str, b: str) -> float:
    """Jaccard similarity of the numeric token sets of two texts (0 when both have none)."""
    tokens_a, tokens_b = numeric_tokens(a), numeric_tokens(b)
    union = tokens_a | tokens_b
    return len(tokens_a & tokens_b) / len(union) if union else 0.0


def pick_distractor(anchor: str, candidates: Sequence[str], *, max_jaccard: float) -> int | None:
    """Returns the index of the candidate closest in length to `anchor` (earliest on ties).

    Candidates equal to the anchor or with numeric Jaccard above `max_jaccard` are skipped.
    """
    best, best_gap = None, None
    for index, text in enumerate(candidates):
        if text == anchor or numeric_jaccard(anchor, text) > max_jaccard:
            continue
        gap = abs(len(text) - len(anchor))
        if best_gap is None or gap < best_gap:
            best, best_gap = index, gap
    return best


class Bm25Neighbours:
    """BM25 (bm25s, English stopwords) over a fixed list of texts, queried by text index."""

    def __init__(self, texts: Sequence[str]):
        if not texts:
            raise ValueError("cannot index an empty corpus")
        tokens = bm25s.tokenize(list(texts), stopwords="en", show_progress=False)
        self._token_ids = tokens.ids
        self._retriever = bm25s.BM25()
        self._retriever.index(tokens, show_progress=False)

    def neighbours(
        self, indices: Sequence[int], *, k: int, candidates: int | None = None
    ) -> list[list[int]]:
        """Top-`k` BM25 neighbours (score > 0, best first, equal scores by corpus position) of
        each indexed text, self included; with `candidates`, only among the first `candidates`
        texts (e.g. the training passages of an index over training + held-out texts).

        The order of equal scores is fixed here rather than left to bm25s's top-k
        (`np.argpartition`, whose order among ties differs between machines): a passage repeated
        verbatim in two filings scores the same, and which one becomes a distractor must not
        depend on the CPU (docs/history.md, 2026-11-26).
        """
        # An empty query (all stopwords) has no neighbours; bm25s rejects it.
        return [
            top_k_by_score(self._retriever.get_scores_from_ids(query)[:candidates], k)
            if query
            else []
            for query in (list(self._token_ids[index]) for index in indices)
        ]


def top_k_by_score(scores: np.ndarray, k: int) -> list[int]:
    """Positions of the `k` highest positive `scores`, highest first, equal scores in ascending
    position: the same on every machine (every tie at the cut is kept until the final sort)."""
    positive = np.flatnonzero(scores > 0)
    if len(positive) > k:
        cut = np.partition(scores[positive], len(positive) - k)[len(positive) - k]
        positive = positive[scores[positive] >= cut]
    order = np.lexsort((positive, -scores[positive]))
    return [int(position) for position in positive[order[:k]]]


def check_quotas(quotas: Mapping[str, int], name: str) -> None:
    """ValueError naming `name` when a category is unknown or a quota negative."""
    for category, quota in quotas.items():
        if category not in perturb.CATEGORIES or quota < 0:
            raise ValueError(f"{name}: bad quota {category!r}: {quota!r}")


def build_numgap(
    passages: Sequence[Mapping[str, Any]],
    *,
    quotas_test: Mapping[str, int] = PAPER_QUOTAS_TEST,
    quotas_dev: Mapping[str, int] = PAPER_QUOTAS_DEV,
    seed: int = 0,
    bm25_k: int = 10,
    max_jaccard: float = 0.5,
    min_chars: int = ANCHOR_MIN_CHARS,
    max_chars: int = ANCHOR_MAX_CHARS,
    min_numeric_tokens: int = ANCHOR_MIN_NUMERIC_TOKENS,
    batch_size: int = 256,
    rules: perturb.Rules = perturb.PAPER_RULES,
) -> dict[str, list[dict[str, str]]]:
    """Builds the NumGap dev and test splits from `passages`.

    Eligible anchors (see `is_eligible`) are visited in seeded order. Each is offered to the
    firing category with the largest unmet share of its quota, then gets a distractor (the
    length-closest of its top-`bm25_k` BM25 neighbours in `passages`, minus itself and numeric
    Jaccard duplicates) and goes to the split with the larger unmet share. An anchor is used at
    most once; anchors without a distractor are skipped. Quotas are upper bounds.

    Args:
      passages: dicts with unique `id` and `text`; also the distractor pool.
      quotas_test, quotas_dev: records per category in each split.
      seed: anchor order and perturbation choice.
      bm25_k: neighbours retrieved per anchor (including the anchor itself).
      max_jaccard: drop neighbours whose numeric-token Jaccard with the anchor exceeds this.
      min_chars, max_chars, min_numeric_tokens: anchor eligibility (Appendix D.1).
      batch_size: anchors per BM25 retrieval batch (speed only; results do not depend on it).
      rules: where direction words count, which scale words swap (`perturb.Rules`).

    Returns:
      {"dev": [record, ...], "test": [record, ...]} with RECORD_FIELDS keys.
    """
    check_quotas(quotas_test, "quotas_test")
    check_quotas(quotas_dev, "quotas_dev")
    ids = [str(passage["id"]) for passage in passages]
    texts = [passage["text"] for passage in passages]
    if len(set(ids)) != len(ids):
        raise ValueError("passage ids must be unique")
    remaining = {
        "test": {category: int(n) for category, n in quotas_test.items()},
        "dev": {category: int(n) for category, n in quotas_dev.items()},
    }
    totals = {
        category: quotas_test.get(category, 0) + quotas_dev.get(category, 0)
        for category in perturb.CATEGORIES
    }

    def unmet_share(category: str) -> float:
        left = remaining["test"].get(category, 0) + remaining["dev"].get(category, 0)
        return left / totals[category] if totals[category] else 0.0

    eligible = [
        index
        for index, text in enumerate(texts)
        if is_eligible(
            text, min_chars=min_chars, max_chars=max_chars, min_numeric_tokens=min_numeric_tokens
        )
    ]
    random.Random(seed).shuffle(eligible)
    splits: dict[str, list[dict[str, str]]] = {split: [] for split in SPLITS}
    if not eligible or not any(totals.values()):
        return splits
    index = Bm25Neighbours(texts)
    for batch_start in range(0, len(eligible), batch_size):
        wanted = [category for category in perturb.CATEGORIES if unmet_share(category) > 0]
        if not wanted:
            break
        batch = eligible[batch_start : batch_start + batch_size]
        fired = [
            perturb.perturb_all(
                texts[anchor],
                seed=perturb.derive_seed(seed, "numgap", ids[anchor]),
                categories=wanted,
                rules=rules,
            )
            for anchor in batch
        ]
        needs_distractor = [anchor for anchor, options in zip(batch, fired, strict=True) if options]
        neighbours = dict(
            zip(needs_distractor, index.neighbours(needs_distractor, k=bm25_k), strict=True)
        )
        for anchor, options in zip(batch, fired, strict=True):
            open_categories = [category for category in options if unmet_share(category) > 0]
            if not open_categories:
                continue
            distractor = _distractor(texts, anchor, neighbours[anchor], max_jaccard=max_jaccard)
            if distractor is None:
                continue
            # Largest unmet share first; CATEGORIES order breaks ties.
            category = max(open_categories, key=unmet_share)
            split = max(
                SPLITS,
                key=lambda name: (
                    remaining[name].get(category, 0)
                    / max(1, (quotas_test if name == "test" else quotas_dev).get(category, 0))
                ),
            )
            remaining[split][category] -= 1
            splits[split].append(
                _record(category, options[category], texts, ids, anchor, distractor)
            )
    return splits


def _distractor(
    texts: Sequence[str], anchor: int, neighbours: Sequence[int], *, max_jaccard: float
) -> int | None:
    """The index of `anchor`'s distractor among its BM25 `neighbours` (itself left out;
    `pick_distractor`), or None."""
    candidates = [doc for doc in neighbours if doc != anchor]
    choice = pick_distractor(
        texts[anchor], [texts[doc] for doc in candidates], max_jaccard=max_jaccard
    )
    return None if choice is None else candidates[choice]


def _record(
    category: str, perturbed: str, texts: Sequence[str], ids: Sequence[str], anchor: int,
    distractor: int,
) -> dict[str, str]:  # fmt: skip
    """A NumGap record (RECORD_FIELDS) of `texts[anchor]`."""
    return {"category": category, "anchor": texts[anchor], "perturbed": perturbed,
            "distractor": texts[distractor], "anchor_id": ids[anchor],
            "distractor_id": ids[distractor]}  # fmt: skip


def build_per_rule(
    passages: Sequence[Mapping[str, Any]],
    *,
    category: str,
    per_rule: int,
    rules: perturb.Rules = perturb.PAPER_RULES,
    seed: int = 0,
    bm25_k: int = 10,
    max_jaccard: float = 0.5,
    exclude: Sequence[str] = (),
) -> list[dict[str, str]]:
    """NumGap records of one category with every rule equally represented: up to `per_rule`
    records per rule (`perturb.edit_rule`, e.g. each scale swap in each direction), for a
    per-rule, per-direction readout that `build_numgap`'s draw (rules as common as in the text)
    cannot give to rare rules.

    Eligible anchors (`is_eligible`, Appendix D.1) other than the `exclude` texts are visited in
    seeded order; an anchor goes to the rule with the fewest records so far among those it admits
    that are not yet full, with one of that rule's edits drawn by seed, and gets its distractor as
    in `build_numgap`. Each anchor is used once.

    Returns:
      Records with RECORD_FIELDS keys, in the order they were drawn.
    """
    check_quotas({category: per_rule}, "per_rule")
    ids = [str(passage["id"]) for passage in passages]
    texts = [passage["text"] for passage in passages]
    excluded = set(exclude)
    eligible = [
        index
        for index, text in enumerate(texts)
        if text not in excluded
        and is_eligible(
            text,
            min_chars=ANCHOR_MIN_CHARS,
            max_chars=ANCHOR_MAX_CHARS,
            min_numeric_tokens=ANCHOR_MIN_NUMERIC_TOKENS,
        )
    ]
    random.Random(seed).shuffle(eligible)
    options = {}
    for anchor in eligible:
        by_rule: dict[str, list[str]] = {}
        for rule, perturbed in perturb.candidate_edits(texts[anchor], category, rules=rules):
            by_rule.setdefault(rule, []).append(perturbed)
        if by_rule:
            options[anchor] = by_rule
    if not options:
        return []
    index = Bm25Neighbours(texts)
    counts: dict[str, int] = {}
    records = []
    for anchor, by_rule in options.items():
        open_rules = sorted(rule for rule in by_rule if counts.get(rule, 0) < per_rule)
        if not open_rules:
            continue
        neighbours = index.neighbours([anchor], k=bm25_k)[0]
        distractor = _distractor(texts, anchor, neighbours, max_jaccard=max_jaccard)
        if distractor is None:
            continue
        rule = min(open_rules, key=lambda name: counts.get(name, 0))
        counts[rule] = counts.get(rule, 0) + 1
        rng = random.Random(perturb.derive_seed(seed, "per_rule", ids[anchor]))
        perturbed = rng.choice(by_rule[rule])
        records.append(_record(category, perturbed, texts, ids, anchor, distractor))
    return records


def save_numgap(output_dir: str | os.PathLike, splits: Mapping[str, Sequence[Mapping]]) -> dict:
    """Atomically writes `numgap_<split>.jsonl` per split; returns {split: path}."""
    written = {}
    for split, records in splits.items():
        path = paths.as_path(output_dir) / f"numgap_{split}.jsonl"
        corpus.save_jsonl(path, records)
        written[split] = str(path)
    return written


def load_numgap(path: str | os.PathLike) -> list[dict[str, str]]:
    """Reads NumGap records, checking that each has every RECORD_FIELDS string field."""
    records = corpus.load_jsonl(path)
    for number, record in enumerate(records, start=1):
        for field in RECORD_FIELDS:
            if not isinstance(record.get(field), str):
                raise ValueError(
                    f"{path}: record {number}: field {field!r} missing or not a string"
                )
        if record["category"] not in perturb.CATEGORIES:
            raise ValueError(f"{path}: record {number}: unknown category {record['category']!r}")
    return records
