"""scripts/study_mpnet.py: the truncated-teacher stores and the untrained student it evaluates."""

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from caliber_jax.data import corpus, teacher

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
_spec = importlib.util.spec_from_file_location("study_mpnet", REPO / "scripts" / "study_mpnet.py")
study_mpnet = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(study_mpnet)


def _run(stage: str, argv: list[str], times: dict[str, float]) -> None:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    times[stage] = time.perf_counter() - start


def _unit_rows(rng, rows: int) -> np.ndarray:
    vectors = rng.standard_normal((rows, 768)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_truncated_stores_are_the_768_stores_cut_and_renormalised(tmp_path):
    data, data_384 = tmp_path / "data", tmp_path / "data_384"
    data.mkdir()
    rng = np.random.default_rng(0)
    native = {}
    for split, rows in (("train", 5), ("val", 3)):
        texts = [f"Revenue was ${i + 1} million in {split}." for i in range(rows)]
        perturbed = [f"Revenue was ${i + 7} million." if i % 2 else None for i in range(rows)]
        records = [
            {"id": f"{split}:{i}", "text": t, "perturbed": p}
            for i, (t, p) in enumerate(zip(texts, perturbed, strict=True))
        ]
        corpus.save_jsonl(data / f"{split}.jsonl", records)
        for name, column in (("x", texts), ("px", [p or "" for p in perturbed])):
            vectors = _unit_rows(rng, rows)
            native[split, name] = vectors
            teacher.embed_to_store(
                lambda batch, v=vectors, c=column: v[[c.index(t) for t in batch]],
                column,
                data / f"teacher_{split}" / name,
                batch_rows=8,
                dim=768,
                chunk_rows=2,
                process_index=0,
                process_count=1,
                metadata={"teacher": "fake-mpnet", "pooling": "mean", "native_dim": 768},
            )
    times: dict[str, float] = {}
    study_mpnet.derive_truncated(data, data_384, _run, [], times)
    for split, rows in (("train", 5), ("val", 3)):
        assert (data_384 / f"{split}.jsonl").resolve() == (data / f"{split}.jsonl").resolve()
        for name in ("x", "px"):
            stored = teacher.open_reader(
                data_384 / f"teacher_{split}" / name, expect_rows=rows, expect_dim=384
            )[np.arange(rows)]
            cut = native[split, name][:, :384]
            expected = cut / np.linalg.norm(cut, axis=1, keepdims=True)
            if name == "px":
                expected[0::2] = 0.0  # rows without a perturbation stay zero
            np.testing.assert_allclose(stored, expected, atol=1e-6)
    assert set(times) == {"teacher vectors 384 (train)", "teacher vectors 384 (val)"}
    # Done: a rerun skips both splits.
    again: dict[str, float] = {}
    study_mpnet.derive_truncated(data, data_384, _run, [], again)
    assert again == {}


def test_initial_student_is_minilm_with_the_seeded_w_out(minilm_dir, tmp_path):
    from caliber_jax.models import embedding

    hf_dir = study_mpnet.write_initial(
        tmp_path / "hf", init_dir=str(minilm_dir), out_dim=768, seed=0, max_length=128
    )
    spec = embedding.read_spec(hf_dir, pooling="mean", num_layers=None, out_dim=768)
    written = embedding.load_flat_params(hf_dir, spec)
    spec_init = embedding.read_spec(minilm_dir, pooling="mean", num_layers=None, out_dim=768)
    expected = embedding.load_flat_params(minilm_dir, spec_init, seed=0)  # what train.py uses
    assert sorted(written) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)
