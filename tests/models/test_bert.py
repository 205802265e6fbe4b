"""BERT port vs sentence-transformers on the real all-MiniLM-L6-v2 weights and real filing text."""

import json

import numpy as np
import pytest
import torch
import transformers
from sentence_transformers import SentenceTransformer

from caliber_jax import Embedder


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return Embedder.from_pretrained(minilm_dir)


def test_matches_sentence_transformers_on_filings(minilm, minilm_dir, filing_passages):
    assert len(filing_passages) >= 60
    reference = SentenceTransformer(str(minilm_dir), device="cpu").encode(
        filing_passages, batch_size=16, convert_to_numpy=True
    )
    ours = minilm.encode(filing_passages, batch_size=16)
    assert minilm.max_length == 256  # sentence_bert_config.json's max_seq_length
    assert ours.shape == reference.shape == (len(filing_passages), 384)
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)


def test_order_and_batch_size_do_not_change_vectors(minilm, filing_passages):
    texts = filing_passages[:20]
    a = minilm.encode(texts, batch_size=3)
    b = minilm.encode(texts[::-1], batch_size=8)[::-1]
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_bfloat16_close_to_float32(minilm, minilm_dir, filing_passages):
    bf16 = Embedder.from_pretrained(minilm_dir, dtype="bfloat16")
    texts = filing_passages[:24]
    cos = np.sum(minilm.encode(texts) * bf16.encode(texts), axis=1)
    assert cos.min() >= 0.999


def test_first_layers_match_transformers_truncated_model(minilm_dir, filing_passages):
    ours = Embedder.from_pretrained(minilm_dir, num_layers=3)
    model = transformers.BertModel.from_pretrained(minilm_dir, num_hidden_layers=3).eval()
    texts = filing_passages[:8]
    batch = ours.tokenizer(
        texts, padding=True, truncation=True, max_length=256, return_tensors="pt"
    )
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    reference = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    np.testing.assert_allclose(ours.encode(texts), reference.numpy(), atol=1e-5, rtol=0)


def test_out_dim_adds_w_out(minilm_dir, filing_passages):
    emb = Embedder.from_pretrained(minilm_dir, out_dim=128, num_layers=2)
    vecs = emb.encode(filing_passages[:4])
    assert vecs.shape == (4, 128)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-6)


def test_legacy_gamma_beta_names_load(minilm_dir, tmp_path, filing_passages):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(minilm_dir / "model.safetensors")
    renamed = {
        "bert."
        + k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        ): v
        for k, v in tensors.items()
    }
    save_file(renamed, tmp_path / "model.safetensors")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):  # fmt: skip
        (tmp_path / name).write_bytes((minilm_dir / name).read_bytes())
    texts = filing_passages[:4]
    a = Embedder.from_pretrained(minilm_dir).encode(texts, max_length=128)
    b = Embedder.from_pretrained(tmp_path).encode(texts, max_length=128)
    np.testing.assert_array_equal(a, b)


def test_unsupported_config_field_is_named(minilm_dir, tmp_path):
    config = json.loads((minilm_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps({**config, "position_embedding_type": "relative_key"})
    )
    with pytest.raises(ValueError, match="position_embedding_type='relative_key'"):
        Embedder.from_pretrained(tmp_path)


def _with_pooling(minilm_dir, path, **flags):
    """A copy of all-MiniLM-L6-v2 whose sentence-transformers Pooling module has these flags."""
    path.mkdir()
    for item in minilm_dir.iterdir():
        if item.is_file():
            (path / item.name).symlink_to(item)
    (path / "1_Pooling").mkdir()
    config = json.loads((minilm_dir / "1_Pooling" / "config.json").read_text())
    config = {**config, **{key: False for key in config if key.startswith("pooling_mode_")}}
    (path / "1_Pooling" / "config.json").write_text(json.dumps({**config, **flags}))
    return path


def test_cls_pooling_matches_sentence_transformers(minilm_dir, tmp_path, filing_passages):
    """A directory whose Pooling module takes [CLS] (BGE and other BERT embedders) is pooled so."""
    path = _with_pooling(minilm_dir, tmp_path / "cls", pooling_mode_cls_token=True)
    texts = filing_passages[:24]
    reference = SentenceTransformer(str(path), device="cpu").encode(texts, convert_to_numpy=True)
    ours = Embedder.from_pretrained(path)
    assert ours.spec.pooling == "cls"
    np.testing.assert_allclose(ours.encode(texts, batch_size=5), reference, atol=1e-5, rtol=0)
    mean = Embedder.from_pretrained(minilm_dir).encode(texts)
    assert np.max(np.sum(mean * reference, axis=1)) < 0.99  # CLS is not the mean here


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"pooling_mode_max_tokens": True}, r"max pooling is not in the Flax encoders"),
        (
            {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True},
            r"1_Pooling/config.json: expected one pooling mode, found \['mean', 'cls'\]",
        ),
    ],
)
def test_pooling_the_encoders_cannot_run_is_named(minilm_dir, tmp_path, flags, message):
    path = _with_pooling(minilm_dir, tmp_path / "pooling", **flags)
    with pytest.raises(ValueError, match=message):
        Embedder.from_pretrained(path)
