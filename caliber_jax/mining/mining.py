"""The stages of one mining iteration of paper 001 (IV-A steps 1-4, IV-B2, IV-C2), each resumable.

Every stage writes its output atomically (JSONL via `corpus.save_jsonl`, vectors in a TensorStore
array via `teacher.embed_to_store`), so a finished stage is skipped on rerun. Judging, the
expensive stage, appends each judged batch to `<name>.partial.jsonl` and renames it when complete:
a killed run resumes after the last complete batch and ends with the same file. A failed judge
request is never stored as a grade: the next call asks for that pair again. No jax.
"""

import collections
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from caliber_jax.data import corpus, teacher
from caliber_jax.eval import within_doc
from caliber_jax.mining import judge as judge_lib
from caliber_jax.mining import querygen, sampling, triples

EncodeFn = Callable[[list[str]], np.ndarray]


def cached_jsonl(path: Path, build: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The records of `path` if it exists (a finished stage), else `build()` saved there."""
    if path.exists():
        return corpus.load_jsonl(path)
    records = build()
    corpus.save_jsonl(path, records)
    return records


def group_by_doc(chunks: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Chunks per document, in document order and chunk order."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for chunk in chunks:
        out.setdefault(chunk["doc_name"], []).append(chunk)
    return out


def sample_chunks_per_doc(
    chunks: Sequence[Mapping[str, Any]], *, per_doc: int, seed: int
) -> list[Mapping[str, Any]]:
    """Step 1's sample: up to `per_doc` chunks of each document (seeded), in corpus order."""
    out = []
    for doc_name, doc_chunks in group_by_doc(chunks).items():
        rng = np.random.default_rng([seed, int.from_bytes(doc_name.encode()[:8], "big")])
        rows = np.sort(rng.permutation(len(doc_chunks))[:per_doc])
        out += [doc_chunks[row] for row in rows]
    return out


def generate_queries(
    generator: querygen.QueryGenerator,
    chunks: Sequence[Mapping[str, Any]],
    *,
    per_doc: int,
    batch_size: int,
) -> list[dict[str, Any]]:
    """Step 1: one query per chunk, then the top `per_doc` per document by score (InPars)."""
    scored: list[querygen.Scored] = []
    for start in range(0, len(chunks), batch_size):
        scored += generator.generate(chunks[start : start + batch_size])
    return querygen.select_top(chunks, scored, per_doc=per_doc)


def encode_chunks(
    encode_fn: EncodeFn,
    texts: Sequence[str],
    path: Path,
    *,
    model_name: str,
    dim: int,
    batch_rows: int,
    chunk_rows: int,
) -> np.ndarray:
    """Student vectors of `texts` in a TensorStore array at `path` (resumable); returns `[N, D]`."""
    teacher.embed_to_store(
        encode_fn,
        list(texts),
        path,
        batch_rows=batch_rows,
        dim=dim,
        chunk_rows=chunk_rows,
        process_index=0,
        process_count=1,
        metadata={"teacher": model_name, "pooling": "model", "native_dim": dim},
    )
    reader = teacher.open_reader(
        path, expect_rows=len(texts), expect_dim=dim, expect_hash=teacher.text_hash(texts)
    )
    return reader[np.arange(len(texts))]


def retrieve_candidates(
    queries: Sequence[Mapping[str, Any]],
    query_vecs: np.ndarray,
    chunks: Sequence[Mapping[str, Any]],
    chunk_vecs: np.ndarray,
    *,
    top_k_corpus: int,
    max_docs: int,
    k: int,
    omega: float,
    seed: int,
) -> list[dict[str, Any]]:
    """Steps 2 and 3a: per query, the documents of its corpus-wide top-K chunks (at most
    `max_docs`, by best rank), and per document the top k chunks plus 2k sampled by rank.

    Returns:
      Candidate records {"query_id", "query", "doc_name", "chunk_id", "rank" (within the
      document), "top" (in the top k), "score" (student cosine)} in query, document, draw order.
    """
    rows_by_doc: dict[str, list[int]] = {}
    for row, chunk in enumerate(chunks):
        rows_by_doc.setdefault(chunk["doc_name"], []).append(row)
    doc_rows = {doc: np.asarray(rows) for doc, rows in rows_by_doc.items()}
    out = []
    for q_index, (query, query_vec) in enumerate(zip(queries, query_vecs, strict=True)):
        scores = chunk_vecs @ query_vec
        top = np.argsort(-scores, kind="stable")[:top_k_corpus]
        docs = list(dict.fromkeys(chunks[row]["doc_name"] for row in top))[:max_docs]
        for doc in docs:
            rows = doc_rows[doc]
            order = rows[np.argsort(-scores[rows], kind="stable")]
            rng = np.random.default_rng([seed, q_index, len(out)])
            ranked_ids = [chunks[row]["id"] for row in order]
            score_of = {chunks[row]["id"]: float(scores[row]) for row in order}
            for chunk_id, rank, in_top in sampling.select_candidates(
                ranked_ids, k=k, omega=omega, rng=rng
            ):
                out.append(
                    {
                        "query_id": query["id"],
                        "query": query["text"],
                        "doc_name": doc,
                        "chunk_id": chunk_id,
                        "rank": rank,
                        "top": in_top,
                        "score": score_of[chunk_id],
                    }
                )
    return out


def _complete_lines(path: Path) -> int:
    """Counts complete lines of a partial JSONL, cutting off a torn last line (a kill mid-write)."""
    if not path.exists():
        return 0
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with open(path, "r+b") as handle:
            handle.truncate(end)
    return data[:end].count(b"\n")


def judge_candidates(
    judge: judge_lib.Judge,
    candidates: Sequence[Mapping[str, Any]],
    chunk_by_id: Mapping[str, Mapping[str, Any]],
    path: Path,
    *,
    batch_size: int,
    log_fn: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Step 3: grades every candidate, `batch_size` at a time, resumable after a kill.

    Returns the candidates with "grade" and "judge" (`judge.identity`) added, as saved in
    `path`. A pair whose request failed (`judge.grade_with_failures`) is saved with grade None
    and "failed" (the reason): ungraded in this run, as a pair the judge gave no grade, but not
    a grade, so the next call on the file (finished or partial) asks for it again. A file of
    another judge is refused: one stage, one judge.
    """
    if path.exists():
        records = _check_judge(corpus.load_jsonl(path), judge, path)
        return _ask_again(judge, records, chunk_by_id, path, batch_size=batch_size, log_fn=log_fn)
    partial = path.with_name(path.stem + ".partial.jsonl")
    done = _complete_lines(partial)
    if done:
        records = _check_judge(corpus.load_jsonl(partial), judge, partial)
        log_fn(f"judge: resuming {path.name} at {done}/{len(candidates)}")
        _ask_again(judge, records, chunk_by_id, partial, batch_size=batch_size, log_fn=log_fn)
    with open(partial, "a", encoding="utf-8") as handle:
        for start in range(done, len(candidates), batch_size):
            graded = _graded(judge, candidates[start : start + batch_size], chunk_by_id)
            handle.write("".join(json.dumps(record) + "\n" for record in graded))
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(partial, path)
    return corpus.load_jsonl(path)


def _graded(
    judge: judge_lib.Judge,
    batch: Sequence[Mapping[str, Any]],
    chunk_by_id: Mapping[str, Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """`batch` (candidates, or records to grade again) with "grade" and "judge" set, and
    "failed" (the reason) only where the request failed."""
    grades, failures = judge_lib.grade_with_failures(
        judge, [c["query"] for c in batch], [chunk_by_id[c["chunk_id"]] for c in batch]
    )
    out = []
    for candidate, grade, failed in zip(batch, grades, failures, strict=True):
        record = {key: value for key, value in candidate.items() if key != "failed"}
        record |= {"grade": grade, "judge": judge.identity}
        out.append(record | {"failed": failed} if failed else record)
    return out


def _ask_again(
    judge: judge_lib.Judge,
    records: list[dict[str, Any]],
    chunk_by_id: Mapping[str, Mapping[str, Any]],
    path: Path,
    *,
    batch_size: int,
    log_fn: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Grades again the records whose request failed in an earlier run, then rewrites `path`
    atomically; `records` is returned (updated in place)."""
    rows = [row for row, record in enumerate(records) if record.get("failed")]
    if not rows:
        return records
    log_fn(f"judge: asking again for {len(rows)} pairs of {path.name} whose request failed")
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        regraded = _graded(judge, [records[row] for row in batch], chunk_by_id)
        for row, record in zip(batch, regraded, strict=True):
            records[row] = record
    corpus.save_jsonl(path, records)
    return records


def failed_count(records: Sequence[Mapping[str, Any]]) -> int:
    """How many judged records have no grade because their request failed (see
    `judge_candidates`)."""
    return sum(1 for record in records if record.get("failed"))


def _check_judge(
    records: list[dict[str, Any]], judge: judge_lib.Judge, path: Path
) -> list[dict[str, Any]]:
    other = [r.get("judge") for r in records if r.get("judge") != judge.identity]
    if other:
        raise ValueError(
            f"{path}: graded by judge {other[0]!r}, but this run's judge is {judge.identity!r}; "
            "use a new workdir or delete the file"
        )
    return records


def calibrate_embedding_judge(
    embedding_judge: judge_lib.EmbeddingJudge,
    queries: Sequence[Mapping[str, Any]],
    chunks: Sequence[Mapping[str, Any]],
    *,
    positive_quantile: float,
    negative_quantile: float,
    seed: int,
) -> dict[str, Any]:
    """Thresholds of the embedding judge from (query, its source chunk) positives and (query, a
    random chunk of another document) negatives (see `judge.calibrate_thresholds`)."""
    chunk_by_id = {chunk["id"]: chunk for chunk in chunks}
    rng = np.random.default_rng(seed)
    with_source = [q for q in queries if q.get("chunk_id") in chunk_by_id]
    if not with_source:
        raise ValueError("calibration needs queries generated from known chunks")
    negatives = []
    for query in with_source:
        others = [c for c in chunks if c["doc_name"] != query["doc_name"]] or chunks
        negatives.append(others[int(rng.integers(len(others)))])
    texts = [q["text"] for q in with_source]
    positive = embedding_judge.cosines(texts, [chunk_by_id[q["chunk_id"]] for q in with_source])
    negative = embedding_judge.cosines(texts, negatives)
    return judge_lib.calibrate_thresholds(
        positive, negative, positive_quantile=positive_quantile, negative_quantile=negative_quantile
    )


def mine_triples(
    judged: Sequence[Mapping[str, Any]],
    split_of_doc: Mapping[str, str],
    seen: set[tuple[str, str, str]],
    *,
    margin: float,
    distance: str,
    correct_ratio: float,
    max_per_group: int,
    seed: int,
) -> dict[str, list[dict[str, Any]]]:
    """Step 4: same-document triples (> 3 vs < 3) minus those of earlier iterations (`seen`),
    then hard plus already-correct ones per (query, document); split by the document's split
    ("train" / "val"). `seen` gains the kept triples."""
    fresh = triples.deduplicate(triples.extract_triples(judged), seen)
    kept = triples.select_triples(
        fresh,
        margin=margin,
        distance=distance,
        correct_ratio=correct_ratio,
        max_per_group=max_per_group,
        seed=seed,
    )
    seen.update(triples.triple_key(t) for t in kept)
    out: dict[str, list[dict[str, Any]]] = {"train": [], "val": []}
    for triple in kept:
        out[split_of_doc[triple["doc_name"]]].append(triple)
    return out


def triple_texts(
    records: Sequence[Mapping[str, Any]], chunk_by_id: Mapping[str, Mapping[str, Any]]
) -> list[tuple[str, str, str]]:
    """(query, c_rel text, c_irrel text) of triple records."""
    return [
        (t["query"], chunk_by_id[t["pos_id"]]["text"], chunk_by_id[t["neg_id"]]["text"])
        for t in records
    ]


def eval_rankings(
    queries: Sequence[Mapping[str, Any]],
    query_vecs: Mapping[str, np.ndarray],
    chunks: Sequence[Mapping[str, Any]],
    chunk_vecs: Mapping[str, np.ndarray],
    *,
    top_k_corpus: int,
    max_docs: int,
) -> dict[str, dict[tuple[str, str], list[str]]]:
    """IV-E steps 1-2 on the test documents, for several models at once.

    D_test(q, K) is the union over models of the documents of each model's top-K test chunks
    (at most `max_docs`, by best rank over the models); each model then ranks every chunk of
    each such document. Returns {model: {(query id, doc): chunk ids best first}}: keyed by id,
    so queries sharing a text (a repeated template question) stay separate pairs.
    """
    models = list(query_vecs)
    ids = [chunk["id"] for chunk in chunks]
    rows_by_doc: dict[str, list[int]] = {}
    for row, chunk in enumerate(chunks):
        rows_by_doc.setdefault(chunk["doc_name"], []).append(row)
    rankings: dict[str, dict[tuple[str, str], list[str]]] = {model: {} for model in models}
    for q_index, query in enumerate(queries):
        best: dict[str, int] = {}
        scores = {m: chunk_vecs[m] @ query_vecs[m][q_index] for m in models}
        for model in models:
            top = np.argsort(-scores[model], kind="stable")[:top_k_corpus]
            for rank, row in enumerate(top):
                doc = chunks[row]["doc_name"]
                best[doc] = min(best.get(doc, rank), rank)
        docs = sorted(best, key=lambda doc: (best[doc], doc))[:max_docs]
        for model in models:
            for doc in docs:
                rows = np.asarray(rows_by_doc[doc])
                order = rows[np.argsort(-scores[model][rows], kind="stable")]
                rankings[model][(query["id"], doc)] = [ids[row] for row in order]
    return rankings


def judged_eval(
    rankings: Mapping[str, Mapping[tuple[str, str], Sequence[str]]],
    judge: judge_lib.Judge,
    chunk_by_id: Mapping[str, Mapping[str, Any]],
    cache_path: Path,
    *,
    k: int,
    queries: Sequence[Mapping[str, Any]],
    log_fn: Callable[[str], None] = print,
) -> dict[str, dict[str, list[float]]]:
    """Step 6a: judges each model's top k and returns per-(query, document) MRR@k / DCG@k per
    model, in the order of `rankings` (keyed by query id, see `eval_rankings`; `queries` gives
    their texts). Grades are cached in `cache_path` across iterations under (judge identity,
    query text, chunk): a grade depends on those alone, and another judge's grades stay in the
    file but are never used for this one. A pair whose request failed counts as not relevant
    in this call (logged) and is not cached, so the next call asks again."""
    text_of = {query["id"]: query["text"] for query in queries}
    records = corpus.load_jsonl(cache_path) if cache_path.exists() else []
    # Records of other judges are kept (switching back reuses them), not read.
    cache: dict[tuple[str, str], int | None] = {
        (r["query"], r["chunk_id"]): r["grade"] for r in records if r.get("judge") == judge.identity
    }
    failed: dict[tuple[str, str], str] = {}  # this call only: never written to `cache_path`

    def grade_fn(id_pairs: list[tuple[str, str]]) -> list[int | None]:
        pairs = [(text_of[query_id], chunk_id) for query_id, chunk_id in id_pairs]
        missing = list(dict.fromkeys(p for p in pairs if p not in cache and p not in failed))
        if missing:
            grades, failures = judge_lib.grade_with_failures(
                judge, [q for q, _ in missing], [chunk_by_id[c] for _, c in missing]
            )
            graded = []
            for pair, grade, reason in zip(missing, grades, failures, strict=True):
                if reason:
                    failed[pair] = reason
                else:
                    cache[pair] = grade
                    graded.append(pair)
            if graded:
                records.extend(
                    {"judge": judge.identity, "query": q, "chunk_id": c, "grade": cache[(q, c)]}
                    for q, c in graded
                )
                corpus.save_jsonl(cache_path, records)
        return [cache.get(pair) for pair in pairs]

    per_model, _ = within_doc.judged_at_k(rankings, grade_fn, k=k)
    if failed:
        log_fn(
            f"judged eval: {len(failed)} grades failed ({_by_reason(failed.values())}), counted "
            f"as not relevant here; not cached in {cache_path.name}, so a rerun asks again"
        )
    return per_model


def _by_reason(reasons: Iterable[str]) -> str:
    """How many of each failure reason, as "HTTP 500 x2, timeout x1"."""
    counts = collections.Counter(reasons)
    return ", ".join(f"{reason} x{count}" for reason, count in sorted(counts.items()))
