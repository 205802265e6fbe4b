"""EmbedNum-style numeracy test (Deng et al., "Revealing the Numeracy Gap"): Q / A+ / A- triples.

A question asks for a financial metric above or below a threshold; A+ satisfies it, A- differs
only in its number and does not. Accuracy = mean 1[sim(Q, A+) > sim(Q, A-)], overall and for each
numeric format of the paper's Table 1 (18 formats: "orig" and a1-e3). No jax.

The paper writes its 1K triples with an LLM from BULL questions; here they come from templates
over financial metrics. Choices it leaves open, fixed here:
- Formats follow Table 1's examples: b1-b4 have a one-digit integer part ("8.3", "8.7713"), c/d
  scale a single digit ("0.08", "800"), e1/e2 write a single-digit integer with " percentage" or
  "%" ("8 percentage", "8%") and e3 a four-digit integer with a comma ("3,035"), like a4's "3035".
- e1/e2 questions use percentage metrics (margins, growth); the other formats use dollar amounts
  ("$220 million"), per-share dollars or plain ratios.
- The two answers sit symmetrically around the threshold (200 -> 220 / 180, the paper's example),
  so the distance to the threshold tells nothing and only the comparison decides.
- Directions alternate, so each format has as many "above" as "below" questions.
"""

import dataclasses
import random
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import numpy as np

from caliber_jax.data import perturb
from caliber_jax.eval import EncodeFn
from caliber_jax.eval.numfine import ScoreFn, pair_scores


@dataclasses.dataclass(frozen=True)
class NumberFormat:
    """Numbers `units * 10**exponent` for integer units in [low, high], written by `render`."""

    low: int
    high: int
    exponent: int
    kind: str  # "plain", "comma", "percentage" (" percentage") or "percent" ("%")

    def render(self, units: int) -> str:
        value = Decimal(units).scaleb(self.exponent)
        text = f"{value:.{max(0, -self.exponent)}f}"
        if self.kind == "comma":
            return f"{int(value):,}"
        if self.kind == "percentage":
            return f"{text} percentage"
        if self.kind == "percent":
            return f"{text}%"
        return text


# Table 1 of the paper, in its order.
FORMATS: dict[str, NumberFormat] = {
    "orig": NumberFormat(1, 999, 0, "plain"),
    "a1": NumberFormat(1, 9, 0, "plain"),
    "a2": NumberFormat(10, 99, 0, "plain"),
    "a3": NumberFormat(100, 999, 0, "plain"),
    "a4": NumberFormat(1000, 9999, 0, "plain"),
    "b1": NumberFormat(10, 99, -1, "plain"),
    "b2": NumberFormat(100, 999, -2, "plain"),
    "b3": NumberFormat(1000, 9999, -3, "plain"),
    "b4": NumberFormat(10000, 99999, -4, "plain"),
    "c1": NumberFormat(1, 9, -1, "plain"),
    "c2": NumberFormat(1, 9, -2, "plain"),
    "c3": NumberFormat(1, 9, -3, "plain"),
    "d1": NumberFormat(1, 9, 1, "plain"),
    "d2": NumberFormat(1, 9, 2, "plain"),
    "d3": NumberFormat(1, 9, 3, "plain"),
    "e1": NumberFormat(1, 9, 0, "percentage"),
    "e2": NumberFormat(1, 9, 0, "percent"),
    "e3": NumberFormat(1000, 9999, 0, "comma"),
}
PERCENT_KINDS = ("percentage", "percent")

# (metric, template for the number): "{x}" is the rendered number.
MONEY_METRICS = (
    ("revenue", "${x} million"),
    ("net income", "${x} million"),
    ("free cash flow", "${x} million"),
    ("operating income", "${x} million"),
    ("capital expenditures", "${x} million"),
    ("total debt", "${x} million"),
    ("cash and cash equivalents", "${x} million"),
    ("research and development expense", "${x} million"),
    ("diluted EPS", "${x}"),
    ("dividends per share", "${x}"),
    ("book value per share", "${x}"),
    ("P/E ratio", "{x}"),
    ("current ratio", "{x}"),
    ("debt-to-equity ratio", "{x}"),
    ("interest coverage ratio", "{x}"),
    ("inventory turnover", "{x}"),
)
PERCENT_METRICS = (
    ("operating margin", "{x}"),
    ("gross margin", "{x}"),
    ("net profit margin", "{x}"),
    ("revenue growth", "{x}"),
    ("return on equity", "{x}"),
    ("dividend yield", "{x}"),
    ("effective tax rate", "{x}"),
    ("free cash flow margin", "{x}"),
)
COMPARISONS = {
    "above": ("above", "greater than", "more than", "over", "higher than", "exceeding"),
    "below": ("below", "less than", "under", "lower than", "not exceeding"),
}
QUESTIONS = (
    "Which companies reported {metric} {comparison} {number}?",
    "Which company has {metric} {comparison} {number}?",
    "Find the firms whose {metric} was {comparison} {number}.",
    "Which stocks show {metric} {comparison} {number}?",
)
ANSWERS = (
    "{company} reported {metric} of {number}.",
    "{possessive} {metric} was {number} last fiscal year.",
    "{company} posted {metric} of {number}.",
    "For {company}, {metric} came in at {number}.",
)
COMPANIES = (
    "Alder Industries", "Birchwood Capital", "Cobalt Systems", "Dunmore Foods", "Eastgate Energy",
    "Fairview Health", "Granite Logistics", "Harbor Semiconductor", "Ironleaf Retail",
    "Juniper Telecom", "Kestrel Motors", "Lumen Biotech", "Meridian Insurance",
    "Northwind Airlines", "Oakridge Materials", "Pinecrest Software",
)  # fmt: skip


def sample_triple(fmt: NumberFormat, direction: str, rng: random.Random) -> tuple[int, int, int]:
    """(threshold, A+ number, A- number) in units of `fmt`, with A+/A- = threshold +- gap.

    The threshold leaves room for a gap of at least one unit on both sides within [low, high].
    """
    if direction not in COMPARISONS:
        raise ValueError(f"direction={direction!r}, expected one of {sorted(COMPARISONS)}")
    threshold = rng.randint(fmt.low + 1, fmt.high - 1)
    gap = rng.randint(1, min(threshold - fmt.low, fmt.high - threshold))
    above, below = threshold + gap, threshold - gap
    return (threshold, above, below) if direction == "above" else (threshold, below, above)


def make_item(format_name: str, direction: str, rng: random.Random) -> dict[str, Any]:
    """One question / A+ / A- triple in format `format_name`."""
    if format_name not in FORMATS:
        raise ValueError(f"format {format_name!r}, expected one of {list(FORMATS)}")
    fmt = FORMATS[format_name]
    threshold, positive, negative = sample_triple(fmt, direction, rng)
    metrics = PERCENT_METRICS if fmt.kind in PERCENT_KINDS else MONEY_METRICS
    metric, number_template = rng.choice(metrics)
    comparison = rng.choice(COMPARISONS[direction])
    company = rng.choice(COMPANIES)
    question_template = rng.choice(QUESTIONS)
    answer_template = rng.choice(ANSWERS)

    def number(units: int) -> str:
        return number_template.format(x=fmt.render(units))

    def answer(units: int) -> str:
        possessive = company + ("'" if company.endswith("s") else "'s")
        text = answer_template.format(
            company=company, possessive=possessive, metric=metric, number=number(units)
        )
        return text[0].upper() + text[1:]

    return {
        "format": format_name,
        "direction": direction,
        "metric": metric,
        "question": question_template.format(
            metric=metric, comparison=comparison, number=number(threshold)
        ),
        "positive": answer(positive),
        "negative": answer(negative),
        "threshold": float(Decimal(threshold).scaleb(fmt.exponent)),
        "positive_value": float(Decimal(positive).scaleb(fmt.exponent)),
        "negative_value": float(Decimal(negative).scaleb(fmt.exponent)),
    }


def build_embednum(*, seed: int, per_format: int) -> list[dict[str, Any]]:
    """`per_format` triples for each of the 18 FORMATS, half "above" and half "below".

    Returns:
      Dicts {"id", "format", "direction", "metric", "question", "positive", "negative",
      "threshold", "positive_value", "negative_value"}; the same seed gives the same list.
    """
    if per_format < 1:
        raise ValueError(f"per_format={per_format} must be positive")
    items = []
    for format_name in FORMATS:
        rng = random.Random(perturb.derive_seed(seed, "embednum", format_name))
        for index in range(per_format):
            direction = ("above", "below")[index % 2]
            item = make_item(format_name, direction, rng)
            items.append({"id": f"embednum-{format_name}-{index}", **item})
    return items


def evaluate(
    encode_fn: EncodeFn | None,
    items: Sequence[Mapping[str, Any]],
    *,
    score_fn: ScoreFn | None = None,
) -> dict[str, float]:
    """Accuracy = mean 1[sim(Q, A+) > sim(Q, A-)] (strict), overall, per format and direction.

    sim is `score_fn(questions, answers)` when given (e.g. NASH), else the cosine of the
    `encode_fn` vectors (questions get no instruction prefix; wrap `encode_fn` to add one).

    Returns:
      {"overall": acc, "<format>": acc for each format present (FORMATS order), "above": acc,
      "below": acc}.
    """
    if not items:
        raise ValueError("EmbedNum needs at least one item")
    for item in items:
        if item["format"] not in FORMATS:
            raise ValueError(f"item {item.get('id')}: unknown format {item['format']!r}")
    questions = [item["question"] for item in items]
    answers = [item["positive"] for item in items] + [item["negative"] for item in items]
    scores = pair_scores(encode_fn, score_fn, questions + questions, answers)
    positive, negative = scores[: len(items)], scores[len(items) :]
    correct = positive > negative
    results = {"overall": float(np.mean(correct))}
    for key, values in (
        ("format", list(FORMATS)),
        ("direction", list(COMPARISONS)),
    ):
        for value in values:
            mask = np.array([item[key] == value for item in items])
            if mask.any():
                results[value] = float(np.mean(correct[mask]))
    return results
