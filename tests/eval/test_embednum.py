"""Tests for caliber_jax/eval/embednum.py: formats, comparison templates, accuracy."""

import math
import random
import re

import numpy as np
import pytest

from caliber_jax.eval import embednum

# The numbers of Table 1 in the paper, written in each format.
TABLE_1 = {
    "orig": (235, "235"),
    "a1": (8, "8"),
    "a2": (77, "77"),
    "a3": (719, "719"),
    "a4": (3035, "3035"),
    "b1": (83, "8.3"),
    "b2": (867, "8.67"),
    "b3": (8868, "8.868"),
    "b4": (87713, "8.7713"),
    "c1": (8, "0.8"),
    "c2": (8, "0.08"),
    "c3": (8, "0.008"),
    "d1": (8, "80"),
    "d2": (8, "800"),
    "d3": (8, "8000"),
    "e1": (8, "8 percentage"),
    "e2": (8, "8%"),
    "e3": (3035, "3,035"),
}
NUMBER_RE = re.compile(r"\d[\d,]*(?:\.\d+)?")


def test_formats_follow_table_1():
    assert list(embednum.FORMATS) == list(TABLE_1)
    for name, (units, text) in TABLE_1.items():
        fmt = embednum.FORMATS[name]
        assert fmt.low <= units <= fmt.high
        assert fmt.render(units) == text


def _value(text):
    """The single number in an answer ("$1,234 million" -> 1234.0)."""
    numbers = NUMBER_RE.findall(text)
    assert len(numbers) == 1, text
    return float(numbers[0].replace(",", ""))


@pytest.mark.parametrize("name", list(embednum.FORMATS))
def test_triples_satisfy_and_violate(name):
    fmt = embednum.FORMATS[name]
    rng = random.Random(0)
    for index in range(200):
        direction = ("above", "below")[index % 2]
        threshold, positive, negative = embednum.sample_triple(fmt, direction, rng)
        assert fmt.low <= min(positive, negative) < threshold < max(positive, negative) <= fmt.high
        assert positive - threshold == threshold - negative  # symmetric: distance says nothing
        assert (positive > threshold) == (direction == "above")


@pytest.mark.parametrize("name", list(embednum.FORMATS))
def test_items_render_and_differ_only_in_the_number(name):
    items = [
        item for item in embednum.build_embednum(seed=5, per_format=20) if item["format"] == name
    ]
    assert len(items) == 20
    assert sum(item["direction"] == "above" for item in items) == 10
    for item in items:
        positive, negative = _value(item["positive"]), _value(item["negative"])
        threshold = _value(item["question"])
        assert (positive, negative, threshold) == pytest.approx(
            (item["positive_value"], item["negative_value"], item["threshold"])
        )
        if item["direction"] == "above":
            assert positive > threshold > negative
            assert any(word in item["question"] for word in embednum.COMPARISONS["above"])
        else:
            assert positive < threshold < negative
        assert NUMBER_RE.sub("#", item["positive"]) == NUMBER_RE.sub("#", item["negative"])
        assert item["positive"] != item["negative"]
        if name in ("e1", "e2"):
            suffix = " percentage" if name == "e1" else "%"
            assert item["question"].count(suffix) == item["positive"].count(suffix) == 1


def test_build_is_deterministic():
    first = embednum.build_embednum(seed=1, per_format=4)
    assert first == embednum.build_embednum(seed=1, per_format=4)
    assert first != embednum.build_embednum(seed=2, per_format=4)
    assert len(first) == 4 * 18
    assert len({item["id"] for item in first}) == len(first)
    with pytest.raises(ValueError, match="per_format"):
        embednum.build_embednum(seed=0, per_format=0)


def _direction_aware(texts_a, texts_b):
    """Prefers larger numbers for "above"-type questions and smaller ones otherwise."""
    below = embednum.COMPARISONS["below"]  # checked first: "not exceeding" holds "exceeding"
    signs = [-1.0 if any(f" {word} " in q for word in below) else 1.0 for q in texts_a]
    return np.array([sign * _value(answer) for sign, answer in zip(signs, texts_b, strict=True)])


def test_evaluate_toy_scorers():
    items = embednum.build_embednum(seed=0, per_format=10)
    perfect = embednum.evaluate(None, items, score_fn=_direction_aware)
    assert set(perfect) == {"overall", "above", "below", *embednum.FORMATS}
    assert all(value == 1.0 for value in perfect.values())

    larger = embednum.evaluate(None, items, score_fn=lambda q, a: np.array([_value(t) for t in a]))
    assert larger["overall"] == 0.5
    assert larger["above"] == 1.0 and larger["below"] == 0.0
    assert all(larger[name] == 0.5 for name in embednum.FORMATS)

    flat = embednum.evaluate(None, items, score_fn=lambda q, a: np.zeros(len(a)))
    assert flat["overall"] == 0.0  # ties never count


def test_evaluate_cosine_path_and_subset():
    items = [
        i for i in embednum.build_embednum(seed=0, per_format=6) if i["format"] in ("a1", "e3")
    ]

    def encode_fn(texts):
        # Questions at angle 0; an answer's angle grows with how wrong it is.
        angles = []
        for text in texts:
            if text.endswith("?") or text.startswith("Find"):
                angles.append(0.0)
            else:
                item = next(i for i in items if text in (i["positive"], i["negative"]))
                angles.append(0.3 if text == item["positive"] else 0.9)
        return np.array([[math.cos(a), math.sin(a)] for a in angles])

    result = embednum.evaluate(encode_fn, items)
    assert result == {"overall": 1.0, "a1": 1.0, "e3": 1.0, "above": 1.0, "below": 1.0}
