"""Numeric tokens and the rule-based numeric perturbations of Caliber (paper §3.3, App. D.2-D.3).

Every rule proposes *sites* (one numeric span, one direction word, or one unit/currency token next
to a number), each with one or more alternative edits; a seeded RNG picks a site and an edit. The
result differs from the input only inside that site, by 1 to 30 characters of edit distance.
"""

import dataclasses
import functools
import hashlib
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal

from rapidfuzz.distance import Levenshtein

CATEGORIES = ("magnitude", "polarity", "period", "unit", "currency")
MIN_EDIT_DISTANCE = 1
MAX_EDIT_DISTANCE = 30
# Appendix D.3: direction words count only this close (in characters) to a numeric span.
POLARITY_WINDOW = 50
# Where a direction word may be swapped. "paper" is Appendix D.3: within POLARITY_WINDOW
# characters of any numeric span, years and dates included, so "as indicated above ... in 2021"
# counts. "quantity" keeps only the words that govern an amount: a numeric span that is no year,
# period or document reference ("Item 7") lies at most QUANTITY_WORDS words away, inside the
# window and with no sentence break between them ("rose 5%", "below $10 million", "a loss of
# $3.2 million"). The headline study measured the difference: most "above"/"below" pairs of the
# paper rule are cross-references, and no student learns to separate those as numbers.
POLARITY_SCOPES = ("paper", "quantity")
QUANTITY_WORDS = 4
# Which scale words a unit edit may swap. "paper" is Appendix D.2's table: million -> billion or
# thousand, billion -> million, thousand -> million ("$5M" -> "$5B", "$2B" -> "$2M", "$9K" ->
# "$9M"). "all" swaps every scale for every other, both ways: billion <-> thousand and the
# letters' K <-> B and M -> K as well. An independent check found students that separate one
# direction of one word (million -> x) and not its reverse; this set trains and tests all six.
SCALE_SETS = ("paper", "all")
# A sentence ends at [.;:!?] before a space, the end or a capital (PDF text drops spaces: "bps.As").
_SENTENCE_BREAK_RE = re.compile(r"[.;:!?](?:\s|$|(?=[A-Z]))|\n")

# Appendix D.2, without the PDF spacing artefacts ("(? :" -> "(?:", "\d {2,4}" -> "\d{2,4}",
# "[ + \u2212 ]" -> "[+\u2212]": VERBOSE keeps spaces inside a character class). re.ASCII keeps
# `\d` to 0-9, so that reformatting a number never swaps the digits' script. A span is a whole
# number or none: it neither starts right after "." or "," nor ends before a digit or a "."/","
# and a digit, so ".5%", "1.234,56", "31.12.2023", "June 30,2021" and the "75%" of a glued
# "was7.75%" are no sites (a fragment's edit wrote "7.7.5%", or "7.750%" at the same value); a
# signed number takes its thousands groups ("\u22121,234").
NUM_RE = re.compile(
    r"""
    (?<![A-Za-z0-9.,])
    (?:
        \$?\d{1,3}(?:,\d{3})+(?:\.\d+)?
        | \$?\d+\.\d+
        | \$?\d+%
        | \d+\s?(?:bps|bp|basis\s+points?)
        | \d+(?:\.\d+)?\s?(?:million|billion|thousand|M|B|K)\b
        | (?:Q[1-4]|FY)\s?\d{2,4}
        | \b(?:19|20)\d{2}\b
        | [+\u2212]\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?
    )
    (?![.,]?\d)
    """,
    re.VERBOSE | re.IGNORECASE | re.ASCII,
)

_YEAR_RE = re.compile(r"(?:19|20)\d{2}", re.ASCII)
_PERIOD_SPAN_RE = re.compile(r"(?:Q[1-4]|FY)\s?(\d{2,4})", re.IGNORECASE | re.ASCII)
_NUMBER_RE = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?", re.ASCII)
_YEAR_SHIFTS = (-3, -2, -1, 1, 2, 3)

# Each pair is swapped both ways; a word in two pairs ("loss") maps back through its first pair.
_DIRECTION_PAIRS = (
    ("increase", "decrease"),
    ("increases", "decreases"),
    ("increased", "decreased"),
    ("increasing", "decreasing"),
    ("rise", "fall"),
    ("rises", "falls"),
    ("rose", "fell"),
    ("risen", "fallen"),
    ("rising", "falling"),
    ("grew", "declined"),
    ("grow", "decline"),
    ("grows", "declines"),
    ("growing", "declining"),
    ("gain", "loss"),
    ("gains", "losses"),
    ("profit", "loss"),
    ("profits", "losses"),
    ("profitable", "unprofitable"),
    ("surplus", "deficit"),
    ("surpluses", "deficits"),
    ("higher", "lower"),
    ("highest", "lowest"),
    ("high", "low"),
    ("up", "down"),
    ("upward", "downward"),
    ("positive", "negative"),
    ("positively", "negatively"),
    ("inflow", "outflow"),
    ("inflows", "outflows"),
    ("improved", "deteriorated"),
    ("improve", "deteriorate"),
    ("improves", "deteriorates"),
    ("improving", "deteriorating"),
    ("improvement", "deterioration"),
    ("widened", "narrowed"),
    ("widen", "narrow"),
    ("widening", "narrowing"),
    ("above", "below"),
    ("more", "less"),
    ("favorable", "unfavorable"),
    ("favourable", "unfavourable"),
    ("strengthened", "weakened"),
    ("stronger", "weaker"),
    ("maximum", "minimum"),
    ("upside", "downside"),
)
DIRECTION_WORDS: dict[str, str] = {}
for _first, _second in _DIRECTION_PAIRS:
    DIRECTION_WORDS.setdefault(_first, _second)
    DIRECTION_WORDS.setdefault(_second, _first)
# Hyphens count as word characters here so that "up-front" or "non-increase" stay untouched.
_DIRECTION_RE = re.compile(
    r"(?<![\w-])(" + "|".join(sorted(DIRECTION_WORDS, key=len, reverse=True)) + r")(?![\w-])",
    re.IGNORECASE | re.ASCII,
)
_SIGN_FLIP = {"+": "-", "-": "+", "\u2212": "+"}

# A unit token directly after a digit; single-letter units only without a space ("5M", "2.1B").
_UNIT_RE = re.compile(
    r"(?<=\d)(?P<sep>\s?)(?P<unit>"
    r"(?i:millions?|billions?|thousands?|basis\s+points?|percentage\s+points?|percent|bps|bp)\b"
    r"|%|(?<=\d)[MBK]\b)",
    re.ASCII,
)
_SCALE_SWAPS = {
    "paper": {
        "million": ("billion", "thousand"),
        "billion": ("million",),
        "thousand": ("million",),
    },
    "all": {
        "million": ("billion", "thousand"),
        "billion": ("million", "thousand"),
        "thousand": ("million", "billion"),
    },
}
_LETTER_SWAPS = {"paper": {"M": ("B",), "B": ("M",), "K": ("M",)},
                 "all": {"M": ("B", "K"), "B": ("M", "K"), "K": ("M", "B")}}  # fmt: skip
_LETTERS = ("M", "B", "K")
_LETTER_UNIT_RE = re.compile(r"\d\s?[MBK]$", re.IGNORECASE | re.ASCII)
_MONEY_PREFIX_RE = re.compile(r"[$\u20ac\u00a3\u00a5]\s?$")
_REFERENCE_RE = re.compile(
    r"\b(?:exhibits?|items?|sections?|notes?|rules?|articles?|schedules?|forms?|parts?|"
    r"regulations?|appendix|tables?|figures?|nos?\.|\u00a7+)\s*$",
    re.IGNORECASE,
)

ISO_CODES = ("USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "CNY", "HKD", "INR", "SEK", "NOK")
CURRENCY_SYMBOLS = ("$", "\u20ac", "\u00a3", "\u00a5")
_CODES = "|".join(ISO_CODES)
_CODE_BEFORE_RE = re.compile(rf"(?<![A-Za-z])(?P<code>{_CODES})(?=\s?\d)", re.ASCII)
_CODE_AFTER_RE = re.compile(
    rf"\d(?:\s?(?i:million|billion|thousand)s?)?\s?(?P<code>{_CODES})(?![A-Za-z])", re.ASCII
)
_SYMBOL_RE = re.compile(r"(?<![A-Za-z])(?P<code>[$\u20ac\u00a3\u00a5])(?=\s?\d)", re.ASCII)


@dataclasses.dataclass(frozen=True)
class Rules:
    """The choices inside the rules that differ from the paper's: where direction words count
    (`polarity_scope`, POLARITY_SCOPES) and which scale words a unit edit swaps (`scales`,
    SCALE_SETS). `Rules()` is Appendix D."""

    polarity_scope: str = "paper"
    scales: str = "paper"

    def __post_init__(self):
        if self.polarity_scope not in POLARITY_SCOPES:
            raise ValueError(
                f"unknown polarity scope {self.polarity_scope!r}; expected one of {POLARITY_SCOPES}"
            )
        if self.scales not in SCALE_SETS:
            raise ValueError(f"unknown scale set {self.scales!r}; expected one of {SCALE_SETS}")


PAPER_RULES = Rules()


@dataclasses.dataclass(frozen=True)
class Edit:
    """Replace `text[start:end]` with `replacement`."""

    start: int
    end: int
    replacement: str

    def apply(self, text: str) -> str:
        return text[: self.start] + self.replacement + text[self.end :]


Site = list[Edit]  # Alternative edits of one span, word or token.


def numeric_spans(text: str) -> list[tuple[int, int]]:
    """Returns the sorted, non-overlapping `(start, end)` offsets of NUM_RE matches in `text`."""
    return [match.span() for match in NUM_RE.finditer(text)]


def edit_distance(a: str, b: str) -> int:
    """Character-level Levenshtein distance."""
    return Levenshtein.distance(a, b)


def derive_seed(seed: int, *keys: object) -> int:
    """Mixes `seed` with `keys` into a 63-bit seed that does not depend on `PYTHONHASHSEED`."""
    payload = "\x1f".join(str(part) for part in (seed, *keys)).encode("utf-8")
    return int.from_bytes(hashlib.sha256(payload).digest()[:8], "big") >> 1


def _is_period_token(token: str) -> bool:
    return bool(_YEAR_RE.fullmatch(token) or _PERIOD_SPAN_RE.fullmatch(token))


def shift_decimal(number: str, exponent: int) -> str | None:
    """Moves the decimal point of a numeral `exponent` places right (left when negative).

    The digits stay as written ("1.500" -> "15.00" or "0.1500"); an integer only gains the
    decimals it needs ("3,400" -> "340", "3,455" -> "345.5"). Thousand separators are regrouped
    unless the input spells a 4+ digit integer part without them ("1234.5" -> "12345").

    Returns:
      The new numeral, or None for zero (which no shift changes).
    """
    digits = number.replace(",", "")
    value = Decimal(digits)
    if value == 0:
        return None
    shifted = value.scaleb(exponent)
    decimals = len(digits.partition(".")[2])
    if decimals:
        places = max(0, decimals - exponent)
    else:
        places = max(0, -shifted.normalize().as_tuple().exponent)
    integer, _, fraction = f"{shifted:.{places}f}".partition(".")
    if "," in number or len(digits.partition(".")[0]) < 4:
        integer = f"{int(integer):,}"
    return integer + ("." + fraction if fraction else "")


def _has_money_prefix(text: str, number_start: int) -> bool:
    """True when a currency symbol directly precedes the number starting at `number_start`."""
    return bool(_MONEY_PREFIX_RE.search(text, max(0, number_start - 2), number_start))


def _is_reference(text: str, start: int) -> bool:
    """True for a number that labels a document part ("Exhibit 31.2", "Item 5.03", "Note 3.1")."""
    return bool(_REFERENCE_RE.search(text, max(0, start - 16), start))


def _is_bare_letter_unit(text: str, start: int, end: int) -> bool:
    """A "3M" or "10K" without a currency symbol is more often a name ("3M Company") than money."""
    return bool(_LETTER_UNIT_RE.search(text, start, end)) and not _has_money_prefix(text, start)


def _magnitude_sites(text: str, spans: Sequence[tuple[int, int]], rules: Rules) -> list[Site]:
    del rules  # no choice inside this category
    sites = []
    for start, end in spans:
        token = text[start:end]
        if (
            _is_period_token(token)
            or _is_bare_letter_unit(text, start, end)
            or _is_reference(text, start)
        ):
            continue
        number = _NUMBER_RE.search(token)
        if number is None:
            continue
        edits = []
        for exponent in (1, -1):
            shifted = shift_decimal(number.group(), exponent)
            if shifted is not None and shifted != number.group():
                edits.append(Edit(start + number.start(), start + number.end(), shifted))
        if edits:
            sites.append(edits)
    return sites


def _match_case(original: str, word: str) -> str:
    if len(original) > 1 and original.isupper():
        return word.upper()
    if original[:1].isupper():
        return word[:1].upper() + word[1:]
    return word


def _near_span(start: int, end: int, spans: Sequence[tuple[int, int]]) -> bool:
    return any(
        max(span_start - end, start - span_end) <= POLARITY_WINDOW for span_start, span_end in spans
    )


def _is_quantity(text: str, start: int, end: int) -> bool:
    """A numeric span that states an amount: no year or fiscal period, no "Item 7"-style label,
    no bare "3M"-style name."""
    token = text[start:end]
    return not (
        _is_period_token(token)
        or _is_reference(text, start)
        or _is_bare_letter_unit(text, start, end)
    )


def _governs(text: str, start: int, end: int, amounts: Sequence[tuple[int, int]]) -> bool:
    """True when the word `text[start:end]` is close to one of `amounts` (quantity spans) in the
    "quantity" scope's sense: at most QUANTITY_WORDS words and POLARITY_WINDOW characters between
    them, no sentence break."""
    for span_start, span_end in amounts:
        gap = text[end:span_start] if span_start >= end else text[span_end:start]
        if (
            len(gap) <= POLARITY_WINDOW
            and len(gap.split()) <= QUANTITY_WORDS
            and not _SENTENCE_BREAK_RE.search(gap)
        ):
            return True
    return False


def _polarity_sites(text: str, spans: Sequence[tuple[int, int]], rules: Rules) -> list[Site]:
    if rules.polarity_scope == "paper":
        near, anchors = _near_span, spans
    else:  # the amounts among the spans, found once for every direction word
        near = functools.partial(_governs, text)
        anchors = [(a, b) for a, b in spans if _is_quantity(text, a, b)]
    sites = []
    for match in _DIRECTION_RE.finditer(text):
        if near(match.start(), match.end(), anchors):
            opposite = DIRECTION_WORDS[match.group().lower()]
            sites.append([Edit(match.start(), match.end(), _match_case(match.group(), opposite))])
    for start, end in spans:
        token = text[start:end]
        if token[0] in _SIGN_FLIP:
            if not _in_sign_pair(text, start):
                sites.append([Edit(start, start + 1, _SIGN_FLIP[token[0]])])
        elif (
            start > 0
            and text[start - 1] in _SIGN_FLIP
            and (start == 1 or not text[start - 2].isalnum())
            and not _in_sign_pair(text, start - 1)
            and not _is_period_token(token)
        ):
            # An ASCII "-" (or a "+" the regex left out, as in "+$5") signs the number it touches.
            sites.append([Edit(start - 1, start, _SIGN_FLIP[text[start - 1]])])
    return sites


def _in_sign_pair(text: str, sign: int) -> bool:
    """The sign at `sign` is the second of a "+/-" (or "-/+") pair, which says "either way": no
    polarity site ("+/-100 basis points" became "+/+100")."""
    return sign >= 2 and text[sign - 1] == "/" and text[sign - 2] in _SIGN_FLIP


# A two-digit companion year after a year ("FY2022-23", "fiscal 2021/22"): shifting the first
# year alone writes "FY2023-23", so such a year is no period site.
_YEAR_PAIR_RE = re.compile(r"[-/\u2013]\d{2}(?!\d)", re.ASCII)


def _shift_year(digits: str, delta: int) -> str | None:
    year = int(digits) + delta
    if len(digits) == 2:
        return f"{year % 100:02d}"
    if len(digits) == 4 and 1900 <= year <= 2099:
        return str(year)
    return None


def _period_sites(text: str, spans: Sequence[tuple[int, int]], rules: Rules) -> list[Site]:
    del rules  # no choice inside this category
    sites = []
    for start, end in spans:
        token = text[start:end]
        period = _PERIOD_SPAN_RE.fullmatch(token)
        if period is not None:
            year_start, year_end = start + period.start(1), start + period.end(1)
        elif _YEAR_RE.fullmatch(token):
            year_start, year_end = start, end
        else:
            continue
        if _YEAR_PAIR_RE.match(text, year_end):
            continue
        edits = []
        for delta in _YEAR_SHIFTS:
            shifted = _shift_year(text[year_start:year_end], delta)
            if shifted is not None:
                edits.append(Edit(year_start, year_end, shifted))
        if edits:
            sites.append(edits)
    return sites


def _unit_replacements(separator: str, unit: str, scales: str) -> list[str]:
    if unit in _LETTERS:
        return [] if separator else list(_LETTER_SWAPS[scales][unit])
    if unit == "%":
        return [" bps"]
    lower = " ".join(unit.lower().split())
    plural = "s" if lower.endswith("s") and lower != "bps" else ""
    scale = lower.removesuffix("s")
    if scale in _SCALE_SWAPS[scales]:
        words = [other + plural for other in _SCALE_SWAPS[scales][scale]]
    elif lower in ("bps", "bp"):
        return ["%"]
    elif lower.startswith("basis"):
        words = ["percent"]
    elif lower.startswith("percentage"):
        words = ["basis point" + plural]
    else:  # percent
        words = ["basis points"]
    return [separator + _match_case(unit, word) for word in words]


def _unit_sites(text: str, spans: Sequence[tuple[int, int]], rules: Rules) -> list[Site]:
    del spans  # Any number may carry a unit ("5 percent" is no NUM_RE span).
    sites = []
    for match in _UNIT_RE.finditer(text):
        if match.group("unit") in _LETTERS:
            number_start = match.start()
            while number_start > 0 and text[number_start - 1] in "0123456789.,":
                number_start -= 1
            if not _has_money_prefix(text, number_start):
                continue  # "3M Company", "10K run": see _is_bare_letter_unit.
        replacements = _unit_replacements(match.group("sep"), match.group("unit"), rules.scales)
        if replacements:
            sites.append([Edit(match.start(), match.end(), new) for new in replacements])
    return sites


def _currency_sites(text: str, spans: Sequence[tuple[int, int]], rules: Rules) -> list[Site]:
    del spans, rules  # A currency token next to a number is enough; no choice inside.
    found = {}
    for pattern, choices in (
        (_CODE_BEFORE_RE, ISO_CODES),
        (_CODE_AFTER_RE, ISO_CODES),
        (_SYMBOL_RE, CURRENCY_SYMBOLS),
    ):
        for match in pattern.finditer(text):
            start, end = match.span("code")
            others = [code for code in choices if code != match.group("code")]
            found[start] = [Edit(start, end, other) for other in others]
    return [found[start] for start in sorted(found)]


_SITE_FNS: dict[str, Callable[[str, Sequence[tuple[int, int]], Rules], list[Site]]] = {
    "magnitude": _magnitude_sites,
    "polarity": _polarity_sites,
    "period": _period_sites,
    "unit": _unit_sites,
    "currency": _currency_sites,
}


def _check_categories(categories: Iterable[str]) -> None:
    for category in categories:
        if category not in _SITE_FNS:
            raise ValueError(f"unknown perturbation category {category!r}; expected {CATEGORIES}")


def _sites(text: str, spans: Sequence[tuple[int, int]], category: str, rules: Rules) -> list[Site]:
    return _SITE_FNS[category](text, spans, rules)


def candidate_sites(text: str, category: str, *, rules: Rules = PAPER_RULES) -> list[Site]:
    """Every site where `category` could edit `text` under `rules`, before the edit-distance
    filter."""
    _check_categories([category])
    spans = numeric_spans(text)
    return _sites(text, spans, category, rules) if spans else []


def _choose(text: str, sites: list[Site], seed: int) -> str | None:
    rng = random.Random(seed)
    order = list(range(len(sites)))
    rng.shuffle(order)
    for index in order:
        edits = list(sites[index])
        rng.shuffle(edits)
        for edit in edits:
            perturbed = edit.apply(text)
            distance = edit_distance(text, perturbed) if perturbed != text else 0
            if MIN_EDIT_DISTANCE <= distance <= MAX_EDIT_DISTANCE:
                return perturbed
    return None


def perturb(text: str, category: str, seed: int = 0, *, rules: Rules = PAPER_RULES) -> str | None:
    """Applies one seeded `category` perturbation to `text`.

    Args:
      text: passage with at least one numeric token (NUM_RE); other texts give None.
      category: one of CATEGORIES.
      seed: picks the site and the edit; the same inputs always give the same output.
      rules: where direction words count and which scales swap (`Rules()`: Appendix D).

    Returns:
      The perturbed text, or None when the rule cannot fire.
    """
    return _choose(text, candidate_sites(text, category, rules=rules), seed)


def perturb_all(
    text: str,
    seed: int = 0,
    categories: Sequence[str] = CATEGORIES,
    *,
    rules: Rules = PAPER_RULES,
) -> dict[str, str]:
    """Maps each category in `categories` that fires on `text` to its perturbed text."""
    _check_categories(categories)
    spans = numeric_spans(text)
    if not spans:
        return {}
    fired = {}
    for category in categories:
        sites = _sites(text, spans, category, rules)
        perturbed = _choose(text, sites, derive_seed(seed, category))
        if perturbed is not None:
            fired[category] = perturbed
    return fired


def perturb_any(
    text: str,
    seed: int = 0,
    categories: Sequence[str] = CATEGORIES,
    *,
    rules: Rules = PAPER_RULES,
) -> tuple[str, str] | None:
    """Picks one firing category by seed and returns `(category, perturbed)`, or None."""
    fired = perturb_all(text, seed=seed, categories=categories, rules=rules)
    if not fired:
        return None
    category = random.Random(seed).choice(sorted(fired))
    return category, fired[category]


# ------------------------------------------------------------------------ rules

_DIRECTION_PAIR_OF = {}
for _first, _second in _DIRECTION_PAIRS:
    _DIRECTION_PAIR_OF.setdefault((_first, _second), f"{_first}/{_second}")
    _DIRECTION_PAIR_OF.setdefault((_second, _first), f"{_first}/{_second}")
_NUMERAL_CHARS = "0123456789.,"


def _changed_span(text: str, perturbed: str, extend: Callable[[str], bool]) -> tuple[str, str]:
    """The differing parts of two texts, each widened to whole tokens of characters `extend`
    accepts (both texts share the prefix and suffix around them)."""
    limit = min(len(text), len(perturbed))
    start = 0
    while start < limit and text[start] == perturbed[start]:
        start += 1
    tail = 0
    while tail < limit - start and text[-1 - tail] == perturbed[-1 - tail]:
        tail += 1
    while start > 0 and extend(text[start - 1]):
        start -= 1
    while tail > 0 and extend(text[len(text) - tail]):
        tail -= 1
    return text[start : len(text) - tail].strip(), perturbed[start : len(perturbed) - tail].strip()


def _changed_number(text: str, other: str) -> Decimal:
    """The value of the numeral of `text` (`_NUMBER_RE`) in which it first differs from `other`."""
    start = 0
    while start < min(len(text), len(other)) and text[start] == other[start]:
        start += 1
    for match in _NUMBER_RE.finditer(text):
        if match.start() <= start <= match.end():
            return Decimal(match.group().replace(",", ""))
    raise ValueError(f"edit_rule: no numeral at the first difference (offset {start})")


def _unit_name(token: str) -> str:
    if token in _LETTERS:
        return token
    lower = " ".join(token.lower().split())
    if lower in ("bp", "bps"):
        return "bps"
    for stem in ("percentage", "basis"):  # "percentage points" <-> "basis points" differ here
        if lower.startswith(stem):
            return f"{stem} point"
    return lower.removesuffix("s") if lower.endswith(("ions", "ands", "points")) else lower


def edit_rule(text: str, perturbed: str, category: str) -> str:
    """The rule an edit of `category` applied, as a label: "million->billion", "%->bps",
    "percent->basis point", "M->B" (unit); "increase/decrease", "sign" (polarity; a direction
    word pair is one rule whichever way it is swapped); "x10", "/10" (magnitude); "year+1"
    (period); "$->EUR" (currency). For per-rule NumGap reports and balanced sampling."""
    _check_categories([category])
    if text == perturbed:
        raise ValueError("edit_rule: the texts are equal")
    if category == "magnitude":
        bigger = _changed_number(perturbed, text) > _changed_number(text, perturbed)
        return "x10" if bigger else "/10"
    if category == "period":
        old, new = _changed_span(text, perturbed, str.isdigit)
        delta = int(new) - int(old)
        if len(old) == 2:  # two-digit years wrap around the century
            delta = (delta + 50) % 100 - 50
        return f"year{delta:+d}"
    old, new = _changed_span(text, perturbed, str.isalpha)
    if category == "polarity":
        if old in _SIGN_FLIP and new in _SIGN_FLIP:
            return "sign"
        return _DIRECTION_PAIR_OF.get((old.lower(), new.lower()), f"{old.lower()}/{new.lower()}")
    if category == "unit":
        return f"{_unit_name(old)}->{_unit_name(new)}"
    return f"{old}->{new}"


def candidate_edits(
    text: str, category: str, *, rules: Rules = PAPER_RULES
) -> list[tuple[str, str]]:
    """Every `(rule, perturbed text)` that `category` can make of `text` within the edit-distance
    bounds, in site order (the choices `perturb` draws one of)."""
    found = []
    for site in candidate_sites(text, category, rules=rules):
        for edit in site:
            perturbed = edit.apply(text)
            distance = edit_distance(text, perturbed) if perturbed != text else 0
            if MIN_EDIT_DISTANCE <= distance <= MAX_EDIT_DISTANCE:
                found.append((edit_rule(text, perturbed, category), perturbed))
    return found


def rule_weights(
    texts: Iterable[str], categories: Sequence[str], *, rules: Rules = PAPER_RULES
) -> dict[str, dict[str, float]]:
    """Per category, 1 / (number of `texts` admitting the rule) for every rule seen: the weights
    under which `perturb_balanced` draws the rules of a corpus about equally often."""
    counts: dict[str, dict[str, int]] = {category: {} for category in categories}
    for text in texts:
        for category in categories:
            edits = candidate_edits(text, category, rules=rules)
            for rule in {rule for rule, _ in edits}:
                counts[category][rule] = counts[category].get(rule, 0) + 1
    return {c: {rule: 1.0 / n for rule, n in rules.items()} for c, rules in counts.items()}


def perturb_balanced(
    text: str,
    seed: int,
    categories: Sequence[str],
    weights: dict[str, dict[str, float]],
    *,
    rules: Rules = PAPER_RULES,
    category_weights: Mapping[str, float] | None = None,
) -> tuple[str, str] | None:
    """One seeded perturbation with rules drawn by `weights` (`rule_weights`): a category
    uniformly among those that fire (or in proportion to `category_weights`, 1 for a category it
    leaves out; equal weights draw as no weights do), then a rule with probability proportional
    to its weight among the rules that category can apply here, then one of that rule's edits
    uniformly.

    Returns:
      `(category, perturbed)`, or None when no category fires.
    """
    _check_categories(categories)
    rng = random.Random(seed)
    options = {c: edits for c in categories if (edits := candidate_edits(text, c, rules=rules))}
    if not options:
        return None
    names = sorted(options)
    category_draw = [(category_weights or {}).get(c, 1.0) for c in names]
    if len(set(category_draw)) > 1:
        category = rng.choices(names, weights=category_draw)[0]
    else:  # equal weights: the uniform draw, as without weights
        category = rng.choice(names)
    by_rule: dict[str, list[str]] = {}
    for rule, perturbed in options[category]:
        by_rule.setdefault(rule, []).append(perturbed)
    rules = sorted(by_rule)
    chosen = rng.choices(rules, weights=[weights[category].get(r, 1.0) for r in rules])[0]
    return category, rng.choice(by_rule[chosen])
