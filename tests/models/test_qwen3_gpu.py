"""Qwen3 parity at the real Qwen3-Embedding-0.6B / -8B shapes, random weights (GPU only).

Run on a GPU machine: `python -m pytest -q -m gpu tests/models/test_qwen3_gpu.py`. The 8B case
needs ~70 GB of host RAM for the float32 PyTorch reference; set CALIBER_GPU_8B=1 to include it.
"""

import os

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
    "8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
               num_attention_heads=32, num_key_value_heads=8),
}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["0.6B", "8B"])
def test_real_shape_parity(name, tmp_path):
    if name == "8B" and not os.environ.get("CALIBER_GPU_8B"):
        pytest.skip("set CALIBER_GPU_8B=1 for the 8B shape")
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
    # Full float32 matmuls on the GPU (XLA would otherwise use TF32), as the CPU reference does.
    with jax.default_matmul_precision("highest"):
        ours = Embedder.from_pretrained(tmp_path, pooling="mean").encode_ids(seqs, batch_size=4)
    reference = torch_embed(model, seqs, "mean")
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)
