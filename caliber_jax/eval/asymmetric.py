"""LEAF's asymmetric retrieval: the student encodes queries, the teacher encodes documents.

Alignment-only distillation puts the student in the teacher's space, so a corpus indexed once
with the large teacher can be searched with student query vectors. A teacher wider than the
student is MRL-truncated to the student's dim and re-normalised (as in training). No jax.
"""

from collections.abc import Mapping, Sequence

from caliber_jax.eval import EncodeFn, encode_texts, mrl, retrieval


def evaluate(
    query_encode_fn: EncodeFn,
    doc_encode_fn: EncodeFn,
    *,
    queries: Mapping[str, str],
    corpus: Mapping[str, str],
    qrels: Mapping[str, Mapping[str, int]],
    query_task: str | None = None,
    ks: Sequence[int] = (10, 100),
) -> dict[str, float]:
    """Retrieval metrics of student queries against teacher documents.

    Args:
      query_encode_fn: the student, `texts -> [n, D_s]` unit vectors.
      doc_encode_fn: the teacher, `texts -> [n, D_t]` unit vectors with D_t >= D_s.
      queries: {qid: text}.
      corpus: {doc id: text}.
      qrels: {qid: {doc id: grade}}.
      query_task: instruction for the queries (`Instruct: {task}\\nQuery:{query}`); documents
        get none.
      ks: metric cutoffs.

    Returns:
      The metrics of `retrieval.retrieval_metrics`.
    """
    query_ids, doc_ids = list(queries), list(corpus)
    texts = [queries[q] for q in query_ids]
    if query_task:
        texts = [retrieval.format_query(text, query_task) for text in texts]
    query_vecs = encode_texts(query_encode_fn, texts, "queries (student)")
    doc_vecs = encode_texts(doc_encode_fn, [corpus[d] for d in doc_ids], "corpus (teacher)")
    student_dim, teacher_dim = query_vecs.shape[1], doc_vecs.shape[1]
    if teacher_dim < student_dim:
        raise ValueError(
            f"teacher dim {teacher_dim} < student dim {student_dim}: the student's space must be "
            "the teacher's (or an MRL prefix of it)"
        )
    doc_vecs = mrl.truncate(doc_vecs, student_dim)
    run = retrieval.rank_run(
        query_ids, doc_ids, lambda rows: query_vecs[rows] @ doc_vecs.T, top_k=max(ks)
    )
    return retrieval.retrieval_metrics(qrels, run, ks)
