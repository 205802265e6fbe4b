"""What a real-LLM mining run got back, and how it compares with the offline run (docs/mining.md).

    python scripts/llm_run_report.py --llm runs/mine_smollm2 --offline runs/mine_smollm2_offline \\
        --output runs/mine_smollm2/report.md

Reads the run's LLM response cache (every answer the server gave, with its request) and counts
unusable answers by stage and reason with the pipeline's own parsers: InPars generations (no query
line, no log-probabilities), few-shot lines (rejected by the step 1a filter) and judge replies
(empty, off-scale, unparseable). Then grades the LLM-judged (query, chunk) pairs with the
embedding judge (all-MiniLM-L6-v2, calibrated as the offline run calibrates it, on this run's
queries) and reports agreement and Cohen's kappa; and puts both runs' per-iteration metrics and
final evaluations side by side.
"""

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caliber_jax.data import corpus  # noqa: E402
from caliber_jax.mining import client as client_lib  # noqa: E402
from caliber_jax.mining import final_eval, mining, querygen  # noqa: E402
from caliber_jax.mining import judge as judge_lib  # noqa: E402


def classify_cache(cache_dir: Path) -> dict[str, collections.Counter]:
    """Per stage ("inpars", "few-shot", "judge"): outcome -> count over the cached answers."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for path in sorted(cache_dir.glob("*/*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        request, response = record["request"], record["response"]
        texts = client_lib.choice_texts(response)
        text = texts[0] if texts else ""
        if "prompt" in request:
            stage = "inpars"
            query = querygen.parse_query(text)
            score = (client_lib.choice_mean_logprobs(response) or [None])[0]
            if query is None:
                out[stage]["no query line" if text.strip() else "empty"] += 1
            elif query.lower().replace("\u2019", "'") in querygen.EXAMPLE_QUERIES:
                out[stage]["copied a prompt example"] += 1
            elif score is None:
                out[stage]["no log-probabilities"] += 1
            else:
                out[stage]["usable"] += 1
        elif request["messages"][0]["content"].startswith("You are grading"):
            stage = "judge"
            grade = judge_lib.parse_grade(text)
            out[stage]["usable" if grade else judge_lib.unusable_reason(text)] += 1
        else:
            stage = "few-shot"
            lines = [line for line in text.splitlines() if line.strip()]
            out[stage]["replies"] += 1
            if not lines:
                out[stage]["empty reply"] += 1
            prompt = request["messages"][0]["content"]
            shots = prompt.split("# Example of queries:\n", 1)[-1].split("\n\ngenerate", 1)[0]
            exemplars = {line.strip().lower() for line in shots.splitlines() if line.strip()}
            for line in lines:
                query = querygen.accept_query(line, min_words=5, seen=exemplars)
                if query:
                    out[stage]["lines accepted (before cross-reply dedup)"] += 1
                elif querygen.accept_query(line, min_words=5, seen=set()):
                    out[stage]["lines repeating an exemplar"] += 1
                else:
                    out[stage]["lines too short, not a question or first person"] += 1
    return out


def agreement(workdir: Path, minilm_dir: str) -> dict[str, float]:
    """LLM grades of every judged pair in the run vs the embedding judge's on the same pairs."""
    from caliber_jax.embedder import Embedder

    chunks = {c["id"]: c for c in corpus.load_jsonl(workdir / "chunks.jsonl")}
    pairs = []
    for path in sorted(workdir.glob("iter_*/judgments.jsonl")):
        pairs += [(r["query"], r["chunk_id"], r["grade"]) for r in corpus.load_jsonl(path)]
    pairs = list({(q, c): (q, c, g) for q, c, g in pairs}.values())
    embedder = Embedder.from_pretrained(minilm_dir)
    encode_fn = embedder.encode_fn(batch_size=32, max_length=256)
    queries = corpus.load_jsonl(workdir / "iter_0" / "queries.jsonl")
    tv_chunks = [c for c in chunks.values() if c["split"] in ("train", "val")]
    name = f"{minilm_dir} layers=None"
    calibration = mining.calibrate_embedding_judge(
        judge_lib.EmbeddingJudge(encode_fn, [0.0, 0.0, 0.0], name=name),
        queries, tv_chunks, positive_quantile=0.5, negative_quantile=0.95, seed=0,
    )  # fmt: skip
    judge = judge_lib.EmbeddingJudge(encode_fn, calibration["thresholds"], name=name)
    embedding = judge.grade([q for q, _, _ in pairs], [chunks[c] for _, c, _ in pairs])
    out = final_eval.judge_agreement([g for _, _, g in pairs], embedding)
    out["llm_grades"] = dict(collections.Counter(str(g) for _, _, g in pairs))
    out["embedding_grades"] = dict(collections.Counter(str(g) for g in embedding))
    return out


def metric_rows(name: str, results: list[dict], key: str) -> list[str]:
    rows = []
    for result in results:
        for metric, v in (result["eval"].get(key) or {}).items():
            rows.append(
                f"| {result['iteration']} | {name} | {metric} | {v['count']} | "
                f"{v['base']:.4f} +- {v['base_se']:.4f} | {v['exp']:.4f} +- {v['exp_se']:.4f} | "
                f"{v['cohens_d']:+.3f} |"
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm", required=True, type=Path)
    parser.add_argument("--offline", type=Path, default=None)
    parser.add_argument("--minilm_dir", default=None)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    if args.minilm_dir is None:
        from configs import mine as mine_config

        args.minilm_dir = mine_config.minilm_dir()
    report: dict = {"outcomes": classify_cache(args.llm / "llm_cache")}
    report["agreement"] = agreement(args.llm, args.minilm_dir)
    lines = ["## Unusable LLM answers (from the response cache)", ""]
    for stage, counts in sorted(report["outcomes"].items()):
        lines.append(f"- {stage}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    a = report["agreement"]
    lines += ["", "## LLM judge vs embedding judge on the same pairs", "", json.dumps(a), ""]
    runs = [("llm", args.llm)] + ([("offline", args.offline)] if args.offline else [])
    sections = (
        ("heldout_judged", "Held-out test documents (training judge)"),
        ("validation_6a", "Validation documents, step 6a (training judge)"),
    )
    for key, title in sections:
        lines += [f"## {title}", "",
                  "| iteration | run | metric | pairs | base | exp | Cohen's d |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for name, workdir in runs:
            if (workdir / "results.json").exists():
                lines += metric_rows(name, json.loads((workdir / "results.json").read_text()), key)
        lines.append("")
    from caliber_jax import mine_final

    for name, workdir in runs:
        if (workdir / "final_eval.json").exists():
            lines += [f"### {name} run", ""]
            lines.append(
                mine_final.format_markdown(json.loads((workdir / "final_eval.json").read_text()))
            )
    args.output.write_text("\n".join(lines) + "\n", encoding="utf-8")
    corpus.save_json(args.output.with_suffix(".json"), report)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
