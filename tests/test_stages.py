"""scripts/stages.py: the study's stage runner (order, concurrency, logs, failures)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from stages import (  # noqa: E402
    Stage,
    check_graph,
    core_groups,
    keep_recorded,
    log_name,
    record_file,
    restore_result,
    run_stages,
    startable,
    summary,
)

from caliber_jax import provenance  # noqa: E402


def _writer(path: Path, text: str, *, sleep: float = 0.0, wait_for: Path | None = None):
    """A stage that optionally waits for a file, then appends `text` to `path`."""
    code = (
        "import pathlib, sys, time\n"
        f"wait = {str(wait_for) if wait_for else ''!r}\n"
        "deadline = time.time() + 30\n"
        "while wait and not pathlib.Path(wait).exists() and time.time() < deadline:\n"
        "    time.sleep(0.02)\n"
        f"time.sleep({sleep})\n"
        f"pathlib.Path({str(path)!r}).open('a').write({text!r} + '\\n')\n"
        f"print('progress 1/2\\rprogress 2/2'); print('final: {text}')\n"
    )
    return ("-c", code)


def test_check_graph_rejects_unknown_and_duplicate_stages():
    with pytest.raises(ValueError, match=r"stage 'b' needs \['c'\]"):
        check_graph([Stage("a", ("-c", "")), Stage("b", ("-c", ""), ("c",))])
    with pytest.raises(ValueError, match="defined twice"):
        check_graph([Stage("a", ("-c", "")), Stage("a", ("-c", ""))])


def test_summary_shows_the_last_state_of_progress_bars():
    text = "start\n 10%|#   \r 50%|##  \r100%|####\n\nfinal: loss=1\n"
    assert summary(text, 2) == ["100%|####", "final: loss=1"]
    assert log_name("train LEAF s0 (x)") == "train_LEAF_s0_x.log"


@pytest.mark.parametrize("jobs", [1, 2])
def test_prerequisites_finish_before_their_stages_start(tmp_path, jobs):
    order = tmp_path / "order.txt"
    stages = [
        Stage("first", _writer(order, "first", sleep=0.3)),
        Stage("second", _writer(order, "second"), ("first",)),
        Stage("third", _writer(order, "third"), ("second",)),
    ]
    times = {}
    run_stages(stages, times, cwd=tmp_path, jobs=jobs, log_dir=tmp_path / "logs")
    assert order.read_text().split() == ["first", "second", "third"]
    assert set(times) == {"first", "second", "third"}
    if jobs > 1:
        log = (tmp_path / "logs" / "second.log").read_text()
        assert log.startswith("$ python -c") and "final: second" in log


def test_independent_stages_run_side_by_side(tmp_path):
    # "slow" only finishes once "fast" has written its file: run one after the other, the pair
    # would wait out slow's 30 s deadline and write in the order slow, fast.
    order, flag = tmp_path / "order.txt", tmp_path / "fast.txt"
    stages = [
        Stage("slow", _writer(order, "slow", wait_for=flag)),
        Stage("fast", _writer(flag, "fast")),
        Stage("after", _writer(order, "after"), ("slow", "fast")),
    ]
    run_stages(stages, {}, cwd=tmp_path, jobs=2, log_dir=tmp_path / "logs")
    assert order.read_text().split() == ["slow", "after"]
    assert flag.read_text().split() == ["fast"]


def test_pinned_stages_side_by_side_get_disjoint_shares_of_the_cores(tmp_path):
    """Two compute-bound stages side by side (two trainings) each run on their own cores; the
    groups cover this process's cores. Where there are fewer cores than jobs, nothing is pinned."""
    parent = sorted(os.sched_getaffinity(0))
    code = "import os, sys; open(sys.argv[1], 'w').write(repr(sorted(os.sched_getaffinity(0))))"
    stages = [Stage(name, ("-c", code, str(tmp_path / name))) for name in ("a", "b", "c")]
    run_stages(stages, {}, cwd=tmp_path, jobs=2, log_dir=tmp_path / "logs", pin_cores=True)
    seen = {name: eval((tmp_path / name).read_text()) for name in ("a", "b", "c")}
    groups = core_groups(2)
    if len(parent) < 2:
        assert groups == [] and all(cores == parent for cores in seen.values())
        return
    assert sorted(core for group in groups for core in group) == parent
    assert not set(groups[0]) & set(groups[1])
    # a and b start together on the two groups; c reuses whichever group was freed first.
    assert {tuple(seen["a"]), tuple(seen["b"])} == set(groups)
    assert tuple(seen["c"]) in groups
    assert core_groups(1) == [] and core_groups(len(parent) + 1) == []


def test_an_alone_stage_waits_for_the_running_ones_then_runs_by_itself():
    a, b, c = Stage("a", ()), Stage("b", ()), Stage("c", ())
    solo = Stage("solo", (), alone=True)
    assert startable([a, b, c], [], 2) == [a, b]
    assert startable([solo, a], [], 2) == [solo]  # nothing beside it
    assert startable([a, solo, b], [], 2) == [a]  # b does not jump ahead of the waiting solo
    assert startable([solo, a], [b], 2) == []  # solo waits for b; a waits behind solo
    assert startable([a, b], [solo], 2) == []
    assert startable([b], [a], 2) == [b] and startable([b], [a], 1) == []


def test_an_alone_stage_gets_every_core_while_the_others_are_pinned(tmp_path):
    parent = sorted(os.sched_getaffinity(0))
    code = "import os, sys; open(sys.argv[1], 'w').write(repr(sorted(os.sched_getaffinity(0))))"
    stages = [
        Stage("solo", ("-c", code, str(tmp_path / "solo")), alone=True),
        *(Stage(name, ("-c", code, str(tmp_path / name)), ("solo",)) for name in "ab"),
    ]
    run_stages(stages, {}, cwd=tmp_path, jobs=2, log_dir=tmp_path / "logs", pin_cores=True)
    seen = {name: eval((tmp_path / name).read_text()) for name in ("solo", "a", "b")}
    assert seen["solo"] == parent
    if len(parent) >= 2:
        assert {tuple(seen["a"]), tuple(seen["b"])} == set(core_groups(2))


def test_a_failed_stage_stops_its_dependents_and_raises(tmp_path, capsys):
    order = tmp_path / "order.txt"
    stages = [
        Stage("broken", ("-c", "print('bad input: line 3'); raise SystemExit(2)")),
        Stage("sibling", _writer(order, "sibling", sleep=0.2)),
        Stage("dependent", _writer(order, "dependent"), ("broken",)),
    ]
    times = {}
    with pytest.raises(subprocess.CalledProcessError) as failure:
        run_stages(stages, times, cwd=tmp_path, jobs=2, log_dir=tmp_path / "logs")
    assert failure.value.returncode == 2
    # The sibling already running ends normally; the dependent never starts.
    assert order.read_text().split() == ["sibling"]
    assert "dependent" not in times
    out = capsys.readouterr().out
    assert "== broken: FAILED" in out and "bad input: line 3" in out


def test_config_value_resolves_file_and_overrides_in_process():
    from stages import config_value

    common = [f"--config={REPO / 'configs' / 'demo.py'}", "--config.data.dir=/tmp/elsewhere"]
    assert config_value(common, "data.dir") == "/tmp/elsewhere"
    assert config_value(common, "model.num_layers") == 3  # from the file, typed
    with pytest.raises(Exception, match="lamda"):
        config_value([*common, "--config.loss.lamda=1"], "loss.lam")


def test_config_value_imports_configs_package_from_a_plain_script(tmp_path):
    # `python scripts/sweep.py` has scripts/ on sys.path, not the root that `configs.*` lives in.
    code = (
        f"import sys; sys.path[:] = [p for p in sys.path if p not in ('', {str(REPO)!r})]; "
        f"sys.path.insert(0, {str(REPO / 'scripts')!r}); from stages import config_value; "
        f"print(config_value(['--config={REPO / 'configs/numeric.py'}'], 'loss.objective'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == "neighbour"


def test_keep_recorded_records_once_and_never_swaps_a_rebuild(tmp_path):
    """A rebuilt evaluation set that differs from the recorded one stays as built, and the run
    gets one line saying so (results scored on the recorded one then fail the data hash)."""
    root, record = tmp_path / "run", tmp_path / "record"
    path = root / "data" / "numgap_test.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("first build\n")
    assert keep_recorded(path, root, record) is None  # nothing recorded yet: records it
    assert (record / "data" / "numgap_test.jsonl").read_text() == "first build\n"
    assert keep_recorded(path, root, record) is None  # the same bytes: nothing to do
    path.write_text("a rebuild on another machine\n")
    line = keep_recorded(path, root, record)
    assert path.read_text() == "a rebuild on another machine\n"  # not swapped
    assert (record / "data" / "numgap_test.jsonl").read_text() == "first build\n"
    built = provenance.data_hash([path])
    assert "\n" not in line and built in line and "not restored" in line
    assert keep_recorded(path, root, None) is None  # no record: the file stays as built
    assert keep_recorded(root / "missing.jsonl", root, record) is None


def _result(path: Path, block: dict | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    value = {"financebench": {"ndcg_at_10": 0.5}}
    if block is not None:
        value["provenance"] = block
    path.write_text(json.dumps(value))


def test_restore_result_only_with_this_runs_hashes_and_marks_it(tmp_path, capsys):
    root, record = tmp_path / "run", tmp_path / "record"
    block = provenance.stamp(config="c" * 16, data="d" * 16)
    _result(record / "results" / "a.json", block)
    target = root / "results" / "a.json"
    # Another config: not restored, one line naming both hashes and the record's commit.
    assert not restore_result(
        target, root, record, config="x" * 16, data="d" * 16, who="t", restore_unverified=False
    )
    line = capsys.readouterr().out.strip()
    assert line == (f"t: results/a.json not restored: config hash differs (recorded {'c' * 16} "
                    f"at commit {block['commit']}, this run {'x' * 16})")  # fmt: skip
    assert not target.exists()
    assert not restore_result(
        target, root, record, config="c" * 16, data="e" * 16, who="t", restore_unverified=False
    )
    assert "data hash differs" in capsys.readouterr().out
    assert restore_result(
        target, root, record, config="c" * 16, data="d" * 16, who="t", restore_unverified=False
    )
    restored = json.loads(target.read_text())
    assert restored["provenance"] == {**block, "restored": True}
    assert provenance.mark(restored) == f" (restored @{block['commit']})"
    # A restored copy is never recorded back over the original (whose block says computed).
    record_file(target, root, record)
    assert json.loads((record / "results" / "a.json").read_text())["provenance"] == block


def test_a_record_without_provenance_is_refused_unless_asked_then_marked_unknown(tmp_path, capsys):
    root, record = tmp_path / "run", tmp_path / "record"
    _result(record / "results" / "old.json", None)
    target = root / "results" / "old.json"
    assert not restore_result(target, root, record, config="c" * 16, data="d" * 16, who="t",
                              restore_unverified=False)  # fmt: skip
    line = capsys.readouterr().out.strip()
    assert line.startswith("t: results/old.json not restored: config hash unknown (recorded at ")
    assert "--restore_unverified" in line and not target.exists()
    assert restore_result(target, root, record, config="c" * 16, data="d" * 16, who="t",
                          restore_unverified=True)  # fmt: skip
    restored = json.loads(target.read_text())
    assert restored["provenance"]["config_hash"] == "unknown"
    assert provenance.mark(restored) == " (restored, provenance unknown)"
    # ...and a record whose commit is known but whose config hash is not says both.
    _result(record / "results" / "dated.json", {"commit": "010f3d1", "config_hash": "unknown"})
    target = root / "results" / "dated.json"
    assert restore_result(target, root, record, config="c" * 16, data="d" * 16, who="t",
                          restore_unverified=True)  # fmt: skip
    assert provenance.mark(json.loads(target.read_text())) == (
        " (restored @010f3d1, provenance unknown)"
    )


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_stage_ends_with_its_peak_memory(tmp_path, capsys, jobs):
    """The line a stage ends with gives that process's own peak resident memory: a stage that
    holds 600 MiB reports at least that, one that holds nothing reports far less, even when the
    runner itself is large (a test worker: the kernel's ru_maxrss would report the runner's)."""
    big = "import numpy as np, time; a = np.ones(600 * 2**20 // 8); time.sleep(1); print(a.sum())"
    small = "import time; time.sleep(1); print(1)"
    stages = [Stage("big", ("-c", big)), Stage("small", ("-c", small))]
    import numpy as np

    ballast = np.ones(1024 * 2**20 // 8)  # the runner holds 1 GiB, as a busy test worker does
    run_stages(stages, {}, cwd=tmp_path, jobs=jobs, log_dir=tmp_path / "logs")
    del ballast
    out = capsys.readouterr().out
    peaks = {name: float(out.split(f"== {name}: done in ")[1].split("peak memory ")[1].split()[0])
             for name in ("big", "small")}  # fmt: skip
    assert peaks["big"] >= 600 / 1024 and peaks["small"] < 0.3, out


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_stage_a_signal_ends_is_named_and_sigkill_points_at_memory(tmp_path, capsys, jobs):
    """A stage the kernel kills leaves a log cut off mid-line; the runner's line names the
    signal, and for SIGKILL the out-of-memory killer and what to do about it."""
    killed = "import os, signal; print('step 7/100', flush=True); os.kill(os.getpid(), 9)"
    with pytest.raises(subprocess.CalledProcessError) as failure:
        run_stages([Stage("train", ("-c", killed))], {}, cwd=tmp_path, jobs=jobs,
                   log_dir=tmp_path / "logs")  # fmt: skip
    assert failure.value.returncode == -9
    out = capsys.readouterr().out
    assert "== train: FAILED: killed by SIGKILL after" in out
    assert "out-of-memory killer" in out and "--jobs 1" in out
    with pytest.raises(subprocess.CalledProcessError):
        run_stages([Stage("stopped", ("-c", "import os; os.kill(os.getpid(), 15)"))], {},
                   cwd=tmp_path, jobs=jobs, log_dir=tmp_path / "logs")  # fmt: skip
    out = capsys.readouterr().out
    assert "killed by SIGTERM" in out and "out-of-memory" not in out


def test_stamping_never_passes_an_older_result_off_as_computed_now(tmp_path, capsys):
    """A results file an earlier run left in the run folder, scored on other data or made
    without a provenance block, is not stamped with this run's hashes (stamping raises); it is
    set aside with one line instead, and then restored or computed again like a missing one.
    A result computed by this run is stamped as before."""
    from stages import drop_stale, stale_result, stamp_result

    root = tmp_path / "run"
    other = root / "results" / "M" / "numgap.json"  # the evaluator's own block, data X
    _result(other, provenance.stamp(config="evalcfg", data="x" * 16))
    with pytest.raises(ValueError, match="data hash differs"):
        stamp_result(other, config="rowcfg", data="y" * 16)
    assert json.loads(other.read_text())["provenance"]["data_hash"] == "x" * 16  # untouched
    legacy = root / "results" / "M" / "old.json"
    _result(legacy, None)
    with pytest.raises(ValueError, match="no provenance block"):
        stamp_result(legacy, config="rowcfg", data="y" * 16)
    assert "provenance" not in json.loads(legacy.read_text())

    for path in (other, legacy):
        assert drop_stale(path, root, config="rowcfg", data="y" * 16, who="t")
        assert not path.exists() and path.with_name(path.name + ".stale").is_file()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith(
        "t: results/M/numgap.json in the run folder not used (data hash differs (computed "
    )  # fmt: skip
    assert "results/M/old.json" in lines[1] and "no provenance block" in lines[1]

    # Computed by this run: stamped with the row's config hash, the evaluator's kept apart; a
    # rerun accepts it, unless the row's config has changed since.
    now = root / "results" / "N" / "numgap.json"
    _result(now, provenance.stamp(config="evalcfg", data="y" * 16))
    block = stamp_result(now, config="rowcfg", data="y" * 16)["provenance"]
    assert (block["config_hash"], block["eval_config_hash"], block["restored"]) == (
        "rowcfg", "evalcfg", False,
    )  # fmt: skip
    assert stamp_result(now, config="rowcfg", data="y" * 16)["provenance"] == block
    assert stale_result(now, config="rowcfg", data="y" * 16) is None
    assert "config hash differs" in stale_result(now, config="othercfg", data="y" * 16)
    assert stale_result(now, config=None, data="y" * 16) is None  # row hash unknown: data only
    assert not drop_stale(now, root, config="rowcfg", data="y" * 16, who="t") and now.is_file()
    assert not drop_stale(root / "missing.json", root, config="c", data="d", who="t")


def test_a_restored_result_in_the_run_folder_is_held_to_the_restore_rule(tmp_path):
    """A result an earlier run restored stays only while its hashes are this run's (one whose
    hash was never recorded only with `restore_unverified`), and never with `recompute`."""
    from stages import stale_result

    path = tmp_path / "results" / "a.json"
    block = provenance.stamp(config="c" * 16, data="d" * 16)
    _result(path, {**block, "restored": True})
    here = dict(config="c" * 16, data="d" * 16)
    assert stale_result(path, **here) is None
    assert "data hash differs" in stale_result(path, config="c" * 16, data="e" * 16)
    assert "--recompute" in stale_result(path, **here, recompute=True)
    _result(path, {"commit": "010f3d1", "restored": True})  # restored, provenance unknown
    assert "--restore_unverified" in stale_result(path, **here)
    assert stale_result(path, **here, restore_unverified=True) is None
    path.write_text('{"financebench": {"ndcg')  # torn by an older writer
    assert stale_result(path, **here) == "not valid JSON"
