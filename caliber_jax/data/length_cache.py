"""Token lengths of a split, written once beside its data and read back by every later launch.

`caliber_jax.train` needs the token length of every passage and perturbation before its first
step: they decide the length grouping and each batch's padded shape. Tokenizing the corpus is the
launch's largest host cost at scale (the 144,696 training passages of the shared filings and their
68,865 perturbations: 72 CPU-seconds with the Qwen3 tokenizer, BENCHMARKS.md), so the lengths
are kept in `<data.dir>/token_lengths/`, under a name made of what decides them: the passages
file's bytes, the tokenizer's files and max_length. A changed corpus, tokenizer or max_length
gets a new file; a file that does not match its split's row count is ignored.
"""

import dataclasses
import hashlib
import io
import os
from collections.abc import Callable
from typing import Any

import numpy as np
from absl import logging
from etils import epath

from caliber_jax import hub, paths
from caliber_jax.data import pipeline

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


@dataclasses.dataclass(frozen=True)
class Processes:
    """The run's processes as `corpus_lengths` meets them (one process when left as is).

    Attributes:
      index: this process's index.
      count: the number of processes.
      gather: x -> [count, *x.shape], every process's x (all processes call it).
      first: a tree of arrays -> process 0's tree, on every process (all processes call it).
    """

    index: int = 0
    count: int = 1
    gather: Callable[[np.ndarray], np.ndarray] | None = None
    first: Callable[[Any], Any] | None = None


def corpus_lengths(
    source,
    tokenize_fn: Callable[[list[str], int], list[list[int]]],
    *,
    max_length: int,
    cache: epath.Path | None = None,
    processes: Processes = Processes(),
) -> tuple[np.ndarray, np.ndarray]:
    """Token lengths of every x and pi(x) ([N], [N] int64) of `source` (its `len` and
    `read_texts`): each process tokenizes only its 1/P share of the rows, then all processes
    gather the rest. `cache` (`cache_path`): read from there when
    it holds them, else written there (by process 0) once computed.

    Whether the cache holds them is decided once, by process 0, which hands the lengths to the
    others: a process that looked for itself (its own copy of the data, a file another job writes
    meanwhile) could skip the gather the others wait in.
    """
    rows = len(source)
    kept = load(cache, rows) if cache is not None and processes.index == 0 else None
    if cache is not None and processes.count > 1:
        # One collective: process 0's verdict and, when it found them, its lengths.
        both = np.zeros((2, rows), np.int32) if kept is None else np.stack(kept).astype(np.int32)
        found, both = processes.first((np.int32(kept is not None), both))
        kept = (both[0].astype(np.int64), both[1].astype(np.int64)) if int(found) else None
    if kept is not None:
        return kept
    count, index = processes.count, processes.index
    share = -(-rows // count)
    start, stop = min(index * share, rows), min((index + 1) * share, rows)
    mine = np.zeros((2, share), np.int32)
    if stop > start:
        texts, perturbed = source.read_texts(range(start, stop))
        mine[0, : stop - start] = pipeline.token_lengths(tokenize_fn, texts, max_length)
        mine[1, : stop - start] = pipeline.token_lengths(tokenize_fn, perturbed, max_length)
    if count > 1:
        mine = processes.gather(mine)  # [P, 2, share]
        mine = np.transpose(mine, (1, 0, 2)).reshape(2, count * share)
    lengths, pert_lengths = mine[0, :rows].astype(np.int64), mine[1, :rows].astype(np.int64)
    if cache is not None and index == 0:
        try:
            save(cache, lengths, pert_lengths)
        except OSError as error:  # a read-only data dir: tokenize again next launch
            logging.warning("token lengths not kept at %s: %s", cache, error)
    return lengths, pert_lengths
