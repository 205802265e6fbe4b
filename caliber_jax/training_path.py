"""The path a run's train step takes: batch layout, step form, layer scan, compile-ahead, and why.

`choose` turns the config's switches and the platform into one `TrainingPath` record, which
`train` logs at start; `make_train_step` builds the step that record names. The table of which
path each platform and config takes, and why, is docs/training_path.md.
"""

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import optax
from flax import nnx
from jax.sharding import Mesh

from caliber_jax import compile_ahead, grad_chunks, sharding, step

LAYOUTS = ("stacked", "compact", "packed")
STEP_FORMS = ("one_program", "split_update", "chunked")


@dataclasses.dataclass(frozen=True)
class TrainingPath:
    """Which train step a run builds (`make_train_step`), with the reason for each choice.

    Attributes:
      layout: "stacked" (x and pi(x) padded rows, one pi(x) row per x), "compact" (pi(x) rows of
        the perturbed x only) or "packed" (every sequence end to end in rows of pack_length).
      step_form: "one_program" (gradients and update in one program per batch shape),
        "split_update" (a gradient program per batch shape, one update program) or "chunked"
        (the packed rows through fixed-size programs in groups of `chunk_rows`, then the update).
      chunk_rows: packed rows per group and process ("chunked"), else 0.
      scan_layers: the encoder's layers as one `lax.scan`.
      compile_ahead: each batch shape's program compiled on a background thread ahead of its step.
      in_order: each program with collectives finishes before the next is issued (CPU runs of
        several devices).
      reasons: (field, why) for each choice.
    """

    layout: str
    step_form: str
    chunk_rows: int
    scan_layers: bool
    compile_ahead: bool
    in_order: bool
    reasons: tuple[tuple[str, str], ...]

    def describe(self) -> str:
        """One line for the run's log."""
        why = "; ".join(f"{field}: {reason}" for field, reason in self.reasons)
        chunks = f" (groups of {self.chunk_rows} rows)" if self.step_form == "chunked" else ""
        return (
            f"training path: layout={self.layout}, step={self.step_form}{chunks}, "
            f"scan_layers={self.scan_layers}, compile_ahead={self.compile_ahead}, "
            f"in_order={self.in_order} [{why}]"
        )


def choose(
    *,
    platform: str,
    process_count: int,
    local_devices: int,
    pack_length: int,
    pert_rows_multiple: int,
    grad_chunk_rows: int,
    grad_chunk_rows_on_accelerator: bool,
    split_update: bool,
    compile_ahead: bool,
    scan_layers: bool,
) -> TrainingPath:
    """The training path of a run's settings (config fields of the same names) on `platform`
    ("cpu", "gpu", "tpu") with `process_count` processes of `local_devices` devices each.

    Raises:
      ValueError: grad_chunk_rows > 0 with the packed layout on an accelerator, unless
        grad_chunk_rows_on_accelerator says it is meant.
    """
    reasons = []
    if pack_length:
        layout = "packed"
        reasons.append(("layout", f"pack_length={pack_length}"))
    elif pert_rows_multiple:
        layout = "compact"
        reasons.append(("layout", f"pert_rows_multiple={pert_rows_multiple}, pack_length=0"))
    else:
        layout = "stacked"
        reasons.append(("layout", "pack_length=0, pert_rows_multiple=0"))

    chunk_rows = 0
    if grad_chunk_rows and layout != "packed":
        reasons.append(("grad_chunk_rows", f"{grad_chunk_rows} ignored: no packed rows to group"))
    elif grad_chunk_rows:
        if platform != "cpu" and not grad_chunk_rows_on_accelerator:
            raise ValueError(
                f"config.grad_chunk_rows={grad_chunk_rows} on {platform}: the chunked step keeps "
                "every group's activations until the loss, so it saves no memory; it only keeps "
                "the CPU's program count fixed. Set grad_chunk_rows=0 (or "
                "grad_chunk_rows_on_accelerator=True to run it anyway)"
            )
        chunk_rows = math.lcm(grad_chunk_rows, local_devices)
    if chunk_rows:
        step_form = "chunked"
        reasons.append(("step", f"grad_chunk_rows={grad_chunk_rows}, packed layout"))
    elif split_update:
        step_form = "split_update"
        reasons.append(("step", "split_update=True"))
    else:
        step_form = "one_program"
        reasons.append(("step", "split_update=False, no chunks"))

    ahead = compile_ahead and step_form != "chunked"
    if compile_ahead and not ahead:
        reasons.append(("compile_ahead", "off: the chunked step's programs never change shape"))
    else:
        reasons.append(("compile_ahead", f"compile_ahead={compile_ahead}"))
    reasons.append(("scan_layers", f"scan_layers={scan_layers}"))

    # On the CPU runtime, dozens of issued programs with all-reduces over several devices in
    # flight deadlocked (issue #34: 2 processes x 2 devices, and 1 process x 4 devices; see
    # grad_chunks.ChunkedGradFn); accelerators order them on their streams.
    devices = process_count * local_devices
    in_order = platform == "cpu" and devices > 1
    if in_order:
        reasons.append(
            ("in_order", f"CPU collectives over {devices} devices, {process_count} process(es)")
        )
    return TrainingPath(
        layout=layout,
        step_form=step_form,
        chunk_rows=chunk_rows,
        scan_layers=scan_layers,
        compile_ahead=ahead,
        in_order=in_order,
        reasons=tuple(reasons),
    )


@dataclasses.dataclass(frozen=True)
class SplitTrainFn:
    """A train step as two jitted programs: `grad(params, batch, weights) -> (grads, metrics)`,
    compiled once per batch shape, then `update(state, grads, metrics) -> (state, metrics)`,
    compiled once. Called like the one-program step: `(state, batch, weights)`."""

    grad: Any
    update: Any

    def __call__(self, state, batch, weights):
        return self.update(state, *self.grad(state.params, batch, weights))


class TrainStep:
    """`step(state, host_batch) -> (state, metrics)`: the step of a `TrainingPath`.

    Built by `make_train_step`. `start_compile_ahead` starts the background compiles where the
    path has them; `close` stops them.
    """

    def __init__(self, path: TrainingPath, jitted: Any, weights: Any, mesh: Mesh):
        self.path = path
        self.jitted = jitted  # a jitted step, a SplitTrainFn, or one with a ChunkedGradFn
        self._weights = weights
        self._mesh = mesh
        self._run = jitted
        self.programs: compile_ahead.StepPrograms | None = None

    def __call__(self, state, host_batch):
        # The chunked step places each group of rows itself.
        chunked = self.path.step_form == "chunked"
        batch = host_batch if chunked else sharding.to_global(host_batch, self._mesh)
        out = self._run(state, batch, self._weights)
        # The chunked step also waits for each of its programs (grad_chunks.ChunkedGradFn).
        return jax.block_until_ready(out) if self.path.in_order else out

    def start_compile_ahead(
        self,
        walk: Any,
        make_batch: Callable[[Any], dict[str, Any]],
        abstract_state: Any,
    ) -> None:
        """Builds each coming batch shape's program ahead of its step (if the path says so).

        Args:
          walk: (kind, item) per coming step (`compile_ahead.StepPrograms.start`).
          make_batch: item -> that step's host batch.
          abstract_state: the state's `jax.ShapeDtypeStruct`s with their shardings.
        """
        if not self.path.compile_ahead:
            return
        split = isinstance(self.jitted, SplitTrainFn)
        # Split: only the gradient half depends on the batch shape, so it is the one built ahead.
        self.programs = compile_ahead.StepPrograms(self.jitted.grad if split else self.jitted)
        self.programs.start(
            walk,
            lambda item: (
                abstract_state.params if split else abstract_state,
                sharding.to_global(make_batch(item), self._mesh),
                self._weights,
            ),
        )
        self._run = SplitTrainFn(self.programs, self.jitted.update) if split else self.programs

    @property
    def compiled_ahead(self) -> int:
        return self.programs.compiled_ahead if self.programs is not None else 0

    def close(self) -> None:
        if self.programs is not None:
            self.programs.close()


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
    pooled_shape: tuple[int, int],
) -> TrainStep:
    """The jitted programs of `path`'s step form, as one `TrainStep`.

    Args:
      loss_args: `step.vectors_loss`'s static arguments (reduction, objective, ...).
      weights: lam and margin, traced scalars (placed replicated here), so every point of a
        lambda x margin sweep shares one program per batch shape.
      state_shardings: the `TrainState`'s shardings.
      pooled_shape: (S, D) of the chunked step's pooled states: 2B slots by the encoder width.
    """
    replicated = sharding.replicated(mesh)
    batch_sharding = sharding.batch_sharding(mesh)
    params_shardings = state_shardings.params
    if path.step_form == "one_program":
        jitted = jax.jit(
            lambda s, b, w: step.train_step(
                s, b, graphdef=graphdef, optimizer=optimizer, schedule=schedule, **loss_args, **w
            ),
            in_shardings=(state_shardings, batch_sharding, replicated),
            out_shardings=(state_shardings, replicated),
            donate_argnums=0,
        )
    else:
        if path.step_form == "chunked":
            grad_fn = grad_chunks.make_chunked_grad(
                graphdef,
                loss_args,
                mesh=mesh,
                params_shardings=params_shardings,
                rows=path.chunk_rows,
                pooled_shape=pooled_shape,
                in_order=path.in_order,
            )
        else:
            grad_fn = jax.jit(
                lambda p, b, w: step.grad_step(p, b, graphdef=graphdef, **loss_args, **w),
                in_shardings=(params_shardings, batch_sharding, replicated),
                out_shardings=(params_shardings, replicated),
            )
        # Two programs: gradients (one per batch shape, or the chunked step's fixed ones) and the
        # optimizer update (one for the run), so a new batch shape compiles the gradients only.
        update = jax.jit(
            functools.partial(step.apply_update, optimizer=optimizer, schedule=schedule),
            in_shardings=(state_shardings, params_shardings, replicated),
            out_shardings=(state_shardings, replicated),
            # The state only: its outputs already take every buffer of the grads' shapes.
            donate_argnums=0,
        )
        jitted = SplitTrainFn(grad_fn, update)
    return TrainStep(path, jitted, jax.device_put(weights, replicated), mesh)
