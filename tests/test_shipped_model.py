"""The student shipped in models/: it loads from a fresh clone with no training, with
both loaders a user has, and gives the vector it gave when it was exported."""

from pathlib import Path

import numpy as np

MODEL = Path(__file__).resolve().parents[1] / "models" / "minilm-l6-caliber-finance"
SENTENCE = "Revenue increased 4% to $3.2 billion in 2019."
# The first 8 of its 768 components through `Embedder` (float32 compute over the float16
# weights), at export (2026-12-02, 2-core AMD EPYC Zen 5). Tolerance 1e-3: float16 rounding of
# the weights is already in these values, so what remains is float32 summation order across
# CPUs (~1e-6); a different or damaged model moves them by ~1e-2 or more (the student shipped
# before this one differs by up to 2.9e-2 here, and by 5.5e-3 in the first component alone).
KNOWN = [-0.00214, 0.06317, -0.03135, -0.00938, 0.00805, -0.0248, -0.03642, -0.00966]


def test_the_shipped_model_is_float16_and_small():
    from safetensors import safe_open

    size = sum(path.stat().st_size for path in MODEL.rglob("*") if path.is_file())
    assert size <= 50 * 2**20, f"{size / 2**20:.1f} MiB"
    for weights in (MODEL / "model.safetensors", MODEL / "2_Dense" / "model.safetensors"):
        with safe_open(weights, "np") as f:
            assert {str(f.get_tensor(name).dtype) for name in f.keys()} == {"float16"}, weights
    assert (MODEL / "README.md").is_file()  # the model card


def test_embedder_gives_the_known_vector():
    from caliber_jax import Embedder

    vector = np.asarray(Embedder.from_pretrained(MODEL).encode([SENTENCE], max_length=256))[0]
    assert vector.shape == (768,)
    np.testing.assert_allclose(np.linalg.norm(vector), 1.0, atol=1e-5)
    np.testing.assert_allclose(vector[:8], KNOWN, atol=1e-3)


def test_sentence_transformers_loads_it_and_agrees_with_the_embedder():
    """Whatever loader a user takes, the same vectors: cosine >= 0.999 per text (sentence-
    transformers computes in float16 on the CPU, as the weights are stored)."""
    import sentence_transformers

    from caliber_jax import Embedder

    texts = [SENTENCE, "Revenue decreased 4% to $3.2 billion in 2019.",
             "What was the company's revenue in 2019?"]  # fmt: skip
    ours = np.asarray(Embedder.from_pretrained(MODEL).encode(texts, max_length=256))
    model = sentence_transformers.SentenceTransformer(str(MODEL), device="cpu")
    theirs = model.encode(texts, normalize_embeddings=True).astype(np.float32)
    theirs /= np.linalg.norm(theirs, axis=1, keepdims=True)
    assert np.all(np.sum(ours * theirs, axis=1) >= 0.999)
