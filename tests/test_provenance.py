"""caliber_jax/provenance.py: hashes, the restore check, the marks, and the records."""

import json
import subprocess
import sys
from pathlib import Path

import ml_collections
import pytest

from caliber_jax import provenance

REPO = Path(__file__).resolve().parents[1]
FIELDS = ("commit", "config_hash", "data_hash", "machine", "date")


def test_config_hash_counts_paths_by_name_and_every_value():
    config = ml_collections.ConfigDict({"data": {"dir": "/run/a/data"}, "optim": {"lr": 1e-4}})
    moved = ml_collections.ConfigDict({"data": {"dir": "/other/b/data"}, "optim": {"lr": 1e-4}})
    assert provenance.config_hash(config) == provenance.config_hash(moved)
    assert provenance.config_hash(config) == provenance.config_hash(config.to_dict())
    config.optim.lr = 2e-4
    assert provenance.config_hash(config) != provenance.config_hash(moved)
    # Flags with paths: the same by name, another file name differs.
    assert provenance.config_hash(["--numgap=/x/numgap_test.jsonl"]) == provenance.config_hash(
        ["--numgap=/y/numgap_test.jsonl"]
    )
    assert provenance.config_hash(["--numgap=/x/numgap_dev.jsonl"]) != provenance.config_hash(
        ["--numgap=/x/numgap_test.jsonl"]
    )


def test_data_hash_follows_the_bytes(tmp_path):
    first, second = tmp_path / "a" / "numgap.jsonl", tmp_path / "b" / "numgap.jsonl"
    for path in (first, second):
        path.parent.mkdir()
        path.write_text('{"id": 1}\n')
    assert provenance.data_hash([first]) == provenance.data_hash([second, None])
    second.write_text('{"id": 2}\n')
    assert provenance.data_hash([first]) != provenance.data_hash([second])
    assert provenance.data_hash([tmp_path / "missing.jsonl"]) != provenance.data_hash([first])


def test_check_refuses_a_known_hash_that_differs_and_an_unknown_one_unless_asked():
    block = {"commit": "abc", "config_hash": "c1", "data_hash": "d1"}
    for unverified in (False, True):
        options = dict(restore_unverified=unverified)
        assert provenance.check({"provenance": block}, config="c1", data="d1", **options) is None
        assert "config hash differs" in provenance.check(
            {"provenance": block}, config="c2", data="d1", **options
        )
        assert "data hash differs" in provenance.check(
            {"provenance": block}, config="c1", data="d2", **options
        )
    # A hash never recorded (records older than these fields, or no block at all): refused
    # with one line that names the way to restore it anyway, restored when asked.
    unknown = {**block, "config_hash": "unknown", "data_hash": "unknown"}
    for recorded in ({"provenance": unknown}, {}):
        reason = provenance.check(recorded, config="c2", data="d2", restore_unverified=False)
        assert reason and "config hash unknown" in reason and "--restore_unverified" in reason
        assert "\n" not in reason
        assert provenance.check(recorded, config="c2", data="d2", restore_unverified=True) is None
    only_data = {**block, "data_hash": "unknown"}
    reason = provenance.check({"provenance": only_data}, config="c1", data="d2",
                              restore_unverified=False)  # fmt: skip
    assert reason.startswith("data hash unknown (recorded at commit abc")


def test_marks_and_summary_lines():
    computed = {"provenance": provenance.stamp(config="c", data="d")}
    restored = {"provenance": provenance.restored(computed)}
    row = {"provenance": {"numgap": computed["provenance"], "mrl": restored["provenance"]}}
    commit = computed["provenance"]["commit"]
    assert provenance.mark(computed) == ""
    assert provenance.mark(restored) == f" (restored @{commit})"
    assert provenance.mark(row) == f" (restored @{commit})"  # restored in part
    lines = provenance.summary_lines({"A": computed, "B": restored, "C": {}}, prefix="x")
    assert lines == ["x: computed now: A, C", f"x: restored from records: B (restored @{commit})"]
    table = provenance.format_table({"A": computed, "B": row})
    assert "| A |  | now |" in table and "| B | mrl | restored |" in table


def test_git_commit_is_head_of_this_checkout():
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    assert provenance.git_commit().split("+")[0] == head


@pytest.mark.parametrize("folder", ["records", "docs"])
def test_git_commit_is_dirty_for_code_not_for_records(tmp_path, folder):
    """A study writes its records into records/ of the checkout it runs from (and a page of docs/
    may be edited beside it): that leaves the code clean; an edit to a tracked code file marks
    the commit '+dirty'."""
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "r.json").write_text("{}")
    (tmp_path / "m.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    head = provenance.git_commit(tmp_path)
    assert len(head) == 12 and "+" not in head
    (tmp_path / folder / "r.json").write_text('{"a": 1}')
    assert provenance.git_commit(tmp_path) == head
    (tmp_path / "m.py").write_text("x = 2\n")
    assert provenance.git_commit(tmp_path) == head + "+dirty"


def test_git_commit_is_dirty_for_an_untracked_module_not_an_ignored_file(tmp_path):
    """A new module not yet committed changes the code as much as an edit does; files the
    checkout ignores (.gitignore: run folders, caches) and new records under records/ do not."""
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / ".gitignore").write_text("runs/\n*.pyc\n")
    (tmp_path / "m.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    head = provenance.git_commit(tmp_path)
    assert "+" not in head
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "m.pyc").write_bytes(b"\0")
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "new_record.json").write_text("{}")
    assert provenance.git_commit(tmp_path) == head
    (tmp_path / "helper.py").write_text("y = 2\n")
    assert provenance.git_commit(tmp_path) == head + "+dirty"


def test_every_record_under_docs_carries_provenance(tmp_path, capsys):
    """Each recorded result (studies and sweep) has the five fields; the records made before
    them say so, are refused with one line unless `restore_unverified`, and then restore marked
    'provenance unknown' with the commit that recorded them."""
    sys.path.insert(0, str(REPO / "scripts"))
    from stages import restore_result

    records = sorted(
        path
        for pattern in ("records/study_mpnet*/results/**/*.json", "records/sweep/**/*.json")
        for path in REPO.glob(pattern)
        if "/drift/" not in path.as_posix()
    )
    assert len(records) >= 80
    for path in records:
        block = json.loads(path.read_text()).get("provenance")
        assert block and all(block.get(field) for field in FIELDS), path
    record = REPO / "records" / "sweep"
    path = tmp_path / "points" / "teacher.json"
    assert not restore_result(path, tmp_path, record, config="c", data="d", who="test",
                              restore_unverified=False)  # fmt: skip
    assert not path.exists()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("test: points/teacher.json not restored: ")
    assert "unknown" in lines[0] and "--restore_unverified" in lines[0]
    assert restore_result(path, tmp_path, record, config="c", data="d", who="test",
                          restore_unverified=True)  # fmt: skip
    commit = json.loads((record / "points" / "teacher.json").read_text())["provenance"]["commit"]
    assert commit != "unknown"
    assert provenance.mark(json.loads(path.read_text())) == (
        f" (restored @{commit}, provenance unknown)"
    )
