"""The PyTorch teacher backend: SentenceTransformer parity, resume after a kill, text hash."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from caliber_jax.data import corpus, teacher, torch_teacher

REPO = Path(__file__).resolve().parents[2]
MAX_LENGTH = 256  # all-MiniLM-L6-v2's own max_seq_length


@pytest.fixture(scope="module")
def reference(minilm_dir, filing_passages) -> np.ndarray:
    """SentenceTransformer.encode of the real passages: [n, 384] unit vectors."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_dir), device="cpu")
    model.max_seq_length = MAX_LENGTH
    return model.encode(filing_passages, batch_size=16, normalize_embeddings=True)


def test_store_equals_sentence_transformers_encode(
    minilm_dir, filing_passages, reference, tmp_path
):
    encoder = torch_teacher.TorchEncoder(minilm_dir, pooling="mean", dtype="float32", device="cpu")
    assert (encoder.dim, encoder.pooling, encoder.device) == (384, "mean", "cpu")
    texts = list(filing_passages)
    texts[3] = ""  # an unperturbed row of a pi(x) store: stays zero, never encoded
    store = teacher.embed_to_store(
        encoder.encode_fn(batch_size=16, max_length=MAX_LENGTH),
        texts,
        tmp_path / "x",
        batch_rows=16,
        dim=384,
        chunk_rows=32,
        process_index=0,
        process_count=1,
        metadata={"teacher": str(minilm_dir), "pooling": encoder.pooling, "native_dim": 384},
    )
    reader = teacher.open_reader(
        store.path, expect_rows=len(texts), expect_dim=384, expect_hash=teacher.text_hash(texts)
    )
    stored = reader[np.arange(len(texts))]
    keep = np.arange(len(texts)) != 3
    assert np.abs(stored[keep] - reference[keep]).max() <= 1e-5
    assert not stored[3].any()


def test_plain_transformers_dir_matches_sentence_transformers(
    minilm_dir, filing_passages, reference, tmp_path
):
    # The same weights without modules.json: AutoModel + our mean pooling + L2 normalisation.
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
        "special_tokens_map.json",
    ):
        if (minilm_dir / name).exists():
            (plain / name).symlink_to(minilm_dir / name)
    encoder = torch_teacher.TorchEncoder(plain, pooling="mean", dtype="float32", device="cpu")
    assert not encoder.is_sentence_transformers and encoder.dim == 384
    vectors = encoder.encode(filing_passages, batch_size=16, max_length=MAX_LENGTH)
    assert np.abs(vectors - reference).max() <= 1e-5
    with pytest.raises(ValueError, match="Pooling module uses 'mean', config asks 'cls'"):
        torch_teacher.TorchEncoder(minilm_dir, pooling="cls", dtype="float32", device="cpu")


def test_token_budget_batches_keep_every_vector(minilm_dir, filing_passages, reference, tmp_path):
    """With `tokens_per_batch` the texts go length-sorted in batches of `padding.batch_plan`
    (many short ones to a pass, few long ones) and come back in input order, equal to
    SentenceTransformer's vectors, for the sentence-transformers and the plain layout."""
    from caliber_jax.data import padding

    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "vocab.txt", "special_tokens_map.json"):  # fmt: skip
        if (minilm_dir / name).exists():
            (plain / name).symlink_to(minilm_dir / name)
    texts = list(filing_passages)
    budget = 2048
    for directory in (minilm_dir, plain):
        encoder = torch_teacher.TorchEncoder(
            directory, pooling="mean", dtype="float32", device="cpu"
        )
        lengths = encoder.token_lengths(texts, MAX_LENGTH)
        assert lengths.max() <= MAX_LENGTH and lengths.min() > 2
        plan = padding.batch_plan(lengths, batch_size=16, max_length=MAX_LENGTH,
                                  tokens_per_batch=budget)  # fmt: skip
        sizes = {len(rows) for rows, _, _ in plan}
        assert len(sizes) > 1 and max(sizes) > 16  # short texts many to a batch
        calls: list[int] = []

        def counted(batch, *, calls=calls, original=encoder._encode, **options):
            calls.append(len(batch))  # the rows of each forward pass
            return original(batch, **options)

        encoder._encode = counted
        vectors = encoder.encode(texts, batch_size=16, max_length=MAX_LENGTH,
                                 tokens_per_batch=budget)  # fmt: skip
        assert calls == [len(rows) for rows, _, _ in plan]
        assert np.abs(vectors - reference).max() <= 1e-5, directory


def _command(data_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "caliber_jax.embed_teacher",
        f"--config={REPO / 'configs/demo.py'}",
        f"--config.data.dir={data_dir}",
        "--splits=train",
        "--config.teacher.backend=torch",
        "--config.teacher.device=cpu",
        "--config.teacher.chunk_rows=4",
        "--config.teacher.batch_size=4",
        f"--config.teacher.max_length={MAX_LENGTH}",
        "--compilation_cache=none",
    ]


def _write_passages(data_dir: Path, texts: list[str]) -> None:
    rows = [
        {"id": f"p:{i}", "text": text, "perturbed": text.replace("the", "a") if i % 2 else None}
        for i, text in enumerate(texts)
    ]
    corpus.save_jsonl(data_dir / "train.jsonl", rows)


@pytest.mark.slow(65)
def test_cli_resumes_after_a_kill_and_checks_the_text_hash(
    minilm_dir, filing_passages, reference, tmp_path
):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    # 32 of the passages: 8 chunks of 4 rows per store, enough for a kill to land mid-run; three
    # encodes of all 120 at 256 tokens made this the suite's slowest test.
    texts = list(filing_passages)[:32]
    reference = reference[:32]
    _write_passages(data_dir, texts)
    store_x = data_dir / "teacher_train" / "x"
    num_chunks = -(-len(texts) // 4)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    process = subprocess.Popen(
        _command(data_dir), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        done = store_x / "done"
        if done.is_dir() and len(os.listdir(done)) >= 2:
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    finished = sorted(int(name) for name in os.listdir(store_x / "done"))
    assert 2 <= len(finished) < num_chunks, "the kill must land mid-run"
    first_chunk = store_x / "c" / str(finished[0]) / "0"
    written_at = first_chunk.stat().st_mtime_ns

    result = subprocess.run(
        _command(data_dir), cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(os.listdir(store_x / "done")) == num_chunks
    assert first_chunk.stat().st_mtime_ns == written_at, "a finished chunk was rewritten"
    stored = teacher.open_reader(store_x, expect_rows=len(texts), expect_dim=384)
    resumed = stored[np.arange(len(texts))]
    assert np.abs(resumed - reference).max() <= 1e-5
    metadata = json.loads((store_x / "metadata.json").read_text())
    assert (metadata["backend"], metadata["pooling"], metadata["native_dim"]) == (
        "torch",
        "mean",
        384,
    )
    assert metadata["text_hash"] == teacher.text_hash(texts)

    # The same run from scratch gives an identical store.
    fresh_dir = tmp_path / "fresh"
    fresh_dir.mkdir()
    _write_passages(fresh_dir, texts)
    fresh = subprocess.run(
        _command(fresh_dir), cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    for name in ("x", "px"):
        rows = len(texts)
        again = teacher.open_reader(
            fresh_dir / "teacher_train" / name, expect_rows=rows, expect_dim=384
        )[np.arange(rows)]
        before = teacher.open_reader(
            data_dir / "teacher_train" / name, expect_rows=rows, expect_dim=384
        )[np.arange(rows)]
        np.testing.assert_array_equal(again, before)

    # A changed text list is refused: one line naming the store and the text hash.
    _write_passages(data_dir, [texts[1], texts[0], *texts[2:]])
    refused = subprocess.run(
        _command(data_dir), cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: {store_x}: existing teacher store has text_hash=")


def test_evaluate_encodes_through_the_torch_backend(minilm_dir, filing_passages, reference):
    from caliber_jax import evaluate

    encode_fn, limit = evaluate._encode_fn(
        str(minilm_dir),
        pooling=None,
        dtype="float32",
        batch_size=8,
        max_length=None,
        backend="torch",
        device="cpu",
    )
    assert limit == MAX_LENGTH  # the model's own, recorded in the results' settings
    vectors = encode_fn(filing_passages[:12])
    assert np.abs(vectors - reference[:12]).max() <= 1e-5


@pytest.mark.parametrize("native", [True, False])
def test_auto_dtype_is_bfloat16_autocast_only_where_the_cpu_multiplies_it(
    minilm_dir, filing_passages, reference, monkeypatch, native
):
    """ "auto": float32 weights under bfloat16 autocast on a CPU with bfloat16 instructions (the
    vectors within the rounding of bfloat16 products), plain float32 elsewhere (equal)."""
    from caliber_jax import host

    monkeypatch.setattr(host, "native_bf16", lambda: native)
    model = torch_teacher.TorchEncoder(minilm_dir, pooling="mean", dtype="auto", device="cpu")
    assert model.autocast is native
    got = model.encode(filing_passages, batch_size=16, max_length=MAX_LENGTH)
    assert got.dtype == np.float32
    cosines = np.sum(got * reference, axis=1)
    if native:
        assert 0.999 < cosines.min() < 1 - 1e-7, cosines.min()  # close, not equal
    else:
        np.testing.assert_allclose(got, reference, atol=1e-5)


def test_plain_dir_pools_real_tokens_on_either_padding_side(qwen_tokenizer_dir, tmp_path):
    """Qwen3-Embedding's tokenizer pads on the left: "last" and "cls" pool the last and first
    real token wherever the padding sits (the last slot of a left-padded row is a real token, of
    a right-padded one a pad): a batch gives each text's vector alone, on both sides."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir))
    tokenizer.save_pretrained(str(tmp_path))
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    transformers.Qwen3Model(config).save_pretrained(str(tmp_path))
    texts = ["Revenue rose 12%.", "Q3", "Net income was $3.2 billion, up from $2.9 billion."]
    settings = json.loads((tmp_path / "tokenizer_config.json").read_text())
    for side in ("left", "right"):
        (tmp_path / "tokenizer_config.json").write_text(
            json.dumps({**settings, "padding_side": side})
        )
        padded = transformers.AutoTokenizer.from_pretrained(str(tmp_path))(
            ["a b", "a"], padding=True
        )
        assert padded["attention_mask"][1][0 if side == "left" else -1] == 0  # the side in effect
        for pooling in ("last", "cls"):
            encoder = torch_teacher.TorchEncoder(tmp_path, pooling=pooling, dtype="float32",
                                                 device="cpu")  # fmt: skip
            batched = encoder.encode(texts, batch_size=3, max_length=64)
            alone = [encoder.encode([text], batch_size=1, max_length=64) for text in texts]
            assert np.isfinite(batched).all(), (side, pooling)
            np.testing.assert_allclose(batched, np.concatenate(alone), atol=1e-5, rtol=0,
                                       err_msg=f"{side} padding, {pooling}")  # fmt: skip


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)


def _linked_copy(source: Path, target: Path, *, leave_out: tuple[str, ...] = ()) -> Path:
    """`target` holding a symlink to each entry of `source` but those named in `leave_out`."""
    target.mkdir()
    for entry in source.iterdir():
        if entry.name not in leave_out:
            (target / entry.name).symlink_to(entry)
    return target


def _refuse_loading(monkeypatch) -> None:
    """Makes any model load fail the test: a refusal must come before loading."""
    import sentence_transformers
    import transformers

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before the directory was checked")

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", loaded)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", loaded)
    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", loaded)


def test_a_dir_without_tokenizer_files_is_refused_before_loading(minilm_dir, tmp_path, monkeypatch):
    """Without its tokenizer files transformers builds an empty vocabulary (every word [UNK])
    and the vectors come out without an error: refused, in the sentence-transformers and the
    plain layout, as the Flax backend refuses."""
    no_tokenizer = _linked_copy(minilm_dir, tmp_path / "st", leave_out=TOKENIZER_FILES)
    plain = _linked_copy(
        minilm_dir, tmp_path / "plain", leave_out=(*TOKENIZER_FILES, "modules.json")
    )
    _refuse_loading(monkeypatch)
    for directory in (no_tokenizer, plain):
        with pytest.raises(
            ValueError, match=rf"^{re.escape(str(directory))}: no tokenizer files \(tokenizer.json"
        ):
            torch_teacher.TorchEncoder(directory, pooling="mean", dtype="float32", device="cpu")


def test_a_module_folder_listed_but_missing_is_refused(minilm_dir, tmp_path, monkeypatch):
    """A Dense module that modules.json lists without its folder (sentence-transformers: a
    TypeError traceback from Dense.__init__) or without its config.json is one ValueError naming
    the folder; a present Dense module loads and sets the width."""
    from sentence_transformers.models import Dense

    modules = json.loads((minilm_dir / "modules.json").read_text())
    dense = {"idx": 3, "name": "3", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    student = _linked_copy(minilm_dir, tmp_path / "student", leave_out=("modules.json",))
    (student / "modules.json").write_text(json.dumps([*modules[:2], dense, modules[2]]))
    listing = f"{student}/modules.json"
    with monkeypatch.context() as patched:
        _refuse_loading(patched)
        missing = f"{student}/2_Dense: the Dense module listed in {listing} is missing"
        with pytest.raises(ValueError, match=f"^{re.escape(missing)}$"):
            torch_teacher.TorchEncoder(student, pooling="mean", dtype="float32", device="cpu")
        (student / "2_Dense").mkdir()
        with pytest.raises(
            ValueError, match=rf"^{re.escape(str(student))}/2_Dense: .* has no config.json$"
        ):
            torch_teacher.TorchEncoder(student, pooling="mean", dtype="float32", device="cpu")
    Dense(in_features=384, out_features=128).save(str(student / "2_Dense"))
    encoder = torch_teacher.TorchEncoder(student, pooling="mean", dtype="float32", device="cpu")
    assert encoder.dim == 128
    assert encoder.encode(["Revenue rose 12%."], batch_size=1, max_length=None).shape == (1, 128)


def test_max_length_zero_is_the_models_own_and_past_the_positions_is_refused(
    minilm_dir, filing_passages, reference
):
    """0 means the model's own limit (as on the Flax backend; it used to reach torch as "no
    truncation" and fail on a long text); a length past the 512-row position table or below 0 is
    one ValueError naming the directory, before any encoding; 512 itself encodes."""
    encoder = torch_teacher.TorchEncoder(minilm_dir, pooling="mean", dtype="float32", device="cpu")
    long_text = " ".join(filing_passages) * 2  # thousands of tokens
    assert encoder.token_lengths([long_text], 0).tolist() == [MAX_LENGTH]
    texts = [filing_passages[0], long_text]
    own = encoder.encode(texts, batch_size=2, max_length=None)
    np.testing.assert_array_equal(encoder.encode_fn(batch_size=2, max_length=0)(texts), own)
    assert np.abs(own[0] - reference[0]).max() <= 1e-5
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(minilm_dir))}: max_length=1000 exceeds the 512 "
    ):
        encoder.encode_fn(batch_size=2, max_length=1000)
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(minilm_dir))}: max_length=-5 is negative"
    ):
        encoder.encode(texts, batch_size=2, max_length=-5)
    at_table = encoder.encode([long_text], batch_size=1, max_length=512)
    assert np.isfinite(at_table).all() and np.abs(at_table - own[1]).max() > 1e-3
    # Encoding at 512 leaves the model's own limit (sentence-transformers' max_seq_length) alone.
    assert (encoder.model_max_length(), encoder.positions) == (MAX_LENGTH, 512)
    np.testing.assert_array_equal(encoder.encode(texts, batch_size=2, max_length=None), own)


def test_position_limit_reads_the_table_less_its_offset():
    """BERT embeds max_position_embeddings positions, MPNet two fewer (its positions start after
    the pad id), Qwen3's rotary positions stop at max_position_embeddings."""
    import transformers

    sizes = dict(vocab_size=64, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=16, max_position_embeddings=40)  # fmt: skip
    bert = transformers.BertModel(transformers.BertConfig(**sizes))
    mpnet = transformers.MPNetModel(transformers.MPNetConfig(**sizes))
    qwen3 = transformers.Qwen3Model(
        transformers.Qwen3Config(**sizes, num_key_value_heads=1, head_dim=4)
    )
    assert [torch_teacher.position_limit(m) for m in (bert, mpnet, qwen3)] == [40, 38, 40]
