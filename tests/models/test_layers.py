"""caliber_jax/models/layers.py: packed rows as cuDNN reads them (`packed_segments`), bfloat16
matmuls on the CPU (`cpu_bf16_matmul`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from caliber_jax.models import layers


def _runs(row: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each run of equal ids in `row`, a plain-Python reference."""
    runs, start = [], 0
    for i in range(1, len(row) + 1):
        if i == len(row) or row[i] != row[start]:
            runs.append((start, i - start))
            start = i
    return runs


def test_packed_segments_are_the_runs_of_each_row_padded_with_minus_one():
    # Row 0: three sequences then padding (-1); row 1: one sequence filling the row; row 2:
    # two sequences, no padding. Slot ids are global, as the packer writes them.
    ids = np.array([[0, 0, 0, 1, 1, 2, -1, -1], [3, 3, 3, 3, 3, 3, 3, 3], [4, 4, 4, 4, 5, 5, 5, 5]])
    segments = layers.packed_segments(jnp.asarray(ids), max_segments=4)
    assert segments.seqlens_bm.shape == (3, 4) and segments.offsets_bm.shape == (3, 5)
    np.testing.assert_array_equal(
        segments.seqlens_bm, [[3, 2, 1, 2], [8, -1, -1, -1], [4, 4, -1, -1]]
    )
    np.testing.assert_array_equal(
        segments.offsets_bm, [[0, 3, 5, 6, -1], [0, -1, -1, -1, -1], [0, 4, -1, -1, -1]]
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_packed_segments_match_a_reference_on_random_packings(seed):
    rng = np.random.default_rng(seed)
    t = 64
    rows = []
    for r in range(6):
        row, slot = [], 100 * r
        while len(row) < t - 2 and rng.random() < 0.85:
            length = int(rng.integers(1, 20))
            row += [slot] * min(length, t - len(row))
            slot += 1
        rows.append(row + [-1] * (t - len(row)))
    ids = np.array(rows)
    segments = layers.packed_segments(jnp.asarray(ids), max_segments=t)
    for b, row in enumerate(ids):
        runs = _runs(row)
        k = len(runs)
        np.testing.assert_array_equal(segments.seqlens_bm[b, :k], [n for _, n in runs])
        np.testing.assert_array_equal(segments.offsets_bm[b, :k], [s for s, _ in runs])
        assert (np.asarray(segments.seqlens_bm[b, k:]) == -1).all()
        assert (np.asarray(segments.offsets_bm[b, k:]) == -1).all()
        assert sum(n for _, n in runs) == t  # every token, padding included, is in one run


def test_packed_rows_go_to_cudnn_as_segments_and_to_xla_as_a_mask():
    ids = jnp.asarray([[0, 0, 1, -1]])
    mask_bt = jnp.ones((1, 4), jnp.int32)
    xla_mask, positions = layers.packed_or_padded(
        mask_bt, ids, None, default_positions_fn=layers.positions_from_mask
    )
    assert xla_mask.shape == (1, 4, 4) and positions.shape == (1, 4)
    segments, _ = layers.packed_or_padded(
        mask_bt, ids, None, default_positions_fn=layers.positions_from_mask,
        implementation="cudnn",
    )  # fmt: skip
    assert isinstance(segments, layers.PackedSegments)
    np.testing.assert_array_equal(segments.seqlens_bm, [[2, 1, 1, -1]])
    padded, _ = layers.packed_or_padded(
        mask_bt, None, None, default_positions_fn=layers.positions_from_mask,
        implementation="cudnn",
    )  # fmt: skip
    assert padded is mask_bt  # right-padded rows keep the key mask (jax.nn's cuDNN call)


# --- bfloat16 matmuls on the CPU (`layers.cpu_bf16_matmul`) -------------------------------------


def _bf16(x):
    return np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32))


def test_cpu_bf16_matmul_is_float32_products_of_bfloat16_operands_rounded_once():
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(2, 5, 48)).astype(np.float32), rng.normal(size=(48, 24)) * 0.1
    got = layers.cpu_bf16_matmul(jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.float32),
                                 jnp.bfloat16)  # fmt: skip
    assert got.dtype == jnp.bfloat16
    # The same products summed in float64 and rounded to bfloat16 once: equal, or one bfloat16
    # step apart where the float32 sum's order lands on the other side of a rounding boundary.
    want = _bf16(np.einsum("bti,io->bto", _bf16(x).astype(np.float64), _bf16(w)))
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=2**-7, atol=1e-6)
    assert np.mean(np.asarray(got, np.float32) == want) > 0.95


def test_cpu_bf16_matmul_gradients_are_those_of_the_rounded_float32_product():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(3, 7, 32)), jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=(32, 16)) * 0.1, jnp.float32)
    g = jnp.asarray(rng.normal(size=(3, 7, 16)), jnp.float32)

    def loss(matmul):
        return lambda x, w: jnp.sum(matmul(x, w).astype(jnp.float32) * g)

    dx, dw = jax.grad(loss(lambda x, w: layers.cpu_bf16_matmul(x, w, jnp.bfloat16)), (0, 1))(x, w)
    assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.float32  # the weight's gradient in float32
    g16 = _bf16(g).astype(np.float64)  # the cotangent arrives in bfloat16
    want_dx = _bf16(np.einsum("bto,io->bti", g16, _bf16(w)))
    want_dw = np.einsum("bti,bto->io", _bf16(x).astype(np.float64), g16)
    np.testing.assert_allclose(np.asarray(dx, np.float32), want_dx, rtol=2**-7, atol=1e-6)
    np.testing.assert_allclose(np.asarray(dw), want_dw, rtol=1e-5, atol=1e-5)


def test_bfloat16_linears_on_the_cpu_multiply_bfloat16_operands_forward_and_backward(monkeypatch):
    """What makes it fast: every dot of a bfloat16 Linear's forward and backward takes bfloat16
    operands (autodiff of a dot with float32 products would feed the weight's gradient float32),
    on a CPU with bfloat16 instructions; other CPUs keep the plain Linear."""
    from caliber_jax import host

    monkeypatch.setattr(host, "native_bf16", lambda: False)
    assert layers.linear(8, 4, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)).dot_general is (
        jax.lax.dot_general
    )
    monkeypatch.setattr(host, "native_bf16", lambda: True)
    lin = layers.linear(32, 16, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(lin)
    x = jnp.ones((4, 32), jnp.float32)

    def loss(state, x):
        return jnp.sum(nnx.merge(graphdef, state)(x).astype(jnp.float32) ** 2)

    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(state, x).as_text()
    dots = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    assert len(dots) == 3  # forward, the input's gradient, the weight's gradient
    for line in dots:
        operands = line.split(":", 1)[1].split("->")[0]
        assert operands.count("bf16") == 2, line
    # float32 compute keeps the plain Linear.
    plain = layers.linear(32, 16, dtype=jnp.float32, rngs=nnx.Rngs(0))
    assert plain.dot_general is jax.lax.dot_general


# A bfloat16 cotangent summed over many rows: 3,000 reads of one row with gradient 0.01 each.
READS, COTANGENT = 3000, 0.01
EXACT = READS * float(jnp.asarray(COTANGENT, jnp.bfloat16))  # each term rounded once, 30.03


def _grad_of_sum(module, inputs):
    """d/dparams of sum(module(inputs) x 0.01), jitted as a training step is."""

    def loss(module):
        return jnp.sum(module(inputs).astype(jnp.float32) * COTANGENT)

    return jax.jit(nnx.grad(loss))(module)


def test_bfloat16_embedding_gradients_are_summed_in_float32():
    """A row that thousands of tokens read gets their whole gradient: `nnx.Embed` rounds the table
    to bfloat16 before the lookup, so its backward sums in bfloat16 and stops at 4.0 (seen before
    this layer existed); the forward values are the same as that lookup's."""
    table = layers.embed(10, 4, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    ids = jnp.asarray([0] * READS + [3, 7], jnp.int32)
    flax_embed = nnx.Embed(10, 4, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    flax_embed.embedding[...] = table.embedding[...]
    got = table(ids)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(got, np.float32), np.asarray(flax_embed(ids), np.float32)
    )
    grad = np.asarray(_grad_of_sum(table, ids).embedding[...])
    assert grad.dtype == np.float32
    np.testing.assert_allclose(grad[0], EXACT, rtol=1e-5)
    np.testing.assert_allclose(grad[[3, 7]], float(jnp.asarray(COTANGENT, jnp.bfloat16)), rtol=1e-6)
    np.testing.assert_array_equal(grad[[1, 2, 4, 5, 6, 8, 9]], 0.0)


@pytest.mark.parametrize("native", [False, True])
def test_bfloat16_bias_and_norm_gradients_are_summed_in_float32(monkeypatch, native):
    """A bias's and an RMSNorm scale's gradient are sums over every row of a batch: in float32
    (rounded to bfloat16 first, the sum came out 31.875 for 30.03), on both Linear paths; the
    forward adds the float32 bias to the product and rounds the sum once."""
    from caliber_jax import host

    monkeypatch.setattr(host, "native_bf16", lambda: native)
    lin = layers.linear(4, 4, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    x = jnp.zeros((READS, 4), jnp.bfloat16)  # the output is the bias alone
    np.testing.assert_array_equal(
        np.asarray(lin(x), np.float32),
        np.broadcast_to(np.asarray(lin.bias[...].astype(jnp.bfloat16), np.float32), (READS, 4)),
    )
    np.testing.assert_allclose(np.asarray(_grad_of_sum(lin, x).bias[...]), EXACT, rtol=1e-5)
    lin.bias[...] = jnp.asarray([0.1234567, -1.0078125, 3.0e-3, 257.3], jnp.float32)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(5, 4)), jnp.bfloat16)
    product = np.asarray(x, np.float64) @ np.asarray(
        lin.kernel[...].astype(jnp.bfloat16), np.float64
    )
    # The product in bfloat16 (float32 products, rounded once), then + the float32 bias, rounded.
    want = _bf16(_bf16(product) + np.asarray(lin.bias[...], np.float64))
    np.testing.assert_array_equal(np.asarray(lin(x), np.float32), want)

    norm = layers.RMSNorm(4, eps=1e-6, dtype=jnp.bfloat16)
    ones = jnp.ones((READS, 4), jnp.bfloat16)  # normalised to 1: the output is the scale
    np.testing.assert_array_equal(np.asarray(norm(ones), np.float32), 1.0)
    np.testing.assert_allclose(np.asarray(_grad_of_sum(norm, ones).weight[...]), EXACT, rtol=1e-3)
