"""Tests for caliber_jax/eval/numgap.py on 2-D vectors with known cosines."""

import json

import numpy as np
import pytest

from caliber_jax.eval import numgap

# anchor, perturbation, distractor; s_p = cos(anchor, pert), s_d = cos(anchor, dist)
TRIPLES = [
    ([1, 0], [0.6, 0.8], [0.8, 0.6]),  # s_p = .6, s_d = .8  -> counted, s_d - s_p = .2
    ([0, 1], [0, 1], [0.6, 0.8]),  # s_p = 1,  s_d = .8  -> not counted, -.2
    ([1, 0], [-1, 0], [0, 1]),  # s_p = -1, s_d = 0   -> counted, 1
    ([1, 0], [0, 1], [0, -1]),  # s_p = 0,  s_d = 0   -> tie, not counted (strict), 0
]


def _arrays(triples):
    return [np.array([t[i] for t in triples], np.float32) for i in range(3)]


def test_scores_hand_values():
    d, m = numgap.numgap_scores(*_arrays(TRIPLES))
    assert d == 2 / 4
    assert m == pytest.approx((0.2 - 0.2 + 1 + 0) / 4, abs=1e-7)
    d, m = numgap.numgap_scores(*_arrays(TRIPLES[:3]))
    assert d == pytest.approx(2 / 3)
    assert m == pytest.approx(1 / 3, abs=1e-7)


def test_scores_divide_by_norms():
    anchor, pert, dist = _arrays(TRIPLES)
    assert numgap.numgap_scores(3 * anchor, pert, 0.5 * dist) == pytest.approx(
        numgap.numgap_scores(anchor, pert, dist)
    )


def test_scores_shape_errors():
    anchor, pert, dist = _arrays(TRIPLES)
    with pytest.raises(ValueError, match="three"):
        numgap.numgap_scores(anchor, pert[:2], dist)
    with pytest.raises(ValueError, match="at least one"):
        numgap.numgap_scores(anchor[:0], pert[:0], dist[:0])


def _records():
    names = [("a1", "p1", "x1"), ("a2", "p2", "x2"), ("a1", "p3", "x3"), ("a1", "p4", "x4")]
    categories = ["magnitude", "unit", "magnitude", "polarity"]
    table = {}
    records = []
    for (anchor, pert, dist), triple, category in zip(names, TRIPLES, categories, strict=True):
        for name, vector in zip((anchor, pert, dist), triple, strict=True):
            table[name] = np.array(vector, np.float32)
        records.append(
            {"category": category, "anchor": anchor, "perturbed": pert, "distractor": dist}
        )
    return records, table


def test_evaluate_overall_and_per_category():
    records, table = _records()
    calls = []

    def encode_fn(texts):
        calls.append(list(texts))
        return np.stack([table[t] for t in texts])

    results = numgap.evaluate(encode_fn, records)
    assert len(calls) == 1
    assert sorted(calls[0]) == sorted(set(calls[0])) == sorted(table)  # "a1" encoded once
    assert list(results) == ["overall", "magnitude", "polarity", "unit"]
    assert results["overall"]["D"] == 0.5 and results["overall"]["n"] == 4
    assert results["overall"]["M"] == pytest.approx(0.25, abs=1e-7)
    # magnitude = records 1 and 3: both counted, margins .2 and 1.
    assert results["magnitude"] == pytest.approx({"D": 1.0, "M": 0.6, "n": 2})
    assert results["unit"] == pytest.approx({"D": 0.0, "M": -0.2, "n": 1})
    assert results["polarity"] == pytest.approx({"D": 0.0, "M": 0.0, "n": 1})


def test_load_numgap_round_trip_and_errors(tmp_path):
    records, _ = _records()
    path = tmp_path / "numgap.jsonl"
    path.write_text("\n".join(json.dumps({**r, "source": "edgar"}) for r in records) + "\n\n")
    loaded = numgap.load_numgap(path)
    assert [{k: r[k] for k in numgap.FIELDS} for r in loaded] == records
    assert loaded[0]["source"] == "edgar"

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(records[0]) + "\n" + json.dumps({**records[1], "perturbed": ""}))
    with pytest.raises(ValueError, match=f"{bad}:2: field 'perturbed'"):
        numgap.load_numgap(bad)
    bad.write_text(json.dumps(records[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=f"{bad}:2: malformed JSON"):
        numgap.load_numgap(bad)
    bad.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=f"{bad}:1: expected a JSON object"):
        numgap.load_numgap(bad)


def test_evaluate_per_record_outcomes_average_to_the_scores():
    records, table = _records()
    results = numgap.evaluate(lambda texts: np.stack([table[t] for t in texts]), records,
                              per_record=True)  # fmt: skip
    per_record = results.pop("per_query")
    assert list(results) == ["overall", "magnitude", "polarity", "unit"]
    ids = [numgap.record_id(index, record) for index, record in enumerate(records)]
    assert list(per_record["D"]) == list(per_record["M"]) == ids
    assert all(i.startswith(f"{n}:") for n, i in enumerate(ids))
    # The hand values of the test above, record by record: records 1 and 3 (magnitude) count.
    assert [per_record["D"][i] for i in ids] == [1, 0, 1, 0]
    assert np.mean(list(per_record["M"].values())) == pytest.approx(results["overall"]["M"])
    # The same position with other texts gets another id: files that differ do not pair up.
    other = dict(records[0], perturbed=records[0]["perturbed"] + " (restated)")
    assert numgap.record_id(0, other) != ids[0]
