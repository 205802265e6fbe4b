"""NumGap-D per perturbation rule within each category, from recorded per-record results.

    python scripts/numgap_rules.py --numgap docs/study_mpnet_long/data/numgap_test.jsonl \
        --results docs/study_mpnet_long/results/*/numgap.json --output docs/numgap_rules.md

Each NumGap record's rule (`perturb.edit_rule`: each scale swap, %/bps, percent/basis points, each
direction-word pair, x10 or /10, ...) is read off its anchor and perturbed text; each results file
(`caliber_jax.evaluate --tasks numgap`, saved with per-record outcomes) gives its hit per record.
Nothing is encoded: a file scored on other records (ids differ) is refused. `--train` adds the
rule counts of a prepared passages file (the training perturbations) as a column.
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from caliber_jax.data import corpus, perturb  # noqa: E402
from caliber_jax.eval import PER_QUERY, numgap  # noqa: E402


def record_rules(records: list[dict]) -> list[tuple[str, str]]:
    """(category, rule) of each NumGap record."""
    return [
        (r["category"], perturb.edit_rule(r["anchor"], r["perturbed"], r["category"]))
        for r in records
    ]


def train_rules(path: Path) -> Counter:
    """(category, rule) counts of a prepared passages file's perturbations."""
    counts: Counter = Counter()
    for record in corpus.load_jsonl(path):
        if record.get("perturbed"):
            category = record["category"]
            rule = perturb.edit_rule(record["text"], record["perturbed"], category)
            counts[(category, rule)] += 1
    return counts


def per_rule(records: list[dict], results: dict[str, dict]) -> dict[tuple[str, str], dict]:
    """{(category, rule): {"n": count, label: D}} over every model of `results` (label ->
    loaded results file), plus each category's and the overall rows (rule "all")."""
    rules = record_rules(records)
    ids = [numgap.record_id(index, r) for index, r in enumerate(records)]
    table: dict[tuple[str, str], dict] = {}
    groups: dict[tuple[str, str], list[int]] = {("overall", "all"): list(range(len(records)))}
    for index, (category, rule) in enumerate(rules):
        groups.setdefault((category, "all"), []).append(index)
        groups.setdefault((category, rule), []).append(index)
    for key in sorted(groups, key=lambda k: (k[0] == "overall", k[0], k[1] != "all", k[1])):
        table[key] = {"n": len(groups[key])}
    for label, loaded in results.items():
        hits = loaded.get(PER_QUERY, {}).get("numgap", {}).get("D")
        if hits is None or set(hits) != set(ids):
            raise ValueError(f"{label}: no per-record NumGap outcomes for these records")
        for key, rows in groups.items():
            table[key][label] = sum(hits[ids[row]] for row in rows) / len(rows)
    return table


def markdown(table: dict, labels: list[str], train: Counter | None = None) -> str:
    head = ["category", "rule", "n", *(["train pairs"] if train is not None else []), *labels]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for (category, rule), row in table.items():
        cells = [category, rule, str(row["n"])]
        if train is not None:
            if rule == "all":
                count = sum(n for (c, _), n in train.items() if category in ("overall", c))
            else:
                count = train.get((category, rule), 0)
            cells.append(str(count))
        cells += [f"{row[label]:.4f}" for label in labels]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--numgap", required=True, help="the NumGap file the results scored")
    parser.add_argument("--results", nargs="+", required=True, help="results JSON files")
    parser.add_argument("--train", default=None, help="prepared train.jsonl: rule counts")
    parser.add_argument("--output", default=None, help="also write the markdown table here")
    args = parser.parse_args()
    records = numgap.load_numgap(args.numgap)
    results = {}
    for path in args.results:
        loaded = json.loads(Path(path).read_text())
        results[loaded.get("label") or Path(path).parent.name] = loaded
    table = per_rule(records, results)
    train = train_rules(Path(args.train)) if args.train else None
    text = markdown(table, list(results), train)
    if args.output:
        output = Path(args.output)
        partial = output.with_name(output.name + ".partial")
        partial.write_text(text)
        partial.replace(output)  # atomic: a reader never sees half a table
    print(text)


if __name__ == "__main__":
    main()
