"""scripts/numgap_rules.py: NumGap-D per rule from per-record outcomes, on a hand-made set."""

import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import numgap_rules  # noqa: E402

from caliber_jax.eval import PER_QUERY, numgap  # noqa: E402

RECORDS = [
    {"category": "unit", "anchor": "up 5% in 2019", "perturbed": "up 5 bps in 2019"},
    {"category": "unit", "anchor": "$5 million in 2019", "perturbed": "$5 billion in 2019"},
    {"category": "unit", "anchor": "$7 million in 2019", "perturbed": "$7 billion in 2019"},
    {"category": "polarity", "anchor": "sales rose 5%", "perturbed": "sales fell 5%"},
    # A direction word only the paper's rule admits: a name near a year, no amount.
    {
        "category": "polarity",
        "anchor": "a More Focused Company in 2019",
        "perturbed": "a Less Focused Company in 2019",
    },
]
for index, record in enumerate(RECORDS):
    record["distractor"] = f"another passage {index}"


def results(hits, margins=(0.0,) * 5):
    ids = [numgap.record_id(i, r) for i, r in enumerate(RECORDS)]
    return {PER_QUERY: {"numgap": {"D": dict(zip(ids, hits, strict=True)),
                                   "M": dict(zip(ids, margins, strict=True))}}}  # fmt: skip


def test_per_rule_hand_values():
    table = numgap_rules.per_rule(
        RECORDS, {"A": results([1, 0, 1, 0, 1]), "B": results([0, 1, 1, 1, 0])}
    )
    assert table[("unit", "%->bps")] == {"n": 1, "A": 1.0, "B": 0.0}
    assert table[("unit", "million->billion")] == {"n": 2, "A": 0.5, "B": 1.0}
    assert table[("unit", "all")] == {"n": 3, "A": 2 / 3, "B": 2 / 3}
    assert table[("polarity", "rose/fell")] == {"n": 1, "A": 0.0, "B": 1.0}
    assert table[("polarity", "more/less")] == {"n": 1, "A": 1.0, "B": 0.0}
    # Polarity split by scope: "rose 5%" governs an amount, "More Focused Company" does not.
    assert table[("polarity", numgap_rules.AMOUNT)] == {"n": 1, "A": 0.0, "B": 1.0}
    assert table[("polarity", numgap_rules.NO_AMOUNT)] == {"n": 1, "A": 1.0, "B": 0.0}
    assert table[("polarity", "all")] == {"n": 2, "A": 0.5, "B": 0.5}
    assert table[("overall", "all")] == {"n": 5, "A": 0.6, "B": 0.6}
    assert list(table)[-1] == ("overall", "all")  # categories first, the overall row last
    polarity = [rule for category, rule in table if category == "polarity"]
    assert polarity == ["all", numgap_rules.AMOUNT, numgap_rules.NO_AMOUNT, "more/less",
                        "rose/fell"]  # fmt: skip
    train = Counter({("unit", "%->bps"): 7, ("polarity", "rose/fell"): 3,
                     ("polarity", numgap_rules.AMOUNT): 3})  # fmt: skip
    text = numgap_rules.markdown(table, ["A", "B"], train)
    assert "| unit | %->bps | 1 | 7 | 1.0000 | 0.0000 |" in text
    assert "| polarity | all | 2 | 3 |" in text  # the scope rows are not counted twice
    assert "| overall | all | 5 | 10 |" in text
    # The mean margin per rule instead of the share separated.
    margins = numgap_rules.per_rule(
        RECORDS, {"A": results([1, 0, 1, 0, 1], (0.1, -0.2, 0.3, -0.4, 0.5))}, "M"
    )
    by_rule = {key: row["A"] for key, row in margins.items()}
    assert by_rule[("unit", "million->billion")] == pytest.approx((-0.2 + 0.3) / 2)
    assert by_rule[("unit", "all")] == pytest.approx((0.1 - 0.2 + 0.3) / 3)
    assert by_rule[("polarity", "rose/fell")] == pytest.approx(-0.4)
    assert by_rule[("overall", "all")] == pytest.approx(0.06)
    with pytest.raises(ValueError, match="stat='R'"):
        numgap_rules.per_rule(RECORDS, {"A": results([1, 0, 1, 0, 1])}, "R")
    # Outcomes of other records (or none) are refused rather than mismatched.
    other = results([1, 0, 1, 0, 1])
    other[PER_QUERY]["numgap"]["D"] = {"0:deadbeef": 1}
    with pytest.raises(ValueError, match="C: no per-record NumGap outcomes"):
        numgap_rules.per_rule(RECORDS, {"C": other})


def test_teacher_distances_hand_values(tmp_path):
    """Per rule, the teacher's mean 1 - cos(t x, t pi x) and 1 - cos(t x, t nb) over the
    perturbed training rows, read from the stores (vectors need not be unit length)."""
    from caliber_jax.data import corpus, teacher

    rows = [
        {"text": "Sales were $5 million.", "category": "unit",
         "perturbed": "Sales were $5 billion.", "neighbour": 2},
        {"text": "Margins increased.", "category": "polarity",
         "perturbed": "Margins decreased.", "neighbour": None},
        {"text": "Costs were flat.", "category": None, "perturbed": None, "neighbour": None},
    ]  # fmt: skip
    corpus.save_jsonl(tmp_path / "train.jsonl", rows)
    vectors = {"x": [[2.0, 0.0], [0.0, 1.0], [0.0, 3.0]], "px": [[1.0, 1.0], [0.6, 0.8], [0, 0]]}
    texts = {"x": [row["text"] for row in rows], "px": [row["perturbed"] or "" for row in rows]}
    for name, values in vectors.items():
        path = tmp_path / "teacher_train" / name
        meta = {"teacher": "t", "pooling": "mean", "native_dim": 2,
                "text_hash": teacher.text_hash(texts[name])}  # fmt: skip
        teacher.create_store(path, num_rows=3, dim=2, chunk_rows=3, metadata=meta)
        teacher.write_rows(path, 0, np.asarray(values, dtype=np.float32))
    table = numgap_rules.teacher_distances(tmp_path)
    unit = table[("unit", "million->billion")]
    assert unit["n"] == 1 and unit["pair"] == pytest.approx(1 - 2**-0.5)
    assert unit["neighbour"] == pytest.approx(1.0)  # x (1, 0) against its neighbour (0, 1)
    polarity = table[("polarity", "increased/decreased")]
    assert polarity["pair"] == pytest.approx(0.2) and np.isnan(polarity["neighbour"])
    assert table[("unit", "all")]["n"] == 1 and ("None", "all") not in table
    text = numgap_rules.distances_markdown(table)
    assert "| unit | million->billion | 1 | 0.2929 | 1.0000 |" in text
    # Prepared again with other edits, its stores not yet encoded again: refused, not read.
    rows[0]["perturbed"] = "Sales were $5 thousand."
    corpus.save_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(ValueError, match="text_hash"):
        numgap_rules.teacher_distances(tmp_path)


def test_train_rules_count_polarity_scope_beside_the_rule(tmp_path):
    from caliber_jax.data import corpus

    rows = [{"text": r["anchor"], "perturbed": r["perturbed"], "category": r["category"]}
            for r in RECORDS]  # fmt: skip
    rows.append({"text": "no numbers", "perturbed": None, "category": None})
    corpus.save_jsonl(tmp_path / "train.jsonl", rows)
    counts = numgap_rules.train_rules(tmp_path / "train.jsonl")
    assert counts == Counter({
        ("unit", "%->bps"): 1, ("unit", "million->billion"): 2, ("polarity", "rose/fell"): 1,
        ("polarity", "more/less"): 1, ("polarity", numgap_rules.AMOUNT): 1,
        ("polarity", numgap_rules.NO_AMOUNT): 1,
    })  # fmt: skip


def test_a_user_error_is_one_line(tmp_path):
    """A missing prepared folder: one line naming the file, exit status 2, no traceback."""
    import subprocess

    script = Path(__file__).resolve().parents[1] / "scripts" / "numgap_rules.py"
    done = subprocess.run([sys.executable, str(script), "--teacher_data", str(tmp_path / "none")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: [Errno 2] No such file or directory: '{tmp_path / 'none' / 'train.jsonl'}'"
    ]
