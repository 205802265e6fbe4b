"""Within-document retrieval (paper 001 IV-A step 6, IV-E and VI): rank one document's chunks.

Two evaluations, each per (query, document) then averaged, with Cohen's d between two models:
- `judged_at_k`: MRR@k and DCG@k of the top k chunks (k = 5) under each model, graded by a judge
  (step 6a: what the new model retrieves is judged too), grades binarised at >= 4 as the paper does.
- `financebench`: every chunk of the question's evidence filing ranked; chunks overlapping an
  evidence passage by more than a third (section VI-B) are relevant; MRR and nDCG over the full
  ranking (Table V) and at k.
No jax.
"""

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from caliber_jax.eval import EncodeFn, encode_texts

RELEVANT_GRADE = 4  # the paper binarises r(q, c) >= 4 before every metric


def mrr(relevance: Sequence[int | float], k: int | None = None) -> float:
    """1 / rank of the first relevant item within the first k (all when None), else 0."""
    for rank, rel in enumerate(relevance[:k] if k else relevance, start=1):
        if rel > 0:
            return 1.0 / rank
    return 0.0


def dcg(relevance: Sequence[int | float], k: int | None = None) -> float:
    """sum_i rel_i / log2(i + 1) over the first k items (linear gain, as trec_eval)."""
    items = relevance[:k] if k else relevance
    return float(sum(rel / math.log2(rank + 1) for rank, rel in enumerate(items, start=1)))


def ndcg(relevance: Sequence[int | float], k: int | None = None) -> float:
    """DCG over the DCG of the ideal ordering of the same items; 0 when nothing is relevant."""
    ideal = dcg(sorted(relevance, reverse=True), k)
    return dcg(relevance, k) / ideal if ideal > 0 else 0.0


def cohens_d(base: Sequence[float], exp: Sequence[float]) -> float:
    """Cohen's d of exp vs base: (mean(exp) - mean(base)) / pooled standard deviation.

    The pooled SD is sqrt((var_b + var_e) / 2) with sample variances (ddof = 1); 0 when both
    are constant. Positive d: exp scores higher.
    """
    base, exp = np.asarray(base, np.float64), np.asarray(exp, np.float64)
    if base.size < 2 or exp.size < 2:
        raise ValueError(f"Cohen's d needs >= 2 values per side, got {base.size}, {exp.size}")
    pooled = math.sqrt((base.var(ddof=1) + exp.var(ddof=1)) / 2)
    diff = float(exp.mean() - base.mean())
    return diff / pooled if pooled > 0 else 0.0


def paired_d(base: Sequence[float], exp: Sequence[float]) -> float:
    """Paired effect size d_z: mean(exp - base) / sd(exp - base) (0 when the sd is 0)."""
    diff = np.asarray(exp, np.float64) - np.asarray(base, np.float64)
    sd = diff.std(ddof=1) if diff.size > 1 else 0.0
    return float(diff.mean() / sd) if sd > 0 else 0.0


def compare(
    base: Mapping[str, Sequence[float]], exp: Mapping[str, Sequence[float]]
) -> dict[str, dict[str, float]]:
    """Per metric: base and exp means, standard errors, Cohen's d, paired d_z and the count."""
    out = {}
    for metric in base:
        b, e = np.asarray(base[metric], np.float64), np.asarray(exp[metric], np.float64)
        out[metric] = {
            "base": float(b.mean()),
            "exp": float(e.mean()),
            "base_se": float(b.std(ddof=1) / math.sqrt(b.size)) if b.size > 1 else 0.0,
            "exp_se": float(e.std(ddof=1) / math.sqrt(e.size)) if e.size > 1 else 0.0,
            "cohens_d": cohens_d(b, e) if b.size > 1 else 0.0,
            "paired_d": paired_d(b, e),
            "count": int(b.size),
        }
    return out


def rank_chunks(query_vec: np.ndarray, chunk_vecs: np.ndarray) -> np.ndarray:
    """Chunk rows best first by dot product; ties by row (stable). `[D]`, `[N, D]` -> `[N]`."""
    return np.argsort(-(chunk_vecs @ query_vec), kind="stable")


# ------------------------------------------------------------------------ judged, held-out docs


def judged_at_k(
    rankings: Mapping[str, Mapping[tuple[str, str], Sequence[str]]],
    grade_fn: Callable[[list[tuple[str, str]]], list[int | None]],
    *,
    k: int,
) -> tuple[dict[str, dict[str, list[float]]], dict[tuple[str, str], int | None]]:
    """MRR@k and DCG@k per (query, document) for several models, judging each top-k chunk once.

    Args:
      rankings: model name -> {(query key, doc name): chunk ids best first}; every model must
        cover the same (query, document) pairs. The key is the query's id where texts repeat.
      grade_fn: [(query key, chunk id)] -> grades 1-4 (None: invalid, counted not relevant).
      k: cutoff (the paper's 5).

    Returns:
      ({model: {"mrr_at_k": [...], "dcg_at_k": [...]}} in one pair order, {(query, chunk): grade}).
    """
    models = list(rankings)
    pairs = list(rankings[models[0]])
    for model in models[1:]:
        if set(rankings[model]) != set(pairs):
            raise ValueError(
                f"model {model!r} ranks other (query, document) pairs than {models[0]!r}"
            )
    needed = list(
        dict.fromkeys(
            (query, chunk)
            for model in models
            for (query, _), ranked in rankings[model].items()
            for chunk in ranked[:k]
        )
    )
    grades = dict(zip(needed, grade_fn(needed), strict=True))
    per_model: dict[str, dict[str, list[float]]] = {}
    for model in models:
        values = {f"mrr_at_{k}": [], f"dcg_at_{k}": []}
        for query, doc in pairs:
            rel = [
                1 if (grades[(query, c)] or 0) >= RELEVANT_GRADE else 0
                for c in rankings[model][(query, doc)][:k]
            ]
            values[f"mrr_at_{k}"].append(mrr(rel, k))
            values[f"dcg_at_{k}"].append(dcg(rel, k))
        per_model[model] = values
    return per_model, grades


# ------------------------------------------------------------------------------- FinanceBench

_WORD_RE = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    """Lowercased alphanumeric tokens: the unit in which chunk/evidence overlap is measured."""
    return _WORD_RE.findall(text.lower())


def overlap_length(
    chunk_words: Sequence[str], evidence_ngrams: set[tuple[str, ...]], n: int
) -> int:
    """Chunk words covered by an n-gram that also occurs in the evidence passage.

    pdftotext evidence and our cleaned chunks differ in whitespace and table debris, so character
    spans do not line up; shared word n-grams approximate len(c intersect p) in words.
    """
    covered = np.zeros(len(chunk_words), bool)
    for start in range(len(chunk_words) - n + 1):
        if tuple(chunk_words[start : start + n]) in evidence_ngrams:
            covered[start : start + n] = True
    return int(covered.sum())


def evidence_labels(
    chunks: Sequence[str], evidence: Sequence[str], *, ngram: int, min_fraction: float
) -> list[int]:
    """Section VI-B labels: chunk c is relevant (1) when, for some evidence passage p,
    len(c intersect p) > min_fraction * min(len(c), len(p)) (the paper: 1/3), lengths in words."""
    labels = [0] * len(chunks)
    chunk_words = [words(chunk) for chunk in chunks]
    for passage in evidence:
        passage_words = words(passage)
        grams = {tuple(passage_words[i : i + ngram]) for i in range(len(passage_words) - ngram + 1)}
        for row, cw in enumerate(chunk_words):
            if not labels[row] and cw and passage_words:
                inter = overlap_length(cw, grams, ngram)
                labels[row] = int(inter > min_fraction * min(len(cw), len(passage_words)))
    return labels


def financebench_items(
    questions: Sequence[Mapping[str, Any]],
    chunks_by_doc: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    ngram: int,
    min_fraction: float,
) -> list[dict[str, Any]]:
    """Questions whose evidence filing is chunked, with per-chunk labels of that filing.

    Questions whose evidence spans several filings use the first filing's evidence; those with
    no relevant chunk (evidence lost in text extraction) are left out, as they carry no signal.

    Returns:
      [{"id", "question", "doc_name", "chunk_ids", "chunk_texts", "labels"}].
    """
    items = []
    for record in questions:
        evidence = record.get("evidence") or []
        doc_name = record.get("doc_name") or (evidence[0].get("doc_name") if evidence else None)
        if doc_name not in chunks_by_doc:
            continue
        passages = [e["evidence_text"] for e in evidence if e.get("doc_name", doc_name) == doc_name]
        chunks = chunks_by_doc[doc_name]
        labels = evidence_labels(
            [c["text"] for c in chunks], passages, ngram=ngram, min_fraction=min_fraction
        )
        if any(labels):
            items.append(
                {
                    "id": record["financebench_id"],
                    "question": record["question"],
                    "doc_name": doc_name,
                    "chunk_ids": [c["id"] for c in chunks],
                    "chunk_texts": [c["text"] for c in chunks],
                    "labels": labels,
                }
            )
    return items


def financebench_scores(
    encode_fn: EncodeFn,
    items: Sequence[Mapping[str, Any]],
    *,
    k: int,
    query_instruction: str | None = None,
) -> dict[str, list[float]]:
    """Per-question MRR, nDCG (over the whole document, Table V), MRR@k and DCG@k of one model."""
    texts = [item["question"] for item in items]
    if query_instruction:
        texts = [f"Instruct: {query_instruction}\nQuery:{text}" for text in texts]
    query_vecs = encode_texts(encode_fn, texts, "queries")
    docs = list(dict.fromkeys(item["doc_name"] for item in items))
    doc_vecs = {}
    for doc in docs:
        first = next(item for item in items if item["doc_name"] == doc)
        doc_vecs[doc] = encode_texts(encode_fn, first["chunk_texts"], "chunks")
    scores = {"mrr": [], "ndcg": [], f"mrr_at_{k}": [], f"dcg_at_{k}": []}
    for item, query_vec in zip(items, query_vecs, strict=True):
        order = rank_chunks(query_vec, doc_vecs[item["doc_name"]])
        rel = [item["labels"][row] for row in order]
        scores["mrr"].append(mrr(rel))
        scores["ndcg"].append(ndcg(rel))
        scores[f"mrr_at_{k}"].append(mrr(rel, k))
        scores[f"dcg_at_{k}"].append(dcg(rel, k))
    return scores


def summarize(scores: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Means of per-query scores, plus the count."""
    out = {metric: float(np.mean(values)) for metric, values in scores.items()}
    out["count"] = len(next(iter(scores.values()))) if scores else 0
    return out


def load_questions(path: str) -> list[dict[str, Any]]:
    """FinanceBench records with `evidence` as a list (the bundled file stores it as a string)."""
    import ast

    from caliber_jax.data import corpus

    out = []
    for line, record in corpus.iter_jsonl(path):
        evidence = record.get("evidence")
        if isinstance(evidence, str):
            try:
                evidence = ast.literal_eval(evidence)
            except (ValueError, SyntaxError) as error:
                raise ValueError(f"{path}:{line}: evidence: unreadable ({error})") from error
        if not isinstance(evidence, list) or not isinstance(record.get("question"), str):
            raise ValueError(f"{path}:{line}: needs a question string and an evidence list")
        out.append({**record, "evidence": evidence})
    return out


def load_items(
    questions_path: str,
    filings_path: str,
    *,
    min_chars: int,
    max_chars: int,
    ngram: int,
    min_fraction: float,
    max_docs: int,
) -> list[dict[str, Any]]:
    """FinanceBench within-document items from the questions and the filings file: the evidence
    filings (the `max_docs` with most questions, 0: all) chunked as mining chunks them."""
    from caliber_jax.data import corpus
    from caliber_jax.mining import chunking

    questions = load_questions(questions_path)
    counts: dict[str, int] = {}
    for record in questions:
        counts[record.get("doc_name")] = counts.get(record.get("doc_name"), 0) + 1
    wanted = sorted(counts, key=lambda doc: (-counts[doc], str(doc)))
    wanted = set(wanted[:max_docs] if max_docs else wanted)
    chunks_by_doc = {}
    for record in corpus.load_records(filings_path):
        if record["doc_name"] in wanted:
            text = corpus.clean_text(record["text"])
            chunks_by_doc[record["doc_name"]] = [
                {"id": f"{record['doc_name']}:{i}", "text": chunk}
                for i, chunk in enumerate(
                    chunking.chunk_text(text, min_chars=min_chars, max_chars=max_chars)
                )
            ]
    if not chunks_by_doc:
        raise ValueError(f"{filings_path}: none of the FinanceBench evidence filings is there")
    return financebench_items(questions, chunks_by_doc, ngram=ngram, min_fraction=min_fraction)


def evaluate(
    encode_fn: EncodeFn,
    items: Sequence[Mapping[str, Any]],
    *,
    k: int,
    query_instruction: str | None = None,
    baseline_encode_fn: EncodeFn | None = None,
) -> dict[str, Any]:
    """FinanceBench within-document means; with a baseline, also its means and Cohen's d."""
    scores = financebench_scores(encode_fn, items, k=k, query_instruction=query_instruction)
    out: dict[str, Any] = summarize(scores)
    if baseline_encode_fn is not None:
        base = financebench_scores(
            baseline_encode_fn, items, k=k, query_instruction=query_instruction
        )
        out["vs_baseline"] = compare(base, scores)
    return out
