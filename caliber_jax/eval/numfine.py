"""NumFinE (NASH paper, Sec. 4, App. G): graded numeric variants of real sentences, 3 protocols.

One evaluation unit is a sentence `s` with a target number `t` and k = 9 variants that change only
`t`. Scores: Triplet accuracy (easy / medium / hard negatives), Listwise Kendall tau_b, and
Cross-Pair accuracy across sentences of the same category. No jax.

Choices the paper leaves open, fixed here:
- Targets are `perturb.numeric_spans` matches, classified as `date` (a "Month D, YYYY" or
  "M/D/YYYY" date around a year span), `percentage` (followed by %, "percent", "percentage
  point(s)", or a bps span), `money` (a currency symbol right before it) or `quantity` (the rest).
  Bare years, "Q1 2023" / "FY2023", "3M"-style names and references ("Note 3.1") are not targets:
  the paper's date rule shifts days, which a year alone does not have.
- nu(t) is the numeral's value without its scale word (nu = 15 for "$15 million", as in Sec. 4.2.1)
  and a date's day number; only the numeral (or the whole date) is rewritten, so signs, "$", "%"
  and scale words stay, and the variant keeps the number of decimals; thousands separators are
  kept, and added when a short integer part grows past 999.
- Factors are log-uniform within the App. G range (so x0.5 and x2 are equally likely), drawn in k
  equal strata of log-factor so that the deviations are graded. A draw is rejected when its
  rendered value is 0, equals the original or an earlier variant, or ties an earlier deviation
  (triplet levels and the listwise order then have a strict gold order); a unit that cannot get k
  such variants (e.g. "5%", with too few values at its precision) is dropped.
"""

import calendar
import datetime
import math
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import numpy as np

from caliber_jax.data import corpus, perturb
from caliber_jax.eval import EncodeFn, encode_texts

CATEGORIES = ("date", "money", "percentage", "quantity")
# Appendix G: multiplicative ranges. Quantities <= 5 use the wider range; dates shift by days.
FACTOR_RANGE = {"money": (0.5, 2.0), "percentage": (0.5, 2.0), "quantity": (0.5, 2.0)}
SMALL_QUANTITY_MAX = 5
SMALL_QUANTITY_RANGE = (0.25, 4.0)
MAX_DAY_SHIFT = 30
# Sentence filter: long enough to have context, short enough for one sentence, not a table row.
MIN_SENTENCE_CHARS = 40
MAX_SENTENCE_CHARS = 400
MIN_WORDS = 6
MAX_DIGIT_FRACTION = 0.25
DRAWS_PER_STRATUM = 25
CROSS_PAIR_DRAWS = 10

ScoreFn = Callable[[list[str], list[str]], np.ndarray]

_NUMERAL_RE = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?", re.ASCII)
_YEAR_RE = re.compile(r"(?:19|20)\d{2}", re.ASCII)
_PERIOD_RE = re.compile(r"(?:Q[1-4]|FY)\s?\d{2,4}", re.IGNORECASE | re.ASCII)
_LETTER_UNIT_RE = re.compile(r"\d\s?[MBK]$", re.IGNORECASE | re.ASCII)
_PERCENT_AFTER_RE = re.compile(r"\s?(?:%|percent\b|percentage\s+points?\b)", re.IGNORECASE)
_BPS_RE = re.compile(r"(?:bps|bp|basis\s+points?)$", re.IGNORECASE)
_CURRENCY_BEFORE_RE = re.compile(r"[$\u20ac\u00a3\u00a5]\s?$")
_REFERENCE_RE = re.compile(
    r"\b(?:exhibits?|items?|sections?|notes?|rules?|articles?|schedules?|forms?|parts?|"
    r"regulations?|appendix|tables?|figures?|nos?\.|\u00a7+)\s*$",
    re.IGNORECASE,
)
_WORD_RE = re.compile(r"[A-Za-z]{2,}")
_MONTHS = {name.lower(): number for number, name in enumerate(calendar.month_name) if name}
_MONTHS.update({name.lower(): number for number, name in enumerate(calendar.month_abbr) if name})
_MONTHS["sept"] = 9
_MONTH_DATE_RE = re.compile(
    r"\b(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")(?P<dot>\.?)\s"
    r"(?P<day>\d{1,2}),\s?(?P<year>(?:19|20)\d{2})\b",
    re.IGNORECASE | re.ASCII,
)
_SLASH_DATE_RE = re.compile(
    r"(?<![\d/])(?P<month>\d{1,2})/(?P<day>\d{1,2})/(?P<year>(?:19|20)\d{2})\b", re.ASCII
)


def split_sentences(sentences_or_passages: Iterable[str | Mapping[str, Any]]) -> list[str]:
    """Unique sentences of plain strings or passage dicts (`text`), in input order.

    Lines are split at `corpus.split_sentences` boundaries; sentences outside
    [MIN_SENTENCE_CHARS, MAX_SENTENCE_CHARS], with fewer than MIN_WORDS words or more than
    MAX_DIGIT_FRACTION digits (table remnants) are dropped.
    """
    seen: dict[str, None] = {}
    for index, source in enumerate(sentences_or_passages):
        if isinstance(source, Mapping):
            if not isinstance(source.get("text"), str):
                raise ValueError(f"input {index}: passage dict without a string 'text' field")
            source = source["text"]
        if not isinstance(source, str):
            raise ValueError(f"input {index}: expected a string or a passage dict")
        for line in source.split("\n"):
            for sentence in corpus.split_sentences(" ".join(line.split())):
                if _keep_sentence(sentence):
                    seen.setdefault(sentence, None)
    return list(seen)


def _keep_sentence(sentence: str) -> bool:
    if not MIN_SENTENCE_CHARS <= len(sentence) <= MAX_SENTENCE_CHARS:
        return False
    if len(_WORD_RE.findall(sentence)) < MIN_WORDS:
        return False
    return sum(c.isdigit() for c in sentence) <= MAX_DIGIT_FRACTION * len(sentence)


def find_targets(sentence: str) -> list[dict[str, Any]]:
    """Candidate targets of a sentence: `{"category", "start", "end"}` of the text to rewrite.

    For dates the span is the whole date; otherwise it is the numeral inside the NUM_RE span
    (without "$", "%" or a scale word).
    """
    targets = []
    dates = [
        match
        for pattern in (_MONTH_DATE_RE, _SLASH_DATE_RE)
        for match in pattern.finditer(sentence)
        if _parse_date(match) is not None
    ]
    for start, end in perturb.numeric_spans(sentence):
        token = sentence[start:end]
        date = next((m for m in dates if m.span("year") == (start, end)), None)
        if date is not None:
            targets.append({"category": "date", "start": date.start(), "end": date.end()})
            continue
        if (
            _YEAR_RE.fullmatch(token)
            or _PERIOD_RE.fullmatch(token)
            or _REFERENCE_RE.search(sentence[max(0, start - 16) : start])
        ):
            continue
        money = bool(_CURRENCY_BEFORE_RE.search(sentence[max(0, start - 2) : start])) or (
            token[0] in "$\u20ac\u00a3\u00a5"
        )
        if _LETTER_UNIT_RE.search(token) and not money:
            continue  # "3M", "10K": a name far more often than an amount.
        numeral = _NUMERAL_RE.search(token)
        if numeral is None or Decimal(numeral.group().replace(",", "")) == 0:
            continue
        num_start, num_end = start + numeral.start(), start + numeral.end()
        if _BPS_RE.search(token) or _PERCENT_AFTER_RE.match(sentence, num_end):
            category = "percentage"
        elif money:
            category = "money"
        else:
            category = "quantity"
        targets.append({"category": category, "start": num_start, "end": num_end})
    return targets


def _parse_date(match: re.Match) -> datetime.date | None:
    month = match.group("month")
    month = int(month) if month.isdigit() else _MONTHS[month.lower()]
    try:
        return datetime.date(int(match.group("year")), month, int(match.group("day")))
    except ValueError:
        return None


def _match_date(text: str) -> datetime.date:
    match = _MONTH_DATE_RE.fullmatch(text) or _SLASH_DATE_RE.fullmatch(text)
    date = None if match is None else _parse_date(match)
    if date is None:
        raise ValueError(f"not a valid date: {text!r}")
    return date


def render_date(original: str, new: datetime.date) -> str:
    """`new` written in the style of `original` (month name, abbreviation, dot, zero padding)."""
    match = _MONTH_DATE_RE.fullmatch(original)
    if match is not None:
        written = match.group("month")
        if written.lower() in (name.lower() for name in calendar.month_name if name):
            month = calendar.month_name[new.month]
        else:
            month = calendar.month_abbr[new.month]
            if written.lower() == "sept" and new.month == 9:
                month = "Sept"
        if written.isupper():
            month = month.upper()
        padded = match.group("day").startswith("0")
        day = f"{new.day:02d}" if padded else str(new.day)
        between = original[match.end("day") : match.start("year")]
        return f"{month}{match.group('dot')} {day}{between}{new.year}"
    match = _SLASH_DATE_RE.fullmatch(original)
    if match is None:
        raise ValueError(f"not a date: {original!r}")
    month = f"{new.month:0{len(match.group('month'))}d}"
    day = f"{new.day:0{len(match.group('day'))}d}"
    return f"{month}/{day}/{new.year}"


def render_number(original: str, value: Decimal) -> str:
    """`value` in the format of the numeral `original`: same decimals, thousands separators.

    Separators are kept when `original` has them and added when its integer part has under four
    digits (filings write "1,900", not "1900"); a 4+ digit integer written without them stays so.
    """
    digits = original.replace(",", "")
    decimals = len(digits.partition(".")[2])
    text = f"{value:.{decimals}f}"
    integer, _, fraction = text.partition(".")
    if "," in original or len(digits.partition(".")[0]) < 4:
        integer = f"{int(integer):,}"
    return integer + ("." + fraction if fraction else "")


def _numeric_variants(
    numeral: str, category: str, k: int, rng: random.Random
) -> list[tuple[str, float, float]] | None:
    """k (rendered numeral, value, deviation) with distinct values and deviations, or None."""
    original = Decimal(numeral.replace(",", ""))
    quantum = Decimal(1).scaleb(-len(numeral.replace(",", "").partition(".")[2]))
    low, high = FACTOR_RANGE[category]
    if category == "quantity" and original <= SMALL_QUANTITY_MAX:
        low, high = SMALL_QUANTITY_RANGE
    edges = np.linspace(math.log(low), math.log(high), k + 1)
    values: set[Decimal] = {original}
    deviations: set[Decimal] = set()
    out = []
    for stratum in range(k):
        for draw in range(2 * DRAWS_PER_STRATUM):
            # Half the draws in the stratum; then anywhere in the range (coarse numerals).
            lo, hi = (
                (edges[stratum], edges[stratum + 1])
                if draw < DRAWS_PER_STRATUM
                else (
                    edges[0],
                    edges[-1],
                )
            )
            factor = Decimal(repr(math.exp(rng.uniform(lo, hi))))
            value = (original * factor).quantize(quantum, rounding=ROUND_HALF_UP)
            deviation = abs(value - original)
            if value != 0 and value not in values and deviation not in deviations:
                values.add(value)
                deviations.add(deviation)
                out.append((render_number(numeral, value), float(value), float(deviation)))
                break
        else:
            return None
    return out


def _date_variants(
    date_text: str, k: int, rng: random.Random
) -> list[tuple[str, float, float]] | None:
    """k (rendered date, day number, |shift| in days) with distinct shifts, or None."""
    base = _match_date(date_text)
    if k > MAX_DAY_SHIFT:
        return None
    # Distinct |shift| in 1..30, graded by drawing one from each of k strata of that range.
    edges = np.linspace(1, MAX_DAY_SHIFT + 1, k + 1)
    out = []
    for stratum in range(k):
        shift = rng.randrange(int(math.ceil(edges[stratum])), int(math.ceil(edges[stratum + 1])))
        shift *= rng.choice((-1, 1))
        new = base + datetime.timedelta(days=shift)
        out.append((render_date(date_text, new), float(new.toordinal()), float(abs(shift))))
    return out


def make_unit(
    sentence: str, target: Mapping[str, Any], *, k: int, rng: random.Random
) -> dict[str, Any] | None:
    """One evaluation unit: the sentence, its target and k variants, or None if it cannot have k.

    Returns:
      {"category", "anchor", "span": [start, end], "target", "value", "variants": [{"text",
      "span", "target", "value", "deviation"}, ...]}, variants shuffled.
      `deviation` is the paper's d_nu = |nu(t) - nu(t~)| (days for dates).
    """
    start, end = target["start"], target["end"]
    original = sentence[start:end]
    category = target["category"]
    if category == "date":
        value = float(_match_date(original).toordinal())
        rendered = _date_variants(original, k, rng)
    else:
        value = float(Decimal(original.replace(",", "")))
        rendered = _numeric_variants(original, category, k, rng)
    if rendered is None:
        return None
    rng.shuffle(rendered)
    variants = []
    for text, new_value, deviation in rendered:
        variants.append(
            {
                "text": sentence[:start] + text + sentence[end:],
                "span": [start, start + len(text)],
                "target": text,
                "value": new_value,
                "deviation": deviation,
            }
        )
    return {
        "category": category,
        "anchor": sentence,
        "span": [start, end],
        "target": original,
        "value": value,
        "variants": variants,
    }


def build_numfine(
    sentences_or_passages: Iterable[str | Mapping[str, Any]],
    *,
    seed: int,
    k: int = 9,
    max_items: int,
) -> list[dict[str, Any]]:
    """Builds up to `max_items` NumFinE units, deterministically from `seed`.

    Sentences are visited in a seeded order; each contributes at most one unit, for one target
    picked at random among its `find_targets`. Then units are paired within a category for the
    Cross-Pair protocol (Sec. 4.4.2): each pair draws one variant of each unit, redrawn when the
    two deviations tie, and the first unit of the pair records it under "cross_pair".

    Args:
      sentences_or_passages: strings or passage dicts with a `text` field.
      seed: fixes sentence order, targets, factors and pairs.
      k: variants per unit (the paper's k = 9; needs k >= 4).
      max_items: the number of units to stop at.

    Returns:
      Units as from `make_unit`, plus "id" ("numfine-<i>") and, on the first unit of each
      Cross-Pair, "cross_pair": {"partner": id, "variant": i, "partner_variant": j}.
    """
    if k < 4:
        raise ValueError(f"k={k}: the medium triplet needs k >= 4 (the paper uses k = 9)")
    if max_items < 1:
        raise ValueError(f"max_items={max_items} must be positive")
    sentences = split_sentences(sentences_or_passages)
    random.Random(perturb.derive_seed(seed, "numfine-order")).shuffle(sentences)
    items: list[dict[str, Any]] = []
    for sentence in sentences:
        targets = find_targets(sentence)
        if not targets:
            continue
        rng = random.Random(perturb.derive_seed(seed, "numfine", sentence))
        unit = make_unit(sentence, rng.choice(targets), k=k, rng=rng)
        if unit is None:
            continue
        items.append({"id": f"numfine-{len(items)}", **unit})
        if len(items) == max_items:
            break
    _pair_units(items, seed)
    return items


def _pair_units(items: list[dict[str, Any]], seed: int) -> None:
    rng = random.Random(perturb.derive_seed(seed, "numfine-cross-pair"))
    for category in CATEGORIES:
        units = [item for item in items if item["category"] == category]
        rng.shuffle(units)
        for first, second in zip(units[0::2], units[1::2], strict=False):
            for _ in range(CROSS_PAIR_DRAWS):
                i = rng.randrange(len(first["variants"]))
                j = rng.randrange(len(second["variants"]))
                if first["variants"][i]["deviation"] != second["variants"][j]["deviation"]:
                    first["cross_pair"] = {
                        "partner": second["id"],
                        "variant": i,
                        "partner_variant": j,
                    }
                    break


def triplet_negatives(k: int) -> dict[str, int]:
    """0-based ranks (by ascending deviation) of the Sec. 4.4.1 negatives; the positive is rank 0.

    Easy = s~_(k), medium = s~_(floor(k/2)), hard = s~_(2), in the paper's 1-based order.
    """
    return {"easy": k - 1, "medium": k // 2 - 1, "hard": 1}


def kendall_tau_b(similarities: Sequence[float], deviations: Sequence[float]) -> float:
    """tau_b between the similarity order and the gold order (smaller deviation = more similar).

    Constant similarities rank nothing; tau_b is undefined there and counts as 0.
    """
    import scipy.stats  # here, not at the top: prepare and evaluate would pay ~0.4 s per launch

    result = scipy.stats.kendalltau(np.asarray(similarities), -np.asarray(deviations))
    return 0.0 if np.isnan(result.statistic) else float(result.statistic)


def pair_scores(
    encode_fn: EncodeFn | None,
    score_fn: ScoreFn | None,
    texts_a: list[str],
    texts_b: list[str],
) -> np.ndarray:
    """Similarity of each (texts_a[i], texts_b[i]): `score_fn`, else cosine of `encode_fn`.

    With `encode_fn`, each distinct text is encoded once. Returns `[n]` float64.
    """
    if score_fn is not None:
        scores = np.asarray(score_fn(texts_a, texts_b), np.float64)
        if scores.shape != (len(texts_a),) or not np.all(np.isfinite(scores)):
            raise ValueError(
                f"score_fn gave shape {scores.shape} (finite: {np.all(np.isfinite(scores))}) for "
                f"{len(texts_a)} pairs"
            )
        return scores
    if encode_fn is None:
        raise ValueError("pass an encode_fn or a score_fn")
    unique = list(dict.fromkeys(texts_a + texts_b))
    vectors = encode_texts(encode_fn, unique, "NumFinE texts").astype(np.float64)
    row = {text: index for index, text in enumerate(unique)}
    a = vectors[[row[t] for t in texts_a]]
    b = vectors[[row[t] for t in texts_b]]
    return np.sum(a * b, axis=1)


def evaluate(
    encode_fn: EncodeFn | None,
    items: Sequence[Mapping[str, Any]],
    *,
    score_fn: ScoreFn | None = None,
) -> dict[str, Any]:
    """Triplet accuracy per level, mean Listwise tau_b and Cross-Pair accuracy (Sec. 4.4).

    sim(s, s~) is `score_fn(anchors, variants)` when given (e.g. NASH), else the cosine of the
    `encode_fn` vectors. Accuracies count strict wins: sim(s, s~+) > sim(s, s~-).

    Returns:
      {"triplet": {"easy", "medium", "hard"}, "listwise_tau_b", "cross_pair", "n",
      "n_cross_pair"}; "cross_pair" is NaN when no unit has its partner in `items`.
    """
    if not items:
        raise ValueError("NumFinE needs at least one unit")
    k = len(items[0]["variants"])
    for item in items:
        if len(item["variants"]) != k:
            raise ValueError(
                f"unit {item.get('id')}: {len(item['variants'])} variants, expected {k}"
            )
    texts_a = [item["anchor"] for item in items for _ in item["variants"]]
    texts_b = [variant["text"] for item in items for variant in item["variants"]]
    sims = pair_scores(encode_fn, score_fn, texts_a, texts_b).reshape(len(items), k)
    deviations = np.array([[v["deviation"] for v in item["variants"]] for item in items])

    order = np.argsort(deviations, axis=1, kind="stable")
    ranked = np.take_along_axis(sims, order, axis=1)
    triplet = {
        level: float(np.mean(ranked[:, 0] > ranked[:, rank]))
        for level, rank in triplet_negatives(k).items()
    }
    tau = float(np.mean([kendall_tau_b(s, d) for s, d in zip(sims, deviations, strict=True)]))

    row_of = {item["id"]: row for row, item in enumerate(items)}
    correct = []
    for row, item in enumerate(items):
        pair = item.get("cross_pair")
        if pair is None or pair["partner"] not in row_of:
            continue  # A subset (one category, say) may leave a partner out.
        partner = row_of[pair["partner"]]
        i, j = pair["variant"], pair["partner_variant"]
        closer_first = deviations[row, i] < deviations[partner, j]
        higher_first = sims[row, i] > sims[partner, j]
        lower_first = sims[row, i] < sims[partner, j]
        correct.append(higher_first if closer_first else lower_first)
    return {
        "triplet": triplet,
        "listwise_tau_b": tau,
        "cross_pair": float(np.mean(correct)) if correct else float("nan"),
        "n": len(items),
        "n_cross_pair": len(correct),
    }


def load_numfine(path: str) -> list[dict[str, Any]]:
    """Reads NumFinE units saved as JSONL (one `build_numfine` unit per line).

    Raises:
      ValueError: "<path>:<line>: ..." for malformed JSON or a unit without anchor / variants.
    """
    items = []
    for number, item in corpus.iter_jsonl(path):
        where = f"{path}:{number}"
        for field in ("id", "category", "anchor", "variants"):
            if field not in item:
                raise ValueError(f"{where}: missing field {field!r}")
        for variant in item["variants"]:
            if not isinstance(variant, dict) or not {"text", "deviation"} <= set(variant):
                raise ValueError(f"{where}: each variant needs 'text' and 'deviation'")
        items.append(item)
    if not items:
        raise ValueError(f"{path}: no NumFinE units")
    return items


def evaluate_scorers(
    evaluate_fn: Callable[..., dict[str, Any]],
    encode_fn: EncodeFn,
    items: Sequence[Mapping[str, Any]],
    nash_fn: ScoreFn | None,
) -> dict[str, dict[str, Any]]:
    """{"cosine": evaluate_fn(encode_fn, items), "nash": ... with score_fn=nash_fn} (if given).

    `evaluate_fn` is this module's or `eval.embednum`'s `evaluate`.
    """
    results = {"cosine": evaluate_fn(encode_fn, items)}
    if nash_fn is not None:
        results["nash"] = evaluate_fn(None, items, score_fn=nash_fn)
    return results
