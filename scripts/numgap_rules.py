"""NumGap-D per perturbation rule within each category, from recorded per-record results.

    python scripts/numgap_rules.py --numgap records/study_mpnet_long/data/numgap_test.jsonl \
        --results records/study_mpnet_long/results/*/numgap.json --output docs/numgap_rules.md

`--stat M` gives the mean margin M = cos(x, d) - cos(x, pi x) per rule instead of the share
separated: where D is 0, whether a rule is near separating or where distillation left it.

Each NumGap record's rule (`perturb.edit_rule`: each scale swap, %/bps, percent/basis points, each
direction-word pair, x10 or /10, ...) is read off its anchor and perturbed text; each results file
(`caliber_jax.evaluate --tasks numgap`, saved with per-record outcomes) gives its hit per record.
Nothing is encoded: a file scored on other records (ids differ) is refused. `--train` adds the
rule counts of a prepared passages file (the training perturbations) as a column.

    python scripts/numgap_rules.py --teacher_data runs/headline/data

prints, per rule of a prepared folder's training perturbations, how far the teacher itself moves
a passage under the edit (1 - cos(t x, t pi x)) and how far its BM25 neighbour is
(1 - cos(t x, t nb)), from the teacher stores `embed_teacher` wrote: whether a rule that does not
separate is one the teacher barely registers.
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from caliber_jax import cli  # noqa: E402
from caliber_jax.data import corpus, perturb, teacher  # noqa: E402
from caliber_jax.eval import PER_QUERY, numgap  # noqa: E402

# The two rows that split polarity by scope: a flipped direction word that governs an amount
# ("rose 5%", "less than 6.0%": `perturb`'s "quantity" scope) or one the paper's rule alone admits
# (any number within 50 characters: "a More Focused Company", "Less: Promotional allowances").
AMOUNT, NO_AMOUNT = "- governs an amount", "- no amount (paper rule only)"


def record_rules(records: list[dict]) -> list[tuple[str, str]]:
    """(category, rule) of each NumGap record."""
    return [
        (r["category"], perturb.edit_rule(r["anchor"], r["perturbed"], r["category"]))
        for r in records
    ]


def polarity_scope(text: str, perturbed: str) -> str:
    """AMOUNT when the quantity scope admits the edit `text` -> `perturbed` (a sign flip
    included), else NO_AMOUNT."""
    edits = perturb.candidate_edits(
        text, "polarity", rules=perturb.Rules(polarity_scope="quantity")
    )
    return AMOUNT if any(p == perturbed for _, p in edits) else NO_AMOUNT


def train_rules(path: Path) -> Counter:
    """(category, rule) counts of a prepared passages file's perturbations."""
    counts: Counter = Counter()
    for record in corpus.load_jsonl(path):
        if record.get("perturbed"):
            category = record["category"]
            rule = perturb.edit_rule(record["text"], record["perturbed"], category)
            counts[(category, rule)] += 1
            if category == "polarity":
                counts[(category, polarity_scope(record["text"], record["perturbed"]))] += 1
    return counts


def teacher_distances(data: Path) -> dict[tuple[str, str], dict[str, float]]:
    """{(category, rule): {"n", "pair", "neighbour"}} over a prepared folder's perturbed training
    passages: the mean 1 - cos(t x, t pi x) and 1 - cos(t x, t nb) of the teacher's stored
    vectors (rows without a neighbour count for "pair" only), plus each category's "all" row."""
    rows = list(corpus.load_jsonl(data / "train.jsonl"))
    # The stores of these very texts (a folder prepared again keeps the old ones until
    # embed_teacher runs): the text hash is checked as training checks it.
    texts = {"x": [row["text"] for row in rows],
             "px": [row.get("perturbed") or "" for row in rows]}  # fmt: skip
    stores = {name: teacher.open_reader(data / "teacher_train" / name, expect_rows=len(rows),
                                        expect_dim=_store_dim(data / "teacher_train" / name),
                                        expect_hash=teacher.text_hash(texts[name]))
              for name in ("x", "px")}  # fmt: skip
    perturbed = [i for i, row in enumerate(rows) if row.get("perturbed")]
    x, px = (_unit(stores[name][perturbed]) for name in ("x", "px"))
    pair = 1.0 - np.sum(x * px, axis=1)
    with_nb = [k for k, i in enumerate(perturbed) if rows[i].get("neighbour") is not None]
    nb = _unit(stores["x"][[rows[perturbed[k]]["neighbour"] for k in with_nb]])
    neighbour = dict(zip(with_nb, 1.0 - np.sum(x[with_nb] * nb, axis=1), strict=True))
    groups: dict[tuple[str, str], list[int]] = {}
    for k, i in enumerate(perturbed):
        category = rows[i]["category"]
        rule = perturb.edit_rule(rows[i]["text"], rows[i]["perturbed"], category)
        groups.setdefault((category, "all"), []).append(k)
        groups.setdefault((category, rule), []).append(k)
    table = {}
    for key in sorted(groups, key=lambda k: (k[0], k[1] != "all", k[1])):
        ks = groups[key]
        nbs = [neighbour[k] for k in ks if k in neighbour]
        table[key] = {"n": len(ks), "pair": float(np.mean(pair[ks])),
                      "neighbour": float(np.mean(nbs)) if nbs else float("nan")}  # fmt: skip
    return table


def _store_dim(path: Path) -> int:
    return int(json.loads((path / "metadata.json").read_text())["dim"])


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def distances_markdown(table: dict, min_pairs: int = 1) -> str:
    lines = ["| category | rule | train pairs | teacher 1 - cos(t x, t pi x) | "
             "teacher 1 - cos(t x, t nb) |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for (category, rule), row in table.items():
        if rule == "all" or row["n"] >= min_pairs:
            lines.append(f"| {category} | {rule} | {row['n']} | {row['pair']:.4f} | "
                         f"{row['neighbour']:.4f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def per_rule(
    records: list[dict], results: dict[str, dict], stat: str = "D"
) -> dict[tuple[str, str], dict]:
    """{(category, rule): {"n": count, label: mean}} over every model of `results` (label ->
    loaded results file), plus each category's and the overall rows (rule "all"): the mean of
    `stat` over the rule's records, "D" (the share separated) or "M" (the mean margin
    cos(x, d) - cos(x, pi x): how far from separating a rule that scores D 0 is)."""
    if stat not in ("D", "M"):
        raise ValueError(f"stat={stat!r}: NumGap's per-record outcomes are 'D' and 'M'")
    rules = record_rules(records)
    ids = [numgap.record_id(index, r) for index, r in enumerate(records)]
    table: dict[tuple[str, str], dict] = {}
    groups: dict[tuple[str, str], list[int]] = {("overall", "all"): list(range(len(records)))}
    for index, (category, rule) in enumerate(rules):
        groups.setdefault((category, "all"), []).append(index)
        groups.setdefault((category, rule), []).append(index)
        if category == "polarity":
            scope = polarity_scope(records[index]["anchor"], records[index]["perturbed"])
            groups.setdefault((category, scope), []).append(index)
    for key in sorted(groups, key=_row_order):
        table[key] = {"n": len(groups[key])}
    for label, loaded in results.items():
        hits = loaded.get(PER_QUERY, {}).get("numgap", {}).get(stat)
        if hits is None or set(hits) != set(ids):
            raise ValueError(f"{label}: no per-record NumGap outcomes for these records (scored "
                             f"on another NumGap file than --numgap?)")  # fmt: skip
        for key, rows in groups.items():
            table[key][label] = sum(hits[ids[row]] for row in rows) / len(rows)
    return table


def _row_order(key: tuple[str, str]) -> tuple:
    """Categories in name order, the overall row last; in each, "all", the scope rows, then the
    rules by name."""
    category, rule = key
    return (category == "overall", category, 0 if rule == "all" else 1 if rule in (
        AMOUNT, NO_AMOUNT) else 2, rule)  # fmt: skip


def markdown(table: dict, labels: list[str], train: Counter | None = None) -> str:
    head = ["category", "rule", "n", *(["train pairs"] if train is not None else []), *labels]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for (category, rule), row in table.items():
        cells = [category, rule, str(row["n"])]
        if train is not None:
            if rule == "all":
                scopes = (AMOUNT, NO_AMOUNT)
                count = sum(n for (c, r), n in train.items()
                            if category in ("overall", c) and r not in scopes)  # fmt: skip
            else:
                count = train.get((category, rule), 0)
            cells.append(str(count))
        cells += [f"{row[label]:.4f}" for label in labels]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--numgap", help="the NumGap file the results scored")
    parser.add_argument("--results", nargs="+", help="results JSON files")
    parser.add_argument(
        "--teacher_data",
        default=None,
        help="a prepared folder with teacher "
        "stores: print the teacher's distances per training rule instead",
    )
    parser.add_argument("--min_pairs", type=int, default=20, help="(--teacher_data) smallest "
                        "rule shown")  # fmt: skip
    parser.add_argument("--train", default=None, help="prepared train.jsonl: rule counts")
    parser.add_argument("--output", default=None, help="also write the markdown table here")
    parser.add_argument("--stat", choices=("D", "M"), default="D",
                        help="per rule: the share separated (D) or the mean margin "
                        "cos(x, d) - cos(x, pi x) (M)")  # fmt: skip
    args = parser.parse_args()
    if args.teacher_data:
        print(distances_markdown(teacher_distances(Path(args.teacher_data)), args.min_pairs))
        return
    if not args.numgap or not args.results:
        parser.error("--numgap and --results are required (or --teacher_data)")
    records = numgap.load_numgap(args.numgap)
    results = {}
    for path in args.results:
        loaded = json.loads(Path(path).read_text())
        results[loaded.get("label") or Path(path).parent.name] = loaded
    table = per_rule(records, results, args.stat)
    train = train_rules(Path(args.train)) if args.train else None
    text = markdown(table, list(results), train)
    if args.output:
        output = Path(args.output)
        partial = output.with_name(output.name + ".partial")
        partial.write_text(text)
        partial.replace(output)  # atomic: a reader never sees half a table
    print(text)


if __name__ == "__main__":
    cli.run_script(main)  # a user error: one line naming the file or label, exit status 2
