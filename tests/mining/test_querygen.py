"""The offline question generator: facts, the plain and the filing forms."""

import pytest

from caliber_jax.mining import querygen

TEXT = (
    "Net sales increased 4.2% to $32.8 billion in 2019, driven by organic growth. Total "
    "operating expenses were $1,234 million for the year ended December 31, 2018."
)


def test_fiscal_period_from_the_fact_else_the_filing():
    assert querygen.fiscal_period("year ended December 31, 2018", 2019) == "FY2018"
    assert querygen.fiscal_period("fiscal 2021", None) == "FY2021"
    assert querygen.fiscal_period("third quarter of fiscal 2020", 2021) == "Q3 FY2020"
    assert querygen.fiscal_period(None, 2017) == "FY2017"
    assert querygen.fiscal_period(None, "2023Q2") is None  # not a year
    assert querygen.fiscal_period(None, None) is None


def test_filing_style_names_the_company_and_fiscal_year_and_keeps_the_fact():
    chunk = {"text": TEXT, "company": "3M", "doc_period": 2019, "doc_type": "10k"}
    ((plain, plain_score),) = querygen.OfflineQueryGenerator("plain").generate([chunk])
    ((filing, filing_score),) = querygen.OfflineQueryGenerator("filing").generate([chunk])
    assert plain == "What was the amount of operating expenses in year ended December 31, 2018?"
    assert "3M" in filing and "FY2018" in filing and "operating expenses" in filing
    assert "1,234" not in filing  # the answer is not in the question
    assert filing_score == plain_score
    # the same fact gets the same form on every run
    assert querygen.OfflineQueryGenerator("filing").generate([chunk])[0][0] == filing


def test_filing_style_without_a_company_is_the_plain_question():
    ((filing, _),) = querygen.OfflineQueryGenerator("filing").generate([{"text": TEXT}])
    ((plain, _),) = querygen.OfflineQueryGenerator("plain").generate([{"text": TEXT}])
    assert filing == plain


def test_filing_forms_cover_changes_percentages_and_amounts():
    fact = {"item": "net sales", "verb": "increased", "amount": "4.2%", "period": "2019"}
    chunks = [{"company": f"Company {i}", "doc_period": 2019, "doc_type": "10k"} for i in range(40)]
    asked = {querygen.filing_question(fact, chunk) for chunk in chunks}
    changes = {form.format(company="X", period="FY2019", item="net sales", form="10-K")
               for form in querygen.FILING_FORMS["change"]}  # fmt: skip
    assert len(asked) == 40 and all("FY2019" in q for q in asked)
    # every change form is drawn across 40 companies
    assert {
        q.replace(c["company"], "X")
        for q, c in zip(
            map(lambda c: querygen.filing_question(fact, c), chunks), chunks, strict=True
        )
    } == changes
    percent = {**fact, "verb": "was"}
    assert "percent" in querygen.filing_question(percent, chunks[0]) or "share" in (
        querygen.filing_question(percent, chunks[0])
    )


def test_unknown_style_is_refused():
    with pytest.raises(ValueError, match="query style"):
        querygen.OfflineQueryGenerator("chatty")
