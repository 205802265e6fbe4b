"""Orbax checkpoints of `{state, data_iter}`: the TrainState pytree and the Grain iterator position.

One composite checkpoint per saved step, written by Orbax's CheckpointManager (atomic: a step
directory only appears once complete), keep-N, restored into an abstract state carrying shardings.
Directories may be URLs (`gs://bucket/run/checkpoints`); Orbax handles them through epath.
"""

import os
from typing import Any

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp

from caliber_jax import paths


def make_manager(
    directory: str | os.PathLike,
    *,
    max_to_keep: int,
    save_interval_steps: int,
    keep_period: int | None = None,
) -> ocp.CheckpointManager:
    """CheckpointManager for `{state, data_iter}` items under `directory`.

    `max_to_keep` latest steps are kept; with `keep_period`, every step divisible by it is kept
    as well (mid-run checkpoints to export and score later, e.g. `scripts/sweep.py --checkpoints`).
    """
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        keep_period=keep_period or None,
        save_interval_steps=save_interval_steps,
        create=True,
        enable_async_checkpointing=False,
    )
    handlers = {
        "state": ocp.StandardCheckpointHandler(),
        "data_iter": grain.checkpoint.CheckpointHandler(),
    }
    return ocp.CheckpointManager(paths.as_path(directory), item_handlers=handlers, options=options)


def save(
    manager: ocp.CheckpointManager,
    step: int,
    state: Any,
    data_iter: grain.DatasetIterator,
    *,
    force: bool = False,
) -> bool:
    """Saves when the manager's interval says so (or `force`); returns whether it saved."""
    args = ocp.args.Composite(
        state=ocp.args.StandardSave(state), data_iter=grain.checkpoint.CheckpointSave(data_iter)
    )
    saved = manager.save(step, args=args, force=force)
    manager.wait_until_finished()
    return saved


def restore(
    manager: ocp.CheckpointManager,
    abstract_state: Any,
    data_iter: grain.DatasetIterator,
    *,
    step: int | None = None,
) -> tuple[Any, int]:
    """Restores the latest (or given) step into `abstract_state`'s shapes and shardings.

    The iterator is restored in place. Returns (state, step).
    """
    step = manager.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"no checkpoint in {manager.directory}")
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data_iter=grain.checkpoint.CheckpointRestore(data_iter),
        ),
    )
    return restored["state"], step


def restore_params(
    directory: str | os.PathLike, *, step: int | None = None, device: jax.Device | None = None
) -> tuple[Any, int]:
    """Only the params of a saved TrainState, as host arrays. Returns (params, step).

    Reads nothing else (no Adam moments) and places every array whole on one device (default: the
    first local one) through explicit targets, so a checkpoint written by any number of processes
    and devices restores in a single process.
    """
    directory = paths.as_path(directory)
    with ocp.CheckpointManager(directory) as manager:
        step = manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {directory}")
        path = manager.directory / str(step) / "state"
    # The item's own handler, not a `Checkpointer`: a Checkpointer looks for the step's
    # _CHECKPOINT_METADATA inside the item directory (`<step>/state`), where the manager never
    # writes it, and logs a warning on every export.
    handler = ocp.PyTreeCheckpointHandler()
    try:
        metadata = handler.metadata(path).tree
        single = jax.sharding.SingleDeviceSharding(device or jax.local_devices()[0])
        target = {"params": jax.tree.map(lambda m: np.zeros(m.shape, m.dtype), metadata["params"])}
        restore_args = jax.tree.map(lambda _: ocp.ArrayRestoreArgs(sharding=single), target)
        restored = handler.restore(
            path,
            args=ocp.args.PyTreeRestore(
                item=target, restore_args=restore_args, partial_restore=True
            ),
        )
    finally:
        handler.close()
    return jax.device_get(restored["params"]), step
