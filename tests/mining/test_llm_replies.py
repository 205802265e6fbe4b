"""What a small real LLM (SmolLM2-135M on llama.cpp) sends back, parsed without guessing: a grade
echoed with its Table II label, and an InPars generation that copies the prompt's example."""

import pytest

from caliber_jax.mining import judge, querygen


@pytest.mark.parametrize(
    "text, grade",
    [
        ("1: No answer", 1),  # SmolLM2's reply at max_tokens=4, measured
        ("2. No answer but", 2),
        ("4: Explicit answer and perfectly", 4),
        ("3) Partial answer and moderately relevant - The query is relevant", 3),
        ("1: Explicit answer", None),  # the words belong to grade 4: inconsistent
        ("4: No answer", None),
        ("4: Explicit", 4),  # measured, max_tokens=4
        ("1: No", 1),  # the digit decides; the words only must not contradict it
        ("4: Ex", None),  # a cut word
        ("1: The passage", None),
        ("5: No answer", None),
    ],
)
def test_grade_with_its_own_table_ii_words(text, grade):
    assert judge.parse_grade(text) == grade


class FixedClient:
    """Answers every completions call with the given texts in turn (log-prob -0.5 a token)."""

    def __init__(self, texts):
        self.texts = list(texts)

    def map(self, calls):
        return [
            {"choices": [{"text": self.texts.pop(0),
                          "logprobs": {"token_logprobs": [-0.5, -0.5]}}]}
            for _ in calls
        ]  # fmt: skip


def test_generation_copying_the_prompt_example_is_no_query():
    # Measured on SmolLM2-135M: greedy decoding repeated example 2's query for a filing chunk.
    copied = " What is the size and maturity of the company's revolving credit facility?"
    curly = copied.replace("'", "\u2019")  # measured too: "company\u2019s"
    generator = querygen.OpenAIQueryGenerator(
        FixedClient([copied, " What was the net revenue in 2022?", "", curly]),
        endpoint="completions", max_tokens=32, temperature=0.0, max_document_chars=100,
    )  # fmt: skip
    chunks = [{"id": f"d:{n}", "doc_name": "d", "text": "text"} for n in range(4)]
    assert generator.generate(chunks) == [
        (None, None), ("What was the net revenue in 2022?", -0.5), (None, None), (None, None)
    ]  # fmt: skip
    assert dict(generator.unusable) == {"copied a prompt example": 2, "empty generation": 1}


@pytest.mark.parametrize(
    "line, kept",
    [
        ("I'm ready to assist. What do you need from me today?", False),  # accepted before
        ("To begin with, I want to know what growth rate of 3M's sales is. To ask that question?",
         False),
        ("Let me add a new one. What changed in the company's debt covenants this year?", False),
        ("2. What drove the change in gross margin during the fiscal year?",
         True),
        ("What risk factors does Part I of the annual report list?", True),  # a numeral
        ("What is the impact of adopting ASU 2017-08 on the current accounting period?", False),
    ],
)  # fmt: skip
def test_few_shot_filter_rejects_chatter(line, kept):
    seen = {"what is the impact of adopting asu 2017-08 on the current accounting period?"}
    assert (querygen.accept_query(line, min_words=5, seen=seen) is not None) is kept
