"""Token lengths of a split, written once beside its data and read back by every later launch.

`caliber_jax.train` needs the token length of every passage and perturbation before its first
step: they decide the length grouping and each batch's padded shape. Tokenizing the corpus is the
launch's largest host cost at scale (the 144,696 training passages of the shared filings and their
68,865 perturbations: 72 CPU-seconds with the Qwen3 tokenizer, BENCHMARKS.md), so the lengths
are kept in `<data.dir>/token_lengths/`, under a name made of what decides them: the passages
file's bytes, the tokenizer's files and max_length. A changed corpus, tokenizer or max_length
gets a new file; a file that does not match its split's row count is ignored.
"""

import hashlib
import io
import os

import numpy as np
from etils import epath

from caliber_jax import hub, paths

DIR = "token_lengths"
# The files that can define a tokenizer directory's output (`tokenization.load_tokenizer`).
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "sentencepiece.bpe.model",
    "spiece.model",
    "tokenizer.model",
)


def cache_path(
    data_dir: str | os.PathLike,
    split: str,
    *,
    passages: str | os.PathLike,
    tokenizer_dir: str | os.PathLike,
    max_length: int,
) -> epath.Path:
    """Where the lengths of `split` (`passages`, tokenized by `tokenizer_dir`'s tokenizer and cut
    at `max_length`) are kept."""
    digest = hashlib.sha256(f"max_length={max_length}\n".encode())
    with paths.as_path(passages).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    tokenizer = paths.as_path(tokenizer_dir)
    if not tokenizer.exists() and hub.parse_hub_id(os.fspath(tokenizer_dir)):
        tokenizer = hub.resolve_model_dir(tokenizer_dir)  # a Hub id: the files of its snapshot
    for name in _TOKENIZER_FILES:
        file = tokenizer / name
        if file.exists():
            digest.update(name.encode())
            digest.update(file.read_bytes())
    return paths.as_path(data_dir) / DIR / f"{split}_{digest.hexdigest()[:16]}.npz"


def load(path: epath.Path, rows: int) -> tuple[np.ndarray, np.ndarray] | None:
    """([N] x, [N] pi(x)) int64 lengths kept at `path`, or None (absent, or not N rows)."""
    if not path.exists():
        return None
    with np.load(io.BytesIO(path.read_bytes())) as saved:
        lengths, pert_lengths = saved["lengths"], saved["pert_lengths"]
    if lengths.shape != (rows,) or pert_lengths.shape != (rows,):
        return None
    return lengths.astype(np.int64), pert_lengths.astype(np.int64)


def save(path: epath.Path, lengths: np.ndarray, pert_lengths: np.ndarray) -> None:
    """Writes the lengths at `path` whole or not at all (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(
        buffer,
        lengths=np.asarray(lengths, np.int32),
        pert_lengths=np.asarray(pert_lengths, np.int32),
    )
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    tmp.write_bytes(buffer.getvalue())
    tmp.rename(path)
