"""`caliber_jax.mine` pieces: an export cut short is redone, not loaded as bi-enc(i+1)."""

from caliber_jax import export, mine


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
