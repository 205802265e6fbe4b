"""Paired comparison of two models on the same queries: is a difference in a mean metric real?

FinanceBench has 150 questions, so a difference of a few thousandths in nDCG@10 between two
models can be one question ranked differently. `paired_comparison` takes the per-query values of
both models (`retrieval.per_query_metrics`, saved by `caliber_jax.evaluate` under
`results["per_query"][task]`) and reports the mean difference with

- a paired bootstrap confidence interval (queries resampled with replacement, percentile
  interval; `scipy.stats.bootstrap`), and
- a two-sided paired randomization test (each query's difference flips sign under the null of
  exchangeable models, Fisher's test that Smucker et al. 2007 recommend for IR;
  `scipy.stats.permutation_test`, exact when 2^n <= resamples),

plus the queries won, lost and tied. `paired_tables` gives a study report's tables: every model
against the teacher, its untrained start, LEAF and its first seed (`comparison_pairs`), for
nDCG@10, NumGap-D and NumGap-M; `seed_means` adds each model trained on several seeds as its
mean over them, so the report also compares the methods seed-averaged.
"""

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from caliber_jax.eval import PER_QUERY

# The paired tables of a study report: (task, metric) of each.
PAIRED = (("financebench", "ndcg_at_10"), ("numgap", "D"), ("numgap", "M"))


def paired_differences(
    a: Mapping[str, float], b: Mapping[str, float], *, name_a: str = "a", name_b: str = "b"
) -> np.ndarray:
    """`a[q] - b[q]` for every query, in sorted query order; both must score the same queries."""
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if only_a or only_b:
        raise ValueError(
            f"{name_a} and {name_b} scored different queries: {len(only_a)} only in {name_a} "
            f"(e.g. {only_a[:3]}), {len(only_b)} only in {name_b} (e.g. {only_b[:3]})"
        )
    if not a:
        raise ValueError(f"{name_a} and {name_b} have no query to compare")
    queries = sorted(a)
    return np.array([a[q] for q in queries], np.float64) - np.array([b[q] for q in queries])


def paired_comparison(
    a: Mapping[str, float],
    b: Mapping[str, float],
    *,
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
    name_a: str = "a",
    name_b: str = "b",
) -> dict[str, float]:
    """Mean of `a - b` over the shared queries, its bootstrap interval and randomization p-value.

    Args:
      a, b: query id -> metric value of the two models (the same query ids).
      resamples: bootstrap resamples and randomization permutations.
      confidence: level of the interval.
      seed: seeds both procedures (the same inputs give the same numbers).
      name_a, name_b: names for error messages.

    Returns:
      {"n", "mean_a", "mean_b", "diff", "ci_low", "ci_high", "p_value", "wins", "losses",
      "ties"}: wins are queries where a > b.
    """
    diffs = paired_differences(a, b, name_a=name_a, name_b=name_b)
    queries = sorted(a)
    mean_a = float(np.mean([a[q] for q in queries]))
    mean_b = float(np.mean([b[q] for q in queries]))
    if np.all(diffs == diffs[0]):  # no spread: resampling cannot move the mean
        low = high = float(diffs[0])
        p_value = 1.0 if diffs[0] == 0 else 2.0 ** (1 - len(diffs))
    else:
        interval = stats.bootstrap(
            (diffs,),
            np.mean,
            n_resamples=resamples,
            confidence_level=confidence,
            method="percentile",
            rng=np.random.default_rng(seed),
        ).confidence_interval
        low, high = float(interval.low), float(interval.high)
        p_value = float(
            stats.permutation_test(
                (diffs,),
                np.mean,
                permutation_type="samples",
                n_resamples=resamples,
                alternative="two-sided",
                rng=np.random.default_rng(seed),
            ).pvalue
        )
    return {
        "n": len(diffs),
        "mean_a": mean_a,
        "mean_b": mean_b,
        "diff": float(np.mean(diffs)),
        "ci_low": low,
        "ci_high": high,
        "p_value": p_value,
        "wins": int(np.sum(diffs > 0)),
        "losses": int(np.sum(diffs < 0)),
        "ties": int(np.sum(diffs == 0)),
    }


def per_query_values(result: Mapping[str, Any], task: str, metric: str) -> dict[str, float]:
    """One model's per-query `metric` of `task` from a `caliber_jax.evaluate` results dict."""
    label = result.get("label", "the results")
    try:
        values = dict(result[PER_QUERY][task][metric])
    except KeyError:
        raise ValueError(
            f"{label} has no per-query {metric} for {task!r} (evaluate it again: per-query values "
            "are saved since the paired comparisons were added)"
        ) from None
    except (TypeError, ValueError):  # a results file edited or written by another tool
        raise ValueError(f"{label}: {PER_QUERY}.{task}.{metric} is not an object of "
                         f"query id -> value") from None  # fmt: skip
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values.values()):
        raise ValueError(f"{label}: {PER_QUERY}.{task}.{metric} holds a value that is not a number")
    return values


@functools.lru_cache(maxsize=4096)
def _comparison(
    a: tuple[tuple[str, float], ...],
    b: tuple[tuple[str, float], ...],
    resamples: int,
    seed: int,
    name_a: str,
    name_b: str,
) -> dict[str, float]:
    """`paired_comparison`, remembered: a study report redraws every table after each stage, and
    most of its pairs have not changed since the last one."""
    return paired_comparison(
        dict(a), dict(b), resamples=resamples, seed=seed, name_a=name_a, name_b=name_b
    )


def compare_results(
    results: Mapping[str, Mapping[str, Any]],
    pairs: Sequence[tuple[str, str]],
    *,
    task: str = "financebench",
    metric: str = "ndcg_at_10",
    resamples: int = 10_000,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """`paired_comparison` of each (label a, label b) in `pairs`, from results keyed by label."""
    rows = []
    for label_a, label_b in pairs:
        a, b = (
            tuple(sorted(per_query_values(results[label], task, metric).items()))
            for label in (label_a, label_b)
        )
        comparison = _comparison(a, b, resamples, seed, label_a, label_b)
        rows.append({"a": label_a, "b": label_b, **comparison})
    return rows


def format_comparisons(rows: Sequence[Mapping[str, Any]], *, metric: str, task: str) -> str:
    """Markdown table of `compare_results` rows."""
    header = (
        f"| a | b | {metric} a | {metric} b | a - b | 95% CI | p | a wins / loses / ties |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r['a']} | {r['b']} | {r['mean_a']:.4f} | {r['mean_b']:.4f} | {r['diff']:+.4f} | "
        f"[{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] | {r['p_value']:.3g} | "
        f"{r['wins']} / {r['losses']} / {r['ties']} |"
        for r in rows
    ]
    n = rows[0]["n"] if rows else 0
    title = (
        f"## Paired comparisons, {task} {metric} (n = {n}; paired bootstrap interval, "
        "two-sided randomization test)\n\n"
    )
    return title + header + "\n".join(lines) + "\n"


# A label's seed: "s1", or "s0+s1" for the mean over those seeds (`seed_means`).
_SEED = re.compile(r"s\d+(\+s\d+)*")


def _parts(label: str) -> tuple[str, str, str]:
    """'Caliber lp long s1' -> ('Caliber', 'lp long', 's1'); 'Teacher' -> ('Teacher', '', '');
    'LEAF lp long s0+s1' -> ('LEAF', 'lp long', 's0+s1')."""
    objective, *rest = label.split(" ")
    seed = rest.pop() if rest and _SEED.fullmatch(rest[-1]) else ""
    return objective, " ".join(rest), seed


def _mean_tree(trees: Sequence[Any]) -> Any:
    """The element-wise mean of results trees: numbers averaged, mappings recursed on the keys
    every tree has; anything else (lists, strings) is None and left out."""
    if all(isinstance(tree, Mapping) for tree in trees):
        keys = [key for key in trees[0] if all(key in tree for tree in trees[1:])]
        means = {key: _mean_tree([tree[key] for tree in trees]) for key in keys}
        return {key: value for key, value in means.items() if value is not None}
    if all(isinstance(x, int | float) and not isinstance(x, bool) for x in trees):
        return float(np.mean(trees))
    return None


def seed_means(results: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every model trained on two or more seeds as one more model, '<objective> <variant>
    s0+s1', whose metrics and per-query values are the mean over its seeds.

    A method difference smaller than the seed-to-seed spread shows up in one seed's pair and not
    the other's; the paired test of the seed means asks whether it holds on average, per query
    (each question's nDCG@10 averaged over the seeds). Only what every seed has is averaged: a
    query or metric one seed lacks is left out (and a paired test against a model that has it
    then refuses, naming the difference).
    """
    groups: dict[tuple[str, str], list[str]] = {}
    for label in results:
        objective, variant, seed = _parts(label)
        if seed and "+" not in seed:
            groups.setdefault((objective, variant), []).append(label)
    means = {}
    for (objective, variant), labels in groups.items():
        if len(labels) > 1:
            seeds = "+".join(_parts(label)[2] for label in labels)
            name = " ".join(part for part in (objective, variant, seeds) if part)
            means[name] = _mean_tree([results[label] for label in labels])
    return means


def comparison_pairs(labels: Sequence[str]) -> list[tuple[str, str]]:
    """The (a, b) pairs of a study's paired tests, among labels "<objective> [variant] [s<seed>]"
    ("Teacher", "Initial lp s0", "Caliber lp long s1"): every model against the
    Teacher; every trained student against its untrained start (the Initial of the same variant,
    the first seed's when the fitted start is the same for every seed); every other objective
    against LEAF of the same variant and seed; a later seed against the first seed's run of the
    same model (the seed-to-seed noise that a method difference has to exceed). A seed mean
    ("LEAF lp long s0+s1", `seed_means`) pairs like a seed, except with a single seed."""
    present = set(labels)
    parts = {label: _parts(label) for label in labels}
    pairs = []
    for label in labels:
        objective, variant, seed = parts[label]
        if label == "Teacher":
            continue
        if "Teacher" in present:
            pairs.append((label, "Teacher"))
        if objective == "Initial":
            continue
        initials = [other for other in labels if parts[other][:2] == ("Initial", variant)]
        same_seed = [other for other in initials if parts[other][2] == seed]
        if same_seed or initials:
            pairs.append((label, (same_seed or initials)[0]))
        leaf = " ".join(part for part in ("LEAF", variant, seed) if part)
        if objective != "LEAF" and leaf in present:
            pairs.append((label, leaf))
        # A single seed against the first seed's run; a seed mean against no seed of its own.
        first_seed = next((other for other in labels if parts[other][:2] == (objective, variant)
                           and "+" not in parts[other][2]), label)  # fmt: skip
        if "+" not in seed and first_seed != label:
            pairs.append((label, first_seed))
    return pairs


def paired_tables(
    results: Mapping[str, Mapping[str, Any]],
    *,
    resamples: int = 10_000,
    extra: Sequence[tuple[str, str]] = (),
) -> str:
    """Markdown: a table of `comparison_pairs` per (task, metric) of PAIRED, among the models of
    `results` (keyed by label) that kept that task's per-query values, then the `extra` pairs a
    study asks for (where both sides were scored); "" when there is none."""
    tables = []
    for task, metric in PAIRED:
        scored = [label for label, result in results.items()
                  if metric in result.get(PER_QUERY, {}).get(task, {})]  # fmt: skip
        pairs = comparison_pairs(scored)
        pairs += [pair for pair in extra
                  if pair not in pairs and pair[0] in scored and pair[1] in scored]  # fmt: skip
        if pairs:
            rows = compare_results(results, pairs, task=task, metric=metric, resamples=resamples)
            tables.append(format_comparisons(rows, metric=metric, task=task))
    return "".join("\n" + table for table in tables)
