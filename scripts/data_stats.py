"""Passage and NumGap statistics of a corpus (the FinanceBench filings, by default use).

    python scripts/data_stats.py /work/shared/data/financebench/filings.jsonl.gz /tmp/prepared

Runs `caliber_jax.prepare.prepare` without the FinanceBench evaluation filings, then prints the
number of passages, the share admitting a perturbation (the paper saw 38.5% on its corpus), the
per-category counts, the NumGap split sizes and the wall time.
"""

import argparse
import statistics
import time

from caliber_jax.data import corpus, perturb
from caliber_jax.prepare import prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", help="corpus file (.txt, .jsonl, .jsonl.gz)")
    parser.add_argument("output_dir", help="folder for passages.jsonl, numgap_*.jsonl, stats.json")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    start = time.perf_counter()
    stats = prepare(args.input, args.output_dir, seed=args.seed, build_numgap=True)
    seconds = time.perf_counter() - start

    print(f"documents (non-eval): {stats['documents']}")
    print(f"passages: {stats['passages']}")
    print(
        f"admit >= 1 perturbation: {stats['perturbable']} "
        f"({100 * stats['perturbable_share']:.1f}%; paper: 38.5%)"
    )
    print("category  admits  chosen")
    for category in perturb.CATEGORIES:
        print(f"{category:9s} {stats['admits'][category]:7d} {stats['chosen'][category]:7d}")
    print(f"NumGap eligible anchors: {stats['numgap_eligible_anchors']}")
    for split, counts in stats["numgap"].items():
        path = f"{args.output_dir}/numgap_{split}.jsonl"
        records = corpus.load_jsonl(path)
        lengths = {
            field: statistics.median(len(record[field]) for record in records) if records else 0
            for field in ("anchor", "perturbed", "distractor")
        }
        print(f"NumGap {split}: {sum(counts.values())} records {counts}; median chars {lengths}")
    print(f"wall time: {seconds:.1f} s")


if __name__ == "__main__":
    main()
