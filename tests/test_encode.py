"""The encode CLI writes the same vectors as the Embedder API, in input order."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from caliber_jax import Embedder
from caliber_jax.encode import read_texts, save_npy


def test_cli_matches_api(minilm_dir, filing_passages, tmp_path):
    texts = filing_passages[:6]
    source = tmp_path / "texts.jsonl"
    source.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "vecs.npy"
    result = subprocess.run(
        [sys.executable, "-m", "caliber_jax.encode", f"--model={minilm_dir}",
         f"--input={source}", f"--output={out}", "--batch_size=4"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    expected = Embedder.from_pretrained(minilm_dir).encode(texts)
    np.testing.assert_allclose(np.load(out), expected, atol=1e-6)


def test_bad_input_names_file_and_line(tmp_path):
    source = tmp_path / "bad.jsonl"
    source.write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: field 'text'"):
        read_texts(source, text_field="text")
    source.write_text('{"text": "fine"}\n\n\n\n{"body": "after blank lines"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:5: field 'text'"):  # the file's line
        read_texts(source, text_field="text")
    lines = tmp_path / "t.txt"
    lines.write_text("one\n\ntwo\n")
    assert read_texts(lines, text_field="text") == ["one", "two"]


def test_save_npy_follows_the_umask(tmp_path):
    """Under umask 022 the vectors are 0644, not the 0600 of a `tempfile.mkstemp` file, and no
    temporary file stays behind."""
    previous = os.umask(0o022)
    try:
        save_npy(tmp_path / "v.npy", np.eye(3, dtype=np.float32))
    finally:
        os.umask(previous)
    assert (tmp_path / "v.npy").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["v.npy"]
    np.testing.assert_array_equal(np.load(tmp_path / "v.npy"), np.eye(3))
