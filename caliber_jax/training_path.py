"""The path a run's train step takes: packed batches, one program per row count, compile-ahead.

`choose` turns the config's switches and the platform into one `TrainingPath` record, which
`train` logs at start; `make_train_step` builds the step that record names. The table of which
path each platform and config takes, and why, is docs/training_path.md.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import optax
from flax import nnx
from jax.sharding import Mesh

from caliber_jax import compile_ahead, sharding, step


@dataclasses.dataclass(frozen=True)
class TrainingPath:
    """Which train step a run builds (`make_train_step`), with the reason for each choice.

    Every run trains on the packed layout (every x and pi(x) end to end in rows of
    `pack_length`, the row count one of a short fixed ladder: `pipeline.make_batch_fn`) with one
    program per row count: gradients and optimizer update together.

    Attributes:
      scan_layers: the encoder's layers as one `lax.scan`.
      compile_ahead: each row count's program compiled on background threads ahead of its step.
      in_order: each step finishes before the next is issued (CPU runs of several devices).
      reasons: (field, why) for each choice.
    """

    scan_layers: bool
    compile_ahead: bool
    in_order: bool
    reasons: tuple[tuple[str, str], ...]

    def describe(self) -> str:
        """One line for the run's log."""
        why = "; ".join(f"{field}: {reason}" for field, reason in self.reasons)
        return (
            f"training path: layout=packed, step=one_program, scan_layers={self.scan_layers}, "
            f"compile_ahead={self.compile_ahead}, in_order={self.in_order} [{why}]"
        )


def choose(
    *,
    platform: str,
    process_count: int,
    local_devices: int,
    pack_length: int,
    pack_rungs: int,
    compile_ahead: bool,
    scan_layers: bool,
) -> TrainingPath:
    """The training path of a run's settings (config fields of the same names) on `platform`
    ("cpu", "gpu", "tpu") with `process_count` processes of `local_devices` devices each.

    Raises:
      ValueError: pack_length = 0 (the padded layouts are no longer a training path).
    """
    if not pack_length:
        raise ValueError(
            "config.data.pack_length=0: training runs on packed rows only (docs/training_path.md);"
            " set data.pack_length >= data.max_length"
        )
    reasons = [("layout", f"pack_length={pack_length}, pack_rungs={pack_rungs}")]
    reasons.append(("compile_ahead", f"compile_ahead={compile_ahead}"))
    reasons.append(("scan_layers", f"scan_layers={scan_layers}"))
    # On the CPU runtime, many issued programs with all-reduces over several devices in flight
    # deadlocked (2 processes x 2 devices, and 1 process x 4 devices);
    # accelerators order them on their streams.
    devices = process_count * local_devices
    in_order = platform == "cpu" and devices > 1
    if in_order:
        reasons.append(
            ("in_order", f"CPU collectives over {devices} devices, {process_count} process(es)")
        )
    return TrainingPath(
        scan_layers=scan_layers,
        compile_ahead=compile_ahead,
        in_order=in_order,
        reasons=tuple(reasons),
    )


class TrainStep:
    """`step(state, host_batch) -> (state, metrics)`: the step of a `TrainingPath`.

    Built by `make_train_step`. `start_compile_ahead` starts the background compiles where the
    path has them; `close` stops them.
    """

    def __init__(self, path: TrainingPath, jitted: Any, weights: Any, mesh: Mesh):
        self.path = path
        self.jitted = jitted
        self.weights = weights  # lam and margin, placed replicated
        self._mesh = mesh
        self._run = jitted
        self.programs: compile_ahead.StepPrograms | None = None

    def __call__(self, state, host_batch):
        out = self._run(state, sharding.to_global(host_batch, self._mesh), self.weights)
        return jax.block_until_ready(out) if self.path.in_order else out

    def start_compile_ahead(
        self,
        walk: Any,
        make_batch: Callable[[Any], dict[str, Any]],
        abstract_state: Any,
        *,
        parallel: int,
    ) -> None:
        """Builds each coming row count's program ahead of its step (if the path says so).

        Args:
          walk: (kind, item) per coming step (`compile_ahead.StepPrograms.start`).
          make_batch: item -> that step's host batch.
          abstract_state: the state's `jax.ShapeDtypeStruct`s with their shardings.
          parallel: programs built at once after the first step's (`StepPrograms.start`).
        """
        if not self.path.compile_ahead:
            return
        self.programs = compile_ahead.StepPrograms(self.jitted)
        self.programs.start(
            walk,
            lambda item: (
                abstract_state,
                sharding.to_global(make_batch(item), self._mesh),
                self.weights,
            ),
            parallel=parallel,
        )
        self._run = self.programs

    @property
    def compiled_ahead(self) -> int:
        return self.programs.compiled_ahead if self.programs is not None else 0

    @property
    def build_seconds(self) -> list[float]:
        """Seconds each step program took to build, in the order they finished (compile-ahead's
        record; empty without it)."""
        return list(self.programs.build_seconds) if self.programs is not None else []

    def close(self, *, wait: bool = True) -> None:
        """Stops the compiles ahead (`compile_ahead.StepPrograms.close`)."""
        if self.programs is not None:
            self.programs.close(wait=wait)


def make_train_step(
    path: TrainingPath,
    *,
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    schedule: Callable[[jax.Array], jax.Array],
    loss_args: dict[str, Any],
    weights: dict[str, Any],
    mesh: Mesh,
    state_shardings: Any,
) -> TrainStep:
    """The jitted step of `path`, as one `TrainStep`.

    Args:
      loss_args: `step.vectors_loss`'s static arguments (reduction, objective, ...).
      weights: lam and margin (host scalars, placed replicated here), traced, so every point of
        a lambda x margin sweep shares one program per batch shape.
      state_shardings: the `TrainState`'s shardings.
    """
    replicated = sharding.replicated(mesh)
    jitted = jax.jit(
        lambda s, b, w: step.train_step(
            s, b, graphdef=graphdef, optimizer=optimizer, schedule=schedule, **loss_args, **w
        ),
        in_shardings=(state_shardings, sharding.batch_sharding(mesh), replicated),
        out_shardings=(state_shardings, replicated),
        donate_argnums=0,
    )
    return TrainStep(path, jitted, jax.device_put(weights, replicated), mesh)
