"""The chunked gradient step: a batch's packed rows through the encoder in groups of fixed size.

One program per batch shape means one XLA compile (seconds on a CPU) for every packed row count
an epoch meets. Here the encoder runs a fixed number of packed rows at a time
(`step.embed_chunk`, which keeps each group's backward pass), the loss runs on the summed pooled
states (`step.head_gradients`), and the groups' backward passes add up the gradients
(`step.add_chunk_gradients`): the gradients of `step.grad_step` from programs whose shapes never
change, whatever the row count.
"""

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from caliber_jax import sharding, step


@dataclasses.dataclass(frozen=True)
class ChunkedGradFn:
    """`(params, host_batch, weights) -> (grads, metrics)`, like `step.grad_step` jitted, but
    taking this process's host batch (numpy) and placing each group of `rows` rows itself."""

    forward: Any
    head: Any
    backward: Any
    finish: Any
    zeros: Any
    rows: int
    mesh: Mesh
    # Wait for each program before issuing the next (`in_order`): see `__call__`.
    in_order: bool = False

    def __call__(self, params, host_batch, weights):
        """One batch's gradients and metrics.

        Every group's forward and backward program sums over all devices (all-reduces, across
        processes when the mesh spans them), and JAX issues them without waiting: a step puts
        2G + 3 such programs in flight, and the CPU runtime holds up to 32 per device. That
        deadlocked within a few steps (issue #34), with 2 processes x 2 devices and with 1
        process x 4 devices alike: some devices waiting in a gloo all-reduce, the others' next
        launch waiting for a free slot of those 32, none of their queued programs running.
        `in_order` waits for each program to finish before issuing the next, so one program
        with collectives is in flight at a time, the same one on every process.
        """
        count = host_batch["packed_ids"].shape[0]
        if count % self.rows:
            raise ValueError(f"{count} packed rows do not split into groups of {self.rows}")
        settle = jax.block_until_ready if self.in_order else _identity
        rest = {k: v for k, v in host_batch.items() if k not in step.PACKED_KEYS}
        rest = sharding.to_global(rest, self.mesh)
        pooled = self.zeros()
        backward_fns = []
        for start in range(0, count, self.rows):
            chunk = {k: host_batch[k][start : start + self.rows] for k in step.PACKED_KEYS}
            pooled, vjp_fn = settle(
                self.forward(params, sharding.to_global(chunk, self.mesh), pooled)
            )
            backward_fns.append(vjp_fn)
        grads, cotangent, metrics = settle(self.head(params, pooled, rest, weights))
        while backward_fns:  # each group's saved activations go as soon as they are used
            grads = settle(self.backward(backward_fns.pop(), cotangent, grads))
        return settle(self.finish(grads, metrics))


def _identity(value):
    return value


def make_chunked_grad(
    graphdef: nnx.GraphDef,
    loss_args: dict[str, Any],
    *,
    mesh: Mesh,
    params_shardings: Any,
    rows: int,
    pooled_shape: tuple[int, int],
    in_order: bool = False,
) -> ChunkedGradFn:
    """The five jitted programs of the chunked gradient step, each compiled once per run.

    Args:
      graphdef: the `EmbeddingModel`'s graph.
      loss_args: `step.vectors_loss`'s static arguments (reduction, objective, ...); lam and
        margin come with each call's `weights`.
      params_shardings: the params' shardings (gradients come out the same).
      rows: packed rows per group, per process; a multiple of the local device count.
      pooled_shape: (S, D): 2B sequence slots by the encoder width.
      in_order: wait for each program before issuing the next (`ChunkedGradFn.__call__`):
        needed on the CPU runtime with several devices.
    """
    if rows < 1 or rows % jax.local_device_count():
        raise ValueError(
            f"grad_chunk_rows={rows}: must be a positive multiple of this process's "
            f"{jax.local_device_count()} devices"
        )
    replicated = sharding.replicated(mesh)
    batch_sharding = sharding.batch_sharding(mesh)
    return ChunkedGradFn(
        forward=jax.jit(
            functools.partial(step.embed_chunk, graphdef=graphdef),
            in_shardings=(params_shardings, batch_sharding, replicated),
        ),
        head=jax.jit(
            lambda p, pooled, b, w: step.head_gradients(
                p, pooled, b, graphdef=graphdef, **loss_args, **w
            ),
            in_shardings=(params_shardings, replicated, batch_sharding, replicated),
            out_shardings=(params_shardings, replicated, replicated),
        ),
        # The running gradients are donated: each group adds into the same buffers.
        backward=jax.jit(
            step.add_chunk_gradients, out_shardings=params_shardings, donate_argnums=2
        ),
        finish=jax.jit(step.with_grad_norm, out_shardings=(params_shardings, replicated)),
        zeros=jax.jit(lambda: jnp.zeros(pooled_shape, jnp.float32), out_shardings=replicated),
        rows=rows,
        mesh=mesh,
        in_order=in_order,
    )
