"""Tests for caliber_jax/eval/significance.py and the `caliber_jax.compare` entry point."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from caliber_jax import compare
from caliber_jax.eval import significance

REPO = Path(__file__).resolve().parents[2]


def test_exact_randomization_p_value_on_three_queries():
    # Differences +1, +1, +0.5: of the 8 sign patterns only all-plus and all-minus reach
    # |mean| >= 2.5/3, so the exact two-sided p-value is 2/8.
    a = {"q1": 1.0, "q2": 1.0, "q3": 0.5}
    b = {"q1": 0.0, "q2": 0.0, "q3": 0.0}
    result = significance.paired_comparison(a, b, resamples=1000)
    assert result["p_value"] == pytest.approx(0.25)
    assert result["diff"] == pytest.approx(2.5 / 3)
    assert (result["wins"], result["losses"], result["ties"], result["n"]) == (3, 0, 0, 3)
    # The bootstrap mean of 3 values lies between their min and max.
    assert 0.5 <= result["ci_low"] <= result["diff"] <= result["ci_high"] <= 1.0


def test_identical_and_constant_differences():
    a = {f"q{i}": i / 10 for i in range(10)}
    same = significance.paired_comparison(a, dict(a))
    assert same["diff"] == 0.0 and same["p_value"] == 1.0
    assert (same["ci_low"], same["ci_high"]) == (0.0, 0.0) and same["ties"] == 10
    shifted = significance.paired_comparison({q: v + 0.1 for q, v in a.items()}, a)
    # Every query moves by the same amount: only the two all-same-sign patterns are as extreme.
    assert shifted["p_value"] == pytest.approx(2.0**-9)
    assert shifted["ci_low"] == pytest.approx(0.1) and shifted["ci_high"] == pytest.approx(0.1)


def test_real_difference_is_found_and_noise_is_not():
    rng = np.random.default_rng(1)
    base = rng.uniform(0, 1, 150)
    queries = [f"q{i}" for i in range(150)]
    b = dict(zip(queries, base, strict=True))
    better = dict(zip(queries, base + 0.05 + rng.normal(0, 0.1, 150), strict=True))
    noise = dict(zip(queries, base + rng.normal(0, 0.1, 150), strict=True))
    found = significance.paired_comparison(better, b, resamples=2000)
    assert found["p_value"] < 0.001 and found["ci_low"] > 0
    null = significance.paired_comparison(noise, b, resamples=2000)
    assert null["p_value"] > 0.05 and null["ci_low"] < 0 < null["ci_high"]
    # Deterministic for a seed.
    assert significance.paired_comparison(noise, b, resamples=2000) == null


def test_different_queries_are_refused():
    with pytest.raises(ValueError, match=r"LEAF and Caliber scored different queries: 1 only in"):
        significance.paired_comparison(
            {"q1": 1.0, "q2": 0.0}, {"q1": 1.0}, name_a="LEAF", name_b="Caliber"
        )


def _results_file(path, label, values):
    per_query = {"ndcg_at_10": dict(values)}
    mean = sum(values.values()) / len(values)
    result = {"financebench": {"ndcg_at_10": mean}, "label": label,
              "per_query": {"financebench": per_query}}  # fmt: skip
    path.write_text(json.dumps(result))
    return path


def test_compare_results_table():
    results = {
        "Teacher": {"per_query": {"financebench": {"ndcg_at_10": {"q1": 1.0, "q2": 0.5}}}},
        "LEAF": {"per_query": {"financebench": {"ndcg_at_10": {"q1": 0.5, "q2": 0.5}}}},
        "old": {"financebench": {"ndcg_at_10": 0.5}, "label": "old"},
    }
    rows = significance.compare_results(results, [("LEAF", "Teacher")])
    assert rows[0]["a"] == "LEAF" and rows[0]["diff"] == pytest.approx(-0.25)
    table = significance.format_comparisons(rows, metric="ndcg_at_10", task="financebench")
    assert "| LEAF | Teacher | 0.5000 | 0.7500 | -0.2500 |" in table
    assert "0 / 1 / 1 |" in table and "(n = 2;" in table
    with pytest.raises(ValueError, match="old has no per-query ndcg_at_10 for 'financebench'"):
        significance.compare_results(results, [("old", "LEAF")])


def test_compare_results_remembers_unchanged_pairs():
    """A study redraws its tables after every stage: a pair whose values have not changed is not
    resampled again, and a changed value is."""
    rng = np.random.default_rng(2)
    values = {name: {f"q{i}": float(v) for i, v in enumerate(rng.uniform(0, 1, 60))}
              for name in ("A", "B")}  # fmt: skip
    results = {
        name: {"per_query": {"financebench": {"ndcg_at_10": v}}} for name, v in values.items()
    }
    before = significance._comparison.cache_info()
    first = significance.compare_results(results, [("A", "B")], resamples=500)
    again = significance.compare_results(results, [("A", "B")], resamples=500)
    after = significance._comparison.cache_info()
    assert again == first and (after.hits - before.hits, after.misses - before.misses) == (1, 1)
    values["A"]["q0"] += 1.0
    changed = significance.compare_results(results, [("A", "B")], resamples=500)
    assert changed[0]["diff"] == pytest.approx(first[0]["diff"] + 1.0 / 60)
    assert significance._comparison.cache_info().misses - after.misses == 1
    # The result is the uncached computation's.
    fresh = significance.paired_comparison(values["A"], values["B"], resamples=500)
    assert {k: changed[0][k] for k in fresh} == fresh


def test_compare_cli(tmp_path):
    base = {f"q{i}": (i % 5) / 5 for i in range(40)}
    first = _results_file(tmp_path / "leaf.json", "LEAF", base)
    second = _results_file(tmp_path / "cal.json", "Caliber", {q: v + 0.2 for q, v in base.items()})
    out = tmp_path / "cmp.md"
    done = subprocess.run(
        [sys.executable, "-m", "caliber_jax.compare", str(first), str(second), f"--output={out}",
         "--resamples=500"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "| Caliber | LEAF |" in done.stdout and "+0.2000" in done.stdout
    assert out.read_text() == done.stdout
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    failed = subprocess.run(
        [sys.executable, "-m", "caliber_jax.compare", str(first), str(bad)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert failed.returncode == 2
    assert f"{bad}: not a results JSON" in failed.stderr
    assert "Traceback" not in failed.stderr
    bad.write_text("[1, 2]")  # JSON, but not the object evaluate writes
    with pytest.raises(ValueError, match=rf"{bad}: not a results JSON \(a list"):
        compare.load_results([str(first), str(bad)])


def test_comparison_pairs_of_the_long_study():
    labels = ["Teacher", "LEAF lp long s0", "Caliber lp long s0", "Initial lp long s0",
              "LEAF lp long s1", "Caliber lp long s1"]  # fmt: skip
    assert significance.comparison_pairs(labels) == [
        ("LEAF lp long s0", "Teacher"), ("LEAF lp long s0", "Initial lp long s0"),
        ("Caliber lp long s0", "Teacher"), ("Caliber lp long s0", "Initial lp long s0"),
        ("Caliber lp long s0", "LEAF lp long s0"),
        ("Initial lp long s0", "Teacher"),
        ("LEAF lp long s1", "Teacher"), ("LEAF lp long s1", "Initial lp long s0"),
        ("LEAF lp long s1", "LEAF lp long s0"),
        ("Caliber lp long s1", "Teacher"), ("Caliber lp long s1", "Initial lp long s0"),
        ("Caliber lp long s1", "LEAF lp long s1"), ("Caliber lp long s1", "Caliber lp long s0"),
    ]  # fmt: skip
    # Without a teacher or a start, only the objective and seed pairs remain.
    assert significance.comparison_pairs(["Numeric lp s0", "LEAF lp s0"]) == [
        ("Numeric lp s0", "LEAF lp s0")
    ]
    # The demo's labels: an untrained "Initial" without variant or seed.
    assert significance.comparison_pairs(["Initial", "Teacher", "LEAF s0", "Caliber s0"]) == [
        ("Initial", "Teacher"), ("LEAF s0", "Teacher"), ("LEAF s0", "Initial"),
        ("Caliber s0", "Teacher"), ("Caliber s0", "Initial"), ("Caliber s0", "LEAF s0"),
    ]  # fmt: skip


def test_paired_tables_cover_the_models_with_values():
    values = {"q1": 0.5, "q2": 0.0, "q3": 1.0}
    results = {
        "Teacher": {"per_query": {"financebench": {"ndcg_at_10": values},
                                  "numgap": {"D": {"0:a": 1}, "M": {"0:a": 0.1}}}},
        "LEAF s0": {"per_query": {"financebench": {"ndcg_at_10": {**values, "q2": 1.0}}}},
        "Caliber s0": {"financebench": {"ndcg_at_10": 0.5}},  # evaluated before per-query values
    }  # fmt: skip
    tables = significance.paired_tables(results, resamples=100)
    assert tables.count("## Paired comparisons") == 1  # numgap: a teacher alone pairs with none
    assert "| LEAF s0 | Teacher | 0.8333 | 0.5000 | +0.3333 |" in tables
    assert "Caliber s0" not in tables
    assert significance.paired_tables({"Teacher": results["Teacher"]}) == ""


def test_seed_means_average_metrics_and_queries_and_pair_like_a_seed():
    def run(ndcg, per_query, numgap_d):
        return {
            "financebench": {"ndcg_at_10": ndcg},
            "numgap": {"overall": {"D": numgap_d}},
            "validation": [{"step": 0}],  # a curve is not averaged
            "per_query": {"financebench": {"ndcg_at_10": per_query}},
        }

    results = {
        "Teacher": run(0.6, {"q1": 1.0, "q2": 0.2}, 0.01),
        "Initial lp long s0": run(0.4, {"q1": 0.5, "q2": 0.3}, 0.0),
        "LEAF lp long s0": run(0.5, {"q1": 1.0, "q2": 0.0}, 0.02),
        "Caliber lp long s0": run(0.6, {"q1": 1.0, "q2": 0.2}, 0.04),
        "LEAF lp long s1": run(0.7, {"q1": 0.5, "q2": 0.9}, 0.00),
        "Caliber lp long s1": run(0.8, {"q1": 0.75, "q2": 0.85}, 0.01),
        "LEAF lp long s2": {"financebench": {"ndcg_at_10": 0.9}},  # no per-query values
    }
    means = significance.seed_means(results)
    assert list(means) == ["LEAF lp long s0+s1+s2", "Caliber lp long s0+s1"]
    leaf, caliber = means["LEAF lp long s0+s1+s2"], means["Caliber lp long s0+s1"]
    assert leaf == {"financebench": {"ndcg_at_10": pytest.approx(0.7)}}  # only what all three have
    assert caliber["financebench"]["ndcg_at_10"] == pytest.approx(0.7)
    assert caliber["numgap"]["overall"]["D"] == pytest.approx(0.025)
    assert caliber["per_query"]["financebench"]["ndcg_at_10"] == pytest.approx(
        {"q1": 0.875, "q2": 0.525}
    )
    assert "validation" not in caliber
    assert significance.seed_means({"Teacher": results["Teacher"], **dict([means.popitem()])}) == {}
    # The mean pairs with the teacher, the (shared) start and LEAF's mean, not with its own seeds.
    labels = ["Teacher", "Initial lp long s0", "LEAF lp long s0+s1", "Caliber lp long s0+s1"]
    assert significance.comparison_pairs(labels) == [
        ("Initial lp long s0", "Teacher"),
        ("LEAF lp long s0+s1", "Teacher"), ("LEAF lp long s0+s1", "Initial lp long s0"),
        ("Caliber lp long s0+s1", "Teacher"), ("Caliber lp long s0+s1", "Initial lp long s0"),
        ("Caliber lp long s0+s1", "LEAF lp long s0+s1"),
    ]  # fmt: skip
    two = {label: result for label, result in results.items() if not label.endswith("s2")}
    models = {**two, **significance.seed_means(two)}
    tables = significance.paired_tables(models, resamples=100)
    # Caliber's mean per query (0.875, 0.525) against LEAF's (0.75, 0.45): +0.1 on average.
    assert "| Caliber lp long s0+s1 | LEAF lp long s0+s1 | 0.7000 | 0.6000 | +0.1000 |" in tables
    assert "| Caliber lp long s1 | Caliber lp long s0 |" in tables
    assert "| Caliber lp long s0+s1 | Caliber lp long s0 |" not in tables
    # A pair the study asks for beyond the rule (a model against the plain model users run
    # today), once, and only where both sides were scored.
    plain = {**models, "Initial t384 s0": run(0.45, {"q1": 0.5, "q2": 0.4}, 0.0)}
    extra = [("Caliber lp long s0+s1", "Initial t384 s0"), ("LEAF lp long s2", "Initial t384 s0")]
    tables = significance.paired_tables(plain, resamples=100, extra=extra)
    assert tables.count("| Caliber lp long s0+s1 | Initial t384 s0 | 0.7000 | 0.4500 |") == 1
    assert "| LEAF lp long s2 | Initial t384 s0 |" not in tables  # no per-query values


def test_per_query_values_that_are_not_an_object_of_numbers_are_one_line():
    """A results file written or edited by another tool: a TypeError traceback in `compare`."""
    cases = [([], "is not an object"), ({"financebench": []}, "is not an object"),
             ({"financebench": {"ndcg_at_10": {"q": "1"}}}, "holds a value")]  # fmt: skip
    for per_query, message in cases:
        with pytest.raises(ValueError, match=f"x: per_query.financebench.ndcg_at_10 {message}"):
            significance.per_query_values({"label": "x", "per_query": per_query},
                                          "financebench", "ndcg_at_10")  # fmt: skip
    good = {"label": "x", "per_query": {"financebench": {"ndcg_at_10": {"q": 0.5, "r": 1}}}}
    assert significance.per_query_values(good, "financebench", "ndcg_at_10") == {"q": 0.5, "r": 1}
