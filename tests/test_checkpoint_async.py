"""Asynchronous checkpoints: the saved state and iterator are those of the saved step even while
later (donating) steps run, an interrupted write leaves no restorable step, and asynchronous and
synchronous managers read each other's checkpoints."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax

from caliber_jax import checkpoint, sharding, step

REPO = Path(__file__).resolve().parents[1]
OPTIMIZER = optax.adamw(1e-2)


def make_state(mesh, *, rows: int = 64):
    """A TrainState with a [rows, 256] float32 matrix split over the fsdp axis, and its
    shardings."""
    rng = np.random.default_rng(0)
    params = {
        "layer": {"kernel": rng.normal(size=(rows, 256)).astype(np.float32)},
        "norm": {"scale": rng.normal(size=(256,)).astype(np.float32)},
    }
    abstract = jax.eval_shape(lambda p: step.init_state(p, OPTIMIZER, seed=0), params)
    shardings = sharding.param_shardings(mesh, abstract)
    init = jax.jit(lambda p: step.init_state(p, OPTIMIZER, seed=0), out_shardings=shardings)
    return init(sharding.put_sharded(params, shardings.params)), shardings


def make_update_fn(shardings):
    """A train-step stand-in that donates the state, as `train_step` does: one AdamW update with
    all-ones gradients, which changes every params and moments entry."""

    def update(state):
        grads = jax.tree.map(jnp.ones_like, state.params)
        updates, opt_state = OPTIMIZER.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return dataclasses.replace(state, step=state.step + 1, params=params, opt_state=opt_state)

    return jax.jit(update, in_shardings=(shardings,), out_shardings=shardings, donate_argnums=0)


def abstract_of(state, shardings):
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), state, shardings
    )


def data_iterator():
    return iter(grain.MapDataset.range(100).to_iter_dataset())


def assert_trees_equal(got, want):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_async_save_keeps_its_step_while_donating_steps_run(tmp_path):
    # Every array is split over all 8 devices or held by each: no replica is sliced into a new
    # buffer, so Orbax reads the very buffers the next step donates.
    mesh = sharding.make_mesh(fsdp=8)
    state, shardings = make_state(mesh, rows=4096)  # 4 MB per array, 12 MB with the moments
    update_fn = make_update_fn(shardings)
    state = update_fn(state)
    iterator = data_iterator()
    for _ in range(3):
        next(iterator)
    saved = jax.device_get(state)  # a host copy of the step-1 state, taken before saving
    manager = checkpoint.make_manager(
        tmp_path / "ckpt", max_to_keep=2, save_interval_steps=1, asynchronous=True
    )
    try:
        assert checkpoint.save(manager, 1, state, iterator, force=True)
        # The loop's next steps, at once: they donate (overwrite) the buffers just saved, and the
        # iterator moves on, possibly while the background thread still writes step 1.
        with jax.transfer_guard("disallow"):
            for _ in range(3):
                state = update_fn(state)
        for _ in range(5):
            next(iterator)
        after = jax.device_get(state)
        manager.wait_until_finished()
        assert manager.all_steps() == [1]
        fresh = data_iterator()
        restored, found_step = checkpoint.restore(manager, abstract_of(state, shardings), fresh)
    finally:
        manager.close()
    assert found_step == 1 and next(fresh) == 3
    assert_trees_equal(restored, saved)
    # The test can fail: the later steps changed every saved array but the rng.
    for name in ("step", "params", "opt_state"):
        later, kept = jax.tree.leaves(getattr(after, name)), jax.tree.leaves(getattr(saved, name))
        for a, b in zip(later, kept, strict=True):
            assert not np.array_equal(a, b), name
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        assert got.sharding == want.sharding
    params, found_step = checkpoint.restore_params(tmp_path / "ckpt")
    assert found_step == 1
    assert_trees_equal(params, saved.params)


def test_sync_and_async_managers_read_each_others_checkpoints(tmp_path):
    mesh = sharding.make_mesh(fsdp=2)
    state, shardings = make_state(mesh)
    update_fn = make_update_fn(shardings)
    abstract = abstract_of(state, shardings)
    iterator = data_iterator()
    next(iterator)
    step_1 = jax.device_get(state)
    with checkpoint.make_manager(tmp_path / "ckpt", max_to_keep=3, save_interval_steps=1) as sync:
        assert checkpoint.save(sync, 1, state, iterator)
        assert sync.all_steps() == [1]  # written when save returns

    with checkpoint.make_manager(
        tmp_path / "ckpt", max_to_keep=3, save_interval_steps=1, asynchronous=True
    ) as manager:
        fresh = data_iterator()
        state, found_step = checkpoint.restore(manager, abstract, fresh)
        assert found_step == 1 and next(fresh) == 1
        assert_trees_equal(state, step_1)
        state = update_fn(state)
        step_2 = jax.device_get(state)
        assert checkpoint.save(manager, 2, state, fresh)
    # close() finished the write

    with checkpoint.make_manager(tmp_path / "ckpt", max_to_keep=3, save_interval_steps=1) as sync:
        assert sync.all_steps() == [1, 2]
        fresh = data_iterator()
        restored, found_step = checkpoint.restore(sync, abstract, fresh)
    assert found_step == 2 and next(fresh) == 2
    assert_trees_equal(restored, step_2)
    for at_step, want in ((1, step_1), (2, step_2)):
        params, found_step = checkpoint.restore_params(tmp_path / "ckpt", step=at_step)
        assert found_step == at_step
        assert_trees_equal(params, want.params)


def save_then_die_before_commit(directory: str) -> None:
    """Child process: saves step 1 completely, then step 2 asynchronously, and dies (as a killed
    job would) once step 2's files are written, just before Orbax makes the step visible."""
    from orbax.checkpoint._src.checkpointers import async_checkpointer

    mesh = sharding.make_mesh(fsdp=1)
    state, shardings = make_state(mesh)
    update_fn = make_update_fn(shardings)
    iterator = data_iterator()
    next(iterator)
    manager = checkpoint.make_manager(
        directory, max_to_keep=3, save_interval_steps=1, asynchronous=True
    )
    checkpoint.save(manager, 1, state, iterator)
    manager.wait_until_finished()
    # The commit (the rename of the temporary directory) runs in the background thread.
    async_checkpointer._on_commit_callback = lambda *args, **kwargs: os._exit(3)
    next(iterator)
    checkpoint.save(manager, 2, update_fn(state), iterator)
    manager.wait_until_finished()
    sys.exit(0)  # not reached


def test_interrupted_async_save_leaves_no_restorable_step(tmp_path):
    directory = tmp_path / "ckpt"
    child = subprocess.run(
        [sys.executable, "-c", "import sys; from tests.test_checkpoint_async import "
         "save_then_die_before_commit as f; f(sys.argv[1])", str(directory)],
        cwd=REPO, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert child.returncode == 3, child.stderr[-3000:]
    names = sorted(p.name for p in directory.iterdir())
    # Step 2's data is on disk, under a temporary name only.
    assert "1" in names and "2" not in names, names
    assert any(name.startswith("2.orbax-checkpoint-tmp") for name in names), names

    _, found_step = checkpoint.restore_params(directory)
    assert found_step == 1
    mesh = sharding.make_mesh(fsdp=1)
    state, shardings = make_state(mesh)  # the child's step-1 state: same seed, same values
    with checkpoint.make_manager(
        directory, max_to_keep=3, save_interval_steps=1, asynchronous=True
    ) as manager:
        assert manager.latest_step() == 1
        fresh = data_iterator()
        restored, found_step = checkpoint.restore(manager, abstract_of(state, shardings), fresh)
        assert found_step == 1 and next(fresh) == 1
        assert_trees_equal(restored, state)
        # The resumed run saves step 2 again over the leftover temporary directory.
        assert checkpoint.save(manager, 2, restored, fresh)
    assert sorted(p.name for p in directory.iterdir()) == ["1", "2"]
    assert checkpoint.restore_params(directory)[1] == 2
