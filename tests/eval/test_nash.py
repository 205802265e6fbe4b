"""Tests for caliber_jax/eval/nash.py: extractor, Eq. 2-3 by hand, and NASH on the real MiniLM."""

import math

import numpy as np
import pytest

from caliber_jax.embedder import Embedder
from caliber_jax.eval import nash, numfine

# Sec. 2.2 of the NASH paper.
S1, S2, S3 = "Revenue increased by 3.56%.", "Revenue increased by 4%.", "Revenue increased by 40%."


def _numbers(text):
    return [
        (text[m.start : m.end], text[m.start : m.suffix_end], m.value)
        for m in nash.extract_numbers(text)
    ]


def test_extract_and_mask():
    text = (
        "Q3 FY2023 sales of $1,234.5M rose 3.56% vs .26, -4.2 and 50bps, up 2 from 3rd; COVID-19."
    )
    assert _numbers(text) == [
        ("1,234.5", "1,234.5M", 1234.5),
        ("3.56", "3.56%", 3.56),
        (".26", ".26", 0.26),
        ("-4.2", "-4.2", -4.2),
        ("50", "50bps", 50.0),
        ("2", "2", 2.0),
        ("19", "19", 19.0),
    ]
    assert nash.mask_numbers("Revenue grows 15%") == "Revenue grows [NUM]%"
    assert nash.mask_numbers(text) == (
        "Q3 FY2023 sales of $[NUM]M rose [NUM]% vs [NUM], [NUM] and [NUM]bps, up [NUM] from 3rd; "
        "COVID-[NUM]."
    )
    assert nash.mask_numbers("no digits here") == "no digits here"


def test_fit_idf_formula():
    idf = nash.fit_idf(["A 5 a", "a b", "c 7 8"])  # masked: "A [NUM] a", "a b", "c [NUM] [NUM]"
    assert idf.num_docs == 3
    assert idf.weight("a") == pytest.approx(math.log(4 / 3) + 1)
    assert idf.weight("[NUM]") == pytest.approx(math.log(4 / 3) + 1)
    assert idf.weight("b") == pytest.approx(math.log(4 / 2) + 1)
    assert idf.weight("unseen") == pytest.approx(math.log(4) + 1)
    # alpha: text mass of "a", "b" and "a" vs numeric mass of two [NUM]s.
    w_text = 2 * idf.weight("a") + idf.weight("b")
    w_num = 2 * idf.weight("[NUM]")
    assert nash.alpha(idf, "a [NUM]", "b a [NUM].") == pytest.approx(w_text / (w_text + w_num))
    assert nash.alpha(idf, "a b", "c") == 1.0  # no numbers: NASH falls back to S_text
    assert nash.alpha(idf, "", "") == 1.0


def _pair_term(v, u):
    return 1 / (1 + abs(v - u) / (1 + 0.5 * (abs(v) + abs(u))))


def test_numeric_similarity_by_hand():
    e1, e2 = np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]])
    empty_values, empty_vectors = np.zeros(0), np.zeros((0, 2))
    # Footnote 5.
    assert (
        nash.numeric_similarity(empty_values, empty_vectors, empty_values, empty_vectors, 0.5) == 1
    )
    assert nash.numeric_similarity(np.array([4.0]), e1, empty_values, empty_vectors, 0.5) == 0
    assert nash.numeric_similarity(empty_values, empty_vectors, np.array([4.0]), e1, 0.5) == 0
    # Footnote 4: N = 1 + (|v| + |u|) / 2; the paper's 3.56 / 4 / 40.
    close = nash.numeric_similarity(np.array([3.56]), e1, np.array([4.0]), e1, 0.5)
    far = nash.numeric_similarity(np.array([3.56]), e1, np.array([40.0]), e1, 0.5)
    assert close == pytest.approx(1 / (1 + 0.44 / 4.78))
    assert far == pytest.approx(1 / (1 + 36.44 / 22.78))
    # Below the threshold nothing aligns.
    assert nash.numeric_similarity(np.array([4.0]), e1, np.array([4.0]), e2, 0.5) == 0
    # A mention without tokens (NaN vector) never aligns.
    nan = np.full((1, 2), np.nan)
    assert nash.numeric_similarity(np.array([4.0]), nan, np.array([4.0]), e1, -1.0) == 0


def test_alignment_follows_context_not_position():
    """s: [100 (amount), 20 (rate)]; t: [25 (rate), 90 (amount)]; vectors mark the roles."""
    amount, rate = [1.0, 0.0], [0.0, 1.0]
    values_s, vectors_s = np.array([100.0, 20.0]), np.array([amount, rate])
    values_t, vectors_t = np.array([25.0, 90.0, 7.0]), np.array([rate, amount, [-1.0, 0.0]])
    expected_forward = (_pair_term(100, 90) + _pair_term(20, 25)) / 2  # divided by |V_s| = 2
    expected_backward = (_pair_term(25, 20) + _pair_term(90, 100) + 0) / 3  # 7 aligns nowhere
    score = nash.numeric_similarity(values_s, vectors_s, values_t, vectors_t, 0.5)
    assert score == pytest.approx((expected_forward + expected_backward) / 2)


@pytest.fixture(scope="module")
def embedder(minilm_dir):
    return Embedder.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def threshold(embedder, filing_passages):
    return nash.fit_threshold(
        embedder, numfine.split_sentences(filing_passages), seed=0, num_pairs=1000
    )


@pytest.fixture(scope="module")
def scorer(embedder, filing_passages, threshold):
    return nash.NashScorer(embedder, idf=nash.fit_idf(filing_passages), threshold=threshold)


def test_token_embeddings_offsets_and_padding(embedder):
    texts = [S1, "Net income was $1,234.5 million, or $2.10 per diluted share, in fiscal 2023."]
    alone = nash.token_embeddings(embedder, texts[:1])
    both = nash.token_embeddings(embedder, texts, batch_size=2)
    for text, (offsets, vectors) in zip(texts, both, strict=True):
        ids = embedder.tokenizer(text, add_special_tokens=False)["input_ids"]
        tokens = embedder.tokenizer.convert_ids_to_tokens(ids)
        assert offsets.shape == (len(tokens), 2) and vectors.shape == (len(tokens), embedder.dim)
        assert vectors.dtype == np.float32 and offsets.dtype == np.int32
        assert [text[start:end].lower() for start, end in offsets] == [
            token.removeprefix("##") for token in tokens
        ]
    # Padding to a longer neighbour's length changes nothing.
    np.testing.assert_array_equal(alone[0][0], both[0][0])
    np.testing.assert_allclose(alone[0][1], both[0][1], atol=1e-5)
    with pytest.raises(TypeError):
        nash.token_embeddings(embedder, S1)


def test_threshold_is_a_background_similarity(threshold):
    assert 0.2 < threshold < 0.8


def test_nash_edge_cases(scorer):
    pairs = [
        ("The board met in the spring.", "The board met in the autumn."),  # no numbers
        ("Revenue increased by 4%.", "Revenue increased strongly."),  # numbers on one side
        ("Sales were $4.6 billion, up 2.3 percent.", "Sales were $4.6 billion, up 2.3 percent."),
    ]
    parts = scorer.components([a for a, _ in pairs], [b for _, b in pairs])
    assert parts["num"][0] == 1.0 and parts["alpha"][0] == 1.0
    assert parts["nash"][0] == pytest.approx(parts["text"][0])
    assert parts["num"][1] == 0.0 and 0 < parts["alpha"][1] < 1
    assert parts["nash"][1] == pytest.approx(parts["alpha"][1] * parts["text"][1])
    assert parts["num"][2] == 1.0
    assert parts["nash"][2] == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(
        scorer.score([a for a, _ in pairs], [b for _, b in pairs]), parts["nash"]
    )


def test_paper_ordering(scorer):
    """sim(s1, s2) > sim(s1, s3): 4% is closer to 3.56% than 40% is (Sec. 2.2)."""
    parts = scorer.components([S1, S1], [S2, S3])
    assert parts["text"][0] == pytest.approx(parts["text"][1])  # masked texts are equal
    assert parts["num"][0] == pytest.approx(1 / (1 + 0.44 / 4.78))
    assert parts["num"][1] == pytest.approx(1 / (1 + 36.44 / 22.78))
    assert parts["nash"][0] > parts["nash"][1]


def test_rerank(scorer):
    candidates = [S3, "Our headquarters are in Minnesota.", S1, "Revenue increased by 4.1%."]
    order, scores = scorer.rerank(S2, candidates, base_scores=[0.9, 0.1, 0.8, 0.7], top_k=3)
    assert sorted(order.tolist()) == [0, 2, 3]  # the top 3 by base score
    assert order.tolist() == [3, 2, 0]  # 4.1% and 3.56% beat 40%
    np.testing.assert_allclose(scores, scorer.score([S2] * 3, [candidates[i] for i in order]))
    assert np.all(np.diff(scores) <= 0)
    with pytest.raises(ValueError, match="base_scores"):
        scorer.rerank(S2, candidates, base_scores=[1.0], top_k=2)


def test_nash_on_numfine_units(scorer, filing_passages):
    """Masking makes anchor and variant equal for the text channel, so NASH ranks by magnitude.

    Dates are left out: NASH reads "December 31, 2016" as the numbers 31 and 2016, and a shift
    that crosses a month changes the masked text ("January [NUM], [NUM]").
    """
    items = numfine.build_numfine(filing_passages, seed=0, max_items=40)
    items = [item for item in items if item["category"] != "date"][:12]
    assert len(items) == 12
    for item in items:
        masked = {nash.mask_numbers(v["text"]) for v in item["variants"]}
        assert masked == {nash.mask_numbers(item["anchor"])}
    result = numfine.evaluate(None, items, score_fn=scorer.score)
    cosine = numfine.evaluate(scorer.embedder.encode, items)
    assert result["triplet"]["easy"] == 1.0
    assert result["listwise_tau_b"] > 0.8 > cosine["listwise_tau_b"]
