"""Optimizer: AdamW with a weight-decay mask, optional clipping and gradient accumulation.

The learning-rate schedules reproduce the two references: the HF/Caliber linear warmup + decay
and LEAF's cyclic linear decay. jax and optax only.
"""

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("linear", "cyclic_linear", "constant")
# End of each decay as a fraction of lr when `end_lr_frac` is None: HF's
# get_linear_schedule_with_warmup decays to 0; LEAF (Sec. 3.2) decays 1e-4 -> 1e-5 per cycle.
_DEFAULT_END_LR_FRAC = {"linear": 0.0, "cyclic_linear": 0.1, "constant": 1.0}


def make_schedule(
    *,
    lr: float,
    total_steps: int,
    warmup_frac: float,
    schedule: str = "linear",
    cycles: int = 1,
    end_lr_frac: float | None = None,
    epochs_per_cycle: int | None = None,
) -> optax.Schedule:
    """Builds the learning rate as a function of the optimizer update count (0-based).

    All schedules start with `warmup = int(warmup_frac * total_steps)` steps of linear warmup
    from 0 to `lr` (the `int()` of the authors' `caliber/train.py`), so the first update runs at
    lr 0 when warmup > 0, exactly as torch's `LambdaLR` does. After the warmup:

    - "linear": HF `get_linear_schedule_with_warmup`: linear decay from `lr` at step `warmup` to
      `end_lr_frac * lr` at `total_steps` (default 0), constant after that. The authors' released
      code floors the decay at 0.1 * lr instead (`max(0.1, 1 - 0.9 * progress)`): pass
      `end_lr_frac=0.1` for that.
    - "cyclic_linear": LEAF (Vujanic and Rueckstiess 2025, Sec. 3.2 "Training details" and App.
      A.2): the remaining steps form `cycles` equal cycles; in each, lr decays linearly from
      `lr` to `end_lr_frac * lr` (default 0.1: LEAF's 1e-4 -> 1e-5) and is then reset to `lr`.
      LEAF lowers the rate once per epoch ("we decrease the learning rate at the end of each
      epoch, from lr=1e-4 to lr=1e-5 at the 10th epoch"), with 3 cycles of 10 epochs: pass
      `epochs_per_cycle=10` for that staircase (epoch k of E runs at
      lr * (1 - (1 - end_lr_frac) * k / (E - 1))). With `epochs_per_cycle=None` it decays every
      step instead, reaching `end_lr_frac * lr` at the cycle boundary.
    - "constant": `lr` after the warmup (HF `get_constant_schedule_with_warmup`).

    Args:
      lr: peak learning rate.
      total_steps: number of optimizer updates (micro-batches / accum_steps).
      warmup_frac: fraction of `total_steps` spent warming up, in [0, 1).
      schedule: one of SCHEDULES.
      cycles: number of decay cycles of "cyclic_linear" (must be 1 otherwise).
      end_lr_frac: final learning rate of each decay as a fraction of `lr`; None takes the
        reference value of the schedule (0 for "linear", 0.1 for "cyclic_linear").
      epochs_per_cycle: "cyclic_linear" only: decay in this many equal constant stages per cycle.

    Returns:
      A function of the integer step returning a float32 learning rate.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}; expected one of {SCHEDULES}")
    if total_steps < 1:
        raise ValueError(f"total_steps={total_steps} must be >= 1")
    if not 0.0 <= warmup_frac < 1.0:
        raise ValueError(f"warmup_frac={warmup_frac} must be in [0, 1)")
    if cycles < 1 or (cycles != 1 and schedule != "cyclic_linear"):
        raise ValueError(f"cycles={cycles} must be >= 1, and 1 unless schedule='cyclic_linear'")
    if epochs_per_cycle is not None and (schedule != "cyclic_linear" or epochs_per_cycle < 1):
        raise ValueError(f"epochs_per_cycle={epochs_per_cycle} needs schedule='cyclic_linear'")
    if end_lr_frac is None:
        end_lr_frac = _DEFAULT_END_LR_FRAC[schedule]
    warmup = int(warmup_frac * total_steps)
    decay_steps = total_steps - warmup
    cycle_len = decay_steps / cycles

    def decay_factor(step: jax.Array) -> jax.Array:
        """Multiplier in [end_lr_frac, 1] for steps >= warmup."""
        if schedule == "constant":
            return jnp.ones_like(step)
        position = step - warmup
        if schedule == "linear":
            progress = jnp.clip(position / max(1, decay_steps), 0.0, 1.0)
            return 1.0 - (1.0 - end_lr_frac) * progress
        cycle = jnp.clip(jnp.floor(position / cycle_len), 0, cycles - 1)
        progress = jnp.clip((position - cycle * cycle_len) / cycle_len, 0.0, 1.0)
        if epochs_per_cycle is not None:
            stage = jnp.minimum(jnp.floor(progress * epochs_per_cycle), epochs_per_cycle - 1)
            progress = stage / max(1, epochs_per_cycle - 1)
        return 1.0 - (1.0 - end_lr_frac) * progress

    def schedule_fn(count: jax.Array) -> jax.Array:
        step = jnp.asarray(count, jnp.float32)
        warming = step / max(1, warmup)
        return lr * jnp.where(step < warmup, warming, decay_factor(step))

    return schedule_fn


def decay_mask(params):
    """True for the params AdamW decays: matrices and up (>= 2-D).

    Biases and norm scales (1-D) are left undecayed, the HF Trainer / PyTorch fine-tuning
    practice (`no_decay = ["bias", "LayerNorm.weight"]`) expressed by rank instead of by name.
    Note: the authors' released code decays every parameter (plain `torch.optim.AdamW`).
    """
    return jax.tree.map(lambda param: jnp.ndim(param) >= 2, params)


def make_optimizer(**kwargs) -> optax.GradientTransformation:
    """The optimizer of `make_optimizer_and_schedule` (same arguments), without its schedule."""
    return make_optimizer_and_schedule(**kwargs)[0]


def make_optimizer_and_schedule(
    *,
    lr: float,
    weight_decay: float,
    warmup_frac: float,
    total_steps: int,
    schedule: str,
    cycles: int,
    b1: float,
    b2: float,
    eps: float,
    clip_norm: float | None,
    accum_steps: int,
    end_lr_frac: float | None = None,
    epochs_per_cycle: int | None = None,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW (decoupled decay, masked by `decay_mask`) on the schedule of `make_schedule`, and
    that schedule (one object: what a trainer logs as `train/lr` is what the optimizer applies).

    The chain is clip_by_global_norm(clip_norm) (skipped when clip_norm is None or 0) then
    AdamW, matching `torch.nn.utils.clip_grad_norm_` + `torch.optim.AdamW`. With
    `accum_steps > 1` it is wrapped in `optax.MultiSteps`: gradients of `accum_steps`
    consecutive calls are averaged, the inner chain (clipping included) runs once on the mean,
    and the other calls return zero updates. The schedule counts inner updates, so
    `total_steps` is the number of optimizer updates, not of micro-batches.
    """
    if accum_steps < 1:
        raise ValueError(f"accum_steps={accum_steps} must be >= 1")
    if clip_norm is not None and clip_norm < 0:
        raise ValueError(f"clip_norm={clip_norm} must be None, 0 (off) or positive")
    learning_rate = make_schedule(
        lr=lr,
        total_steps=total_steps,
        warmup_frac=warmup_frac,
        schedule=schedule,
        cycles=cycles,
        end_lr_frac=end_lr_frac,
        epochs_per_cycle=epochs_per_cycle,
    )
    adamw = optax.adamw(
        learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask
    )
    optimizer = optax.chain(optax.clip_by_global_norm(clip_norm), adamw) if clip_norm else adamw
    if accum_steps > 1:
        optimizer = optax.MultiSteps(optimizer, every_k_schedule=accum_steps)
        optimizer = optimizer.gradient_transformation()
    return optimizer, learning_rate
