"""Qwen3 port vs transformers' PyTorch `Qwen3Model` on random tiny configs (float32, CPU)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file, save_file

from caliber_jax import Embedder
from caliber_jax.models import embedding, hf

TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,
    rms_norm_eps=1e-6,
    rope_theta=10_000.0,
    max_position_embeddings=512,
    pad_token_id=0,
)
LENGTHS = (5, 37, 12, 64, 1, 20)


def make_hf_qwen3(path, *, seed=0, **overrides):
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(**{**TINY, **overrides})
    model = transformers.Qwen3Model(config).eval()
    # Non-trivial norm weights, so a missed norm would show.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    return model


def random_ids(seed=1, lengths=LENGTHS):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, TINY["vocab_size"], size=n).tolist() for n in lengths]


def torch_embed(model, seqs, pooling):
    """Reference: right-padded batch through transformers, pooled and normalised in torch."""
    longest = max(map(len, seqs))
    ids = torch.zeros((len(seqs), longest), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    if pooling == "mean":
        m = mask[..., None].float()
        pooled = (hidden * m).sum(1) / m.sum(1)
    elif pooling == "cls":
        pooled = hidden[:, 0]
    else:
        pooled = hidden[torch.arange(len(seqs)), mask.sum(1) - 1]
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen3")
    model = make_hf_qwen3(path, attn_implementation="eager")
    return path, model


@pytest.mark.parametrize("pooling", ["mean", "last", "cls"])
def test_matches_transformers_float32(tiny_dir, pooling):
    path, model = tiny_dir
    seqs = random_ids()
    ours = Embedder.from_pretrained(path, pooling=pooling).encode_ids(seqs, batch_size=4)
    ref = torch_embed(model, seqs, pooling)
    assert ours.shape == (len(seqs), TINY["hidden_size"])
    np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)


def test_attention_bias_and_mha(tmp_path):
    model = make_hf_qwen3(
        tmp_path, seed=3, attention_bias=True, num_key_value_heads=4, attn_implementation="eager"
    )
    seqs = random_ids(seed=4)
    ours = Embedder.from_pretrained(tmp_path, pooling="mean").encode_ids(seqs)
    np.testing.assert_allclose(ours, torch_embed(model, seqs, "mean"), atol=1e-5, rtol=0)


@pytest.mark.parametrize("pooling", ["last", "cls"])
def test_left_padding_equals_right_padding(tiny_dir, pooling):
    """Positions count real tokens only, so the padding side does not change the embedding."""
    path, _ = tiny_dir
    emb = Embedder.from_pretrained(path, pooling=pooling)
    model = nnx.merge(emb.graphdef, emb.params)
    seqs = random_ids(seed=7, lengths=(3, 9, 16))
    right = np.zeros((3, 16), np.int32)
    left = np.zeros((3, 16), np.int32)
    for row, seq in enumerate(seqs):
        right[row, : len(seq)] = seq
        left[row, 16 - len(seq) :] = seq
    out_right = model(jnp.asarray(right), jnp.asarray((right > 0).astype(np.int32)))
    out_left = model(jnp.asarray(left), jnp.asarray((left > 0).astype(np.int32)))
    np.testing.assert_allclose(np.asarray(out_left), np.asarray(out_right), atol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "last", "cls"])
def test_packed_rows_match_transformers(tiny_dir, pooling):
    """Sequences packed end to end (causal within each, RoPE positions restarting) give each
    sequence's transformers embedding; an id no token carries gives a zero vector."""
    from caliber_jax.data import padding

    path, model = tiny_dir
    seqs = random_ids(seed=11)
    emb = Embedder.from_pretrained(path, pooling=pooling)
    slots = [0, 2, 3, 4, 5, 6]  # slot 1 left empty
    ids, slot_ids, positions = padding.pack_rows(
        seqs, slots, rows=3, length=72, pad_id=0, pad_slot=99
    )
    assert len(np.unique(slot_ids[0])) >= 3  # rows do hold several sequences
    out = nnx.merge(emb.graphdef, emb.params).embed_packed(
        jnp.asarray(ids), jnp.asarray(slot_ids), jnp.asarray(positions), num_segments=7
    )
    out = np.asarray(out)
    np.testing.assert_allclose(out[slots], torch_embed(model, seqs, pooling), atol=1e-5, rtol=0)
    assert np.all(out[1] == 0)


def test_num_layers_truncation_matches_shallower_transformers_model(tiny_dir):
    path, _ = tiny_dir
    shallow = transformers.Qwen3Model.from_pretrained(
        path, num_hidden_layers=1, attn_implementation="eager"
    ).eval()
    seqs = random_ids(seed=2)
    ours = Embedder.from_pretrained(path, pooling="mean", num_layers=1).encode_ids(seqs)
    np.testing.assert_allclose(ours, torch_embed(shallow, seqs, "mean"), atol=1e-5, rtol=0)


def test_bfloat16_close_to_float32(tiny_dir):
    path, _ = tiny_dir
    seqs = random_ids(seed=5)
    f32 = Embedder.from_pretrained(path, pooling="mean").encode_ids(seqs)
    bf16 = Embedder.from_pretrained(path, pooling="mean", dtype="bfloat16").encode_ids(seqs)
    assert bf16.dtype == np.float32
    assert np.min(np.sum(f32 * bf16, axis=1)) >= 0.999


def test_sharded_checkpoint_loads_identically(tiny_dir, tmp_path):
    path, model = tiny_dir
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    seqs = random_ids(seed=6)
    a = Embedder.from_pretrained(path).encode_ids(seqs)
    b = Embedder.from_pretrained(tmp_path).encode_ids(seqs)
    np.testing.assert_array_equal(a, b)


def _rewrite(src, dst, edit):
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    tensors = load_file(src / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors")


def test_missing_tensor_is_named(tiny_dir, tmp_path):
    path, _ = tiny_dir
    _rewrite(path, tmp_path / "m", lambda t: t.pop("layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"missing tensor 'layers\.1\.mlp\.up_proj\.weight'"):
        Embedder.from_pretrained(tmp_path / "m")


def test_mismatched_tensor_is_named(tiny_dir, tmp_path):
    path, _ = tiny_dir

    def shrink(tensors):
        tensors["layers.0.self_attn.k_norm.weight"] = tensors["layers.0.self_attn.k_norm.weight"][
            :-1
        ]

    _rewrite(path, tmp_path / "m", shrink)
    with pytest.raises(
        ValueError, match=r"'layers\.0\.self_attn\.k_norm\.weight' has shape \(23,\)"
    ):
        Embedder.from_pretrained(tmp_path / "m")


def test_config_errors_name_the_field(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "model_type": "llama"}))
    with pytest.raises(ValueError, match="model_type='llama'"):
        Embedder.from_pretrained(tmp_path)


def test_table_round_trip_is_exact(tiny_dir):
    path, _ = tiny_dir
    family, config, _ = hf.load_config(path)
    tensors = hf.read_safetensors(path)
    back = hf.flat_to_hf(hf.hf_to_flat(tensors, family, config), family, config)
    assert set(back) == set(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(back[name], value)


def test_params_are_float32_and_named_like_hf(tiny_dir):
    path, _ = tiny_dir
    emb = Embedder.from_pretrained(path, dtype="bfloat16")
    flat = embedding.params_to_flat(emb.params)
    assert {v.dtype for v in flat.values()} == {np.dtype("float32")}
    assert "encoder.layers.2.self_attn.q_norm.weight" in flat
    assert flat["encoder.layers.0.self_attn.q_proj.kernel"].shape == (64, 4 * 24)


def test_config_without_pad_token_id_matches_transformers(tmp_path):
    """The issue's reproduction: no pad_token_id and V < 151,643 once gave NaN for every row."""
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    config.pad_token_id = None
    model = transformers.Qwen3Model(config).eval()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved.get("pad_token_id") is None
    emb = Embedder.from_pretrained(tmp_path)
    # eos_token_id when the config names one, else 0; inside the vocabulary either way.
    assert 0 <= emb.pad_id < 512
    seqs = [[5, 17, 33], *random_ids(seed=3, lengths=(9, 2, 30))]
    ours = emb.encode_ids(seqs, batch_size=4)
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, torch_embed(model, seqs, "mean"), atol=1e-5)


def test_out_of_range_id_is_an_error_naming_it(tiny_dir):
    path, _ = tiny_dir
    emb = Embedder.from_pretrained(path)
    with pytest.raises(ValueError, match="row 1: token id 512 is outside the vocabulary"):
        emb.encode_ids([[5, 6], [7, 512, 8]])
    with pytest.raises(ValueError, match="row 0: token id -1"):
        emb.encode_ids([[-1]])


def test_pad_id_outside_vocabulary_is_refused(tmp_path):
    make_hf_qwen3(tmp_path, pad_token_id=None, eos_token_id=600)
    with pytest.raises(ValueError, match="pad_token_id=600 is outside the vocabulary"):
        Embedder.from_pretrained(tmp_path)
