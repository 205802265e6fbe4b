"""Triplet retraining of the student (paper 001 step 5) on the project's train machinery.

The loop mirrors `caliber_jax.train`: params from an HF directory, `step.triplet_train_step`
jitted over the data-parallel mesh of `sharding`, AdamW from `optim`, a Grain iterator of
tokenized triplet batches, Orbax checkpoints of `{state, data_iter}` (a killed run resumes where it
stopped), and a resolved `config.json` in the workdir, so `export.export` writes the result out.
"""

import functools
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grain
import jax
import numpy as np
import optax
from flax import nnx

from caliber_jax import checkpoint, metrics_log, optim, sharding, step, tokenization
from caliber_jax.embedder import resolve_dtype
from caliber_jax.models import embedding, hf

Triplet = tuple[str, str, str]


class TripletBatches:
    """Maps a batch index to a tokenized triplet batch of fixed shapes (picklable for Grain):
    `query_*` `[B, query_max_length]`, `pos_*` and `neg_*` `[B, max_length]` int32.

    Batch b of epoch e takes rows `order_e[b*B:(b+1)*B]`, with `order_e` a permutation seeded by
    (seed, e); the last partial batch of an epoch is padded with copies of row 0 at weight 0.
    """

    def __init__(
        self,
        triplets: Sequence[Triplet],
        *,
        tokenizer_dir: str,
        batch_size: int,
        max_length: int,
        query_max_length: int,
        seed: int,
        pad_id: int,
        query_instruction: str | None,
    ):
        if not triplets:
            raise ValueError("no triplets to train on")
        self.triplets = list(triplets)
        self.tokenizer_dir = tokenizer_dir
        self.batch_size = batch_size
        self.max_length = max_length
        self.query_max_length = query_max_length
        self.seed = seed
        self.pad_id = pad_id
        self.query_instruction = query_instruction
        self.per_epoch = -(-len(self.triplets) // batch_size)
        self._tokenizer = None

    def __getstate__(self):
        return {**self.__dict__, "_tokenizer": None}

    def _tokenize(self, texts: list[str], max_length: int) -> tuple[np.ndarray, np.ndarray]:
        if self._tokenizer is None:
            self._tokenizer = tokenization.load_tokenizer(self.tokenizer_dir)
        ids = tokenization.tokenize(self._tokenizer, texts, max_length=max_length)
        # Fixed [B, max_length] shapes: the step compiles once (a shape per batch would
        # recompile it again and again).
        length = max_length
        out = np.full((len(ids), length), self.pad_id, np.int32)
        mask = np.zeros((len(ids), length), np.int32)
        for row, seq in enumerate(ids):
            out[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        return out, mask

    def rows(self, index: int) -> np.ndarray:
        """Row indices of batch `index` (-1 for padding)."""
        epoch, position = divmod(int(index), self.per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.triplets))
        rows = np.full(self.batch_size, -1, np.int64)
        chosen = order[position * self.batch_size : (position + 1) * self.batch_size]
        rows[: len(chosen)] = chosen
        return rows

    def __call__(self, index: int) -> dict[str, np.ndarray]:
        rows = self.rows(index)
        real = rows >= 0
        picked = [self.triplets[r] for r in np.where(real, rows, rows[0])]
        queries = [tokenization.format_query(t[0], self.query_instruction) for t in picked]
        batch = {"weight": real.astype(np.float32), "index": rows}
        for name, texts, limit in (
            ("query", queries, self.query_max_length),
            ("pos", [t[1] for t in picked], self.max_length),
            ("neg", [t[2] for t in picked], self.max_length),
        ):
            batch[f"{name}_input_ids"], batch[f"{name}_attention_mask"] = self._tokenize(
                texts, limit
            )
        return batch


def make_loader(batches: TripletBatches, num_batches: int) -> grain.IterDataset:
    """A checkpointable Grain iterator over batches 0..num_batches-1 (no worker processes)."""
    return grain.MapDataset.range(num_batches).map(batches).to_iter_dataset()


def write_resolved_config(
    workdir: Path,
    *,
    init_dir: str,
    pooling: str | None,
    num_layers: int | None,
    max_length: int,
    settings: dict,
) -> None:
    """The `config.json` that `export.export` reads (model + data.max_length) plus the settings."""
    hf.save_json(
        {
            "model": {
                "init_dir": init_dir,
                "pooling": pooling,
                "num_layers": num_layers,
                "out_dim": None,
                "tokenizer_dir": None,
            },
            "data": {"max_length": max_length},
            "triplet": settings,
        },
        workdir / "config.json",
    )


def make_optimizer(
    optim_config: dict[str, Any], *, micro_steps: int
) -> tuple[int, optax.GradientTransformation, Callable[[jax.Array], jax.Array]]:
    """The optimizer and the logged-lr schedule for `micro_steps` micro-batches.

    With `accum_steps = A > 1`, `optax.MultiSteps` applies one update per A micro-batches and
    the inner schedule counts those updates, so it is built over `micro_steps // A` updates
    (warm-up and decay measured in updates, the decay ending at the last one); the schedule
    returned for logging maps micro-batch s to the lr of its update, s // A, as `train.py`
    does.

    Returns:
      (micro-batches to run: a whole number of updates, at least one; optimizer; schedule).
    """
    accum = optim_config["accum_steps"]
    updates = max(1, micro_steps // accum)
    # One schedule object: the logged lr is the one the optimizer applies.
    optimizer, update_schedule = optim.make_optimizer_and_schedule(
        total_steps=updates, **optim_config
    )

    def schedule(micro_step: jax.Array) -> jax.Array:
        return update_schedule(micro_step // accum)

    return updates * accum, optimizer, schedule


def train_triplets(
    triplets: Sequence[Triplet],
    val_triplets: Sequence[Triplet],
    *,
    workdir: str | Path,
    init_dir: str,
    num_layers: int | None,
    pooling: str | None,
    dtype: str,
    batch_size: int,
    max_length: int,
    query_max_length: int,
    query_instruction: str | None,
    num_epochs: float,
    max_steps: int,
    margin: float,
    distance: str,
    optim_config: dict[str, Any],
    seed: int,
    checkpoint_every: int,
    log_every: int,
    log_fn: Callable[[str], None] = print,
) -> dict[str, float]:
    """Trains (or resumes) the student on triplets; returns summary metrics.

    Args:
      triplets: (query, c_rel, c_irrel) texts to train on.
      val_triplets: held-out triplets; their loss and accuracy are measured before and after.
      workdir: checkpoints, `metrics.jsonl`, the resolved `config.json`.
      init_dir: HF directory of bi-enc(i); `num_layers` keeps only its first N layers.
      pooling: pooling override (None: the directory's).
      dtype: compute dtype ("float32" / "bfloat16").
      batch_size: triplets per step (global; divisible by the device count).
      max_length, query_max_length: token limits of chunks and queries.
      query_instruction: optional instruction prepended to queries (Qwen3 style).
      num_epochs: passes over `triplets` (fractions allowed).
      max_steps: cap on the micro-batch steps (0: none); with `optim_config["accum_steps"]`
        = A, steps are rounded down to a multiple of A (at least A).
      margin, distance: alpha and d of `losses.triplet_loss`.
      optim_config: `optim.make_optimizer` kwargs except `total_steps`.
      seed: data order and state rng.
      checkpoint_every, log_every: cadence in steps.
      log_fn: where progress lines go.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    settings = {
        "margin": margin,
        "distance": distance,
        "batch_size": batch_size,
        "num_epochs": num_epochs,
        "seed": seed,
        "num_triplets": len(triplets),
        "query_instruction": query_instruction,
        "optim": optim_config,
    }
    write_resolved_config(
        workdir,
        init_dir=init_dir,
        pooling=pooling,
        num_layers=num_layers,
        max_length=max_length,
        settings=settings,
    )
    spec = embedding.read_spec(init_dir, pooling=pooling, num_layers=num_layers, out_dim=None)
    flat = embedding.load_flat_params(init_dir, spec, seed=seed)
    tokenizer = tokenization.load_tokenizer(init_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    make_batches = functools.partial(
        TripletBatches,
        tokenizer_dir=init_dir,
        batch_size=batch_size,
        max_length=max_length,
        query_max_length=query_max_length,
        seed=seed,
        pad_id=pad_id,
        query_instruction=query_instruction,
    )
    batches = make_batches(triplets)
    steps = max(1, int(np.ceil(num_epochs * batches.per_epoch)))
    if max_steps:
        steps = min(steps, max_steps)
    # Micro-batches; with gradient accumulation rounded down to whole updates.
    steps, optimizer, schedule = make_optimizer(optim_config, micro_steps=steps)

    mesh = sharding.make_mesh()
    sharding.check_batch_size(batch_size, mesh)
    graphdef, params_state = embedding.split_model(spec, flat, dtype=resolve_dtype(dtype))
    params = nnx.to_pure_dict(params_state)
    abstract_state = jax.eval_shape(lambda p: step.init_state(p, optimizer, seed=seed), params)
    state_shardings = sharding.param_shardings(mesh, abstract_state)
    loss_args = {"margin": margin, "distance": distance}
    train_fn = jax.jit(
        lambda s, b: step.triplet_train_step(
            s, b, graphdef=graphdef, optimizer=optimizer, schedule=schedule, **loss_args
        ),
        in_shardings=(state_shardings, sharding.batch_sharding(mesh)),
        out_shardings=(state_shardings, sharding.replicated(mesh)),
        donate_argnums=0,
    )
    eval_fn = jax.jit(
        lambda p, b: step.triplet_eval_step(p, b, graphdef=graphdef, **loss_args),
        in_shardings=(state_shardings.params, sharding.batch_sharding(mesh)),
        out_shardings=sharding.replicated(mesh),
    )
    data_iter = iter(make_loader(batches, steps))
    manager = checkpoint.make_manager(
        workdir / "checkpoints", max_to_keep=2, save_interval_steps=checkpoint_every
    )
    # Resume order: this workdir's latest checkpoint, else bi-enc(i) from init_dir.
    if manager.latest_step() is not None:
        abstract = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
            abstract_state,
            state_shardings,
        )
        state, start = checkpoint.restore(manager, abstract, data_iter)
        log_fn(f"train: resumed at step {start} of {steps}")
    else:
        init_fn = jax.jit(
            lambda p: step.init_state(p, optimizer, seed=seed), out_shardings=state_shardings
        )
        state, start = init_fn(params), 0
    del params, flat, params_state

    def validate(params) -> dict[str, float]:
        if not val_triplets:
            return {}
        val = make_batches(val_triplets)
        totals: dict[str, float] = {}
        for index in range(val.per_epoch):
            sums = jax.device_get(eval_fn(params, sharding.to_global(val(index), mesh)))
            for key, value in sums.items():
                totals[key] = totals.get(key, 0.0) + float(value)
        rows = max(totals.pop("rows"), 1.0)
        return {f"val/{key}": value / rows for key, value in totals.items()}

    summary: dict[str, float] = {"steps": steps}
    if start == 0:
        summary.update({f"{k}_before": v for k, v in validate(state.params).items()})
        hf.save_json(summary, workdir / "val_before.json")
    elif (workdir / "val_before.json").exists():
        summary.update(json.loads((workdir / "val_before.json").read_text()))
    started = time.perf_counter()
    metrics_log.trim_after(workdir / "metrics.jsonl", last_step=start)
    with open(workdir / "metrics.jsonl", "a", encoding="utf-8") as log:
        for step_num in range(start + 1, steps + 1):
            batch = next(data_iter)
            state, metrics = train_fn(state, sharding.to_global(batch, mesh))
            if step_num % log_every == 0 or step_num == steps:
                fetched = {k: float(v) for k, v in jax.device_get(metrics).items()}
                if not all(np.isfinite(list(fetched.values()))):
                    raise FloatingPointError(f"step {step_num}: non-finite metrics {fetched}")
                log.write(json.dumps({"step": step_num, **fetched}) + "\n")
                log.flush()
                log_fn(
                    f"train: step {step_num}/{steps} loss {fetched['train/loss']:.4f} "
                    f"({time.perf_counter() - started:.0f} s)"
                )
                summary.update(fetched)
            if step_num % checkpoint_every == 0 or step_num == steps:
                checkpoint.save(manager, step_num, state, data_iter, force=True)
    if start >= steps and manager.latest_step() is not None:
        log_fn(f"train: already finished ({steps} steps)")
    summary.update({f"{k}_after": v for k, v in validate(state.params).items()})
    manager.close()
    hf.save_json(summary, workdir / "summary.json")
    return summary
