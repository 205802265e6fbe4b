"""caliber_jax/grad_chunks.py: the gradients of `step.grad_step` from groups of packed rows."""

import functools

import jax
import numpy as np
import pytest

from caliber_jax import grad_chunks, sharding, step
from tests.test_step import CONFIG, make_batch, make_model, to_packed

LOSS_ARGS = dict(reduction="batch")
WEIGHTS = {"lam": np.float32(0.5), "margin": np.float32(0.05)}


def chunked(graphdef, params, mesh, *, rows):
    abstract = jax.eval_shape(lambda p: p, params)
    params_shardings = sharding.param_shardings(mesh, abstract)
    fn = grad_chunks.make_chunked_grad(
        graphdef, LOSS_ARGS, mesh=mesh, params_shardings=params_shardings, rows=rows,
        pooled_shape=(2 * 16, CONFIG.hidden_size),
    )  # fmt: skip
    return fn, sharding.put_sharded(params, params_shardings)


def whole(graphdef, params, packed):
    fn = jax.jit(functools.partial(step.grad_step, graphdef=graphdef, **LOSS_ARGS, **WEIGHTS))
    return jax.device_get(fn(params, packed))


@pytest.mark.parametrize("out_dim", [None, 24])
def test_groups_of_rows_give_the_whole_batch_gradients(out_dim):
    """8 devices, groups of 8 packed rows: the same gradients and metrics as one program over
    all rows (with W_out, whose gradient comes from the loss program alone, and without)."""
    graphdef, params = make_model(0, out_dim=out_dim)
    dim = out_dim or CONFIG.hidden_size
    batch = make_batch(3, rows=16)
    if out_dim:
        rng = np.random.default_rng(1)
        for key in ("teacher_x", "teacher_px"):
            vecs = rng.standard_normal((16, dim)).astype(np.float32)
            batch[key] = vecs / np.linalg.norm(vecs, axis=-1, keepdims=True)
    packed = to_packed(batch, length=16, rows_multiple=8)
    assert packed["packed_ids"].shape[0] >= 16  # at least two groups
    grads_whole, metrics_whole = whole(graphdef, params, packed)

    mesh = sharding.make_mesh(devices=jax.devices())
    fn, placed = chunked(graphdef, params, mesh, rows=8)
    grads, metrics = jax.device_get(fn(placed, packed, WEIGHTS))
    assert metrics.keys() == metrics_whole.keys()
    for key in metrics:
        np.testing.assert_allclose(metrics[key], metrics_whole[key], rtol=1e-5, err_msg=key)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads, grads_whole
    )


def test_every_row_count_runs_the_same_programs():
    graphdef, params = make_model(0)
    mesh = sharding.make_mesh(devices=jax.devices())
    fn, placed = chunked(graphdef, params, mesh, rows=8)
    programs = (fn.forward, fn.head, fn.backward, fn.finish)
    counts, cache_sizes = set(), []
    for seed, rows_multiple in ((4, 8), (5, 32)):
        packed = to_packed(make_batch(seed, rows=16), length=16, rows_multiple=rows_multiple)
        counts.add(packed["packed_ids"].shape[0])
        grads, _ = jax.device_get(fn(placed, packed, WEIGHTS))
        # jit shares its cache between wrappers of one function, so count what this batch adds.
        cache_sizes.append([program._cache_size() for program in programs])
        grads_whole, _ = whole(graphdef, params, packed)
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
            grads,
            grads_whole,
        )
    assert len(counts) == 2
    assert cache_sizes[0] == cache_sizes[1]


def test_rows_must_split_evenly():
    graphdef, params = make_model(0)
    mesh = sharding.make_mesh(devices=jax.devices())
    with pytest.raises(ValueError, match="multiple of this process's 8 devices"):
        chunked(graphdef, params, mesh, rows=4)
    fn, placed = chunked(graphdef, params, mesh, rows=16)
    packed = to_packed(make_batch(4, rows=16), length=16, rows_multiple=8)
    if packed["packed_ids"].shape[0] % 16 == 0:
        packed = {k: (v[:8] if k in step.PACKED_KEYS else v) for k, v in packed.items()}
    with pytest.raises(ValueError, match="do not split into groups of 16"):
        fn(placed, packed, WEIGHTS)
