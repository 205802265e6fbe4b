"""Tests for caliber_jax.data.numgap on a small synthetic corpus."""

import random

import numpy as np
import pytest

from caliber_jax.data import numgap, perturb

TOPICS = {
    "pension": "pension plan obligations actuarial discount rate retirees benefit funding",
    "leases": "operating lease liabilities right-of-use assets rent tenants office space",
    "tax": "income tax provision deferred tax assets valuation allowance jurisdictions",
    "debt": "senior notes credit facility borrowings interest coupon maturity lenders",
}


def make_passage(topic: str, index: int, rng: random.Random) -> dict[str, str]:
    words = TOPICS[topic]
    text = (
        f"The {words} increased {rng.randint(1, 99)}.{rng.randint(1, 9)}% to "
        f"${rng.randint(1, 999):,} million in fiscal {rng.randint(2010, 2023)}. "
        f"Management notes that {words} rose by {rng.randint(10, 90)} bps compared with the prior "
        f"year, while {' '.join(words.split()[:4])} stayed above ${rng.randint(1000, 99999):,}."
    )
    return {"id": f"{topic}:{index}", "text": text + " Filler." * (index % 7)}


def make_corpus(per_topic: int = 30, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [make_passage(topic, index, rng) for topic in TOPICS for index in range(per_topic)]


def test_is_eligible():
    ok = "Revenue grew 12.4% to $3,400 million in fiscal 2022. " * 5
    assert numgap.is_eligible(ok, min_chars=200, max_chars=1200, min_numeric_tokens=2)
    assert not numgap.is_eligible(ok[:150], min_chars=200, max_chars=1200, min_numeric_tokens=2)
    assert not numgap.is_eligible(ok * 6, min_chars=200, max_chars=1200, min_numeric_tokens=2)
    one_number = "Revenue grew 12.4 percent in the year. " + "Nothing else to report. " * 8
    assert not numgap.is_eligible(one_number, min_chars=200, max_chars=1200, min_numeric_tokens=2)
    no_terminator = ok.replace(".", ",")
    assert not numgap.is_eligible(
        no_terminator, min_chars=200, max_chars=1200, min_numeric_tokens=2
    )


def test_numeric_jaccard():
    assert numgap.numeric_tokens("a 12.4% b $3,400 c 2020.") == {"12.4", "$3,400", "2020"}
    assert numgap.numeric_jaccard("a 12.4% b $3,400 c 2020", "x 12.4% y 2021") == 1 / 4
    assert numgap.numeric_jaccard("no numbers", "none here") == 0.0
    assert numgap.numeric_jaccard("in 2020 and 2021", "2021 and 2020") == 1.0


def test_pick_distractor_filters_and_prefers_closest_length():
    anchor = "Sales were 12.4% and $3,400 in 2020. " + "x" * 263  # 300 chars
    assert len(anchor) == 300
    candidates = [
        anchor,  # The anchor itself.
        "Sales were 12.4% and $3,400 in 2020." + "y" * 264,  # Jaccard 1.0.
        "Costs were 7.5% in 2019. " + "z" * 475,  # 500 chars.
        "Costs were 7.5% and 12.4% in 2019. " + "z" * 285,  # 320 chars, Jaccard 1/5.
        "Costs were 9.5% in 2018. " + "z" * 255,  # 280 chars, same gap: later, so not picked.
    ]
    assert numgap.pick_distractor(anchor, candidates, max_jaccard=0.5) == 3
    assert numgap.pick_distractor(anchor, candidates[:2], max_jaccard=0.5) is None
    # At Jaccard threshold 1.0 the near-duplicate (gap 0) wins.
    assert numgap.pick_distractor(anchor, candidates, max_jaccard=1.0) == 1


def test_bm25_neighbours_are_topical():
    passages = make_corpus(per_topic=5)
    index = numgap.Bm25Neighbours([passage["text"] for passage in passages])
    for query, neighbours in zip([0, 7], index.neighbours([0, 7], k=5), strict=True):
        assert neighbours[0] == query
        topic = passages[query]["id"].split(":")[0]
        assert all(passages[doc]["id"].startswith(topic) for doc in neighbours)


def test_top_k_by_score_orders_ties_by_position_and_keeps_the_lowest_at_the_cut():
    scores = np.array([0.5, 2.0, 0.0, 2.0, 1.0, 2.0, -1.0, 2.0], np.float32)
    assert numgap.top_k_by_score(scores, 2) == [1, 3]  # four tied at 2.0: the first two
    assert numgap.top_k_by_score(scores, 5) == [1, 3, 5, 7, 4]
    assert numgap.top_k_by_score(scores, 10) == [1, 3, 5, 7, 4, 0]  # positive scores only
    assert numgap.top_k_by_score(np.zeros(3), 2) == []


def test_bm25_neighbours_break_ties_by_position_and_match_bm25s_scores():
    """Verbatim repeats (one passage in two filings) score the same; which of them is a
    neighbour, and in which order, is fixed by corpus position on every machine."""
    passages = make_corpus(per_topic=5)
    texts = [passage["text"] for passage in passages]
    repeated = texts[3]
    texts = [repeated, *texts, repeated, repeated]  # positions 0, 4, len-2 and len-1
    index = numgap.Bm25Neighbours(texts)
    copies = [0, 4, len(texts) - 2, len(texts) - 1]
    for query in copies:
        assert index.neighbours([query], k=4) == [copies]  # all four tie at the top
        assert index.neighbours([query], k=2) == [copies[:2]]
    # Outside the ties, the order is bm25s's own ranking by score.
    (mine,) = index.neighbours([7], k=6)
    scores = index._retriever.get_scores_from_ids(list(index._token_ids[7]))
    assert [round(float(scores[doc]), 4) for doc in mine] == sorted(
        (round(float(x), 4) for x in scores if x > 0), reverse=True
    )[:6]


QUOTAS_TEST = {"magnitude": 12, "polarity": 10, "unit": 8}
QUOTAS_DEV = {"magnitude": 4, "polarity": 4, "unit": 3, "period": 3}


@pytest.fixture(scope="module")
def built():
    passages = make_corpus()
    return passages, numgap.build_numgap(
        passages, quotas_test=QUOTAS_TEST, quotas_dev=QUOTAS_DEV, seed=0, bm25_k=8, batch_size=16
    )


def test_build_numgap_fills_quotas_with_unique_anchors(built):
    passages, splits = built
    for split, quotas in (("test", QUOTAS_TEST), ("dev", QUOTAS_DEV)):
        counts = {category: 0 for category in perturb.CATEGORIES}
        for record in splits[split]:
            counts[record["category"]] += 1
        assert counts == {category: quotas.get(category, 0) for category in perturb.CATEGORIES}
    anchors = [record["anchor_id"] for split in splits.values() for record in split]
    assert len(anchors) == len(set(anchors)) == 44


def test_build_numgap_records_are_valid(built):
    passages, splits = built
    texts = {passage["id"]: passage["text"] for passage in passages}
    index = numgap.Bm25Neighbours([passage["text"] for passage in passages])
    position = {passage["id"]: number for number, passage in enumerate(passages)}
    for record in splits["test"] + splits["dev"]:
        assert tuple(record) == numgap.RECORD_FIELDS
        anchor, distractor = record["anchor"], record["distractor"]
        assert texts[record["anchor_id"]] == anchor
        assert texts[record["distractor_id"]] == distractor
        assert record["distractor_id"] != record["anchor_id"]
        assert record["anchor_id"].split(":")[0] == record["distractor_id"].split(":")[0]
        assert numgap.numeric_jaccard(anchor, distractor) <= 0.5
        assert 1 <= perturb.edit_distance(anchor, record["perturbed"]) <= 30
        # The distractor is the length-closest admissible one among the anchor's BM25 top 8.
        (neighbours,) = index.neighbours([position[record["anchor_id"]]], k=8)
        assert position[record["distractor_id"]] in neighbours
        admissible = [
            texts[passages[doc]["id"]]
            for doc in neighbours
            if doc != position[record["anchor_id"]]
            and numgap.numeric_jaccard(anchor, texts[passages[doc]["id"]]) <= 0.5
        ]
        gap = abs(len(distractor) - len(anchor))
        assert gap == min(abs(len(text) - len(anchor)) for text in admissible)


def test_build_numgap_is_deterministic_and_seeded(built):
    passages, splits = built
    again = numgap.build_numgap(
        passages, quotas_test=QUOTAS_TEST, quotas_dev=QUOTAS_DEV, seed=0, bm25_k=8, batch_size=5
    )
    assert again == splits  # Batch size changes speed only.
    other = numgap.build_numgap(
        passages, quotas_test=QUOTAS_TEST, quotas_dev=QUOTAS_DEV, seed=1, bm25_k=8
    )
    assert [r["anchor_id"] for r in other["test"]] != [r["anchor_id"] for r in splits["test"]]


def test_build_numgap_quotas_are_upper_bounds():
    passages = make_corpus(per_topic=3)
    splits = numgap.build_numgap(
        passages, quotas_test={"magnitude": 100}, quotas_dev={"period": 2}, seed=0, bm25_k=5
    )
    # All 12 anchors are used once. Each goes to the category with the largest unmet share of
    # its quota: magnitude (tie, first in CATEGORIES), period (2/2 > 99/100), then magnitude
    # always (99/100 > 1/2).
    assert [record["category"] for record in splits["dev"]] == ["period"]
    assert [record["category"] for record in splits["test"]] == ["magnitude"] * 11
    with pytest.raises(ValueError, match="quotas_test: bad quota 'size'"):
        numgap.build_numgap(passages, quotas_test={"size": 1}, quotas_dev={})


def test_save_and_load_numgap(tmp_path, built):
    _, splits = built
    paths = numgap.save_numgap(tmp_path, splits)
    assert sorted(paths) == ["dev", "test"]
    assert numgap.load_numgap(paths["test"]) == splits["test"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"category": "unit", "anchor": "a"}\n')
    with pytest.raises(ValueError, match="record 1: field 'perturbed' missing"):
        numgap.load_numgap(bad)


def scale_corpus(per_topic: int = 30) -> list[dict[str, str]]:
    """The synthetic corpus with its "million" turned to each scale word in turn, so every
    scale swap of perturb's "all" set has anchors (and %/bps, from the template)."""
    scales = ("million", "billion", "thousand")
    return [
        {**p, "text": p["text"].replace("million", scales[i % 3])}
        for i, p in enumerate(make_corpus(per_topic))
    ]


def test_build_per_rule_gives_every_rule_its_quota_and_honours_exclude():
    passages = scale_corpus()
    rules = perturb.Rules(scales="all")
    excluded = [passages[0]["text"], passages[5]["text"]]
    records = numgap.build_per_rule(
        passages, category="unit", per_rule=6, rules=rules, seed=3, exclude=excluded
    )
    counts: dict[str, int] = {}
    for record in records:
        rule = perturb.edit_rule(record["anchor"], record["perturbed"], "unit")
        counts[rule] = counts.get(rule, 0) + 1
        assert record["category"] == "unit" and set(record) == set(numgap.RECORD_FIELDS)
        assert record["perturbed"] in [p for _, p in perturb.candidate_edits(
            record["anchor"], "unit", rules=rules)]  # fmt: skip
        assert record["distractor"] != record["anchor"]
        assert numgap.numeric_jaccard(record["anchor"], record["distractor"]) <= 0.5
    assert counts == {
        rule: 6
        for rule in ("%->bps", "bps->%", "million->billion", "million->thousand",
                     "billion->million", "billion->thousand", "thousand->million",
                     "thousand->billion")
    }  # fmt: skip
    anchors = [record["anchor"] for record in records]
    assert len(set(anchors)) == len(anchors) and not set(anchors) & set(excluded)
    again = numgap.build_per_rule(
        passages, category="unit", per_rule=6, rules=rules, seed=3, exclude=excluded
    )
    assert again == records
    # The paper's set has no reverse swaps to fill.
    paper = numgap.build_per_rule(passages, category="unit", per_rule=6, seed=3)
    paper_rules = {perturb.edit_rule(r["anchor"], r["perturbed"], "unit") for r in paper}
    assert "billion->thousand" not in paper_rules and "thousand->billion" not in paper_rules
