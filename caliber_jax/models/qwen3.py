"""Qwen3 transformer used as a text encoder (Qwen3-Embedding), mirroring HF `Qwen3Model`.

Legend: B batch, T tokens, D model width, N q-heads, K kv-heads, H head dim, F MLP width, V vocab.
Attribute names copy the HF modules so that the weight table in `models/hf.py` is a plain rename.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from caliber_jax.models import layers


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    """Architecture of a Qwen3 encoder; `from_hf` reads a HF `config.json` dict."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    attention_bias: bool = False
    pad_token_id: int = 151643

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "Qwen3Config":
        if hf.get("model_type") not in ("qwen3", None):
            raise ValueError(f"config.json: model_type={hf.get('model_type')!r}, expected 'qwen3'")
        if hf.get("use_sliding_window"):
            raise ValueError(
                "config.json: use_sliding_window=true is not supported by this encoder"
            )
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json: hidden_act={hf['hidden_act']!r}, expected 'silu'")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(
                f"config.json: rope scaling {rope!r} is not supported (default RoPE only)"
            )
        theta = rope.get("rope_theta", hf.get("rope_theta", 1_000_000.0))
        heads = hf["num_attention_heads"]
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads", heads),
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            attention_bias=bool(hf.get("attention_bias", False)),
            pad_token_id=layers.resolve_pad_id(hf, vocab_size=hf["vocab_size"]),
        )

    def to_hf(self) -> dict[str, Any]:
        """The `config.json` fields that `transformers.Qwen3Model` needs to rebuild this encoder."""
        return {
            "architectures": ["Qwen3Model"],
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "attention_bias": self.attention_bias,
            "hidden_act": "silu",
            "pad_token_id": self.pad_token_id,
            "eos_token_id": self.pad_token_id,
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "max_position_embeddings": 32768,
        }

    @property
    def width(self) -> int:
        return self.hidden_size


class Qwen3Attention(nnx.Module):
    """Grouped-query causal attention with per-head q/k RMSNorm (HF `Qwen3Attention`)."""

    def __init__(
        self, config: Qwen3Config, *, dtype: jnp.dtype, rngs: nnx.Rngs, attention: str = "xla"
    ):
        n, k, h, d = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.hidden_size,
        )
        bias = config.attention_bias
        self.q_proj = layers.linear(d, n * h, bias=bias, dtype=dtype, rngs=rngs)
        self.k_proj = layers.linear(d, k * h, bias=bias, dtype=dtype, rngs=rngs)
        self.v_proj = layers.linear(d, k * h, bias=bias, dtype=dtype, rngs=rngs)
        self.o_proj = layers.linear(n * h, d, bias=bias, dtype=dtype, rngs=rngs)
        self.q_norm = layers.RMSNorm(h, eps=config.rms_norm_eps, dtype=dtype)
        self.k_norm = layers.RMSNorm(h, eps=config.rms_norm_eps, dtype=dtype)
        self.head_dim = h
        self.attention = attention

    def __call__(self, x_btd, cos_bth, sin_bth, attention_mask_bt) -> jax.Array:
        b, t, _ = x_btd.shape
        q_btnh = self.q_norm(self.q_proj(x_btd).reshape(b, t, -1, self.head_dim))
        k_btkh = self.k_norm(self.k_proj(x_btd).reshape(b, t, -1, self.head_dim))
        v_btkh = self.v_proj(x_btd).reshape(b, t, -1, self.head_dim)
        q_btnh = layers.apply_rope(q_btnh, cos_bth, sin_bth)
        k_btkh = layers.apply_rope(k_btkh, cos_bth, sin_bth)
        out_btnh = layers.attention(
            q_btnh, k_btkh, v_btkh, attention_mask_bt, causal=True, implementation=self.attention
        )
        return self.o_proj(out_btnh.reshape(b, t, -1))


class Qwen3MLP(nnx.Module):
    """SwiGLU MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: Qwen3Config, *, dtype: jnp.dtype, rngs: nnx.Rngs):
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = layers.linear(d, f, bias=False, dtype=dtype, rngs=rngs)
        self.up_proj = layers.linear(d, f, bias=False, dtype=dtype, rngs=rngs)
        self.down_proj = layers.linear(f, d, bias=False, dtype=dtype, rngs=rngs)

    def __call__(self, x_btd: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x_btd)) * self.up_proj(x_btd))


class Qwen3DecoderLayer(nnx.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(
        self, config: Qwen3Config, *, dtype: jnp.dtype, rngs: nnx.Rngs, attention: str = "xla"
    ):
        self.self_attn = Qwen3Attention(config, dtype=dtype, rngs=rngs, attention=attention)
        self.mlp = Qwen3MLP(config, dtype=dtype, rngs=rngs)
        eps = config.rms_norm_eps
        self.input_layernorm = layers.RMSNorm(config.hidden_size, eps=eps, dtype=dtype)
        self.post_attention_layernorm = layers.RMSNorm(config.hidden_size, eps=eps, dtype=dtype)

    def __call__(self, x_btd, cos_bth, sin_bth, attention_mask_bt) -> jax.Array:
        x_btd = x_btd + self.self_attn(
            self.input_layernorm(x_btd), cos_bth, sin_bth, attention_mask_bt
        )
        return x_btd + self.mlp(self.post_attention_layernorm(x_btd))


class Qwen3Encoder(nnx.Module):
    """Token ids [B, T] and mask [B, T] -> final-norm hidden states [B, T, D]."""

    def __init__(
        self,
        config: Qwen3Config,
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
        self.embed_tokens = layers.embed(
            config.vocab_size, config.hidden_size, dtype=dtype, rngs=rngs
        )
        self.layers = nnx.List(
            [
                Qwen3DecoderLayer(config, dtype=dtype, rngs=rngs, attention=attention)
                for _ in range(config.num_hidden_layers)
            ]
        )
        self.norm = layers.RMSNorm(config.hidden_size, eps=config.rms_norm_eps, dtype=dtype)
        self.remat = layers.resolve_remat(remat)

    def __call__(
        self,
        input_ids_bt: jax.Array,
        attention_mask_bt: jax.Array,
        *,
        segment_ids_bt: jax.Array | None = None,
        positions_bt: jax.Array | None = None,
    ) -> jax.Array:
        """`segment_ids_bt`/`positions_bt`: packed rows (causal attention within a segment,
        positions restarting in each); without them every row is one padded sequence."""
        mask, positions_bt = layers.packed_or_padded(
            attention_mask_bt,
            segment_ids_bt,
            positions_bt,
            default_positions_fn=layers.positions_from_mask,
            implementation=self.attention,
        )
        cos_bth, sin_bth = layers.rope_cos_sin(
            positions_bt, head_dim=self.config.head_dim, theta=self.config.rope_theta
        )
        apply = layers.remat_layer(layers.call_layer, self.remat)
        x_btd = self.embed_tokens(layers.mask_ids(input_ids_bt, attention_mask_bt))
        x_btd = layers.apply_layers(
            self.layers, apply, x_btd, cos_bth, sin_bth, mask, scan=self.scan_layers
        )
        return self.norm(x_btd)
