"""caliber_jax: Caliber distillation of text embedders in JAX."""

from caliber_jax.embedder import Embedder

__all__ = ["Embedder"]
