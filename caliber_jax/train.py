"""Caliber / LEAF distillation: the training entry point.

    python -m caliber_jax.train --config configs/caliber.py --workdir DIR [--config.loss.lam=0 ...]

Reads prepared passages and teacher vectors (`caliber_jax.prepare`, `caliber_jax.embed_teacher`),
trains the student with the jit-compiled, data-parallel step of `caliber_jax.step`, logs to
TensorBoard, checkpoints with Orbax and resumes where it stopped.
"""

import contextlib
import copy
import functools
import json
import signal
import sys
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import app, flags, logging
from etils import epath
from flax import nnx
from jax.experimental import multihost_utils
from ml_collections import config_flags
from tqdm import tqdm

from caliber_jax import (
    checkpoint,
    cli,
    compile_ahead,
    host,
    losses,
    metrics_log,
    optim,
    paths,
    run_config,
    sharding,
    step,
    tokenization,
    training_path,
    w_out_init,
    watchdog,
)
from caliber_jax.data import pipeline
from caliber_jax.embedder import Embedder, resolve_dtype, resolve_dtype_name
from caliber_jax.models import embedding
from caliber_jax.run_data import (
    TokenizeFn,
    batch_options,
    corpus_lengths,
    exists_for_all,
    keep_token_lengths,  # noqa: F401  (prepare's and the benchmarks' train.keep_token_lengths)
    lengths_cache,
    make_source,
    passages_path,
    student_tokenizer_dir,
)


def choose_path(config: ml_collections.ConfigDict) -> training_path.TrainingPath:
    """The run's training path (docs/training_path.md): scan, compile-ahead, in order."""
    return training_path.choose(
        platform=jax.default_backend(),
        process_count=jax.process_count(),
        local_devices=jax.local_device_count(),
        pack_length=config.data.pack_length,
        pack_rungs=config.data.pack_rungs,
        compile_ahead=config.compile_ahead,
        scan_layers=config.model.scan_layers,
    )


def init_params(config: ml_collections.ConfigDict) -> tuple[embedding.ModelSpec, dict[str, Any]]:
    """Student spec and flat float32 params from `config.model.init_dir` (HF layout)."""
    model = config.model
    spec = embedding.read_spec(
        model.init_dir, pooling=model.pooling, num_layers=model.num_layers, out_dim=model.out_dim
    )
    return spec, embedding.load_flat_params(model.init_dir, spec, seed=config.seed)


def start_w_out(
    config: ml_collections.ConfigDict,
    spec: embedding.ModelSpec,
    flat: dict[str, Any],
    workdir: epath.Path,
    source: pipeline.TrainSource,
) -> dict[str, Any]:
    """`flat` with W_out's starting value (`config.model.w_out_init`).

    "lstsq" fits a new W_out on the training passages once and keeps it in the workdir
    (`w_out_init.FILE`), so a resumed run and `export --interpolate` use the same start (a
    method other than those two: `run_config.check_config`).
    """
    model = config.model
    if model.w_out_init == "xavier" or not embedding.has_new_w_out(model.init_dir, spec):
        return flat

    def fit_fn():
        fitted, scored = w_out_init.split_rows(
            len(source), fit_rows=model.w_out_fit_rows, seed=config.seed
        )
        rows = np.concatenate([fitted, scored])
        texts, _ = source.read_texts(rows)
        targets, _ = source.read_teacher(rows)
        student = Embedder.from_pretrained(
            model.init_dir,
            pooling=model.pooling,
            num_layers=model.num_layers,
            tokenizer_dir=model.tokenizer_dir or None,
            dtype=model.dtype,
        )  # no out_dim: unit pooled vectors, what W_out sees up to scale
        return w_out_init.fit(
            lambda batch: student.encode(
                batch, batch_size=config.batch_size, max_length=config.data.max_length
            ),
            texts,
            targets,
            heldout_rows=len(scored),
            ridge=model.w_out_ridge,
        )

    def barrier():
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("w_out_init")

    # Process 0 fits (or finds a resumed run's file); the others wait for the file and read it.
    tensors, report = w_out_init.fit_once(
        workdir / w_out_init.FILE, fit_fn, process_index=jax.process_index(), barrier=barrier
    )
    if report is not None:
        print(f"[caliber_jax] W_out fitted by least squares: {json.dumps(report)}", file=sys.stderr)
    if jax.process_count() > 1:
        where = f"process {jax.process_index()}/{jax.process_count()}"
        print(f"[caliber_jax] {where}: W_out starts from {w_out_init.FILE} "
              f"({w_out_init.digest(tensors)})", file=sys.stderr)  # fmt: skip
    return {**flat, **tensors}


def total_steps(config: ml_collections.ConfigDict, num_rows: int) -> int:
    """The run's micro-batches: `config.total_steps`, else `num_epochs` of `num_rows`, cut to
    whole optimizer updates of `optim.accum_steps` micro-batches (a remainder would be
    accumulated and never applied; a line says so). Fewer than one update is an error."""
    steps = config.total_steps
    if not steps:
        per_epoch = pipeline.batches_per_epoch(
            num_rows, batch_size=config.batch_size, drop_remainder=config.data.drop_remainder
        )
        steps = int(np.ceil(config.num_epochs * per_epoch))
    accum = config.optim.accum_steps
    if steps < accum:
        raise ValueError(f"config.optim.accum_steps={accum}: the run has {steps} micro-batches, "
                         f"less than one optimizer update")  # fmt: skip
    if steps % accum and jax.process_index() == 0:
        print(f"[caliber_jax] {steps} micro-batches cut to {steps - steps % accum}: whole "
              f"updates of optim.accum_steps={accum}", file=sys.stderr)  # fmt: skip
    return steps - steps % accum


def host_device() -> jax.Device:
    """The host's CPU device (where whole arrays may live), else this process's first device."""
    try:
        return jax.local_devices(backend="cpu")[0]
    except RuntimeError:  # JAX_PLATFORMS excludes the CPU backend
        return jax.local_devices()[0]


def write_config(config: ml_collections.ConfigDict, workdir: epath.Path) -> None:
    """Process 0 writes the run's config.json, whole (the other processes of a resumed run may be
    reading it in `run_config.check_workdir_config` at that moment; an object store's upload is
    whole)."""
    if jax.process_index() != 0:
        return
    paths.write_text_whole(workdir / "config.json", config.to_json_best_effort(indent=2))


def check_finite(metrics: dict[str, float], step_num: int) -> None:
    bad = {k: v for k, v in metrics.items() if not np.isfinite(v)}
    if bad:
        raise FloatingPointError(
            f"step {step_num}: non-finite {bad}; stopping. The last good checkpoint is kept."
        )


def evaluate(eval_fn, params, loader_factory, mesh,
             loss: ml_collections.ConfigDict | None = None) -> dict[str, float]:  # fmt: skip
    """Validation loss components over one pass of the held-out split; with the run's `loss`
    config, val/loss is the trained loss of those components (`losses.loss_from_parts`), else
    the row-weighted mean of the batches' losses. One batch stays in flight: the next is
    loaded and sent while the device works on the last, whose sums come to the host after."""
    totals: dict[str, float] = {}

    def add(sums) -> None:
        for k, v in jax.device_get(sums).items():
            totals[k] = totals.get(k, 0.0) + float(v)

    in_flight = None
    for batch in iter(loader_factory()):
        sums = eval_fn(params, sharding.to_global(batch, mesh))
        if in_flight is not None:
            add(in_flight)
        in_flight = sums
    if in_flight is not None:
        add(in_flight)
    # Each part over the rows it is a mean of (`step.eval_step`): every row, the perturbed rows,
    # or the numeric term's rows (for "neighbour": perturbed and with a neighbour).
    counts = {
        name: totals.pop(name) for name in ("rows", "pert_rows", "term_rows", "query_rows",
                                              "contrastive_rows")
        if name in totals
    }  # fmt: skip
    out = {}
    for key, total in totals.items():
        out[f"val/{key}"] = total / max(counts[step.EVAL_PART_ROWS.get(key, "rows")], 1.0)
    out["val/term_frac"] = counts["term_rows"] / max(counts["rows"], 1.0)
    if loss is not None and counts["rows"]:
        parts = {key.removeprefix("val/"): value for key, value in out.items()}
        out["val/loss"] = losses.loss_from_parts(
            parts, reduction=loss.reduction, lam=float(loss.lam),
            perturb_weight=loss.get("perturb_weight", 1.0),
            structure_weight=loss.structure_weight, query_weight=loss.get("query_weight", 0.0),
            contrastive_weight=loss.get("contrastive_weight", 0.0),
            query_align_weight=loss.get("query_align_weight", 0.0),
            pert_frac=counts["pert_rows"] / counts["rows"], term_frac=out["val/term_frac"],
        )  # fmt: skip
    return out


def make_model_state(
    config: ml_collections.ConfigDict,
    spec: embedding.ModelSpec,
    flat: dict[str, Any],
    *,
    mesh: jax.sharding.Mesh,
    optimizer: Any,
    scan_layers: bool,
) -> tuple[nnx.GraphDef, dict[str, Any], Any, Any]:
    """The student's graph, its params (in host memory), the `TrainState`'s abstract arrays
    (`jax.ShapeDtypeStruct`s carrying their shardings), and `init_fn(params) -> TrainState`."""
    # Weights stay in host memory until each device receives its own shard (put_sharded).
    with jax.default_device(host_device()):
        graphdef, params_state = embedding.split_model(
            spec,
            flat,
            dtype=resolve_dtype(config.model.dtype),
            remat=config.model.remat,
            attention=config.model.attention,
            scan_layers=scan_layers,
        )
    params = nnx.to_pure_dict(params_state)
    # Params are born sharded: the state's layout comes from the rules in sharding.py.
    abstract_state = jax.eval_shape(
        lambda p: step.init_state(p, optimizer, seed=config.seed), params
    )
    state_shardings = sharding.param_shardings(mesh, abstract_state)
    init_fn = jax.jit(
        lambda p: step.init_state(p, optimizer, seed=config.seed), out_shardings=state_shardings
    )
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        abstract_state,
        state_shardings,
    )
    return graphdef, params, abstract, init_fn


def optimizer_and_schedule(config: ml_collections.ConfigDict, steps: int):
    """The run's optimizer and its per-micro-batch learning-rate schedule, for `steps`
    micro-batches. With accumulation the optimizer (and its schedule) counts updates, not
    micro-batches; one schedule object, so the logged train/lr is the one the optimizer applies.
    Its constants (warmup, decay length) and the division by accum_steps are part of the step's
    XLA program."""
    accum = config.optim.accum_steps
    optimizer, update_schedule = optim.make_optimizer_and_schedule(
        total_steps=max(1, steps // accum), **config.optim
    )

    def schedule(micro_step):
        return update_schedule(micro_step // accum)

    return optimizer, schedule


def loss_arguments(config: ml_collections.ConfigDict) -> tuple[dict, dict[str, np.ndarray]]:
    """The config's loss as the train step takes it: `make_train_step`'s static `loss_args`,
    and the traced weights. lambda and m enter the step as traced scalars, not constants: LEAF,
    Caliber and every point of a lambda x margin sweep then share one compiled program per batch
    shape (and the cache)."""
    loss = config.loss
    static = dict(
        reduction=loss.reduction,
        objective=loss.get("objective", "caliber"),
        perturb_weight=loss.get("perturb_weight", 1.0),
        structure_weight=loss.structure_weight,
        query_weight=loss.get("query_weight", 0.0),
        query_passages=loss.get("query_passages", "both"),
        contrastive_weight=loss.get("contrastive_weight", 0.0),
        contrastive_temperature=loss.get("contrastive_temperature", 0.05),
        contrastive_judge=loss.get("contrastive_judge", "none"),
        query_align_weight=loss.get("query_align_weight", 0.0),
    )
    return static, {"lam": np.float32(loss.lam), "margin": np.float32(loss.margin)}


def make_eval_fn(graphdef, loss_args, weights, mesh, params_shardings, *, in_order: bool):
    """`eval_fn(params, global_batch) -> sums` of `step.eval_step` (see `evaluate`); `in_order`
    (`training_path.TrainingPath.in_order`: CPU collectives over several devices) returns only
    once the batch is done, so no two programs are in flight there."""
    replicated = sharding.replicated(mesh)
    eval_jit = jax.jit(
        lambda p, b, w: step.eval_step(p, b, graphdef=graphdef, **loss_args, **w),
        in_shardings=(params_shardings, sharding.batch_sharding(mesh), replicated),
        out_shardings=replicated,
    )
    if in_order:
        return lambda params, batch: jax.block_until_ready(eval_jit(params, batch, weights))
    return lambda params, batch: eval_jit(params, batch, weights)


def train(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
    """Runs (or resumes) training; returns the final summary metrics."""
    # A run that stops making progress (a deadlocked collective, a stuck filesystem) dumps its
    # stacks and exits watchdog.EXIT_STALLED instead of hanging: watched from here, through the
    # start-up collectives, restore and the steps, to the end of closing.
    stall = watchdog.StepWatchdog(
        factor=config.watchdog_factor, min_seconds=config.watchdog_min_s
    ).start()
    # Preemption and Ctrl-C: checkpoint and stop (installed just before the loop); the caller's
    # own handlers are back once the last save is written.
    agreed = multihost_utils.reached_preemption_sync_point if jax.process_count() > 1 else None
    sigterm = watchdog.SigtermFlag(agreed)
    try:
        return _train(config, workdir, stall, sigterm)
    finally:
        sigterm.restore()
        stall.close()


def _train(
    config: ml_collections.ConfigDict,
    workdir: str,
    stall: watchdog.StepWatchdog,
    sigterm: watchdog.SigtermFlag,
) -> dict[str, float]:
    run_config.check_config(config, backend=jax.default_backend(), devices=jax.device_count())
    workdir = paths.as_path(workdir)
    run_config.check_workdir_config(config, workdir)
    path = choose_path(config)  # first: a refused combination fails before any work
    marks = [("began", time.perf_counter())]  # where launch-to-first-step goes (cli.startup_line)
    spec, flat = init_params(config)
    marks.append(("weights", time.perf_counter()))
    dim = spec.out_dim or spec.config.width
    tokenizer_dir = student_tokenizer_dir(config)
    tokenizer = tokenization.load_tokenizer(tokenizer_dir)
    tokenize_fn = TokenizeFn(tokenizer_dir, tokenizer)
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else spec.config.pad_token_id
    )

    train_source = make_source(config, "train", dim)
    run_config.check_source(config, train_source)
    # Written once the inputs are found: a run that cannot start leaves the folder as it was.
    workdir.mkdir(parents=True, exist_ok=True)
    write_config(config, workdir)
    # Logged once the inputs are found, so a missing input stays a one-line error.
    if jax.process_index() == 0:
        print(f"[caliber_jax] {path.describe()}", file=sys.stderr)
    flat = start_w_out(config, spec, flat, workdir, train_source)
    marks.append(("inputs and W_out", time.perf_counter()))
    steps = total_steps(config, len(train_source))  # micro-batches
    optimizer, schedule = optimizer_and_schedule(config, steps)
    mesh = sharding.make_mesh(fsdp=config.mesh.fsdp)
    graphdef, params, abstract, init_fn = make_model_state(
        config, spec, flat, mesh=mesh, optimizer=optimizer, scan_layers=path.scan_layers
    )
    del flat
    marks.append(("model state", time.perf_counter()))
    state_shardings = jax.tree.map(lambda a: a.sharding, abstract)
    loss_args, weights = loss_arguments(config)
    train_fn = training_path.make_train_step(
        path,
        graphdef=graphdef,
        optimizer=optimizer,
        schedule=schedule,
        loss_args=loss_args,
        weights=weights,
        mesh=mesh,
        state_shardings=state_shardings,
    )
    eval_fn = make_eval_fn(graphdef, loss_args, weights, mesh, state_shardings.params,
                           in_order=path.in_order)  # fmt: skip

    process_rows = sharding.process_batch_rows(mesh, config.batch_size)
    max_length = config.data.max_length
    lengths = corpus_lengths(
        train_source, tokenize_fn, max_length=max_length,
        cache=lengths_cache(config, "train", tokenizer_dir),
    )  # fmt: skip
    # One batch function: the loader's, and (a copy, with its own epoch plan) compile-ahead's.
    batch_fn = pipeline.make_batch_fn(
        train_source,
        **batch_options(config, tokenize_fn, pad_id=pad_id, train=True,
                        process_rows=process_rows, lengths=lengths),
    )  # fmt: skip
    data_iter = iter(
        pipeline.iterate(
            batch_fn, num_epochs=None, worker_count=config.data.worker_count,
            read_threads=config.data.read_threads,
        )
    )  # fmt: skip
    marks.append(("token lengths and loader", time.perf_counter()))
    manager = checkpoint.make_manager(
        workdir / "checkpoints",
        max_to_keep=config.keep_checkpoints,
        save_interval_steps=config.checkpoint_every,
        keep_period=config.keep_period,
        # Saves return once the state is copied to host memory; the step goes on while a
        # background thread writes the files (see `checkpoint.save`).
        asynchronous=True,
    )
    # Resume order: this workdir's latest checkpoint, else config.model.init_dir (HF weights).
    latest = manager.latest_step()
    with contextlib.ExitStack() as cleanup:
        # Last out: however train() ends (finished, SIGTERM, an exception), the last save is
        # written and its step made visible before it returns, so a preempted job exits with it.
        cleanup.callback(manager.close)
        if path.compile_ahead:
            # Before the state is built (restored or initialised), the validation inputs and the
            # writer: the first step's program compiles beside them, from the state's shapes;
            # then the ladder's other row counts, side by side on the host's cores.
            # The walk plans steps until each rung of the row ladder has come (within an epoch:
            # a rung that first comes later compiles at its step), on a copy of the batch
            # function, so that the loader's plan of its epoch is not replaced under it.
            walk_fn, first = copy.copy(batch_fn), latest or 0
            coming = range(first, min(steps, first + walk_fn.per_epoch))
            walk = compile_ahead.first_of_each(
                walk_fn.geometry, coming, kinds=len(set(walk_fn.pack_ladder))
            )
            parallel = max(1, min(len(batch_fn.pack_ladder), host.usable_cores() - 1))
            train_fn.start_compile_ahead(walk, walk_fn, abstract, parallel=parallel)
        # However train() ends, no queued compile outlives it; after a failure none is waited for.
        cleanup.push(lambda failure, *_: train_fn.close(wait=failure is None))
        if latest is not None:
            state, start = checkpoint.restore(manager, abstract, data_iter, step=latest)
            # A stage line, not INFO logging: resuming is what a user must see even when quiet.
            print(f"[caliber_jax] resumed from {manager.directory} at step {start}",
                  file=sys.stderr)  # fmt: skip
        else:
            state, start = init_fn(sharding.put_sharded(params, state_shardings.params)), 0
        del params
        marks.append(("train state", time.perf_counter()))

        val_factory = None
        if config.data.validate and exists_for_all(passages_path(config.data.dir, "val")):
            val_source = make_source(config, "val", dim, neighbour_source=train_source)
            val_lengths = corpus_lengths(
                val_source,
                tokenize_fn,
                max_length=max_length,
                cache=lengths_cache(config, "val", tokenizer_dir),
            )
            val_factory = functools.partial(
                pipeline.make_loader, val_source, num_epochs=1,
                worker_count=config.data.worker_count, read_threads=config.data.read_threads,
                **batch_options(config, tokenize_fn, pad_id=pad_id, train=False,
                                process_rows=process_rows, lengths=val_lengths),
            )  # fmt: skip

        # tensorboardX writes gs:// and s3:// logdirs itself.
        writer = metrics_log.MetricsWriter(workdir, tensorboard=config.tensorboard, start=start,
                                           active=jax.process_index() == 0)  # fmt: skip
        cleanup.callback(writer.close)
        sigterm.install()
        # Joining the compile thread and closing the manager (finishing the last save) have the
        # long limit.
        cleanup.callback(stall.enter, "closing")
        summary = _loop(
            config, state, start, steps, train_fn, eval_fn, data_iter, manager, mesh, writer,
            val_factory, sigterm, stall, marks,
        )  # fmt: skip
    # The compute dtype a config's "auto" became on this machine (`embedder.resolve_dtype_name`).
    summary["compute_bfloat16"] = float(resolve_dtype_name(config.model.dtype) == "bfloat16")
    return summary


def _loop(config, state, start, steps, train_fn, eval_fn, data_iter, manager, mesh, writer,
          val_factory, sigterm, stall, marks) -> dict[str, float]:  # fmt: skip
    """The linear train loop: step, log, validate, checkpoint; `marks` (name, perf_counter) of
    the setup phases, printed with the first step's end (`cli.startup_line`)."""
    last: dict[str, float] = {}
    window_start, window_rows, window_tokens = time.perf_counter(), 0, 0.0
    shapes: set[tuple] = set()  # distinct batch shapes = distinct train-step programs
    bar = tqdm(total=steps, initial=start, desc="train", disable=jax.process_index() != 0)
    step_num = start
    if val_factory is not None and config.eval_at_start and start == 0:
        # the starting point of the validation curves
        with jax.transfer_guard("allow"), stall.phase("validation"):
            writer.write(evaluate(eval_fn, state.params, val_factory, mesh, config.loss), 0)
    # Host-to-device copies are explicit (sharding.to_global); anything implicit is a bug.
    with jax.transfer_guard("disallow"):
        for step_num in range(start + 1, steps + 1):
            batch = next(data_iter)
            shape = compile_ahead.shape_key(batch)
            if shape not in shapes:  # its program compiles now, or compile-ahead's may still be
                stall.enter("compile")
            shapes.add(shape)
            state, metrics = train_fn(state, batch)
            if step_num == start + 1 and jax.process_index() == 0:
                jax.block_until_ready(metrics)
                marks.append(("first step", time.perf_counter()))
                stats = cli.COMPILE_STATS.snapshot()
                print(f"[caliber_jax] {cli.startup_line(marks, stats)}", file=sys.stderr)
            window_rows += int(np.sum(batch["weight"])) * jax.process_count()
            window_tokens += real_tokens(batch) * jax.process_count()
            must_log = step_num % config.log_every == 0 or step_num == steps
            stop = sigterm.reached(step_num)
            must_save = step_num % config.checkpoint_every == 0 or step_num == steps or stop
            if must_log or must_save:
                fetched = {k: float(v) for k, v in jax.device_get(metrics).items()}
                check_finite(fetched, step_num)
                elapsed = time.perf_counter() - window_start
                fetched["train/seq_per_s"] = window_rows / elapsed
                fetched["train/tokens_per_s"] = window_tokens / elapsed
                window_start, window_rows, window_tokens = time.perf_counter(), 0, 0.0
                last.update(fetched)
                writer.write(fetched, step_num)
                bar.set_postfix(
                    loss=f"{fetched['train/loss']:.4f}", lr=f"{fetched['train/lr']:.2e}"
                )
            paused = time.perf_counter()  # validation and saves are not training throughput
            if val_factory is not None and (step_num % config.eval_every == 0 or step_num == steps):
                with jax.transfer_guard("allow"), stall.phase("validation"):
                    val = evaluate(eval_fn, state.params, val_factory, mesh, config.loss)
                last.update(val)
                writer.write(val, step_num)
            if must_save:
                with jax.transfer_guard("allow"), stall.phase("checkpoint save"):
                    checkpoint.save(manager, step_num, state, data_iter, force=True)
            window_start += time.perf_counter() - paused
            stall.step_done(step_num)
            bar.update(1)
            if stop:
                logging.warning(
                    "%s: checkpointed step %d, exiting",
                    signal.Signals(sigterm.signum).name,
                    step_num,
                )
                break
    bar.close()
    last["step"] = step_num
    last["steps_run"] = step_num - start
    last["preempted"] = float(step_num < steps)
    if step_num < steps:
        last["stop_signal"] = float(sigterm.signum)  # 15 SIGTERM, 2 SIGINT
    last.update(cli.compile_summary(len(shapes), ahead=train_fn.compiled_ahead,
                                    build_seconds=train_fn.build_seconds,
                                    show=jax.process_index() == 0))  # fmt: skip
    if jax.process_index() == 0:
        print("final: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(last.items())))
    return last


def real_tokens(batch: dict[str, np.ndarray]) -> int:
    """Non-pad tokens of x and of the existing pi(x) in this host's packed batch: slot g holds x
    row g, B + g its pi(x), 2B padding (slots hold global positions, B the global batch)."""
    global_rows = len(batch["weight"]) * jax.process_count()
    return int(np.sum(batch["packed_slots"] < 2 * global_rows))


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
    # Multi-host runs (SLURM, TPU pods, or JAX_COORDINATOR_ADDRESS) join one JAX cluster.
    sharding.initialize_distributed(config.multihost)
    summary = train(config, workdir)
    if summary["preempted"]:
        # Not finished: no summary.json, and a status that stops `train && export` pipelines.
        print(
            f"[caliber_jax] stopped by {signal.Signals(int(summary['stop_signal'])).name} at step "
            f"{int(summary['step'])}, checkpoint saved; "
            "the same command resumes it",
            file=sys.stderr,
        )
        sys.exit(watchdog.EXIT_PREEMPTED)
    if jax.process_index() != 0:
        return
    path = paths.as_path(workdir) / "summary.json"
    if summary["steps_run"] == 0 and path.exists():
        # Rerunning a finished run (a pipeline resumed after it) keeps the summary of its steps.
        print(f"[caliber_jax] {workdir}: already trained to step {int(summary['step'])}; "
              f"{path.name} kept", file=sys.stderr)  # fmt: skip
        return
    path.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    # Flags are defined only when run as a script, so tests can import `train`.
    config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
    flags.DEFINE_string("workdir", None, "Run directory: checkpoints, logs, config.", required=True)
    flags.mark_flag_as_required("config")
    cli.run(main)
