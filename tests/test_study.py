"""Smoke run of the main job (launch/demo.sh's study script) on a cut-down demo config."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke_study(tmp_path_factory, financebench_third) -> tuple[Path, subprocess.CompletedProcess]:
    """`--preset smoke` run once per module: its output folder and the finished process. Its
    prepared data folder (with teacher vectors) is also the numeric preset test's `--data`."""
    out = tmp_path_factory.mktemp("study") / "smoke"
    result = subprocess.run(
        [sys.executable, "scripts/study.py", "--preset", "smoke", "--output", str(out),
         f"--financebench={financebench_third}"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out, result


@pytest.mark.slow(60)
def test_study_smoke_runs_every_stage(smoke_study):
    """The demo's path cut down: LEAF and the numeric student from the same 3-layer start."""
    out, result = smoke_study
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = json.loads((out / "study.json").read_text())
    assert list(study["results"]) == ["Initial", "Teacher", "LEAF s0", "Numeric s0"]
    for label, results in study["results"].items():
        assert 0.0 <= results["financebench"]["ndcg_at_10"] <= 1.0, label
        assert 0.0 <= results["numgap"]["overall"]["D"] <= 1.0, label
    # The teacher is the real all-MiniLM-L6-v2: its retrieval is far above the 3-layer Initial.
    assert study["results"]["Teacher"]["financebench"]["ndcg_at_10"] > 0.4
    assert study["results"]["Initial"]["settings"]["num_layers"] == 3
    assert study["results"]["Numeric s0"]["train_summary"]["step"] == 3
    configs = {label: json.loads((out / label.replace(" ", "_") / "config.json").read_text())
               for label in ("LEAF s0", "Numeric s0")}  # fmt: skip
    assert configs["Numeric s0"]["loss"]["objective"] == "neighbour"
    assert (configs["LEAF s0"]["loss"]["objective"], configs["LEAF s0"]["loss"]["lam"]) == (
        "caliber",
        0.0,
    )
    assert "train/sim_nb" in study["results"]["Numeric s0"]["train_summary"]
    assert (out / "LEAF_s0" / "hf" / "modules.json").is_file()
    report = (out / "study.md").read_text()
    assert "## FinanceBenchRetrieval" in report
    # Paired tests on the same queries / NumGap records, the numeric student against LEAF.
    for table in ("financebench ndcg_at_10", "numgap D", "numgap M"):
        assert f"## Paired comparisons, {table} (n = " in report, table
    assert "| Numeric s0 | LEAF s0 |" in report
    assert any((out / "figures").glob("*.png"))
    lines = result.stdout.strip().splitlines()
    assert "study: computed now: Initial, Teacher, LEAF s0, Numeric s0" in lines
    assert "study: restored from records: none" in lines
    # The last lines: the before/after table (written beside the report too), then the pointers.
    study_module = _study_module()
    table = (out / "before_after.md").read_text()
    closing = [*study_module.DEMO_HEADING.splitlines(), "", *table.splitlines(), "",
               *study_module.DEMO_EPILOGUE.splitlines()]  # fmt: skip
    assert lines[-len(closing) :] == closing
    assert table.splitlines()[0].startswith("| model | NumGap-D (test, n = 12) | magnitude |")


def _study_module():
    import importlib.util

    sys.path.insert(0, str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location("study_script", REPO / "scripts" / "study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _result(numgap_d: dict[str, int], ndcg: dict[str, float]) -> dict:
    """A results dict as `caliber_jax.evaluate` writes it, for records r0.. (even: magnitude, odd:
    polarity) and questions q0.."""
    categories = {"magnitude": [], "polarity": []}
    for record, d in numgap_d.items():
        categories["magnitude" if int(record[1:]) % 2 == 0 else "polarity"].append(d)
    return {
        "numgap": {
            "overall": {"D": sum(numgap_d.values()) / len(numgap_d), "n": len(numgap_d)},
            **{name: {"D": sum(v) / len(v), "n": len(v)} for name, v in categories.items()},
        },
        "financebench": {"ndcg_at_10": sum(ndcg.values()) / len(ndcg)},
        "per_query": {"numgap": {"D": numgap_d}, "financebench": {"ndcg_at_10": ndcg}},
    }


def test_before_after_table_rows_and_paired_tests():
    """The demo's closing table on 10 made-up records and 4 questions: the figures of each row,
    and exact randomization p-values (2^n sign flips <= the resamples)."""
    records = [f"r{i}" for i in range(10)]
    questions = [f"q{i}" for i in range(4)]
    zeros = dict.fromkeys(records, 0)
    results = {
        "Teacher": _result({**zeros, "r0": 1}, dict.fromkeys(questions, 0.5)),
        "Initial": _result(zeros, dict.fromkeys(questions, 0.0)),
        "LEAF s0": _result(zeros, {"q0": 0.3, "q1": 0.2, "q2": 0.1, "q3": 0.2}),
        "Numeric s0": _result({**zeros, **dict.fromkeys(records[:6], 1)},
                              {"q0": 0.3, "q1": 0.1, "q2": 0.1, "q3": 0.2}),
    }  # fmt: skip
    lines = _study_module().before_after_table(results).splitlines()
    assert lines[0] == (
        "| model | NumGap-D (test, n = 10) | magnitude | polarity | FinanceBench nDCG@10 (n = 4) |"
    )
    assert lines[2:6] == [
        "| Teacher | 0.1000 | 0.2000 | 0.0000 | 0.5000 |",
        "| Initial | 0.0000 | 0.0000 | 0.0000 | 0.0000 |",
        "| LEAF s0 | 0.0000 | 0.0000 | 0.0000 | 0.2000 |",
        "| Numeric s0 | 0.6000 | 0.6000 | 0.6000 | 0.1750 |",
    ]
    tests = lines[9:]
    # Five records separated that the teacher keeps together (r0 both): p = 2 / 2^5.
    assert tests[0].startswith("| Numeric s0 | Teacher | NumGap-D | +0.5000 | [")
    assert tests[0].endswith("| 0.062 | 5 / 0 / 5 |")
    # Six against LEAF: p = 2 / 2^6; every resample of six +1 and four 0 stays in [0.3, 0.9].
    assert tests[1].startswith("| Numeric s0 | LEAF s0 | NumGap-D | +0.6000 | [+0.")
    assert tests[1].endswith("| 0.031 | 6 / 0 / 4 |")
    # One question lost by 0.1 out of 4: a difference no test can tell from noise (p = 1).
    assert tests[2] == (
        "| Numeric s0 | LEAF s0 | nDCG@10 | -0.0250 | [-0.0750, +0.0000] | 1 | 0 / 1 / 3 |"
    )
    assert tests[3].startswith("| Numeric s0 | Initial | nDCG@10 | +0.1750 | [")
    assert tests[3].endswith("| 0.12 | 4 / 0 / 0 |")
    assert len(tests) == 4


def test_demo_epilogue_quotes_the_records():
    """The demo's closing pointers quote the records that measured them (records/demo_record.json
    names each), rounded to 3 places; nothing is read from the prose docs."""
    epilogue = " ".join(_study_module().DEMO_EPILOGUE.split())
    record = json.loads((REPO / "records" / "demo_record.json").read_text())
    verify, full = record["pointers"]["headline_verify"], record["pointers"]["headline_late800"]
    assert f"python scripts/study.py {verify['command']}" in epilogue
    assert f"about {round(verify['wall_s'] / 60)} minutes from a fresh clone" in epilogue
    assert f"{verify['date']}, commit {verify['commit'][:7]}" in epilogue
    results = json.loads((REPO / verify["record"]).read_text())["results"]
    mined, twin, numeric, teacher = (results[label] for label in verify["rows"])
    assert (
        f"nDCG@10 to {mined['financebench']['ndcg_at_10']:.3f} against its twin's "
        f"{twin['financebench']['ndcg_at_10']:.3f}"
    ) in epilogue
    assert (
        f"NumGap-D reaches {numeric['numgap']['overall']['D']:.3f} against its teacher's "
        f"{teacher['numgap']['overall']['D']:.3f}"
    ) in epilogue
    runs = [json.loads((REPO / full["record"]).read_text())["results"][label]
            for label in full["rows"]]  # fmt: skip
    ndcg = sum(run["financebench"]["ndcg_at_10"] for run in runs) / len(runs)
    d = sum(run["numgap"]["overall"]["D"] for run in runs) / len(runs)
    assert f"`{full['command']}`" in epilogue
    assert f"reaches nDCG@10 {ndcg:.3f} at NumGap-D {d:.3f}" in epilogue
    assert "configs/caliber.py" in epilogue


def test_demo_record_holds_the_table_it_quotes():
    """records/demo_record.json's recorded before/after table says what its figures say, and the
    record names the command, date, commit, config and machine that produced it."""
    demo = json.loads((REPO / "records" / "demo_record.json").read_text())["demo"]
    for field in ("command", "date", "commit", "config", "machine", "shared", "wall_s"):
        assert demo[field], field
    lines = demo["table"].splitlines()
    assert list(demo["rows"]) == list(_study_module().DEMO_ROWS)
    for label, row in demo["rows"].items():
        values = [row["numgap_d"], *(row[f"numgap_d_{name}"] for name in ("magnitude", "polarity",
                  "unit")), row["ndcg_at_10"]]  # fmt: skip
        assert f"| {label} | " + " | ".join(f"{v:.4f}" for v in values) + " |" in lines, label
        assert row["provenance"]["commit"].startswith(demo["commit"]), label
    assert len(demo["paired"]) == len(_study_module().DEMO_TESTS)
    for pair in demo["paired"]:
        head = f"| {pair['model']} | {pair['against']} | "
        (line,) = [line for line in lines
                   if line.startswith(head) and f"| {pair['diff']:+.4f} |" in line]  # fmt: skip
        assert line.endswith(f"| {pair['p_value']:.2g} | {pair['wins']} / {pair['losses']} / "
                             f"{pair['ties']} |")  # fmt: skip


@pytest.mark.slow(100)
def test_numeric_preset_trains_leaf_paper_and_recipe_at_one_length(
    tmp_path, financebench_third, smoke_study
):
    """`--preset numeric` (issue #16) on the bundled sample, cut down by `--overrides`: the model
    calibrating itself, LEAF and eq. 4 beside the recipe, every model scored at 128 tokens. It
    trains on the smoke study's data folder (`--data`): the overrides' prepare and teacher
    settings are the smoke preset's, so preparing the sample again would write the same folder."""
    smoke_out, smoke_result = smoke_study
    assert smoke_result.returncode == 0, smoke_result.stderr[-3000:]
    out = tmp_path / "numeric"
    overrides = (
        "--config.prepare.max_passages=48 --config.prepare.max_val_passages=16 "
        "--config.prepare.heldout_fraction=0.34 "
        "--config.prepare.numgap_quotas_test={'magnitude':6,'polarity':6} "
        "--config.prepare.numgap_quotas_dev={'magnitude':2} --config.batch_size=8 "
        "--config.data.max_length=64 --config.teacher.max_length=64 --config.total_steps=2 "
        "--config.model.num_layers=1 --config.data.pack_rungs=1"
    )
    # One stage at a time (the smoke above runs them side by side): LEAF and eq. 4 differ only in
    # lambda and m, traced scalars of one step program, which the second training then reads from
    # the cache the first one wrote instead of compiling it beside it (79 CPU-s instead of 89).
    result = subprocess.run(
        [sys.executable, "scripts/study.py", "--preset", "numeric", "--output", str(out),
         "--filings", "data/sample/filings.jsonl.gz", f"--financebench={financebench_third}",
         f"--data={smoke_out / 'data'}", f"--overrides={overrides}", "--jobs=1"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = json.loads((out / "study.json").read_text())
    assert list(study["results"]) == ["Teacher", "LEAF s0", "Caliber-paper s0", "Numeric s0"]
    for label, results in study["results"].items():
        assert results["settings"]["max_length"] == 128, label
        assert 0.0 <= results["numgap"]["overall"]["D"] <= 1.0, label
    # The user's total_steps wins over the variants' one epoch; each variant keeps its loss.
    summaries = {
        label: r["train_summary"] for label, r in study["results"].items() if label != "Teacher"
    }
    assert all(summary["step"] == 2 for summary in summaries.values())
    configs = {label: json.loads((out / label.replace(" ", "_") / "config.json").read_text())
               for label in summaries}  # fmt: skip
    assert configs["LEAF s0"]["loss"]["lam"] == 0.0
    assert configs["Caliber-paper s0"]["loss"]["objective"] == "caliber"
    assert configs["Numeric s0"]["loss"]["objective"] == "neighbour"
    # --data: the folder given is read as it is; nothing prepared or embedded again.
    assert not {"prepare", "teacher vectors"} & set(study["times"])
    assert not (out / "data").exists()


def test_data_folder_given_skips_the_data_stages_and_must_be_prepared(tmp_path):
    """`--data`: no prepare or teacher-vector stage, and a folder without stats, NumGap test
    records or training teacher vectors is refused up front with the ones it lacks."""
    study = _study_module()
    common = ["--config=configs/demo.py"]
    assert [stage.name for stage in study.data_stages(common, prepared=False)] == [
        "prepare", "teacher vectors",
    ]  # fmt: skip
    assert study.data_stages(common, prepared=True) == []
    (tmp_path / "stats.json").write_text("{}")
    with pytest.raises(ValueError, match="no numgap_test.jsonl, teacher_train/x"):
        study.check_prepared(tmp_path)
    (tmp_path / "numgap_test.jsonl").write_text("")
    (tmp_path / "teacher_train" / "x").mkdir(parents=True)
    study.check_prepared(tmp_path)
    # The presets with their own data flows refuse it rather than ignore it.
    refused = subprocess.run(
        [sys.executable, "scripts/study.py", "--preset", "mpnet", f"--data={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "--data: --preset mpnet prepares its own data folders" in refused.stderr


@pytest.mark.parametrize("jobs", [2, 1])
def test_a_failed_stage_stops_the_study_with_one_line_and_its_status(tmp_path, jobs):
    """Side by side (--jobs 2, the default on two or more usable cores) a stage's output goes to
    its log and its last lines to the study's summary; one after the other (--jobs 1, the default
    on one core) it streams, so the stage's error line is the one line above the study's."""
    missing = tmp_path / "no_such_filings.jsonl.gz"
    argv = [sys.executable, "scripts/study.py", "--preset", "smoke", "--output",
            str(tmp_path / "out"), "--filings", str(missing), f"--jobs={jobs}"]  # fmt: skip
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 2  # the failed stage's own status (a user error)
    assert "Traceback" not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    if jobs == 2:
        assert str(missing) in result.stdout  # the stage's own error line, in its summary
    else:
        assert len(lines) == 2 and lines[0].startswith("error: ") and str(missing) in lines[0]
    line = lines[-1]
    assert len(lines) == 3 - jobs
    assert line.startswith("study: stopped: stage `python -m caliber_jax.prepare ")
    assert "rerun the same command to resume" in line
    if jobs == 1:
        return
    # --traceback shows where it stopped.
    traced = subprocess.run([*argv, "--traceback"], cwd=REPO, capture_output=True, text=True,
                            check=False)  # fmt: skip
    assert traced.returncode != 0 and "CalledProcessError" in traced.stderr


def test_a_user_error_of_the_study_itself_is_one_line():
    sys.path.insert(0, str(REPO / "scripts"))
    import study

    line, status = study.stopped(ValueError("LEAF s1 and Teacher scored different queries"))
    assert (line, status) == (
        "study: stopped: error: LEAF s1 and Teacher scored different queries",
        2,
    )
