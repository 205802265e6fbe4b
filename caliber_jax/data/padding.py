"""Padding to a small fixed set of bucket lengths, shared by the train loader and the encoders.

Every distinct batch shape is one XLA program to compile (seconds on a CPU, minutes for a large
model on a GPU), so sequences are padded to lengths from a short geometric ladder instead of to
the longest row. No jax here: the loader and the benchmarks use it on the host.
"""

import collections
from collections.abc import Sequence

import numpy as np


def bucket_lengths(max_length: int, *, multiple: int, growth: float) -> tuple[int, ...]:
    """The padded lengths a batch may take: `multiple`, then x `growth` rounded up, to max_length.

    growth 1.5 with multiple 16 gives 16, 32, 48, 80, 128, 192, 288, 432, 512 (nine programs up to
    512 tokens, at most a third of each padded row wasted); growth 1 gives every multiple.

    Args:
      max_length: the longest sequence; always the last bucket.
      multiple: every bucket is a multiple of this (except a max_length that is not).
      growth: ratio between consecutive buckets, >= 1.
    """
    if multiple < 1 or max_length < 1 or growth < 1:
        raise ValueError(
            f"need multiple >= 1, max_length >= 1, growth >= 1; got {multiple}, {max_length}, "
            f"{growth}"
        )
    buckets = []
    length = multiple
    while length < max_length:
        buckets.append(length)
        length = max(length + multiple, -(-int(np.ceil(length * growth)) // multiple) * multiple)
    buckets.append(max_length)
    return tuple(buckets)


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= length (the last bucket caps longer inputs)."""
    for bucket in buckets:
        if bucket >= length:
            return bucket
    return buckets[-1]


def pad_rows(
    id_lists: Sequence[Sequence[int]], *, rows: int, length: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Right-pads token id lists to `[rows, length]` int32 ids and mask; extra rows are padding."""
    if len(id_lists) > rows:
        raise ValueError(f"{len(id_lists)} sequences do not fit in {rows} rows")
    ids = np.full((rows, length), pad_id, np.int32)
    mask = np.zeros((rows, length), np.int32)
    for row, seq in enumerate(id_lists):
        if len(seq) > length:
            raise ValueError(f"row {row}: {len(seq)} tokens do not fit in length {length}")
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return ids, mask


def pack_bins(lengths: Sequence[int], *, capacity: int) -> list[list[int]]:
    """First-fit decreasing: sequence indices grouped into rows of at most `capacity` tokens.

    Deterministic (ties keep input order), so every process computes every process's packing.

    Returns:
      One list of indices per packed row, in the order rows were opened.
    """
    order = sorted(range(len(lengths)), key=lambda i: -int(lengths[i]))
    bins: list[list[int]] = []
    free: list[int] = []
    for index in order:
        length = int(lengths[index])
        if length > capacity:
            raise ValueError(f"sequence {index}: {length} tokens do not fit in a row of {capacity}")
        row = next((r for r, room in enumerate(free) if room >= length), None)
        if row is None:
            bins.append([])
            free.append(capacity)
            row = len(bins) - 1
        bins[row].append(index)
        free[row] -= length
    return bins


def pack_rows(
    id_lists: Sequence[Sequence[int]],
    slots: Sequence[int],
    *,
    rows: int,
    length: int,
    pad_id: int,
    pad_slot: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Packs token id lists end to end into `[rows, length]` (see `pack_bins`).

    Args:
      id_lists: the sequences.
      slots: one int per sequence: where its pooled vector goes (`EmbeddingModel.embed_packed`).
      rows, length: the output shape; the packing must fit.
      pad_id: token id of padding positions.
      pad_slot: slot of padding positions (out of range for the pooled output).

    Returns:
      ids, slots, positions: [rows, length] int32 each; positions count from 0 in every sequence.
    """
    bins = pack_bins([len(ids) for ids in id_lists], capacity=length)
    if len(bins) > rows:
        raise ValueError(f"{len(id_lists)} sequences need {len(bins)} packed rows, above {rows}")
    ids_rl = np.full((rows, length), pad_id, np.int32)
    slots_rl = np.full((rows, length), pad_slot, np.int32)
    positions_rl = np.zeros((rows, length), np.int32)
    for row, members in enumerate(bins):
        start = 0
        for index in members:
            seq = id_lists[index]
            end = start + len(seq)
            ids_rl[row, start:end] = seq
            slots_rl[row, start:end] = slots[index]
            positions_rl[row, start:end] = np.arange(len(seq))
            start = end
    return ids_rl, slots_rl, positions_rl


def row_ladder(needed: Sequence[int], *, rungs: int, worst: int, multiple: int) -> tuple[int, ...]:
    """The fixed row counts of the packed layout: `rungs` programs, and a fallback.

    The rungs are the `rungs` row counts that leave the fewest padded rows over `needed` (the
    rows each of a sample of batches needs, e.g. one epoch's), the largest of them the sample's
    most; then `worst`, a count that any batch fits, for a batch outside the sample that needs
    more (not repeated when the sample's most is already the worst case). Counts are rounded up
    to `multiple`. A batch takes the smallest rung that holds it (`bucket_for`), so the sample's
    batches meet at most `rungs` shapes.

    Args:
      needed: rows each sampled batch needs (its packing, before rounding).
      rungs: row counts drawn from the sample, >= 1.
      worst: the row count that always fits (e.g. one sequence per row).
      multiple: every rung is a multiple of this (the devices sharing a batch).
    """
    if rungs < 1 or multiple < 1 or worst < 1:
        raise ValueError(f"need rungs, multiple, worst >= 1; got {rungs}, {multiple}, {worst}")

    def up(count: int) -> int:
        return max(multiple, -(-int(count) // multiple) * multiple)

    top = up(worst)
    values, counts = np.unique([min(up(n), top) for n in needed], return_counts=True)
    values, counts = values.tolist(), counts.tolist()
    # cost[i][j]: padded rows when the batches needing values[i..j] all take values[j].
    above = np.cumsum([0, *counts])
    weighted = np.cumsum([0, *(v * c for v, c in zip(values, counts, strict=True))])

    def cost(i: int, j: int) -> int:
        return values[j] * (above[j + 1] - above[i]) - (weighted[j + 1] - weighted[i])

    # best[k][j]: least padding of values[..j] with k rungs, the last one values[j]; a small
    # dynamic programme (values: a few dozen row counts).
    inf = float("inf")
    n, data_rungs = len(values), min(rungs, len(values))
    best = [[inf] * n for _ in range(data_rungs + 1)]
    choice = [[-1] * n for _ in range(data_rungs + 1)]
    for k in range(1, data_rungs + 1):
        for j in range(n):
            if k == 1:
                best[k][j] = cost(0, j)
                continue
            for i in range(1, j + 1):
                total = best[k - 1][i - 1] + cost(i, j)
                if total < best[k][j]:
                    best[k][j], choice[k][j] = total, i - 1
    chosen = []
    k = min(range(1, data_rungs + 1), key=lambda m: best[m][n - 1])
    j = n - 1
    while j >= 0 and k >= 1:
        chosen.append(values[j])
        j, k = choice[k][j], k - 1
    return tuple(sorted({*chosen, top}))


def central_first_order(
    values: Sequence[int], steps: int, *, ladder: Sequence[int]
) -> tuple[np.ndarray, int]:
    """An order of an epoch's batches that leads with up to `steps` batches of about one size.

    Each batch's value (e.g. the rows it packs into) takes a rung of `ladder` (`bucket_for`). The
    leaders are batches of the most common rung (ties: the one met first), at most `steps` of
    them: those whose value lies closest to that rung's most common value (of two as far, the
    smaller, then the earlier batch). They come first, in their order; every other batch follows
    in its order. Each batch is still met once per epoch. With the first step's program built, the
    others compile while those steps run (`compile_ahead`), instead of the second step waiting
    for its shape's.

    Args:
      values: one int per batch (its size), in order.
      steps: how many batches lead at most (fewer if the common rung has fewer).
      ladder: the rungs that group the values.

    Returns:
      (order, leaders): [len(values)] int64, position i of the new order takes batch order[i];
      how many batches lead.
    """
    if steps < 0:
        raise ValueError(f"steps={steps} must be >= 0")
    values = [int(value) for value in values]
    if not values or steps == 0:
        return np.arange(len(values), dtype=np.int64), 0
    rungs = [bucket_for(value, ladder) for value in values]
    # Counters keep the order first met: max keeps the first of a tie.
    rung = max(collections.Counter(rungs).items(), key=lambda item: item[1])[0]
    members = [i for i in range(len(values)) if rungs[i] == rung]
    counts = collections.Counter(values[i] for i in members)
    center = max(counts, key=counts.__getitem__)
    members.sort(key=lambda i: (abs(values[i] - center), values[i], i))
    lead = sorted(members[:steps])
    chosen = set(lead)
    rest = [i for i in range(len(values)) if i not in chosen]
    return np.asarray(lead + rest, dtype=np.int64), len(lead)


# Encoding pads to the same short geometric ladder as training: one compiled program per rung,
# however many batches.
BUCKET_MULTIPLE = 16
BUCKET_GROWTH = 1.5


def bucket_length(length: int, max_length: int = 512) -> int:
    """Smallest rung >= length of the ladder 16, 32, 48, 80, 128, 192, 288, 432, ..., max_length."""
    ladder = bucket_lengths(max(max_length, length), multiple=BUCKET_MULTIPLE, growth=BUCKET_GROWTH)
    return bucket_for(length, ladder)


def batch_plan(
    lengths: Sequence[int],
    *,
    batch_size: int,
    max_length: int = 512,
    tokens_per_batch: int = 0,
    row_multiple: int = 1,
) -> list[tuple[np.ndarray, int, int]]:
    """How the encoders (`Embedder.encode_ids`, the PyTorch teacher) batch sequences: (row
    indices, padded rows, padded length) per batch.

    Longest first (stable), each batch padded to the ladder rung of its longest row
    (`bucket_length`). With `tokens_per_batch` 0 every batch has `batch_size` rows; otherwise a
    batch whose rung is L has as many rows as fit in `tokens_per_batch` slots (floor(budget / L),
    at least one), so short passages come many to a batch instead of making small matmuls. Rows
    are rounded up (fixed batches) or down (budgets, at least one multiple) to `row_multiple`,
    the devices a batch is split over. Either way each rung has one row count, hence one program.
    """
    if batch_size < 1 or tokens_per_batch < 0 or row_multiple < 1:
        raise ValueError(
            f"need batch_size >= 1, tokens_per_batch >= 0, row_multiple >= 1; got {batch_size}, "
            f"{tokens_per_batch}, {row_multiple}"
        )
    order = np.argsort(-np.asarray(lengths), kind="stable")
    fixed = -(-batch_size // row_multiple) * row_multiple
    plan, start = [], 0
    while start < len(order):
        length = bucket_length(int(lengths[order[start]]), max_length)
        rows = fixed
        if tokens_per_batch:
            rows = max(row_multiple, tokens_per_batch // length // row_multiple * row_multiple)
        count = batch_size if not tokens_per_batch else rows
        plan.append((order[start : start + count], rows, length))
        start += count
    return plan
