"""MPNet encoder (all-mpnet-base-v2 and other MPNet embedders), as HF `MPNetModel` (no pooler).

Legend: B batch, T tokens, D model width, N heads.
BERT's post-LayerNorm block (`bert.BertLayer`) with three differences: no token-type embeddings,
absolute positions that start at 2 (fairseq's convention: `padding_idx + 1`, with HF's hard-coded
padding_idx 1), and a T5-style relative-position bias, one table of 32 buckets x N heads shared by
all layers and added to every layer's attention logits.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from caliber_jax.models import bert, layers

# HF's MPNetEmbeddings fixes padding_idx = 1 whatever the config's pad_token_id, and numbers real
# tokens from padding_idx + 1.
POSITION_OFFSET = 2
# HF's MPNetEncoder.compute_position_bias always buckets into 32 (its num_buckets default) with
# max_distance 128, whatever relative_attention_num_buckets says; we accept only configs where
# the two agree.
NUM_BUCKETS = 32
MAX_DISTANCE = 128


@dataclasses.dataclass(frozen=True)
class MPNetConfig:
    """Architecture of an MPNet encoder; `from_hf` reads a HF `config.json` dict."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int = 514
    layer_norm_eps: float = 1e-5
    hidden_act: str = "gelu"
    pad_token_id: int = 1
    relative_attention_num_buckets: int = NUM_BUCKETS

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "MPNetConfig":
        if hf.get("model_type") not in ("mpnet", None):
            raise ValueError(f"config.json: model_type={hf.get('model_type')!r}, expected 'mpnet'")
        act = hf.get("hidden_act", "gelu")
        if act not in bert.ACTIVATIONS:
            raise ValueError(
                f"config.json: hidden_act={act!r}, expected one of {sorted(bert.ACTIVATIONS)}"
            )
        if hf["hidden_size"] % hf["num_attention_heads"]:
            raise ValueError("config.json: hidden_size is not a multiple of num_attention_heads")
        buckets = hf.get("relative_attention_num_buckets", NUM_BUCKETS)
        if buckets != NUM_BUCKETS:
            raise ValueError(
                f"config.json: relative_attention_num_buckets={buckets}; transformers' MPNet "
                f"always buckets into {NUM_BUCKETS}, so only {NUM_BUCKETS} is supported"
            )
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=hf["num_attention_heads"],
            max_position_embeddings=hf.get("max_position_embeddings", 514),
            layer_norm_eps=hf.get("layer_norm_eps", 1e-5),
            hidden_act=act,
            pad_token_id=layers.resolve_pad_id(hf, vocab_size=hf["vocab_size"]),
            relative_attention_num_buckets=buckets,
        )

    def to_hf(self) -> dict[str, Any]:
        """The `config.json` fields that `transformers.MPNetModel` needs to rebuild this encoder."""
        return {
            "architectures": ["MPNetModel"],
            "model_type": "mpnet",
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
        }

    @property
    def width(self) -> int:
        return self.hidden_size

    @property
    def max_tokens(self) -> int:
        """The longest sequence the position table holds (512 for max_position_embeddings 514)."""
        return self.max_position_embeddings - POSITION_OFFSET


def relative_position_buckets(length: int) -> np.ndarray:
    """[T, T] int32: the bucket of key s seen from query t (HF `relative_position_bucket` of s - t).

    Half the buckets for keys before the query, half for keys after; within a half, distances
    below 8 get a bucket each and 8..127 share 8 log-spaced ones (the last also takes >= 128).
    The log bucket 8 + floor(8 ln(n/8) / ln 16) equals 8 + floor(log2(n^2 / 64)), computed here
    in integers (HF computes it in float32; the test checks both agree on every distance).
    """
    rel = np.arange(length)[None, :] - np.arange(length)[:, None]  # key - query
    n = -rel
    half = NUM_BUCKETS // 2
    max_exact = half // 2
    side = np.where(n < 0, half, 0)
    n = np.abs(n)
    log_bucket = np.array([int(v * v).bit_length() + 1 for v in range(length)])  # 8 + (bits - 7)
    large = np.minimum(log_bucket[n], half - 1)
    assert MAX_DISTANCE == max_exact * 16  # the closed form above assumes ln(128/8) = ln 16
    return (side + np.where(n < max_exact, n, large)).astype(np.int32)


class MPNetEmbeddings(nnx.Module):
    """Word + absolute position embeddings, then LayerNorm (no token types)."""

    def __init__(self, config: MPNetConfig, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        d = config.hidden_size
        self.word_embeddings = layers.embed(config.vocab_size, d, dtype=dtype, rngs=rngs)
        self.position_embeddings = layers.embed(
            config.max_position_embeddings, d, dtype=dtype, rngs=rngs
        )
        self.LayerNorm = layers.LayerNorm(d, eps=config.layer_norm_eps, dtype=dtype)

    def __call__(self, input_ids_bt: jax.Array, positions_bt: jax.Array) -> jax.Array:
        x_btd = self.word_embeddings(input_ids_bt) + self.position_embeddings(positions_bt)
        return self.LayerNorm(x_btd)


class MPNetEncoder(nnx.Module):
    """Token ids [B, T] and mask [B, T] -> last hidden states [B, T, D]."""

    def __init__(
        self,
        config: MPNetConfig,
        *,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
        remat: bool | str = False,
        attention: str = "xla",
        scan_layers: bool = True,
    ):
        if attention != "xla":
            raise ValueError(
                f"attention={attention!r}: MPNet adds a relative-position bias to the logits, "
                "which only the 'xla' attention takes"
            )
        self.config = config
        self.scan_layers = scan_layers
        self.embeddings = MPNetEmbeddings(config, dtype=dtype, rngs=rngs)
        self.relative_attention_bias = layers.embed(
            NUM_BUCKETS, config.num_attention_heads, dtype=jnp.float32, rngs=rngs
        )
        self.layer = nnx.List(
            [
                bert.BertLayer(config, dtype=dtype, rngs=rngs, attention=attention)
                for _ in range(config.num_hidden_layers)
            ]
        )
        self.remat = layers.resolve_remat(remat)

    def __call__(
        self,
        input_ids_bt: jax.Array,
        attention_mask_bt: jax.Array,
        *,
        segment_ids_bt: jax.Array | None = None,
        positions_bt: jax.Array | None = None,
    ) -> jax.Array:
        """`segment_ids_bt`/`positions_bt`: packed rows (attention within a segment, positions
        restarting in each at 0); without them every row is one right- or left-padded sequence.

        The relative bias depends only on key - query column offsets, so it is the same for a
        sequence wherever it lies in a row (padded on either side, or packed behind another).
        """
        t = input_ids_bt.shape[1]
        if segment_ids_bt is None and t > self.config.max_tokens:
            raise ValueError(
                f"sequence length {t} exceeds max_position_embeddings="
                f"{self.config.max_position_embeddings} (MPNet positions start at "
                f"{POSITION_OFFSET}: at most {self.config.max_tokens} tokens)"
            )
        mask, positions_bt = layers.packed_or_padded(
            attention_mask_bt,
            segment_ids_bt,
            positions_bt,
            default_positions_fn=layers.positions_from_mask,
        )
        x_btd = self.embeddings(
            layers.mask_ids(input_ids_bt, attention_mask_bt), positions_bt + POSITION_OFFSET
        )
        table_kn = self.relative_attention_bias.embedding[...]
        bias_nts = jnp.moveaxis(table_kn[jnp.asarray(relative_position_buckets(t))], -1, 0)
        apply = layers.remat_layer(layers.call_layer, self.remat)
        return layers.apply_layers(self.layer, apply, x_btd, mask, bias_nts, scan=self.scan_layers)
