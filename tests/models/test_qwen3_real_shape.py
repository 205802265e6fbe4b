"""Qwen3 parity at the real Qwen3-Embedding-0.6B / -8B layer shapes, random weights, float32.

Opt-in (deselected by default: gigabytes of weights, a minute or more per case on 2 cores):
`python -m pytest -q -m real_shape tests/models/test_qwen3_real_shape.py`, on the CPU or a GPU.
"8B-2" is the 8B model's width, heads and MLP with its first 2 of 36 layers (each layer is the
same computation; ~12 GB of host RAM); "8B" is all 36 layers and needs ~70 GB of host RAM for
the float32 PyTorch reference and our copy (`-k 'not 8B]'` leaves it out on smaller hosts).
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
