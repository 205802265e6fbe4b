"""Orbax checkpoints of `{state, data_iter}`: the TrainState pytree and the Grain iterator position.

One composite checkpoint per saved step, written by Orbax's CheckpointManager (atomic: a step
directory only appears once complete), keep-N, restored into an abstract state carrying shardings.
Saves may be asynchronous: the caller waits for the device-to-host copy only, and a background
thread writes the files. Directories may be URLs (`gs://bucket/run/checkpoints`); Orbax handles
them through epath.
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
    asynchronous: bool = False,
) -> ocp.CheckpointManager:
    """CheckpointManager for `{state, data_iter}` items under `directory`.

    `max_to_keep` latest steps are kept; with `keep_period`, every step divisible by it is kept
    as well (mid-run checkpoints to export and score later, e.g. `scripts/sweep.py --checkpoints`).
    With `asynchronous`, `save` returns once the state is in host memory and the files are written
    in the background: the caller must `close()` the manager (or `wait_until_finished()`) before
    the process exits, or the last step stays an unfinished temporary directory.
    """
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        keep_period=keep_period or None,
        save_interval_steps=save_interval_steps,
        create=True,
        enable_async_checkpointing=asynchronous,
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
    """Saves when the manager's interval says so (or `force`); returns whether it saved.

    A synchronous manager returns with the step written. An asynchronous one (`make_manager`)
    first waits for its previous save, then returns once this step's arrays are copied to host
    memory and the iterator's position is written, so the caller may advance both at once (the
    next train step may donate the state's buffers); the arrays are written and the step made
    visible in a background thread.
    """
    # Orbax's async save of a jax.Array copies it to host memory before `manager.save` returns
    # (PyTreeCheckpointHandler's default, no device-to-host byte limit: every array is a
    # "prioritized", synchronous transfer). Grain's handler is synchronous: Orbax runs it inside
    # the same blocking phase, so the saved position is the one of `step`.
    args = ocp.args.Composite(
        state=ocp.args.StandardSave(state), data_iter=grain.checkpoint.CheckpointSave(data_iter)
    )
    return manager.save(step, args=args, force=force)


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


def saved_steps(directory: str | os.PathLike) -> list[int]:
    """The steps of the finished checkpoints in `directory`, ascending ([] when it is missing;
    an unfinished save, "<step>.orbax-checkpoint-tmp...", is not one)."""
    directory = paths.as_path(directory)
    return sorted(ocp.utils.checkpoint_steps(directory)) if directory.exists() else []


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
