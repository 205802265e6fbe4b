"""cuDNN fused attention vs the XLA path on the same right-padded batches (GPU only)."""

import numpy as np
import pytest

from caliber_jax import Embedder
from tests.models.test_qwen3 import make_hf_qwen3, random_ids

pytestmark = pytest.mark.gpu


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1)


def test_cudnn_matches_xla_on_qwen3(tmp_path):
    make_hf_qwen3(tmp_path, head_dim=64, num_attention_heads=4, num_key_value_heads=2)
    seqs = random_ids(seed=5, lengths=(5, 37, 12, 64, 1, 20, 128, 77))
    xla = Embedder.from_pretrained(tmp_path, dtype="bfloat16", attention="xla")
    cudnn = Embedder.from_pretrained(tmp_path, dtype="bfloat16", attention="cudnn")
    assert _cosines(xla.encode_ids(seqs), cudnn.encode_ids(seqs)).min() >= 0.999


def test_cudnn_matches_xla_on_minilm(minilm_dir, filing_passages):
    texts = filing_passages[:32]
    xla = Embedder.from_pretrained(minilm_dir, dtype="bfloat16", attention="xla")
    cudnn = Embedder.from_pretrained(minilm_dir, dtype="bfloat16", attention="cudnn")
    assert _cosines(xla.encode(texts), cudnn.encode(texts)).min() >= 0.999


@pytest.mark.parametrize(
    "heads, kv_heads, causal", [(4, 4, False), (8, 2, False), (8, 2, True)], ids=str
)
def test_cudnn_packed_rows_match_xla_masked_attention(heads, kv_heads, causal):
    """Training's packed rows: cuDNN's sequence packing (`layers.PackedSegments`) against the
    XLA attention under the [B, T, T] segment mask, forward and gradients, multi-head and
    grouped-query (whose packed case was wrong upstream until mid-2026), on the real tokens."""
    import jax
    import jax.numpy as jnp

    from caliber_jax.models import layers

    rng = np.random.default_rng(0)
    b, t, h = 3, 256, 64
    rows = []
    for r in range(b):
        row, slot = [], 50 * r
        while len(row) < t - 8:
            row += [slot] * min(int(rng.integers(4, 90)), t - 8 - len(row))
            slot += 1
        rows.append(row + [-1] * (t - len(row)))
    ids = jnp.asarray(rows)
    real = (ids >= 0)[:, :, None, None]
    q, k, v = (
        jnp.asarray(rng.normal(size=(b, t, n, h)), jnp.bfloat16)
        for n in (heads, kv_heads, kv_heads)
    )
    weights = jnp.asarray(rng.normal(size=(b, t, heads, h)), jnp.float32)
    masks = {"xla": layers.segment_mask(ids),
             "cudnn": layers.packed_segments(ids, max_segments=t)}  # fmt: skip

    def loss(q, k, v, implementation):
        out = layers.attention(q, k, v, masks[implementation], causal=causal,
                               implementation=implementation)  # fmt: skip
        return jnp.sum(jnp.where(real, out.astype(jnp.float32) * weights, 0.0)), out

    results = {}
    for implementation in ("xla", "cudnn"):
        grad_fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True),
                          static_argnums=3)  # fmt: skip
        (_, out), grads = grad_fn(q, k, v, implementation)
        results[implementation] = (np.asarray(jnp.where(real, out, 0), np.float32),
                                   [np.asarray(g, np.float32) for g in grads])  # fmt: skip
    out_x, grads_x = results["xla"]
    out_c, grads_c = results["cudnn"]
    np.testing.assert_allclose(out_c, out_x, atol=2e-2, rtol=2e-2)
    for g_c, g_x in zip(grads_c, grads_x, strict=True):
        scale = np.abs(g_x).max()
        assert np.abs(g_c - g_x).max() <= 3e-2 * scale
