"""Export: HF -> Flax -> Orbax -> HF round trip, and PyTorch / sentence-transformers loading."""

import json
import os
import shutil
from pathlib import Path

import grain
import ml_collections
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file
from sentence_transformers import SentenceTransformer

from caliber_jax import Embedder, checkpoint, optim, paths, step
from caliber_jax.export import WEIGHT_DTYPES, export
from caliber_jax.models import embedding
from tests.models.test_qwen3 import make_hf_qwen3

TEXTS = [
    "Net sales increased 4.2% to $32.1 billion in 2019.",
    "Operating margin declined 150 bps year over year.",
    "The company repurchased 10.5 million shares for $1.2 billion during Q3 2021.",
    "Free cash flow was negative.",
]


def make_workdir(
    tmp_path, init_dir, *, num_layers=None, out_dim=None, seed=0, max_length=128, pooling="mean",
    at_step=7,
):  # fmt: skip
    """A training workdir as `train.py` leaves it: resolved config.json and one checkpoint (at
    step `at_step`)."""
    config = ml_collections.ConfigDict(
        {
            "seed": seed,
            "model": {
                "init_dir": str(init_dir),
                "tokenizer_dir": "",
                "pooling": pooling,
                "num_layers": num_layers,
                "out_dim": out_dim,
            },
            "data": {"max_length": max_length},
        }
    )
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text(config.to_json())
    spec = embedding.read_spec(init_dir, pooling=pooling, num_layers=num_layers, out_dim=out_dim)
    flat = embedding.load_flat_params(init_dir, spec, seed=seed)
    # Perturb W_out and the encoder a little, as training would, so nothing passes by accident.
    rng = np.random.default_rng(seed)
    flat = {k: v + 0.01 * rng.standard_normal(v.shape).astype(np.float32) for k, v in flat.items()}
    _, params = embedding.split_model(spec, flat, dtype=np.float32)
    optimizer = optim.make_optimizer(
        lr=1e-4, weight_decay=0.01, warmup_frac=0.0, total_steps=10, schedule="constant",
        cycles=1, b1=0.9, b2=0.999, eps=1e-8, clip_norm=None, accum_steps=1,
    )  # fmt: skip
    state = step.init_state(nnx.to_pure_dict(params), optimizer, seed=seed)
    data_iter = iter(grain.MapDataset.range(4).to_iter_dataset())
    with checkpoint.make_manager(
        workdir / "checkpoints", max_to_keep=1, save_interval_steps=1
    ) as m:
        checkpoint.save(m, at_step, state, data_iter, force=True)
    return workdir, spec, flat


def test_round_trip_preserves_every_tensor(minilm_dir, tmp_path):
    workdir, spec, flat = make_workdir(tmp_path, minilm_dir, num_layers=3)
    out = export(workdir, tmp_path / "hf")
    tensors = load_file(out / "model.safetensors")
    # Undo the perturbation of make_workdir: compare against what was checkpointed.
    assert len(tensors) == 5 + 16 * 3 + 2  # embeddings, 3 layers, the untouched pooler
    source = load_file(minilm_dir / "model.safetensors")
    np.testing.assert_array_equal(tensors["pooler.dense.weight"], source["pooler.dense.weight"])
    np.testing.assert_array_equal(
        tensors["encoder.layer.2.attention.self.query.weight"],
        flat["encoder.layer.2.query.kernel"].T,
    )
    reloaded = embedding.load_flat_params(out, embedding.read_spec(out))
    assert set(reloaded) == set(flat)
    for name, value in flat.items():
        np.testing.assert_array_equal(reloaded[name], value, err_msg=name)
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 3
    assert json.loads((out / "caliber_export.json").read_text())["step"] == 7


@pytest.mark.parametrize("out_dim", [None, 128])
def test_bert_student_loads_in_torch_and_sentence_transformers(minilm_dir, tmp_path, out_dim):
    workdir, _, _ = make_workdir(tmp_path, minilm_dir, num_layers=3, out_dim=out_dim)
    out = export(workdir, tmp_path / "hf")
    ours = Embedder.from_pretrained(out).encode(TEXTS)
    assert ours.shape == (len(TEXTS), out_dim or 384)
    model = SentenceTransformer(str(out), device="cpu")
    reference = model.encode(TEXTS, convert_to_numpy=True)
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)
    auto, info = transformers.AutoModel.from_pretrained(out, output_loading_info=True)
    assert type(auto).__name__ == "BertModel"
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_query_prompt_is_the_instruction_evaluate_takes(minilm_dir, tmp_path):
    """`--query_prompt` means one thing in evaluate and export: the instruction. The shipped
    model's sentence-transformers "query" prompt encodes a query as the evaluation did
    (`Embedder.encode(query_task=...)`, Qwen3's "Instruct: ...\nQuery:" format)."""
    task = "Given a financial question, retrieve the filing passage that answers it"
    workdir, _, _ = make_workdir(tmp_path, minilm_dir, num_layers=2)
    out = export(workdir, tmp_path / "hf", query_prompt=task)
    prompts = json.loads((out / "config_sentence_transformers.json").read_text())["prompts"]
    assert prompts == {"query": f"Instruct: {task}\nQuery:", "document": ""}
    model = SentenceTransformer(str(out), device="cpu")
    shipped = model.encode(TEXTS[:2], prompt_name="query", convert_to_numpy=True)
    evaluated = Embedder.from_pretrained(out).encode(TEXTS[:2], query_task=task)
    np.testing.assert_allclose(shipped, evaluated, atol=1e-5, rtol=0)


def test_cls_pooled_student_exports_its_pooling(minilm_dir, tmp_path):
    """A student trained with [CLS] pooling (a BGE-style BERT) exports a Pooling module that
    sentence-transformers runs as CLS, and reads back as "cls"."""
    workdir, _, _ = make_workdir(tmp_path, minilm_dir, num_layers=2, pooling="cls")
    out = export(workdir, tmp_path / "hf")
    pooling = json.loads((out / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_cls_token"] and not pooling["pooling_mode_mean_tokens"]
    assert embedding.read_spec(out).pooling == "cls"
    ours = Embedder.from_pretrained(out).encode(TEXTS)
    reference = SentenceTransformer(str(out), device="cpu").encode(TEXTS, convert_to_numpy=True)
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)
    mean = Embedder.from_pretrained(out, pooling="mean").encode(TEXTS)
    assert np.max(np.sum(mean * ours, axis=1)) < 0.99  # the pooling did change the vectors


@pytest.fixture(scope="module")
def tiny_qwen3_with_tokenizer(tmp_path_factory, qwen_tokenizer_dir):
    path = tmp_path_factory.mktemp("tiny_qwen3_tok")
    make_hf_qwen3(path, vocab_size=151_669, pad_token_id=151_643, num_hidden_layers=2)
    for item in qwen_tokenizer_dir.iterdir():
        shutil.copy(item, path / item.name)
    return path


@pytest.mark.parametrize("out_dim", [None, 48])
def test_qwen3_student_loads_in_torch_and_sentence_transformers(
    tiny_qwen3_with_tokenizer, tmp_path, out_dim
):
    workdir, _, _ = make_workdir(tmp_path, tiny_qwen3_with_tokenizer, out_dim=out_dim)
    out = export(workdir, tmp_path / "hf")
    ours = Embedder.from_pretrained(out).encode(TEXTS)
    model = SentenceTransformer(str(out), device="cpu")
    reference = model.encode(TEXTS, convert_to_numpy=True)
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)
    auto = transformers.AutoModel.from_pretrained(out)
    assert type(auto).__name__ == "Qwen3Model"
    # The exported tokenizer appends <|endoftext|> like Qwen3-Embedding's.
    assert model.tokenizer(TEXTS[0])["input_ids"][-1] == 151_643
    with torch.no_grad():
        assert auto(**model.tokenizer(TEXTS[:1], return_tensors="pt")).last_hidden_state.ndim == 3


def test_missing_workdir_config_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        export(tmp_path, tmp_path / "out")


@pytest.mark.parametrize("out_dim", [None, 128])
def test_interpolate_blends_initial_and_trained_weights(minilm_dir, tmp_path, out_dim):
    workdir, spec, trained = make_workdir(tmp_path, minilm_dir, num_layers=3, out_dim=out_dim)
    # The initial student as train.py builds it (W_out, if any, from config.seed).
    initial = embedding.load_flat_params(minilm_dir, spec, seed=0)
    for alpha in (0.0, 0.25, 1.0):
        out = export(workdir, tmp_path / f"hf_{alpha}", interpolate=alpha)
        reloaded = embedding.load_flat_params(out, embedding.read_spec(out))
        assert set(reloaded) == set(trained)
        for name, value in trained.items():
            expected = (1 - alpha) * initial[name].astype(np.float64) + alpha * value
            # float32 storage: within half an ulp of the float64 blend.
            np.testing.assert_allclose(reloaded[name], expected, rtol=1e-7, atol=1e-9, err_msg=name)
        record = json.loads((out / "caliber_export.json").read_text())
        assert record["interpolate"] == alpha and record["step"] == 7
    # alpha 0 is exactly the initial student, alpha 1 exactly the checkpoint.
    zero = embedding.load_flat_params(tmp_path / "hf_0.0", spec)
    one = embedding.load_flat_params(tmp_path / "hf_1.0", spec)
    name = "encoder.layer.0.query.kernel"
    np.testing.assert_array_equal(zero[name], initial[name])
    np.testing.assert_array_equal(one[name], trained[name])


@pytest.mark.parametrize("out_dim", [None, 128])
def test_blend_with_mixes_two_trained_runs(minilm_dir, tmp_path, out_dim):
    """A soup of two runs from the same start: (1 - alpha) * other + alpha * this, tensor by
    tensor; the record names the other run and its step; a different student or no alpha is
    refused."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    this, spec, trained = make_workdir(tmp_path / "a", minilm_dir, num_layers=3, out_dim=out_dim)
    other, _, other_trained = make_workdir(
        tmp_path / "b", minilm_dir, num_layers=3, out_dim=out_dim, seed=1, at_step=11
    )
    out = export(this, tmp_path / "soup", interpolate=0.25, blend_with=other)
    reloaded = embedding.load_flat_params(out, embedding.read_spec(out))
    assert set(reloaded) == set(trained)
    for name, value in trained.items():
        expected = 0.75 * other_trained[name].astype(np.float64) + 0.25 * value
        np.testing.assert_allclose(reloaded[name], expected, rtol=1e-7, atol=1e-9, err_msg=name)
    assert not np.allclose(reloaded["encoder.layer.0.query.kernel"],
                           trained["encoder.layer.0.query.kernel"])  # fmt: skip
    record = json.loads((out / "caliber_export.json").read_text())
    assert record["blend_with"] == str(other) and record["interpolate"] == 0.25
    # Both runs' checkpoint steps: the other run's latest checkpoint moves as it trains on.
    assert record["step"] == 7 and record["blend_step"] == 11
    with pytest.raises(ValueError, match="blend_with needs interpolate"):
        export(this, tmp_path / "x", blend_with=other)
    (tmp_path / "c").mkdir()
    shallow, _, _ = make_workdir(tmp_path / "c", minilm_dir, num_layers=2, out_dim=out_dim)
    with pytest.raises(ValueError, match="model.num_layers is 2, this run's 3"):
        export(this, tmp_path / "y", interpolate=0.5, blend_with=shallow)


def test_interpolate_rejects_alpha_outside_unit_interval(minilm_dir, tmp_path):
    workdir, _, _ = make_workdir(tmp_path, minilm_dir, num_layers=3)
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\], got 1.5"):
        export(workdir, tmp_path / "hf", interpolate=1.5)


def test_cli_export_prints_no_checkpoint_warning(minilm_dir, tmp_path):
    """`python -m caliber_jax.export` reads the params with the item's handler: no absl warning
    about a missing _CHECKPOINT_METADATA (a Checkpointer looked for it inside `<step>/state`)."""
    import subprocess
    import sys
    from pathlib import Path

    workdir, _, flat = make_workdir(tmp_path, minilm_dir, num_layers=1)
    result = subprocess.run(
        [sys.executable, "-m", "caliber_jax.export", f"--workdir={workdir}",
         f"--output={tmp_path / 'hf'}"],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "_CHECKPOINT_METADATA" not in result.stderr and "WARNING" not in result.stderr, (
        result.stderr
    )
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    assert len(exported) > 0 and (tmp_path / "hf" / "config.json").is_file()


def _weight_files(out):
    """The export's safetensors files: the encoder's and, when present, the Dense W_out's."""
    out = Path(out)
    return [p for p in (out / "model.safetensors", out / "2_Dense" / "model.safetensors")
            if p.is_file()]  # fmt: skip


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_export_writes_every_tensor_in_that_dtype(minilm_dir, tmp_path, dtype):
    """`dtype="float16"`/"bfloat16" writes every tensor of model.safetensors (the pooler too) and
    of 2_Dense/ in that dtype, in about half the bytes of the float32 export of the same run;
    config.json's torch_dtype and the export record say it."""
    from safetensors import safe_open

    workdir, _, _ = make_workdir(tmp_path, minilm_dir, num_layers=3, out_dim=128)
    full = export(workdir, tmp_path / "hf32")
    half = export(workdir, tmp_path / f"hf_{dtype}", dtype=dtype)
    assert len(_weight_files(half)) == 2
    stored = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}
    for out, name in ((full, "float32"), (half, dtype)):
        for path in _weight_files(out):
            with safe_open(path, framework="numpy") as handle:
                found = {handle.get_slice(k).get_dtype() for k in handle.keys()}
            assert found == {stored[name]}, (path, found)
        assert json.loads((out / "config.json").read_text())["torch_dtype"] == name
        assert json.loads((out / "caliber_export.json").read_text())["dtype"] == name
    ratio = sum(p.stat().st_size for p in _weight_files(half)) / sum(
        p.stat().st_size for p in _weight_files(full)
    )
    assert 0.49 < ratio < 0.51, ratio  # 2 bytes a value instead of 4; the headers are tiny
    # The same tensors, rounded once from float32.
    for path16, path32 in zip(_weight_files(half), _weight_files(full), strict=True):
        values16, values32 = load_file(path16), load_file(path32)
        assert set(values16) == set(values32)
        for name, value in values32.items():
            np.testing.assert_array_equal(values16[name], value.astype(values16[name].dtype))
    # The loader behind `Embedder.from_pretrained` reads them back as float32 params, exactly.
    read16 = embedding.load_flat_params(half, embedding.read_spec(half))
    read32 = embedding.load_flat_params(full, embedding.read_spec(full))
    assert set(read16) == set(read32)
    for name, value in read32.items():
        assert read16[name].dtype == np.float32, name
        rounded = value.astype(WEIGHT_DTYPES[dtype]).astype(np.float32)
        np.testing.assert_array_equal(read16[name], rounded, err_msg=name)


def test_float16_export_encodes_like_float32_in_both_loaders(minilm_dir, tmp_path):
    """The float16 export's vectors agree with the float32 export's to cosine >= 0.999 per
    sentence, through `SentenceTransformer(dir)` and `Embedder.from_pretrained(dir)`, and the two
    loaders agree with each other on the float16 export.

    0.999: float16 keeps 11 significant bits, so each weight moves by at most 2^-11 of itself
    (about 5e-4), independently; over 3 layers and the W_out that turns a vector by a few 1e-4
    radians (1 - cosine ~ 3e-7 measured), so 1 - 0.999 = 1e-3 leaves a wide margin while still
    catching a wrong cast (a scaled, transposed or zeroed tensor costs far more). Cosines are of
    the normalised vectors: `SentenceTransformer` loads the float16 directory in float16
    (config.json's torch_dtype), so its Normalize runs in float16 and its vectors' norms are 1
    only to ~4e-4 (hence atol 1e-3 between the loaders); loaded in float32 it computes what
    `Embedder` computes (float32 on the float16 weights), to 1e-5.
    """
    workdir, _, _ = make_workdir(tmp_path, minilm_dir, num_layers=3, out_dim=128)
    full = export(workdir, tmp_path / "hf32")
    half = export(workdir, tmp_path / "hf16", dtype="float16")
    vectors = {}
    for name, out in (("full", full), ("half", half)):
        vectors[name, "ours"] = Embedder.from_pretrained(out).encode(TEXTS)
        model = SentenceTransformer(str(out), device="cpu")
        vectors[name, "st"] = model.encode(TEXTS, convert_to_numpy=True).astype(np.float32)

    def cosine(a, b):
        return np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    for loader in ("ours", "st"):
        agreement = cosine(vectors["half", loader], vectors["full", loader])
        assert np.all(agreement >= 0.999), (loader, agreement)
        assert np.max(np.abs(vectors["half", loader] - vectors["full", loader])) > 0  # was cast
    assert np.all(cosine(vectors["half", "ours"], vectors["half", "st"]) >= 0.999)
    np.testing.assert_allclose(vectors["half", "ours"], vectors["half", "st"], atol=1e-3, rtol=0)
    upcast = SentenceTransformer(str(half), device="cpu", model_kwargs={"dtype": torch.float32})
    np.testing.assert_allclose(
        vectors["half", "ours"], upcast.encode(TEXTS, convert_to_numpy=True), atol=1e-5, rtol=0
    )


def test_half_precision_export_casts_the_float32_blend_last(minilm_dir, tmp_path):
    """--interpolate with --dtype float16: the blend is computed in float32 (as without --dtype),
    then rounded once to float16, tensor by tensor (the Dense W_out too)."""
    workdir, _, _ = make_workdir(tmp_path, minilm_dir, num_layers=2, out_dim=128)
    full = export(workdir, tmp_path / "hf32", interpolate=0.25)
    half = export(workdir, tmp_path / "hf16", interpolate=0.25, dtype="float16")
    for path16, path32 in zip(_weight_files(half), _weight_files(full), strict=True):
        values16, values32 = load_file(path16), load_file(path32)
        for name, value in values32.items():
            np.testing.assert_array_equal(values16[name], value.astype(np.float16), err_msg=name)
    record = json.loads((half / "caliber_export.json").read_text())
    assert record["interpolate"] == 0.25 and record["dtype"] == "float16"


def test_cli_rejects_an_unknown_dtype_in_one_line(minilm_dir, tmp_path):
    """`--dtype float8` is one `error:` line on stderr (exit status 2, no traceback), and nothing
    is written."""
    import subprocess
    import sys

    workdir, _, _ = make_workdir(tmp_path, minilm_dir, num_layers=1)
    result = subprocess.run(
        [sys.executable, "-m", "caliber_jax.export", f"--workdir={workdir}",
         f"--output={tmp_path / 'hf'}", "--dtype=float8"],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: export: dtype='float8', expected one of float32, float16, bfloat16"
    ]
    assert not (tmp_path / "hf").exists()


def test_re_export_replaces_the_previous_export_whole(minilm_dir, tmp_path):
    """Exporting a run without W_out over one with a W_out leaves no 2_Dense/ or old Normalize
    folder behind, and no staging folder beside it; a 2_Dense/ that modules.json does not list
    is not applied by `Embedder` (sentence-transformers does not load it either)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with_w_out, _, _ = make_workdir(tmp_path / "a", minilm_dir, num_layers=1, out_dim=256)
    without, _, _ = make_workdir(tmp_path / "b", minilm_dir, num_layers=1, seed=1, at_step=3)
    out = tmp_path / "hf"
    export(with_w_out, out)
    stale_dense = tmp_path / "stale_dense"
    shutil.copytree(out / "2_Dense", stale_dense)
    export(without, out)
    assert not (out / "2_Dense").exists() and not (out / "3_Normalize").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "hf", "stale_dense"]
    assert json.loads((out / "caliber_export.json").read_text())["step"] == 3
    assert Embedder.from_pretrained(out).dim == 384
    shutil.copytree(stale_dense, out / "2_Dense")  # a leftover that modules.json does not list
    assert embedding.read_spec(out).out_dim is None
    assert Embedder.from_pretrained(out).dim == 384


def test_an_export_cut_short_leaves_the_previous_one_untouched(minilm_dir, tmp_path, monkeypatch):
    """An export that fails after writing its files (before DONE_FILE) changes nothing in the
    output: the previous export stays whole, finished by its own marker, and the half-written
    one is removed."""
    from caliber_jax import export as export_module

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, _, _ = make_workdir(tmp_path / "a", minilm_dir, num_layers=1)
    second, _, _ = make_workdir(tmp_path / "b", minilm_dir, num_layers=1, seed=1, at_step=3)
    out = export(first, tmp_path / "hf")
    before = {p.relative_to(out): p.read_bytes() for p in Path(out).rglob("*") if p.is_file()}
    save_pretrained = embedding.save_pretrained

    def crash_after_writing(*args, **kwargs):
        save_pretrained(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(export_module.embedding, "save_pretrained", crash_after_writing)
    with pytest.raises(KeyboardInterrupt):
        export(second, out)
    after = {p.relative_to(out): p.read_bytes() for p in Path(out).rglob("*") if p.is_file()}
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "hf"]


def test_export_refuses_to_replace_a_directory_that_holds_no_export(minilm_dir, tmp_path):
    """An export replaces its output whole, so an output that is not empty and holds no export
    (a folder of runs, the training workdir itself) is an error, and stays as it was."""
    workdir, _, _ = make_workdir(tmp_path, minilm_dir, num_layers=1)
    contents = sorted(p.name for p in workdir.iterdir())
    runs = tmp_path / "runs"
    (runs / "other").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"runs is not empty and holds no export"):
        export(workdir, runs)
    with pytest.raises(ValueError, match=r"run is workdir .*run, which the export reads"):
        export(workdir, workdir)
    assert sorted(p.name for p in workdir.iterdir()) == contents
    assert [p.name for p in runs.iterdir()] == ["other"]
    (tmp_path / "empty").mkdir()
    assert (export(workdir, tmp_path / "empty") / "caliber_export.json").is_file()


def test_copy_to_a_remote_output_writes_the_marker_last(tmp_path, monkeypatch):
    """`_copy_tree` (the copy to gs:// and other stores without rename) copies caliber_export.json
    after every other file, whatever order the folder lists its files in."""
    from etils import epath

    from caliber_jax.export import DONE_FILE, _copy_tree

    source = tmp_path / "local"
    (source / "2_Dense").mkdir(parents=True)
    for name in (DONE_FILE, "config.json", "model.safetensors", "2_Dense/model.safetensors"):
        (source / name).write_text(name)
    path_type = type(epath.Path(source))
    iterdir, copy = path_type.iterdir, path_type.copy
    # The marker first, as a store may list it.
    monkeypatch.setattr(
        path_type, "iterdir", lambda self: sorted(iterdir(self), key=lambda p: p.name != DONE_FILE)
    )
    copied = []

    def recording_copy(self, destination, **kwargs):
        copied.append(str(Path(destination).relative_to(tmp_path / "remote")))
        return copy(self, destination, **kwargs)

    monkeypatch.setattr(path_type, "copy", recording_copy)
    _copy_tree(epath.Path(source), epath.Path(tmp_path / "remote"))
    assert sorted(copied) == sorted(
        [DONE_FILE, "config.json", "model.safetensors", "2_Dense/model.safetensors"]
    )
    assert copied[-1] == DONE_FILE


@pytest.fixture
def umask_022():
    """The usual umask for the test, restored after it."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_exported_files_follow_the_umask(minilm_dir, tmp_path, umask_022):
    """Under umask 022 every file of an export is 0644 like the tokenizer's, not 0600 (the
    weights, config.json and the rest once came from `tempfile.mkstemp`)."""
    workdir, _, _ = make_workdir(tmp_path, minilm_dir, num_layers=1, out_dim=32)
    out = Path(export(workdir, tmp_path / "hf", dtype="float16"))  # the cast rewrites weights
    modes = {str(p.relative_to(out)): p.stat().st_mode & 0o777 for p in out.rglob("*")}
    files = {name for name in modes if (out / name).is_file()}
    assert {"model.safetensors", "config.json", "modules.json", "caliber_export.json",
            "2_Dense/model.safetensors", "2_Dense/config.json"} <= files  # fmt: skip
    assert {name: modes[name] for name in files if modes[name] != 0o644} == {}


def test_save_atomic_leaves_nothing_behind_when_the_write_fails(tmp_path):
    from caliber_jax.models import hf

    target = tmp_path / "config.json"
    hf.save_json({"a": 1}, target)

    def fail(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        paths.write_atomic(target, fail)
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]
    assert json.loads(target.read_text()) == {"a": 1}


def test_write_text_whole_renames_a_local_file_and_uploads_a_remote_one_once(tmp_path, monkeypatch):
    """A local file is written beside itself and renamed over the old one (nothing left behind);
    a remote one (`gs://...`: an object store, no rename) goes up in one `write_text`."""
    target = tmp_path / "config.json"
    target.write_text("old")
    paths.write_text_whole(target, "new")
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["config.json"]

    uploads = []

    class Remote:
        def __init__(self, text):
            self.text = text

        def write_text(self, text, encoding=None):
            uploads.append((self.text, text, encoding))

    monkeypatch.setattr(paths, "as_path", Remote)
    monkeypatch.setattr(paths, "write_atomic", lambda *a: pytest.fail("renamed on a bucket"))
    paths.write_text_whole("gs://bucket/run/config.json", "{}")
    assert uploads == [("gs://bucket/run/config.json", "{}", "utf-8")]


def test_a_missing_step_lists_the_saved_steps(minilm_dir, tmp_path):
    """`--step` of a step never saved: one line with the saved steps, not Orbax's missing
    _METADATA file; nothing is written."""
    workdir, _, _ = make_workdir(tmp_path, minilm_dir, num_layers=1, at_step=7)
    message = rf"no checkpoint at step 5 in {workdir / 'checkpoints'}; saved steps: 7$"
    with pytest.raises(FileNotFoundError, match=message):
        export(workdir, tmp_path / "hf", step=5)
    assert not (tmp_path / "hf").exists()


def test_an_unwritable_output_is_named_not_the_staging_folder(minilm_dir, tmp_path):
    """An output that cannot be created is reported by its own path (the staging folder beside
    it is an implementation detail), before the checkpoint is read."""
    workdir, _, _ = make_workdir(tmp_path, minilm_dir, num_layers=1)
    (tmp_path / "afile").write_text("")
    output = tmp_path / "afile" / "hf"  # its parent is a file
    with pytest.raises(OSError) as raised:
        export(workdir, output)
    assert str(raised.value).startswith(f"export: cannot write {output}: ")
    assert ".export-" not in str(raised.value)


def test_export_refuses_a_model_folder_that_is_no_export(minilm_dir, tmp_path):
    """A downloaded model folder (weights, config.json, tokenizer, a user's notes) is not an
    export: only caliber_export.json, which every export writes, makes a folder replaceable, so
    `--output` pointed at it is one error line and the folder stays as it was."""
    workdir, _, _ = make_workdir(tmp_path, minilm_dir, num_layers=1)
    downloaded = tmp_path / "downloaded"
    shutil.copytree(minilm_dir, downloaded)
    (downloaded / "NOTES.md").write_text("where this model came from\n")
    before = {p.relative_to(downloaded): p.read_bytes() for p in downloaded.rglob("*")
              if p.is_file()}  # fmt: skip
    assert (downloaded / "model.safetensors").is_file()
    with pytest.raises(ValueError, match=r"downloaded is not empty and holds no export") as raised:
        export(workdir, downloaded)
    assert "\n" not in str(raised.value) and "caliber_export.json" in str(raised.value)
    after = {p.relative_to(downloaded): p.read_bytes() for p in downloaded.rglob("*")
             if p.is_file()}  # fmt: skip
    assert after == before
    # What an export leaves is replaceable: its marker says so.
    out = export(workdir, tmp_path / "hf")
    assert (out / "caliber_export.json").is_file()
    assert export(workdir, out) == out


def test_export_refuses_an_output_that_overlaps_what_it_reads(minilm_dir, tmp_path):
    """`--output` equal to, inside or around the init dir (read for every export: tokenizer,
    passthrough tensors; with `--interpolate`, the start it blends from) or `--blend_with`'s run
    is refused before anything is written, even where that folder is itself an export (a
    student initialised from an earlier export)."""
    init = tmp_path / "init"
    shutil.copytree(minilm_dir, init)
    (tmp_path / "w").mkdir()
    workdir, _, _ = make_workdir(tmp_path / "w", init, num_layers=1)
    first = export(workdir, tmp_path / "first")
    before = sorted(p.name for p in init.iterdir())
    # The init dir made to look like an export: the replaceable check alone would let it go.
    (init / "caliber_export.json").write_text("{}")
    for output, relation in ((init, "is"), (init / "hf", "is inside"), (tmp_path, "holds")):
        for options in ({}, {"interpolate": 0.5}):
            with pytest.raises(ValueError, match=rf"{relation} model.init_dir") as raised:
                export(workdir, output, **options)
            assert "\n" not in str(raised.value)
    (init / "caliber_export.json").unlink()
    assert sorted(p.name for p in init.iterdir()) == before and not (init / "hf").exists()
    # --blend_with's run: the other source of a soup.
    (tmp_path / "o").mkdir()
    other, _, _ = make_workdir(tmp_path / "o", init, num_layers=1, seed=1)
    with pytest.raises(ValueError, match=r"is inside blend_with"):
        export(workdir, other / "soup", interpolate=0.5, blend_with=other)
    assert not (other / "soup").exists()
    assert (first / "caliber_export.json").is_file()


def test_a_remote_export_cut_short_can_be_exported_again(minilm_dir, tmp_path, monkeypatch):
    """A store without rename gets the files one by one: an export cut short there holds no
    caliber_export.json yet, but its in-progress marker (written first) still lets a rerun
    replace it."""
    from caliber_jax import export as export_module

    workdir, _, _ = make_workdir(tmp_path, minilm_dir, num_layers=1)
    output = tmp_path / "bucket" / "hf"
    monkeypatch.setattr(export_module.paths, "is_remote", lambda path: True)
    copy_tree = export_module._copy_tree

    def cut_short(source, target):
        target.mkdir(parents=True, exist_ok=True)
        (target / "config.json").write_text("{}")  # one file copied, then the job is killed
        raise KeyboardInterrupt

    monkeypatch.setattr(export_module, "_copy_tree", cut_short)
    with pytest.raises(KeyboardInterrupt):
        export(workdir, output)
    assert not (output / "caliber_export.json").exists()
    monkeypatch.setattr(export_module, "_copy_tree", copy_tree)
    export(workdir, output)
    names = sorted(p.name for p in output.iterdir())
    assert "caliber_export.json" in names and "model.safetensors" in names
    assert not any(name.endswith(".partial") for name in names)
    assert Embedder.from_pretrained(output).dim == 384
