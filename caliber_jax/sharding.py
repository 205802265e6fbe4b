"""The one place that knows about sharding: the device mesh, parameter and batch shardings.

The mesh has a `data` axis (batch split, parameters replicated) and an optional `fsdp` axis
(batch split too, and large parameters split along their first dimension by the regex rules).
"""

import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

BATCH_AXES = ("data", "fsdp")

# Ordered (regex over "a.b.c" param paths, spec); the first match wins. Matrices and embedding
# tables are split on their first axis over `fsdp`; norms and biases stay replicated.
PARAM_RULES: tuple[tuple[str, P], ...] = (
    (r".*\.(kernel|embedding)$", P("fsdp", None)),
    (r".*", P()),
)


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

    A rule's split is dropped when the dimension does not divide evenly over the mesh axis.
    """

    def choose(path, leaf):
        name = _path_str(path)
        for pattern, spec in rules:
            if re.fullmatch(pattern, name):
                return NamedSharding(mesh, _fit(spec, leaf.shape, mesh))
        raise ValueError(f"no sharding rule matches parameter {name!r}")

    return jax.tree_util.tree_map_with_path(choose, params)


def _fit(spec: P, shape: tuple[int, ...], mesh: Mesh) -> P:
    fitted = []
    for dim, axis in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=False):
        size = mesh.shape[axis] if axis is not None else 1
        fitted.append(axis if axis is not None and size > 1 and dim % size == 0 else None)
    return P(*fitted[: len(shape)])


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over every mesh axis."""
    return NamedSharding(mesh, P(BATCH_AXES))


def check_batch_size(global_batch: int, mesh: Mesh) -> None:
    if global_batch % mesh.size:
        raise ValueError(f"global batch {global_batch} is not divisible by {mesh.size} devices")


def to_global(host_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """This process's rows of every array -> global `jax.Array`s split over the batch axes."""
    sharding = batch_sharding(mesh)
    return {
        k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
        for k, v in host_batch.items()
    }
