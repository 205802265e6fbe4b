"""The one place that knows about sharding: the cluster, the device mesh, param and batch shardings.

The mesh has a `data` axis (batch split, parameters replicated) and an optional `fsdp` axis
(batch split too, and large parameters split by the regex rules). In a multi-process run each
process feeds the rows of the global batch that live on its devices (`process_batch_rows`).
"""

import logging
import os
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

BATCH_AXES = ("data", "fsdp")

# Ordered (regex over "a.b.c" param paths, spec); the first match wins. Matrices are split on
# their input axis over `fsdp`. Embedding tables [V, D] are split on the hidden axis D: vocabulary
# sizes such as Qwen3's 151,669 divide by no mesh size, hidden sizes do. Norms and biases stay
# replicated.
PARAM_RULES: tuple[tuple[str, P], ...] = (
    (r".*\.embedding$", P(None, "fsdp")),
    (r".*\.kernel$", P("fsdp", None)),
    (r".*", P()),
)


def initialize_distributed(multihost: bool) -> bool:
    """Joins the JAX cluster when asked to or when a launcher set `JAX_COORDINATOR_ADDRESS`.

    `launch/local_multiprocess.sh` sets JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
    JAX_PROCESS_ID; under SLURM or on a Cloud TPU slice `jax.distributed.initialize` finds them
    itself. Returns whether this process is part of a cluster.
    """
    env = os.environ
    if not multihost and not env.get("JAX_COORDINATOR_ADDRESS"):
        return False
    count, index = env.get("JAX_NUM_PROCESSES"), env.get("JAX_PROCESS_ID")
    jax.distributed.initialize(
        num_processes=int(count) if count else None, process_id=int(index) if index else None
    )
    return True


def make_mesh(*, fsdp: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Mesh of all (or the given) devices as (data, fsdp) with data = count // fsdp."""
    devices = list(devices if devices is not None else jax.devices())
    if fsdp < 1 or len(devices) % fsdp:
        raise ValueError(f"fsdp={fsdp} must divide the device count {len(devices)}")
    grid = np.asarray(devices).reshape(len(devices) // fsdp, fsdp)
    return Mesh(grid, BATCH_AXES)


def _path_str(path) -> str:
    parts = (getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path)
    return ".".join(str(p) for p in parts)


def param_shardings(mesh: Mesh, params: Any, rules=PARAM_RULES) -> Any:
    """A `NamedSharding` per leaf of `params` (arrays or ShapeDtypeStructs) from the rules.

    A rule's split is dropped when the dimension does not divide evenly over the mesh axis; each
    such fallback to replication is logged as a warning naming the parameter.
    """

    def choose(path, leaf):
        name = _path_str(path)
        for pattern, spec in rules:
            if re.fullmatch(pattern, name):
                return NamedSharding(mesh, _fit(spec, leaf.shape, mesh, name=name))
        raise ValueError(f"no sharding rule matches parameter {name!r}")

    return jax.tree_util.tree_map_with_path(choose, params)


def _fit(spec: P, shape: tuple[int, ...], mesh: Mesh, *, name: str) -> P:
    fitted = []
    for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=False):
        size = mesh.shape[axis] if axis is not None else 1
        fits = axis is not None and size > 1 and dim % size == 0
        if axis is not None and size > 1 and not fits:
            logging.warning(
                "sharding: %s %s: dimension %d does not divide over %s=%d; replicated instead",
                name, tuple(shape), dim, axis, size,
            )  # fmt: skip
        fitted.append(axis if fits else None)
    return P(*fitted[: len(shape)])


def put_sharded(host_tree: Any, shardings: Any) -> Any:
    """Host arrays -> global `jax.Array`s, each device receiving only its own shard.

    Built with `jax.make_array_from_callback`, so no device ever holds a whole unsharded copy of a
    split parameter. Every process passes the same full host values.
    """

    def put(value, sharding):
        value = np.asarray(value)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    return jax.tree.map(put, host_tree, shardings)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over every mesh axis."""
    return NamedSharding(mesh, P(BATCH_AXES))


def check_batch_size(global_batch: int, mesh: Mesh) -> None:
    if global_batch % mesh.size:
        raise ValueError(f"global batch {global_batch} is not divisible by {mesh.size} devices")


def process_batch_rows(mesh: Mesh, global_batch: int) -> np.ndarray:
    """Which rows of a global batch each process holds, as `to_global` places them.

    `jax.make_array_from_process_local_data` puts a process's local row r at the r-th smallest
    global row among those of its devices; with a mesh whose device order does not follow the
    process order (TPU slices, permuted meshes) these rows are not one contiguous block.

    Returns:
      [process_count, b] int64, b = B / process_count: row p lists the global rows of process p,
      ascending.
    """
    check_batch_size(global_batch, mesh)
    indices = batch_sharding(mesh).devices_indices_map((global_batch,))
    rows: dict[int, set[int]] = {}
    for device, (index,) in indices.items():
        rows.setdefault(device.process_index, set()).update(range(*index.indices(global_batch)))
    if sorted(rows) != list(range(len(rows))) or len({len(r) for r in rows.values()}) != 1:
        raise ValueError(f"uneven batch rows per process: { {p: len(r) for p, r in rows.items()} }")
    return np.array([sorted(rows[p]) for p in range(len(rows))], dtype=np.int64)


def to_global(host_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """This process's rows of every array -> global `jax.Array`s split over the batch axes."""
    sharding = batch_sharding(mesh)
    # The copy is explicit, but with several processes jax builds it through
    # make_array_from_callback, which the loop's transfer guard would count as implicit.
    with jax.transfer_guard_host_to_device("allow"):
        return {
            k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
            for k, v in host_batch.items()
        }
