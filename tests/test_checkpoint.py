"""Checkpoints: a sharded TrainState round trip, and params-only restore onto one device."""

import grain
import jax
import numpy as np
import optax
import pytest

from caliber_jax import checkpoint, sharding, step


def make_state(mesh):
    """A TrainState whose [16, 8] matrix and [12, 4] embedding are split over the fsdp axis."""
    rng = np.random.default_rng(0)
    params = {
        "encoder": {
            "layer": {"kernel": rng.normal(size=(16, 8)).astype(np.float32)},
            "embed": {"embedding": rng.normal(size=(12, 4)).astype(np.float32)},
            "norm": {"scale": rng.normal(size=(8,)).astype(np.float32)},
        }
    }
    optimizer = optax.adamw(1e-3)
    abstract = jax.eval_shape(lambda p: step.init_state(p, optimizer, seed=0), params)
    shardings = sharding.param_shardings(mesh, abstract)
    init = jax.jit(lambda p: step.init_state(p, optimizer, seed=0), out_shardings=shardings)
    return params, init(sharding.put_sharded(params, shardings.params)), shardings


def data_iterator():
    return iter(grain.MapDataset.range(100).to_iter_dataset())


def test_sharded_save_then_params_only_restore_on_one_device(tmp_path):
    mesh = sharding.make_mesh(fsdp=4)
    params, state, _ = make_state(mesh)
    kernel = state.params["encoder"]["layer"]["kernel"]
    assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", None)
    embedding = state.params["encoder"]["embed"]["embedding"]
    assert embedding.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp")  # hidden axis
    manager = checkpoint.make_manager(tmp_path / "ckpt", max_to_keep=2, save_interval_steps=1)
    iterator = data_iterator()
    next(iterator)
    assert checkpoint.save(manager, 3, state, iterator, force=True)
    manager.close()

    device = jax.local_devices()[5]
    restored, found_step = checkpoint.restore_params(tmp_path / "ckpt", device=device)
    assert found_step == 3
    assert restored.keys() == {"encoder"}
    for name in ("layer", "embed", "norm"):
        (key,) = restored["encoder"][name]
        np.testing.assert_array_equal(restored["encoder"][name][key], params["encoder"][name][key])
        assert isinstance(restored["encoder"][name][key], np.ndarray)


def test_full_restore_into_sharded_abstract_state_resumes_the_iterator(tmp_path):
    mesh = sharding.make_mesh(fsdp=2)
    _, state, shardings = make_state(mesh)
    manager = checkpoint.make_manager(tmp_path / "ckpt", max_to_keep=2, save_interval_steps=1)
    iterator = data_iterator()
    consumed = [next(iterator) for _ in range(4)]
    checkpoint.save(manager, 4, state, iterator, force=True)
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), state, shardings
    )
    fresh = data_iterator()
    restored, found_step = checkpoint.restore(manager, abstract, fresh)
    manager.close()
    assert found_step == 4 and consumed == [0, 1, 2, 3] and next(fresh) == 4
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        assert got.sharding == want.sharding
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_restore_params_without_checkpoint_fails_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        checkpoint.restore_params(tmp_path / "empty")


def test_keep_period_keeps_mid_run_steps_beside_the_latest(tmp_path):
    mesh = sharding.make_mesh(fsdp=1)
    _, state, _ = make_state(mesh)
    iterator = data_iterator()
    with checkpoint.make_manager(
        tmp_path / "ckpt", max_to_keep=1, save_interval_steps=1, keep_period=3
    ) as manager:
        for number in range(1, 8):
            next(iterator)
            checkpoint.save(manager, number, state, iterator)
        assert sorted(manager.all_steps()) == [3, 6, 7]
    _, found_step = checkpoint.restore_params(tmp_path / "ckpt", step=3)
    assert found_step == 3
