"""`Embedder`: load a local HF / sentence-transformers directory and encode text into unit vectors.

    emb = Embedder.from_pretrained(path, pooling="mean", dtype="float32", num_layers=None)
    vecs = emb.encode(texts, batch_size=32, max_length=512)   # [n, d] float32, L2-normalised

Batches are grouped by length and padded to a few bucket lengths, so real passages are not all
padded to max_length and jit compiles only a handful of shapes.
"""

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from caliber_jax import host, hub, sharding, tokenization
from caliber_jax.data import padding
from caliber_jax.models import embedding, st_layout

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
AUTO = "auto"


def resolve_dtype_name(name: str) -> str:
    """A compute dtype's name, "auto" resolved: bfloat16 on accelerators and on CPUs that multiply
    it in hardware (`host.native_bf16`), float32 on other CPUs."""
    if name == AUTO:
        return "bfloat16" if host.auto_bf16(jax.default_backend() != "cpu") else "float32"
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r}, expected one of {sorted([*DTYPES, AUTO])}")
    return name


def resolve_dtype(name: str) -> jnp.dtype:
    return DTYPES[resolve_dtype_name(name)]


def pad_batch(
    id_lists: Sequence[Sequence[int]], *, rows: int, length: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Right-pads to `[rows, length]`; extra rows are all padding (mask 0)."""
    return padding.pad_rows(id_lists, rows=rows, length=length, pad_id=pad_id)


def check_ids(seqs: Sequence[Sequence[int]], *, vocab_size: int) -> None:
    """Raises ValueError naming the first row holding an id outside [0, vocab_size)."""
    for row, seq in enumerate(seqs):
        if seq and (min(seq) < 0 or max(seq) >= vocab_size):
            token = next(t for t in seq if not 0 <= t < vocab_size)
            raise ValueError(
                f"row {row}: token id {token} is outside the vocabulary (vocab_size={vocab_size})"
            )


def cast_params(flat: dict[str, np.ndarray], param_dtype: str) -> dict[str, np.ndarray]:
    """Matrices and tables (>= 2-D) to `param_dtype` on the host, one tensor at a time."""
    target = resolve_dtype(param_dtype)
    if target == jnp.float32:
        return flat
    return {k: v.astype(target) if v.ndim >= 2 else v for k, v in flat.items()}


def _forward(graphdef: nnx.GraphDef, params: nnx.State, ids: jax.Array, mask: jax.Array):
    return nnx.merge(graphdef, params)(ids, mask)


# One jit for every single-device Embedder: models of the same architecture (a student and its
# checkpoints, a teacher cut to N layers) have equal graph definitions, so a process that encodes
# with several of them traces and compiles each batch shape once, not once per model.
_forward_jit = jax.jit(_forward, static_argnums=0)


class Embedder:
    """A loaded embedding model, its tokenizer and a jit-compiled encode function."""

    def __init__(
        self,
        spec: embedding.ModelSpec,
        graphdef: nnx.GraphDef,
        params: nnx.State,
        tokenizer,
        *,
        max_length: int,
        data_parallel: bool = False,
        source: str | None = None,
    ):
        self.spec = spec
        self.source = source  # the directory it was loaded from, for messages
        self.graphdef = graphdef
        self.params = params
        self.tokenizer = tokenizer
        self.max_length = max_length
        pad = tokenizer.pad_token_id if tokenizer is not None else None
        self.pad_id = spec.config.pad_token_id if pad is None else pad
        if not 0 <= self.pad_id < spec.config.vocab_size:
            raise ValueError(
                f"tokenizer pad id {self.pad_id} is outside the vocabulary "
                f"(vocab_size={spec.config.vocab_size})"
            )
        self.mesh = None
        if data_parallel and len(jax.local_devices()) > 1:
            # Every local device encodes its share of each batch (params replicated): an 8B
            # teacher keeps all GPUs of a node busy instead of one.
            self.mesh = sharding.make_mesh(devices=jax.local_devices())
            replicated, rows = sharding.replicated(self.mesh), sharding.batch_sharding(self.mesh)
            self.params = jax.device_put(params, replicated)
            self._embed = jax.jit(
                lambda p, ids, mask: _forward(graphdef, p, ids, mask),
                in_shardings=(replicated, rows, rows),
                out_shardings=rows,
            )
        else:
            self._embed = lambda p, ids, mask: _forward_jit(graphdef, p, ids, mask)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        pooling: str | None = None,
        dtype: str = "float32",
        num_layers: int | None = None,
        out_dim: int | None = None,
        tokenizer_dir: str | os.PathLike | None = None,
        seed: int = 0,
        *,
        param_dtype: str = "float32",
        attention: str = "xla",
        data_parallel: bool = False,
    ) -> "Embedder":
        """Loads a HF directory (config.json + safetensors + tokenizer files) or a Hub id.

        Args:
            path: model directory in HF (optionally sentence-transformers) layout, or a Hub id
                `org/name[@revision]` (`hub.resolve_model_dir`: fetched into the Hub cache, or
                found there when offline).
            pooling: "mean", "last" or "cls"; None takes the directory's sentence-transformers
                pooling.
            dtype: compute dtype, "float32" or "bfloat16" (params stay float32).
            num_layers: keep only the first N encoder layers (to initialise a smaller student).
            out_dim: add a W_out to this dimension when the directory has none (LEAF).
            tokenizer_dir: where the tokenizer files are (a folder or Hub id), if not in `path`.
            seed: initialises a new W_out.
            param_dtype: "bfloat16" stores the matrices and embedding tables in bfloat16 (half the
                memory: an 8B teacher in 16 GB instead of 32); norms and biases stay float32.
            attention: "xla" or "cudnn" (GPU, bfloat16; `layers.attention`).
            data_parallel: split each batch over all local devices (params replicated).
        """
        path = hub.resolve_model_dir(path)
        spec = embedding.read_spec(path, pooling=pooling, num_layers=num_layers, out_dim=out_dim)
        flat = cast_params(embedding.load_flat_params(path, spec, seed=seed), param_dtype)
        graphdef, params = embedding.split_model(
            spec, flat, dtype=resolve_dtype(dtype), attention=attention
        )
        tokenizer = tokenization.load_tokenizer(tokenizer_dir or path, required=False)
        if tokenizer is not None and len(tokenizer) > spec.config.vocab_size:
            raise ValueError(
                f"{tokenizer_dir or path}: tokenizer has {len(tokenizer)} tokens but the model's "
                f"vocab_size is {spec.config.vocab_size}"
            )
        return cls(
            spec,
            graphdef,
            params,
            tokenizer,
            max_length=_max_length(path, spec),
            data_parallel=data_parallel,
            source=str(path),
        )

    @property
    def dim(self) -> int:
        return self.spec.out_dim or self.spec.config.width

    def tokenize(self, texts: Sequence[str], *, max_length: int | None = None) -> list[list[int]]:
        if self.tokenizer is None:
            raise ValueError(
                f"{self.source or 'this model directory'}: no tokenizer files; use encode_ids or "
                f"pass tokenizer_dir"
            )
        return tokenization.tokenize(
            self.tokenizer, texts, max_length=max_length or self.max_length
        )

    def encode(
        self,
        texts: Sequence[str],
        batch_size: int = 32,
        max_length: int | None = None,
        *,
        query_task: str | None = None,
        tokens_per_batch: int = 0,
        progress: bool = False,
    ) -> np.ndarray:
        """Texts -> [n, d] float32 unit vectors. `query_task` adds Qwen3's query instruction;
        `tokens_per_batch` as in `encode_ids`."""
        if isinstance(texts, str):
            raise TypeError("encode takes a sequence of texts, not one string")
        texts = [tokenization.format_query(t, query_task) for t in texts]
        return self.encode_ids(
            self.tokenize(texts, max_length=max_length), batch_size=batch_size,
            tokens_per_batch=tokens_per_batch, progress=progress,
        )  # fmt: skip

    def encode_ids(
        self,
        token_id_lists: Sequence[Sequence[int]],
        batch_size: int = 32,
        max_length: int | None = None,
        *,
        tokens_per_batch: int = 0,
        progress: bool = False,
    ) -> np.ndarray:
        """Already-tokenised input (no special tokens added) -> [n, d] float32 unit vectors.

        Batches as `padding.batch_plan` says: `batch_size` rows each, or with `tokens_per_batch`
        as many rows of a length rung as fill that many token slots."""
        limit = max_length or self.max_length
        seqs = [list(s)[:max_length] if max_length else list(s) for s in token_id_lists]
        if any(len(s) == 0 for s in seqs):
            raise ValueError("encode_ids: empty token sequence")
        check_ids(seqs, vocab_size=self.spec.config.vocab_size)
        out = np.zeros((len(seqs), self.dim), np.float32)
        plan = padding.batch_plan(
            [len(s) for s in seqs], batch_size=batch_size, max_length=limit,
            tokens_per_batch=tokens_per_batch,
            # Batch rows: a multiple of the devices the batch is split over.
            row_multiple=self.mesh.size if self.mesh is not None else 1,
        )  # fmt: skip
        # One batch in flight: the device encodes batch i while the host pads and sends batch
        # i + 1; only then are batch i's vectors pulled (a teacher's encoding is hours on a GPU,
        # and padding is host work that would otherwise leave the device idle).
        in_flight = None
        for rows, padded_rows, length in tqdm(plan, disable=not progress):
            ids, mask = pad_batch(
                [seqs[r] for r in rows], rows=padded_rows, length=length, pad_id=self.pad_id
            )
            if self.mesh is not None:
                # Explicit placement: under jax.distributed a jit refuses host arrays for a mesh.
                rows_sharding = sharding.batch_sharding(self.mesh)
                ids, mask = jax.device_put((ids, mask), rows_sharding)
            vecs = self._embed(self.params, ids, mask)
            vecs.copy_to_host_async()  # the copy starts once the batch is done, not when pulled
            if in_flight is not None:
                _pull(out, *in_flight)
            in_flight = rows, vecs
        if in_flight is not None:
            _pull(out, *in_flight)
        bad = np.flatnonzero(~np.isfinite(out).all(axis=1))
        if bad.size:
            raise FloatingPointError(
                f"encode: non-finite vectors for {bad.size} rows (first: row {bad[0]}); "
                "check the weights and the compute dtype"
            )
        return out

    def encode_fn(self, **kwargs) -> Callable[[Sequence[str]], np.ndarray]:
        """`texts -> vectors` closure for the evaluators."""
        return lambda texts: self.encode(texts, **kwargs)


def _pull(out: np.ndarray, rows: np.ndarray, vecs: jax.Array) -> None:
    """Writes a batch's vectors (padding rows dropped) to its rows of `out` on the host."""
    out[rows] = np.asarray(vecs)[: len(rows)]


def _max_length(path: Path, spec: embedding.ModelSpec) -> int:
    """sentence-transformers' max_seq_length when recorded (`sentence_bert_config.json`, or the
    tokenizer's `model_max_length` where newer sentence-transformers keeps it), else 512 (the
    paper's); never past what the position table holds (as sentence-transformers cuts)."""
    # BERT's and MPNet's position tables; Qwen3's rotary positions have none.
    positions = getattr(spec.config, "max_tokens", None) or getattr(
        spec.config, "max_position_embeddings", None
    )
    recorded = None
    config = path / "sentence_bert_config.json"
    if config.is_file():
        recorded = st_layout.read_json(config).get("max_seq_length")
    tokenizer_config = path / "tokenizer_config.json"
    newer_st = st_layout.is_sentence_transformers_dir(path) and tokenizer_config.is_file()
    if recorded is None and newer_st:
        limit = st_layout.read_json(tokenizer_config).get("model_max_length")
        recorded = limit if isinstance(limit, int) and limit < 1_000_000 else None
    length = int(recorded or 512)
    return min(length, positions) if positions else length
