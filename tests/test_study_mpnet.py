"""scripts/study_mpnet.py: the truncated-teacher stores and the untrained student it evaluates."""

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from caliber_jax import provenance
from caliber_jax.data import corpus, teacher

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
_spec = importlib.util.spec_from_file_location("study_mpnet", REPO / "scripts" / "study_mpnet.py")
study_mpnet = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study_mpnet)


def _run(stage: str, argv: list[str], times: dict[str, float]) -> None:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    times[stage] = time.perf_counter() - start


def _unit_rows(rng, rows: int) -> np.ndarray:
    vectors = rng.standard_normal((rows, 768)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_truncated_stores_are_the_768_stores_cut_and_renormalised(tmp_path):
    data, data_384 = tmp_path / "data", tmp_path / "data_384"
    data.mkdir()
    rng = np.random.default_rng(0)
    native = {}
    for split, rows in (("train", 5), ("val", 3)):
        texts = [f"Revenue was ${i + 1} million in {split}." for i in range(rows)]
        perturbed = [f"Revenue was ${i + 7} million." if i % 2 else None for i in range(rows)]
        records = [
            {"id": f"{split}:{i}", "text": t, "perturbed": p}
            for i, (t, p) in enumerate(zip(texts, perturbed, strict=True))
        ]
        corpus.save_jsonl(data / f"{split}.jsonl", records)
        for name, column in (("x", texts), ("px", [p or "" for p in perturbed])):
            vectors = _unit_rows(rng, rows)
            native[split, name] = vectors
            teacher.embed_to_store(
                lambda batch, v=vectors, c=column: v[[c.index(t) for t in batch]],
                column,
                data / f"teacher_{split}" / name,
                batch_rows=8,
                dim=768,
                chunk_rows=2,
                process_index=0,
                process_count=1,
                metadata={"teacher": "fake-mpnet", "pooling": "mean", "native_dim": 768},
            )
    times: dict[str, float] = {}
    study_mpnet.derive_truncated(data, data_384, _run, [], times)
    for split, rows in (("train", 5), ("val", 3)):
        assert (data_384 / f"{split}.jsonl").resolve() == (data / f"{split}.jsonl").resolve()
        for name in ("x", "px"):
            stored = teacher.open_reader(
                data_384 / f"teacher_{split}" / name, expect_rows=rows, expect_dim=384
            )[np.arange(rows)]
            cut = native[split, name][:, :384]
            expected = cut / np.linalg.norm(cut, axis=1, keepdims=True)
            if name == "px":
                expected[0::2] = 0.0  # rows without a perturbation stay zero
            np.testing.assert_allclose(stored, expected, atol=1e-6)
    assert set(times) == {"teacher vectors 384 (train)", "teacher vectors 384 (val)"}
    # Done: a rerun skips both splits.
    again: dict[str, float] = {}
    study_mpnet.derive_truncated(data, data_384, _run, [], again)
    assert again == {}


def test_neighbour_passages_are_mined_from_training_texts_and_share_the_stores(tmp_path):
    from caliber_jax import prepare
    from caliber_jax.data import pipeline

    data, data_nb = tmp_path / "data", tmp_path / "data_nb"
    (data / "teacher_train" / "x").mkdir(parents=True)
    (data / "teacher_val").mkdir()
    topics = ["revenue grew in the quarter", "operating cash flow declined", "dividends paid"]
    texts = [
        f"{topics[i % 3]} by {i + 3}.{i} million dollars in fiscal {2000 + i}" for i in range(9)
    ]
    records = [{"id": f"d:{i}", "text": t, "perturbed": None} for i, t in enumerate(texts)]
    corpus.save_jsonl(data / "train.jsonl", records)
    corpus.save_jsonl(data / "val.jsonl", records[:2])
    study_mpnet.derive_neighbours(data, data_nb, k=4)
    written = corpus.load_jsonl(data_nb / "train.jsonl")
    expected = prepare.mine_neighbours(texts, k=4)
    assert [r["neighbour"] for r in written] == expected
    assert [{k: v for k, v in r.items() if k != "neighbour"} for r in written] == records
    # Same topic (every third passage), never itself; what the train loader reads back.
    found = pipeline.load_neighbours(data_nb / "train.jsonl")
    assert all(n == -1 or (n != i and n % 3 == i % 3) for i, n in enumerate(found))
    assert (found >= 0).sum() >= 6
    for name in ("val.jsonl", "teacher_train", "teacher_val"):
        assert (data_nb / name).resolve() == (data / name).resolve()
    # Done: a rerun keeps the file as it is.
    before = (data_nb / "train.jsonl").stat().st_mtime_ns
    study_mpnet.derive_neighbours(data, data_nb, k=4)
    assert (data_nb / "train.jsonl").stat().st_mtime_ns == before


def test_numeric_variant_takes_the_numeric_recipe_loss():
    from configs import numeric
    from configs import study_mpnet as config_module

    config = config_module.get_config("numeric")
    assert config.loss.to_dict() == numeric.get_config().loss.to_dict()
    assert config.model.out_dim == 768 and config.data.dir.endswith("data_nb")
    assert config.prepare.neighbour_k > 0
    runs = study_mpnet.students([0, 1])
    assert [label for label, *_ in runs] == [
        "LEAF lp s0", "Caliber lp s0", "Numeric lp s0", "LEAF t384 s0", "Caliber t384 s0",
        "LEAF lp s1", "Caliber lp s1", "LEAF s0",
    ]  # fmt: skip
    assert runs[-1] == ("LEAF s0", "xavier", 0.0, 0)  # session 8's random-W_out run


def test_w_out_starts_least_squares_except_in_the_xavier_variant():
    from configs import study_mpnet as config_module

    assert config_module.get_config().model.w_out_init == "lstsq"
    assert config_module.get_config("numeric").model.w_out_init == "lstsq"
    xavier = config_module.get_config("xavier")
    assert xavier.model.w_out_init == "xavier" and xavier.model.out_dim == 768
    assert config_module.get_config("trunc384").model.out_dim is None


def test_initial_student_is_minilm_with_the_seeded_w_out(minilm_dir, tmp_path):
    from caliber_jax.models import embedding

    hf_dir = study_mpnet.write_initial(
        tmp_path / "hf", init_dir=str(minilm_dir), out_dim=768, seed=0, max_length=128
    )
    spec = embedding.read_spec(hf_dir, pooling="mean", num_layers=None, out_dim=768)
    written = embedding.load_flat_params(hf_dir, spec)
    spec_init = embedding.read_spec(minilm_dir, pooling="mean", num_layers=None, out_dim=768)
    expected = embedding.load_flat_params(minilm_dir, spec_init, seed=0)  # what train.py uses
    assert sorted(written) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)


def _fake_study(monkeypatch, minilm_dir, tmp_path):
    """study_mpnet with every CLI stage faked (each writes what the next one checks for); returns
    `fake_stage(calls)`, the dict of each stage's argv and the list of the figures' model sets."""
    import json

    monkeypatch.setattr(study_mpnet.fetch_mpnet, "fetch", lambda *a, **k: tmp_path / "mpnet")
    drawn: list[list[str]] = []  # the models of each call to plot_all
    monkeypatch.setattr(
        study_mpnet.plots, "plot_all", lambda results, out: drawn.append(sorted(results)) or []
    )
    # The 384-d stores are derived from real 768-d ones (tested above); here only whether.
    monkeypatch.setattr(
        study_mpnet, "derive_truncated", lambda data, data_384, run, common, times: run(
            "teacher vectors 384", [], times)
    )  # fmt: skip
    monkeypatch.setattr(
        study_mpnet, "derive_neighbours", lambda data, data_nb, k: data_nb.mkdir(parents=True)
    )
    monkeypatch.setattr(
        study_mpnet.study_mpnet, "get_config",
        lambda variant=None: type("C", (), {
            "model": type("M", (), {"init_dir": str(minilm_dir)}),
            "prepare": type("P", (), {"neighbour_k": 10}),
        })(),
    )  # fmt: skip

    calls_argv: dict[str, list[str]] = {}

    def fake_stage(calls):
        def run_stage(stage, argv, times):
            calls.append(stage)
            calls_argv[stage] = argv
            options = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
            if stage == "prepare":
                data = Path(options["--config.data.dir"])
                data.mkdir(parents=True, exist_ok=True)
                (data / "stats.json").write_text("{}")
            if "--output" in options and stage.startswith("evaluate"):
                out = Path(options["--output"])
                out.parent.mkdir(parents=True, exist_ok=True)
                result = {"label": options["--label"], "financebench": {"ndcg_at_10": 0.5}}
                tasks, values = options["--tasks"].split(","), {"q1": 0.5, "q2": 0.25}
                if "financebench" in tasks:  # per-query nDCG@10
                    values = {"q1": 0.5, "q2": len(options["--label"]) / 100}
                    result["per_query"] = {"financebench": {"ndcg_at_10": values}}
                if "numgap" in tasks:  # per-record D and M
                    result["per_query"] = {"numgap": {"D": {"0:a": 1, "1:b": 0}, "M": values}}
                # The evaluator's own block: its settings hash, the evaluation files' data hash.
                data = [options.get("--financebench"), options.get("--numgap")]
                result["provenance"] = provenance.stamp(
                    config="e" * 16, data=provenance.data_hash(data)
                )
                out.write_text(json.dumps(result))
            times[stage] = 1.0

        return run_stage

    return fake_stage, calls_argv, drawn


def test_recorded_study_restores_into_a_fresh_output_and_reruns_nothing(
    minilm_dir, tmp_path, monkeypatch, capsys
):
    """Run folders do not outlive the machine: every finished evaluation is recorded, and a
    fresh output folder with the same record trains, encodes and evaluates nothing again."""
    import argparse
    import json

    fake_stage, calls_argv, _ = _fake_study(monkeypatch, minilm_dir, tmp_path)

    record = tmp_path / "record"
    args = argparse.Namespace(output=str(tmp_path / "first"), filings=None, seeds="0",
                              financebench="fb.jsonl.gz", record=str(record))  # fmt: skip
    first: list[str] = []
    study_mpnet.run_study(args, fake_stage(first))
    assert "teacher vectors" in first and "train Caliber t384 s0" in first
    assert (
        first.index("train LEAF lp s0")
        < first.index("export Initial lp s0")  # the fitted start, evaluated as its own model
        < first.index("evaluate Initial lp s0 (asymmetric)")
        < first.index("train Caliber lp s0")
        < first.index("train Numeric lp s0")
        < first.index("train LEAF t384 s0")
        < first.index("train LEAF s0")
    )
    export = [a for a in calls_argv["export Initial lp s0"] if a.startswith("--")]
    assert "--interpolate=0" in export and any(a.endswith("LEAF_lp_s0") for a in export)
    # untrained (2 students x 3 groups + teacher x 2), 6 trained students and Initial lp x 3
    assert sum(stage.startswith("evaluate") for stage in first) == 2 * 3 + 2 + 6 * 3 + 3
    recorded = sorted(p.relative_to(record).as_posix() for p in record.rglob("*.json"))
    assert "results/Caliber_t384_s0/asymmetric.json" in recorded and "study.json" in recorded

    again: list[str] = []
    args.output = str(tmp_path / "fresh")
    study_mpnet.run_study(args, fake_stage(again))
    assert again == ["prepare"], again  # prepare is minutes; no encoding, training or evaluation
    # Every row says it was restored, with the commit that computed it, in the tables and the
    # provenance section, and the run's last lines say which rows were computed now.
    commit = json.loads((record / "results/LEAF_lp_s0/numgap.json").read_text())["provenance"][
        "commit"
    ]
    fresh_report = (tmp_path / "fresh" / "study.md").read_text()
    assert f"| LEAF lp s0 (restored @{commit}) | 0.5000 |" in fresh_report  # results table
    assert f"| Caliber lp s0 (restored @{commit}) | LEAF lp s0 (restored @{commit}) |" in (
        fresh_report  # paired comparisons
    )
    assert "| LEAF lp s0 | numgap | restored |" in fresh_report
    out = capsys.readouterr().out
    assert "study: computed now: none" in out
    assert "study: restored from records: Initial s0 (restored @" in out
    # The paired tests of the models that have per-query values, in study.md.
    report = (tmp_path / "fresh" / "study.md").read_text()
    assert "## Paired comparisons, financebench ndcg_at_10 (n = 2;" in report
    mark = f" (restored @{commit})"
    assert f"| LEAF s0{mark} | Initial s0{mark} |" in report
    # NumGap's per-record values (another file of the same model) join, not replace, them.
    assert "## Paired comparisons, numgap D (n = 2;" in report
    assert "## Paired comparisons, numgap M (n = 2;" in report
    state = json.loads((tmp_path / "fresh" / "study.json").read_text())
    assert set(state["results"]) == {"Initial s0", "Initial t384 s0", "Teacher", "LEAF s0",
                                     "Initial lp s0", "LEAF lp s0", "Caliber lp s0",
                                     "Numeric lp s0", "LEAF t384 s0",
                                     "Caliber t384 s0"}  # fmt: skip


def test_records_of_another_config_or_recompute_are_not_restored(
    minilm_dir, tmp_path, monkeypatch, capsys
):
    """A record whose config hash is not this run's, or was never recorded (unless
    `--restore_unverified`), is not restored (the model is trained and evaluated again, and the
    run says why in one line); `--recompute` ignores every record."""
    import argparse
    import json

    fake_stage, _, _ = _fake_study(monkeypatch, minilm_dir, tmp_path)
    record = tmp_path / "record"
    args = argparse.Namespace(output=str(tmp_path / "first"), filings=None, seeds="0",
                              financebench="fb.jsonl.gz", record=str(record))  # fmt: skip
    study_mpnet.run_study(args, fake_stage([]))
    computed = capsys.readouterr().out
    assert "study: restored from records: none" in computed
    path = record / "results/Caliber_lp_s0/numgap.json"
    saved = json.loads(path.read_text())
    saved["provenance"]["config_hash"] = "0" * 16  # as if lambda had been another
    path.write_text(json.dumps(saved))

    again: list[str] = []
    args.output = str(tmp_path / "second")
    study_mpnet.run_study(args, fake_stage(again))
    assert [stage for stage in again if stage.startswith("train")] == ["train Caliber lp s0"]
    lines = [line for line in capsys.readouterr().out.splitlines() if "not restored" in line]
    current = json.loads((tmp_path / "first/results/Caliber_lp_s0/numgap.json").read_text())
    assert lines == [f"study: Caliber lp s0 not restored: config hash differs (recorded "
                     f"{'0' * 16} at commit {saved['provenance']['commit']}, this run "
                     f"{current['provenance']['config_hash']}); computing it"]  # fmt: skip
    report = (tmp_path / "second" / "study.md").read_text()
    assert "| Caliber lp s0 | numgap | now |" in report and "| LEAF lp s0 (restored @" in report

    # A record whose config hash was never recorded: computed again, one line naming the flag;
    # restored (and marked) only with --restore_unverified.
    path = record / "results/LEAF_lp_s0/numgap.json"
    saved = json.loads(path.read_text())
    saved["provenance"]["config_hash"] = "unknown"
    path.write_text(json.dumps(saved))
    unverified: list[str] = []
    args.output = str(tmp_path / "unverified")
    study_mpnet.run_study(args, fake_stage(unverified))
    assert [stage for stage in unverified if stage.startswith("train")] == ["train LEAF lp s0"]
    lines = [line for line in capsys.readouterr().out.splitlines() if "not restored" in line]
    assert len(lines) == 1 and lines[0].startswith(
        "study: LEAF lp s0 not restored: config hash unknown (recorded at commit "
    )  # fmt: skip
    assert "--restore_unverified" in lines[0]
    path.write_text(json.dumps(saved))  # the run above recorded its own result over it
    args.output, args.restore_unverified = str(tmp_path / "asked"), True
    asked: list[str] = []
    study_mpnet.run_study(args, fake_stage(asked))
    assert not [stage for stage in asked if stage.startswith("train")]
    assert ", provenance unknown)" in (tmp_path / "asked" / "study.md").read_text()
    args.restore_unverified = False

    args.output, args.recompute = str(tmp_path / "third"), True
    third: list[str] = []
    study_mpnet.run_study(args, fake_stage(third))
    assert sum(stage.startswith("train") for stage in third) == 6
    assert "study: restored from records: none" in capsys.readouterr().out


def test_long_study_trains_the_main_pair_of_every_seed_on_the_long_variant(
    minilm_dir, tmp_path, monkeypatch
):
    import argparse
    import json

    fake_stage, calls_argv, drawn = _fake_study(monkeypatch, minilm_dir, tmp_path)
    record = tmp_path / "record_long"
    args = argparse.Namespace(output=str(tmp_path / "long"), filings=None, seeds="0,1",
                              financebench="fb.jsonl.gz", record=str(record))  # fmt: skip
    calls: list[str] = []
    study_mpnet.run_study(args, fake_stage(calls), long=True)
    trained = [stage for stage in calls if stage.startswith("train")]
    assert trained == ["train LEAF lp long s0", "train Caliber lp long s0",
                       "train LEAF lp long s1", "train Caliber lp long s1"]  # fmt: skip
    for stage in ["prepare", "teacher vectors", *trained]:
        assert any(a.endswith("study_mpnet.py:long") for a in calls_argv[stage]), stage
    caliber = calls_argv["train Caliber lp long s1"]
    assert "--config.loss.lam=0.5" in caliber and "--config.seed=1" in caliber
    assert f"--config.data.dir={tmp_path / 'long' / 'data'}" in caliber
    # references: the teacher and the least-squares start of the first LEAF run; nothing else
    assert "--interpolate=0" in calls_argv["export Initial lp long s0"]
    evaluated = {stage.split(" (")[0].removeprefix("evaluate ") for stage in calls
                 if stage.startswith("evaluate")}  # fmt: skip
    students = {stage.removeprefix("train ") for stage in trained}
    assert evaluated == {"Teacher", "Initial lp long s0", *students}
    state = json.loads((record / "study.json").read_text())
    assert "Caliber lp long s1" in state["results"]
    # The report adds each objective's mean over the two seeds, in the tables and paired tests;
    # the state keeps only what was measured.
    report = (record / "study.md").read_text()
    assert "| Caliber lp long s0+s1 | LEAF lp long s0+s1 |" in report
    assert "| Caliber lp long s0+s1 | Teacher |" in report
    assert "LEAF lp long s0+s1" not in state["results"]
    # The figures are drawn once after every student (a study stopped part way has them), the
    # first time with its untrained start.
    assert len(drawn) == len(students)
    assert drawn[0] == ["Initial lp long s0", "LEAF lp long s0", "Teacher"]
    assert drawn[-1] == sorted(state["results"])


def test_with_jobs_the_students_train_side_by_side_on_their_own_cores(
    minilm_dir, tmp_path, monkeypatch
):
    """`--jobs 2`: every student still to train goes to the stage runner at once, two at a time
    and pinned; then each is exported and evaluated in order, and a student whose training had
    finished (summary.json) is not trained again."""
    import argparse
    import json

    fake_stage, calls_argv, _ = _fake_study(monkeypatch, minilm_dir, tmp_path)
    out = tmp_path / "long"
    done = out / "LEAF_lp_long_s0"  # trained in an earlier session, killed before its export
    done.mkdir(parents=True)
    (done / "summary.json").write_text(json.dumps({"step": 2000}))
    calls: list[str] = []
    run_stage = fake_stage(calls)
    side_by_side = []

    def fake_run_stages(stages, times, *, cwd, jobs, log_dir, pin_cores):
        side_by_side.append(([stage.name for stage in stages], jobs, pin_cores))
        for stage in stages:
            run_stage(stage.name, list(stage.args), times)
            workdir = next(a for a in stage.args if a.startswith("--workdir="))
            workdir = Path(workdir.split("=", 1)[1])
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "summary.json").write_text('{"step": 2000}')

    monkeypatch.setattr(study_mpnet, "run_stages", fake_run_stages)
    args = argparse.Namespace(output=str(out), filings=None, seeds="0,1", jobs=2,
                              financebench="fb.jsonl.gz", record="")  # fmt: skip
    study_mpnet.run_study(args, run_stage, long=True)
    assert side_by_side == [
        (["train Caliber lp long s0", "train LEAF lp long s1", "train Caliber lp long s1"], 2, True)
    ]
    assert "--config.seed=1" in calls_argv["train LEAF lp long s1"]
    # Each training once, all before the first export; then export, evaluate, in study order.
    assert [c for c in calls if c.startswith("train")] == side_by_side[0][0]
    exports = [c for c in calls if c.startswith("export")]
    assert exports == ["export LEAF lp long s0", "export Initial lp long s0",
                       "export Caliber lp long s0", "export LEAF lp long s1",
                       "export Caliber lp long s1"]  # fmt: skip
    assert calls.index("train Caliber lp long s1") < calls.index("export LEAF lp long s0")
    state = json.loads((out / "study.json").read_text())
    assert state["results"]["LEAF lp long s1"]["train_summary"] == {"step": 2000}


def test_long_variant_is_two_thousand_steps_over_twenty_thousand_passages():
    from caliber_jax import train
    from configs import study_mpnet as config_module

    config = config_module.get_config("long")
    assert config.prepare.max_passages == 20000
    assert config.data.dir.endswith("study_mpnet_long/data")
    assert train.total_steps(config, 20000) == 2000
    assert config.model.out_dim == 768 and config.model.w_out_init == "lstsq"


def test_validation_curve_keeps_the_val_rows_last_one_per_step(tmp_path):
    import json

    rows = [{"step": 10, "train/loss": 1.0}, {"step": 0, "val/align_x": 0.9, "val/delta_s": 0.001},
            {"step": 100, "val/align_x": 0.7, "val/delta_s": 0.002},
            {"step": 100, "val/align_x": 0.6, "val/delta_s": 0.003},  # logged again after a resume
            {"step": 100, "train/loss": 0.5}]  # fmt: skip
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert study_mpnet.validation_curve(metrics) == [
        {"step": 0, "val/align_x": 0.9, "val/delta_s": 0.001},
        {"step": 100, "val/align_x": 0.6, "val/delta_s": 0.003},
    ]


def test_results_written_before_per_query_values_are_stale(tmp_path):
    import json

    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps({"financebench": {"ndcg_at_10": 0.5}}))
    new.write_text(json.dumps({"financebench": {}, "per_query": {"financebench": {}}}))
    assert study_mpnet.lacks_per_query(old, "financebench,mrl")
    assert not study_mpnet.lacks_per_query(new, "financebench,mrl")
    assert study_mpnet.lacks_per_query(old, "numgap")
    assert not study_mpnet.lacks_per_query(old, "asymmetric")


def test_wall_times_add_up_resumed_pieces_and_keep_a_redo_apart():
    """A stage resumed from its own output adds to its entry; one started again from nothing on
    a new machine (the teacher encoded again) gets "<stage> (run 2)", and that run's own later
    pieces add to it."""
    times = {"teacher vectors": 5000.0, "prepare": 85.0}
    study_mpnet.add_times({"teacher vectors": 28.0}, times, fresh=set())  # resumed, same machine
    assert times == {"teacher vectors": 5028.0, "prepare": 85.0}
    study_mpnet.add_times(
        {"prepare": 48.0, "teacher vectors": 4000.0}, times, fresh={"prepare", "teacher vectors"}
    )
    study_mpnet.add_times({"teacher vectors": 500.0, "train X": 7.0}, times, fresh=set())
    study_mpnet.add_times({"teacher vectors": 4100.0}, times, fresh={"teacher vectors"})
    assert times == {
        "teacher vectors": 5028.0,
        "prepare": 85.0,
        "prepare (run 2)": 48.0,
        "teacher vectors (run 2)": 4500.0,
        "train X": 7.0,
        "teacher vectors (run 3)": 4100.0,
    }


def test_results_an_earlier_run_left_on_other_data_or_without_provenance_are_not_stamped(
    minilm_dir, tmp_path, monkeypatch, capsys
):
    """A run folder's result scored on other data, or without a provenance block, is never
    stamped with this run's hashes (nor then recorded): it is set aside with one line and
    restored from the record or evaluated again."""
    import argparse
    import json

    fake_stage, _, _ = _fake_study(monkeypatch, minilm_dir, tmp_path)
    record, out = tmp_path / "record", tmp_path / "out"
    args = argparse.Namespace(output=str(out), filings=None, seeds="0",
                              financebench="fb.jsonl.gz", record=str(record))  # fmt: skip
    study_mpnet.run_study(args, fake_stage([]))
    capsys.readouterr()
    recorded = {name: (record / "results" / name).read_text()
                for name in ("LEAF_lp_s0/numgap.json", "Teacher/numgap.json")}  # fmt: skip

    def tamper() -> None:
        for name in recorded:
            path = out / "results" / name
            saved = {**json.loads(path.read_text()), "stale": True}
            if name.startswith("LEAF"):  # scored on another NumGap set, by the evaluator
                saved["provenance"] = provenance.stamp(config="e" * 16, data="x" * 16)
            else:  # written before provenance blocks were kept
                del saved["provenance"]
            path.write_text(json.dumps(saved))

    tamper()
    study_mpnet.run_study(args, fake_stage([]))
    lines = [line for line in capsys.readouterr().out.splitlines() if "not used" in line]
    assert len(lines) == 2, lines
    assert lines[0].startswith("study: results/Teacher/numgap.json in the run folder not used (")
    assert "no provenance block" in lines[0]
    assert lines[1].startswith("study: results/LEAF_lp_s0/numgap.json in the run folder not used "
                               f"(data hash differs (computed {'x' * 16} at commit ")  # fmt: skip
    for name, text in recorded.items():
        assert (record / "results" / name).read_text() == text  # the record is not laundered
        restored = json.loads((out / "results" / name).read_text())
        assert "stale" not in restored and restored["provenance"]["restored"] is True
    state = json.loads((out / "study.json").read_text())
    assert not any("stale" in row for row in state["results"].values())

    # Without a record: evaluated again (the trained student keeps its checkpoint).
    args.record = ""
    tamper()
    again: list[str] = []
    study_mpnet.run_study(args, fake_stage(again))
    assert {"evaluate Teacher (numgap)", "evaluate LEAF lp s0 (numgap)"} <= set(again)
    for name in recorded:
        block = json.loads((out / "results" / name).read_text())["provenance"]
        assert block["restored"] is False and block["data_hash"] != "x" * 16


def test_recompute_recomputes_the_rows_an_earlier_run_restored(
    minilm_dir, tmp_path, monkeypatch, capsys
):
    """`--recompute` on a run folder whose results an earlier run restored from the record
    computes every one of them again, and says why."""
    import argparse
    import json

    fake_stage, _, _ = _fake_study(monkeypatch, minilm_dir, tmp_path)
    record = tmp_path / "record"
    args = argparse.Namespace(output=str(tmp_path / "first"), filings=None, seeds="0",
                              financebench="fb.jsonl.gz", record=str(record))  # fmt: skip
    study_mpnet.run_study(args, fake_stage([]))
    args.output = str(tmp_path / "fresh")
    study_mpnet.run_study(args, fake_stage([]))  # restores every row
    assert "study: computed now: none" in capsys.readouterr().out
    args.recompute = True
    again: list[str] = []
    study_mpnet.run_study(args, fake_stage(again))
    assert sum(stage.startswith("train") for stage in again) == 6
    out = capsys.readouterr().out
    assert "study: restored from records: none" in out
    assert "--recompute computes it again" in out
    state = json.loads((tmp_path / "fresh" / "study.json").read_text())
    assert not any(provenance.is_restored(row) for row in state["results"].values())


def test_a_run_killed_while_saving_its_state_leaves_one_to_resume_from(
    minilm_dir, tmp_path, monkeypatch
):
    """study.json is written atomically: a run killed mid-write leaves the previous state."""
    import argparse
    import json
    import os

    fake_stage, _, _ = _fake_study(monkeypatch, minilm_dir, tmp_path)
    out = tmp_path / "out"
    args = argparse.Namespace(output=str(out), filings=None, seeds="0",
                              financebench="fb.jsonl.gz", record="")  # fmt: skip
    study_mpnet.run_study(args, fake_stage([]))
    before = json.loads((out / "study.json").read_text())

    class Killed(BaseException):
        pass

    state = out / "study.json"
    write_text, replace = Path.write_text, os.replace

    def torn_write(self, text, *a, **k):  # a kill half way through a write in place
        if self == state:
            write_text(self, text[: len(text) // 2], *a, **k)
            raise Killed
        return write_text(self, text, *a, **k)

    def killed_replace(source, target):  # a kill before an atomic write's rename
        if Path(target) == state:
            raise Killed
        return replace(source, target)

    monkeypatch.setattr(Path, "write_text", torn_write)
    monkeypatch.setattr(os, "replace", killed_replace)
    with pytest.raises(Killed):
        study_mpnet.run_study(args, fake_stage([]))
    monkeypatch.undo()
    assert json.loads(state.read_text())["results"] == before["results"]
