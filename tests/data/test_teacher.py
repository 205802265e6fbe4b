"""Tests for caliber_jax/data/teacher.py: store round trip, metadata checks, resume, MRL."""

import hashlib
import os
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest

from caliber_jax import paths
from caliber_jax.data import teacher

REPO = Path(__file__).resolve().parents[2]
NATIVE_DIM = 6
METADATA = {"teacher": "fake-teacher", "pooling": "mean", "native_dim": NATIVE_DIM}


def fake_encode(texts: list[str]) -> np.ndarray:
    """Deterministic unit vectors keyed by text content."""
    rows = [
        np.random.default_rng(zlib.crc32(text.encode())).normal(size=NATIVE_DIM) for text in texts
    ]
    vectors = np.array(rows, dtype=np.float32).reshape(len(texts), NATIVE_DIM)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def make_texts(count: int) -> list[str]:
    return [f"passage {i}: revenue grew {i}.{i % 7}%" for i in range(count)]


def expected_rows(texts: list[str], dim: int) -> np.ndarray:
    out = np.zeros((len(texts), dim), np.float32)
    present = [i for i, text in enumerate(texts) if text]
    out[present] = teacher.mrl_truncate(fake_encode([texts[i] for i in present]), dim)
    return out


def test_text_hash_is_length_prefixed_sha256():
    expected = hashlib.sha256(b"\x02\x00\x00\x00\x00\x00\x00\x00ab").hexdigest()
    assert teacher.text_hash(["ab"]) == expected
    assert teacher.text_hash(["a", "b"]) != teacher.text_hash(["ab"])
    assert teacher.text_hash(["ab", ""]) != teacher.text_hash(["ab"])
    assert teacher.text_hash(iter(["ab"])) == expected


def test_mrl_truncate_renormalises():
    vectors = np.array([[3.0, 4.0, 12.0], [0.0, 0.0, 0.0], [0.0, -2.0, 1.0]])
    out = teacher.mrl_truncate(vectors, 2)
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0], [0.0, -1.0]], rtol=1e-6)
    assert out.dtype == np.float32
    np.testing.assert_allclose(teacher.mrl_truncate(vectors, 3)[0], np.array([3, 4, 12]) / 13)
    with pytest.raises(ValueError, match="dim=4"):
        teacher.mrl_truncate(vectors, 4)


@pytest.mark.parametrize("dtype, tolerance", [("float32", 0.0), ("bfloat16", 1e-2)])
def test_write_read_round_trip(tmp_path, dtype, tolerance):
    vectors = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)
    metadata = {**METADATA, "native_dim": 4, "text_hash": "h"}
    store = teacher.create_store(
        tmp_path / "s", num_rows=10, dim=4, dtype=dtype, chunk_rows=4, metadata=metadata
    )
    teacher.write_rows(store, 0, vectors[:8])
    teacher.write_rows(tmp_path / "s", 8, vectors[8:])
    reader = teacher.open_reader(tmp_path / "s", expect_rows=10, expect_dim=4, expect_hash="h")
    indices = [9, 3, 3, 0, 7]
    rows = reader[indices]
    assert rows.dtype == np.float32 and rows.shape == (5, 4)
    np.testing.assert_allclose(rows, vectors[indices], atol=tolerance, rtol=tolerance)
    np.testing.assert_allclose(reader[2], vectors[2], atol=tolerance, rtol=tolerance)
    assert reader.metadata["dtype"] == dtype and reader.metadata["teacher"] == "fake-teacher"


def test_write_rows_rejects_partial_chunks(tmp_path):
    metadata = {**METADATA, "text_hash": "h"}
    store = teacher.create_store(
        tmp_path / "s", num_rows=10, dim=2, chunk_rows=4, metadata=metadata
    )
    with pytest.raises(ValueError, match="whole chunks"):
        teacher.write_rows(store, 2, np.zeros((4, 2)))
    with pytest.raises(ValueError, match="whole chunks"):
        teacher.write_rows(store, 0, np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"shape \(4, 3\)"):
        teacher.write_rows(store, 0, np.zeros((4, 3)))
    with pytest.raises(ValueError, match="non-finite teacher vector at row 5"):
        teacher.write_rows(store, 4, np.where(np.arange(4)[:, None] == 1, np.nan, 0.0) + [0, 0])


def test_create_store_mismatch_names_field(tmp_path):
    path = tmp_path / "s"
    metadata = {**METADATA, "text_hash": "h1"}
    store = teacher.create_store(path, num_rows=10, dim=4, chunk_rows=4, metadata=metadata)
    again = teacher.create_store(path, num_rows=10, dim=4, chunk_rows=4, metadata=metadata)
    assert again.metadata["created"] == store.metadata["created"]
    cases = [
        ({"num_rows": 11}, "num_rows"),
        ({"dim": 3}, "dim"),
        ({"dtype": "float16"}, "dtype"),
        ({"metadata": {**metadata, "text_hash": "h2"}}, "text_hash"),
        ({"metadata": {**metadata, "teacher": "other"}}, "teacher"),
    ]
    for change, field in cases:
        arguments = {"num_rows": 10, "dim": 4, "chunk_rows": 4, "metadata": metadata, **change}
        with pytest.raises(ValueError, match=rf"{path}: existing teacher store has {field}="):
            teacher.create_store(path, **arguments)
    # The message says how to go on: the folder to delete.
    with pytest.raises(ValueError, match=rf"requested 3; delete the folder {path} to rebuild it$"):
        teacher.create_store(path, num_rows=10, dim=3, chunk_rows=4, metadata=metadata)
    with pytest.raises(ValueError, match="native_dim"):
        teacher.create_store(tmp_path / "t", num_rows=1, dim=1, chunk_rows=1, metadata={})
    # The passages file's path is provenance, not identity: the same texts (hash) prepared in
    # another folder reopen the store, which keeps the path it was made from.
    moved = {**metadata, "passages": "other/train.jsonl"}
    shared = teacher.create_store(path, num_rows=10, dim=4, chunk_rows=4, metadata=moved)
    assert shared.metadata.get("passages") == metadata.get("passages")


def test_open_reader_checks_metadata(tmp_path):
    texts = make_texts(9)
    path = tmp_path / "s"
    teacher.embed_to_store(
        fake_encode, texts, path, batch_rows=4, dim=4, chunk_rows=4,
        process_index=0, process_count=1, metadata=METADATA,
    )  # fmt: skip
    digest = teacher.text_hash(texts)
    reader = teacher.open_reader(path, expect_rows=9, expect_dim=4, expect_hash=digest)
    np.testing.assert_allclose(reader[np.arange(9)], expected_rows(texts, 4), atol=1e-6)
    with pytest.raises(ValueError, match=r"teacher num_rows mismatch: expected 8, found 9"):
        teacher.open_reader(path, expect_rows=8, expect_dim=4)
    with pytest.raises(ValueError, match=r"teacher dim mismatch: expected 6, found 4"):
        teacher.open_reader(path, expect_rows=9, expect_dim=6)
    other = teacher.text_hash(texts[:-1])
    with pytest.raises(
        ValueError, match=rf"{path}: teacher text_hash mismatch: expected '{other}'"
    ):
        teacher.open_reader(path, expect_rows=9, expect_dim=4, expect_hash=other)


def test_open_reader_rejects_incomplete_store(tmp_path):
    path = tmp_path / "s"
    metadata = {**METADATA, "text_hash": "h"}
    store = teacher.create_store(path, num_rows=10, dim=2, chunk_rows=4, metadata=metadata)
    teacher.write_rows(store, 0, np.ones((4, 2)))
    with pytest.raises(ValueError, match=r"incomplete, rows \[\(4, 10\)\]"):
        teacher.open_reader(path, expect_rows=10, expect_dim=2)


def test_embed_writes_zero_rows_for_empty_texts(tmp_path):
    texts = ["a 1", "", "b 2", "", "", "c 3", ""]
    calls = []

    def encode(batch):
        calls.append(list(batch))
        return fake_encode(batch)

    teacher.embed_to_store(
        encode, texts, tmp_path / "s", batch_rows=2, dim=3, chunk_rows=3,
        process_index=0, process_count=1, metadata=METADATA,
    )  # fmt: skip
    assert calls == [["a 1", "b 2"], ["c 3"]]
    reader = teacher.open_reader(tmp_path / "s", expect_rows=7, expect_dim=3)
    rows = reader[np.arange(7)]
    np.testing.assert_allclose(rows, expected_rows(texts, 3), atol=1e-6)
    np.testing.assert_array_equal(np.linalg.norm(rows, axis=1) > 0.5, [bool(t) for t in texts])


def test_process_rows_disjoint_and_covering():
    for num_rows, chunk_rows, process_count in [(100, 8, 3), (7, 4, 4), (64, 16, 4), (1, 1, 2)]:
        ranges = [
            teacher.process_rows(num_rows, chunk_rows, index, process_count)
            for index in range(process_count)
        ]
        covered = np.concatenate([np.arange(start, stop) for start, stop in ranges])
        np.testing.assert_array_equal(covered, np.arange(num_rows))
        for start, stop in ranges:
            assert start % chunk_rows == 0 and (stop % chunk_rows == 0 or stop == num_rows)
    assert teacher.process_rows(100, 8, 1, 3) == (32, 64)


def test_multi_process_embed_writes_only_own_rows(tmp_path):
    texts = make_texts(30)
    path = tmp_path / "s"
    arguments = dict(batch_rows=4, dim=4, chunk_rows=4, process_count=3, metadata=METADATA)
    teacher.embed_to_store(fake_encode, texts, path, process_index=1, **arguments)
    assert teacher.pending_ranges(path, 0, 3) == [(0, 8)]
    assert teacher.pending_ranges(path, 1, 3) == []
    assert teacher.pending_ranges(path, 2, 3) == [(20, 30)]
    assert teacher.pending_ranges(path) == [(0, 8), (20, 30)]
    for index in (2, 0):
        teacher.embed_to_store(fake_encode, texts, path, process_index=index, **arguments)
    assert teacher.pending_ranges(path) == []
    reader = teacher.open_reader(path, expect_rows=30, expect_dim=4)
    np.testing.assert_allclose(reader[np.arange(30)], expected_rows(texts, 4), atol=1e-6)


def _chunk_files(path: Path) -> dict[str, int]:
    return {
        str(file.relative_to(path)): file.stat().st_mtime_ns
        for file in sorted(path.rglob("*"))
        if file.is_file() and (file.parts[-2] == "done" or "c" in file.relative_to(path).parts)
    }


def test_resume_after_crash_skips_finished_chunks(tmp_path):
    texts = make_texts(22)
    path = tmp_path / "s"
    arguments = dict(batch_rows=2, dim=4, chunk_rows=4, process_index=0, process_count=1)
    calls = []

    def crashing_encode(batch):
        if len(calls) == 4:  # chunks 0 and 1 finished, chunk 2 not started
            raise RuntimeError("simulated crash")
        calls.append(list(batch))
        return fake_encode(batch)

    with pytest.raises(RuntimeError, match="simulated crash"):
        teacher.embed_to_store(crashing_encode, texts, path, metadata=METADATA, **arguments)
    assert teacher.pending_ranges(path) == [(8, 22)]
    # Crash between data and marker: chunk 2's data is on disk, its marker is not.
    store = teacher.create_store(
        path, num_rows=22, dim=4, chunk_rows=4,
        metadata={**METADATA, "text_hash": teacher.text_hash(texts)},
    )  # fmt: skip
    store.array[8:12].write(np.full((4, 4), 7.0, np.float32)).result()
    assert teacher.pending_ranges(path) == [(8, 22)]
    before = _chunk_files(path)
    assert set(before) == {"c/0/0", "c/1/0", "c/2/0", "done/0", "done/1"}

    encoded: list[str] = []

    def counting_encode(batch):
        encoded.extend(batch)
        return fake_encode(batch)

    teacher.embed_to_store(counting_encode, texts, path, metadata=METADATA, **arguments)
    assert encoded == texts[8:]
    after = _chunk_files(path)
    for name in ("c/0/0", "c/1/0", "done/0", "done/1"):
        assert after[name] == before[name], name
    assert teacher.pending_ranges(path) == []
    reader = teacher.open_reader(path, expect_rows=22, expect_dim=4)
    np.testing.assert_allclose(reader[np.arange(22)], expected_rows(texts, 4), atol=1e-6)


def test_resume_after_killed_process(tmp_path):
    texts = make_texts(20)
    path = tmp_path / "s"
    script = textwrap.dedent(
        f"""
        import os, zlib
        import numpy as np
        from caliber_jax.data import teacher
        calls = []
        def encode(batch):
            if len(calls) == 3:
                os._exit(17)  # hard kill: no cleanup, no exception handling
            calls.append(batch)
            rows = [np.random.default_rng(zlib.crc32(t.encode())).normal(size={NATIVE_DIM})
                    for t in batch]
            v = np.array(rows, np.float32)
            return v / np.linalg.norm(v, axis=1, keepdims=True)
        texts = [f"passage {{i}}: revenue grew {{i}}.{{i % 7}}%" for i in range(20)]
        teacher.embed_to_store(encode, texts, {str(path)!r}, batch_rows=3, dim=5, chunk_rows=6,
                               process_index=0, process_count=1, metadata={METADATA!r})
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True)
    assert result.returncode == 17, result.stderr.decode()[-2000:]
    # Encode calls of 3 rows: calls 1-2 finish chunk 0 (rows 0-5), call 4 would be in chunk 1.
    assert teacher.pending_ranges(path) == [(6, 20)]
    before = _chunk_files(path)
    encoded: list[str] = []

    def counting_encode(batch):
        encoded.extend(batch)
        return fake_encode(batch)

    teacher.embed_to_store(
        counting_encode, texts, path, batch_rows=3, dim=5, chunk_rows=6,
        process_index=0, process_count=1, metadata=METADATA,
    )  # fmt: skip
    assert encoded == texts[6:]
    assert _chunk_files(path)["c/0/0"] == before["c/0/0"]
    reader = teacher.open_reader(path, expect_rows=20, expect_dim=5)
    np.testing.assert_allclose(reader[np.arange(20)], expected_rows(texts, 5), atol=1e-6)


def test_import_npy(tmp_path):
    texts = ["a", "", "b", "c", ""]
    vectors = np.array([[3, 4, 0], [9, 9, 9], [0, 2, 5], [1, 0, 0], [0, 0, 0]], dtype=np.float32)
    np.save(tmp_path / "v.npy", vectors)
    metadata = {"teacher": "api-teacher", "pooling": "api"}
    teacher.import_npy(
        tmp_path / "s", vectors_npy=tmp_path / "v.npy", texts=texts, dim=2, chunk_rows=2,
        metadata=metadata,
    )  # fmt: skip
    reader = teacher.open_reader(
        tmp_path / "s", expect_rows=5, expect_dim=2, expect_hash=teacher.text_hash(texts)
    )
    expected = [[0.6, 0.8], [0, 0], [0, 1], [1, 0], [0, 0]]
    np.testing.assert_allclose(reader[np.arange(5)], expected, atol=1e-6)
    assert reader.metadata["native_dim"] == 3
    with pytest.raises(ValueError, match=r"num_rows=5 but 4 texts"):
        teacher.import_npy(
            tmp_path / "t", vectors_npy=tmp_path / "v.npy", texts=texts[:4], dim=None,
            chunk_rows=2, metadata=metadata,
        )  # fmt: skip
    with pytest.raises(ValueError, match="row 4 is zero or non-finite"):
        teacher.import_npy(
            tmp_path / "u", vectors_npy=tmp_path / "v.npy", texts=["x"] * 5, dim=None,
            chunk_rows=2, metadata=metadata,
        )  # fmt: skip


def test_import_npy_checks_the_file_before_making_a_store(tmp_path):
    """A file too narrow for `dim`, or with the wrong number of rows, is one error naming it, its
    shape and what is needed, and leaves no store behind: the corrected import then succeeds."""
    texts = ["a", "b", "c"]
    rng = np.random.default_rng(0)
    np.save(tmp_path / "narrow.npy", rng.standard_normal((3, 4)).astype(np.float32))
    np.save(tmp_path / "short.npy", rng.standard_normal((2, 8)).astype(np.float32))
    np.save(tmp_path / "wide.npy", rng.standard_normal((3, 8)).astype(np.float32))
    common = dict(texts=texts, dim=6, chunk_rows=2, metadata={"teacher": "t", "pooling": "api"})
    store = tmp_path / "s"
    narrow = r"narrow\.npy: shape \(3, 4\): 4 columns, but dim=6 needs at least 6"
    with pytest.raises(ValueError, match=narrow):
        teacher.import_npy(store, vectors_npy=tmp_path / "narrow.npy", **common)
    assert not store.exists()
    short = r"short\.npy: shape \(2, 8\): num_rows=2 but 3 texts were given"
    with pytest.raises(ValueError, match=short):
        teacher.import_npy(store, vectors_npy=tmp_path / "short.npy", **common)
    assert not store.exists()
    teacher.import_npy(store, vectors_npy=tmp_path / "wide.npy", **common)
    assert teacher.open_reader(store, expect_rows=3, expect_dim=6).metadata["native_dim"] == 8


def test_import_npy_writes_only_this_process_rows(tmp_path):
    """2 processes: 10 rows in chunks of 3 -> process 0 owns rows [0, 6), process 1 rows [6, 10);
    each import writes only its own, and the two together equal a 1-process import."""
    rng = np.random.default_rng(0)
    texts = [f"t{i}" for i in range(10)]
    np.save(tmp_path / "v.npy", rng.standard_normal((10, 4)).astype(np.float32))
    common = dict(vectors_npy=tmp_path / "v.npy", texts=texts, dim=3, chunk_rows=3,
                  metadata={"teacher": "api-teacher", "pooling": "api"})  # fmt: skip
    teacher.import_npy(tmp_path / "two", **common, process_index=1, process_count=2)
    assert teacher.pending_ranges(tmp_path / "two") == [(0, 6)]  # process 0's rows untouched
    assert teacher.pending_ranges(tmp_path / "two", 1, 2) == []
    teacher.import_npy(tmp_path / "two", **common, process_index=0, process_count=2)
    teacher.import_npy(tmp_path / "one", **common)
    rows = np.arange(10)
    two = teacher.open_reader(tmp_path / "two", expect_rows=10, expect_dim=3)[rows]
    one = teacher.open_reader(tmp_path / "one", expect_rows=10, expect_dim=3)[rows]
    np.testing.assert_array_equal(two, one)
    assert np.all(np.linalg.norm(one, axis=1) > 0.99)


def test_url_paths_reach_tensorstore_and_epath(tmp_path, monkeypatch):
    """A file:// URL store lands at its absolute path; gs:// URLs become kvstore URLs."""
    monkeypatch.chdir(tmp_path)
    texts = make_texts(9) + [""]
    url = f"file://{tmp_path}/data/x"
    teacher.embed_to_store(fake_encode, texts, url, batch_rows=3, dim=4, chunk_rows=4,
                           process_index=0, process_count=1, metadata=METADATA)  # fmt: skip
    assert (tmp_path / "data" / "x" / "metadata.json").is_file()
    assert not (tmp_path / "file:").exists()  # not taken for a relative local path
    reader = teacher.open_reader(url, expect_rows=10, expect_dim=4)
    np.testing.assert_allclose(reader[np.arange(10)], expected_rows(texts, 4), atol=1e-6)
    assert paths.kvstore_spec("gs://bucket/run/x") == "gs://bucket/run/x/"
    assert paths.kvstore_spec(url) == {"driver": "file", "path": f"{tmp_path}/data/x"}
    with pytest.raises(ValueError, match="absolute"):
        paths.as_path("file://relative/x")


def test_known_vectors_maps_texts_to_rows_and_checks_the_store(tmp_path):
    texts = [*make_texts(5), ""]
    path = tmp_path / "s"
    arguments = dict(batch_rows=2, dim=4, chunk_rows=4, process_index=0, process_count=1)
    teacher.embed_to_store(fake_encode, texts, path, metadata=METADATA, **arguments)
    known = teacher.known_vectors(path, texts, dim=4, expect=METADATA)
    assert sorted(known) == sorted(texts[:5])
    np.testing.assert_array_equal(known[texts[2]], expected_rows(texts, 4)[2])
    with pytest.raises(ValueError, match="text_hash"):
        teacher.known_vectors(path, texts[::-1], dim=4, expect=METADATA)
    with pytest.raises(ValueError, match="cannot reuse teacher vectors: pooling"):
        teacher.known_vectors(path, texts, dim=4, expect={**METADATA, "pooling": "cls"})
    # A store written with `known` copies those rows and encodes only the others.
    encoded: list[str] = []

    def counting_encode(batch):
        encoded.extend(batch)
        return fake_encode(batch)

    more = [*texts, "a new passage of 7.5%"]
    teacher.embed_to_store(
        counting_encode, more, tmp_path / "t", metadata=METADATA, known=known, **arguments
    )
    assert encoded == ["a new passage of 7.5%"]
    reader = teacher.open_reader(tmp_path / "t", expect_rows=7, expect_dim=4)
    np.testing.assert_allclose(reader[np.arange(7)], expected_rows(more, 4), atol=1e-6)
