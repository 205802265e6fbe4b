"""Paper 001's final evaluation pipeline (IV-E) and step 6a (IV-C2), on judged top-k chunks.

Final evaluation: out-of-sample queries Q_test on held-out documents; for every pair of
consecutive students bi-enc(i), bi-enc(i+1), each in-scope (query, document) is scored by the
modified Hausdorff distance between the two models' top-k chunk sets times relu(S - the nearer
top-1 distance); the top 1/P pairs are kept, then drawn at random and judged (both models' top k,
by a judge other than the training judge) until every metric's confidence interval is narrower
than a set width. Metrics are MRR@k and DCG@k per (query, document), overall and per filing type.

Step 6a: after retraining, bi-enc(i+1)'s top k on the validation documents of iteration i's
(query, document) pairs is judged too, so MRR@k / DCG@k compare both models on judged chunks.
No jax.
"""

import json
import math
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from caliber_jax.eval import within_doc
from caliber_jax.mining import judge as judge_lib

Pair = tuple[str, str]  # (query id, document name)
EncodeFn = Callable[[list[str]], np.ndarray]


# ----------------------------------------------------------------------------- pure pieces


def pairwise_distance(a: np.ndarray, b: np.ndarray, *, distance: str) -> np.ndarray:
    """`[m, D]`, `[n, D]` -> `[m, n]`: 1 - a.b ("cosine", unit rows) or ||a - b|| ("euclidean")."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if distance == "cosine":
        return 1.0 - a @ b.T
    if distance == "euclidean":
        squared = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
        return np.sqrt(np.maximum(squared, 0.0))
    raise ValueError(f"distance={distance!r}, expected 'cosine' or 'euclidean'")


def modified_hausdorff(a: np.ndarray, b: np.ndarray, *, distance: str) -> float:
    """Modified Hausdorff distance (Dubuisson and Jain, 1994) between point sets `[m, D]`, `[n, D]`:
    max(mean_a min_b d(a, b), mean_b min_a d(a, b)). 0 for equal sets."""
    if len(a) == 0 or len(b) == 0:
        raise ValueError(
            f"modified Hausdorff distance needs two non-empty sets, got {len(a)}, {len(b)}"
        )
    d = pairwise_distance(a, b, distance=distance)
    return float(max(d.min(axis=1).mean(), d.min(axis=0).mean()))


def document_score(hausdorff: float, top1_distance: float, *, similarity: float) -> float:
    """IV-E step 3's document score: how much fine-tuning moved the top k (the modified
    Hausdorff distance) times how likely the document answers the query, relu(S - the smaller
    of the two models' query-to-top-1 distances). The paper names both factors, not how they
    combine; the product makes a document score 0 when either factor is 0."""
    return hausdorff * max(similarity - top1_distance, 0.0)


def select_top_fraction(scores: Mapping[Pair, float], *, fraction_p: int) -> list[Pair]:
    """The top ceil(n / P) pairs by score (ties by pair), so |all| / |kept| ~ P."""
    if fraction_p < 1:
        raise ValueError(f"P={fraction_p} must be >= 1")
    ranked = sorted(scores, key=lambda pair: (-scores[pair], pair))
    return ranked[: math.ceil(len(ranked) / fraction_p)]


def z_value(level: float) -> float:
    """Two-sided normal quantile of a confidence level (0.95 -> 1.96)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"confidence level {level} must be in (0, 1)")
    return statistics.NormalDist().inv_cdf(0.5 + level / 2)


def confidence_interval(values: Sequence[float], *, level: float) -> tuple[float, float, float]:
    """(mean, low, high): the normal-approximation interval mean +- z * sd / sqrt(n), sd with
    ddof=1; a single value gives an infinitely wide interval."""
    x = np.asarray(values, np.float64)
    if x.size == 0:
        raise ValueError("a confidence interval needs at least one value")
    mean = float(x.mean())
    if x.size < 2:
        return mean, -math.inf, math.inf
    half = z_value(level) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half


def intervals_narrow(
    metrics: Mapping[str, Sequence[float]],
    *,
    width: float,
    level: float,
    min_count: int,
    ranges: Mapping[str, float] | None = None,
) -> bool:
    """The stopping rule: at least `min_count` values and every metric's interval (high - low)
    at most `width`.

    With `ranges` (metric -> its largest possible value R), each sample is padded with one
    pseudo-value at 0 and one at R before its interval is computed ("add two", as Agresti-Coull
    do for proportions): a run of equal values, e.g. all-zero MRR when nothing relevant is
    retrieved, then never has a zero-width interval, and the padding's weight fades as values
    accumulate.
    """
    for name, values in metrics.items():
        if len(values) < max(min_count, 2):
            return False
        if ranges is not None:
            values = [*values, 0.0, ranges[name]]
        _, low, high = confidence_interval(values, level=level)
        if high - low > width:
            return False
    return True


def at_k(grades: Sequence[int | None], k: int) -> tuple[float, float]:
    """(MRR@k, DCG@k) of graded chunks best first, grades binarised at >= 4 (None: 0)."""
    rel = [1 if (g or 0) >= within_doc.RELEVANT_GRADE else 0 for g in grades[:k]]
    return within_doc.mrr(rel, k), within_doc.dcg(rel, k)


def judge_key(**identity: Any) -> str:
    """A stable string naming a judge (backend, model, server, depth...) for grade caches."""
    return json.dumps(identity, sort_keys=True, default=str)


# ------------------------------------------------------------------------------ grade cache


class GradeCache:
    """Grades by (judge key, query id, chunk id) in an append-only JSONL, fsynced per batch, so
    a killed evaluation resumes with what it paid for and a changed judge never reuses them.

    A pair whose request failed is not a grade: it is kept in `failed` (pair -> reason) for
    this object's life, graded None (not relevant) without asking again, and never written, so
    a rerun asks again.
    """

    def __init__(self, path: Path, judge_key: str):
        self.path = Path(path)
        self.key = judge_key
        self.grades: dict[tuple[str, str], int | None] = {}
        self.failed: dict[tuple[str, str], str] = {}
        if self.path.exists():
            data = self.path.read_bytes()
            end = data.rfind(b"\n") + 1
            if end < len(data):  # a torn last line from a kill mid-write
                with open(self.path, "r+b") as handle:
                    handle.truncate(end)
            for line in data[:end].decode("utf-8").splitlines():
                record = json.loads(line)
                if record["judge"] == self.key:
                    self.grades[(record["query_id"], record["chunk_id"])] = record["grade"]

    def grade(
        self,
        judge: judge_lib.Judge,
        items: Sequence[tuple[str, str, Mapping[str, Any]]],
    ) -> list[int | None]:
        """Grades of (query id, query text, chunk record) items, judging only the missing ones
        (None where the request failed)."""
        missing = list(
            {(qid, chunk["id"]): (qid, text, chunk) for qid, text, chunk in items
             if (qid, chunk["id"]) not in self.grades and (qid, chunk["id"]) not in self.failed
             }.values()
        )  # fmt: skip
        if missing:
            grades, failures = judge_lib.grade_with_failures(
                judge, [text for _, text, _ in missing], [c for _, _, c in missing]
            )
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as handle:
                for (qid, _, chunk), grade, failed in zip(missing, grades, failures, strict=True):
                    if failed:
                        self.failed[(qid, chunk["id"])] = failed
                        continue
                    self.grades[(qid, chunk["id"])] = grade
                    handle.write(
                        json.dumps(
                            {"judge": self.key, "query_id": qid, "chunk_id": chunk["id"],
                             "grade": grade}
                        ) + "\n"
                    )  # fmt: skip
                handle.flush()
                os.fsync(handle.fileno())
        return [self.grades.get((qid, chunk["id"])) for qid, _, chunk in items]


# ----------------------------------------------------------------------------- step 6a


def validation_6a(
    judged: Sequence[Mapping[str, Any]],
    split_of_doc: Mapping[str, str],
    chunks_by_doc: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    encode_queries: EncodeFn,
    encode_chunks: EncodeFn,
    judge: judge_lib.Judge,
    cache: GradeCache,
    k: int,
) -> dict[str, Any]:
    """Step 6a: MRR@k / DCG@k of bi-enc(i) and bi-enc(i+1) on iteration i's validation pairs.

    Args:
      judged: iteration i's judgments (`query_id`, `query`, `doc_name`, `chunk_id`, `rank`,
        `top`, `grade`); their top-k records are bi-enc(i)'s ranking, already graded.
      split_of_doc: document -> split; only "val" documents count.
      chunks_by_doc: every chunk of each document (bi-enc(i+1) ranks them all).
      encode_queries, encode_chunks: bi-enc(i+1).
      judge: the training judge (the paper's "judging generative model").
      cache: grades of bi-enc(i+1)'s top k not judged in step 3.
      k: the cutoff.

    Returns:
      {"compare": within_doc.compare(base, exp), "pairs", "newly_judged", "failed_grades"}
      (compare is None without validation pairs; failed_grades: chunks whose request failed,
      counted as not relevant here and asked again on a rerun).
    """
    base_top: dict[Pair, list[tuple[int, str]]] = {}
    grade_of: dict[tuple[str, str], int | None] = {}
    text_of: dict[str, str] = {}
    for record in judged:
        if split_of_doc.get(record["doc_name"]) != "val":
            continue
        pair = (record["query_id"], record["doc_name"])
        text_of[record["query_id"]] = record["query"]
        grade_of.setdefault((record["query_id"], record["chunk_id"]), record["grade"])
        if record["top"]:
            base_top.setdefault(pair, []).append((record["rank"], record["chunk_id"]))
    pairs = sorted(base_top)
    if not pairs:
        return {"compare": None, "pairs": 0, "newly_judged": 0, "failed_grades": 0}
    query_ids = sorted({qid for qid, _ in pairs})
    query_vecs = dict(zip(query_ids, encode_queries([text_of[q] for q in query_ids]), strict=True))
    doc_vecs = {}
    for doc in sorted({doc for _, doc in pairs}):
        doc_vecs[doc] = encode_chunks([c["text"] for c in chunks_by_doc[doc]])
    before, failed_before = len(cache.grades), len(cache.failed)
    base = {f"mrr_at_{k}": [], f"dcg_at_{k}": []}
    exp = {f"mrr_at_{k}": [], f"dcg_at_{k}": []}
    for qid, doc in pairs:
        chunks = chunks_by_doc[doc]
        order = within_doc.rank_chunks(query_vecs[qid], doc_vecs[doc])[:k]
        new_top = [chunks[row] for row in order]
        unknown = [c for c in new_top if (qid, c["id"]) not in grade_of]
        cached = cache.grade(judge, [(qid, text_of[qid], c) for c in unknown])
        grade_of.update({(qid, c["id"]): g for c, g in zip(unknown, cached, strict=True)})
        old = [chunk_id for _, chunk_id in sorted(base_top[(qid, doc)])]
        for values, top in ((base, old), (exp, [c["id"] for c in new_top])):
            mrr, dcg = at_k([grade_of[(qid, c)] for c in top], k)
            values[f"mrr_at_{k}"].append(mrr)
            values[f"dcg_at_{k}"].append(dcg)
    return {
        "compare": within_doc.compare(base, exp),
        "pairs": len(pairs),
        "newly_judged": len(cache.grades) - before,
        "failed_grades": len(cache.failed) - failed_before,
    }


# ----------------------------------------------------------------------- final evaluation


def in_scope_documents(
    query_vecs: Sequence[np.ndarray],
    chunk_vecs: Sequence[np.ndarray],
    chunks: Sequence[Mapping[str, Any]],
    *,
    top_k_corpus: int,
    max_docs: int,
) -> list[list[str]]:
    """IV-E step 1: per query, D_test(q, K), the documents of the union over models of each
    model's top-K test chunks, best rank over the models first, at most `max_docs` (0: all).

    Args:
      query_vecs: per model `[Q, D]`; chunk_vecs: per model `[N, D]` (rows of `chunks`).
    """
    out = []
    for q_index in range(len(query_vecs[0])):
        best: dict[str, int] = {}
        for queries, vectors in zip(query_vecs, chunk_vecs, strict=True):
            top = np.argsort(-(vectors @ queries[q_index]), kind="stable")[:top_k_corpus]
            for rank, row in enumerate(top):
                doc = chunks[row]["doc_name"]
                best[doc] = min(best.get(doc, rank), rank)
        docs = sorted(best, key=lambda doc: (best[doc], doc))
        out.append(docs[:max_docs] if max_docs else docs)
    return out


def final_evaluation(
    queries: Sequence[Mapping[str, Any]],
    chunks: Sequence[Mapping[str, Any]],
    query_vecs: Sequence[np.ndarray],
    chunk_vecs: Sequence[np.ndarray],
    doc_type_of: Mapping[str, str],
    *,
    judge: judge_lib.Judge,
    cache: GradeCache,
    k: int,
    top_k_corpus: int,
    max_docs: int,
    similarity: float,
    fraction_p: int,
    ci_width: float,
    ci_level: float,
    min_pairs: int,
    batch_pairs: int,
    distance: str,
    seed: int,
    log_fn: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """IV-E steps 1-3 for bi-enc(i) vs bi-enc(i+1), i = 0..N-1 (N + 1 models given).

    Args:
      queries: Q_test records (`id`, `text`) from held-out documents.
      chunks: C_test (records with `id`, `doc_name`, `text`).
      query_vecs, chunk_vecs: per model bi-enc(0..N), `[Q, D]` and `[N_chunks, D]`, unit rows.
      doc_type_of: document -> filing type (per-type results).
      judge, cache: the evaluation judge (not the training judge) and its grade cache.
      k: the cutoff; top_k_corpus, max_docs: K and the cap on D_test(q, K).
      similarity: S of the document score; fraction_p: P (the top 1/P pairs are judged).
      ci_width, ci_level, min_pairs: stop when every metric's `ci_level` interval is at most
        `ci_width` wide over at least `min_pairs` judged pairs (or when the pairs run out).
      batch_pairs: pairs drawn between two checks of the rule.
      distance: "cosine" or "euclidean" for the Hausdorff distance and the top-1 distance.
      seed: the draw order.

    Returns:
      Per iteration i: {"iteration", "pairs_in_scope", "pairs_selected", "pairs_judged",
      "stopped" ("ci" | "exhausted"), "judged_chunks", "failed_grades" (judged chunks whose
      request failed: not relevant here, not cached, asked again on a rerun), "overall":
      compare + intervals, "by_type": {type: compare + intervals}}.
    """
    if len(query_vecs) < 2 or len(query_vecs) != len(chunk_vecs):
        raise ValueError(f"need >= 2 models' vectors, got {len(query_vecs)}, {len(chunk_vecs)}")
    scope = in_scope_documents(
        query_vecs, chunk_vecs, chunks, top_k_corpus=top_k_corpus, max_docs=max_docs
    )
    rows_by_doc: dict[str, np.ndarray] = {}
    for row, chunk in enumerate(chunks):
        rows_by_doc.setdefault(chunk["doc_name"], []).append(row)
    rows_by_doc = {doc: np.asarray(rows) for doc, rows in rows_by_doc.items()}
    results = []
    for i in range(len(query_vecs) - 1):
        tops: dict[Pair, tuple[list[int], list[int]]] = {}
        scores: dict[Pair, float] = {}
        for q_index, query in enumerate(queries):
            for doc in scope[q_index]:
                rows = rows_by_doc[doc]
                ranked, top1 = [], []
                for j in (i, i + 1):
                    sims = chunk_vecs[j][rows] @ query_vecs[j][q_index]
                    order = rows[np.argsort(-sims, kind="stable")[:k]]
                    ranked.append(order.tolist())
                    top1.append(
                        float(pairwise_distance(
                            query_vecs[j][q_index][None], chunk_vecs[j][order[:1]],
                            distance=distance,
                        )[0, 0])
                    )  # fmt: skip
                # Both sets in bi-enc(i)'s space: one metric for the change of the top k.
                hausdorff = modified_hausdorff(
                    chunk_vecs[i][ranked[0]], chunk_vecs[i][ranked[1]], distance=distance
                )
                pair = (query["id"], doc)
                tops[pair] = (ranked[0], ranked[1])
                scores[pair] = document_score(hausdorff, min(top1), similarity=similarity)
        selected = select_top_fraction(scores, fraction_p=fraction_p)
        order = np.random.default_rng([seed, i]).permutation(len(selected))
        text_of = {query["id"]: query["text"] for query in queries}
        names = (f"mrr_at_{k}", f"dcg_at_{k}")
        best = {names[0]: 1.0, names[1]: within_doc.dcg([1] * k, k)}  # every top-k chunk relevant
        ranges = {f"{side}/{n}": best[n] for side in ("base", "exp") for n in names}
        base = {name: [] for name in names}
        exp = {name: [] for name in names}
        judged_pairs: list[Pair] = []
        stopped = "exhausted"
        for start in range(0, len(order), batch_pairs):
            batch = [selected[row] for row in order[start : start + batch_pairs]]
            items = [
                (qid, text_of[qid], chunks[row])
                for qid, doc in batch
                for row in dict.fromkeys(tops[(qid, doc)][0] + tops[(qid, doc)][1])
            ]
            grades = dict(
                zip([(q, c["id"]) for q, _, c in items], cache.grade(judge, items), strict=True)
            )
            for qid, doc in batch:
                for values, top in zip((base, exp), tops[(qid, doc)], strict=True):
                    mrr, dcg = at_k([grades[(qid, chunks[row]["id"])] for row in top], k)
                    values[names[0]].append(mrr)
                    values[names[1]].append(dcg)
                judged_pairs.append((qid, doc))
            series = {f"base/{n}": v for n, v in base.items()} | {
                f"exp/{n}": v for n, v in exp.items()
            }
            if intervals_narrow(
                series, width=ci_width, level=ci_level, min_count=min_pairs, ranges=ranges
            ):
                stopped = "ci"
                break
        judged_chunks = {(q, chunks[r]["id"]) for q, d in judged_pairs
                         for r in tops[(q, d)][0] + tops[(q, d)][1]}  # fmt: skip
        failed = sum(item in cache.failed for item in judged_chunks)
        log_fn(
            f"final eval {i}: {len(judged_pairs)}/{len(selected)} selected pairs judged "
            f"({len(scores)} in scope), stopped: {stopped}, {failed} of {len(judged_chunks)} "
            "grades failed (not relevant here; asked again on a rerun)"
        )
        by_type: dict[str, list[int]] = {}
        for position, (_, doc) in enumerate(judged_pairs):
            by_type.setdefault(doc_type_of.get(doc, "unknown"), []).append(position)
        results.append(
            {
                "iteration": i,
                "pairs_in_scope": len(scores),
                "pairs_selected": len(selected),
                "pairs_judged": len(judged_pairs),
                "stopped": stopped,
                "judged_chunks": len(judged_chunks),
                "failed_grades": failed,
                "overall": summarize(base, exp, level=ci_level),
                "by_type": {
                    doc_type: summarize(
                        {n: [v[p] for p in positions] for n, v in base.items()},
                        {n: [v[p] for p in positions] for n, v in exp.items()},
                        level=ci_level,
                    )
                    for doc_type, positions in sorted(by_type.items())
                },
            }
        )  # fmt: skip
    return results


def summarize(
    base: Mapping[str, Sequence[float]], exp: Mapping[str, Sequence[float]], *, level: float
) -> dict[str, dict[str, float]]:
    """`within_doc.compare` plus each side's confidence interval (`base_ci`, `exp_ci`: [low,
    high], None from a single value, so the JSON stays standard)."""
    if not next(iter(base.values()), []):
        return {}
    out = within_doc.compare(base, exp)
    for metric in out:
        for side, values in (("base", base[metric]), ("exp", exp[metric])):
            _, low, high = confidence_interval(values, level=level)
            out[metric][f"{side}_ci"] = [low, high] if len(values) > 1 else None
    return out


# ------------------------------------------------------------------------------ agreement


def judge_agreement(
    grades_a: Sequence[int | None], grades_b: Sequence[int | None]
) -> dict[str, float]:
    """Agreement of two judges on the same pairs (pairs where either gave no grade are left out):
    exact agreement rate and Cohen's kappa on the 1-4 grades, and both on the binarised grades
    (>= 4, the relevance every metric uses)."""
    from sklearn.metrics import cohen_kappa_score

    both = [
        (a, b) for a, b in zip(grades_a, grades_b, strict=True) if a is not None and b is not None
    ]
    out: dict[str, float] = {"pairs": len(grades_a), "graded_by_both": len(both)}
    if not both:
        return out
    a, b = np.array([x for x, _ in both]), np.array([y for _, y in both])
    bin_a, bin_b = (
        (a >= within_doc.RELEVANT_GRADE).astype(int),
        (b >= within_doc.RELEVANT_GRADE).astype(int),
    )
    out["agreement"] = float(np.mean(a == b))
    out["kappa"] = _kappa(a, b, cohen_kappa_score)
    out["binary_agreement"] = float(np.mean(bin_a == bin_b))
    out["binary_kappa"] = _kappa(bin_a, bin_b, cohen_kappa_score)
    return out


def _kappa(a: np.ndarray, b: np.ndarray, fn) -> float:
    # Both judges constant on one value: kappa is undefined (0/0); report agreement only.
    if len(set(a.tolist()) | set(b.tolist())) < 2:
        return float("nan")
    return float(fn(a, b))
