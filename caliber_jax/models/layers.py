"""Building blocks shared by the encoders: norms, rotary embeddings, masked attention, pooling.

Legend: B batch, T query tokens, S key tokens, D model width, N query heads, K kv heads, H head dim.
Norms, softmax and pooling run in float32 whatever the compute dtype.
"""

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from caliber_jax import host


class RMSNorm(nnx.Module):
    """RMSNorm as in HF `Qwen3RMSNorm`: normalise in float32, then scale in the compute dtype."""

    def __init__(self, width: int, *, eps: float, dtype: jnp.dtype):
        self.weight = nnx.Param(jnp.ones((width,), jnp.float32))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return broadcast_param(self.weight[...], x.shape, self.dtype) * normed.astype(self.dtype)


def broadcast_param(param: jax.Array, shape: tuple[int, ...], dtype) -> jax.Array:
    """A float32 parameter broadcast to `shape`, then rounded to `dtype`: the values of
    `param.astype(dtype)` broadcast, but its gradient is summed over the broadcast axes in
    float32. Rounded first, that sum runs in the compute dtype, and a bfloat16 sum over a batch's
    tokens loses most of it (a review of the GPU step: a bias's gradient 6% off over 3,000 rows)."""
    return jnp.broadcast_to(param, shape).astype(dtype)


class Embed(nnx.Embed):
    """`nnx.Embed` that gathers float32 rows and rounds them to the compute dtype. The values are
    those of `nnx.Embed` (which rounds the whole table first), but the backward's scatter-add runs
    in float32: in bfloat16 a row that thousands of tokens read (a frequent token, the one token
    type, MPNet's relative-position buckets) stops growing (3,000 reads of gradient 0.01 summed to
    4.0, not 30; tests/models/test_layers.py)."""

    def __call__(self, inputs: jax.Array) -> jax.Array:
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise ValueError(f"Embed: token ids must be integers, got {inputs.dtype}")
        rows = jnp.take(self.embedding[...], inputs, axis=0)
        return rows if self.dtype is None else rows.astype(self.dtype)


def embed(count: int, width: int, *, dtype: jnp.dtype, rngs: nnx.Rngs) -> Embed:
    """A float32 lookup table computing in `dtype`, HF's N(0, 0.02) init (BERT, MPNet, Qwen3)."""
    init = nnx.initializers.normal(0.02)
    return Embed(count, width, dtype=dtype, param_dtype=jnp.float32, embedding_init=init, rngs=rngs)


class Linear(nnx.Linear):
    """`nnx.Linear` whose float32 bias is added to the product in float32 and the sum rounded
    once to the compute dtype (nearer to cuBLAS's bias epilogue under PyTorch's autocast, which
    adds it to the float32 accumulator, than rounding the bias first): its promote_dtype
    (`_promote_operands`, `_promote_input`) leaves the bias float32, so the bias's gradient is
    summed over the rows in float32 (in bfloat16 a sum over a batch's tokens loses most of it:
    a review of the GPU step, 6% off over 3,000 rows). The same parameters, and in float32 the same
    computation."""

    def __call__(self, inputs: jax.Array) -> jax.Array:
        y = super().__call__(inputs)
        return y if self.dtype is None else y.astype(self.dtype)


class LayerNorm(nnx.Module):
    """LayerNorm with HF parameter names (`weight`, `bias`), computed in float32."""

    def __init__(self, width: int, *, eps: float, dtype: jnp.dtype):
        self.weight = nnx.Param(jnp.ones((width,), jnp.float32))
        self.bias = nnx.Param(jnp.zeros((width,), jnp.float32))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        normed = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        return (normed * self.weight[...] + self.bias[...]).astype(self.dtype)


def linear(
    d_in: int,
    d_out: int,
    *,
    dtype: jnp.dtype,
    rngs: nnx.Rngs,
    bias: bool = True,
    init: Callable | None = None,
) -> Linear:
    """A float32-weight `Linear` computing in `dtype` (HF's N(0, 0.02) init by default).

    bfloat16 on a CPU with bfloat16 instructions multiplies through `cpu_bf16_matmul`: XLA's CPU
    backend runs a bfloat16 x bfloat16 -> bfloat16 dot as a float32 dot (both operands
    converted), and one with float32 products natively there. Other CPUs (where that path was not
    measured), GPUs and TPUs (which accumulate in float32 already) keep the plain dot."""
    on_cpu = native_cpu_bf16(dtype)
    return Linear(
        d_in,
        d_out,
        use_bias=bias,
        dtype=dtype,
        param_dtype=jnp.float32,
        kernel_init=init or nnx.initializers.normal(0.02),
        rngs=rngs,
        promote_dtype=_promote_input if on_cpu else _promote_operands,
        **({"dot_general": _linear_dot} if on_cpu else {}),
    )


def native_cpu_bf16(dtype) -> bool:
    """Whether `dtype` is bfloat16 computed on a CPU that multiplies it in hardware."""
    return (
        jnp.dtype(dtype) == jnp.bfloat16 and jax.default_backend() == "cpu" and host.native_bf16()
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def cpu_bf16_matmul(x_bi: jax.Array, w_io: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """x [..., I] @ w [I, O] in `dtype` with float32 products, returned in `dtype`; `w` may stay
    float32 (it is rounded to `dtype` inside). Its backward is two such matmuls too (the input's
    gradient in `dtype`, the weight's in the weight's dtype), where autodiff of the forward would
    convert both operands of the weight's gradient to float32. On a 2-core AMD EPYC Zen 4 with
    AVX512_BF16: all-mpnet-base-v2's forward 1.85x the float32 one, a 3-layer MiniLM training
    step 1.25x (docs/benchmarks_history.md, 2026-11-29)."""
    return _matmul(x_bi, w_io.astype(dtype), dtype)


def _matmul(a, b, dtype, contract=((-1,), (0,))):
    dims = tuple(tuple(d % x.ndim for d in axes) for x, axes in zip((a, b), contract, strict=True))
    out = jax.lax.dot_general(a, b, (dims, ((), ())), preferred_element_type=jnp.float32)
    return out.astype(dtype)


def _cpu_bf16_matmul_fwd(x_bi, w_io, dtype):
    return cpu_bf16_matmul(x_bi, w_io, dtype), (x_bi, w_io)


def _cpu_bf16_matmul_bwd(dtype, residuals, g_bo):
    x_bi, w_io = residuals
    g_bo = g_bo.astype(dtype)
    dx_bi = _matmul(g_bo, w_io.astype(dtype), x_bi.dtype, contract=((-1,), (1,)))
    x_ni, g_no = x_bi.reshape(-1, x_bi.shape[-1]), g_bo.reshape(-1, g_bo.shape[-1])
    dw_io = _matmul(x_ni.astype(dtype), g_no, w_io.dtype, contract=((0,), (0,)))
    return dx_bi, dw_io


cpu_bf16_matmul.defvjp(_cpu_bf16_matmul_fwd, _cpu_bf16_matmul_bwd)


def _linear_dot(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **_):
    """`nnx.Linear`'s dot_general: it always contracts the input's last axis with the kernel's
    first, which `cpu_bf16_matmul` computes (the compute dtype is the input's)."""
    del precision, preferred_element_type
    if dimension_numbers != (((lhs.ndim - 1,), (0,)), ((), ())):
        raise ValueError(f"cpu_bf16_matmul: unexpected dimension_numbers {dimension_numbers}")
    return cpu_bf16_matmul(lhs, rhs, lhs.dtype)


def _promote_operands(args, *, dtype=None, inexact=True):
    """`Linear`'s promote_dtype: the input and kernel as `nnx.Linear` promotes them, the bias
    left float32 (added in float32, `Linear`)."""
    x, kernel, bias = args
    x, kernel = nnx.nn.dtypes.promote_dtype((x, kernel), dtype=dtype, inexact=inexact)
    return x, kernel, bias


def _promote_input(args, *, dtype=None, inexact=True):
    """`Linear`'s promote_dtype on a CPU with bfloat16 instructions: the input cast, the kernel
    left float32, so that `cpu_bf16_matmul` returns the kernel's gradient in float32, and the
    bias left float32 (added in float32, `Linear`)."""
    del inexact
    x, kernel, bias = args
    return (x if dtype is None else x.astype(dtype)), kernel, bias


def mask_ids(input_ids_bt: jax.Array, attention_mask_bt: jax.Array) -> jax.Array:
    """Token ids with every padded position set to 0, so a lookup never reads outside the table.

    An out-of-range id makes `jnp.take` return a NaN row, and 0 x NaN then leaks through masked
    attention into every real token; padding must never be able to do that, whatever pad id a
    tokenizer or config names. (Out-of-range ids on real tokens are rejected on the host.)
    """
    return jnp.where(attention_mask_bt.astype(bool), input_ids_bt, 0)


def resolve_pad_id(hf: dict, *, vocab_size: int, name: str = "config.json") -> int:
    """`pad_token_id`, else `eos_token_id` (the first if a list), else 0; checked against V."""
    pad = hf.get("pad_token_id")
    if pad is None:
        eos = hf.get("eos_token_id")
        pad = (eos[0] if eos else None) if isinstance(eos, list) else eos
    pad = 0 if pad is None else int(pad)
    if not 0 <= pad < vocab_size:
        raise ValueError(
            f"{name}: pad_token_id={pad} is outside the vocabulary (vocab_size={vocab_size})"
        )
    return pad


def positions_from_mask(attention_mask_bt: jax.Array) -> jax.Array:
    """Position ids that count only real tokens, so left and right padding give the same result.

    For right-padded batches this equals HF's default `arange(T)` on every real token.
    """
    return jnp.maximum(jnp.cumsum(attention_mask_bt.astype(jnp.int32), axis=-1) - 1, 0)


def segment_mask(segment_ids_bt: jax.Array) -> jax.Array:
    """[B, T, S] bool: query t may attend key s when both belong to the same packed sequence.

    For the "packed" layout, where one row holds several sequences end to end (padding tokens
    share a segment id of their own and attend only to each other; pooling drops them).
    """
    return segment_ids_bt[:, :, None] == segment_ids_bt[:, None, :]


class PackedSegments(NamedTuple):
    """Packed rows as cuDNN's fused attention reads them: per row, the length and the start of
    each run of equal segment ids ([B, M] and [B, M + 1], -1 past the row's runs; M static)."""

    seqlens_bm: jax.Array
    offsets_bm: jax.Array


def packed_segments(segment_ids_bt: jax.Array, *, max_segments: int) -> PackedSegments:
    """The runs of equal ids in each row of `segment_ids_bt` ([B, T]): every packed sequence,
    and the padding after them, is one run (the `segment_mask` semantics: a token attends to the
    tokens of its own run). `max_segments` (M) must be at least the most runs a row has; M = T
    always is. Pure jnp, any backend."""
    b, t = segment_ids_bt.shape
    first_bt = jnp.concatenate(
        [jnp.ones((b, 1), bool), segment_ids_bt[:, 1:] != segment_ids_bt[:, :-1]], axis=1
    )
    # Run starts in order, then T: [B, M + 1]; a run's length is the next start minus its own.
    starts = jax.vmap(lambda row: jnp.nonzero(row, size=max_segments + 1, fill_value=t)[0])(
        first_bt
    ).astype(jnp.int32)
    lengths = starts[:, 1:] - starts[:, :-1]
    real = starts < t
    return PackedSegments(
        seqlens_bm=jnp.where(real[:, :-1], lengths, -1), offsets_bm=jnp.where(real, starts, -1)
    )


def packed_or_padded(
    attention_mask_bt: jax.Array,
    segment_ids_bt: jax.Array | None,
    positions_bt: jax.Array | None,
    *,
    default_positions_fn: Callable[[jax.Array], jax.Array],
    implementation: str = "xla",
) -> tuple[jax.Array | PackedSegments, jax.Array]:
    """The attention mask and position ids of an encoder's input rows.

    Packed rows (`segment_ids_bt` given) attend within their segment: a [B, T, T] mask
    (`segment_mask`), or for `implementation` "cudnn" the segments' lengths and offsets
    (`packed_segments`, M = T); padded rows use the [B, T] key mask. Positions not given come
    from `default_positions_fn(attention_mask_bt)` (each encoder's own convention).
    """
    if segment_ids_bt is None:
        mask = attention_mask_bt
    elif implementation == "cudnn":
        mask = packed_segments(segment_ids_bt, max_segments=segment_ids_bt.shape[1])
    else:
        mask = segment_mask(segment_ids_bt)
    if positions_bt is None:
        positions_bt = default_positions_fn(attention_mask_bt)
    return mask, positions_bt


def rope_cos_sin(positions_bt: jax.Array, *, head_dim: int, theta: float) -> tuple[jax.Array, ...]:
    """HF default RoPE tables: `cos`, `sin` of shape [B, T, H] (half-frequencies repeated twice)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions_bt.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x_btnh: jax.Array, cos_bth: jax.Array, sin_bth: jax.Array) -> jax.Array:
    """Rotate-half RoPE exactly as HF `apply_rotary_pos_emb` (no q/k permutation needed)."""
    half = x_btnh.shape[-1] // 2
    rotated = jnp.concatenate([-x_btnh[..., half:], x_btnh[..., :half]], axis=-1)
    cos = cos_bth[:, :, None, :].astype(x_btnh.dtype)
    sin = sin_bth[:, :, None, :].astype(x_btnh.dtype)
    return x_btnh * cos + rotated * sin


# "xla": a boolean key mask, any padding, any backend. "cudnn": cuDNN's fused flash kernel (GPU,
# bfloat16/float16) given per-row sequence lengths (right-padded rows) or per-segment lengths and
# offsets (packed rows, `PackedSegments`).
ATTENTION_IMPLEMENTATIONS = ("xla", "cudnn")


def attention(
    q_btnh: jax.Array,
    k_bskh: jax.Array,
    v_bskh: jax.Array,
    attention_mask_bs: jax.Array,
    *,
    causal: bool,
    implementation: str = "xla",
    bias_nts: jax.Array | None = None,
) -> jax.Array:
    """Scaled dot-product attention over non-pad keys; grouped-query when K < N.

    `attention_mask_bs` is a [B, S] key mask, a [B, T, S] mask (`segment_mask`, packed rows;
    "xla"), or `PackedSegments` (packed rows; "cudnn"). `bias_nts` is an additive float32 bias on
    the scaled logits, one [T, S] table per query head (MPNet's relative-position bias; "xla"
    only). "cudnn" on a [B, S] mask goes through `jax.nn.dot_product_attention`, which keeps the
    softmax in float32, and reads the mask as right padding (`query_seq_lengths` /
    `key_value_seq_lengths` = its row sums); padded query rows then come back as zeros, which
    pooling ignores. On `PackedSegments` it calls cuDNN's packed (ragged offsets) kernel, which
    `jax.nn.dot_product_attention` does not expose (`_cudnn_packed`).

    Returns:
        [B, T, N, H] in the dtype of q.
    """
    if implementation == "cudnn":
        if bias_nts is not None:
            raise ValueError("attention='cudnn' takes no position bias (MPNet): use 'xla'")
        if isinstance(attention_mask_bs, PackedSegments):
            return _cudnn_packed(q_btnh, k_bskh, v_bskh, attention_mask_bs, causal=causal)
        if attention_mask_bs.ndim != 2:
            raise ValueError(
                "attention='cudnn' takes right-padded rows or PackedSegments, not a [B, T, S] mask"
            )
        lengths_b = jnp.sum(attention_mask_bs.astype(jnp.int32), axis=-1)
        return jax.nn.dot_product_attention(
            q_btnh,
            k_bskh,
            v_bskh,
            is_causal=causal,
            query_seq_lengths=lengths_b,
            key_value_seq_lengths=lengths_b,
            implementation="cudnn",
        )
    if implementation != "xla":
        raise ValueError(
            f"attention={implementation!r}, expected one of {ATTENTION_IMPLEMENTATIONS}"
        )
    return _einsum_attention(
        q_btnh, k_bskh, v_bskh, attention_mask_bs, causal=causal, bias_nts=bias_nts
    )


def _cudnn_packed(q_btnh, k_bskh, v_bskh, segments: PackedSegments, *, causal: bool):
    """cuDNN fused attention within each packed segment (sequence packing through ragged
    offsets, the same kernel `jax.nn.dot_product_attention` uses for padded rows). Tokens past a
    row's runs come back as zeros. GPU only, bfloat16/float16; checked against the XLA masked
    attention by tests/models/test_attention_gpu.py."""
    try:  # the packed form is only in JAX's internal cuDNN module (jax 0.10)
        from jax._src.cudnn import fused_attention_stablehlo as cudnn
    except ImportError as error:
        raise ValueError(
            f"attention='cudnn' on packed rows needs jax's cuDNN sequence packing "
            f"(jax._src.cudnn.fused_attention_stablehlo; jax {jax.__version__}): use 'xla'"
        ) from error
    mask_type = cudnn.MaskType.PADDING_CAUSAL if causal else cudnn.MaskType.PADDING
    return cudnn.dot_product_attention(
        q_btnh,
        k_bskh,
        v_bskh,
        q_seqlen=segments.seqlens_bm,
        kv_seqlen=segments.seqlens_bm,
        q_offsets=segments.offsets_bm,
        kv_offsets=segments.offsets_bm,
        scale=1.0 / float(np.sqrt(q_btnh.shape[-1])),
        mask_type=mask_type,
        qkv_layout="BTNH",
    )


def _einsum_attention(
    q_btnh, k_bskh, v_bskh, attention_mask_bs, *, causal: bool, bias_nts=None
) -> jax.Array:
    """Softmax attention as two batched matmuls, logits and softmax in float32.

    Heads are moved in front of the sequence axes first ([B, N, T, H]; grouped-query heads as
    [B, K, G, T, H] against [B, K, S, H], so k and v are not copied G times), and the mask enters
    as an additive bias (0 or the most negative float32) rather than a select. On a 2-core AVX2
    CPU (MiniLM heads, float32, packed rows of 256) that is 3x faster forward and 1.3x faster
    forward + backward than einsums on the [B, T, N, H] layout with a select, at the same values
    (BENCHMARKS.md, "Attention").
    """
    b, t, n, h = q_btnh.shape
    s, k = k_bskh.shape[1], k_bskh.shape[2]
    g = n // k
    mask_bts = attention_mask_bs.astype(bool)
    if mask_bts.ndim == 2:
        mask_bts = mask_bts[:, None, :]
    if causal:
        mask_bts = mask_bts & (jnp.arange(s)[None, None, :] <= jnp.arange(t)[None, :, None])
    bias_bts = jnp.where(mask_bts, 0.0, _NEG_INF).astype(jnp.float32)
    k_bksh = k_bskh.transpose(0, 2, 1, 3)
    v_bksh = v_bskh.transpose(0, 2, 1, 3)
    if g == 1:  # plain multi-head: 4-D batched matmuls (the 5-D path with G = 1 ran 1.5x slower)
        q_bnth = q_btnh.transpose(0, 2, 1, 3)
        logits = jnp.einsum("bnth,bnsh->bnts", q_bnth, k_bksh, preferred_element_type=jnp.float32)
        logits = logits * (1.0 / np.sqrt(h))
        if bias_nts is not None:  # position bias first, then the mask, as HF adds them
            logits = logits + bias_nts.astype(jnp.float32)[None]
        logits = logits + bias_bts[:, None]
        probs = jax.nn.softmax(logits, axis=-1).astype(v_bskh.dtype)
        return _probs_times_values("bnts,bnsh->bnth", probs, v_bksh).transpose(0, 2, 1, 3)
    q_bkgth = q_btnh.reshape(b, t, k, g, h).transpose(0, 2, 3, 1, 4)
    logits = jnp.einsum("bkgth,bksh->bkgts", q_bkgth, k_bksh, preferred_element_type=jnp.float32)
    logits = logits * (1.0 / np.sqrt(h))
    if bias_nts is not None:
        logits = logits + bias_nts.astype(jnp.float32).reshape(k, g, t, s)[None]
    logits = logits + bias_bts[:, None, None]
    probs = jax.nn.softmax(logits, axis=-1).astype(v_bskh.dtype)
    out_bkgth = _probs_times_values("bkgts,bksh->bkgth", probs, v_bksh)
    return out_bkgth.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


def _probs_times_values(spec: str, probs: jax.Array, v: jax.Array) -> jax.Array:
    """The attention's second matmul; bfloat16 on the CPU with float32 products (`linear`)."""
    if native_cpu_bf16(v.dtype):
        return jnp.einsum(spec, probs, v, preferred_element_type=jnp.float32).astype(v.dtype)
    return jnp.einsum(spec, probs, v)


# Masked logits: the most negative finite float32, so a row with no valid key stays finite.
_NEG_INF = float(np.finfo(np.float32).min)


# Rematerialisation per layer: "none" keeps every activation, "full" recomputes the whole layer in
# the backward pass, "dots" keeps only matmul outputs (no batch dims) and recomputes the rest.
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def resolve_remat(remat: bool | str) -> str:
    """Normalises `remat` (False/True are "none"/"full") and checks it."""
    name = {False: "none", True: "full"}.get(remat, remat) if isinstance(remat, bool) else remat
    if name not in REMAT_POLICIES:
        raise ValueError(f"remat={remat!r}, expected a bool or one of {sorted(REMAT_POLICIES)}")
    return name


def call_layer(layer, *args: jax.Array) -> jax.Array:
    """`layer(*args)`: the `apply_fn` of `remat_layer` / `apply_layers` for plain layers."""
    return layer(*args)


def remat_layer(apply_fn, remat: bool | str):
    """`apply_fn(layer, *args)` wrapped in `nnx.remat` with the named policy (or unchanged)."""
    name = resolve_remat(remat)
    if name == "none":
        return apply_fn
    return nnx.remat(apply_fn, policy=REMAT_POLICIES[name])


def apply_layers(
    layer_list, apply_fn, x: jax.Array, *args: jax.Array, scan: bool = True
) -> jax.Array:
    """`x = apply_fn(layer, x, *args)` for every layer in order.

    With `scan` the layers' parameters are stacked inside the traced function and the layer runs
    as the body of one `lax.scan`: JAX traces and XLA compiles one layer instead of L, so compile
    time no longer grows with depth. Parameters, checkpoints and HF names keep their per-layer
    layout (the stack is a copy made in the step; its gradient is unstacked by autodiff)."""
    if not scan or len(layer_list) < 2:
        for layer in layer_list:
            x = apply_fn(layer, x, *args)
        return x
    splits = [nnx.split(layer) for layer in layer_list]
    graphdef = splits[0][0]
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *(state for _, state in splits))

    def body(carry: jax.Array, state) -> tuple[jax.Array, None]:
        return apply_fn(nnx.merge(graphdef, state), carry, *args), None

    x, _ = jax.lax.scan(body, x, stacked)
    return x


def mean_pool(hidden_btd: jax.Array, attention_mask_bt: jax.Array) -> jax.Array:
    """Mean of the hidden states over non-pad tokens, in float32. Rows with no token give zeros."""
    mask = attention_mask_bt.astype(jnp.float32)[..., None]
    total = jnp.sum(hidden_btd.astype(jnp.float32) * mask, axis=1)
    return total / jnp.maximum(jnp.sum(mask, axis=1), 1.0)


def last_token_pool(hidden_btd: jax.Array, attention_mask_bt: jax.Array) -> jax.Array:
    """Hidden state of the last non-pad token (Qwen3-Embedding's default), any padding side."""
    mask = attention_mask_bt.astype(jnp.int32)
    positions = jnp.arange(mask.shape[1], dtype=jnp.int32)
    last = jnp.max(jnp.where(mask > 0, positions, 0), axis=1)
    return jnp.take_along_axis(hidden_btd, last[:, None, None], axis=1)[:, 0].astype(jnp.float32)


def first_token_pool(hidden_btd: jax.Array, attention_mask_bt: jax.Array) -> jax.Array:
    """Hidden state of the first non-pad token ([CLS] of BERT-style embedders such as BGE), any
    padding side."""
    first = jnp.argmax(attention_mask_bt > 0, axis=1)
    return jnp.take_along_axis(hidden_btd, first[:, None, None], axis=1)[:, 0].astype(jnp.float32)


def l2_normalize(x_bd: jax.Array, eps: float = 1e-12) -> jax.Array:
    """Row-wise L2 normalisation in float32 (as `torch.nn.functional.normalize`).

    max(||x||, eps) taken as sqrt(max(||x||^2, eps^2)): the same value, and a zero row (a packed
    slot with no sequence) gets a zero gradient instead of 0 x inf = NaN from sqrt at 0.
    """
    x32 = x_bd.astype(jnp.float32)
    norm = jnp.sqrt(jnp.maximum(jnp.sum(x32 * x32, axis=-1, keepdims=True), eps * eps))
    return x32 / norm


POOLERS = {"mean": mean_pool, "last": last_token_pool, "cls": first_token_pool}


# Poolers that take one token per packed sequence: the side from which the neighbouring id is
# read ("last": the next token, so pad after; "cls": the previous one, so pad before).
_NEIGHBOUR_PAD = {"last": (0, 1), "cls": (1, 0)}


def _shifted(segment_ids_bt: jax.Array, pad: tuple[int, int]) -> jax.Array:
    """Each token's neighbour id along the sequence (-1 past either end), read from the side
    `pad` names: (0, 1) gives the next token's id, (1, 0) the previous one's."""
    kept = segment_ids_bt[:, pad[1] : segment_ids_bt.shape[1] - pad[0]]
    return jnp.pad(kept, ((0, 0), pad), constant_values=-1)


def pool_packed(
    hidden_btd: jax.Array, segment_ids_bt: jax.Array, *, pooling: str, num_segments: int
) -> jax.Array:
    """`POOLERS[pooling]` per packed sequence: [num_segments, D] float32, zeros for empty ids.

    Tokens whose segment id is outside [0, num_segments) (padding) are dropped. "last" takes a
    segment's final token: sequences lie end to end, so that is where the next id differs; "cls"
    its first, where the previous id differs.
    """
    if pooling not in POOLERS:
        raise ValueError(f"pooling={pooling!r}, expected one of {sorted(POOLERS)}")
    hidden_nd = hidden_btd.astype(jnp.float32).reshape(-1, hidden_btd.shape[-1])
    segments_n = segment_ids_bt.reshape(-1)
    if pooling in _NEIGHBOUR_PAD:
        neighbour = _shifted(segment_ids_bt, _NEIGHBOUR_PAD[pooling])
        take_n = (segment_ids_bt != neighbour).reshape(-1).astype(jnp.float32)
        return jax.ops.segment_sum(hidden_nd * take_n[:, None], segments_n, num_segments)
    total = jax.ops.segment_sum(hidden_nd, segments_n, num_segments)
    count = jax.ops.segment_sum(jnp.ones_like(segments_n, jnp.float32), segments_n, num_segments)
    return total / jnp.maximum(count, 1.0)[:, None]
