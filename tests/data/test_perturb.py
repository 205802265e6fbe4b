"""Tests for caliber_jax.data.perturb: golden examples per category and property tests."""

import decimal
import itertools
import os
import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from caliber_jax.data import perturb

SEEDS = range(40)


def outputs(text: str, category: str) -> set[str | None]:
    return {perturb.perturb(text, category, seed=seed) for seed in SEEDS}


def tokens(text: str) -> list[str]:
    return [text[start:end] for start, end in perturb.numeric_spans(text)]


# --- numeric spans -------------------------------------------------------------------------------


def test_numeric_spans_follow_the_paper_regex():
    text = "Revenue grew 12.4% to $3,400 million in fiscal 2022, up from $2.2 billion in FY2021."
    assert tokens(text) == ["12.4", "$3,400", "2022", "$2.2", "FY2021"]
    assert tokens("margin up 25 bps, loss of EUR 500 million in Q3 2023") == [
        "25 bps",
        "500 million",
        "Q3 2023",
    ]
    assert tokens("changes of +1.5% and \u22122.1% and 7% and 5M units") == [
        "+1.5%",
        "\u22122.1%",
        "7%",
        "5M",
    ]


def test_numeric_spans_skip_plain_integers_codes_and_zips():
    assert tokens("Note 14, Form 10-K, Washington, D.C. 20549, item 7A, Room 101") == []
    assert tokens("abc2020 and x1.5") == []  # Preceded by a letter.


def test_numeric_spans_are_sorted_and_disjoint():
    spans = perturb.numeric_spans("1,000 2.5 2019 Q1 2020 +3% 40 basis points 7 billion")
    assert len(spans) == 7
    assert spans == sorted(spans)
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(spans))


def test_edit_distance():
    assert perturb.edit_distance("kitten", "sitting") == 3
    assert perturb.edit_distance("12.4%", "1.24%") == 2
    assert perturb.edit_distance("same", "same") == 0


# --- magnitude -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("number", "exponent", "expected"),
    [
        ("12.4", -1, "1.24"),
        ("12.4", 1, "124"),
        ("3,400", 1, "34,000"),
        ("3,400", -1, "340"),
        ("3,455", -1, "345.5"),
        ("915", 1, "9,150"),
        ("1234.5", 1, "12345"),
        ("0.5", -1, "0.05"),
        ("5", -1, "0.5"),
        ("1,000.50", -1, "100.050"),
        ("1.500", 1, "15.00"),
        ("1.500", -1, "0.1500"),
        ("0.05", 1, "0.5"),
        ("999,999", 1, "9,999,990"),
    ],
)
def test_shift_decimal(number, exponent, expected):
    assert perturb.shift_decimal(number, exponent) == expected


def test_shift_decimal_of_zero_is_none():
    assert perturb.shift_decimal("0.00", 1) is None


@given(st.decimals(min_value=0, max_value=10**9, places=3, allow_nan=False), st.booleans())
def test_shift_decimal_round_trips_the_value(value, up):
    number = f"{value:,f}"
    shifted = perturb.shift_decimal(number, 1 if up else -1)
    if value == 0:
        assert shifted is None
        return
    assert decimal.Decimal(shifted.replace(",", "")) == value.scaleb(1 if up else -1)
    integer = shifted.partition(".")[0]
    assert re.fullmatch(r"\d{1,3}(,\d{3})*", integer), shifted  # Regrouped separators.


def test_magnitude_shifts_one_number_and_never_a_year():
    assert outputs("Sales rose 12.4% in 2021.", "magnitude") == {
        "Sales rose 1.24% in 2021.",
        "Sales rose 124% in 2021.",
    }
    assert outputs("Debt was $3,400 at year end.", "magnitude") == {
        "Debt was $34,000 at year end.",
        "Debt was $340 at year end.",
    }


def test_magnitude_skips_years_and_periods():
    assert outputs("Compared with 2021, FY2022 and Q3 2023 and fiscal 1999.", "magnitude") == {None}


def test_magnitude_skips_document_references():
    text = "See Exhibit 31.2, Item 5.03 and Note 3.1 for the 2.5% rate."
    assert outputs(text, "magnitude") == {
        "See Exhibit 31.2, Item 5.03 and Note 3.1 for the 0.25% rate.",
        "See Exhibit 31.2, Item 5.03 and Note 3.1 for the 25% rate.",
    }


# --- polarity ------------------------------------------------------------------------------------


def test_polarity_swaps_direction_words_preserving_case():
    assert outputs("Revenue increased 5.5% this year.", "polarity") == {
        "Revenue decreased 5.5% this year."
    }
    assert outputs("Increased 5.5% this year.", "polarity") == {"Decreased 5.5% this year."}
    assert outputs("NET LOSS OF $2.5 was recorded.", "polarity") == {
        "NET GAIN OF $2.5 was recorded."
    }
    assert outputs("the deficit widened to 1.2 billion", "polarity") == {
        "the surplus widened to 1.2 billion",
        "the deficit narrowed to 1.2 billion",
    }


def test_polarity_needs_a_number_within_50_characters():
    far = "Revenue increased" + " because of many unrelated factors, xx" * 2 + " to 5.5% later."
    assert far.index("5.5") - far.index("increased") - len("increased") > 50
    assert outputs(far, "polarity") == {None}
    assert outputs("Revenue increased a lot, with no figures at all.", "polarity") == {None}


def test_polarity_flips_explicit_signs():
    assert outputs("a change of -3.2% in margin", "polarity") == {"a change of +3.2% in margin"}
    assert outputs("a change of +1.5% in margin", "polarity") == {"a change of -1.5% in margin"}
    assert outputs("a change of \u22122.1% in margin", "polarity") == {
        "a change of +2.1% in margin"
    }


def test_polarity_leaves_ranges_and_hyphenated_words_alone():
    assert outputs("a range of 5-10% for the up-front fee", "polarity") == {None}


def quantity_outputs(text: str) -> set[str | None]:
    return {
        perturb.perturb(text, "polarity", seed, rules=perturb.Rules(polarity_scope="quantity"))
        for seed in SEEDS
    }


def test_quantity_scope_swaps_words_that_govern_an_amount():
    for text in (
        "Revenue increased 5.5% this year.",
        "the price stayed below $10 million in the quarter",
        "a loss of $3.2 million was recorded",
        "margins were 120 bps higher than planned",
    ):
        assert quantity_outputs(text) == outputs(text, "polarity") != {None}


def test_quantity_scope_skips_cross_references_dates_and_labels():
    """The paper's rule (Appendix D.3) swaps these; none of them states a numeric fact."""
    for text in (
        "As indicated above, the plan was adopted in 2021.",  # only a year nearby
        "Costs rose in Q3 2022 as planned.",  # a fiscal period
        "See Exhibit 31.2 below for the certification.",  # a document label
        "a loss, as the notes to the statements say, of $3 million",  # 8 words away
        "Margins improved. Revenue was $5.2 million.",  # another sentence
        "the rate was 15 bps.As discussed above, the plan",  # a break without a space
    ):
        assert outputs(text, "polarity") != {None}, text
        assert quantity_outputs(text) == {None}, text


def test_quantity_scope_keeps_sign_flips():
    assert quantity_outputs("a change of -3.2% in margin") == {"a change of +3.2% in margin"}


def test_unknown_rule_choices_raise():
    with pytest.raises(ValueError, match="polarity scope 'near'"):
        perturb.Rules(polarity_scope="near")
    with pytest.raises(ValueError, match="scale set 'every'"):
        perturb.Rules(scales="every")


# --- period --------------------------------------------------------------------------------------


def test_period_shifts_quarter_year_keeping_format():
    results = outputs("Sales in Q3 2023 were flat.", "period")
    assert results == {
        f"Sales in Q3 {year} were flat." for year in (2020, 2021, 2022, 2024, 2025, 2026)
    }


def test_period_shifts_fiscal_years_keeping_format():
    assert outputs("Guidance for FY22 is 7%.", "period") == {
        f"Guidance for FY{year} is 7%." for year in (19, 20, 21, 23, 24, 25)
    }
    assert outputs("Guidance for FY 2022 is set.", "period") == {
        f"Guidance for FY {year} is set." for year in (2019, 2020, 2021, 2023, 2024, 2025)
    }
    assert outputs("In fiscal 2022 we grew.", "period") == {
        f"In fiscal {year} we grew." for year in (2019, 2020, 2021, 2023, 2024, 2025)
    }


def test_period_keeps_years_in_range_and_skips_non_years():
    assert outputs("Maturity in 2099.", "period") == {
        f"Maturity in {y}." for y in (2096, 2097, 2098)
    }
    assert outputs("Sales of $3,400 and 12.5% with 1,999 units.", "period") == {None}


# --- unit ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("paid $915 million in cash", {"paid $915 billion in cash", "paid $915 thousand in cash"}),
        ("paid 2.2 Billion in cash", {"paid 2.2 Million in cash"}),
        ("rates up 25 bps in 2020", {"rates up 25% in 2020"}),
        ("rates up 25 basis points in 2020", {"rates up 25 percent in 2020"}),
        ("margin of 3.2% overall", {"margin of 3.2 bps overall"}),
        ("up 0.7 percentage points in 2019", {"up 0.7 basis points in 2019"}),
        ("up 5 percent in 2019", {"up 5 basis points in 2019"}),
        ("a $5M fee", {"a $5B fee"}),
        ("3 thousands of units in 2019", {"3 millions of units in 2019"}),
    ],
)
def test_unit_swaps_the_unit_after_a_number(text, expected):
    assert outputs(text, "unit") == expected


def test_letter_units_need_a_currency_symbol():
    text = "3M Company reported 1.5% growth"
    assert tokens(text) == ["3M", "1.5"]  # The paper regex does match "3M".
    assert outputs(text, "magnitude") == {
        "3M Company reported 0.15% growth",
        "3M Company reported 15% growth",
    }
    assert outputs(text, "unit") == {"3M Company reported 1.5 bps growth"}
    assert outputs("a $5M fee and a $20K bonus", "magnitude") == {
        "a $50M fee and a $20K bonus",
        "a $0.5M fee and a $20K bonus",
        "a $5M fee and a $200K bonus",
        "a $5M fee and a $2K bonus",
    }


ALL_SCALES = perturb.Rules(scales="all")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("paid $915 million in cash", {"paid $915 billion in cash", "paid $915 thousand in cash"}),
        ("paid 2.2 Billion in cash", {"paid 2.2 Million in cash", "paid 2.2 Thousand in cash"}),
        (
            "3 thousands of units in 2019",
            {"3 millions of units in 2019", "3 billions of units in 2019"},
        ),
        ("a $5M fee", {"a $5B fee", "a $5K fee"}),
        ("a $2B loan", {"a $2M loan", "a $2K loan"}),
        ("a $9K bonus", {"a $9M bonus", "a $9B bonus"}),
        ("3M Company, 10K run", {None}),  # letters still need a currency symbol
        ("rates up 25 bps", {"rates up 25%"}),  # the other unit rules do not change
    ],
)
def test_all_scales_swap_every_scale_both_ways(text, expected):
    assert {perturb.perturb(text, "unit", seed, rules=ALL_SCALES) for seed in SEEDS} == expected


def test_all_scales_name_each_direction_and_keep_the_other_categories():
    text = "Sales were $5 billion, $40 thousand of fees and $3M of costs, up 5% in 2019."
    rules = {rule for rule, _ in perturb.candidate_edits(text, "unit", rules=ALL_SCALES)}
    assert rules == {
        "billion->million", "billion->thousand", "thousand->million", "thousand->billion",
        "M->B", "M->K", "%->bps",
    }  # fmt: skip
    paper = {rule for rule, _ in perturb.candidate_edits(text, "unit")}
    assert paper == {"billion->million", "thousand->million", "M->B", "%->bps"}
    for category in ("magnitude", "polarity", "period", "currency"):
        assert perturb.candidate_sites(text, category, rules=ALL_SCALES) == (
            perturb.candidate_sites(text, category)
        )
    weights = perturb.rule_weights([text], ["unit"], rules=ALL_SCALES)
    assert set(weights["unit"]) == rules


def test_unit_needs_a_number_before_the_unit_word():
    assert outputs("Millions of customers since 2019 and a percent of them.", "unit") == {None}
    assert outputs("Class B shares and 10 K-cups in 2019.", "unit") == {None}


# --- currency ------------------------------------------------------------------------------------


def test_currency_swaps_codes_and_symbols_attached_to_numbers():
    code = outputs("notes of EUR 500 million due 2026", "currency")
    assert code == {
        f"notes of {other} 500 million due 2026" for other in perturb.ISO_CODES if other != "EUR"
    }
    symbol = outputs("a fee of $5.2 billion", "currency")
    assert symbol == {f"a fee of {other}5.2 billion" for other in "\u20ac\u00a3\u00a5"}
    after = outputs("a fee of 5.2 million USD in 2020", "currency")
    assert after == {f"a fee of 5.2 million {c} in 2020" for c in perturb.ISO_CODES if c != "USD"}


def test_currency_needs_a_number_next_to_the_code():
    assert outputs("The EUR and the $ moved in 2020.", "currency") == {None}


# --- all categories ------------------------------------------------------------------------------


def test_no_numeric_token_means_no_perturbation():
    text = "Revenue increased by millions of EUR, up strongly."
    assert all(perturb.perturb(text, c, seed=s) is None for c in perturb.CATEGORIES for s in SEEDS)
    assert perturb.perturb_any(text, seed=0) is None


def test_unknown_category_raises():
    with pytest.raises(ValueError, match="unknown perturbation category 'size'"):
        perturb.perturb("12.4%", "size")


RICH = (
    "In FY2022 revenue increased 12.4% to $3,400 million, up from $2.2 billion in 2021, "
    "while margins improved 25 bps and the deficit narrowed to EUR 1.2 billion in Q3 2022."
)


def test_seeds_choose_different_edits_and_repeat_exactly():
    for category in perturb.CATEGORIES:
        first = [perturb.perturb(RICH, category, seed=seed) for seed in SEEDS]
        assert first == [perturb.perturb(RICH, category, seed=seed) for seed in SEEDS]
        assert len(set(first)) >= 3, category
    assert {perturb.perturb_any(RICH, seed=seed)[0] for seed in SEEDS} == set(perturb.CATEGORIES)


def test_perturb_any_restricted_categories():
    category, text = perturb.perturb_any(RICH, seed=3, categories=("unit",))
    assert category == "unit"
    assert text == perturb.perturb_all(RICH, seed=3, categories=("unit",))["unit"]


def test_output_does_not_depend_on_hash_seed():
    code = (
        "from caliber_jax.data import perturb;"
        f"print([perturb.perturb_any({RICH!r}, seed=s) for s in range(8)])"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for hash_seed in ("1", "2")
    }
    assert len(runs) == 1
    assert runs.pop() == str([perturb.perturb_any(RICH, seed=s) for s in range(8)]) + "\n"


# --- properties ----------------------------------------------------------------------------------


def changes_only(text: str, new: str, start: int, end: int) -> bool:
    """True when `new` is `text` with only `text[start:end]` replaced."""
    return (
        new.startswith(text[:start])
        and new.endswith(text[end:])
        and len(new) >= start + len(text) - end
    )


_DIRECTION_WORD_RE = re.compile(r"[A-Za-z]+")


def allowed_regions(text: str, category: str) -> list[tuple[int, int]]:
    """Independent description of where each category may edit `text`."""
    spans = perturb.numeric_spans(text)
    if category in ("magnitude", "period"):
        return spans
    if category == "polarity":
        words = [
            m.span()
            for m in _DIRECTION_WORD_RE.finditer(text)
            if m.group().lower() in perturb.DIRECTION_WORDS
            and any(max(s - m.end(), m.start() - e) <= 50 for s, e in spans)
        ]
        return words + [(max(0, s - 1), e) for s, e in spans]
    if category == "unit":
        return [m.span() for m in re.finditer(r"(?<=\d)\s?(?:[A-Za-z]+(?:\s+points?)?|%)", text)]
    symbol = r"(?:[$\u20ac\u00a3\u00a5]|(?<![A-Za-z])[A-Z]{3}(?![A-Za-z]))"
    # The unit word between number and code is optional: try it both lazily and greedily, so
    # "1,000 USD USD" allows the first code (right after the number) as well as the second.
    return [m.span(1) for m in re.finditer(rf"({symbol})\s?\d", text)] + [
        m.span(1)
        for quantifier in ("?", "??")
        for m in re.finditer(rf"\d(?:\s?[A-Za-z]+){quantifier}\s?({symbol})", text)
    ]


def check_perturbation(text: str, category: str, seed: int) -> None:
    new = perturb.perturb(text, category, seed=seed)
    if new is None:
        return
    assert new != text
    assert 1 <= perturb.edit_distance(text, new) <= 30
    regions = allowed_regions(text, category)
    assert any(changes_only(text, new, start, end) for start, end in regions), (text, new)
    assert new == perturb.perturb(text, category, seed=seed)


SNIPPETS = (
    "revenue increased",
    "net loss",
    "Gross margin declined",
    "was up",
    "fell",
    "in fiscal",
    "in FY",
    "Q2",
    "compared to",
    "of",
    "basis points",
    "bps",
    "percent",
    "million",
    "Billion",
    "thousand",
    "USD",
    "EUR",
    "$",
    "\u20ac",
    "%",
    "+",
    "-",
    "\u2212",
    "(",
    ")",
    ".",
    ",",
    "higher",
    "below",
    "surplus",
)
numbers = st.one_of(
    st.integers(0, 10**7).map(lambda n: f"{n:,}"),
    st.integers(0, 10**7).map(str),
    st.integers(1900, 2099).map(str),
    st.decimals(min_value=0, max_value=10**5, places=2, allow_nan=False).map(str),
)
financial_text = st.lists(st.one_of(st.sampled_from(SNIPPETS), numbers), max_size=30).flatmap(
    lambda parts: st.sampled_from([" ", ""]).map(lambda sep: sep.join(parts))
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(financial_text, st.sampled_from(perturb.CATEGORIES), st.integers(0, 2**32))
def test_properties_on_financial_text(text, category, seed):
    check_perturbation(text, category, seed)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200), st.sampled_from(perturb.CATEGORIES), st.integers(0, 2**32))
def test_properties_on_arbitrary_text(text, category, seed):
    check_perturbation(text, category, seed)


@settings(max_examples=150, deadline=None)
@given(financial_text, st.integers(0, 2**32))
def test_perturb_any_matches_its_category(text, seed):
    result = perturb.perturb_any(text, seed=seed)
    if result is not None:
        category, new = result
        assert category in perturb.CATEGORIES
        assert new == perturb.perturb_all(text, seed=seed)[category]
        assert any(changes_only(text, new, s, e) for s, e in allowed_regions(text, category))


@pytest.mark.parametrize(
    ("text", "perturbed", "category", "rule"),
    [
        ("sales of $5 million in 2019", "sales of $5 billion in 2019", "unit", "million->billion"),
        ("sales of $5 millions", "sales of $5 thousands", "unit", "million->thousand"),
        ("5 billion in 2019", "5 million in 2019", "unit", "billion->million"),
        ("up 5% in 2019", "up 5 bps in 2019", "unit", "%->bps"),
        ("up 40 bp in 2019", "up 40% in 2019", "unit", "bps->%"),
        ("5 percent in 2019", "5 basis points in 2019", "unit", "percent->basis point"),
        ("2 percentage points", "2 basis points", "unit", "percentage point->basis point"),
        ("$3M in 2019", "$3B in 2019", "unit", "M->B"),
        ("Revenue increased 5%", "Revenue decreased 5%", "polarity", "increased/decreased"),
        ("Revenue decreased 5%", "Revenue increased 5%", "polarity", "increased/decreased"),
        ("a Loss of $5", "a Gain of $5", "polarity", "gain/loss"),
        ("fell -3% in 2019", "fell +3% in 2019", "polarity", "sign"),
        ("tax of $34 million.", "tax of $3.4 million.", "magnitude", "/10"),
        ("Section 4.1.1 sets 2,500 units", "Section 4.1.1 sets 25,000 units", "magnitude", "x10"),
        ("in fiscal 2019 sales", "in fiscal 2017 sales", "period", "year-2"),
        ("in FY99 sales", "in FY01 sales", "period", "year+2"),
        ("USD 5 million", "EUR 5 million", "currency", "USD->EUR"),
    ],
)
def test_edit_rule_labels(text, perturbed, category, rule):
    assert perturb.edit_rule(text, perturbed, category) == rule


def test_candidate_edits_are_perturb_choices_with_their_rules():
    text = "Sales were $5 million, up 5% from 2019, and costs increased 3%."
    for category in ("unit", "polarity", "magnitude"):
        edits = perturb.candidate_edits(text, category)
        assert edits
        for seed in range(6):  # every seeded perturbation is one of the candidates
            assert perturb.perturb(text, category, seed) in [p for _, p in edits]
    rules = {rule for rule, _ in perturb.candidate_edits(text, "unit")}
    assert rules == {"million->billion", "million->thousand", "%->bps"}


def test_balanced_sampling_evens_out_rules():
    """100 passages admit only %->bps, 20 admit both %->bps and million->billion/thousand: plain
    sampling makes %->bps ~10 times the scale swaps; under `rule_weights` the three unit rules
    are drawn alike where they can be."""
    only_percent = [f"Margin rose {i}% in 2019." for i in range(1, 101)]
    both = [f"Sales were ${i} million, up {i}% in 2019." for i in range(1, 21)]
    texts = only_percent + both
    weights = perturb.rule_weights(texts, ["unit"])
    assert weights["unit"] == pytest.approx(
        {"%->bps": 1 / 120, "million->billion": 1 / 20, "million->thousand": 1 / 20}
    )
    drawn: dict[str, int] = {}
    for seed, text in enumerate(both * 20):
        category, perturbed = perturb.perturb_balanced(text, seed, ["unit"], weights)
        rule = perturb.edit_rule(text, perturbed, category)
        drawn[rule] = drawn.get(rule, 0) + 1
    # On the passages that admit all three: %->bps with p = (1/120) / (1/120 + 2/20) ~ 0.077.
    assert drawn["%->bps"] < 0.15 * 400
    assert abs(drawn["million->billion"] - drawn["million->thousand"]) < 0.2 * 400
    assert perturb.perturb_balanced("No numbers here.", 0, ["unit"], weights) is None
    # Seeded: the same draw twice.
    assert perturb.perturb_balanced(both[0], 7, ["unit"], weights) == perturb.perturb_balanced(
        both[0], 7, ["unit"], weights
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(financial_text)
def test_quantity_scope_is_a_subset_of_the_paper_rule(text):
    paper = perturb.candidate_sites(text, "polarity")
    quantity = perturb.candidate_sites(
        text, "polarity", rules=perturb.Rules(polarity_scope="quantity")
    )
    assert all(site in paper for site in quantity)
    for category in ("magnitude", "unit"):  # the scope touches polarity alone
        assert perturb.candidate_sites(
            text, category, rules=perturb.Rules(polarity_scope="quantity")
        ) == (perturb.candidate_sites(text, category))


def test_category_weights_tilt_the_category_draw_and_equal_weights_change_nothing():
    text = "Sales were $5 million, up 5% from 2019, and costs increased 3%."
    weights = perturb.rule_weights([text], ["unit", "polarity"])
    draw = [perturb.perturb_balanced(text, seed, ["unit", "polarity"], weights)
            for seed in range(200)]  # fmt: skip
    same = [perturb.perturb_balanced(text, seed, ["unit", "polarity"], weights,
                                     category_weights={"unit": 2.0, "polarity": 2.0})
            for seed in range(200)]  # fmt: skip
    assert same == draw
    tilted = [perturb.perturb_balanced(text, seed, ["unit", "polarity"], weights,
                                       category_weights={"polarity": 9.0})
              for seed in range(200)]  # fmt: skip
    share = [sum(c == "polarity" for c, _ in rows) / 200 for rows in (draw, tilted)]
    assert 0.4 < share[0] < 0.6 and share[1] > 0.85  # 1/2 and 9/10 in expectation


@pytest.mark.parametrize(
    "text",
    [
        "The expected return on plan assets was7.75% in 2015.",  # pdftotext glue
        "Rates rose by .5% this year.",
        "Revenue was 1.234,56 EUR.",  # European grouping
        "Balance as at 31.12.2023 was high.",
        "For the period ended June 30,2021 we reported.",
    ],
)
def test_no_site_inside_a_number(text):
    """A span is a whole number or none: editing a fragment wrote malformed numbers ("7.7.5%",
    "311.2.2023", "June 302,0201") or the same value ("7.750%", ".50%")."""
    assert perturb.candidate_edits(text, "magnitude") == []
    for start, end in perturb.numeric_spans(text):  # "2015" of the first is a whole year
        assert text[start - 1] not in ".,0123456789" and not re.match(r"[.,]?\d", text[end:])
    if "2015" not in text:  # a glued year is no period site either
        assert perturb.candidate_edits(text, "period") == []


def test_signed_numbers_keep_their_groups_and_plus_minus_pairs_are_no_sign_sites():
    text = "Net debt was \u22121,234 million."
    assert {out for _, out in perturb.candidate_edits(text, "magnitude")} == {
        "Net debt was \u221212,340 million.", "Net debt was \u2212123.4 million."}  # fmt: skip
    assert perturb.candidate_edits(text, "polarity") == [("sign", "Net debt was +1,234 million.")]
    for pair in ("+/-100 basis points", "+/\u2212100 basis points", "-/+100 bps"):
        assert perturb.candidate_edits(f"A {pair} change in rates.", "polarity") == [], pair


@pytest.mark.parametrize("label", ["FY2022-23", "fiscal 2021/22", "FY22-23", "2021\u201322"])
def test_period_skips_a_year_with_a_two_digit_companion(label):
    """Shifting the first year of "FY2022-23" alone wrote "FY2023-23"."""
    assert perturb.candidate_edits(f"Revenue for {label} was 1,234 crore.", "period") == []
    assert perturb.candidate_edits("Revenue for FY2022 was $5 million.", "period")


_WELL_FORMED = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+", re.ASCII)


def _number_run(text: str, start: int, end: int) -> str:
    """The run of digits, "." and "," around [start, end), without a trailing "." or ","."""
    while start > 0 and text[start - 1] in "0123456789.,":
        start -= 1
    while end < len(text) and text[end] in "0123456789.,":
        end += 1
    return text[start:end].rstrip(".,")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(financial_text)
def test_magnitude_edits_write_a_well_formed_other_number(text):
    """Glued or not, every magnitude edit turns a whole, well-formed number into another
    well-formed number of another value: never a fragment of a longer run of digits."""
    for _, out in perturb.candidate_edits(text, "magnitude"):
        start = len(os.path.commonprefix([text, out]))
        tail = min(len(os.path.commonprefix([text[::-1], out[::-1]])), len(text) - start)
        before = _number_run(text, start, len(text) - tail)
        after = _number_run(out, start, len(out) - tail)
        assert _WELL_FORMED.fullmatch(before) and _WELL_FORMED.fullmatch(after), (text, out)
        values = (decimal.Decimal(before.replace(",", "")), decimal.Decimal(after.replace(",", "")))
        assert values[1] in (values[0] * 10, values[0] / 10), (text, out)
