"""Relevance judges grading (query, chunk) pairs on the 1-4 scale of paper 001 Table II.

One interface, `grade(queries, chunks) -> [grade | None]` (None: the judge gave no valid grade)
plus an `identity` stored with every grade (`grade_with_failures` also says which Nones are
failed requests, never to be stored), two backends: `OpenAIJudge` (an LLM with the Table II
criteria in the prompt and strict parsing) and `EmbeddingJudge` (a local teacher's cosine mapped
to grades by calibrated, stored thresholds). FinanceBench's evidence labels (section VI) are not a
judge: they label FinanceBench's own questions only, never the generated queries that mining and
the held-out evaluation grade, so `eval.within_doc` applies them directly. No jax.
"""

import collections
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from caliber_jax.mining import client as client_lib

GRADES = (1, 2, 3, 4)


class Judge(Protocol):
    # Which judge this is (backend, model, settings): stored with every grade, so cached grades
    # of another judge are never mixed in.
    identity: str

    def grade(
        self, queries: Sequence[str], chunks: Sequence[Mapping[str, Any]]
    ) -> list[int | None]:
        """Grade of chunk i for query i, or None when no valid grade came back."""


def grade_with_failures(
    judge: Judge, queries: Sequence[str], chunks: Sequence[Mapping[str, Any]]
) -> tuple[list[int | None], list[str | None]]:
    """`judge.grade` plus, per pair, why its request failed (None: it did not).

    A failed request (HTTP 5xx or a timeout after the retries, a malformed response, a 400) is
    no verdict on the pair: its grade is None for this run only, and callers keep it out of
    every stored grade, so a rerun asks again. Judges that send no request (`EmbeddingJudge`)
    never fail.
    """
    method = getattr(judge, "grade_with_failures", None)
    if method is not None:
        return method(queries, chunks)
    grades = judge.grade(queries, chunks)
    return grades, [None] * len(grades)


# Table II of the paper, verbatim.
TABLE_II = {
    1: "No answer and not relevant - The query is entirely unrelated to the content of the "
    "passage and contains no answer.",
    2: "No answer but somewhat relevant - The query has weak relevance to the content of the "
    "passage, the connection between them is unclear or incomplete, we can not answer the query "
    "based on the passage.",
    3: "Partial answer and moderately relevant - The query is relevant to the content of the "
    "answer passage and shows a clear connection, but there may be some gaps or minor "
    "inconsistencies in relevance. If we want to answer the query accurately based on the "
    "passage as context, the answer will be partial.",
    4: "Explicit answer and perfectly relevant - The passage is perfectly and directly relevant "
    "to the query, with a clear and complete connection between them. The answer is not only "
    "relevant but also highly accurate, effectively and explicitly answering the query.",
}

JUDGE_PROMPT = """You are grading how relevant a passage from an SEC filing is to a query.
Use exactly one of these scores:
{criteria}

Query: {query}

Passage: {passage}

Answer with the score only: a single digit 1, 2, 3 or 4."""

_GRADE_RE = re.compile(
    r"^\s*(?:\**\s*(?:score|grade|relevance)\s*[:=]?\s*)?\**\s*([1-4])\s*\**\.?\s*$", re.IGNORECASE
)


def judge_prompt(query: str, passage: str) -> str:
    criteria = "\n".join(f"{grade}: {text}" for grade, text in TABLE_II.items())
    return JUDGE_PROMPT.format(criteria=criteria, query=query, passage=passage)


# A grade followed by (the start of) its own Table II line, as the prompt lists them: small
# models echo the list ("1: No answer", cut by max_tokens). The words must be that grade's.
_LABELLED_RE = re.compile(r"^\s*\**\s*([1-4])\s*[:.)-]\s*(\S.*?)\s*$", re.DOTALL)


def parse_grade(text: str) -> int | None:
    """Strict parse: the whole reply is one grade 1-4, optionally as "Score: 3" (markdown bold
    and a final period allowed), or a grade followed by the opening words of that same grade's
    Table II criterion ("1: No answer", "4: Explicit"). Anything else ("3 or 4", "5", prose,
    "1: Explicit answer", "4: Ex") is None, never a guess."""
    match = _GRADE_RE.match(text or "")
    if match:
        return int(match.group(1))
    match = _LABELLED_RE.match(text or "")
    if match:
        grade, words = int(match.group(1)), " ".join(match.group(2).lower().split())
        label = TABLE_II[grade].lower()
        # Whole words only ("4: Explicit", not "4: Ex"): the digit decides, the words agree.
        if words.startswith(label) or (label.startswith(words) and label[len(words)] in " -"):
            return grade
    return None


def unusable_reason(text: str) -> str:
    """Why `parse_grade` found no grade: "empty reply", "off-scale grade" (a lone number
    outside 1-4) or "unparseable reply"."""
    if not (text or "").strip():
        return "empty reply"
    if _OFF_SCALE_RE.match(text):
        return "off-scale grade"
    return "unparseable reply"


_OFF_SCALE_RE = re.compile(
    r"^\s*(?:\**\s*(?:score|grade|relevance)\s*[:=]?\s*)?\**\s*-?\d+(?:\.\d+)?\s*\**\.?\s*$",
    re.IGNORECASE,
)


class OpenAIJudge:
    """An LLM judge on an OpenAI-compatible chat server (temperature 0, a few tokens).

    Attributes:
      unusable: reason -> pairs graded None ("request failed: HTTP 400", "empty reply",
        "off-scale grade", "unparseable reply").
    """

    def __init__(self, client: client_lib.OpenAIClient, *, max_tokens: int, max_passage_chars: int):
        self.client = client
        self.max_tokens = max_tokens
        self.max_passage_chars = max_passage_chars
        self.unusable: collections.Counter[str] = collections.Counter()
        prompt = hashlib.sha256(judge_prompt("{query}", "{passage}").encode()).hexdigest()[:12]
        self.identity = (
            f"openai {client.base_url} {client.model} max_tokens={max_tokens} "
            f"max_passage_chars={max_passage_chars} prompt={prompt}"
        )

    def grade(
        self, queries: Sequence[str], chunks: Sequence[Mapping[str, Any]]
    ) -> list[int | None]:
        return self.grade_with_failures(queries, chunks)[0]

    def grade_with_failures(
        self, queries: Sequence[str], chunks: Sequence[Mapping[str, Any]]
    ) -> tuple[list[int | None], list[str | None]]:
        """Grades, and per pair the reason its request failed (None: it did not)."""
        calls = [
            (
                "chat",
                {
                    "messages": [
                        {
                            "role": "user",
                            "content": judge_prompt(query, chunk["text"][: self.max_passage_chars]),
                        }
                    ],
                    "temperature": 0.0,
                    "max_tokens": self.max_tokens,
                },
            )
            for query, chunk in zip(queries, chunks, strict=True)
        ]
        grades, failures = [], []
        for response in self.client.map(calls):
            failed = client_lib.failure_reason(response)
            text = (client_lib.choice_texts(response) or [""])[0]
            grade = None if failed else parse_grade(text)
            if grade is None:
                self.unusable[f"request failed: {failed}" if failed else unusable_reason(text)] += 1
            grades.append(grade)
            failures.append(failed)
        return grades, failures


# ------------------------------------------------------------------------------ embedding judge


def grades_from_cosine(cosines: np.ndarray, thresholds: Sequence[float]) -> np.ndarray:
    """Grade = 1 + number of thresholds (t2 <= t3 <= t4) the cosine reaches. `[n]` -> `[n]` int."""
    thresholds = np.asarray(thresholds, np.float64)
    if thresholds.shape != (3,) or np.any(np.diff(thresholds) < 0):
        raise ValueError(f"need 3 non-decreasing thresholds (t2, t3, t4), got {thresholds}")
    return 1 + np.sum(np.asarray(cosines, np.float64)[:, None] >= thresholds[None, :], axis=1)


def calibrate_thresholds(
    positive: np.ndarray,
    negative: np.ndarray,
    *,
    positive_quantile: float,
    negative_quantile: float,
) -> dict[str, Any]:
    """Cosine thresholds of the embedding judge from labelled calibration pairs.

    Positives are (query, the chunk it was generated from), negatives (query, a random chunk of
    another document). t2 = the `negative_quantile` quantile of negative cosines (above it, a
    pair is more similar than almost every unrelated one: "somewhat relevant"), t4 = the
    `positive_quantile` quantile of positive cosines (as similar as a typical source chunk:
    "explicit answer"), t3 = their midpoint. If t4 < t2 the two collapse to their midpoint.

    Returns:
      {"thresholds": [t2, t3, t4], plus the counts, quantiles and means used}.
    """
    positive, negative = np.asarray(positive, np.float64), np.asarray(negative, np.float64)
    if positive.size == 0 or negative.size == 0:
        raise ValueError("calibration needs at least one positive and one negative pair")
    t2 = float(np.quantile(negative, negative_quantile))
    t4 = float(np.quantile(positive, positive_quantile))
    if t4 < t2:
        t2 = t4 = (t2 + t4) / 2
    return {
        "thresholds": [t2, (t2 + t4) / 2, t4],
        "positive_quantile": positive_quantile,
        "negative_quantile": negative_quantile,
        "num_positive": int(positive.size),
        "num_negative": int(negative.size),
        "positive_mean": float(positive.mean()),
        "negative_mean": float(negative.mean()),
    }


def save_calibration(path: str | Path, calibration: Mapping[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(dict(calibration), indent=2) + "\n", encoding="utf-8")


def load_calibration(path: str | Path, *, expect: Mapping[str, Any]) -> dict[str, Any]:
    """The stored calibration, refused (one line) unless it records the judge of `expect`
    (e.g. judge_model, judge_num_layers and the quantiles): thresholds calibrated for one judge
    mean nothing for another."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if len(data.get("thresholds", [])) != 3:
        raise ValueError(f"{path}: field thresholds must list 3 cosines (t2, t3, t4)")
    differ = [key for key, value in expect.items() if data.get(key) != value]
    if differ:
        stored = ", ".join(f"{key}={data.get(key)!r}" for key in differ)
        wanted = ", ".join(f"{key}={expect[key]!r}" for key in differ)
        raise ValueError(
            f"{path}: calibrated for {stored}, but the config's judge has {wanted}; "
            "use a new workdir (its judgments came from the old judge) or delete the file"
        )
    return data


class EmbeddingJudge:
    """Grades by the cosine of a local teacher `encode_fn` and calibrated thresholds."""

    def __init__(
        self,
        encode_fn: Callable[[list[str]], np.ndarray],
        thresholds: Sequence[float],
        *,
        name: str,
        query_instruction: str | None = None,
    ):
        """`name` says which encoder `encode_fn` runs (model directory, layers): with the
        thresholds and the instruction it is the judge's `identity`."""
        self.encode_fn = encode_fn
        self.thresholds = list(thresholds)
        self.query_instruction = query_instruction
        self.identity = (
            f"embedding {name} thresholds={[round(float(t), 6) for t in self.thresholds]} "
            f"instruction={query_instruction!r}"
        )
        # text -> vector: a chunk judged for many queries is encoded once.
        self._vectors: dict[str, np.ndarray] = {}

    def _encode(self, texts: list[str]) -> dict[str, np.ndarray]:
        missing = [text for text in dict.fromkeys(texts) if text not in self._vectors]
        if missing:
            self._vectors.update(zip(missing, np.asarray(self.encode_fn(missing)), strict=True))
        return self._vectors

    def cosines(self, queries: Sequence[str], chunks: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """`[n]` cosine of each (query, chunk) pair under the teacher."""
        if not queries:
            return np.zeros((0,), np.float32)
        texts = [_with_instruction(q, self.query_instruction) for q in queries]
        vectors = self._encode(texts + [chunk["text"] for chunk in chunks])
        return np.array(
            [float(vectors[q] @ vectors[c["text"]]) for q, c in zip(texts, chunks, strict=True)],
            np.float32,
        )

    def grade(
        self, queries: Sequence[str], chunks: Sequence[Mapping[str, Any]]
    ) -> list[int | None]:
        return [int(g) for g in grades_from_cosine(self.cosines(queries, chunks), self.thresholds)]


def _with_instruction(query: str, instruction: str | None) -> str:
    return query if not instruction else f"Instruct: {instruction}\nQuery:{query}"
