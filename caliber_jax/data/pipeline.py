"""Grain input pipeline: passages, perturbations and teacher rows joined by index, batched as numpy.

Each epoch's batch order is a pure function of (seed, epoch): a seeded permutation, optional
length grouping (sort windows of several batches by token length, cut batches, shuffle the batch
order), then every process takes its slice of each global batch. Grain runs the per-batch work
(tokenize, pad, read teacher rows) in threads or worker processes and gives a checkpointable
iterator whose state is the index of the next batch.
"""

import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import grain
import numpy as np

from caliber_jax import paths
from caliber_jax.data import corpus, padding, teacher

# tokenize_fn(texts, max_length) -> token ids per text, special tokens included, truncated.
TokenizeFn = Callable[[list[str], int], list[list[int]]]
# Texts per tokenize_fn call when measuring the corpus's token lengths.
_TOKENIZE_ROWS = 4096


def load_neighbours(
    path: str | os.PathLike, *, field: str = "neighbour", num_rows: int | None = None
) -> np.ndarray | None:
    """The optional "neighbour" field of a passages file (`prepare.mine_neighbours`), or another
    `field` naming rows of another file of `num_rows` rows ("train_neighbour" of a validation
    file: rows of train.jsonl, `prepare.mine_heldout_neighbours`).

    Returns:
      [N] int64 row index of each passage's neighbour (in the same file unless `num_rows` is
      given), -1 where it is null, or None when no record has the field.
    """
    path = paths.as_path(path)
    values = read_optional_field(path, field)
    if values is None:
        return None
    found: list[int] = []
    for line_number, neighbour in values:
        if neighbour is not None and (not isinstance(neighbour, int) or neighbour < 0):
            raise ValueError(f"{path}:{line_number}: field {field!r} must be a row or null")
        found.append(-1 if neighbour is None else neighbour)
    neighbours = np.asarray(found, dtype=np.int64)
    limit = len(neighbours) if num_rows is None else num_rows
    if neighbours.max(initial=-1) >= limit:
        raise ValueError(f"{path}: {field} row {neighbours.max()} >= {limit} rows")
    return neighbours


def load_queries(path: str | os.PathLike) -> list[str] | None:
    """The optional "query" field of a passages file (`prepare.make_queries`): per row, a
    training question about that passage (str), "" where it has none; None when no record has
    the field."""
    path = paths.as_path(path)
    values = read_optional_field(path, "query")
    if values is None:
        return None
    found: list[str] = []
    for line_number, query in values:
        if query is not None and not isinstance(query, str):
            raise ValueError(f"{path}:{line_number}: field 'query' must be str or null")
        found.append(query or "")
    return found


def read_optional_field(path, field: str) -> list[tuple[int, Any]] | None:
    """(line number, value or None) of `field` for every record of a JSONL file; None when no
    record has the field."""
    values = []
    present = False
    for line_number, record in corpus.iter_jsonl(path):  # errors name the file and line
        present |= field in record
        values.append((line_number, record.get(field)))
    return values if present else None


def load_passages(path: str | os.PathLike) -> tuple[list[str], list[str]]:
    """Reads a passages `.jsonl` (or `.jsonl.gz`) with fields id, text, perturbed (str or null).

    Returns:
      (texts, perturbed), row-aligned; a passage without a perturbation gets "".
    """
    path = paths.as_path(path)
    texts: list[str] = []
    perturbed: list[str] = []
    # Through epath, so a gs:// data dir streams like a local one; errors name the file and line.
    for line_number, record in corpus.iter_jsonl(path):
        text, pert = record.get("text"), record.get("perturbed")
        if not isinstance(text, str) or not text:
            raise ValueError(f"{path}:{line_number}: field 'text' must be a non-empty string")
        if pert is not None and not isinstance(pert, str):
            raise ValueError(f"{path}:{line_number}: field 'perturbed' must be str or null")
        texts.append(text)
        perturbed.append(pert or "")
    if not texts:
        raise ValueError(f"{path}: no passages")
    return texts, perturbed


class PassageTexts:
    """The texts of a passages file, read as `TrainSource` reads them (`len`, `read_texts`),
    without teacher stores: what token lengths need before the teacher has run."""

    def __init__(self, passages_path: str | os.PathLike):
        self.texts, self.perturbed = load_passages(paths.as_path(passages_path))

    def __len__(self) -> int:
        return len(self.texts)

    def read_texts(self, indices: Sequence[int]) -> tuple[list[str], list[str]]:
        """(texts, perturbed) of the rows; "" where a row has no perturbation."""
        return [self.texts[i] for i in indices], [self.perturbed[i] for i in indices]


class TrainSource:
    """Random-access rows {text, perturbed, has_pert, teacher_x, teacher_px, index}.

    The teacher stores are checked (row count, dim, text hash) when the source is built and again
    when a worker first reads them. Pickling drops the texts and TensorStore handles, so a worker
    process reloads the passages file and verifies its hash before use.
    """

    def __init__(
        self,
        passages_path: str | os.PathLike,
        *,
        teacher_x_path: str | os.PathLike,
        teacher_px_path: str | os.PathLike | None,
        dim: int,
        neighbour_source: "TrainSource | None" = None,
        teacher_q_path: str | os.PathLike | None = None,
    ):
        """Builds the source.

        Args:
          passages_path: passages `.jsonl[.gz]`, row i = passage i.
          teacher_x_path: teacher store of the passages (row i = t(x_i)).
          teacher_px_path: teacher store of the perturbations (row i = t(pi(x_i)), zero when
            there is none); None only when no passage has a perturbation.
          dim: d, the width the student projects to.
          neighbour_source: the source whose rows a "train_neighbour" field names (the training
            split, for a validation split); its teacher x store gives the neighbour vectors.
            Used only when the passages have no "neighbour" field of their own.
          teacher_q_path: teacher store of the passages' training queries (row i = t(q_i), zero
            where row i has none); the queries (field "query") are read only with it.
        """
        self.passages_path = paths.as_path(passages_path)
        texts, perturbed = load_passages(self.passages_path)
        self._texts: list[str] | None = texts
        self._perturbed: list[str] | None = perturbed
        self._hashes = (teacher.text_hash(texts), teacher.text_hash(perturbed))
        self.num_rows = len(texts)
        self.dim = dim
        self.teacher_x = teacher.open_reader(
            teacher_x_path, expect_rows=self.num_rows, expect_dim=dim, expect_hash=self._hashes[0]
        )
        if teacher_px_path is None:
            if any(perturbed):
                raise ValueError(
                    f"{self.passages_path}: {sum(map(bool, perturbed))} passages have a "
                    "perturbation but teacher_px_path is None"
                )
            self.teacher_px = None
        else:
            self.teacher_px = teacher.open_reader(
                teacher_px_path,
                expect_rows=self.num_rows,
                expect_dim=dim,
                expect_hash=self._hashes[1],
            )
        # Neighbours in this file ("neighbour") or in another split's ("train_neighbour").
        self.neighbours = load_neighbours(self.passages_path)
        self.neighbour_x = self.teacher_x
        if self.neighbours is None and neighbour_source is not None:
            if neighbour_source.dim != dim:
                raise ValueError(
                    f"{self.passages_path}: neighbour source {neighbour_source.passages_path} "
                    f"has dim {neighbour_source.dim}, expected {dim}"
                )
            self.neighbour_x = neighbour_source.teacher_x
            self.neighbours = load_neighbours(
                self.passages_path, field="train_neighbour", num_rows=neighbour_source.num_rows
            )
        self.queries, self.teacher_q = None, None
        if teacher_q_path is not None:
            self.queries = load_queries(self.passages_path)
            if self.queries is None:
                raise ValueError(f"{self.passages_path}: no 'query' field for {teacher_q_path}")
            self.teacher_q = teacher.open_reader(
                teacher_q_path,
                expect_rows=self.num_rows,
                expect_dim=dim,
                expect_hash=teacher.text_hash(self.queries),
            )
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.num_rows

    def __getitem__(self, index: int) -> dict[str, Any]:
        texts, perturbed = self.read_texts([index])
        teacher_x, teacher_px = self.read_teacher(np.array([index]))
        return {
            "text": texts[0],
            "perturbed": perturbed[0],
            "has_pert": bool(perturbed[0]),
            "teacher_x": teacher_x[0],
            "teacher_px": teacher_px[0],
            "index": int(index),
        }

    def read_texts(self, indices: Sequence[int]) -> tuple[list[str], list[str]]:
        """Returns (texts, perturbed) for the rows; "" where a row has no perturbation."""
        texts, perturbed = self._loaded()
        return [texts[i] for i in indices], [perturbed[i] for i in indices]

    def read_teacher(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Returns teacher rows ([n, d] x, [n, d] pi(x)) float32; pi(x) rows are 0 if absent."""
        teacher_x = self.teacher_x[indices]
        if self.teacher_px is None:
            return teacher_x, np.zeros_like(teacher_x)
        return teacher_x, self.teacher_px[indices]

    def read_neighbours(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Returns ([n, d] float32 teacher vectors of the rows' neighbours, [n] bool has one).

        Rows without a neighbour get zeros. Only for sources whose passages name neighbours.
        """
        rows = self.neighbours[indices]
        has_nb = rows >= 0
        teacher_nb = self.neighbour_x[np.where(has_nb, rows, 0)]
        teacher_nb[~has_nb] = 0.0
        return teacher_nb, has_nb

    def read_queries(self, indices: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(query texts, "" where none; [n, d] float32 teacher vectors, 0 where none; [n] bool
        has one) of the rows. Only for sources built with `teacher_q_path`."""
        texts = [self.queries[i] for i in indices]
        has_q = np.array([bool(text) for text in texts])
        vectors = self.teacher_q[indices]
        vectors[~has_q] = 0.0
        return texts, vectors, has_q

    def _loaded(self) -> tuple[list[str], list[str]]:
        with self._lock:
            if self._texts is None:
                texts, perturbed = load_passages(self.passages_path)
                if (teacher.text_hash(texts), teacher.text_hash(perturbed)) != self._hashes:
                    raise ValueError(
                        f"{self.passages_path}: file changed since the source was built"
                    )
                self._texts, self._perturbed = texts, perturbed
            return self._texts, self._perturbed

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_texts": None, "_perturbed": None, "_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())


def batches_per_epoch(num_rows: int, *, batch_size: int, drop_remainder: bool) -> int:
    """Returns the number of global batches in one epoch."""
    return num_rows // batch_size if drop_remainder else -(-num_rows // batch_size)


def make_epoch_batches(
    lengths: np.ndarray,
    *,
    batch_size: int,
    seed: int,
    epoch: int,
    shuffle: bool,
    length_group_window: int,
    drop_remainder: bool,
) -> np.ndarray:
    """Returns one epoch's global batches as row indices, a pure function of (seed, epoch).

    Args:
      lengths: [N] grouping key per row.
      batch_size: B, global.
      seed: base seed.
      epoch: epoch number; each epoch gets its own permutation.
      shuffle: permute rows and batches; False keeps row order.
      length_group_window: W; if > 1, each run of W*B consecutive (shuffled) rows is sorted by
        length before cutting batches, so batches hold rows of similar length. 1 disables it.
      drop_remainder: drop the last N % B rows instead of padding their batch with -1.

    Returns:
      [num_batches, B] int64; -1 marks padding slots (only in the last batch).
    """
    num_rows = len(lengths)
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(num_rows) if shuffle else np.arange(num_rows)
    if length_group_window > 1:
        window = length_group_window * batch_size
        order = np.concatenate(
            [
                part[np.argsort(lengths[part], kind="stable")]
                for part in np.split(order, range(window, num_rows, window))
            ]
        )
    num_full = num_rows // batch_size
    batches = order[: num_full * batch_size].reshape(num_full, batch_size)
    if shuffle:
        # Grouped batches come out sorted by length within each window; mix their order.
        batches = batches[rng.permutation(num_full)]
    remainder = order[num_full * batch_size :]
    if remainder.size and not drop_remainder:
        last = np.full((1, batch_size), -1, dtype=np.int64)
        last[0, : remainder.size] = remainder
        batches = np.concatenate([batches, last])
    return batches.astype(np.int64)


def make_batch_fn(
    source: TrainSource,
    *,
    batch_size: int,
    seed: int,
    shuffle: bool,
    process_index: int,
    process_count: int,
    tokenize_fn: TokenizeFn,
    max_length: int,
    pad_id: int,
    pad_to_multiple: int,
    length_group_window: int,
    drop_remainder: bool,
    pert_rows_multiple: int = 0,
    bucket_growth: float = 1.0,
    pack_length: int = 0,
    pack_rows_multiple: int = 1,
    pack_rungs: int = 0,
    pack_first_steps: int = 0,
    process_rows: np.ndarray | None = None,
    lengths: tuple[np.ndarray, np.ndarray] | None = None,
    query_length: int = 32,
) -> "_LoadBatch":
    """The map from a global step to this process's batch that `make_loader` iterates, as a
    picklable callable; `.geometry(step)` gives the integers that decide that batch's array
    shapes without tokenizing or reading anything (to compile a step program ahead of time).
    The batch layouts are described in `make_loader`.

    Args:
      source: the rows.
      batch_size: B, global; divisible by `process_count`.
      seed: shuffle seed.
      shuffle: shuffle rows and batches each epoch.
      process_index: this host, in [0, process_count).
      process_count: number of hosts.
      tokenize_fn: texts, max_length -> ids per text (special tokens included, truncated);
        must be deterministic and picklable when `worker_count > 0`.
      max_length: longest allowed sequence.
      pad_id: id used for padding.
      pad_to_multiple: the first rung of the bucket ladder; every rung is a multiple of it.
      length_group_window: W batches sorted together by length; 1 disables grouping.
      drop_remainder: drop the incomplete last batch of each epoch instead of padding it.
      pert_rows_multiple: 0 keeps the "stacked" layout (`make_loader`). m > 0 gives the "compact"
        layout: pert_input_ids and pert_attention_mask hold only this
        process's perturbed rows, [p, T'] with p = the largest per-process count of perturbed rows
        in the global batch rounded up to m (at most b, so every process has the same shape),
        padding rows encoding "" as the stacked layout's dummies do; T' comes from the global
        batch's perturbed rows. A new key pert_index [p] int32 gives each row's position in the
        global batch (B on padding rows). The forward then runs B + P rows instead of 2B. Keep m a
        multiple of the local device count so that P shards evenly.
      bucket_growth: ratio between consecutive padded lengths (1 = every multiple of
        `pad_to_multiple`; 1.5 = a handful of rungs, hence of compiled programs).
      pack_length: 0 keeps the padded layouts. L > 0 gives the "packed" layout: this
        process's x and existing pi(x) sequences are packed end to end (first-fit decreasing)
        into rows of L tokens, replacing input_ids, attention_mask and the pert_* arrays with
        packed_ids [r, L] (pad_id where empty), packed_slots [r, L] (the pooled vector each
        token belongs to: global batch position g for x, B + g for its pi(x), 2B for padding)
        and packed_positions [r, L] (position within its sequence). Needs L >= max_length.
        The row count r is one of a fixed ladder of counts, the same on every process
        (`pack_ladder`): each batch keeps its B passages and takes the smallest rung its
        packing fits.
      pack_rows_multiple: r is a multiple of this; keep it a multiple of the local device count.
      pack_rungs: the packed layout's row counts drawn from the data, >= 1
        (`padding.row_ladder`): the `pack_rungs` counts that pad epoch 0's batches least (so
        epoch 0 meets at most `pack_rungs` shapes), then a fallback of 2b rows (b = B / P: one
        sequence per row), which any batch fits, for a later epoch's batch that needs more
        rows than any of epoch 0's.
      pack_first_steps: the packed layout's epoch 0 starts with up to this many batches of about
        one size, all at one row count, so that the other counts' programs compile while those
        steps run (`compile_ahead`) instead of a step waiting for them. They are chosen by their
        packing as one whole batch, so the order depends on the data and the seed alone (the
        same on any devices and processes): batches of that packing's most common rung, closest
        to its most common row count first (`padding.central_first_order`: they move ahead,
        every other batch keeps its order after them); each takes the largest rung any of them
        needs here. Later epochs keep their shuffled order. 0 = epoch 0's plain order.
      process_rows: [process_count, b] global batch positions of each process's rows, as the
        device mesh places them (`sharding.process_batch_rows`); None = contiguous blocks in
        process order. Process p reads the planned batch's rows at process_rows[p], so the
        global batch and `pert_index` are the same for any device order.
      lengths: ([N] x, [N] pi(x)) token lengths as `token_lengths` computes them, e.g. each
        process tokenizing only its share and gathering the rest; None tokenizes everything here.
      query_length: sources with training queries: each row's query is truncated and padded to
        this many tokens (one shape for every batch).
    """
    if batch_size < 1 or batch_size % process_count:
        raise ValueError(f"batch_size={batch_size} must be a positive multiple of {process_count=}")
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} not in [0, {process_count})")
    if pert_rows_multiple < 0:
        raise ValueError(f"pert_rows_multiple={pert_rows_multiple} must be >= 0 (0 = stacked)")
    if pack_length and (pack_length < max_length or pack_rows_multiple < 1 or pack_rungs < 1):
        raise ValueError(
            f"pack_length={pack_length} must be 0 (off) or >= max_length={max_length}, with "
            f"pack_rows_multiple={pack_rows_multiple} >= 1 and pack_rungs={pack_rungs} >= 1"
        )
    if pack_first_steps < 0 or (pack_first_steps and not pack_length):
        raise ValueError(f"pack_first_steps={pack_first_steps} needs >= 0 and the packed layout")
    if pad_to_multiple < 1 or max_length < 1 or length_group_window < 1:
        raise ValueError(
            f"need pad_to_multiple, max_length, length_group_window >= 1, got {pad_to_multiple}, "
            f"{max_length}, {length_group_window}"
        )
    per_epoch = batches_per_epoch(len(source), batch_size=batch_size, drop_remainder=drop_remainder)
    if per_epoch == 0:
        raise ValueError(f"{len(source)} rows give no batch of {batch_size} with drop_remainder")
    local = batch_size // process_count
    if process_rows is None:
        process_rows = np.arange(batch_size).reshape(process_count, local)
    process_rows = np.asarray(process_rows, dtype=np.int64)
    if process_rows.shape != (process_count, local) or sorted(process_rows.ravel()) != list(
        range(batch_size)
    ):
        raise ValueError(
            f"process_rows must split the {batch_size} batch rows into {process_count} x {local}, "
            f"got shape {process_rows.shape}"
        )
    texts, perturbed = source.read_texts(range(len(source)))
    if lengths is None:
        lengths = (
            token_lengths(tokenize_fn, texts, max_length),
            token_lengths(tokenize_fn, perturbed, max_length),
        )
    lengths, pert_lengths = (np.asarray(part, dtype=np.int64) for part in lengths)
    if lengths.shape != pert_lengths.shape or len(lengths) != len(source):
        raise ValueError(f"lengths must be two [{len(source)}] arrays")
    load_batch = _LoadBatch(
        source,
        lengths=lengths,
        pert_lengths=pert_lengths,
        per_epoch=per_epoch,
        batch_size=batch_size,
        seed=seed,
        shuffle=shuffle,
        length_group_window=length_group_window,
        drop_remainder=drop_remainder,
        process_index=process_index,
        process_count=process_count,
        tokenize_fn=tokenize_fn,
        max_length=max_length,
        pad_id=pad_id,
        pad_to_multiple=pad_to_multiple,
        pert_rows_multiple=pert_rows_multiple,
        pack_length=pack_length,
        buckets=padding.bucket_lengths(max_length, multiple=pad_to_multiple, growth=bucket_growth),
        process_rows=process_rows,
        has_pert=np.array([bool(text) for text in perturbed]),
        query_length=query_length,
    )
    if pack_length:
        needed = [load_batch.rows_needed(step) for step in range(per_epoch)]
        load_batch.pack_ladder = padding.row_ladder(
            needed, rungs=pack_rungs, worst=2 * local, multiple=pack_rows_multiple
        )
        if pack_first_steps:
            # Which batches lead depends on the data and the seed alone, never on the devices or
            # processes (they change the row counts: `pack_rows_multiple`, each process packing
            # its share), so a run resumed on another topology meets the same order: the batches
            # packed as one whole batch (one process, rows a multiple of 1) that take its ladder's
            # most common rung, closest to that rung's most common row count first. The ladder
            # does not depend on the order (every batch of epoch 0 counts once).
            whole = [load_batch.whole_rows_needed(step) for step in range(per_epoch)]
            whole_ladder = padding.row_ladder(
                whole, rungs=pack_rungs, worst=2 * batch_size, multiple=1
            )
            order, leaders = padding.central_first_order(
                whole, pack_first_steps, ladder=whole_ladder
            )
            load_batch.first_epoch_order = order
            # On this topology they may fall on neighbouring rungs: all take the largest of them,
            # so the first steps share one program.
            load_batch.first_steps = leaders
            load_batch.first_rows = max(
                padding.bucket_for(needed[i], load_batch.pack_ladder) for i in order[:leaders]
            )
    return load_batch


def make_loader(
    source: TrainSource,
    *,
    num_epochs: int | None,
    worker_count: int,
    read_threads: int,
    **batch_options,
) -> grain.IterDataset:
    """Builds the training input pipeline; `iter()` it for a checkpointable grain iterator.

    Needs every row's token length (`lengths`, or tokenizes the whole corpus here): the
    length-grouping key, and what lets each process pad to the global batch's length while
    tokenizing only its own rows. Each element is this process's share (b = B/P rows) of one
    global batch, as numpy:
      input_ids, attention_mask: [b, T] int32, T = the global batch's longest passage or
        perturbation rounded up to a rung of `padding.bucket_lengths(max_length, pad_to_multiple,
        bucket_growth)` (same on every process; x and pi(x) share T, so a run compiles at most
        one step program per rung and pi(x) row count).
      pert_input_ids, pert_attention_mask: [b, T'] int32 (the default "stacked" layout); a row
        without a perturbation holds the tokenization of "" (e.g. [CLS] [SEP]).
      has_pert: [b] bool.  teacher_x, teacher_px: [b, d] float32 (teacher_px 0 where no pert).
      index: [b] int64 row index, -1 for padding rows.  weight: [b] float32, 0 for padding rows.
      teacher_nb: [b, d] float32, has_nb: [b] bool: only when the passages file names
        neighbours (`prepare.neighbour_k`); the teacher vector of each row's neighbour, 0 if none.
    Padding rows (last batch, `drop_remainder=False`) copy real rows so they encode cleanly.

    Args:
      source: the rows.
      num_epochs: epochs to yield, or None for endless.
      worker_count: grain worker processes; 0 runs in this process.
      read_threads: threads per process preparing batches, also the prefetch depth (0 = none).
      **batch_options: what decides each step's batch; `make_batch_fn`'s arguments after `source`.

    Returns:
      A `grain.IterDataset` of batch dicts.
    """
    return iterate(
        make_batch_fn(source, **batch_options),
        num_epochs=num_epochs,
        worker_count=worker_count,
        read_threads=read_threads,
    )


def iterate(
    load_batch: "_LoadBatch", *, num_epochs: int | None, worker_count: int, read_threads: int
) -> grain.IterDataset:
    """`make_loader`'s pipeline over a batch function already built (`make_batch_fn`)."""
    num_steps = sys.maxsize if num_epochs is None else num_epochs * load_batch.per_epoch
    dataset = grain.MapDataset.range(num_steps).map(load_batch)
    read_options = grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=read_threads)
    loader = dataset.to_iter_dataset(read_options)
    if worker_count > 0:
        loader = loader.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
    return loader


def token_lengths(tokenize_fn: TokenizeFn, texts: list[str], max_length: int) -> np.ndarray:
    """Returns [N] token counts; "" is tokenized once (most rows lack a perturbation)."""
    rows = [i for i, text in enumerate(texts) if text]
    lengths = np.full(len(texts), len(tokenize_fn([""], max_length)[0]), dtype=np.int64)
    for start in range(0, len(rows), _TOKENIZE_ROWS):
        part = rows[start : start + _TOKENIZE_ROWS]
        ids = tokenize_fn([texts[i] for i in part], max_length)
        lengths[part] = [len(row) for row in ids]
    if lengths.max() > max_length:
        raise ValueError(f"tokenize_fn returned {lengths.max()} ids, above {max_length=}")
    return lengths


class _LoadBatch:
    """Maps a global step to this process's batch dict (picklable for grain workers)."""

    def __init__(
        self,
        source: TrainSource,
        *,
        lengths: np.ndarray,
        pert_lengths: np.ndarray,
        per_epoch: int,
        **options,
    ):
        self.source = source
        self.lengths = lengths
        self.pert_lengths = pert_lengths
        self.per_epoch = per_epoch
        self.has_pert = options.pop("has_pert")
        self.options = options
        self._cache: tuple[int, np.ndarray] | None = None
        self._empty: int | None = None
        # The packed layout's row counts (`make_batch_fn` sets them from epoch 0's batches).
        self.pack_ladder: tuple[int, ...] = ()
        # Epoch 0's order of its planned batches (`make_batch_fn`'s pack_first_steps), or None;
        # its first `first_steps` steps take `first_rows` packed rows.
        self.first_epoch_order: np.ndarray | None = None
        self.first_steps, self.first_rows = 0, 0

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        o = self.options
        rows, filled = self._global_batch(step)
        real = rows >= 0
        positions = o["process_rows"][o["process_index"]]
        mine = filled[positions]
        texts, perturbed = self.source.read_texts(mine)
        has_pert = np.array([bool(text) for text in perturbed])
        if o["pack_length"]:
            arrays = self._pack(texts, perturbed, mine, self._pack_count(filled, step))
        else:
            arrays = self._pad(texts, perturbed, filled, mine)
        teacher_x, teacher_px = self.source.read_teacher(mine)
        teacher_px[~has_pert] = 0.0
        if self.source.neighbours is not None:
            # Teacher vectors of each row's mined topical neighbour (objective "neighbour").
            arrays["teacher_nb"], arrays["has_nb"] = self.source.read_neighbours(mine)
        if self.source.teacher_q is not None:
            # Each row's training query (the query-geometry term), at one fixed length.
            queries, arrays["teacher_q"], arrays["has_q"] = self.source.read_queries(mine)
            ids = o["tokenize_fn"](queries, o["query_length"])
            arrays["query_input_ids"], arrays["query_attention_mask"] = padding.pad_rows(
                [list(row) for row in ids], rows=len(ids), length=o["query_length"],
                pad_id=o["pad_id"],
            )  # fmt: skip
        return {
            "has_pert": has_pert,
            "teacher_x": teacher_x,
            "teacher_px": teacher_px,
            "index": rows[positions],
            "weight": real[positions].astype(np.float32),
            **arrays,
        }

    def geometry(self, step: int) -> tuple[int, ...]:
        """The integers that decide the shapes of step `step`'s arrays (equal tuples, equal
        shapes): the padded length, the compact layout's pi(x) rows, the packed row count.
        Lengths only: nothing is tokenized or read."""
        o = self.options
        batch = self._global_batch(step)[1]
        if o["pack_length"]:
            return (0, 0, self._pack_count(batch, step))
        longest = padding.bucket_for(max(1, self._longest(batch)), o["buckets"])
        compact = self._compact_count(batch) if o["pert_rows_multiple"] else 0
        return (longest, compact, 0)

    def _global_batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Step `step`'s global batch: its rows (-1 for padding slots) and the same with the
        padding slots filled by copies of real rows."""
        o = self.options
        epoch, position = divmod(step, self.per_epoch)
        cached = self._cache
        if cached is None or cached[0] != epoch:
            plan = make_epoch_batches(
                np.maximum(self.lengths, self.pert_lengths),
                batch_size=o["batch_size"],
                seed=o["seed"],
                epoch=epoch,
                shuffle=o["shuffle"],
                length_group_window=o["length_group_window"],
                drop_remainder=o["drop_remainder"],
            )
            cached = self._cache = (epoch, plan)
        if epoch == 0 and self.first_epoch_order is not None:
            position = int(self.first_epoch_order[position])
        rows = cached[1][position]
        real = rows >= 0
        filled = rows.copy()
        filled[~real] = rows[real][np.arange(np.sum(~real)) % np.sum(real)]
        return rows, filled

    def _longest(self, batch: np.ndarray) -> int:
        """The global batch's longest x or pi(x): the padded layouts' length, before bucketing."""
        return int(max(self.lengths[batch].max(), self.pert_lengths[batch].max()))

    def rows_needed(self, step: int) -> int:
        """Packed rows step `step`'s batch needs: the most any process's packing needs."""
        return self._rows_needed(self._global_batch(step)[1])

    def whole_rows_needed(self, step: int) -> int:
        """Packed rows step `step`'s global batch needs as one batch (one process): what
        `pack_first_steps` orders by, the same on any devices and processes."""
        batch = self._global_batch(step)[1]
        return len(padding.pack_bins(self._sequence_lengths(batch), capacity=self._capacity()))

    def _rows_needed(self, batch: np.ndarray) -> int:
        return max(
            len(padding.pack_bins(self._sequence_lengths(batch[rows]), capacity=self._capacity()))
            for rows in self.options["process_rows"]
        )

    def _capacity(self) -> int:
        return self.options["pack_length"]

    def _sequence_lengths(self, members: np.ndarray) -> list[int]:
        """Token counts of the rows' x, then of their existing pi(x)."""
        pert = members[self.has_pert[members]]
        return self.lengths[members].tolist() + self.pert_lengths[pert].tolist()

    def _pack_count(self, batch: np.ndarray, step: int) -> int:
        """Packed rows per process: the smallest rung of `pack_ladder` that holds the batch, or
        `first_rows` for the first `first_steps` steps of epoch 0."""
        if step < self.first_steps:
            return self.first_rows
        needed = self._rows_needed(batch)
        if needed > self.pack_ladder[-1]:  # the last rung is one sequence per row
            raise AssertionError(f"{needed} packed rows above the ladder {self.pack_ladder}")
        return padding.bucket_for(needed, self.pack_ladder)

    def _compact_count(self, batch: np.ndarray) -> int:
        """The compact layout's pi(x) rows per process (the most any process has, rounded up)."""
        o = self.options
        local = o["batch_size"] // len(o["process_rows"])
        per_process = self.has_pert[batch[o["process_rows"]]].sum(axis=1)
        multiple = o["pert_rows_multiple"]
        return min(local, max(multiple, -(-int(per_process.max()) // multiple) * multiple))

    def _pad(
        self, texts: list[str], perturbed: list[str], batch: np.ndarray, mine: np.ndarray
    ) -> dict[str, np.ndarray]:
        """The "stacked" and "compact" layouts: x and pi(x) rows right-padded to one length."""
        # Lengths come from the whole global batch, so every process pads to the same shape, and
        # x and pi(x) share one length (fewer distinct programs to compile).
        longest = self._longest(batch)
        arrays = {}
        arrays["input_ids"], arrays["attention_mask"] = self._tokenize_pad(
            texts, self.lengths, mine, longest
        )
        if self.options["pert_rows_multiple"]:
            (
                arrays["pert_input_ids"],
                arrays["pert_attention_mask"],
                arrays["pert_index"],
            ) = self._compact_pert(perturbed, batch, mine, longest)
        else:
            arrays["pert_input_ids"], arrays["pert_attention_mask"] = self._tokenize_pad(
                perturbed, self.pert_lengths, mine, longest
            )
        return arrays

    def _pack(
        self, texts: list[str], perturbed: list[str], mine: np.ndarray, count: int
    ) -> dict[str, np.ndarray]:
        """The "packed" layout: this process's x and pi(x) sequences end to end in rows.

        Slot of x at global batch position g: g; of its pi(x): B + g; padding: 2B. The row count
        is the smallest rung of `pack_ladder` that holds the packing of every process (each
        computes every process's packing from the global batch's lengths), so all processes
        share one shape; `count` is that row count (`_pack_count`).
        """
        o = self.options
        capacity, size = o["pack_length"], o["batch_size"]
        positions = o["process_rows"][o["process_index"]]
        pert_rows = [i for i, text in enumerate(perturbed) if text]
        id_lists = self._tokenize_checked(texts, self.lengths[mine]) + self._tokenize_checked(
            [perturbed[i] for i in pert_rows], self.pert_lengths[mine[pert_rows]]
        )
        slots = positions.tolist() + [size + int(positions[i]) for i in pert_rows]
        ids, slot_ids, token_positions = padding.pack_rows(
            id_lists, slots, rows=count, length=capacity, pad_id=o["pad_id"], pad_slot=2 * size
        )
        return {"packed_ids": ids, "packed_slots": slot_ids, "packed_positions": token_positions}

    def _compact_pert(
        self, perturbed: list[str], batch: np.ndarray, mine: np.ndarray, longest: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This process's perturbed rows of pi(x): [p, T'] ids and mask, [p] global positions."""
        o = self.options
        count = self._compact_count(batch)
        rows = [i for i, text in enumerate(perturbed) if text]
        texts = [perturbed[i] for i in rows] + [""] * (count - len(rows))
        expected = np.concatenate(
            [self.pert_lengths[mine[rows]], np.full(count - len(rows), self._empty_length())]
        ).astype(np.int64)
        ids, mask = self._pad_texts(texts, expected, max(longest, self._empty_length()))
        index = np.full(count, o["batch_size"], dtype=np.int32)
        positions = o["process_rows"][o["process_index"]]
        index[: len(rows)] = positions[np.asarray(rows, dtype=np.int64)]
        return ids, mask, index

    def _empty_length(self) -> int:
        if self._empty is None:
            self._empty = len(self.options["tokenize_fn"]([""], self.options["max_length"])[0])
        return self._empty

    def _tokenize_pad(
        self, texts: list[str], lengths: np.ndarray, mine: np.ndarray, longest: int
    ) -> tuple[np.ndarray, np.ndarray]:
        return self._pad_texts(texts, lengths[mine], max(1, longest))

    def _pad_texts(
        self, texts: list[str], expected: np.ndarray, longest: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Tokenizes and right-pads to the bucket of `longest`."""
        length = padding.bucket_for(longest, self.options["buckets"])
        ids = self._tokenize_checked(texts, expected)
        return padding.pad_rows(ids, rows=len(ids), length=length, pad_id=self.options["pad_id"])

    def _tokenize_checked(self, texts: list[str], expected: np.ndarray) -> list[list[int]]:
        if not texts:
            return []
        ids = self.options["tokenize_fn"](texts, self.options["max_length"])
        found = [len(row) for row in ids]
        if found != np.asarray(expected).tolist():
            raise ValueError(
                f"tokenize_fn is not deterministic: got lengths {found}, "
                f"{np.asarray(expected).tolist()} when the loader was built"
            )
        return [list(row) for row in ids]
