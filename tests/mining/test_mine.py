"""`caliber_jax.mine` pieces: an export cut short is redone, not loaded as bi-enc(i+1); each
run's provenance."""

from pathlib import Path

from caliber_jax import export, mine

REPO = Path(__file__).resolve().parents[2]


def test_a_half_written_export_is_redone(tmp_path, monkeypatch):
    """export.export writes config.json before the tokenizer and modules.json; a crash in
    between must not count as a finished export."""
    calls = []

    def crashing_export(workdir, output):
        calls.append(workdir)
        output.mkdir(parents=True, exist_ok=True)
        (output / "config.json").write_text("{}")  # the first file; then the crash
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "export", crashing_export)
    out = tmp_path / "iter_0" / "model"
    try:
        mine.export_student(tmp_path / "train", out)
    except KeyboardInterrupt:
        pass

    def finishing_export(workdir, output):
        calls.append(workdir)
        (output / "modules.json").write_text("[]")
        (output / export.DONE_FILE).write_text("{}")  # written last

    monkeypatch.setattr(export, "export", finishing_export)
    mine.export_student(tmp_path / "train", out)
    assert len(calls) == 2  # the half model was exported again
    mine.export_student(tmp_path / "train", out)
    assert len(calls) == 2  # a finished export is kept


def test_run_provenance_names_the_commit_config_and_filings(tmp_path):
    """results.json and final_eval.json of a mining run carry this block (issue #39)."""
    from caliber_jax import mine_final, provenance
    from configs import mine as mine_config

    config = mine_config.get_config("tiny")
    block = mine_final.run_provenance(config)
    assert block["commit"] == provenance.git_commit() and block["restored"] is False
    assert block["data_hash"] == provenance.data_hash([config.data.filings])
    other = mine_config.get_config("tiny")
    other.train.max_steps += 1
    assert mine_final.run_provenance(other)["config_hash"] != block["config_hash"]
    copy = tmp_path / "filings.jsonl.gz"
    copy.write_bytes((REPO / config.data.filings).read_bytes() + b"\n")
    other = mine_config.get_config("tiny")
    other.data.filings = str(copy)
    assert mine_final.run_provenance(other)["data_hash"] != block["data_hash"]
