"""Teacher vectors from vectors computed elsewhere (.npy import) through the CLI."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from caliber_jax import embed_teacher
from caliber_jax.data import corpus, teacher

REPO = Path(__file__).resolve().parents[1]


def test_import_npy_through_the_cli(tmp_path):
    pairs = [
        ("Revenue rose 5% to $10 million.", "Revenue rose 50% to $10 million."),
        ("The board met twice.", None),
        ("Net loss was $3.2 billion in 2020.", "Net loss was $3.2 billion in 2021."),
    ]
    rows = [{"id": f"a:{i}", "text": t, "perturbed": p} for i, (t, p) in enumerate(pairs)]
    corpus.save_jsonl(tmp_path / "train.jsonl", rows)
    rng = np.random.default_rng(0)
    x, px = rng.standard_normal((2, 3, 512)).astype(np.float32)
    px[1] = 0.0  # no perturbation: the row must stay zero
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "px.npy", px)
    command = [
        sys.executable, "-m", "caliber_jax.embed_teacher", f"--config={REPO / 'configs/demo.py'}",
        f"--config.data.dir={tmp_path}", "--splits=train", f"--import_x={tmp_path / 'x.npy'}",
        f"--import_px={tmp_path / 'px.npy'}", "--teacher_name=api-teacher",
    ]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    stored = teacher.open_reader(tmp_path / "teacher_train" / "x", expect_rows=3, expect_dim=384)
    expected = x[:, :384] / np.linalg.norm(x[:, :384], axis=1, keepdims=True)  # MRL to the student
    np.testing.assert_allclose(stored[np.arange(3)], expected, atol=1e-6)
    stored_px = teacher.open_reader(
        tmp_path / "teacher_train" / "px", expect_rows=3, expect_dim=384
    )
    assert not stored_px[np.array([1])].any()
    meta = json.loads((tmp_path / "teacher_train" / "x" / "metadata.json").read_text())
    assert meta["teacher"] == "api-teacher" and meta["native_dim"] == 512

    np.save(tmp_path / "short.npy", x[:2])
    bad = subprocess.run(
        [*command[:-3], f"--import_x={tmp_path / 'short.npy'}"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode != 0 and "short.npy" in bad.stderr


def _embed(data_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "caliber_jax.embed_teacher", f"--config={REPO / 'configs/demo.py'}",
        f"--config.data.dir={data_dir}", "--splits=train", *extra,
    ]  # fmt: skip
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)


def test_reuse_from_copies_equal_texts_and_encodes_the_rest(tmp_path):
    """Data prepared again with one changed perturbation: `--reuse_from` copies the stored
    vectors of the unchanged texts and encodes only the new one; every row equals a fresh
    encoding of its text (float32, same teacher; that one in token-budget batches)."""
    old = [
        {"id": "a:0", "text": "Revenue rose 5% to $10 million.", "perturbed": "Revenue fell 5%"
         " to $10 million."},
        {"id": "a:1", "text": "Net loss was $3.2 billion in 2020.", "perturbed": None},
    ]  # fmt: skip
    new = [{**old[0], "perturbed": "Revenue rose 50% to $10 million."}, old[1]]
    for name, rows in (("old", old), ("new", new), ("fresh", new)):
        (tmp_path / name).mkdir()
        corpus.save_jsonl(tmp_path / name / "train.jsonl", rows)
    assert _embed(tmp_path / "old").returncode == 0
    # The fresh encoding fills its batches by token budget (`config.teacher.tokens_per_batch`):
    # the same vectors as fixed batches.
    assert _embed(tmp_path / "fresh", "--config.teacher.tokens_per_batch=64").returncode == 0
    result = _embed(tmp_path / "new", f"--reuse_from={tmp_path / 'old'}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "x: 2 of 2 texts reuse" in result.stderr
    assert "px: 0 of 1 texts reuse" in result.stderr

    def rows(name: str, store: str) -> np.ndarray:
        reader = teacher.open_reader(
            tmp_path / name / "teacher_train" / store, expect_rows=2, expect_dim=384
        )
        return reader[np.arange(2)]

    np.testing.assert_array_equal(rows("new", "x"), rows("old", "x"))  # copied, not re-encoded
    np.testing.assert_allclose(rows("new", "px"), rows("fresh", "px"), atol=1e-6)
    assert not rows("new", "px")[1].any()
    # Vectors of another teacher setting are refused, naming the field.
    (tmp_path / "other").mkdir()
    corpus.save_jsonl(tmp_path / "other" / "train.jsonl", new)
    bad = _embed(tmp_path / "other", f"--reuse_from={tmp_path / 'old'}",
                 "--config.teacher.max_length=64")  # fmt: skip
    assert bad.returncode != 0 and "cannot reuse teacher vectors: max_length" in bad.stderr


def test_a_folder_without_the_splits_is_an_error_not_a_silent_exit(tmp_path):
    """A mistyped --config.data.dir or --splits wrote nothing and exited 0; "val" alone may be
    absent (nothing held out)."""
    corpus.save_jsonl(tmp_path / "train.jsonl", [{"id": "a:0", "text": "x", "perturbed": None}])
    assert embed_teacher.present_splits(str(tmp_path), ["train", "val"]) == ["train"]
    with pytest.raises(ValueError, match=r"no trian.jsonl \(the folder"):
        embed_teacher.present_splits(str(tmp_path), ["trian"])
    with pytest.raises(ValueError, match=r"missing: no train.jsonl, val.jsonl"):
        embed_teacher.present_splits(str(tmp_path / "missing"), ["train", "val"])
    result = _embed(tmp_path / "nowhere")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "nowhere: no train.jsonl" in result.stderr


def test_a_wrong_import_file_leaves_no_store_behind(tmp_path):
    """`--import_x`/`--import_px` files are checked (rows, width against the student dim) before
    any store is made: a wrong one is an error naming it, and the corrected rerun succeeds
    (it once met the store the failed run had made: "existing teacher store has native_dim")."""
    import ml_collections

    pairs = [("Revenue rose 5%.", "Revenue rose 50%."), ("The board met twice.", None)]
    rows = [{"id": f"a:{i}", "text": t, "perturbed": p} for i, (t, p) in enumerate(pairs)]
    corpus.save_jsonl(tmp_path / "train.jsonl", rows)
    config = ml_collections.ConfigDict(
        {"data": {"dir": str(tmp_path)}, "teacher": {"chunk_rows": 2}}
    )
    rng = np.random.default_rng(0)
    for name, shape in (("x", (2, 512)), ("px", (2, 512)), ("x_narrow", (2, 100))):
        np.save(tmp_path / f"{name}.npy", rng.standard_normal(shape).astype(np.float32))
    store = tmp_path / "teacher_train"

    def run(x: str, px: str) -> list:
        return embed_teacher.import_split(
            config, "train", 256, str(tmp_path / x), str(tmp_path / px), teacher_name="api"
        )

    with pytest.raises(ValueError, match=r"x_narrow\.npy: shape \(2, 100\): .* dim=256"):
        run("x_narrow.npy", "px.npy")
    with pytest.raises(ValueError, match=r"x_narrow\.npy: shape \(2, 100\)"):
        run("x.npy", "x_narrow.npy")  # a wrong px: not even x is written
    assert not store.exists()
    assert run("x.npy", "px.npy") == [store / "x", store / "px"]
    reader = teacher.open_reader(store / "x", expect_rows=2, expect_dim=256)
    assert reader.metadata["native_dim"] == 512



def test_passage_model_encodes_passages_and_perturbations_the_teacher_questions(tmp_path):
    """`teacher.passage_model_dir`: x and pi(x) are the passage model's vectors, q the teacher's
    (here the demo's MiniLM teacher and a copy of it with its last layer's output bias moved,
    which encodes differently), each store naming the model that wrote it."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from caliber_jax.embedder import Embedder
    from configs import demo

    rows = [{"id": "a:0", "text": "Revenue rose 5% to $10 million.",
             "perturbed": "Revenue rose 5% to $10 billion.", "query": "How much did revenue rise?"},
            {"id": "a:1", "text": "Net loss was $3.2 billion in 2020.", "perturbed": None,
             "query": "What was the net loss in 2020?"}]  # fmt: skip
    corpus.save_jsonl(tmp_path / "data" / "train.jsonl", rows)
    teacher_dir, other = Path(demo.minilm_dir()), tmp_path / "other"
    shutil.copytree(teacher_dir, other)
    weights = load_file(teacher_dir / "model.safetensors")
    bias = "encoder.layer.5.output.dense.bias"
    weights[bias] = weights[bias] + np.random.default_rng(0).normal(0, 0.5, weights[bias].shape
                                                                   ).astype(weights[bias].dtype)
    save_file(weights, other / "model.safetensors")

    result = _embed(tmp_path / "data", f"--config.teacher.passage_model_dir={other}")
    assert result.returncode == 0, result.stderr[-3000:]

    def stored(name: str) -> np.ndarray:
        reader = teacher.open_reader(tmp_path / "data" / "teacher_train" / name, expect_rows=2,
                                     expect_dim=384)  # fmt: skip
        return reader[np.arange(2)]

    def encode(model_dir: Path, texts: list[str]) -> np.ndarray:
        return np.asarray(Embedder.from_pretrained(model_dir, dtype="float32").encode(
            texts, max_length=128))  # fmt: skip

    np.testing.assert_allclose(stored("x"), encode(other, [r["text"] for r in rows]), atol=1e-5)
    np.testing.assert_allclose(stored("px")[:1], encode(other, [rows[0]["perturbed"]]), atol=1e-5)
    np.testing.assert_allclose(stored("q"), encode(teacher_dir, [r["query"] for r in rows]),
                               atol=1e-5)  # fmt: skip
    # ... and the two models do differ on these texts, so the test tells them apart.
    assert np.abs(encode(teacher_dir, [rows[0]["text"]]) - stored("x")[:1]).max() > 1e-2
    meta = {name: json.loads((tmp_path / "data" / "teacher_train" / name / "metadata.json")
                             .read_text())["teacher"] for name in ("x", "px", "q")}  # fmt: skip
    assert meta == {"x": str(other), "px": str(other), "q": str(teacher_dir)}
    # Reusing another folder's vectors would mix two models' stores: refused in one line.
    bad = _embed(tmp_path / "data", f"--config.teacher.passage_model_dir={other}",
                 f"--reuse_from={tmp_path / 'data'}")  # fmt: skip
    assert bad.returncode != 0 and "passage_model_dir" in bad.stderr
