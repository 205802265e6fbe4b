"""Encode texts with any HF / sentence-transformers model directory or Hub id.

    python -m caliber_jax.encode --model DIR --input texts.jsonl --output vectors.npy \
        [--text_field text] [--query_task "Given a question, retrieve passages"]

Input: JSONL (.gz) with one object per line (`--text_field`, default "text"), or .txt with one
text per line. Output: `[n, d]` float32 L2-normalised vectors in input order, written atomically.
"""

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from absl import flags

from caliber_jax import cli, paths
from caliber_jax.data import corpus


def read_texts(path: str | os.PathLike, *, text_field: str) -> list[str]:
    """Texts of a JSONL(.gz) file (one per object) or a .txt file (one per non-empty line)."""
    path = Path(path)
    if path.suffix == ".txt":
        lines = path.read_text(encoding="utf-8").splitlines()
        return [line for line in lines if line.strip()]
    texts = []
    for line_number, record in corpus.iter_jsonl(path):  # the file's own line numbers
        value = record.get(text_field)
        if not isinstance(value, str) or not value:
            raise ValueError(f"{path}:{line_number}: field {text_field!r} is missing or not text")
        texts.append(value)
    return texts


def save_npy(path: str | os.PathLike, array: np.ndarray) -> None:
    """Writes a .npy file atomically, with the umask's permissions (`paths.write_atomic`)."""
    paths.write_atomic(path, lambda tmp: _write_npy(tmp, array))


def _write_npy(path: Path, array: np.ndarray) -> None:
    # A file handle: given a path without ".npy", np.save would write to path + ".npy".
    with open(path, "xb") as handle:
        np.save(handle, array)


def main(argv: Sequence[str]) -> None:
    del argv
    from caliber_jax.embedder import Embedder

    values = flags.FLAGS
    texts = read_texts(values.input, text_field=values.text_field)
    model = Embedder.from_pretrained(values.model, pooling=values.pooling, dtype=values.dtype)
    vectors = model.encode(
        texts,
        batch_size=values.batch_size,
        max_length=values.max_length,
        query_task=values.query_task,
        progress=True,
    )
    save_npy(values.output, vectors)
    print(f"{values.output}: {vectors.shape[0]} x {vectors.shape[1]}")


if __name__ == "__main__":
    flags.DEFINE_string(
        "model",
        None,
        "HF / sentence-transformers directory, or Hub id org/name[@revision].",
        required=True,
    )
    flags.DEFINE_string("input", None, "texts.jsonl[.gz] or texts.txt", required=True)
    flags.DEFINE_string("output", None, "vectors.npy to write.", required=True)
    flags.DEFINE_string("text_field", "text", "JSONL field with the text.")
    flags.DEFINE_string("pooling", None, "mean, last or cls (default: the directory's).")
    flags.DEFINE_string("dtype", "float32", "float32 or bfloat16 compute.")
    flags.DEFINE_integer("batch_size", 32, "Texts per forward pass.")
    flags.DEFINE_integer("max_length", None, "Token limit (default: the model's).")
    flags.DEFINE_string("query_task", None, "Qwen3-Embedding query instruction.")
    cli.run(main)
