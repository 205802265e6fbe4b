"""Tests for caliber_jax/eval/numfine.py: targets, graded variants, and the three protocols."""

import datetime
import math
import random
import re

import numpy as np
import pytest

from caliber_jax.eval import numfine

SENTENCE = (
    "As of December 31, 2019, sales in Consumer totaled $4.6 billion, up 2.3 percent, and the "
    "segment had 1,250 employees."
)
GROUPED_RE = re.compile(r"\d{1,3}(?:,\d{3})*(?:\.\d+)?")


def _targets(sentence):
    return {
        (t["category"], sentence[t["start"] : t["end"]]) for t in numfine.find_targets(sentence)
    }


def test_find_targets_categories():
    assert _targets(SENTENCE) == {
        ("date", "December 31, 2019"),
        ("money", "4.6"),
        ("percentage", "2.3"),
        ("quantity", "1,250"),
    }
    assert _targets("Margins fell 50 bps and rose 12.5% on $1,234 of sales.") == {
        ("percentage", "50"),
        ("percentage", "12.5"),
        ("money", "1,234"),
    }


def test_find_targets_skips_years_periods_names_and_references():
    sentence = (
        "In fiscal 2019 and Q3 2020, 3M filed Exhibit 31.2 and Note 3.1 with the SEC on time."
    )
    assert numfine.find_targets(sentence) == []
    # A letter unit counts as money behind a currency symbol.
    assert _targets("The fund raised $5M from investors during the first quarter.") == {
        ("money", "5")
    }


@pytest.mark.parametrize(
    ("original", "value", "expected"),
    [
        ("1,234", "2468", "2,468"),
        ("950", "1900", "1,900"),  # short integers gain separators past 999
        ("1234", "2468", "2468"),  # a 4-digit integer written without them stays so
        ("4.60", "5.1", "5.10"),
        ("0.26", "0.13", "0.13"),
        ("1,234,567.5", "617283.8", "617,283.8"),
    ],
)
def test_render_number(original, value, expected):
    from decimal import Decimal

    assert numfine.render_number(original, Decimal(value)) == expected


@pytest.mark.parametrize(
    ("original", "new", "expected"),
    [
        ("December 31, 2019", datetime.date(2020, 1, 5), "January 5, 2020"),
        ("Dec. 31, 2019", datetime.date(2020, 1, 1), "Jan. 1, 2020"),
        ("May 05, 2021", datetime.date(2021, 6, 4), "June 04, 2021"),
        ("12/31/2019", datetime.date(2020, 1, 1), "01/01/2020"),
        ("3/1/2020", datetime.date(2020, 2, 29), "2/29/2020"),
    ],
)
def test_render_date(original, new, expected):
    assert numfine.render_date(original, new) == expected


def _unit(sentence, category, seed=0, k=9):
    target = next(t for t in numfine.find_targets(sentence) if t["category"] == category)
    unit = numfine.make_unit(sentence, target, k=k, rng=random.Random(seed))
    assert unit is not None
    return unit


def _check_only_target_changed(unit):
    anchor = unit["anchor"]
    start, end = unit["span"]
    for variant in unit["variants"]:
        new_start, new_end = variant["span"]
        assert new_start == start
        assert variant["text"][:start] == anchor[:start]
        assert variant["text"][new_end:] == anchor[end:]
        assert variant["text"][new_start:new_end] == variant["target"] != unit["target"]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("category", ["money", "percentage", "quantity"])
def test_numeric_variants_graded_in_range_and_well_formed(category, seed):
    # Fine-grained numerals, so that rounding cannot move a factor across a stratum edge.
    sentence = "Net sales rose to $12,345.67 million, up 18.2537%, with 4,321,987 units shipped."
    unit = _unit(sentence, category, seed)
    _check_only_target_changed(unit)
    original = unit["value"]
    decimals = len(unit["target"].partition(".")[2])
    ratios, deviations = [], []
    for variant in unit["variants"]:
        assert GROUPED_RE.fullmatch(variant["target"]), variant["target"]
        assert len(variant["target"].partition(".")[2]) == decimals
        assert float(variant["target"].replace(",", "")) == pytest.approx(variant["value"])
        assert variant["deviation"] == pytest.approx(abs(variant["value"] - original))
        ratios.append(variant["value"] / original)
        deviations.append(variant["deviation"])
    assert len(set(deviations)) == 9 and 0 not in deviations
    assert all(0.5 - 1e-6 <= r <= 2.0 + 1e-6 for r in ratios)
    # Graded: one factor in each of the 9 equal log-strata of [0.5, 2].
    edges = np.linspace(math.log(0.5), math.log(2.0), 10)
    assert sorted(np.searchsorted(edges, np.log(ratios))) == list(range(1, 10))


def test_sign_kept():
    unit = _unit(
        "Operating cash flow changed by -18.25% compared with the prior year.", "percentage"
    )
    _check_only_target_changed(unit)
    assert all("by -" in v["text"] and v["value"] > 0 for v in unit["variants"])


def test_small_quantity_uses_wide_range():
    unit = _unit(
        "The company operated 2.5 million square feet of leased warehouse space.", "quantity"
    )
    ratios = [v["value"] / unit["value"] for v in unit["variants"]]
    assert all(0.25 - 0.02 <= r <= 4.0 + 0.02 for r in ratios)
    assert min(ratios) < 0.5 and max(ratios) > 2.0  # outside the [0.5, 2] of larger quantities


@pytest.mark.parametrize("seed", range(5))
def test_date_variants_valid_and_within_30_days(seed):
    unit = _unit(
        "The notes were issued on February 28, 2020 and mature in five years.", "date", seed
    )
    _check_only_target_changed(unit)
    base = datetime.date(2020, 2, 28)
    shifts = []
    for variant in unit["variants"]:
        new = datetime.datetime.strptime(variant["target"], "%B %d, %Y").date()  # valid date
        shifts.append((new - base).days)
        assert variant["deviation"] == abs(shifts[-1])
        assert variant["value"] == new.toordinal()
    assert all(1 <= abs(s) <= 30 for s in shifts)
    assert len({abs(s) for s in shifts}) == 9


def test_coarse_number_is_dropped():
    # "5%" has only 2.5..10 at integer precision: not 9 distinct deviations.
    target = numfine.find_targets("Revenue grew 5% in the year on higher volumes overall.")[0]
    assert (
        numfine.make_unit(
            "Revenue grew 5% in the year on higher volumes overall.",
            target,
            k=9,
            rng=random.Random(0),
        )
        is None
    )


def test_build_is_deterministic_and_paired(filing_passages):
    first = numfine.build_numfine(filing_passages, seed=3, max_items=30)
    assert first == numfine.build_numfine(filing_passages, seed=3, max_items=30)
    assert first != numfine.build_numfine(filing_passages, seed=4, max_items=30)
    assert len(first) == 30
    assert len({item["id"] for item in first}) == 30
    by_id = {item["id"]: item for item in first}
    pairs = [item for item in first if "cross_pair" in item]
    assert pairs
    for item in first:
        assert len(item["variants"]) == 9
        _check_only_target_changed(item)
    for item in pairs:
        pair = item["cross_pair"]
        partner = by_id[pair["partner"]]
        assert partner["category"] == item["category"] and "cross_pair" not in partner
        assert (
            item["variants"][pair["variant"]]["deviation"]
            != partner["variants"][pair["partner_variant"]]["deviation"]
        )
    partners = [item["cross_pair"]["partner"] for item in pairs]
    assert len(set(partners)) == len(partners)  # each unit is in at most one pair


def test_build_rejects_bad_args(filing_passages):
    with pytest.raises(ValueError, match="k >= 4"):
        numfine.build_numfine(filing_passages, seed=0, k=3, max_items=5)
    with pytest.raises(ValueError, match="text"):
        numfine.build_numfine([{"doc": 1}], seed=0, max_items=5)


def _toy_items():
    """Two k = 9 units with deviations 1..9 (shuffled) and a cross pair between them."""
    items = []
    for index, order in enumerate(([3, 1, 8, 2, 9, 4, 7, 5, 6], [9, 8, 7, 6, 5, 4, 3, 2, 1])):
        anchor = f"anchor {index}"
        variants = [
            {"text": f"{anchor} variant d={d}", "deviation": float(d) * (index + 1)} for d in order
        ]
        items.append(
            {"id": f"u{index}", "category": "money", "anchor": anchor, "variants": variants}
        )
    # Unit 0's d=2 variant (deviation 2) against unit 1's d=3 variant (deviation 6).
    items[0]["cross_pair"] = {"partner": "u1", "variant": 3, "partner_variant": 6}
    return items


def _by_deviation(sign):
    def score_fn(texts_a, texts_b):
        del texts_a
        return np.array([sign * float(t.split("d=")[1]) for t in texts_b])

    return score_fn


def test_evaluate_oracle_and_reversed():
    items = _toy_items()
    oracle = numfine.evaluate(None, items, score_fn=_by_deviation(-1))
    assert oracle == {
        "triplet": {"easy": 1.0, "medium": 1.0, "hard": 1.0},
        "listwise_tau_b": 1.0,
        "cross_pair": 1.0,
        "n": 2,
        "n_cross_pair": 1,
    }
    reverse = numfine.evaluate(None, items, score_fn=_by_deviation(+1))
    assert reverse["triplet"] == {"easy": 0.0, "medium": 0.0, "hard": 0.0}
    assert reverse["listwise_tau_b"] == pytest.approx(-1.0)
    assert reverse["cross_pair"] == 0.0
    flat = numfine.evaluate(None, items, score_fn=lambda a, b: np.zeros(len(a)))
    assert flat["triplet"] == {"easy": 0.0, "medium": 0.0, "hard": 0.0}  # ties never win
    assert flat["listwise_tau_b"] == 0.0 and flat["cross_pair"] == 0.0


def test_evaluate_levels_and_tau_by_hand():
    """Sims by rank of deviation: the negatives are ranks 8 (easy), 3 (medium), 1 (hard)."""
    by_rank = [0.5, 0.4, 0.3, 0.6, 0.2, 0.1, 0.05, 0.0, -0.1]
    items = _toy_items()[:1]
    items[0].pop("cross_pair")
    deviation_of = {v["text"]: v["deviation"] for v in items[0]["variants"]}

    def score_fn(texts_a, texts_b):
        return np.array([by_rank[int(deviation_of[t]) - 1] for t in texts_b])

    result = numfine.evaluate(None, items, score_fn=score_fn)
    assert result["triplet"] == {"easy": 1.0, "medium": 0.0, "hard": 1.0}
    # 36 pairs of ranks; discordant: (0, 3), (1, 3), (2, 3) -> tau = (33 - 3) / 36.
    assert result["listwise_tau_b"] == pytest.approx(30 / 36)
    assert math.isnan(result["cross_pair"]) and result["n_cross_pair"] == 0


def _toy_encode_fn(items):
    """2-D unit vectors whose angle to the anchor's grows with the deviation."""
    angle = {item["anchor"]: 0.0 for item in items}
    for item in items:
        for variant in item["variants"]:
            angle[variant["text"]] = 0.1 * variant["deviation"]
    return lambda texts: np.array([[math.cos(angle[t]), math.sin(angle[t])] for t in texts])


def test_evaluate_cosine_path_matches_score_fn():
    items = _toy_items()
    encode_fn = _toy_encode_fn(items)
    by_cosine = numfine.evaluate(encode_fn, items)
    assert by_cosine == numfine.evaluate(None, items, score_fn=_by_deviation(-1))
    with pytest.raises(ValueError, match="normalised"):
        numfine.evaluate(lambda texts: 2 * encode_fn(texts), items)
    with pytest.raises(ValueError, match="encode_fn or a score_fn"):
        numfine.evaluate(None, items)


def test_subset_drops_pairs_without_partner():
    items = _toy_items()
    assert numfine.evaluate(None, items[:1], score_fn=_by_deviation(-1))["n_cross_pair"] == 0


def test_save_load_round_trip_and_errors(tmp_path, filing_passages):
    from caliber_jax.data import corpus

    items = numfine.build_numfine(filing_passages, seed=0, max_items=5)
    path = tmp_path / "numfine.jsonl"
    corpus.save_jsonl(path, items)
    assert numfine.load_numfine(str(path)) == items
    path.write_text('{"id": "u0", "category": "money", "anchor": "a"}\n')
    with pytest.raises(ValueError, match=r"numfine.jsonl:1: missing field 'variants'"):
        numfine.load_numfine(str(path))


def test_evaluate_scorers():
    items = _toy_items()
    encode_fn = _toy_encode_fn(items)
    assert numfine.evaluate_scorers(numfine.evaluate, encode_fn, items, None) == {
        "cosine": numfine.evaluate(encode_fn, items)
    }
    both = numfine.evaluate_scorers(numfine.evaluate, encode_fn, items, _by_deviation(+1))
    assert both["cosine"]["listwise_tau_b"] == pytest.approx(1.0)
    assert both["nash"]["listwise_tau_b"] == pytest.approx(-1.0)
