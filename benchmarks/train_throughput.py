"""Training throughput of the jit-compiled Caliber step, and of a PyTorch reference in the same run.

    python benchmarks/train_throughput.py --preset cpu-minilm        # this CPU box, < 1 minute
    python benchmarks/train_throughput.py --preset gpu-qwen3-0.6b    # one H100 / H200

Both frameworks get the same batches and the same weights. Batches are cut from real filings
passages by the training pipeline's own length grouping (`pipeline.make_epoch_batches`), and a few
of them, taken at evenly spaced quantiles of their token count, stand for the epoch. JAX runs
`step.train_step` jitted as `train.py` jits it (state donated), on the pipeline's batch layout:
x and pi(x) padded to a multiple of 16 and encoded in one stacked forward, with a pi(x) row for
every x ("stacked") or for the perturbed rows only ("compact", where step.py supports it, see
`step.BATCH_LAYOUTS`). PyTorch is the authors' recipe as one writes it in PyTorch: transformers'
model with SDPA attention, a forward over x padded to the batch max, a second forward over only
the perturbed rows, the same loss (eq. 4), gradient clipping, fused AdamW, bf16 autocast on GPU.

Timing: a warm-up step per framework (the JAX step compiles every shape in a background thread
meanwhile), then rounds over the batches in which the two frameworks alternate step by step, so
both see the same machine load; every step is synchronised. A framework's time for a batch is the
median over rounds, and its throughput is rows over the sum of those medians. Rounds stop at
`--repeats`, or earlier once `--time-budget-s` would be exceeded. The last line printed is
`ratio_jax_over_torch=<jax seq/s / torch seq/s>`.

MFU counts model FLOPs on real (non-pad) tokens only (`common.model_flops`): 6 x non-embedding
params x tokens + 12 x layers x t^2 x (heads x head dim) per sequence, halved for causal
attention, over a peak FLOP/s that is printed with its source.
"""

import argparse
import concurrent.futures
import dataclasses
import functools
import os
import sys
import time
from pathlib import Path

# Run from anywhere, installed or not: the repo root (for `caliber_jax`, `benchmarks`) goes first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# Two frameworks share one GPU: JAX allocates as it goes instead of taking 75% up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks import common  # noqa: E402
from caliber_jax import optim, step, tokenization  # noqa: E402
from caliber_jax.models import embedding  # noqa: E402

PRESETS = {
    "cpu-minilm": {
        "model": "minilm",
        "num_layers": 3,
        "batch_size": 32,
        "pert_frac": 0.4,
        "lengths": "filings",
        "max_length": 256,
        "dtype": "float32",
        "num_batches": 3,
        "repeats": 5,
        "time_budget_s": 20.0,
    },
    "gpu-qwen3-0.6b": {
        "model": "qwen3-0.6b",
        "num_layers": None,
        "batch_size": 32,
        "pert_frac": 0.4,
        "lengths": "filings",
        "max_length": 512,
        "dtype": "bfloat16",
        "num_batches": 8,
        "repeats": 10,
        "time_budget_s": 0.0,
    },
}
# The paper's training set and its single-GPU epoch time (Sec. 5.1; Table 4, LEAF run).
PAPER_PASSAGES = 606_000
PAPER_EPOCH_SECONDS = 6946.0
# Loss and optimizer as configs/caliber.py; the schedule length only shapes the learning rate.
LAM, MARGIN, REDUCTION = 0.5, 0.05, "batch"
OPTIM = dict(
    lr=1e-4, weight_decay=0.01, warmup_frac=0.05, b1=0.9, b2=0.999, eps=1e-8, clip_norm=1.0
)
TOTAL_STEPS = 1000


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--batch-size", type=int, help="global batch B")
    parser.add_argument("--pert-frac", type=float, help="share of rows that carry a pi(x)")
    parser.add_argument("--lengths", help="'filings' (real passages) or 'fixed:N' tokens")
    parser.add_argument("--max-length", type=int, help="token cap")
    parser.add_argument("--num-layers", type=int, help="keep the first N encoder layers")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="compute dtype")
    parser.add_argument("--num-batches", type=int, help="distinct batches timed")
    parser.add_argument("--repeats", type=int, help="most timed rounds over the batches")
    parser.add_argument("--time-budget-s", type=float, help="stop rounds past this; 0 = none")
    parser.add_argument("--pad-multiple", type=int, default=16, help="JAX pads T to this multiple")
    parser.add_argument("--group-window", type=int, default=16, help="length-grouping window")
    parser.add_argument(
        "--jax-layout",
        choices=("stacked", "compact"),
        help="pi(x) rows for every x, or only the perturbed rows padded to a multiple of "
        "--pert-rows-multiple (step.BATCH_LAYOUTS); default: compact where step.py has it",
    )
    parser.add_argument("--pert-rows-multiple", type=int, default=16)
    parser.add_argument("--remat", action="store_true", help="JAX: rematerialise each layer")
    parser.add_argument("--skip-torch", action="store_true", help="time JAX only")
    parser.add_argument("--filings", default=str(common.DEFAULT_FILINGS))
    parser.add_argument("--record-stride", type=int, default=18, help="read every k-th filing")
    parser.add_argument("--pool", type=int, default=2048, help="passages sampled")
    parser.add_argument(
        "--compile-cache",
        default=str(common.REPO_ROOT / "runs" / "xla_cache"),
        help="JAX persistent compilation cache directory ('' = off)",
    )
    parser.add_argument(
        "--jax-attention",
        choices=("xla", "cudnn"),
        default="xla",
        help="xla: the library's jax.nn.dot_product_attention (XLA); cudnn: its fused cuDNN "
        "kernel with sequence lengths (GPU + bf16 only, an experiment switch)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


def build_student(args) -> tuple[common.Student, object]:
    if args.model == "minilm":
        student = common.load_minilm(num_layers=args.num_layers)
        tokenizer = tokenization.load_tokenizer(common.minilm_dir())
    else:
        config = common.QWEN3_EMBEDDING_0_6B
        if args.num_layers:
            config = dataclasses.replace(config, num_hidden_layers=args.num_layers)
        student = common.random_qwen3(config, seed=args.seed)
        tokenizer = tokenization.build_qwen3_tokenizer()
    return student, tokenizer


def build_passages(args, student, tokenizer) -> common.Passages:
    if args.lengths == "filings":
        return common.load_passages(
            args.filings,
            tokenizer,
            count=args.pool,
            max_length=args.max_length,
            record_stride=args.record_stride,
            seed=args.seed,
        )
    if args.lengths.startswith("fixed:"):
        return common.fixed_passages(
            count=args.batch_size * args.num_batches,
            length=int(args.lengths.removeprefix("fixed:")),
            vocab=student.config.vocab_size,
            empty_ids=tokenization.tokenize(tokenizer, [""], max_length=args.max_length)[0],
            seed=args.seed,
        )
    raise ValueError(f"--lengths={args.lengths!r}: expected 'filings' or 'fixed:N'")


def make_batch(args, passages, rows, *, pad_id: int, dim: int, seed: int, layout: str):
    """One batch as the pipeline builds it (round(pert_frac * B) rows with a pi(x)).

    `layout="compact"` then keeps only the perturbed rows of pi(x) (`common.compact_batch`).
    """
    count = round(args.pert_frac * len(rows))
    has_pert = common.choose_perturbed(passages, rows, count=count, seed=seed)
    batch = common.pipeline_batch(
        passages,
        rows,
        has_pert,
        pad_id=pad_id,
        multiple=args.pad_multiple,
        max_length=args.max_length,
        dim=dim,
        seed=seed,
    )
    if layout == "compact":
        batch = common.compact_batch(
            batch,
            rows_multiple=args.pert_rows_multiple,
            multiple=args.pad_multiple,
            max_length=args.max_length,
            pad_id=pad_id,
        )
    return batch


def padding_study(args, passages, pad_id: int) -> None:
    """Padding of a whole epoch of the sampled pool, per layout, with and without grouping.

    Slots are the token positions a forward computes: stacked 2B x max(T, T'), compact
    B x T + P x T' (one forward over B + P rows of max(T, T')), PyTorch B x max|x| + k x max|pi x|.
    """
    if args.lengths != "filings":
        return
    for window in sorted({1, args.group_window}):
        plan = common.epoch_batches(
            passages, batch_size=args.batch_size, window=window, seed=args.seed
        )
        real = 0
        slots = {"stacked": 0, "compact": 0, "torch": 0}
        for i, rows in enumerate(plan):
            batch = make_batch(args, passages, rows, pad_id=pad_id, dim=1, seed=i, layout="stacked")
            compact = common.compact_batch(
                batch,
                rows_multiple=args.pert_rows_multiple,
                multiple=args.pad_multiple,
                max_length=args.max_length,
                pad_id=pad_id,
            )
            real += sum(common.real_lengths(batch))
            for name, b in (("stacked", batch), ("compact", compact)):
                width = max(b["input_ids"].shape[1], b["pert_input_ids"].shape[1])
                slots[name] += (b["input_ids"].shape[0] + b["pert_input_ids"].shape[0]) * width
            x_len = batch["attention_mask"].sum(1)
            p_len = batch["pert_attention_mask"][batch["has_pert"]].sum(1)
            slots["torch"] += len(x_len) * x_len.max() + len(p_len) * p_len.max(initial=0)
        fractions = " ".join(f"{k}={1 - real / v:.3f}" for k, v in slots.items())
        print(f"padding_frac(window={window}, {len(plan)} batches): {fractions}")


# ----------------------------------------------------------------------------- JAX


class JaxRunner:
    """`step.train_step` jitted as `train.py` does (state donated), on device-resident batches."""

    name = "jax"

    def __init__(self, args, student, batches):
        self.device = jax.devices()[0]
        dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
        graphdef, params_state = embedding.split_model(
            student.spec, student.flat, dtype=dtype, remat=args.remat
        )
        params = nnx.to_pure_dict(params_state)
        del params_state
        schedule = optim.make_schedule(
            lr=OPTIM["lr"], total_steps=TOTAL_STEPS, warmup_frac=OPTIM["warmup_frac"]
        )
        optimizer = optim.make_optimizer(
            total_steps=TOTAL_STEPS, schedule="linear", cycles=1, accum_steps=1, **OPTIM
        )
        init = functools.partial(step.init_state, optimizer=optimizer, seed=args.seed)
        self.state = jax.jit(init)(params)
        del params
        self.train_fn = jax.jit(
            functools.partial(
                step.train_step,
                graphdef=graphdef,
                optimizer=optimizer,
                schedule=schedule,
                lam=LAM,
                margin=MARGIN,
                reduction=REDUCTION,
            ),
            donate_argnums=0,
        )
        self.batches = [jax.device_put(b, self.device) for b in batches]
        self.executables = {}

    @staticmethod
    def _shape_key(batch) -> tuple:
        return tuple((k, v.shape) for k, v in sorted(batch.items()))

    def compile_all(self) -> float:
        """Compiles the step for every distinct batch shape, in parallel; returns the wall time.

        Run in a background thread while PyTorch warms up: XLA's compiler is mostly
        single-threaded, so the two overlap on a multi-core CPU without touching timed steps.
        """
        start = time.perf_counter()
        unique = {self._shape_key(b): b for b in self.batches}
        with concurrent.futures.ThreadPoolExecutor(len(unique)) as pool:
            compiled = pool.map(
                lambda b: self.train_fn.lower(self.state, b).compile(), unique.values()
            )
            self.executables = dict(zip(unique, compiled, strict=True))
        return time.perf_counter() - start

    def run(self, index: int) -> jax.Array:
        """One step on batch `index`, returned once the device is done (loss as a scalar)."""
        batch = self.batches[index]
        step_fn = self.executables.get(self._shape_key(batch), self.train_fn)
        self.state, metrics = step_fn(self.state, batch)
        jax.block_until_ready((self.state, metrics))
        return metrics["train/loss"]

    def peak_memory(self) -> str:
        stats = self.device.memory_stats()
        if stats and "peak_bytes_in_use" in stats:
            return f"{common.format_bytes(stats['peak_bytes_in_use'])} (peak_bytes_in_use)"
        longest = max(self.batches, key=lambda b: b["pert_input_ids"].size + b["input_ids"].size)
        analysis = self.train_fn.lower(self.state, longest).compile().memory_analysis()
        used = (
            analysis.argument_size_in_bytes
            + analysis.output_size_in_bytes
            - analysis.alias_size_in_bytes
            + analysis.temp_size_in_bytes
        )
        return f"{common.format_bytes(used)} (XLA buffer assignment, longest batch)"


# ----------------------------------------------------------------------------- PyTorch


class TorchRunner:
    """The authors' recipe in plain PyTorch: forward x, forward the perturbed rows, eq. 4."""

    name = "torch"

    def __init__(self, args, student, batches):
        import torch

        self.torch = torch
        self.on_gpu = torch.cuda.is_available()
        self.device = "cuda" if self.on_gpu else "cpu"
        torch.set_num_threads(os.cpu_count() or 1)
        model = common.torch_model(student, device=self.device)
        model.train()
        # Dropout off in both frameworks (the JAX port has none): same work, same loss.
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        self.model = model
        decay = [p for p in model.parameters() if p.ndim >= 2]
        no_decay = [p for p in model.parameters() if p.ndim < 2]
        self.optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": OPTIM["weight_decay"]},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=OPTIM["lr"],
            betas=(OPTIM["b1"], OPTIM["b2"]),
            eps=OPTIM["eps"],
            fused=True,  # torch >= 2.4 has fused AdamW on CPU and GPU
        )
        warmup = int(OPTIM["warmup_frac"] * TOTAL_STEPS)

        def linear(count: int) -> float:
            if count < warmup:
                return count / max(1, warmup)
            return max(0.0, (TOTAL_STEPS - count) / max(1, TOTAL_STEPS - warmup))

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, linear)
        self.autocast = torch.autocast(
            device_type=self.device, dtype=torch.bfloat16, enabled=self.on_gpu
        )
        self.batches = [self._to_torch(b) for b in batches]

    def _to_torch(self, batch):
        """x padded to the batch max; the perturbed rows gathered and padded to their own max."""
        x_len = int(batch["attention_mask"].sum(axis=1).max())
        pert = np.flatnonzero(batch["has_pert"])
        p_len = int(batch["pert_attention_mask"][pert].sum(axis=1).max()) if len(pert) else 0
        out = {
            "ids": batch["input_ids"][:, :x_len],
            "mask": batch["attention_mask"][:, :x_len],
            "pert_ids": batch["pert_input_ids"][pert, :p_len],
            "pert_mask": batch["pert_attention_mask"][pert, :p_len],
            "pert": pert,
            "t_x": batch["teacher_x"],
            "t_px": batch["teacher_px"][pert],
        }
        return {
            k: self.torch.from_numpy(np.ascontiguousarray(v)).to(self.device)
            for k, v in out.items()
        }

    def _embed(self, ids, mask):
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        weights = mask.unsqueeze(-1).float()
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return self.torch.nn.functional.normalize(pooled, dim=-1)

    def run(self, index: int):
        torch = self.torch
        cosine = torch.nn.functional.cosine_similarity
        tb = self.batches[index]
        with self.autocast:
            s_x = self._embed(tb["ids"], tb["mask"])
            loss = (s_x - tb["t_x"]).norm(dim=-1).sum()
            if tb["pert"].numel():
                s_px = self._embed(tb["pert_ids"], tb["pert_mask"])
                delta_s = 1 - cosine(s_x[tb["pert"]], s_px, dim=-1)
                delta_t = 1 - cosine(tb["t_x"][tb["pert"]], tb["t_px"], dim=-1)
                hinge = torch.relu(delta_t + MARGIN - delta_s)
                loss = loss + (s_px - tb["t_px"]).norm(dim=-1).sum() + LAM * hinge.sum()
            loss = loss / s_x.shape[0]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), OPTIM["clip_norm"])
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.on_gpu:
            torch.cuda.synchronize()
        return loss.detach()

    def peak_memory(self) -> str:
        if not self.on_gpu:
            return "n/a on CPU"
        used = self.torch.cuda.max_memory_allocated()
        return f"{common.format_bytes(used)} (max_memory_allocated)"


# ----------------------------------------------------------------------------- report


def summarise(name, result, batches, student, peak) -> float:
    """Prints one framework's figures; returns its sequences/s."""
    seconds = sum(float(np.median(t)) for t in result["wall"])
    cpu_seconds = sum(float(np.median(t)) for t in result["cpu"])
    rows = sum(b["input_ids"].shape[0] for b in batches)
    lengths = [t for b in batches for t in common.real_lengths(b)]
    flops = common.model_flops(student, lengths, backward=True)
    seq_per_s = rows / seconds
    print(f"{name}_warmup_s={result['warmup_s']:.1f}")
    print(f"{name}_first_loss={result['first_loss']:.6f}")
    print(f"{name}_step_s={seconds / len(batches):.4f}")
    print(f"{name}_process_cpu_s_per_step={cpu_seconds / len(batches):.4f}")
    print(f"{name}_real_tokens_per_s={sum(lengths) / seconds:.1f}")
    print(f"{name}_mfu_real_tokens={flops / seconds / peak:.4f}")
    print(f"{name}_peak_memory={result['memory']}")
    print(f"{name}_seq_per_s={seq_per_s:.3f}")
    return seq_per_s


def measure(jax_runner, compiling, make_torch, num_batches: int, repeats: int, budget_s: float):
    """Warm-up step per runner, then rounds in which the runners alternate step by step.

    `compiling` is the future of `jax_runner.compile_all`, running while PyTorch builds and warms
    up. Returns ({name: {"wall", "cpu": [per batch [per round seconds]], ...}}, rounds run).
    """
    results = {}
    runners = [] if make_torch is None else [make_torch()]
    runners.append(jax_runner)
    for runner in runners:
        if runner is jax_runner:
            print(f"jax_compile_s={compiling.result():.1f} (background, every batch shape)")
        start = time.perf_counter()
        first_loss = float(runner.run(0))
        results[runner.name] = {
            "warmup_s": time.perf_counter() - start,
            "first_loss": first_loss,
            "wall": [[] for _ in range(num_batches)],
            "cpu": [[] for _ in range(num_batches)],
        }
    start = time.perf_counter()
    rounds = 0
    while rounds < repeats:
        round_start = time.perf_counter()
        for i in range(num_batches):
            for runner in runners:
                wall, cpu = time.perf_counter(), time.process_time()
                runner.run(i)
                results[runner.name]["wall"][i].append(time.perf_counter() - wall)
                results[runner.name]["cpu"][i].append(time.process_time() - cpu)
        rounds += 1
        now = time.perf_counter()
        if budget_s and now - start + (now - round_start) > budget_s:
            break
    for runner in runners:
        results[runner.name]["memory"] = runner.peak_memory()
    return results, rounds


def main(argv=None) -> None:
    args = parse_args(argv)
    layouts = getattr(step, "BATCH_LAYOUTS", ("stacked",))
    if args.jax_layout is None:
        args.jax_layout = "compact" if "compact" in layouts else "stacked"
    if args.jax_layout not in layouts:
        raise ValueError(f"--jax-layout={args.jax_layout}: this step.py supports {layouts}")
    if args.compile_cache:
        # Later runs skip XLA compilation; timed steps never include it either way.
        jax.config.update("jax_compilation_cache_dir", args.compile_cache)
    common.use_attention(args.jax_attention)
    clock = time.perf_counter()
    student, tokenizer = build_student(args)
    passages = build_passages(args, student, tokenizer)
    window = args.group_window if args.lengths == "filings" else 1
    plan = common.epoch_batches(passages, batch_size=args.batch_size, window=window, seed=args.seed)
    picks = common.stratified_batches(passages, plan, num_batches=args.num_batches)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    dim = student.spec.out_dim or student.config.width
    build = functools.partial(make_batch, args, passages, pad_id=pad_id, dim=dim)
    batches = [build(rows, seed=args.seed + i, layout="stacked") for i, rows in enumerate(picks)]
    jax_batches = [
        build(rows, seed=args.seed + i, layout=args.jax_layout) for i, rows in enumerate(picks)
    ]
    device = jax.devices()[0]
    peak, peak_source = common.peak_flops(device, dtype=args.dtype)  # before anything else runs
    jax_runner = JaxRunner(args, student, jax_batches)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        compiling = pool.submit(jax_runner.compile_all)
        pert = np.mean([b["has_pert"].mean() for b in batches])
        shapes = sorted({(b["input_ids"].shape, b["pert_input_ids"].shape) for b in jax_batches})
        print(f"preset={args.preset} device={device.device_kind} cores={os.cpu_count()}")
        print(
            f"model={args.model} layers={student.config.num_hidden_layers} "
            f"nonembedding_params={student.nonembedding_params} dtype={args.dtype} "
            f"batch={args.batch_size} pert_frac={pert:.3f} lengths={args.lengths} "
            f"max_length={args.max_length} jax_layout={args.jax_layout} "
            f"jax_attention={args.jax_attention} xla_flags={os.environ.get('XLA_FLAGS', '')!r}"
        )
        print(f"jax_batch_shapes(x,pi_x)={shapes}")
        print(f"peak_flops={peak:.4g} ({peak_source})")
        padding_study(args, passages, pad_id)
        lengths = [t for b in batches for t in common.real_lengths(b)]
        print(
            f"timed_batches={len(batches)} real_tokens_per_batch={sum(lengths) / len(batches):.0f}"
        )
        make_torch = None
        if not args.skip_torch:
            make_torch = functools.partial(TorchRunner, args, student, batches)
        print(f"setup_s={time.perf_counter() - clock:.1f}")
        results, rounds = measure(
            jax_runner, compiling, make_torch, len(batches), args.repeats, args.time_budget_s
        )
    print(f"timed_rounds={rounds} (steps per framework: {rounds * len(batches)})")
    seq = {
        name: summarise(name, result, batches if name == "torch" else jax_batches, student, peak)
        for name, result in results.items()
    }
    epoch_s = PAPER_PASSAGES / seq["jax"]
    print(
        f"jax_projected_epoch_s={epoch_s:.0f} ({PAPER_PASSAGES} passages at this throughput; "
        f"paper: {PAPER_EPOCH_SECONDS:.0f} s on one GPU)"
    )
    print(f"total_s={time.perf_counter() - clock:.1f}")
    if "torch" in seq:
        print(f"ratio_jax_over_torch={seq['jax'] / seq['torch']:.3f}")


if __name__ == "__main__":
    main()
