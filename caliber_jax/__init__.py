"""caliber_jax: Caliber distillation of text embedders in JAX.

`from caliber_jax import Embedder` loads lazily, so that worker processes importing submodules do
not pay for transformers.
"""

__all__ = ["Embedder"]


def __getattr__(name: str):
    if name == "Embedder":
        from caliber_jax.embedder import Embedder

        return Embedder
    raise AttributeError(f"module 'caliber_jax' has no attribute {name!r}")
