"""BERT-family encoder (BERT, MiniLM as in all-MiniLM-L6-v2), mirroring HF `BertModel` (no pooler).

Legend: B batch, T tokens, D model width, N heads, H head dim, F MLP width.
Post-LayerNorm blocks with exact (erf) GELU and learned absolute positions.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from caliber_jax.models import layers

ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Architecture of a BERT encoder; `from_hf` reads a HF `config.json` dict."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "BertConfig":
        if hf.get("model_type") not in ("bert", None):
            raise ValueError(f"config.json: model_type={hf.get('model_type')!r}, expected 'bert'")
        if hf.get("is_decoder"):
            raise ValueError("config.json: is_decoder=true (causal attention) is not supported")
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(
                f"config.json: position_embedding_type={hf['position_embedding_type']!r}, "
                "only 'absolute' is supported"
            )
        act = hf.get("hidden_act", "gelu")
        if act not in ACTIVATIONS:
            raise ValueError(
                f"config.json: hidden_act={act!r}, expected one of {sorted(ACTIVATIONS)}"
            )
        if hf["hidden_size"] % hf["num_attention_heads"]:
            raise ValueError("config.json: hidden_size is not a multiple of num_attention_heads")
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=hf["num_attention_heads"],
            max_position_embeddings=hf.get("max_position_embeddings", 512),
            type_vocab_size=hf.get("type_vocab_size", 2),
            layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
            hidden_act=act,
            pad_token_id=layers.resolve_pad_id(hf, vocab_size=hf["vocab_size"]),
        )

    def to_hf(self) -> dict[str, Any]:
        """The `config.json` fields that `transformers.BertModel` needs to rebuild this encoder."""
        return {
            "architectures": ["BertModel"],
            "model_type": "bert",
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
            "position_embedding_type": "absolute",
        }

    @property
    def width(self) -> int:
        return self.hidden_size


class BertEmbeddings(nnx.Module):
    """Word + absolute position + token-type embeddings, then LayerNorm."""

    def __init__(self, config: BertConfig, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        d = config.hidden_size
        self.word_embeddings = layers.embed(config.vocab_size, d, dtype=dtype, rngs=rngs)
        self.position_embeddings = layers.embed(
            config.max_position_embeddings, d, dtype=dtype, rngs=rngs
        )
        self.token_type_embeddings = layers.embed(config.type_vocab_size, d, dtype=dtype, rngs=rngs)
        self.LayerNorm = layers.LayerNorm(d, eps=config.layer_norm_eps, dtype=dtype)

    def __call__(self, input_ids_bt: jax.Array, positions_bt: jax.Array) -> jax.Array:
        # Token type 0 everywhere: sentence embedders encode single segments.
        x_btd = (
            self.word_embeddings(input_ids_bt)
            + self.position_embeddings(positions_bt)
            + self.token_type_embeddings(jnp.zeros_like(input_ids_bt))
        )
        return self.LayerNorm(x_btd)


class BertLayer(nnx.Module):
    """Post-LN block. Names follow HF's `attention.self.query` etc. flattened one level.

    MPNet's layers are the same block (`mpnet.MPNetEncoder` builds them from its own config,
    which has the fields read here) with a relative-position bias added to the logits.
    """

    def __init__(
        self, config: "BertConfig", *, dtype: jnp.dtype, rngs: nnx.Rngs, attention: str = "xla"
    ):
        d, f, eps = config.hidden_size, config.intermediate_size, config.layer_norm_eps
        self.query = layers.linear(d, d, dtype=dtype, rngs=rngs)
        self.key = layers.linear(d, d, dtype=dtype, rngs=rngs)
        self.value = layers.linear(d, d, dtype=dtype, rngs=rngs)
        self.attention_output = layers.linear(d, d, dtype=dtype, rngs=rngs)
        self.attention_layernorm = layers.LayerNorm(d, eps=eps, dtype=dtype)
        self.intermediate = layers.linear(d, f, dtype=dtype, rngs=rngs)
        self.output = layers.linear(f, d, dtype=dtype, rngs=rngs)
        self.output_layernorm = layers.LayerNorm(d, eps=eps, dtype=dtype)
        self.num_heads = config.num_attention_heads
        self.activation = ACTIVATIONS[config.hidden_act]
        self.attention = attention

    def __call__(
        self, x_btd: jax.Array, attention_mask_bt: jax.Array, bias_nts: jax.Array | None = None
    ) -> jax.Array:
        """`bias_nts`: an additive attention bias per head (MPNet's relative positions)."""
        b, t, _ = x_btd.shape
        heads = (b, t, self.num_heads, -1)
        q_btnh = self.query(x_btd).reshape(heads)
        k_btnh = self.key(x_btd).reshape(heads)
        v_btnh = self.value(x_btd).reshape(heads)
        out_btnh = layers.attention(
            q_btnh,
            k_btnh,
            v_btnh,
            attention_mask_bt,
            causal=False,
            implementation=self.attention,
            bias_nts=bias_nts,
        )
        x_btd = self.attention_layernorm(x_btd + self.attention_output(out_btnh.reshape(b, t, -1)))
        hidden_btf = self.activation(self.intermediate(x_btd))
        return self.output_layernorm(x_btd + self.output(hidden_btf))


class BertEncoder(nnx.Module):
    """Token ids [B, T] and mask [B, T] -> last hidden states [B, T, D]."""

    def __init__(
        self,
        config: BertConfig,
        *,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
        remat: bool | str = False,
        attention: str = "xla",
        scan_layers: bool = True,
    ):
        self.config = config
        self.scan_layers = scan_layers
        self.attention = attention
        self.embeddings = BertEmbeddings(config, dtype=dtype, rngs=rngs)
        self.layer = nnx.List(
            [
                BertLayer(config, dtype=dtype, rngs=rngs, attention=attention)
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
        restarting in each); without them every row is one right- or left-padded sequence."""
        if segment_ids_bt is None and input_ids_bt.shape[1] > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {input_ids_bt.shape[1]} exceeds max_position_embeddings="
                f"{self.config.max_position_embeddings}"
            )
        mask, positions_bt = layers.packed_or_padded(
            attention_mask_bt,
            segment_ids_bt,
            positions_bt,
            default_positions_fn=_arange_positions,
            implementation=self.attention,
        )
        apply = layers.remat_layer(layers.call_layer, self.remat)
        x_btd = self.embeddings(layers.mask_ids(input_ids_bt, attention_mask_bt), positions_bt)
        x_btd = layers.apply_layers(self.layer, apply, x_btd, mask, scan=self.scan_layers)
        return x_btd


def _arange_positions(attention_mask_bt: jax.Array) -> jax.Array:
    """HF BERT's default position ids: 0..T-1 in every row, [1, T]."""
    return jnp.arange(attention_mask_bt.shape[1])[None, :]
