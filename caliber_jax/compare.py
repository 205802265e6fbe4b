"""Entry point: paired significance of metric differences between evaluated models.

    python -m caliber_jax.compare runs/leaf/results.json runs/caliber/results.json \\
        [more results.json ...] [--task financebench] [--metric ndcg_at_10] [--output cmp.md]
    python -m caliber_jax.compare leaf.json caliber.json --task numgap --metric D   # or M

Each results file is one `caliber_jax.evaluate` output (which saves per-query values). Every file
after the first is compared with the first, query by query (both must have scored the same
queries: an error names the ones only one scored): mean difference (later minus first), paired
bootstrap 95% interval, two-sided randomization p-value, and queries won / lost / tied
(`caliber_jax.eval.significance`). Prints a Markdown table; `--output` also writes it.
"""

import json
from collections.abc import Sequence
from pathlib import Path

from absl import flags

from caliber_jax import cli, paths
from caliber_jax.eval import significance


def load_results(files: Sequence[str]) -> dict[str, dict]:
    """Results dicts keyed by label (the file's `label`, else its path), labels made unique."""
    results: dict[str, dict] = {}
    for path in files:
        try:
            result = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not a results JSON ({error})") from None
        if not isinstance(result, dict):
            raise ValueError(f"{path}: not a results JSON (a {type(result).__name__}, not an "
                             f"object as caliber_jax.evaluate writes)")  # fmt: skip
        label = str(result.get("label") or path)
        if label in results:
            label = f"{label} ({path})"
        results[label] = {**result, "label": label}
    return results


def compare_files(
    files: Sequence[str], *, task: str, metric: str, resamples: int, seed: int
) -> tuple[list[dict], str]:
    """Rows of `significance.compare_results` (each later file vs the first) and their table."""
    if len(files) < 2:
        raise ValueError(f"give at least two results files to compare, got {len(files)}")
    results = load_results(files)
    labels = list(results)
    pairs = [(label, labels[0]) for label in labels[1:]]
    rows = significance.compare_results(
        results, pairs, task=task, metric=metric, resamples=resamples, seed=seed
    )
    return rows, significance.format_comparisons(rows, metric=metric, task=task)


def main(argv: Sequence[str]) -> None:
    values = flags.FLAGS
    _, table = compare_files(
        argv[1:],
        task=values.task,
        metric=values.metric,
        resamples=values.resamples,
        seed=values.seed,
    )
    print(table, end="")
    if values.output:
        paths.write_text_whole(values.output, table)


if __name__ == "__main__":
    flags.DEFINE_string("task", "financebench", "Task whose per-query values are compared "
                        "(financebench, bm25, numgap).")  # fmt: skip
    flags.DEFINE_string("metric", "ndcg_at_10", "Metric, e.g. ndcg_at_10, recall_at_100; "
                        "numgap: D or M.")  # fmt: skip
    flags.DEFINE_integer("resamples", 10_000, "Bootstrap resamples and randomization draws.")
    flags.DEFINE_integer("seed", 0, "Seed of both procedures.")
    flags.DEFINE_string("output", None, "Also write the Markdown table here.")
    cli.run(main)
