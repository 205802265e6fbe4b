"""Teacher vectors in a TensorStore zarr3 array, written chunk by chunk with resume markers.

One store holds one `[N, d]` matrix: row i is the teacher vector of text i. Training uses two stores
with the same row order: one for the passages x and one for their perturbations pi(x), where an
empty text ("" = no perturbation) gets a zero row. A store directory holds the zarr3 array
(`zarr.json`, `c/`), a sidecar `metadata.json` and one empty `done/<chunk>` file per chunk whose
write has finished, so a killed job resumes at the first unfinished chunk. Paths may be URLs
(`gs://bucket/data/teacher_train/x`): every file goes through `etils.epath` and the array through
a TensorStore kvstore URL.
"""

import datetime
import hashlib
import json
import os
import struct
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorstore as ts
import tqdm
from etils import epath

from caliber_jax import paths

# Caller metadata every store must carry; the store adds the layout fields itself.
REQUIRED_METADATA = ("teacher", "pooling", "native_dim", "text_hash")
_LAYOUT_FIELDS = ("num_rows", "dim", "dtype", "chunk_rows")
# Fields that may differ between a store and a request to reopen it.
_UNCHECKED_FIELDS = ("created",)
# Caller fields that may differ too: the path of the passages file a store was made from is
# provenance (the texts themselves are `text_hash`), so two prepared folders with the same
# passages share one store; the store keeps the path it was made from.
_PROVENANCE_FIELDS = ("passages",)
_DTYPES = ("float32", "float16", "bfloat16")
_METADATA_FILE = "metadata.json"
_DONE_DIR = "done"


class TeacherStore:
    """An open store for writing: the zarr3 array, its directory and its metadata."""

    def __init__(self, path: epath.Path, array: ts.TensorStore, metadata: dict[str, Any]):
        self.path = path
        self.array = array
        self.metadata = metadata

    @property
    def num_rows(self) -> int:
        return int(self.metadata["num_rows"])

    @property
    def dim(self) -> int:
        return int(self.metadata["dim"])

    @property
    def chunk_rows(self) -> int:
        return int(self.metadata["chunk_rows"])


def text_hash(texts: Iterable[str]) -> str:
    """Returns the sha256 hex digest over length-prefixed UTF-8 texts (order and count matter)."""
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8")
        digest.update(struct.pack("<Q", len(data)))
        digest.update(data)
    return digest.hexdigest()


def mrl_truncate(vectors: np.ndarray, dim: int) -> np.ndarray:
    """Keeps the first `dim` columns (Matryoshka truncation) and L2-normalises each row again.

    Args:
      vectors: [n, D] array.
      dim: target width, 1 <= dim <= D.

    Returns:
      [n, dim] float32; all-zero rows stay zero.
    """
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise ValueError(f"mrl_truncate: expected [n, D] vectors, got shape {vectors.shape}")
    if not 1 <= dim <= vectors.shape[1]:
        raise ValueError(f"mrl_truncate: dim={dim} must be in [1, {vectors.shape[1]}] (width)")
    truncated = vectors[:, :dim]
    norms = np.linalg.norm(truncated, axis=1, keepdims=True)
    return truncated / np.where(norms > 0, norms, 1.0)


def process_rows(
    num_rows: int, chunk_rows: int, process_index: int, process_count: int
) -> tuple[int, int]:
    """Returns the contiguous, chunk-aligned `[start, stop)` rows owned by one process."""
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} not in [0, {process_count})")
    num_chunks = -(-num_rows // chunk_rows)
    first = num_chunks * process_index // process_count
    last = num_chunks * (process_index + 1) // process_count
    return min(first * chunk_rows, num_rows), min(last * chunk_rows, num_rows)


def create_store(
    path: str | os.PathLike,
    *,
    num_rows: int,
    dim: int,
    dtype: str = "float32",
    chunk_rows: int,
    metadata: dict[str, Any],
) -> TeacherStore:
    """Creates a store, or opens an existing one whose metadata matches.

    Args:
      path: store directory (a local path or a URL such as gs://bucket/dir).
      num_rows: N, one row per text.
      dim: d, stored width (after any MRL truncation).
      dtype: one of float32, float16, bfloat16 (readers always return float32).
      chunk_rows: rows per chunk; the unit of writing and resuming.
      metadata: must hold `teacher`, `pooling`, `native_dim` and `text_hash`; extra JSON keys
        (e.g. `prompt`) are kept and checked too.

    Returns:
      The open store.

    Raises:
      ValueError: bad arguments, or the store exists with a different field (named in the message).
    """
    path = paths.as_path(path)
    missing = [key for key in REQUIRED_METADATA if key not in metadata]
    if missing:
        raise ValueError(f"{path}: metadata lacks required fields {missing}")
    if dtype not in _DTYPES:
        raise ValueError(f"{path}: dtype={dtype!r} not in {_DTYPES}")
    if num_rows < 1 or dim < 1 or chunk_rows < 1:
        raise ValueError(
            f"{path}: need num_rows, dim, chunk_rows >= 1, got {num_rows}, {dim}, {chunk_rows}"
        )
    clash = [key for key in _LAYOUT_FIELDS + _UNCHECKED_FIELDS if key in metadata]
    if clash:
        raise ValueError(f"{path}: metadata may not set store-owned fields {clash}")
    full = {
        **metadata,
        "num_rows": int(num_rows),
        "dim": int(dim),
        "dtype": dtype,
        "chunk_rows": int(chunk_rows),
        "created": datetime.datetime.now(datetime.UTC).isoformat(),
    }
    # Compare in JSON form, as stored (tuples become lists).
    full = json.loads(json.dumps(full))
    metadata_path = path / _METADATA_FILE
    if metadata_path.exists():
        existing = _load_metadata(path)
        for key in sorted(set(full) | set(existing)):
            if key in _UNCHECKED_FIELDS + _PROVENANCE_FIELDS:
                continue
            if existing.get(key) != full.get(key):
                raise ValueError(
                    f"{path}: existing teacher store has {key}={existing.get(key)!r}, "
                    f"requested {full.get(key)!r}; delete the folder {path} to rebuild it"
                )
        full = existing
    path.mkdir(parents=True, exist_ok=True)
    (path / _DONE_DIR).mkdir(exist_ok=True)
    array = ts.open(_array_spec(path, num_rows, dim, dtype, chunk_rows), create=True, open=True)
    array = array.result()
    if not metadata_path.exists():
        _write_json_atomic(metadata_path, full)
    return TeacherStore(path, array, full)


def write_rows(path_or_store: str | os.PathLike | TeacherStore, start: int, vectors) -> None:
    """Writes whole chunks of rows starting at `start`, then marks each chunk done.

    Args:
      path_or_store: a store directory or an open `TeacherStore`.
      start: first row; a multiple of `chunk_rows`.
      vectors: [n, d]; `start + n` is a multiple of `chunk_rows` or equals N.
    """
    store = path_or_store if isinstance(path_or_store, TeacherStore) else _open_store(path_or_store)
    vectors = np.asarray(vectors)
    stop = start + (vectors.shape[0] if vectors.ndim else 0)
    if vectors.ndim != 2 or vectors.shape[1] != store.dim:
        raise ValueError(f"{store.path}: vectors shape {vectors.shape}, expected [n, {store.dim}]")
    if start % store.chunk_rows or (stop % store.chunk_rows and stop != store.num_rows):
        raise ValueError(
            f"{store.path}: rows [{start}, {stop}) are not whole chunks of {store.chunk_rows} "
            f"rows (N={store.num_rows})"
        )
    if not 0 <= start < stop <= store.num_rows:
        raise ValueError(f"{store.path}: rows [{start}, {stop}) outside [0, {store.num_rows})")
    if not np.all(np.isfinite(vectors)):
        bad = int(np.nonzero(~np.all(np.isfinite(vectors), axis=1))[0][0]) + start
        raise ValueError(f"{store.path}: non-finite teacher vector at row {bad}")
    data = vectors.astype(store.array.dtype.numpy_dtype)
    store.array[start:stop].write(data).result()
    # A chunk counts as finished only once its data is durably written; the marker comes last.
    for chunk in range(start // store.chunk_rows, -(-stop // store.chunk_rows)):
        (store.path / _DONE_DIR / str(chunk)).touch()


def pending_ranges(
    path: str | os.PathLike, process_index: int = 0, process_count: int = 1
) -> list[tuple[int, int]]:
    """Returns the `[start, stop)` row ranges this process still has to write (merged, sorted)."""
    path = paths.as_path(path)
    metadata = _load_metadata(path)
    num_rows, chunk_rows = int(metadata["num_rows"]), int(metadata["chunk_rows"])
    first, last = process_rows(num_rows, chunk_rows, process_index, process_count)
    done_dir = path / _DONE_DIR
    done = {int(p.name) for p in done_dir.iterdir()} if done_dir.exists() else set()
    ranges: list[tuple[int, int]] = []
    for row in range(first, last, chunk_rows):
        if row // chunk_rows in done:
            continue
        stop = min(row + chunk_rows, num_rows)
        if ranges and ranges[-1][1] == row:
            ranges[-1] = (ranges[-1][0], stop)
        else:
            ranges.append((row, stop))
    return ranges


class TeacherReader:
    """Validated, lazily opened read access: `reader[indices] -> [n, d]` float32.

    Pickles without the TensorStore handle; a copy reopens (and re-validates) on first read.
    """

    def __init__(self, path: epath.Path, metadata: dict[str, Any], expect: dict[str, Any]):
        self.path = path
        self.metadata = metadata
        self._expect = expect
        self._array: ts.TensorStore | None = None

    def __len__(self) -> int:
        return int(self.metadata["num_rows"])

    @property
    def dim(self) -> int:
        return int(self.metadata["dim"])

    def __getitem__(self, indices) -> np.ndarray:
        if self._array is None:
            self._array = _open_validated(self.path, **self._expect)[1]
        if isinstance(indices, (int, np.integer)):
            return np.asarray(self._array[int(indices)].read().result(), dtype=np.float32)
        indices = np.asarray(indices, dtype=np.int64)
        if indices.ndim != 1:
            raise ValueError(f"{self.path}: indices must be 1-D, got shape {indices.shape}")
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            raise ValueError(f"{self.path}: row index out of range [0, {len(self)})")
        rows = self._array.oindex[indices].read().result()
        return np.asarray(rows, dtype=np.float32)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_array": None}


def open_reader(
    path: str | os.PathLike,
    *,
    expect_rows: int,
    expect_dim: int,
    expect_hash: str | None = None,
) -> TeacherReader:
    """Opens a finished store for reading after checking it against what the caller expects.

    Raises:
      ValueError: naming the path, field, expected and found values, when row count, dim, dtype
        or text hash differ, or when chunks are still unwritten.
    """
    path = paths.as_path(path)
    expect = {"expect_rows": expect_rows, "expect_dim": expect_dim, "expect_hash": expect_hash}
    metadata, _ = _open_validated(path, **expect)
    return TeacherReader(path, metadata, expect)


def embed_to_store(
    encode_fn: Callable[[list[str]], np.ndarray],
    texts: Sequence[str],
    path: str | os.PathLike,
    *,
    batch_rows: int,
    dim: int,
    chunk_rows: int,
    dtype: str = "float32",
    process_index: int,
    process_count: int,
    metadata: dict[str, Any],
    known: Mapping[str, np.ndarray] | None = None,
) -> TeacherStore:
    """Encodes this process's unfinished chunks of `texts` and writes them (resumable).

    Empty texts are not encoded; their rows stay zero (the "no perturbation" rows of a pi(x)
    store). Every process calls this with the same arguments; each writes only its own rows.

    Args:
      encode_fn: list of texts -> [n, D] float32, L2-normalised, D = metadata["native_dim"].
      texts: all N texts, in row order.
      path: store directory.
      batch_rows: texts per `encode_fn` call.
      dim: stored width d <= D (MRL truncation + renormalisation when d < D).
      chunk_rows: rows per chunk (write/resume unit).
      dtype: stored dtype.
      process_index: this process, in [0, process_count).
      process_count: number of processes sharing the job.
      metadata: `teacher`, `pooling`, `native_dim` and optional extra keys; `text_hash` is
        computed here.
      known: text -> its stored [d] vector from the same teacher (`known_vectors`); those texts
        are copied, not encoded.

    Returns:
      The store.
    """
    texts = list(texts)
    known = known or {}
    store = _create_for_texts(path, texts, dim=dim, dtype=dtype, chunk_rows=chunk_rows,
                              metadata=metadata)  # fmt: skip
    native_dim = int(store.metadata["native_dim"])
    pending = pending_ranges(path, process_index, process_count)
    first, last = process_rows(len(texts), chunk_rows, process_index, process_count)
    todo = sum(stop - start for start, stop in pending)
    with tqdm.tqdm(total=last - first, initial=last - first - todo, unit="row") as progress:
        for range_start, range_stop in pending:
            for start in range(range_start, range_stop, chunk_rows):
                stop = min(start + chunk_rows, range_stop)
                vectors = np.zeros((stop - start, dim), np.float32)
                rows = []
                for i in range(start, stop):
                    if texts[i] in known:
                        vectors[i - start] = known[texts[i]]
                    elif texts[i]:
                        rows.append(i)
                for offset in range(0, len(rows), batch_rows):
                    batch = rows[offset : offset + batch_rows]
                    encoded = np.asarray(encode_fn([texts[i] for i in batch]), np.float32)
                    if encoded.shape != (len(batch), native_dim):
                        raise ValueError(
                            f"{path}: encode_fn returned shape {encoded.shape}, expected "
                            f"({len(batch)}, {native_dim})"
                        )
                    vectors[np.asarray(batch) - start] = mrl_truncate(encoded, dim)
                write_rows(store, start, vectors)
                progress.update(stop - start)
    return store


# What must agree for a stored vector to stand for a new encoding of the same text.
REUSE_FIELDS = ("teacher", "pooling", "native_dim", "max_length", "compute_dtype", "backend")


def known_vectors(
    path: str | os.PathLike, texts: Sequence[str], *, dim: int, expect: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """Text -> stored vector of the finished store at `path`, whose rows are `texts`.

    For reuse when data is prepared again (e.g. a changed perturbation rule): the rows whose
    text is unchanged need no new encoding.

    Raises:
      ValueError: naming the path and field, when the store's text hash, dim or any of
        REUSE_FIELDS (as in `expect`) differs.
    """
    reader = open_reader(path, expect_rows=len(texts), expect_dim=dim, expect_hash=text_hash(texts))
    for field in REUSE_FIELDS:
        if reader.metadata.get(field) != expect.get(field):
            raise ValueError(
                f"{path}: cannot reuse teacher vectors: {field} is "
                f"{reader.metadata.get(field)!r}, this run's is {expect.get(field)!r}"
            )
    rows = [i for i, text in enumerate(texts) if text]
    vectors = reader[np.asarray(rows, np.int64)] if rows else np.zeros((0, dim), np.float32)
    return {texts[i]: vector for i, vector in zip(rows, vectors, strict=True)}


def import_npy(
    path: str | os.PathLike,
    *,
    vectors_npy: str | os.PathLike,
    texts: Sequence[str],
    dim: int | None,
    chunk_rows: int,
    dtype: str = "float32",
    metadata: dict[str, Any],
    process_index: int = 0,
    process_count: int = 1,
) -> TeacherStore:
    """Stores vectors computed elsewhere (e.g. an API teacher) as a checked teacher store.

    Rows are L2-normalised (and MRL-truncated when `dim` is given); rows of empty texts are
    written as zeros whatever the file holds. Every process calls this with the same arguments;
    each writes (and checks) only its own rows, as `embed_to_store` does.

    Args:
      path: store directory.
      vectors_npy: `.npy` file with [N, D] vectors, row i for texts[i].
      texts: the N texts, in row order.
      dim: stored width, or None to keep D.
      chunk_rows: rows per chunk.
      dtype: stored dtype.
      metadata: `teacher`, `pooling` and optional extra keys; `native_dim` defaults to D and
        `text_hash` is computed here.
      process_index: this process, in [0, process_count).
      process_count: number of processes sharing the job.

    Returns:
      The store.
    """
    texts = list(texts)
    vectors = load_npy_checked(vectors_npy, num_rows=len(texts), dim=dim)
    native_dim = vectors.shape[1]
    if int(metadata.get("native_dim", native_dim)) != native_dim:
        raise ValueError(
            f"{vectors_npy}: native_dim={native_dim}, metadata says {metadata['native_dim']}"
        )
    dim = native_dim if dim is None else dim
    store = _create_for_texts(path, texts, dim=dim, dtype=dtype, chunk_rows=chunk_rows,
                              metadata={**metadata, "native_dim": native_dim})  # fmt: skip
    for start, stop in pending_ranges(path, process_index, process_count):
        for chunk_start in range(start, stop, chunk_rows):
            chunk_stop = min(chunk_start + chunk_rows, stop)
            block = np.asarray(vectors[chunk_start:chunk_stop], dtype=np.float32)
            present = np.array([bool(t) for t in texts[chunk_start:chunk_stop]])
            norms = np.linalg.norm(block, axis=1)
            bad = present & ~(np.isfinite(norms) & (norms > 0))
            if bad.any():
                row = chunk_start + int(np.nonzero(bad)[0][0])
                raise ValueError(f"{vectors_npy}: row {row} is zero or non-finite")
            block = np.where(present[:, None], block, 0.0)
            write_rows(store, chunk_start, mrl_truncate(block, dim))
    return store


def load_npy_checked(vectors_npy: str | os.PathLike, *, num_rows: int, dim: int | None):
    """The [N, D] vectors of a `.npy` file (memory-mapped), checked before any store is made.

    Args:
      vectors_npy: the file.
      num_rows: N, the number of texts.
      dim: the width they will be truncated to (D >= dim), or None for any D.

    Raises:
      ValueError: one line naming the file, its shape and the shape needed.
    """
    vectors = np.load(vectors_npy, mmap_mode="r")
    shape = vectors.shape
    if vectors.ndim != 2:
        raise ValueError(f"{vectors_npy}: shape {shape}, expected [N, D] vectors")
    if shape[0] != num_rows:
        raise ValueError(
            f"{vectors_npy}: shape {shape}: num_rows={shape[0]} but {num_rows} texts were given "
            f"(one row per text)"
        )
    if dim is not None and dim > shape[1]:
        raise ValueError(
            f"{vectors_npy}: shape {shape}: {shape[1]} columns, but dim={dim} needs at least "
            f"{dim} (MRL truncation keeps the first dim columns)"
        )
    return vectors


def _create_for_texts(path, texts, *, dim, dtype, chunk_rows, metadata) -> TeacherStore:
    """`create_store` for the rows of `texts`, recording (and checking) their text hash."""
    digest = text_hash(texts)
    if metadata.get("text_hash", digest) != digest:
        raise ValueError(f"{path}: metadata text_hash {metadata['text_hash']} != texts {digest}")
    return create_store(
        path,
        num_rows=len(texts),
        dim=dim,
        dtype=dtype,
        chunk_rows=chunk_rows,
        metadata={**metadata, "text_hash": digest},
    )


def _array_spec(path: epath.Path, num_rows: int, dim: int, dtype: str, chunk_rows: int) -> dict:
    # Each write chunk is one shard file holding single-row inner chunks, so whole-chunk writes
    # are one file each while random row reads fetch only the rows they need.
    return {
        "driver": "zarr3",
        "kvstore": paths.kvstore_spec(path),
        "metadata": {
            "shape": [num_rows, dim],
            "data_type": dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk_rows, dim]}},
            "codecs": [
                {
                    "name": "sharding_indexed",
                    "configuration": {
                        "chunk_shape": [1, dim],
                        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                        "index_codecs": [
                            {"name": "bytes", "configuration": {"endian": "little"}},
                            {"name": "crc32c"},
                        ],
                    },
                }
            ],
            "fill_value": 0.0,
        },
    }


def _load_metadata(path: epath.Path) -> dict[str, Any]:
    metadata_path = path / _METADATA_FILE
    if not metadata_path.exists():
        raise ValueError(f"{path}: not a teacher store ({_METADATA_FILE} missing)")
    return json.loads(metadata_path.read_text(encoding="utf-8"))


def _write_json_atomic(path: epath.Path, data: dict[str, Any]) -> None:
    # Write-then-rename: a reader never sees half a file (a rename on a local disk is atomic).
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
    tmp.replace(path)


def _open_store(path: str | os.PathLike) -> TeacherStore:
    path = paths.as_path(path)
    metadata = _load_metadata(path)
    spec = {"driver": "zarr3", "kvstore": paths.kvstore_spec(path)}
    return TeacherStore(path, ts.open(spec, open=True).result(), metadata)


def _open_validated(
    path: epath.Path, *, expect_rows: int, expect_dim: int, expect_hash: str | None
) -> tuple[dict[str, Any], ts.TensorStore]:
    store = _open_store(path)
    found = store.metadata
    checks = [
        ("num_rows", expect_rows, found["num_rows"]),
        ("dim", expect_dim, found["dim"]),
        ("array shape", [found["num_rows"], found["dim"]], list(store.array.shape)),
        ("dtype", found["dtype"], str(store.array.dtype.numpy_dtype)),
    ]
    if expect_hash is not None:
        checks.append(("text_hash", expect_hash, found["text_hash"]))
    for field, expected, value in checks:
        if expected != value:
            raise ValueError(
                f"{path}: teacher {field} mismatch: expected {expected!r}, found {value!r}"
            )
    missing = pending_ranges(path)
    if missing:
        raise ValueError(f"{path}: teacher store incomplete, rows {missing} not written yet")
    return found, store.array
