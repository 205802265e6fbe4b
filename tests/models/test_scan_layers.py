"""`scan_layers=True` (the layers as one lax.scan) gives the unrolled model's outputs and gradients.

Every encoder family on tiny random HF checkpoints; with and without per-layer remat."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from caliber_jax.models import embedding, hf
from tests.models.test_mpnet import make_hf_mpnet
from tests.models.test_qwen3 import make_hf_qwen3


def make_hf_bert(path):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    transformers.BertModel(config, add_pooling_layer=False).eval().save_pretrained(path)


def batch(vocab: int):
    rng = np.random.default_rng(3)
    lengths = (7, 19, 3, 24)
    ids = np.zeros((len(lengths), max(lengths)), np.int32)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(1, vocab, size=n)
        mask[row, :n] = 1
    return jnp.asarray(ids), jnp.asarray(mask)


def value_and_grad(model_dir, *, scan: bool, remat: str):
    spec = embedding.read_spec(model_dir, pooling="mean")
    flat = embedding.load_flat_params(model_dir, spec, seed=0)
    graphdef, state = embedding.split_model(
        spec, flat, dtype=jnp.float32, remat=remat, scan_layers=scan
    )
    ids, mask = batch(spec.config.vocab_size)

    def loss(params):
        vectors = nnx.merge(graphdef, params)(ids, mask)
        return jnp.sum(vectors * jnp.arange(vectors.shape[-1])), vectors

    (_, vectors), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(nnx.to_pure_dict(state))
    return np.asarray(vectors), hf.flatten(grads)


@pytest.mark.parametrize(
    ("family", "remat"),
    [("bert", "none"), ("mpnet", "full"), ("qwen3", "none"), ("qwen3", "full")],
)
def test_scanned_layers_match_unrolled(tmp_path, family, remat):
    make = {
        "bert": make_hf_bert,
        "mpnet": lambda path: make_hf_mpnet(path, vocab_size=300, max_position_embeddings=66),
        "qwen3": make_hf_qwen3,
    }[family]
    make(tmp_path)
    vectors, grads = value_and_grad(tmp_path, scan=False, remat=remat)
    scanned_vectors, scanned_grads = value_and_grad(tmp_path, scan=True, remat=remat)
    np.testing.assert_allclose(scanned_vectors, vectors, atol=1e-6)
    assert scanned_grads.keys() == grads.keys()
    assert any(".2." in name for name in grads)  # per-layer names, not a stacked leaf
    # One scale for all: some gradients are zero in exact arithmetic (BERT's key bias: softmax
    # ignores a per-row shift), and their float noise differs between the two programs.
    scale = max(float(np.max(np.abs(grad))) for grad in grads.values())
    for name, grad in grads.items():
        np.testing.assert_allclose(
            np.asarray(scanned_grads[name]), grad, atol=1e-5 * scale, err_msg=name
        )
