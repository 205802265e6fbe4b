"""Hugging Face directory I/O: `config.json`, safetensors weights, and the name table per family.

One declarative table per model family maps HF tensor names to our parameter paths (and back), with
the transform each needs: Linear weights are [out, in] in PyTorch and [in, out] (`kernel`) here.
Weights are only ever read from local directories (a Hub id is first fetched into the Hub cache,
`hub.resolve_model_dir`).
"""

import dataclasses
import json
import os
import re
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from caliber_jax import hub, paths
from caliber_jax.models import bert, mpnet, qwen3, st_layout

# (HF name template, our path template, transform). `{i}` stands for a layer index.
QWEN3_TABLE = (
    ("embed_tokens.weight", "embed_tokens.embedding", "none"),
    ("norm.weight", "norm.weight", "none"),
    ("layers.{i}.input_layernorm.weight", "layers.{i}.input_layernorm.weight", "none"),
    (
        "layers.{i}.post_attention_layernorm.weight",
        "layers.{i}.post_attention_layernorm.weight",
        "none",
    ),
    ("layers.{i}.self_attn.q_norm.weight", "layers.{i}.self_attn.q_norm.weight", "none"),
    ("layers.{i}.self_attn.k_norm.weight", "layers.{i}.self_attn.k_norm.weight", "none"),
    *(
        (f"layers.{{i}}.self_attn.{p}.weight", f"layers.{{i}}.self_attn.{p}.kernel", "transpose")
        for p in ("q_proj", "k_proj", "v_proj", "o_proj")
    ),
    *(
        (f"layers.{{i}}.self_attn.{p}.bias", f"layers.{{i}}.self_attn.{p}.bias", "none")
        for p in ("q_proj", "k_proj", "v_proj", "o_proj")
    ),
    *(
        (f"layers.{{i}}.mlp.{p}.weight", f"layers.{{i}}.mlp.{p}.kernel", "transpose")
        for p in ("gate_proj", "up_proj", "down_proj")
    ),
)

_BERT_LINEARS = (
    ("attention.self.query", "query"),
    ("attention.self.key", "key"),
    ("attention.self.value", "value"),
    ("attention.output.dense", "attention_output"),
    ("intermediate.dense", "intermediate"),
    ("output.dense", "output"),
)
_BERT_NORMS = (
    ("attention.output.LayerNorm", "attention_layernorm"),
    ("output.LayerNorm", "output_layernorm"),
)
BERT_TABLE = (
    *(
        (f"embeddings.{e}.weight", f"embeddings.{e}.embedding", "none")
        for e in ("word_embeddings", "position_embeddings", "token_type_embeddings")
    ),
    ("embeddings.LayerNorm.weight", "embeddings.LayerNorm.weight", "none"),
    ("embeddings.LayerNorm.bias", "embeddings.LayerNorm.bias", "none"),
    *(
        (f"encoder.layer.{{i}}.{h}.weight", f"layer.{{i}}.{o}.kernel", "transpose")
        for h, o in _BERT_LINEARS
    ),
    *((f"encoder.layer.{{i}}.{h}.bias", f"layer.{{i}}.{o}.bias", "none") for h, o in _BERT_LINEARS),
    *(
        (f"encoder.layer.{{i}}.{h}.{p}", f"layer.{{i}}.{o}.{p}", "none")
        for h, o in _BERT_NORMS
        for p in ("weight", "bias")
    ),
)

_MPNET_LINEARS = (
    ("attention.attn.q", "query"),
    ("attention.attn.k", "key"),
    ("attention.attn.v", "value"),
    ("attention.attn.o", "attention_output"),
    ("intermediate.dense", "intermediate"),
    ("output.dense", "output"),
)
_MPNET_NORMS = (
    ("attention.LayerNorm", "attention_layernorm"),
    ("output.LayerNorm", "output_layernorm"),
)
MPNET_TABLE = (
    *(
        (f"embeddings.{e}.weight", f"embeddings.{e}.embedding", "none")
        for e in ("word_embeddings", "position_embeddings")
    ),
    ("embeddings.LayerNorm.weight", "embeddings.LayerNorm.weight", "none"),
    ("embeddings.LayerNorm.bias", "embeddings.LayerNorm.bias", "none"),
    ("encoder.relative_attention_bias.weight", "relative_attention_bias.embedding", "none"),
    *(
        (f"encoder.layer.{{i}}.{h}.weight", f"layer.{{i}}.{o}.kernel", "transpose")
        for h, o in _MPNET_LINEARS
    ),
    *(
        (f"encoder.layer.{{i}}.{h}.bias", f"layer.{{i}}.{o}.bias", "none")
        for h, o in _MPNET_LINEARS
    ),
    *(
        (f"encoder.layer.{{i}}.{h}.{p}", f"layer.{{i}}.{o}.{p}", "none")
        for h, o in _MPNET_NORMS
        for p in ("weight", "bias")
    ),
)

FAMILIES = {
    "qwen3": (qwen3.Qwen3Config, qwen3.Qwen3Encoder, QWEN3_TABLE, "model."),
    "bert": (bert.BertConfig, bert.BertEncoder, BERT_TABLE, "bert."),
    "mpnet": (mpnet.MPNetConfig, mpnet.MPNetEncoder, MPNET_TABLE, "mpnet."),
}
# Old BERT checkpoints name LayerNorm parameters gamma/beta.
_LEGACY_NAMES = (
    (re.compile(r"LayerNorm\.gamma$"), "LayerNorm.weight"),
    (re.compile(r"LayerNorm\.beta$"), "LayerNorm.bias"),
)


def load_config(model_dir: str | os.PathLike) -> tuple[str, Any, dict[str, Any]]:
    """Reads `config.json` of a folder or Hub id. Returns (family, our frozen config, raw dict)."""
    model_dir = hub.resolve_model_dir(model_dir)
    path = model_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no config.json (expected a Hugging Face model directory)")
    raw = st_layout.read_json(path)
    family = raw.get("model_type")
    if family not in FAMILIES:
        raise ValueError(f"{path}: model_type={family!r}, supported: {sorted(FAMILIES)}")
    try:
        config = FAMILIES[family][0].from_hf(raw)
    except ValueError as error:  # "config.json: ..." from the family: name the directory
        raise ValueError(f"{model_dir}/{error}") from error
    return family, config, raw


def with_num_layers(config: Any, num_layers: int | None) -> Any:
    """The same config cut to its first `num_layers` layers (None keeps all)."""
    if num_layers is None:
        return config
    if not 1 <= num_layers <= config.num_hidden_layers:
        raise ValueError(
            f"num_layers={num_layers} must be in [1, {config.num_hidden_layers}] for this model"
        )
    return dataclasses.replace(config, num_hidden_layers=num_layers)


def read_safetensors(model_dir: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of `model.safetensors` or of a sharded `model.safetensors.index.json`; a file
    that cannot be read (truncated, not safetensors) is a ValueError naming it. `model_dir`: a
    folder or Hub id (`hub.resolve_model_dir`)."""
    model_dir = hub.resolve_model_dir(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(st_layout.read_json(index)["weight_map"].values()))
    elif (model_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{model_dir}: neither model.safetensors nor its index is present")
    tensors = {}
    for name in files:
        try:
            with safe_open(model_dir / name, framework="numpy") as handle:
                for key in handle.keys():
                    tensors[key] = handle.get_tensor(key)
        except SafetensorError as error:
            raise ValueError(f"{model_dir / name}: cannot be read ({error})") from error
    return tensors


def _layer_names(template: str, num_layers: int) -> Iterable[tuple[int | None, str]]:
    if "{i}" not in template:
        yield None, template
        return
    for i in range(num_layers):
        yield i, template.format(i=i)


def _canonical(name: str, prefix: str) -> str:
    name = name.removeprefix(prefix)
    for pattern, repl in _LEGACY_NAMES:
        name = pattern.sub(repl, name)
    return name


def hf_to_flat(
    tensors: dict[str, np.ndarray], family: str, config: Any, *, source: str = "checkpoint"
) -> dict[str, np.ndarray]:
    """HF tensors -> flat `{our.path: float32 array}` for the first `num_hidden_layers` layers.

    Raises ValueError naming the tensor when one is missing or has the wrong shape.
    """
    _, _, table, prefix = FAMILIES[family]
    by_name = {_canonical(k, prefix): v for k, v in tensors.items()}
    shapes = expected_shapes(family, config)
    flat = {}
    for hf_template, our_template, transform in table:
        for i, hf_name in _layer_names(hf_template, config.num_hidden_layers):
            ours = our_template.format(i=i)
            if ours not in shapes:
                continue  # e.g. attention biases when the config has attention_bias=false
            if hf_name not in by_name:
                raise ValueError(f"{source}: missing tensor {hf_name!r}")
            value = np.asarray(by_name[hf_name], dtype=np.float32)
            value = value.T if transform == "transpose" else value
            if value.shape != shapes[ours]:
                raise ValueError(
                    f"{source}: tensor {hf_name!r} has shape {tuple(by_name[hf_name].shape)}, "
                    f"expected {shapes[ours][::-1] if transform == 'transpose' else shapes[ours]}"
                )
            flat[ours] = value
    return flat


def flat_to_hf(flat: dict[str, np.ndarray], family: str, config: Any) -> dict[str, np.ndarray]:
    """Inverse of `hf_to_flat`: our flat params -> HF tensor names (no prefix), float32."""
    _, _, table, _ = FAMILIES[family]
    out = {}
    for hf_template, our_template, transform in table:
        for i, hf_name in _layer_names(hf_template, config.num_hidden_layers):
            ours = our_template.format(i=i)
            if ours in flat:
                value = np.asarray(flat[ours], dtype=np.float32)
                out[hf_name] = np.ascontiguousarray(value.T if transform == "transpose" else value)
    named = {
        t[1].format(i=i) for t in table for i, _ in _layer_names(t[1], config.num_hidden_layers)
    }
    if missing := set(flat) - named:
        raise ValueError(f"parameters with no HF name: {sorted(missing)}")
    return out


def expected_shapes(family: str, config: Any) -> dict[str, tuple[int, ...]]:
    """Flat parameter shapes of the encoder for `config`, without allocating it."""
    encoder_cls = FAMILIES[family][1]
    abstract = nnx.eval_shape(lambda: encoder_cls(config, dtype=jnp.float32, rngs=nnx.Rngs(0)))
    params = nnx.to_pure_dict(nnx.state(abstract, nnx.Param))
    return {
        k: tuple(v.shape) for k, v in flatten(params).items() if isinstance(v, jax.ShapeDtypeStruct)
    }


def flatten(tree: dict[Any, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict -> `{"a.b.0.c": leaf}`."""
    flat = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def unflatten(flat: dict[str, Any]) -> dict[Any, Any]:
    """Inverse of `flatten`; integer path parts become int keys (nnx list indices)."""
    tree: dict[Any, Any] = {}
    for path, value in flat.items():
        node = tree
        parts = [int(p) if p.isdigit() else p for p in path.split(".")]
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return tree


def save_safetensors(tensors: dict[str, np.ndarray], path: str | os.PathLike) -> None:
    """Writes a safetensors file atomically (`paths.write_atomic`)."""
    paths.write_atomic(path, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))


def save_json(obj: Any, path: str | os.PathLike) -> None:
    """Writes JSON atomically (`paths.write_atomic`)."""
    paths.write_atomic(
        path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2), encoding="utf-8")
    )
