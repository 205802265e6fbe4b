"""Qwen3 parity at the real Qwen3-Embedding-0.6B / -8B layer shapes, random weights, float32.

Opt-in (deselected by default: gigabytes of weights, a minute or more per case on 2 cores):
`python -m pytest -q -m real_shape tests/models/test_qwen3_real_shape.py`, on the CPU or a GPU.
"8B-2" is the 8B model's width, heads and MLP with its first 2 of 36 layers (each layer is the
same computation; ~12 GB of host RAM); "8B" is all 36 layers and needs ~70 GB of host RAM for
the float32 PyTorch reference and our copy (`-k 'not 8B]'` leaves it out on smaller hosts).
`test_8b_full_depth_layer_by_layer` runs all 36 layers of the 8B shape one at a time in ~9 GB
(5 min 50 s on 2 cores).
"""

import jax
import numpy as np
import pytest
import torch
import transformers

from caliber_jax import Embedder
from tests.models.test_qwen3 import torch_embed

SHAPES = {
    "0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8),
    "8B-2": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=2,
                 num_attention_heads=32, num_key_value_heads=8),
    "8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
               num_attention_heads=32, num_key_value_heads=8),
}  # fmt: skip


@pytest.mark.real_shape
@pytest.mark.parametrize("name", list(SHAPES))
def test_real_shape_parity(name, tmp_path):
    config = transformers.Qwen3Config(
        vocab_size=151_669, head_dim=128, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        max_position_embeddings=32768, pad_token_id=151_643, attn_implementation="eager",
        **SHAPES[name],
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen3Model(config).eval()
    model.save_pretrained(tmp_path)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 151_643, size=n).tolist() for n in (512, 300, 77, 5)]
    # Full float32 matmuls (on a GPU XLA would otherwise use TF32), as the PyTorch reference.
    with jax.default_matmul_precision("highest"):
        ours = Embedder.from_pretrained(tmp_path, pooling="mean").encode_ids(seqs, batch_size=4)
    reference = torch_embed(model, seqs, "mean")
    gap = float(np.abs(ours - reference).max())
    print(f"{name} on {jax.devices()[0].platform}: max |ours - transformers| = {gap:.3g}")
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)


def _hf_layer(config, index: int):
    """transformers' own decoder layer with the 8B shape, N(0, 0.02) matrices and norm weights
    1 + 0.1 N(0, 1) (a missed norm shows), seeded by its index."""
    from transformers.models.qwen3 import modeling_qwen3

    torch.manual_seed(index)
    layer = modeling_qwen3.Qwen3DecoderLayer(config, layer_idx=index).eval()
    with torch.no_grad():
        for name, param in layer.named_parameters():
            if "norm" in name:
                param.copy_(1 + 0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.02)
    return layer


def _our_layer_params(layer, state):
    """Our layer's state (`nnx.split` of an abstract Qwen3DecoderLayer) holding `layer`'s weights,
    renamed and transposed by the per-layer rows of the checkpoint loader's own table
    (`hf.QWEN3_TABLE`); a weight it leaves out stays abstract and fails the first layer's call."""
    from flax import nnx

    from caliber_jax.models import hf

    weights = {name: value.numpy() for name, value in layer.state_dict().items()}
    pure = nnx.to_pure_dict(state)
    for hf_template, our_template, transform in hf.QWEN3_TABLE:
        hf_name = hf_template.format(i=0).removeprefix("layers.0.")
        if "{i}" not in hf_template or hf_name not in weights:
            continue  # the embedding and final norm; attention biases (none in Qwen3)
        value = weights[hf_name].T if transform == "transpose" else weights[hf_name]
        *path, leaf = our_template.format(i=0).removeprefix("layers.0.").split(".")
        node = pure
        for key in path:
            node = node[key]
        node[leaf] = value.copy()
    nnx.replace_by_pure_dict(state, pure)
    return state


@pytest.mark.real_shape
def test_8b_full_depth_layer_by_layer():
    """All 36 layers of the Qwen3-Embedding-8B shape in ~10 GB of host RAM: each layer is built in
    transformers (`Qwen3DecoderLayer`, its own rotary tables and eager attention), copied into our
    `Qwen3DecoderLayer`, run on both sides' running hidden states and freed, so the gaps compound
    over the real depth as in the whole model; then the final norm, mean pooling and L2
    normalisation. The token embedding lookup and the whole-model loop are the "8B-2" case's."""
    import jax.numpy as jnp
    from flax import nnx
    from transformers.models.qwen3 import modeling_qwen3

    from caliber_jax.models import layers, qwen3

    hf_config = transformers.Qwen3Config(
        vocab_size=151_669, head_dim=128, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        max_position_embeddings=32768, pad_token_id=151_643, attn_implementation="eager",
        **SHAPES["8B"],
    )  # fmt: skip
    ours_config = qwen3.Qwen3Config.from_hf(hf_config.to_dict())
    abstract = nnx.eval_shape(
        lambda: qwen3.Qwen3DecoderLayer(ours_config, dtype=jnp.float32, rngs=nnx.Rngs(0))
    )
    graphdef, state = nnx.split(abstract)

    @jax.jit
    def apply(state, x_btd, cos_bth, sin_bth, mask_bt):
        return nnx.merge(graphdef, state)(x_btd, cos_bth, sin_bth, mask_bt)

    rng = np.random.default_rng(0)
    lengths = (512, 300, 77, 5)
    # One passage at a time (no padding): the 8B-2 case checks padded batches.
    hf_h = [torch.from_numpy(0.02 * rng.standard_normal((1, n, 4096), dtype=np.float32))
            for n in lengths]  # fmt: skip
    our_h = [jnp.asarray(h.numpy()) for h in hf_h]
    rotary = modeling_qwen3.Qwen3RotaryEmbedding(hf_config)
    tables, masks, hf_masks = [], [], []
    for n in lengths:
        positions = jnp.arange(n)[None]
        tables.append(layers.rope_cos_sin(positions, head_dim=128, theta=1_000_000.0))
        masks.append(jnp.ones((1, n), jnp.int32))
        causal = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)
        hf_masks.append(causal[None, None])
    gaps = []
    with jax.default_matmul_precision("highest"), torch.no_grad():
        for index in range(hf_config.num_hidden_layers):
            layer = _hf_layer(hf_config, index)
            params = _our_layer_params(layer, state)
            worst = 0.0
            for row, n in enumerate(lengths):
                position_ids = torch.arange(n)[None]
                cos_sin = rotary(hf_h[row], position_ids)
                hf_h[row] = layer(
                    hf_h[row],
                    attention_mask=hf_masks[row],
                    position_ids=position_ids,
                    position_embeddings=cos_sin,
                )
                our_h[row] = apply(params, our_h[row], *tables[row], masks[row])
                scale = float(hf_h[row].abs().max())
                worst = max(worst, float(np.abs(np.asarray(our_h[row]) - hf_h[row].numpy()).max())
                            / scale)  # fmt: skip
            gaps.append(worst)
            del layer, params
        norm = modeling_qwen3.Qwen3RMSNorm(4096, eps=1e-6)
        norm.weight.copy_(1 + 0.1 * torch.randn(4096))
        ours_norm = layers.RMSNorm(4096, eps=1e-6, dtype=jnp.float32)
        ours_norm.weight[...] = jnp.asarray(norm.weight.numpy())
        vectors = {"ours": [], "transformers": []}
        for row in range(len(lengths)):
            pooled_hf = norm(hf_h[row]).mean(dim=1)
            vectors["transformers"].append(torch.nn.functional.normalize(pooled_hf, dim=-1)[0])
            pooled = ours_norm(our_h[row]).mean(axis=1)
            vectors["ours"].append(pooled[0] / jnp.linalg.norm(pooled[0]))
    ours = np.stack([np.asarray(v) for v in vectors["ours"]])
    reference = np.stack([v.numpy() for v in vectors["transformers"]])
    gap = float(np.abs(ours - reference).max())
    print(
        f"8B, 36 layers one at a time on {jax.devices()[0].platform}: hidden-state gap relative "
        f"to its largest value after layers 1/12/24/36: {gaps[0]:.2g} / {gaps[11]:.2g} / "
        f"{gaps[23]:.2g} / {gaps[35]:.2g}; max |ours - transformers| of the vectors = {gap:.3g}"
    )
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)
