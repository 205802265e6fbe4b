"""A NumGap set of one category with every rule equally represented, from a prepared folder's
held-out filings: the per-rule, per-direction readout that the paper-sized sets give
too few records for (9 to 35 per scale swap).

    python scripts/numgap_per_rule.py --data runs/headline/data --category unit --scales all \
        --per_rule 40 --exclude records/study_mpnet_long/data/numgap_test.jsonl \
        --output runs/numgap_scales/numgap_unit_dev.jsonl

The anchors come from the held-out documents that the folder's `stats.json` names (those NumGap
is built from; never training passages), minus every anchor of the `--exclude` files (the
recorded test set: this is a dev set); `numgap.build_per_rule` draws up to `--per_rule` records
per rule (`perturb.edit_rule`) under `--scales` and `--polarity_scope`. Score it with
`python -m caliber_jax.evaluate --model DIR --output RESULTS.json --tasks numgap --numgap
<output>` and read it per rule with
`scripts/numgap_rules.py`.
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from caliber_jax import cli  # noqa: E402
from caliber_jax.data import corpus, numgap, perturb  # noqa: E402


def heldout_passages(data: Path) -> list[dict]:
    """The passages of `data`/passages.jsonl whose document `data`/stats.json holds out."""
    stats = json.loads((data / "stats.json").read_text())
    heldout = set(stats.get("heldout_documents") or [])
    if not heldout:
        raise SystemExit(f"{data / 'stats.json'}: no heldout_documents (prepare with "
                         "prepare.heldout_fraction > 0)")  # fmt: skip
    return [p for p in corpus.load_jsonl(data / "passages.jsonl") if p["doc_name"] in heldout]


def build(data: Path, *, category: str, per_rule: int, rules, seed: int,
          exclude: list[str]) -> list[dict]:  # fmt: skip
    """`numgap.build_per_rule` over `data`'s held-out passages, minus the anchors of the NumGap
    files `exclude`."""
    excluded = [r["anchor"] for path in exclude for r in numgap.load_numgap(path)]
    return numgap.build_per_rule(heldout_passages(data), category=category, per_rule=per_rule,
                                 rules=rules, seed=seed, exclude=excluded)  # fmt: skip


def rule_counts(records: list[dict]) -> str:
    """ "rule n, rule n, ..." of `records`, sorted by rule."""
    counts = Counter(perturb.edit_rule(r["anchor"], r["perturbed"], r["category"]) for r in records)
    return ", ".join(f"{rule} {n}" for rule, n in sorted(counts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a prepared folder (passages, stats)")
    parser.add_argument("--category", default="unit", choices=perturb.CATEGORIES)
    parser.add_argument("--scales", default="all", choices=perturb.SCALE_SETS)
    parser.add_argument("--polarity_scope", default="paper", choices=perturb.POLARITY_SCOPES)
    parser.add_argument("--per_rule", type=int, default=40, help="records per rule, at most")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exclude", nargs="*", default=[], help="NumGap files whose anchors "
                        "are left out (the recorded test set)")  # fmt: skip
    parser.add_argument("--output", required=True, help="the NumGap JSONL to write")
    args = parser.parse_args()
    records = build(
        Path(args.data),
        category=args.category,
        per_rule=args.per_rule,
        rules=perturb.Rules(polarity_scope=args.polarity_scope, scales=args.scales),
        seed=args.seed,
        exclude=args.exclude,
    )
    corpus.save_jsonl(args.output, records)
    print(f"{args.output}: {len(records)} records; {rule_counts(records)}")


if __name__ == "__main__":
    cli.run_script(main)  # a user error: one line naming the file or label, exit status 2
