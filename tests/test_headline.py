"""configs/headline.py and the model card of scripts/model_card.py (issue #37)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import model_card  # noqa: E402

from configs import headline, study_mpnet  # noqa: E402


def test_headline_is_the_long_study_plus_the_numeric_objective():
    config, long = headline.get_config(), study_mpnet.get_config("long")
    # Same student, start, passages, order and length as the LEAF/Caliber long runs.
    for field in ("model", "optim", "seed", "batch_size", "num_epochs"):
        assert config[field] == long[field], field
    assert config.prepare.max_passages == long.prepare.max_passages == 20000
    assert config.prepare.input == long.prepare.input and config.teacher == long.teacher
    loss = config.loss
    assert (loss.objective, loss.lam, loss.margin, loss.perturb_weight) == ("neighbour", 8, 0.1, 0)
    assert loss.structure_weight == 50 and loss.query_weight == 0  # chosen on NumGap dev
    assert config.prepare.queries and config.prepare.balance_rules
    assert config.prepare.neighbour_k > 0 and config.grad_chunk_rows == 0
    assert headline.get_config("query").loss.query_weight == 50
    verify = headline.get_config("verify")
    assert verify.prepare.max_passages == 1600 and verify.data.dir != config.data.dir
    assert verify.loss == config.loss
    with pytest.raises(ValueError, match="unknown variant"):
        headline.get_config("fast")


def test_model_card_reads_every_number_from_the_recorded_results(tmp_path):
    hf = tmp_path / "run" / "hf"
    hf.mkdir(parents=True)
    (hf / "modules.json").write_text(json.dumps([
        {"type": "sentence_transformers.models.Transformer"},
        {"type": "sentence_transformers.models.Pooling"},
        {"type": "sentence_transformers.models.Dense"},
    ]))  # fmt: skip
    (hf / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    config = headline.get_config()
    (tmp_path / "run" / "config.json").write_text(config.to_json_best_effort())
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"step": 2000}))

    def row(ndcg, d):
        return {"financebench": {"ndcg_at_10": ndcg, "recall_at_100": 0.9},
                "numgap": {"overall": {"D": d, "M": -0.1, "n": 500},
                           "unit": {"D": d + 0.1, "M": 0.0, "n": 100}},
                "settings": {"max_length": 256},
                "provenance": {"commit": "abc1234", "date": "2026-11-27"}}  # fmt: skip

    results = {"Headline lp long s0": row(0.61234, 0.26789), "Initial t384 s0": row(0.5557, 0.012),
               "Teacher": row(0.66091, 0.01)}  # fmt: skip
    path = model_card.write_card(
        hf, label="Headline lp long s0", results=results, teacher="Teacher",
        starts=["Initial t384 s0", "Missing s0"], workdir=hf.parent, numgap_path="ng.jsonl",
    )  # fmt: skip
    text = path.read_text()
    assert text.startswith("---\ntags:\n- sentence-transformers\n")
    assert (
        "library_name: sentence-transformers" in text and "# SentenceTransformer based on" in text
    )
    assert "| metric | Headline lp long s0 | Initial t384 s0 | Teacher |" in text
    assert "| FinanceBench ndcg_at_10 | 0.6123 | 0.5557 | 0.6609 |" in text
    assert "| NumGap-D overall | 0.2679 | 0.0120 | 0.0100 |" in text
    assert "| NumGap-D unit | 0.3679 | 0.1120 | 0.1100 |" in text
    assert "| FinanceBench map_at_10 | - | - | - |" in text  # not measured: not made up
    assert "**Steps:** 2000 of batch 32" in text and "commit abc1234" in text
    assert "Transformer -> Pooling -> Dense" in text and "Every model at 256 tokens" in text
    assert "query-passage geometry" not in text and "20000 passages" in text  # no query term
    assert "+ 50.0 x query-passage geometry" in model_card.query_clause(
        headline.get_config("query").loss.to_dict()
    )
    assert not (hf / "README.md.partial").exists()
