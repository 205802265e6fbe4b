"""The embedder around any encoder: pool, optional Linear W_out (LEAF), L2-normalise.

s(x) = normalize(W_out . pool(encoder(x))), with W_out present only when the output dimension
differs from the encoder width. Legend: B batch, T tokens, D encoder width, E output dimension.
"""

import dataclasses
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from caliber_jax import hub
from caliber_jax.models import hf, layers, st_layout

DENSE_DIR = "2_Dense"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild an `EmbeddingModel` and write it back as a HF directory."""

    family: str
    config: Any
    pooling: str
    out_dim: int | None
    raw_config: dict[str, Any]


class EmbeddingModel(nnx.Module):
    """Encoder + pooling + optional `dense` (W_out) + L2 normalisation."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
        remat: bool | str = False,
        attention: str = "xla",
        scan_layers: bool = True,
    ):
        if spec.pooling not in layers.POOLERS:
            raise ValueError(f"pooling={spec.pooling!r}, expected one of {sorted(layers.POOLERS)}")
        encoder_cls = hf.FAMILIES[spec.family][1]
        self.encoder = encoder_cls(
            spec.config,
            dtype=dtype,
            rngs=rngs,
            remat=remat,
            attention=attention,
            scan_layers=scan_layers,
        )
        width = spec.config.width
        self.dense = nnx.data(None)
        if spec.out_dim is not None:  # read_spec keeps it only for a W_out (new or the dir's)
            self.dense = nnx.Linear(
                width,
                spec.out_dim,
                param_dtype=jnp.float32,
                kernel_init=nnx.initializers.xavier_uniform(),
                rngs=rngs,
            )
        self.pooling = spec.pooling

    def __call__(self, input_ids_bt: jax.Array, attention_mask_bt: jax.Array) -> jax.Array:
        """Returns [B, E] float32 unit vectors."""
        hidden_btd = self.encoder(input_ids_bt, attention_mask_bt)
        return self.head(layers.POOLERS[self.pooling](hidden_btd, attention_mask_bt))

    def embed_packed(
        self,
        input_ids_bt: jax.Array,
        segment_ids_bt: jax.Array,
        positions_bt: jax.Array,
        *,
        num_segments: int,
    ) -> jax.Array:
        """Vectors of sequences packed end to end in rows (`padding.pack_rows`).

        Args:
          input_ids_bt: [B, T] token ids of the packed rows.
          segment_ids_bt: [B, T] the output row of each token's sequence; ids outside
            [0, num_segments) mark padding.
          positions_bt: [B, T] position of each token within its sequence.
          num_segments: S, rows of the output.

        Returns:
          [S, E] float32 unit vectors, zeros for ids no token carries.
        """
        return self.head(
            self.pool_packed(input_ids_bt, segment_ids_bt, positions_bt, num_segments=num_segments)
        )

    def pool_packed(
        self,
        input_ids_bt: jax.Array,
        segment_ids_bt: jax.Array,
        positions_bt: jax.Array,
        *,
        num_segments: int,
    ) -> jax.Array:
        """`embed_packed` before the head: [S, D] pooled encoder states, zeros for absent ids.

        A sequence lies within one row, so the pooled states of a batch's rows are the sum of
        those of any split of its rows into groups.
        """
        real_bt = (segment_ids_bt >= 0) & (segment_ids_bt < num_segments)
        hidden_btd = self.encoder(
            input_ids_bt, real_bt, segment_ids_bt=segment_ids_bt, positions_bt=positions_bt
        )
        return layers.pool_packed(
            hidden_btd, segment_ids_bt, pooling=self.pooling, num_segments=num_segments
        )

    def head(self, pooled_bd: jax.Array) -> jax.Array:
        """Pooled [B, D] states -> [B, E] unit vectors (through `dense`, W_out, if any)."""
        if self.dense is not None:
            pooled_bd = self.dense(pooled_bd)  # float32: W_out is tiny and feeds the loss directly
        return layers.l2_normalize(pooled_bd)


def read_spec(
    model_dir: str | Path,
    *,
    pooling: str | None = None,
    num_layers: int | None = None,
    out_dim: int | None = None,
) -> ModelSpec:
    """Reads the architecture of a HF / sentence-transformers directory (or Hub id,
    `hub.resolve_model_dir`).

    `pooling=None` takes the directory's sentence-transformers pooling (mean if none is recorded).
    `out_dim` adds a fresh W_out when the directory has no Dense module and out_dim != width.
    """
    model_dir = hub.resolve_model_dir(model_dir)
    family, config, raw = hf.load_config(model_dir)
    config = hf.with_num_layers(config, num_layers)
    if st_layout.is_sentence_transformers_dir(model_dir):
        st_layout.check_flax_pipeline(model_dir)  # what sentence-transformers would do, or refused
    dense = _read_dense_config(model_dir)
    if dense is not None:
        if dense["in_features"] != config.width:
            raise ValueError(
                f"{model_dir / DENSE_DIR}/config.json: in_features={dense['in_features']} but the "
                f"encoder width is {config.width}"
            )
        if out_dim is not None and out_dim != dense["out_features"]:
            raise ValueError(
                f"out_dim={out_dim} but {model_dir / DENSE_DIR} projects to {dense['out_features']}"
            )
        out_dim = dense["out_features"]
    elif out_dim == config.width:
        out_dim = None  # a fresh W_out only where the dims differ (the paper's rule)
    return ModelSpec(
        family=family,
        config=config,
        pooling=pooling or _read_pooling(model_dir),
        out_dim=out_dim,  # the directory's own Dense applies even when it keeps the width
        raw_config=raw,
    )


def _read_pooling(model_dir: Path) -> str:
    """The directory's sentence-transformers pooling; mean for a plain transformers directory."""
    if not st_layout.is_sentence_transformers_dir(model_dir):
        return "mean"
    pooling = st_layout.read_st_pooling(model_dir)
    if pooling not in layers.POOLERS:
        raise ValueError(
            f"{model_dir}: {pooling} pooling is not in the Flax encoders "
            f'({sorted(layers.POOLERS)}); the PyTorch backend (backend "torch") runs it'
        )
    return pooling


def _holds_dense(model_dir: str | Path) -> bool:
    """Whether the directory's W_out (`DENSE_DIR`) is part of its model: in a sentence-transformers
    directory only when modules.json lists it (an unlisted one is a leftover nothing loads)."""
    model_dir = Path(model_dir)
    if not st_layout.is_sentence_transformers_dir(model_dir):
        return (model_dir / DENSE_DIR).is_dir()
    listed = st_layout.module_paths(model_dir, "Dense")
    if listed not in ([], [DENSE_DIR]):
        raise ValueError(
            f"{model_dir}/modules.json: Dense modules at {listed}; the Flax encoders read at "
            f"most one, at {DENSE_DIR!r}"
        )
    return bool(listed)


def _read_dense_config(model_dir: Path) -> dict[str, Any] | None:
    """The directory's Dense module's config, None without one; a listed Dense whose config or
    safetensors weights are missing is an error (it must not become a fresh random W_out)."""
    path = model_dir / DENSE_DIR / "config.json"
    if not _holds_dense(model_dir):
        return None
    for needed in (path, model_dir / DENSE_DIR / "model.safetensors"):
        if not needed.is_file():
            raise ValueError(
                f"{model_dir / DENSE_DIR}: the Dense module has no {needed.name}"
                + (" (weights only as pytorch_model.bin are not read; the PyTorch backend, "
                   'backend "torch", runs it)' if needed.suffix == ".safetensors" else "")
            )  # fmt: skip
    conf = st_layout.read_json(path)
    activation = conf.get("activation_function", "torch.nn.modules.linear.Identity")
    if not activation.endswith("Identity"):
        raise ValueError(f"{path}: activation_function={activation!r}, only Identity is supported")
    if not conf.get("bias", True):
        raise ValueError(f"{path}: bias=false is not supported")
    return conf


def abstract_model(
    spec: ModelSpec,
    *,
    dtype: jnp.dtype,
    remat: bool | str = False,
    attention: str = "xla",
    scan_layers: bool = True,
) -> EmbeddingModel:
    """The model's structure with `jax.ShapeDtypeStruct` leaves: no memory is allocated.

    `remat`: False/"none", True/"full" or "dots" (`layers.REMAT_POLICIES`), per layer.
    `attention`: "xla" or "cudnn" (`layers.ATTENTION_IMPLEMENTATIONS`).
    `scan_layers`: run the layers as one `lax.scan` (`layers.apply_layers`): one layer is traced
    and compiled instead of all of them; parameters keep their per-layer layout.
    """
    return nnx.eval_shape(
        lambda: EmbeddingModel(
            spec,
            dtype=dtype,
            rngs=nnx.Rngs(0),
            remat=remat,
            attention=attention,
            scan_layers=scan_layers,
        )
    )


def has_new_w_out(model_dir: str | Path, spec: ModelSpec) -> bool:
    """True when `spec` has a W_out that `model_dir` (a folder or Hub id) does not hold (it starts
    from an init)."""
    if spec.out_dim is None:
        return False
    model_dir = hub.resolve_model_dir(model_dir)
    return not (_holds_dense(model_dir) and (model_dir / DENSE_DIR / "model.safetensors").is_file())


def load_flat_params(
    model_dir: str | Path, spec: ModelSpec, *, seed: int = 0
) -> dict[str, np.ndarray]:
    """Flat float32 params (`encoder.*`, `dense.*`) from a HF / sentence-transformers directory
    (or Hub id, `hub.resolve_model_dir`).

    A W_out that the directory does not hold is initialised (Xavier uniform, zero bias) from `seed`.
    """
    model_dir = hub.resolve_model_dir(model_dir)
    tensors = hf.read_safetensors(model_dir)
    source = str(model_dir)
    flat = {
        f"encoder.{k}": v
        for k, v in hf.hf_to_flat(tensors, spec.family, spec.config, source=source).items()
    }
    if spec.out_dim is None:
        return flat
    width = spec.config.width
    if not has_new_w_out(model_dir, spec):
        dense = hf.read_safetensors(model_dir / DENSE_DIR)
        for name, shape in (
            ("linear.weight", (spec.out_dim, width)),
            ("linear.bias", (spec.out_dim,)),
        ):
            if name not in dense:
                raise ValueError(f"{model_dir / DENSE_DIR}: missing tensor {name!r}")
            if tuple(dense[name].shape) != shape:
                raise ValueError(
                    f"{model_dir / DENSE_DIR}: tensor {name!r} has shape {dense[name].shape}, "
                    f"expected {shape}"
                )
        flat["dense.kernel"] = np.asarray(dense["linear.weight"], np.float32).T
        flat["dense.bias"] = np.asarray(dense["linear.bias"], np.float32)
    else:
        limit = np.sqrt(6.0 / (width + spec.out_dim))
        rng = np.random.default_rng(seed)
        flat["dense.kernel"] = rng.uniform(-limit, limit, (width, spec.out_dim)).astype(np.float32)
        flat["dense.bias"] = np.zeros((spec.out_dim,), np.float32)
    return flat


def split_model(
    spec: ModelSpec,
    flat: dict[str, np.ndarray],
    *,
    dtype: jnp.dtype,
    remat: bool | str = False,
    attention: str = "xla",
    scan_layers: bool = True,
) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, params) for `spec` filled with `flat`; shapes are checked against the model."""
    model = abstract_model(
        spec, dtype=dtype, remat=remat, attention=attention, scan_layers=scan_layers
    )
    graphdef, state = nnx.split(model, nnx.Param)
    expected = hf.flatten(nnx.to_pure_dict(state))
    if missing := sorted(set(expected) - set(flat)):
        raise ValueError(f"parameters missing from the checkpoint: {missing[:5]}")
    for name, leaf in expected.items():
        if tuple(flat[name].shape) != tuple(leaf.shape):
            raise ValueError(f"parameter {name!r}: shape {flat[name].shape}, expected {leaf.shape}")
    nnx.replace_by_pure_dict(state, hf.unflatten({k: jnp.asarray(flat[k]) for k in expected}))
    return graphdef, state


def params_to_flat(params: nnx.State | dict[str, Any]) -> dict[str, np.ndarray]:
    """Params state (or its pure dict) -> flat `{path: np.ndarray}` on the host."""
    pure = nnx.to_pure_dict(params) if isinstance(params, nnx.State) else params
    return {k: np.asarray(jax.device_get(v)) for k, v in hf.flatten(pure).items()}


def save_pretrained(
    output_dir: str | Path,
    spec: ModelSpec,
    flat: dict[str, np.ndarray],
    *,
    tokenizer,
    max_seq_length: int,
    query_prompt: str | None = None,
    passthrough: dict[str, np.ndarray] | None = None,
) -> Path:
    """Writes a HF + sentence-transformers directory that inverts `read_spec` + `load_flat_params`.

    `transformers.AutoModel` loads the encoder with its original architecture class;
    `SentenceTransformer(output_dir)` adds pooling, the Dense W_out (if any) and Normalize.
    `passthrough` tensors (e.g. BERT's unused `pooler.*`) are written unchanged beside them.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    encoder = {k.removeprefix("encoder."): v for k, v in flat.items() if k.startswith("encoder.")}
    tensors = {**(passthrough or {}), **hf.flat_to_hf(encoder, spec.family, spec.config)}
    hf.save_safetensors(tensors, output_dir / "model.safetensors")
    config = {**spec.raw_config, **spec.config.to_hf(), "torch_dtype": "float32"}
    config.pop("dtype", None)
    hf.save_json(config, output_dir / "config.json")
    # Right padding: our positions count real tokens, HF's count columns; they agree only then.
    tokenizer.padding_side = "right"
    tokenizer.save_pretrained(str(output_dir))

    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    width = spec.config.width
    hf.save_json(
        {
            "word_embedding_dimension": width,
            **{flag: spec.pooling == name for flag, name in st_layout.POOLING_FLAGS.items()},
            "include_prompt": True,
        },
        output_dir / "1_Pooling" / "config.json",
    )
    if "dense.kernel" in flat:
        out_dim = flat["dense.kernel"].shape[1]
        dense_dir = output_dir / DENSE_DIR
        hf.save_safetensors(
            {
                "linear.weight": np.ascontiguousarray(flat["dense.kernel"].T),
                "linear.bias": np.asarray(flat["dense.bias"]),
            },
            dense_dir / "model.safetensors",
        )
        hf.save_json(
            {
                "in_features": width,
                "out_features": out_dim,
                "bias": True,
                "activation_function": "torch.nn.modules.linear.Identity",
            },
            dense_dir / "config.json",
        )
        modules.append(
            {"idx": 2, "name": "2", "path": DENSE_DIR, "type": "sentence_transformers.models.Dense"}
        )
    modules.append(
        {
            "idx": len(modules),
            "name": str(len(modules)),
            "path": f"{len(modules)}_Normalize",
            "type": "sentence_transformers.models.Normalize",
        }
    )
    (output_dir / modules[-1]["path"]).mkdir(exist_ok=True)
    hf.save_json(modules, output_dir / "modules.json")
    hf.save_json(
        {"max_seq_length": max_seq_length, "do_lower_case": False},
        output_dir / "sentence_bert_config.json",
    )
    prompts = {"query": query_prompt, "document": ""} if query_prompt else {}
    hf.save_json(
        {"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"},
        output_dir / "config_sentence_transformers.json",
    )
    return output_dir
