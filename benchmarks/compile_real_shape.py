"""Compile and step cost of the real train step at the Qwen3-Embedding-0.6B shape.

    python benchmarks/compile_real_shape.py     # every part -> runs/compile_real_shape.json
    python benchmarks/compile_real_shape.py --parts compile-scan-full,step-scan-full
    python benchmarks/compile_real_shape.py --num-layers 2 --max-length 64 --out /tmp/c.json

The step is the one `caliber_jax.train` builds for configs/caliber.py (`training_path.choose` and
`make_train_step`: one program, state donated, lambda and m as traced scalars): float32 master
weights, bf16 compute, AdamW with clipping, eq. 4. Its batch is the longest one an epoch of
configs/caliber.py could meet: B = 32 passages of max_length tokens and P = 16 pi(x), packed one
per row of max_length (B + P rows), built by the training loader (`pipeline.make_batch_fn`) from
passages that tokenize past max_length.

Parts, each in its own subprocess (so `peak_rss_bytes`, the child's `ru_maxrss`, is that part's):
  compile-{unrolled,scan}-{none,full,dots}: layers unrolled or as one `lax.scan`, remat off,
    "full" or "dots" (`layers.REMAT_POLICIES`);
    abstract weights (nothing allocated): seconds in `jit(...).trace`, `.lower()`, `.compile()`,
    the StableHLO's size (characters, ops), the optimised HLO's instruction count and XLA's
    buffer assignment (`memory_analysis`: the step's arguments, outputs and temporaries).
  step-{unrolled,scan}-{none,full,dots}: random weights, the state built on the device,
    compiled, then `--steps` steps timed one by one (the first includes nothing but the step: it
    is compiled ahead), and the peak RSS of the whole process.
Results go to `--out` as one JSON object (written atomically after each part); a part already
there is skipped, so an interrupted run resumes where it stopped (`--force` reruns). No
persistent compilation cache is used.
"""

import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402

ALL_PARTS = tuple(
    f"{kind}-{layout}-{remat}"
    for kind in ("compile", "step")
    for layout in ("unrolled", "scan")
    for remat in ("none", "full", "dots")
)
# What a full run measures: every compile, and the step at the settings that fit 24 GiB.
DEFAULT_PARTS = (
    "compile-unrolled-none",
    "compile-scan-none",
    "compile-unrolled-full",
    "compile-scan-full",
    "step-scan-full",
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--parts",
        default=",".join(DEFAULT_PARTS),
        help=f"comma-separated, from {', '.join(ALL_PARTS)}",
    )
    parser.add_argument("--out", default=str(common.REPO_ROOT / "runs" / "compile_real_shape.json"))
    parser.add_argument("--config", default="configs/caliber.py")
    parser.add_argument("--num-layers", type=int, default=None, help="default: the model's 28")
    parser.add_argument("--model", default="qwen3-0.6b", choices=sorted(common.QWEN3_SHAPES))
    parser.add_argument(
        "--pert-share",
        type=float,
        default=0.4,
        help="share of the batch's rows with a pi(x) (1.0: P = B, the epoch's largest batches)",
    )
    parser.add_argument("--max-length", type=int, default=None, help="default: the config's")
    parser.add_argument("--batch-size", type=int, default=None, help="default: the config's")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per step part")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="per part")
    parser.add_argument("--force", action="store_true", help="rerun parts already in --out")
    parser.add_argument(
        "--min-available-gib",
        type=float,
        default=16.0,
        help="a step part starts only with this much memory available (the machine is shared)",
    )
    parser.add_argument("--run-part", help=argparse.SUPPRESS)  # the child's side
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------- child


def build(args, *, scan: bool, remat: str, abstract: bool):
    """(jitted step, state, batch, weights, info) for one part; `abstract`: ShapeDtypeStructs."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from caliber_jax import sharding, step, tokenization, train, training_path
    from caliber_jax.data import pipeline
    from caliber_jax.models import embedding

    config = common.load_config(args.config)
    if args.max_length:
        config.data.max_length = args.max_length
    if args.batch_size:
        config.batch_size = args.batch_size
    model_config = common.QWEN3_SHAPES[args.model]
    if args.num_layers:
        model_config = dataclasses.replace(model_config, num_hidden_layers=args.num_layers)
    dtype = jnp.dtype(config.model.dtype)
    if abstract:
        spec = embedding.ModelSpec(
            family="qwen3",
            config=model_config,
            pooling="mean",
            out_dim=None,
            raw_config=model_config.to_hf(),
        )
        model = embedding.abstract_model(spec, dtype=dtype, remat=remat, scan_layers=scan)
        graphdef, state = nnx.split(model, nnx.Param)
        params = nnx.to_pure_dict(state)
    else:
        student = common.random_qwen3(model_config, seed=0)
        spec = student.spec
        graphdef, state = embedding.split_model(
            spec, student.flat, dtype=dtype, remat=remat, scan_layers=scan
        )
        del student
        params = nnx.to_pure_dict(state)
        del state
    # The schedule's length only shapes the learning rate; train's own optimizer and schedule.
    optimizer, schedule = train.optimizer_and_schedule(config, 1000)
    init = functools.partial(step.init_state, optimizer=optimizer, seed=config.seed)
    mesh = sharding.make_mesh(fsdp=config.mesh.fsdp)
    state_shardings = sharding.param_shardings(mesh, jax.eval_shape(init, params))
    if abstract:
        state = jax.eval_shape(init, params)
    else:
        state = jax.jit(init, out_shardings=state_shardings)(params)
    del params
    loss_args, weights = train.loss_arguments(config)
    # The step caliber_jax.train builds for this config (lambda and m traced, state donated).
    path = training_path.choose(
        platform=jax.devices()[0].platform,
        process_count=1,
        local_devices=1,
        pack_length=config.data.pack_length,
        pack_rungs=config.data.pack_rungs,
        compile_ahead=False,
        scan_layers=scan,
    )
    train_step = training_path.make_train_step(
        path, graphdef=graphdef, optimizer=optimizer, schedule=schedule, loss_args=loss_args,
        weights=weights, mesh=mesh, state_shardings=state_shardings,
    )  # fmt: skip
    jitted = train_step.jitted
    batch = longest_batch(
        config, spec.out_dim or model_config.hidden_size, args.pert_share, tokenization, pipeline
    )
    if abstract:
        batch = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), batch)
    info = {
        "layers": model_config.num_hidden_layers,
        "batch_shapes": {k: list(v.shape) for k, v in sorted(batch.items())},
        "params": int(sum(np.prod(x.shape) for x in jax.tree.leaves(state.params))),
    }
    return jitted, state, batch, weights, info


def longest_batch(config, dim: int, pert_share: float, tokenization, pipeline) -> dict:
    """The loader's batch of B passages longer than max_length, `pert_share` of them (rounded)
    with a pi(x)."""
    import numpy as np

    tokenizer = tokenization.build_qwen3_tokenizer()
    rows, length = config.batch_size, config.data.max_length
    # "w0 w1 ..." passes max_length; pi(x) changes one number, same length.
    texts = [" ".join(f"{row} {i}" for i in range(length)) for row in range(rows)]
    perturbed = [
        t.replace(" 7 ", " 8 ", 1) if row < round(pert_share * rows) else ""
        for row, t in enumerate(texts)
    ]

    def tokenize_fn(batch, max_length):
        return tokenization.tokenize(tokenizer, batch, max_length=max_length)

    data = config.data
    with tempfile.TemporaryDirectory(prefix="compile_real_shape_") as tmp:
        source = common.write_source(tmp, texts, perturbed, dim=dim, seed=0)
        batch_fn = pipeline.make_batch_fn(
            source,
            batch_size=rows,
            seed=0,
            shuffle=False,
            process_index=0,
            process_count=1,
            tokenize_fn=tokenize_fn,
            max_length=length,
            pad_id=tokenizer.pad_token_id,
            pad_to_multiple=data.pad_to_multiple,
            length_group_window=1,
            drop_remainder=True,
            pert_rows_multiple=data.pert_rows_multiple,
            bucket_growth=data.bucket_growth,
            # Every sequence at max_length: one per packed row of max_length, B + P rows.
            pack_length=length,
            pack_rows_multiple=data.pack_rows_multiple,
            pack_rungs=data.pack_rungs,
        )
        batch = batch_fn(0)
    assert batch["packed_ids"].shape[1] == length, batch["packed_ids"].shape
    return {k: np.asarray(v) for k, v in batch.items()}


def hlo_ops(text: str) -> int:
    """Instructions of an HLO / StableHLO module's text: lines that assign a value."""
    return sum(1 for line in text.splitlines() if " = " in line)


def run_part(args, name: str) -> dict:
    import jax
    import numpy as np

    kind, layout, remat = name.split("-")
    scan = layout == "scan"
    out: dict = {"part": name, "scan_layers": scan, "remat": remat}
    clock = time.perf_counter()
    jitted, state, batch, weights, info = build(
        args, scan=scan, remat=remat, abstract=kind == "compile"
    )
    out.update(info, setup_s=time.perf_counter() - clock)
    if kind == "step":
        batch = jax.device_put(batch)
    # Wall and CPU seconds of each phase: on a loaded machine the CPU seconds (this process's,
    # all threads) are the comparable figure.
    t0, c0 = time.perf_counter(), time.process_time()
    traced = jitted.trace(state, batch, weights)
    t1, c1 = time.perf_counter(), time.process_time()
    lowered = traced.lower()
    t2, c2 = time.perf_counter(), time.process_time()
    compiled = lowered.compile()
    t3, c3 = time.perf_counter(), time.process_time()
    out.update(trace_s=t1 - t0, lower_s=t2 - t1, compile_s=t3 - t2)
    out.update(trace_cpu_s=c1 - c0, lower_cpu_s=c2 - c1, compile_cpu_s=c3 - c2)
    if kind == "compile":
        stablehlo = lowered.as_text()
        hlo = compiled.as_text()
        out.update(
            stablehlo_chars=len(stablehlo),
            stablehlo_ops=hlo_ops(stablehlo),
            hlo_chars=len(hlo),
            hlo_instructions=hlo_ops(hlo),
        )
        memory = compiled.memory_analysis()
        if memory is not None:
            for key in ("argument", "output", "alias", "temp", "generated_code"):
                out[f"xla_{key}_bytes"] = int(getattr(memory, f"{key}_size_in_bytes"))
    else:
        seconds, losses = [], []
        cpu_seconds = []
        for _ in range(args.steps):
            start, cpu = time.perf_counter(), time.process_time()
            state, metrics = compiled(state, batch, weights)
            jax.block_until_ready((state, metrics))
            seconds.append(time.perf_counter() - start)
            cpu_seconds.append(time.process_time() - cpu)
            losses.append(float(metrics["train/loss"]))
        out["step_cpu_s"] = cpu_seconds
        # Packed rows: slot 2B marks padding (the x and pi(x) slots are below it).
        slots = np.asarray(jax.device_get(batch)["packed_slots"])
        out.update(
            step_s=seconds,
            loss=losses,
            real_tokens=int(np.sum(slots < 2 * len(jax.device_get(batch)["has_pert"]))),
            token_slots=int(slots.size),
        )
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


# ----------------------------------------------------------------------------- parent


def available_gib() -> float:
    """MemAvailable of /proc/meminfo, GiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.run_part:
        print("RESULT " + json.dumps(run_part(args, args.run_part)), flush=True)
        return
    parts = [p for p in args.parts.split(",") if p]
    if unknown := sorted(set(parts) - set(ALL_PARTS)):
        raise SystemExit(f"--parts: unknown {unknown}; expected some of {ALL_PARTS}")
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    results["cpu"] = common.cpu_description()
    results.setdefault("parts", {})
    forwarded = [f"--config={args.config}", f"--steps={args.steps}", f"--model={args.model}",
                 f"--pert-share={args.pert_share}"]  # fmt: skip
    for flag in ("num_layers", "max_length", "batch_size"):
        if getattr(args, flag):
            forwarded.append(f"--{flag.replace('_', '-')}={getattr(args, flag)}")
    for name in parts:
        if "error" not in results["parts"].get(name, {"error": ""}) and not args.force:
            print(f"{name}: already in {out}, skipped", flush=True)
            continue
        available = available_gib()
        if name.startswith("step-") and available < args.min_available_gib:
            print(f"{name}: {available:.1f} GiB available < {args.min_available_gib}: not run")
            continue
        print(f"{name}: running (load {os.getloadavg()[0]:.2f})", flush=True)
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, __file__, f"--run-part={name}", *forwarded],
                capture_output=True,
                text=True,
                timeout=args.timeout_s,
            )
            lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
            result = (
                json.loads(lines[-1][7:])
                if lines
                else {"error": f"rc={proc.returncode}: {proc.stderr.strip().splitlines()[-3:]}"}
            )
        except subprocess.TimeoutExpired:
            result = {"error": f"timed out after {args.timeout_s:.0f} s"}
        result.update(wall_s=time.perf_counter() - start, load_1m_after=os.getloadavg()[0])
        results["parts"][name] = result
        write_atomic(out, results)
        print(f"{name}: " + json.dumps(result), flush=True)


if __name__ == "__main__":
    common.run_main(main)
