"""Tests for scripts/sweep.py: point names and overrides, score flattening, Pareto front, plot."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("sweep", REPO / "scripts" / "sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def point(name, d, ndcg, objective="neighbour"):
    params = {} if name == "teacher" else {"objective": objective}
    return {"name": name, "params": params, "scores": {"D/overall": d, "fb/ndcg_at_10": ndcg}}


def test_point_name_and_overrides(sweep):
    point = sweep.Point("neighbour", 2.0, 0.05, 0.0, 5e-5, 200)
    assert point.name == "neighbour_l2_m0.05_pw0_lr5e-05_s200"
    assert point.overrides() == [
        "--config.loss.objective=neighbour", "--config.loss.lam=2.0",
        "--config.loss.margin=0.05", "--config.loss.perturb_weight=0.0",
        "--config.loss.structure_weight=0.0", "--config.optim.lr=5e-05",
        "--config.total_steps=200",
    ]  # fmt: skip
    structured = sweep.Point("neighbour", 8.0, 0.1, 0.0, 1e-4, 1000, structure_weight=50.0)
    assert structured.name == "neighbour_l8_m0.1_pw0_sw50_lr0.0001_s1000"
    assert structured.params()["structure_weight"] == 50.0
    names = [p.name for grid in sweep.GRIDS.values() for p in grid]
    assert len(names) == len(set(names)), "two grid points would share a result file"


def test_scores_flatten_evaluate_results(sweep):
    results = {
        "financebench": {"ndcg_at_10": 0.5, "recall_at_100": 0.9},
        "numgap": {"overall": {"D": 0.01, "M": -0.2, "n": 3}, "unit": {"D": 0.0, "M": -0.1}},
        "label": "x",
    }
    assert sweep.scores(results) == {
        "D/overall": 0.01, "M/overall": -0.2, "D/unit": 0.0, "M/unit": -0.1,
        "fb/ndcg_at_10": 0.5, "fb/recall_at_100": 0.9,
    }  # fmt: skip


def test_pareto_front_by_hand(sweep):
    points = [
        point("teacher", 0.001, 0.55),
        point("a", 0.010, 0.56),  # beats the teacher on both
        point("b", 0.050, 0.50),  # more D, less nDCG: on the front
        point("c", 0.040, 0.49),  # dominated by b
        point("d", 0.050, 0.50),  # ties b exactly: kept too
        point("e", 0.005, 0.56),  # dominated by a (same nDCG, less D)
    ]
    assert sweep.pareto_front(points, x="D/overall", y="fb/ndcg_at_10") in (
        ["a", "b", "d"], ["a", "d", "b"],
    )  # fmt: skip
    summary = sweep.summarise(points + [{"name": "unscored", "params": {}, "scores": {}}])
    assert summary["teacher"] == {"D/overall": 0.001, "fb/ndcg_at_10": 0.55}
    assert [p["name"] for p in summary["points"]][:2] in (["b", "d"], ["d", "b"])
    assert len(summary["points"]) == 6


def test_points_round_trip_and_plot(sweep, tmp_path):
    for p in (point("teacher", 0.001, 0.55), point("b", 0.05, 0.5, "absolute")):
        sweep.write_json(tmp_path / "points" / f"{p['name']}.json", p)
    loaded = sweep.load_points(tmp_path / "points")
    assert [p["name"] for p in loaded] == ["b", "teacher"]
    assert not list((tmp_path / "points").glob("*.tmp"))
    summary = sweep.summarise(loaded)
    assert json.loads(json.dumps(summary)) == summary
    path = sweep.plot_pareto(summary, tmp_path / "pareto.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sweep.write_summary(summary, tmp_path)
    table = (tmp_path / "sweep.md").read_text().splitlines()
    assert table[0].startswith("| point | steps | D overall |") and len(table) == 4
    # Best D first; both points are on the front (b: higher D, teacher: higher nDCG).
    assert table[2].startswith("| **b** |") and "| 0.0500 |" in table[2]
    assert table[3].startswith("| **teacher** |") and "| 0.5500 |" in table[3]


def test_calibrate_and_numeric_configs():
    """The calibrate configs: student = teacher at full depth, neighbour objective, neighbours
    mined; the :caliber variant is eq. 4; configs/caliber.py keeps eq. 4 as the default."""
    from configs import caliber, calibrate, numeric

    for config in (calibrate.get_config(), numeric.get_config()):
        assert config.model.init_dir == config.teacher.model_dir
        assert config.model.num_layers is None
        assert config.loss.objective == "neighbour" and config.prepare.neighbour_k > 0
    eq4 = calibrate.get_config("caliber").loss
    assert (eq4.objective, eq4.lam, eq4.perturb_weight) == ("caliber", 0.5, 1.0)
    paper = caliber.get_config()
    assert (paper.loss.objective, paper.loss.perturb_weight, paper.prepare.neighbour_k) == (
        "caliber", 1.0, 0,
    )  # fmt: skip
    assert numeric.get_config().data.dir != calibrate.get_config().data.dir
    with pytest.raises(ValueError, match="unknown variant"):
        calibrate.get_config("nope")


def test_numeric_preset_trains_the_recorded_recipe_point(sweep):
    """`study.py --preset numeric`'s "Numeric" student is configs/numeric.py as it stands, and the
    sweep's recorded best point (`--grid structure`) is the same config: its overrides change
    nothing in it. So the one-command preset retrains the point docs/numeric.md reports."""
    import study

    from configs import numeric

    variants = dict(study.PRESETS["numeric"]["variants"])
    assert study.PRESETS["numeric"]["config"] == "configs/numeric.py"
    assert variants["Numeric"] == [] and study.PRESETS["numeric"]["overrides"] == []
    (point,) = sweep.GRIDS["structure"]
    config = numeric.get_config()
    for flag in point.overrides():
        key, value = flag.removeprefix("--config.").split("=")
        *parents, leaf = key.split(".")
        node = config
        for part in parents:
            node = node[part]
        assert node[leaf] == type(node[leaf])(value), (key, node[leaf], value)


def test_records_restore_into_a_fresh_output_without_overwriting(sweep, tmp_path, capsys):
    out, record = tmp_path / "out", tmp_path / "record"
    block = sweep.provenance.stamp(config="c" * 16, data="d" * 16)
    finished = out / "points" / "a.json"
    sweep.write_json(finished, {**point("a", 0.1, 0.5), "provenance": block})
    sweep.write_json(out / "results" / "a.dev.json", {"label": "a", "provenance": block})
    for path in (finished, out / "results" / "a.dev.json", out / "missing.json"):
        sweep.record_file(path, out, record)
    assert json.loads((record / "points" / "a.json").read_text())["name"] == "a"
    assert (record / "results" / "a.dev.json").exists() and not (record / "missing.json").exists()
    sweep.record_file(finished, out, None)  # recording off: nothing happens

    fresh = tmp_path / "fresh"
    sweep.write_json(fresh / "points" / "b.json", point("b", 0.2, 0.4))
    sweep.write_json(record / "points" / "b.json", point("b", 0.9, 0.9))  # a stale record
    sweep.write_json(record / "points" / "gone.json", point("gone", 0.9, 0.9))  # no grid has it
    # Another config hash for "a": nothing restored, one line each for "a" and "gone".
    hashes = {"a": "x" * 16, "b": "c" * 16}
    known = dict(restore_unverified=False)  # every record here carries its hashes
    assert sweep.restore_points(record, fresh, hashes, "d" * 16, **known) == []
    said = capsys.readouterr().out.splitlines()
    assert said == [
        f"sweep: points/a.json not restored: config hash differs (recorded {'c' * 16} at commit "
        f"{block['commit']}, this run {'x' * 16})",
        "sweep: gone not restored: no grid of this code makes that point",
    ]
    assert sweep.restore_points(record, fresh, {**hashes, "a": "c" * 16}, "d" * 16,
                                **known) == ["a"]  # fmt: skip
    assert [p["name"] for p in sweep.load_points(fresh / "points")] == ["a", "b"]
    assert sweep.load_points(fresh / "points")[1]["scores"]["D/overall"] == 0.2  # not overwritten
    dev = json.loads((fresh / "results" / "a.dev.json").read_text())
    assert dev["provenance"]["restored"] is True
    # The table says which point was restored, from which commit.
    table = sweep.format_table(sweep.summarise(sweep.load_points(fresh / "points")))
    assert f"| **a (restored @{block['commit']})** |" in table and "| **b** |" in table
    assert sweep.restore_points(record, fresh, {**hashes, "a": "c" * 16}, "d" * 16,
                                **known) == []  # fmt: skip
    assert sweep.restore_points(tmp_path / "no-record", fresh, hashes, "d" * 16, **known) == []


def test_point_hashes_follow_the_resolved_config_not_the_run_folder(sweep, tmp_path):
    """A point's config hash is its resolved config's (the grid's overrides on the config file)
    and the evaluation arguments', with paths by name: the same in any run folder, different
    for another lr; derived points hash with their base point and step or blend."""
    grid_point = sweep.GRIDS["paper"][0]
    names = ["teacher", grid_point.name, f"{grid_point.name}_at50", f"{grid_point.name}_w0.5",
             "no_such_point"]  # fmt: skip
    config = f"--config={REPO / 'configs/numeric.py'}"

    def hashes(folder: str, *overrides: str) -> dict[str, str]:
        common = [config, f"--config.data.dir={tmp_path / folder / 'data'}", *overrides]
        common_eval = [f"--financebench={tmp_path / folder / 'fb.jsonl.gz'}", "--max_length=128"]
        return sweep.point_hashes(names, common, common_eval, str(tmp_path / folder / "teacher"))

    first = hashes("one")
    assert sorted(first) == sorted(names[:4]) and len(set(first.values())) == 4
    assert hashes("two") == first  # another machine's run folder
    other = hashes("one", "--config.optim.warmup_frac=0.2")
    assert other["teacher"] == first["teacher"]
    assert all(other[name] != first[name] for name in names[1:4])


def test_derived_points_and_keep_period(sweep):
    derived = sweep.derived_points("p", 1000, [200, 600, 1000, 1200], [0.5, 0.75])
    assert derived == [
        ("p_at200", 200, None), ("p_at600", 600, None),  # 1000 is the point itself
        ("p_w0.5", None, 0.5), ("p_w0.75", None, 0.75),
    ]  # fmt: skip
    assert sweep.keep_period([600, 700, 800]) == 100
    assert sweep.keep_period([250, 1000]) == 250
    assert sweep.keep_period([]) == 0


@pytest.mark.slow(80)
def test_sweep_runs_trains_and_scores_derived_points(tmp_path, financebench_third):
    """The whole sweep on the bundled sample: teacher, one trained point, a mid-run checkpoint
    and a weight-space blend, each scored by `caliber_jax.evaluate` (about a minute). The student
    keeps 1 of the teacher's 6 layers, packs its batches at one row count (one step program to
    compile) and every model is scored at 64 tokens: the sweep's bookkeeping is the same at any
    size."""
    out, data = tmp_path / "out", tmp_path / "data"
    overrides = (
        f"--config.data.dir={data} --config.prepare.max_passages=48 "
        "--config.prepare.max_val_passages=16 --config.data.max_length=64 "
        "--config.teacher.max_length=64 --config.batch_size=8 --config.checkpoint_every=1 "
        "--config.keep_checkpoints=1 --config.model.num_layers=1 --config.data.pack_rungs=1"
    )
    command = [
        sys.executable, "scripts/sweep.py", "--config", "configs/calibrate.py", "--grid", "smoke",
        "--output", str(out), "--record", str(tmp_path / "record"), "--checkpoints", "1",
        "--interpolate", "0.5", "--eval_max_length=64", f"--overrides={overrides}",
        f"--financebench={financebench_third}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": ""}
    subprocess.run(command, cwd=REPO, check=True, env=env, timeout=900)
    name = "neighbour_l2_m0.05_pw0_lr5e-05_s2"
    points = {p["name"]: p for p in sweep_points(out)}
    assert set(points) == {"teacher", name, f"{name}_at1", f"{name}_w0.5"}
    for point in points.values():
        assert 0.0 <= point["scores"]["D/overall"] <= 1.0
        assert 0.0 < point["scores"]["fb/ndcg_at_10"] <= 1.0
    at1, blend = points[f"{name}_at1"], points[f"{name}_w0.5"]
    assert at1["params"]["steps"] == 1 and at1["params"]["schedule_steps"] == 2
    assert blend["params"]["interpolate"] == 0.5 and blend["params"]["of"] == name
    exported = json.loads((Path(at1["model"]) / "caliber_export.json").read_text())
    assert exported["step"] == 1  # kept by keep_period although keep_checkpoints is 1
    exported = json.loads((Path(blend["model"]) / "caliber_export.json").read_text())
    assert exported == {**exported, "step": 2, "interpolate": 0.5}
    assert (tmp_path / "record" / "points" / f"{name}_w0.5.json").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert {p["name"] for p in summary["points"]} == set(points)
    # Each point records the hashes it was computed with; a fresh output on the same data and
    # config restores every one of them (the hashes computed on restore are the recorded ones),
    # trains and evaluates nothing, and ends by saying so.
    assert all(p["provenance"]["restored"] is False for p in points.values())
    fresh = [*command[:command.index("--output") + 1], str(tmp_path / "fresh"),
             *command[command.index("--output") + 2:]]  # fmt: skip
    again = subprocess.run(fresh, cwd=REPO, check=True, env=env, timeout=300,
                           capture_output=True, text=True)  # fmt: skip
    assert "sweep: computed now: none" in again.stdout, again.stdout[-3000:]
    assert not (tmp_path / "fresh" / "runs").exists()  # nothing trained
    restored = {p["name"]: p for p in sweep_points(tmp_path / "fresh")}
    assert set(restored) == set(points)
    assert all(p["provenance"]["restored"] is True for p in restored.values())
    assert "(restored @" in (tmp_path / "fresh" / "sweep.md").read_text()


def sweep_points(out):
    return [json.loads(path.read_text()) for path in sorted((out / "points").glob("*.json"))]


def test_test_table_has_numgap_per_category_and_every_financebench_metric(sweep):
    fb = {metric: 0.5 for metric in sweep.FB_METRICS}
    fb["ndcg_at_10"] = 0.5583
    test = {"numgap": {"overall": {"D": 0.0062, "M": -0.3514}, "magnitude": {"D": 0.004, "M": 0},
                       "unit": {"D": 0.01, "M": 0}}}  # fmt: skip
    table = sweep.format_test_table([("Teacher", {"financebench": fb}, test)]).splitlines()
    assert table[0].split(" | ")[1:6] == ["D overall", "D magnitude", "D polarity", "D unit",
                                          "M overall"]  # fmt: skip
    assert len(table[0].split(" | ")) == 1 + 5 + 8
    assert table[2] == ("| Teacher | 0.0062 | 0.0040 | - | 0.0100 | -0.3514 | 0.5583 | "
                        + " | ".join(["0.5000"] * 7) + " |")  # fmt: skip


def test_test_table_marks_restored_rows(sweep):
    """A row whose test (or dev) scores were restored from a record says so, as every other
    table does; a row computed now keeps its bare label."""
    fb = {metric: 0.5 for metric in sweep.FB_METRICS}
    block = sweep.provenance.stamp(config="c" * 16, data="d" * 16)
    computed = {"numgap": {"overall": {"D": 0.01, "M": -0.3}}, "provenance": block}
    restored = {**computed, "provenance": {**block, "restored": True}}
    dev = {"financebench": fb, "provenance": block}
    table = sweep.format_test_table(
        [("a", dev, restored), ("b", dev, computed), ("c", {**dev, **restored}, computed)]
    ).splitlines()
    assert table[2].startswith(f"| a (restored @{block['commit']}) | 0.0100 |")
    assert table[3].startswith("| b | 0.0100 |")
    assert table[4].startswith(f"| c (restored @{block['commit']}) |")


def test_points_an_earlier_run_left_are_checked_before_they_are_skipped(sweep, tmp_path, capsys):
    """A finished point in the run folder counts as done only while its hashes are this run's:
    one scored on other data or made by another config, one without provenance, or (with
    --recompute) one restored from a record is set aside with its dev scores, one line each,
    and then restored or computed again."""
    out = tmp_path / "out"
    block = sweep.provenance.stamp(config="e" * 16, data="d" * 16)
    stamped = {**block, "config_hash": "c" * 16, "eval_config_hash": "e" * 16}
    blocks = {
        "current": stamped,
        "other_data": {**stamped, "data_hash": "x" * 16},
        "other_config": {**stamped, "config_hash": "o" * 16},
        "no_provenance": None,
        "restored": {**stamped, "restored": True},
        "gone": stamped,  # no grid makes it any more: its data hash is still checked
    }
    for name, value in blocks.items():
        extra = {} if value is None else {"provenance": value}
        sweep.write_json(out / "points" / f"{name}.json", {**point(name, 0.1, 0.5), **extra})
        sweep.write_json(out / "results" / f"{name}.dev.json", {"label": name, **extra})
    hashes = {name: "c" * 16 for name in blocks if name != "gone"}
    options = dict(recompute=False, restore_unverified=False)
    dropped = sweep.drop_stale_points(out, hashes, "d" * 16, **options)
    assert dropped == ["no_provenance", "other_config", "other_data"]
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all(" in the run folder not used (" in line for line in lines)
    assert sorted(p["name"] for p in sweep.load_points(out / "points")) == [
        "current", "gone", "restored",
    ]  # fmt: skip
    for name in dropped:
        assert not (out / "results" / f"{name}.dev.json").exists()
        assert (out / "points" / f"{name}.json.stale").is_file()
    assert sweep.drop_stale_points(out, hashes, "d" * 16, **options) == []
    # --recompute: the restored point is computed again, the current one stays.
    assert sweep.drop_stale_points(out, hashes, "d" * 16, recompute=True,
                                   restore_unverified=False) == ["restored"]  # fmt: skip
    assert "--recompute computes it again" in capsys.readouterr().out
