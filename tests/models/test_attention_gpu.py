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
