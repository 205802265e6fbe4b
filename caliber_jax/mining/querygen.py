"""Query generation (paper 001 IV-A step 1 and IV-D) behind one interface, with two backends.

A generator maps chunks to one scored query each: `generate(chunks) -> [(query | None, score |
None)]`. `select_top` then keeps, per document, the queries of highest score (InPars: mean token
log-probability). Backends: `OfflineQueryGenerator` (no model: questions from the numeric facts,
periods and line items a chunk states) and `OpenAIQueryGenerator` (any OpenAI-compatible server).
`synthesize_queries` is the few-shot "synthetic query" step 1a. No jax.
"""

import collections
import random
import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from caliber_jax.mining import client as client_lib

Scored = tuple[str | None, float | None]


class QueryGenerator(Protocol):
    def generate(self, chunks: Sequence[Mapping[str, Any]]) -> list[Scored]:
        """One (query, score) per chunk; query None when the chunk gives none."""


# ---------------------------------------------------------------------------- offline backend

_YEAR = r"(?:19|20)\d{2}"
_PERIOD_RE = re.compile(
    rf"\b(?:(?:first|second|third|fourth) quarter of (?:fiscal )?{_YEAR}|fiscal (?:year )?{_YEAR}"
    rf"|(?:year|quarter) ended [A-Z][a-z]+ \d{{1,2}}, {_YEAR}|{_YEAR})\b"
)
_AMOUNT = (
    r"\$\s?\d[\d,]*(?:\.\d+)?(?:\s?(?:million|billion|thousand))?|\d+(?:\.\d+)?\s?(?:%|percent)"
)
_FACT_RE = re.compile(
    r"(?P<item>(?:[A-Za-z][A-Za-z&'\u2019\-]*\s){1,7}?)"
    r"(?P<verb>increased|decreased|rose|declined|grew|fell|was|were|totaled|totalled|amounted to"
    r"|of|represented|included)\s"
    rf"(?:[^.;]{{0,60}}?)(?P<amount>{_AMOUNT})"
)
_CHANGE_VERBS = frozenset({"increased", "decreased", "rose", "declined", "grew", "fell"})
_LEADING_WORDS = frozenset(
    "the a an and or in of for to by on at as our its their this that these those which with "
    "from total also while compared during net had has have will would may could should is are "
    "be been recognizes company".split()
)
_TRAILING_WORDS = frozenset("the a an and or in of for to by on at as is are was were".split())


def _clean_item(words: list[str]) -> str | None:
    """Trims function words off a line-item phrase; None when fewer than 2 content words remain."""
    words = [word for word in words if len(word) > 1]
    while words and words[0].lower() in _LEADING_WORDS:
        words = words[1:]
    while words and words[-1].lower() in _TRAILING_WORDS:
        words = words[:-1]
    if len(words) < 2 or not any(len(word) > 3 for word in words):
        return None
    return " ".join(words)


def numeric_facts(text: str) -> list[dict[str, Any]]:
    """(line item, verb, amount, period) facts stated in `text`, in order of appearance.

    A fact is a phrase of 2-7 words followed by a reporting verb ("increased", "was",
    "totaled", "of", ...) and, within 60 characters, a dollar amount or a percentage. The period
    is the first year/quarter/fiscal-year mention of the same sentence, else of the chunk.
    """
    chunk_period = _PERIOD_RE.search(text)
    facts = []
    for match in _FACT_RE.finditer(text):
        item = _clean_item(match.group("item").split())
        if item is None:
            continue
        sentence_start = max(text.rfind(". ", 0, match.start()) + 1, 0)
        sentence_end = text.find(". ", match.end())
        sentence = text[sentence_start : sentence_end if sentence_end >= 0 else len(text)]
        period = _PERIOD_RE.search(sentence) or chunk_period
        facts.append(
            {
                "item": item,
                "verb": match.group("verb"),
                "amount": match.group("amount"),
                "period": period.group(0) if period else None,
            }
        )
    return facts


def fact_kind(fact: Mapping[str, Any]) -> str:
    """What a question about the fact asks for: "change", "percent" or "amount"."""
    if fact["verb"] in _CHANGE_VERBS:
        return "change"
    if fact["amount"].rstrip().endswith(("%", "percent")):
        return "percent"
    return "amount"


PLAIN_FORMS = {
    "change": "How much did {item} change{period}?",
    "percent": "What percentage was {item}{period}?",
    "amount": "What was the amount of {item}{period}?",
}


def fact_question(fact: Mapping[str, Any]) -> str:
    """A question the fact answers, naming its line item and period but not its amount."""
    period = f" in {fact['period']}" if fact["period"] else ""
    return PLAIN_FORMS[fact_kind(fact)].format(item=fact["item"], period=period)


def fact_score(fact: Mapping[str, Any]) -> float:
    """Offline stand-in for the InPars score: specific facts (a period, 2-4 words) rank first."""
    words = len(fact["item"].split())
    return (1.0 if fact["period"] else 0.0) - 0.25 * abs(words - 3)


_YEAR_RE = re.compile(_YEAR)
_QUARTER_RE = re.compile(r"\b(first|second|third|fourth) quarter\b")
QUERY_STYLES = ("plain", "filing")


def fiscal_period(fact_period: str | None, filing_year: Any) -> str | None:
    """The period as a reader of filings names it: "FY2019" from the fact's own year (else the
    filing's `doc_period`), "Q3 FY2019" for a quarter; None when neither gives a year."""
    match = _YEAR_RE.search(fact_period or "")
    year = match.group(0) if match else None
    if year is None and filing_year not in (None, ""):
        year = str(filing_year)
    if year is None or not _YEAR_RE.fullmatch(year):
        return None
    quarter = _QUARTER_RE.search(fact_period or "")
    if quarter:
        number = ("first", "second", "third", "fourth").index(quarter.group(1)) + 1
        return f"Q{number} FY{year}"
    return f"FY{year}"


# Question forms of a reader of filings (FinanceBench's own are "What is the FY2018 capital
# expenditure amount (in USD millions) for 3M?"): {company}, {period}, {item}, {form}; chosen per
# question by a hash of its fields, so a corpus gets every form and a rerun the same questions.
FILING_FORMS = {
    "amount": (
        "What was {company}'s {item} in {period}?",
        "What is the {period} {item} for {company}?",
        "According to its {period} {form}, what was {company}'s {item}?",
        "How much was {item} for {company} in {period}?",
    ),
    "change": (
        "How much did {company}'s {item} change in {period}?",
        "By how much did {item} change for {company} in {period}?",
        "What drove the change in {company}'s {item} in {period}?",
        "Did {company}'s {item} increase or decrease in {period}, and by how much?",
    ),
    "percent": (
        "What percentage was {company}'s {item} in {period}?",
        "What is the {period} {item} (as a percentage) for {company}?",
        "According to its {period} {form}, what share was {company}'s {item}?",
    ),
}


def filing_question(fact: Mapping[str, Any], chunk: Mapping[str, Any]) -> str:
    """`fact_question` as a reader of filings asks it: naming the company and fiscal period of
    the filing the chunk comes from (its `company`, `doc_period`, `doc_type` fields; a chunk
    without a company gets the plain question)."""
    company = str(chunk.get("company") or "").strip()
    period = fiscal_period(fact["period"], chunk.get("doc_period"))
    if not company or period is None:
        return fact_question(fact)
    forms = FILING_FORMS[fact_kind(fact)]
    key = "|".join((company, period, fact["item"], fact["verb"], fact["amount"]))
    form = forms[zlib.crc32(key.encode("utf-8")) % len(forms)]
    doc_type = str(chunk.get("doc_type") or "").strip().lower()
    filing_form = {"10k": "10-K", "10q": "10-Q", "8k": "8-K"}.get(doc_type, "annual report")
    return form.format(company=company, period=period, item=fact["item"], form=filing_form)


class OfflineQueryGenerator:
    """Questions built from a chunk's numeric facts; needs no model (demo and tests).

    `style` "plain" asks about the line item and the period the text states ("What was the
    amount of net sales in 2019?"); "filing" names the filing's company and fiscal period as a
    reader of filings does (`filing_question`).
    """

    def __init__(self, style: str = "plain"):
        if style not in QUERY_STYLES:
            raise ValueError(f"query style must be one of {QUERY_STYLES}, got {style!r}")
        self.style = style

    def generate(self, chunks: Sequence[Mapping[str, Any]]) -> list[Scored]:
        out: list[Scored] = []
        for chunk in chunks:
            facts = numeric_facts(chunk["text"])
            if not facts:
                out.append((None, None))
                continue
            best = max(facts, key=fact_score)  # ties: the first stated
            ask = filing_question(best, chunk) if self.style == "filing" else fact_question(best)
            out.append((ask, fact_score(best)))
        return out


# ----------------------------------------------------------------------------- openai backend

# InPars "vanilla" prompt (Bonifacio et al. 2022), with filing-style examples.
INPARS_PROMPT = """Example 1:
Document: Net sales increased 4.2% to $32.8 billion in 2019, driven by organic growth in the Health Care segment and acquisitions.
Relevant Query: How much did net sales grow in 2019 and what drove the increase?

Example 2:
Document: The Company's revolving credit facility provides for borrowings of up to $3.0 billion and expires in May 2024. No amounts were outstanding under the facility at year end.
Relevant Query: What is the size and maturity of the company's revolving credit facility?

Example 3:
Document: {document}
Relevant Query:"""  # noqa: E501


# The queries of the prompt's examples: a generation that repeats one copied the prompt, not
# the document (a small model's failure), and is no query of this chunk.
EXAMPLE_QUERIES = frozenset(
    line.split(":", 1)[1].strip().lower()
    for line in INPARS_PROMPT.splitlines()
    if line.startswith("Relevant Query:") and line.split(":", 1)[1].strip()
)


def parse_query(text: str) -> str | None:
    """The first non-empty line of a generation, without a "Relevant Query:" label or quotes."""
    for line in text.strip().splitlines():
        line = re.sub(r"^\s*(?:relevant\s+)?query\s*:\s*", "", line, flags=re.IGNORECASE)
        line = line.strip().strip('"').strip()
        if line:
            return line
    return None


class OpenAIQueryGenerator:
    """InPars query generation on an OpenAI-compatible server, scored by mean token log-prob."""

    def __init__(
        self,
        client: client_lib.OpenAIClient,
        *,
        endpoint: str,
        max_tokens: int,
        temperature: float,
        max_document_chars: int,
    ):
        """Args:
        client: the server.
        endpoint: "completions" (raw prompt, as InPars) or "chat" (prompt as the user message).
        max_tokens: generation limit.
        temperature: sampling temperature (InPars decodes greedily: 0).
        max_document_chars: the chunk is cut to this many characters in the prompt.
        """
        if endpoint not in client_lib.ENDPOINTS:
            raise ValueError(f"endpoint={endpoint!r}, expected one of {client_lib.ENDPOINTS}")
        self.client = client
        self.endpoint = endpoint
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.max_document_chars = max_document_chars
        # reason -> chunks that gave no query ("request failed: HTTP 400", "empty generation").
        self.unusable: collections.Counter[str] = collections.Counter()

    def _call(self, chunk: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        prompt = INPARS_PROMPT.format(document=chunk["text"][: self.max_document_chars])
        params = {"max_tokens": self.max_tokens, "temperature": self.temperature}
        if self.endpoint == "chat":
            return "chat", {
                "messages": [{"role": "user", "content": prompt}],
                "logprobs": True,
                **params,
            }
        return "completions", {
            "prompt": prompt,
            "logprobs": 1,
            "stop": ["\n\n", "Example"],
            **params,
        }

    def generate(self, chunks: Sequence[Mapping[str, Any]]) -> list[Scored]:
        responses = self.client.map([self._call(chunk) for chunk in chunks])
        out: list[Scored] = []
        for response in responses:
            failed = client_lib.failure_reason(response)
            texts = client_lib.choice_texts(response)
            scores = client_lib.choice_mean_logprobs(response)
            query = parse_query(texts[0]) if texts else None
            # Curly apostrophes too: SmolLM2 repeated example 2 with "company’s".
            if query is not None and query.lower().replace("\u2019", "'") in EXAMPLE_QUERIES:
                query = None
                self.unusable["copied a prompt example"] += 1
            elif query is None:
                self.unusable[f"request failed: {failed}" if failed else "empty generation"] += 1
            out.append((query, scores[0] if scores and query else None))
        return out


# --------------------------------------------------------------------------- selection, step 1a


def select_top(
    chunks: Sequence[Mapping[str, Any]], scored: Sequence[Scored], *, per_doc: int
) -> list[dict[str, Any]]:
    """InPars selection: per document, the `per_doc` queries of highest score.

    Queries without a score (a server that returns no log-probabilities) rank after scored
    ones, in chunk order. Duplicate query texts within a document are kept once.

    Returns:
      Query records {"id", "text", "doc_name", "chunk_id", "score", "kind": "inpars"} in chunk
      order within each document.
    """
    by_doc: dict[str, list[tuple[int, str, float | None]]] = {}
    for position, (chunk, (query, score)) in enumerate(zip(chunks, scored, strict=True)):
        if query:
            by_doc.setdefault(chunk["doc_name"], []).append((position, query, score))
    selected = []
    for doc_name, items in by_doc.items():
        seen: set[str] = set()
        unique = [item for item in items if not (item[1] in seen or seen.add(item[1]))]
        ranked = sorted(unique, key=lambda item: (item[2] is None, -(item[2] or 0.0), item[0]))
        for position, query, score in sorted(ranked[:per_doc]):
            chunk = chunks[position]
            selected.append(
                {
                    "id": f"q:{chunk['id']}",
                    "text": query,
                    "doc_name": doc_name,
                    "chunk_id": chunk["id"],
                    "score": score,
                    "kind": "inpars",
                }
            )
    return selected


# Listing 1 of the paper, pointed at SEC filings instead of earnings calls.
SYNTHETIC_PROMPT = """You are a seasoned financial expert meticulously reviewing SEC filings with a laser focus, and expertly crafting insightful questions to distill the critical insights and trends within.
Your task is to generate a set of queries that financial experts would ask about a {doc_class} filing.

# Example of queries:
{examples}

generate a set of five new queries, you can familiarize yourself with the nature of queries using the data above. each query should be generated in a new line."""  # noqa: E501

_QUESTION_START = re.compile(
    r"^(?:what|how|which|who|when|where|why|does|do|did|is|are|was|were|can|has|have)\b", re.I
)


# An analyst's question about a filing does not speak in the first person; a chat model's
# chatter does ("I'm ready to assist. What do you need from me today?", from SmolLM2).
# "Part I" / "Item I" of a filing is a roman numeral, not a pronoun.
_FIRST_PERSON = re.compile(
    r"(?<!Part )(?<!PART )(?<!Item )\bI\b|\b(?:I'm|I\u2019m|I'll|I've|me|my|let me)\b",
    re.IGNORECASE,
)


def accept_query(text: str, *, min_words: int, seen: set[str]) -> str | None:
    """Heuristic filter of step 1a: strips list markers; rejects short, non-question, first-person
    (chatter) and repeated lines."""
    text = re.sub(r"^\s*(?:\d+[.)]|[-*\u2022])\s*", "", text).strip().strip('"').strip()
    if len(text.split()) < min_words or not (text.endswith("?") or _QUESTION_START.match(text)):
        return None
    if _FIRST_PERSON.search(text) or text.lower() in seen:
        return None
    return text


def synthesize_queries(
    client: client_lib.OpenAIClient,
    exemplars: Sequence[str],
    clusters: Sequence[int],
    *,
    num_queries: int,
    doc_class: str,
    per_prompt: int,
    min_words: int,
    max_prompts: int,
    seed: int,
    temperature: float,
) -> list[str]:
    """Step 1a: few-shot "synthetic" queries not tied to one chunk.

    Until `num_queries` are accepted (or `max_prompts` prompts were sent): draw `per_prompt`
    exemplars from distinct clusters (of the base student's query vectors), ask the model for
    five new queries, keep those `accept_query` passes. Prompt i uses seed (seed, i), so a
    rerun sends the same prompts and the client cache answers them.
    """
    if len(exemplars) != len(clusters) or not exemplars:
        raise ValueError(f"need one cluster per exemplar, got {len(exemplars)} and {len(clusters)}")
    by_cluster: dict[int, list[str]] = {}
    for text, cluster in zip(exemplars, clusters, strict=True):
        by_cluster.setdefault(int(cluster), []).append(text)
    seen = {text.lower() for text in exemplars}
    accepted: list[str] = []
    for prompt_index in range(max_prompts):
        if len(accepted) >= num_queries:
            break
        rng = random.Random(f"{seed}:{prompt_index}")
        groups = rng.sample(sorted(by_cluster), min(per_prompt, len(by_cluster)))
        shots = [rng.choice(by_cluster[group]) for group in groups]
        prompt = SYNTHETIC_PROMPT.format(doc_class=doc_class, examples="\n".join(shots))
        response = client.chat(
            [{"role": "user", "content": prompt}], temperature=temperature, max_tokens=400
        )
        for text in client_lib.choice_texts(response):
            for line in text.splitlines():
                query = accept_query(line, min_words=min_words, seen=seen)
                if query and len(accepted) < num_queries:
                    accepted.append(query)
                    seen.add(query.lower())
    return accepted


def make_generator(
    backend: str, client: client_lib.OpenAIClient | None, **kwargs: Any
) -> QueryGenerator:
    """ "offline" or "openai" (the latter needs a client and OpenAIQueryGenerator's kwargs)."""
    if backend == "offline":
        return OfflineQueryGenerator()
    if backend == "openai":
        if client is None:
            raise ValueError("query backend 'openai' needs a client (config.llm)")
        return OpenAIQueryGenerator(client, **kwargs)
    raise ValueError(f"query backend {backend!r}, expected 'offline' or 'openai'")
