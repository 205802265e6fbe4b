"""Where a calibrated student left its teacher: residual statistics on the FinanceBench corpus.

    python scripts/drift_report.py --teacher "$MINILM" --student runs/sweep/runs/NAME/hf [MORE ...]

For every FinanceBench evidence passage p, r(p) = s(p) - t(p) (unit vectors, the model's own max
length). Prints how far the student moved (|r|), how *coherent* the moves are (mean pairwise
cosine of the residuals, and the norm of their mean direction: 0 for independent moves), how well
it kept the passage-to-passage similarity structure (Pearson correlation of the off-diagonal
cosines; mean squared change), and nDCG@10 with the student on one side only (student queries +
teacher passages, teacher queries + student passages), which says which side costs retrieval. The
same residual statistics of the queries (`query_` keys) say how far the student's question vectors
left the teacher's. `--financebench` takes any file of FinanceBench's format (a mined dev set).
Several `--student` directories share one teacher encoding. Writes the numbers as JSON with
`--output` (one student: its numbers; several: {directory: numbers}).
"""

import argparse
import json
from pathlib import Path

import numpy as np

from caliber_jax.embedder import Embedder
from caliber_jax.eval import retrieval

FINANCEBENCH = Path(__file__).resolve().parents[1] / "data/sample/financebench_open_source.jsonl.gz"


def drift_stats(teacher: np.ndarray, student: np.ndarray) -> dict[str, float]:
    """Residual statistics of two `[N, D]` arrays of unit rows for the same N texts."""
    if teacher.shape != student.shape or teacher.ndim != 2 or len(teacher) < 2:
        raise ValueError(f"need two [N >= 2, D] arrays of one shape: {teacher.shape}, "
                         f"{student.shape}")  # fmt: skip
    residual = student - teacher
    norms = np.linalg.norm(residual, axis=1)
    unit = residual / np.maximum(norms, 1e-12)[:, None]
    off = ~np.eye(len(teacher), dtype=bool)
    sim_t, sim_s = (teacher @ teacher.T)[off], (student @ student.T)[off]
    return {
        "residual_norm_mean": float(norms.mean()),
        "residual_norm_median": float(np.median(norms)),
        "cos_to_teacher_mean": float(np.sum(teacher * student, axis=1).mean()),
        "residual_pairwise_cos_mean": float((unit @ unit.T)[off].mean()),
        "residual_mean_direction_norm": float(np.linalg.norm(unit.mean(0))),
        "similarity_corr": float(np.corrcoef(sim_t, sim_s)[0, 1]),
        "similarity_sq_change_mean": float(((sim_s - sim_t) ** 2).mean()),
        "similarity_mean_teacher": float(sim_t.mean()),
        "similarity_mean_student": float(sim_s.mean()),
    }


def ndcg10(queries: np.ndarray, docs: np.ndarray, qrels: dict, qids: list, dids: list) -> float:
    """nDCG@10 of cosine retrieval with the given query and document vectors."""
    run = retrieval.rank_run(qids, dids, lambda rows: queries[rows] @ docs.T, 100)
    return float(retrieval.retrieval_metrics(qrels, run)["ndcg_at_10"])


def report(vectors: dict, qrels: dict, qids: list, dids: list) -> dict[str, float]:
    """Passage and query residuals and the four one-side nDCG@10 of one teacher/student pair.

    `vectors[side, kind]` holds `[N, D]` unit rows, side "teacher"/"student", kind "q"/"d".
    """
    stats = drift_stats(vectors["teacher", "d"], vectors["student", "d"])
    query = drift_stats(vectors["teacher", "q"], vectors["student", "q"])
    stats.update({f"query_{key}": value for key, value in query.items()})
    for query_side in ("teacher", "student"):
        for doc_side in ("teacher", "student"):
            stats[f"ndcg_at_10_{query_side}_queries_{doc_side}_docs"] = ndcg10(
                vectors[query_side, "q"], vectors[doc_side, "d"], qrels, qids, dids
            )
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher", required=True, help="teacher model directory")
    parser.add_argument("--student", required=True, nargs="+", help="student model directories")
    parser.add_argument("--financebench", default=str(FINANCEBENCH))
    parser.add_argument("--max_length", type=int, default=None, help="default: the model's")
    parser.add_argument("--output", default=None, help="also write the numbers here (JSON)")
    args = parser.parse_args()

    queries, corpus, qrels = retrieval.load_financebench(args.financebench)
    qids, dids = list(queries), list(corpus)

    def encode(path: str) -> dict:
        model = Embedder.from_pretrained(path)
        texts = {"q": [queries[q] for q in qids], "d": [corpus[d] for d in dids]}
        return {kind: model.encode(rows, max_length=args.max_length) for kind, rows in texts.items()}

    teacher = encode(args.teacher)
    reports = {}
    for path in args.student:
        student = encode(path)
        vectors = {("teacher", k): v for k, v in teacher.items()}
        vectors.update({("student", k): v for k, v in student.items()})
        reports[path] = report(vectors, qrels, qids, dids)
        print(path)
        for key, value in reports[path].items():
            print(f"  {key} = {value:.4f}")
    if args.output:
        out = reports[args.student[0]] if len(args.student) == 1 else reports
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
