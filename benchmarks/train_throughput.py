"""Training throughput of the jit-compiled Caliber step, and of a PyTorch reference in the same run.

    python benchmarks/train_throughput.py --preset cpu-minilm        # this CPU box, < 1 minute
    python benchmarks/train_throughput.py --preset gpu-qwen3-0.6b    # one H100 / H200
    # The first steps of a `caliber_jax.train` run, its step program read from its cache:
    python benchmarks/train_throughput.py --preset gpu-qwen3-0.6b --data-dir DATA \
        --init-dir MODEL --compile-cache CACHE    # train's data.dir, model.init_dir, cache

Both frameworks get the same batches and the same weights. Batches come from the training
pipeline itself, with the data settings of the preset's config (`configs/demo.py` on CPU,
`configs/caliber.py` on GPU): real filings passages (a seeded share of them with a pi(x)) and
random teacher vectors are written as a `pipeline.TrainSource`, or, with `--data-dir` and
`--init-dir`, a split `caliber_jax.train` ran on (its `config.data.dir`, `config.model.init_dir`).
JAX gets the packed rows `train` runs: `pipeline.make_batch_fn` with `train.batch_options`, so
the row ladder is the one `train` computes over that split (with `--data-dir`, its own epoch);
PyTorch gets the same steps' passages padded (`--bucket-growth`, `--pert-rows-multiple`). The first
`--pool` / B steps of the epoch (all of a pool's epoch) are candidates, and a few, taken at
evenly spaced quantiles of their token count, stand for the epoch. JAX runs the step
`caliber_jax.train` builds, built as `train` builds it: `train.make_model_state` (dtype, remat,
attention, scan from the config, which the flags below set), `training_path.make_train_step`,
the config's whole loss with lambda and m traced, its optimizer and its schedule over the
epoch's length (`train.total_steps`), state donated, the same shardings. Its XLA program is then
the one `train` compiled for the same batch shape, byte for byte, and with `train`'s
`--compilation_cache` as `--compile-cache` (`cli.enable_compilation_cache`: the same compile
options) it loads from there instead of compiling (`jax_step_cache_hits=`).

PyTorch is the authors' recipe as one writes it in PyTorch (`benchmarks/torch_reference.py`):
transformers' model with SDPA attention, a forward over x padded to the batch max, a second
forward over only the perturbed rows, the same loss (eq. 4), gradient clipping, fused AdamW,
float32 weights under bf16 autocast on GPU; PyTorch has no packed path, so it gets the same
passages padded. `--torch-compile MODE` adds a second PyTorch row, the model under
`torch.compile` (`reduce-overhead`: CUDA graphs of the fixed shapes), and the final ratio is
against the faster of the two.

Timing: a warm-up step per framework (the JAX step compiles, or loads, every shape in a background
thread meanwhile), then rounds over the batches in which the two frameworks alternate step by step,
so both see the same machine load; every step is synchronised. A framework's time for a batch is
the median over rounds, and its throughput is rows over the sum of those medians. Rounds stop at
`--repeats`, or earlier once `--time-budget-s` would be exceeded, but never before each framework
has `--min-steps` (9) timed steps, however slow the machine. The CPU model and its vector flags are
printed first; the last line is `ratio_jax_over_torch=<jax seq/s / torch seq/s>`.

MFU counts model FLOPs on real (non-pad) tokens only (`common.model_flops`): 6 x non-embedding
params x tokens + 12 x layers x t^2 x (heads x head dim) per sequence, halved for causal
attention, over a peak FLOP/s that is printed with its source.
"""

import argparse
import concurrent.futures
import dataclasses
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# Run from anywhere, installed or not: the repo root (for `caliber_jax`, `benchmarks`) goes first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# Two frameworks share one GPU: JAX allocates as it goes instead of taking 75% up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common, profile_summary, torch_reference  # noqa: E402
from caliber_jax import (  # noqa: E402
    cli,
    compile_ahead,
    host,
    sharding,
    tokenization,
    train,
    training_path,
)
from caliber_jax.data import pipeline  # noqa: E402

PRESETS = {
    "cpu-minilm": {
        "config": "configs/demo.py",
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
        "config": "configs/caliber.py",
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
OPTIM_FIELDS = ("lr", "weight_decay", "warmup_frac", "b1", "b2", "eps", "clip_norm")
# torch.compile modes the PyTorch baseline may run (the strongest baseline).
TORCH_COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--config", help="config file whose data, loss and optim settings apply")
    parser.add_argument("--batch-size", type=int, help="global batch B")
    parser.add_argument("--pert-frac", type=float, help="share of rows that carry a pi(x)")
    parser.add_argument("--lengths", help="'filings' (real passages) or 'fixed:N' tokens")
    parser.add_argument("--max-length", type=int, help="token cap")
    parser.add_argument("--num-layers", type=int, help="keep the first N encoder layers")
    parser.add_argument(
        "--model",
        choices=("minilm", *common.QWEN3_SHAPES),
        help="architecture (default: the preset's; qwen3-tiny: CPU rehearsals)",
    )
    parser.add_argument(
        "--peak-flops",
        type=float,
        default=0.0,
        help="FLOP/s that MFU divides by (0: data sheet, else measured)",
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="compute dtype")
    parser.add_argument("--num-batches", type=int, help="distinct batches timed")
    parser.add_argument("--repeats", type=int, help="most timed rounds over the batches")
    parser.add_argument("--time-budget-s", type=float, help="stop rounds past this; 0 = none")
    parser.add_argument(
        "--min-steps", type=int, default=9, help="timed steps per framework before the budget"
    )
    parser.add_argument(
        "--pert-rows-multiple",
        type=int,
        help="config.data.pert_rows_multiple: 0 = a pi(x) row per x, m = the perturbed rows only, "
        "their count rounded up to m (default: the config's)",
    )
    parser.add_argument("--bucket-growth", type=float, help="config.data.bucket_growth")
    parser.add_argument(
        "--length-group-window",
        type=int,
        help="config.data.length_group_window for both frameworks (1 = plain shuffled order)",
    )
    parser.add_argument(
        "--pack-length",
        type=int,
        help="config.data.pack_length: L > 0 packs JAX's sequences into rows of L tokens, 0 = "
        "padded rows (default: the config's)",
    )
    parser.add_argument("--remat", default="none", help="JAX remat policy (none, full, dots)")
    parser.add_argument("--scan-layers", type=int, default=0, choices=(0, 1),
                        help="config.model.scan_layers: 1 = layers as one lax.scan")  # fmt: skip
    parser.add_argument("--skip-torch", action="store_true", help="time JAX only")
    parser.add_argument(
        "--torch-compile",
        default="none",
        choices=("none", *TORCH_COMPILE_MODES),
        help="also time PyTorch's model under torch.compile in this mode (a second PyTorch row, "
        "torch_compiled_*, beside eager; the ratio is against the faster): 'reduce-overhead' "
        "adds CUDA graphs (the timed batches' shapes are fixed), 'max-autotune-no-cudagraphs' "
        "autotunes Inductor's GEMMs (minutes of compile on a GPU)",
    )
    parser.add_argument(
        "--torch-compile-backend",
        default="inductor",
        help="torch.compile backend ('eager' / 'aot_eager': the option's wiring without code "
        "generation, for tests)",
    )
    parser.add_argument(
        "--profile-dir",
        help="after timing, trace --profile-steps JAX steps here "
        "and print where their device time went (benchmarks/profile_summary.py)",
    )
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("--filings", default=str(common.DEFAULT_FILINGS))
    parser.add_argument("--record-stride", type=int, default=18, help="read every k-th filing")
    parser.add_argument(
        "--pool",
        type=int,
        default=2048,
        help="passages sampled; with --data-dir, the epoch's first pool / B steps are candidates",
    )
    parser.add_argument(
        "--data-dir",
        help="a split `caliber_jax.train` ran on (its config.data.dir: train.jsonl and teacher "
        "stores): time the first steps of its epoch instead of a pool of --filings passages "
        "(needs --init-dir)",
    )
    parser.add_argument(
        "--init-dir",
        help="train's config.model.init_dir: the student's weights and tokenizer (default: "
        "--model, random weights)",
    )
    parser.add_argument(
        "--compile-cache",
        default=str(common.REPO_ROOT / "runs" / "xla_cache"),
        help="JAX persistent compilation cache directory, as train's --compilation_cache "
        "('' = off); train's own: its step programs load from there",
    )
    parser.add_argument(
        "--jax-attention",
        choices=("xla", "cudnn"),
        default="xla",
        help="the models' `attention=` option: xla (jax.nn.dot_product_attention) or cudnn "
        "(its fused cuDNN kernel with sequence lengths; GPU + bf16 only)",
    )
    parser.add_argument("--seed", type=int, default=0)
    common.add_host_malloc_flag(parser)
    args = parser.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.config = common.load_config(args.config)
    data = args.config.data
    if args.pert_rows_multiple is None:
        args.pert_rows_multiple = data.get("pert_rows_multiple", 0)
    if args.bucket_growth is None:
        args.bucket_growth = data.bucket_growth
    if args.pack_length is None:
        # The config's rows, but never shorter than the preset's longest sequence (the CPU
        # configs pack rows of their own max_length, 128; the cpu-minilm preset caps at 256).
        pack = data.get("pack_length", 0)
        args.pack_length = max(pack, args.max_length) if pack else 0
    if args.length_group_window is None:
        args.length_group_window = data.length_group_window
    if args.lengths != "filings":
        args.length_group_window = 1  # equal lengths: nothing to group
    if args.data_dir and not args.init_dir:
        raise ValueError("--data-dir needs --init-dir (train's model: its tokenizer and shapes)")
    apply_to_config(args)
    return args


def apply_to_config(args: argparse.Namespace) -> None:
    """Writes the flags into `args.config`, which `train`'s functions then read as in a run."""
    config = args.config
    config.seed = args.seed
    config.batch_size = args.batch_size
    config.data.max_length = args.max_length
    config.data.pack_length = args.pack_length
    config.data.length_group_window = args.length_group_window
    config.model.dtype = args.dtype
    config.model.remat = args.remat
    config.model.attention = args.jax_attention
    config.model.scan_layers = bool(args.scan_layers)
    if args.num_layers:
        config.model.num_layers = args.num_layers
    if args.data_dir:
        config.data.dir = args.data_dir
    if args.init_dir:
        config.model.init_dir = args.init_dir


def build_student(args) -> tuple[common.Student, object]:
    if args.init_dir:  # as train loads it (config.model.*)
        spec, flat = train.init_params(args.config)
        tokenizer = tokenization.load_tokenizer(train.student_tokenizer_dir(args.config))
        return common.Student(spec, flat), tokenizer
    if args.model == "minilm":
        student = common.load_minilm(num_layers=args.num_layers)
        tokenizer = tokenization.load_tokenizer(common.minilm_dir())
    else:
        config = common.QWEN3_SHAPES[args.model]
        if args.num_layers:
            config = dataclasses.replace(config, num_hidden_layers=args.num_layers)
        student = common.random_qwen3(config, seed=args.seed)
        tokenizer = tokenization.build_qwen3_tokenizer()
    return student, tokenizer


def fixed_texts(tokenizer, *, count: int, length: int) -> list[str]:
    """`count` texts of exactly `length` tokens, special tokens included ("a a ... a")."""
    cap = length + 8
    special = len(tokenization.tokenize(tokenizer, ["a"], max_length=cap)[0]) - 1
    text = " ".join(["a"] * (length - special))
    if len(tokenization.tokenize(tokenizer, [text], max_length=cap)[0]) != length:
        raise ValueError(f"--lengths=fixed:{length}: could not build a {length}-token text")
    return [text] * count


def build_rows(args, tokenizer) -> tuple[list[str], list[str]]:
    """(texts, perturbed): real passages, or fixed-length ones; pi(x) for `pert_frac` of rows."""
    if args.lengths == "filings":
        texts = common.sample_texts(
            args.filings, count=args.pool, record_stride=args.record_stride, seed=args.seed
        )
        return texts, common.choose_perturbations(texts, share=args.pert_frac, seed=args.seed)
    if args.lengths.startswith("fixed:"):
        length = int(args.lengths.removeprefix("fixed:"))
        texts = fixed_texts(tokenizer, count=args.batch_size * args.num_batches, length=length)
        # pi(x) changes the last word: same length, same work.
        chosen = np.random.default_rng(args.seed).permutation(len(texts))
        chosen = set(chosen[: round(args.pert_frac * len(texts))].tolist())
        perturbed = [t[:-1] + "b" if row in chosen else "" for row, t in enumerate(texts)]
        return texts, perturbed
    raise ValueError(f"--lengths={args.lengths!r}: expected 'filings' or 'fixed:N'")


def epoch_steps(args, source, tokenizer, *, mesh, lengths_cache=None):
    """The first `--pool` / B steps of an epoch of `source` as `caliber_jax.train` loads it, in
    two layouts: ([padded batch], [packed batch]), step by step the same passages.

    Packed (JAX): `pipeline.make_batch_fn` with `train.batch_options` of the config, so the row
    ladder, the epoch's order and the row counts are those of a `train` run on `source`; padded
    (PyTorch): the config's padding ladder and `--pert-rows-multiple`'s pi(x) layout.
    `lengths_cache`: where `train` keeps the split's token lengths (`train.lengths_cache`).
    """
    config, data = args.config, args.config.data

    def tokenize_fn(texts, max_length):
        return tokenization.tokenize(tokenizer, texts, max_length=max_length)

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    lengths = train.corpus_lengths(
        source, tokenize_fn, max_length=data.max_length, cache=lengths_cache
    )
    packed = pipeline.make_batch_fn(
        source,
        **train.batch_options(
            config, tokenize_fn, pad_id=pad_id, train=True, lengths=lengths,
            process_rows=sharding.process_batch_rows(mesh, config.batch_size),
        ),
    )  # fmt: skip
    padded = pipeline.make_batch_fn(
        source,
        batch_size=config.batch_size,
        seed=config.seed,
        shuffle=True,
        process_index=0,
        process_count=1,
        tokenize_fn=tokenize_fn,
        max_length=data.max_length,
        pad_id=pad_id,
        pad_to_multiple=data.pad_to_multiple,
        length_group_window=data.length_group_window,
        drop_remainder=data.drop_remainder,
        pert_rows_multiple=args.pert_rows_multiple,
        bucket_growth=args.bucket_growth,
        lengths=lengths,
    )
    steps = min(packed.per_epoch, -(-args.pool // config.batch_size))
    # The packed epoch may start with its most common row count (`pack_first_steps`): its step
    # i holds the planned batch first_epoch_order[i], which the padded epoch keeps in place.
    order = packed.first_epoch_order
    epoch, jax_epoch = [], []
    for i in range(steps):
        jax_epoch.append(packed(i))
        epoch.append(padded(i if order is None else int(order[i])))
        if not np.array_equal(epoch[-1]["index"], jax_epoch[-1]["index"]):
            raise AssertionError(f"step {i}: the padded and packed batches hold other passages")
    print(f"epoch_steps={steps} (the first of {packed.per_epoch}; packed row ladder "
          f"{packed.pack_ladder})")  # fmt: skip
    return epoch, jax_epoch


def padding_study(epoch: list[dict[str, np.ndarray]], jax_epoch: list[dict[str, np.ndarray]]):
    """Share of the token slots each framework computes that is padding, over the candidate
    steps (a pool's whole epoch).

    JAX: what the loader built (B x T + rows of pi(x) x T', or the packed rows); PyTorch: x and
    the real pi(x) rows each padded to their own batch maximum.
    """
    real = slots_jax = slots_torch = 0
    for batch, jax_batch in zip(epoch, jax_epoch, strict=True):
        lengths = common.real_lengths(batch)
        real += sum(lengths)
        slots_jax += token_slots(jax_batch)
        x_len = batch["attention_mask"].sum(axis=1)
        p_len = np.asarray(lengths[len(x_len) :])
        slots_torch += len(x_len) * x_len.max() + len(p_len) * p_len.max(initial=0)
    print(
        f"padding_frac(epoch of {len(epoch)} batches): jax={1 - real / slots_jax:.3f} "
        f"torch={1 - real / slots_torch:.3f}"
    )


def token_slots(batch: dict[str, np.ndarray]) -> int:
    """Token positions the JAX step computes for `batch` (real and padding)."""
    if "packed_ids" in batch:
        return batch["packed_ids"].size
    return batch["input_ids"].size + batch["pert_input_ids"].size


# ----------------------------------------------------------------------------- JAX


class JaxRunner:
    """The train step `caliber_jax.train` builds for the config (`training_path.make_train_step`:
    one jitted program per row count, state donated), on device-resident batches."""

    name = "jax"

    def __init__(self, args, student, batches, *, mesh, total_steps: int):
        self.device = mesh.devices.flat[0]
        config = args.config
        optimizer, schedule = train.optimizer_and_schedule(config, total_steps)
        # The model (dtype, remat, attention, scan), its params and state as `train` makes them.
        graphdef, params, abstract, init_fn = train.make_model_state(
            config, student.spec, student.flat, mesh=mesh, optimizer=optimizer,
            scan_layers=config.model.scan_layers,
        )  # fmt: skip
        state_shardings = jax.tree.map(lambda a: a.sharding, abstract)
        self.state = init_fn(sharding.put_sharded(params, state_shardings.params))
        del params
        path = training_path.choose(
            platform=self.device.platform,
            process_count=1,
            local_devices=1,
            pack_length=args.pack_length,
            pack_rungs=config.data.pack_rungs,
            compile_ahead=False,  # compile_all builds every timed shape before timing
            scan_layers=config.model.scan_layers,
        )
        static, weights = train.loss_arguments(config)
        self.train_step = training_path.make_train_step(
            path, graphdef=graphdef, optimizer=optimizer, schedule=schedule, loss_args=static,
            weights=weights, mesh=mesh, state_shardings=state_shardings,
        )  # fmt: skip
        self.train_fn = self.train_step.jitted
        self.weights = self.train_step.weights
        self.batches = [sharding.to_global(b, mesh) for b in batches]
        self.executables = {}

    @staticmethod
    def _shape_key(batch) -> tuple:
        return compile_ahead.shape_key(batch)  # the key train's own loop uses

    @staticmethod
    def ids_shapes(key: tuple) -> tuple:
        """The token-id arrays' shapes of a `_shape_key`: how the logs name a step shape."""
        return tuple(shape for name, shape, _ in key if "ids" in name)

    @property
    def compile_first(self) -> bool:
        """Off the CPU, shapes compile one at a time and before PyTorch starts: XLA's autotuner
        times candidate kernels on the device, and other work there would skew its picks."""
        return self.device.platform != "cpu"

    def compile_all(self) -> float:
        """Compiles the step for every distinct batch shape, or loads it from the persistent
        cache; returns the wall time, and prints how many programs came from the cache
        (`jax_step_cache_hits=`, of `jax_step_programs=`).

        Run in a background thread while PyTorch warms up: XLA's compiler is mostly
        single-threaded, so on a multi-core CPU the shapes compile in parallel, beside PyTorch,
        without touching timed steps. Off the CPU they compile one at a time (`compile_first`).
        """
        start = time.perf_counter()
        before = cli.COMPILE_STATS.snapshot()
        unique = {self._shape_key(b): b for b in self.batches}
        workers = 1 if self.compile_first else len(unique)

        def compile_one(key, batch):
            executable = self.train_fn.lower(self.state, batch, self.weights).compile()
            # As each shape finishes (a large model on a GPU takes minutes per shape).
            print(f"jax_compiled shape={self.ids_shapes(key)} "
                  f"at_s={time.perf_counter() - start:.1f}", flush=True)  # fmt: skip
            return executable

        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            compiled = pool.map(compile_one, unique, unique.values())
            self.executables = dict(zip(unique, compiled, strict=True))
        after = cli.COMPILE_STATS.snapshot()
        print(f"jax_step_programs={after['programs'] - before['programs']:.0f}")
        print(f"jax_step_cache_hits={after['cache_hits'] - before['cache_hits']:.0f}", flush=True)
        return time.perf_counter() - start

    def run(self, index: int) -> jax.Array:
        """One step on batch `index`, returned once the device is done (loss as a scalar)."""
        batch = self.batches[index]
        step_fn = self.executables.get(self._shape_key(batch), self.train_fn)
        self.state, metrics = step_fn(self.state, batch, self.weights)
        jax.block_until_ready((self.state, metrics))
        return metrics["train/loss"]

    def peak_memory(self) -> tuple[float, str]:
        """(bytes, what they are): the device's peak, or on a CPU XLA's buffer assignment of the
        longest batch's step."""
        stats = self.device.memory_stats()
        if stats and "peak_bytes_in_use" in stats:
            return float(stats["peak_bytes_in_use"]), "peak_bytes_in_use"
        longest = self._shape_key(max(self.batches, key=token_slots))
        executable = self.executables.get(longest)
        if executable is None:
            executable = self.train_fn.lower(self.state, self.batches[0], self.weights).compile()
        analysis = executable.memory_analysis()
        used = (
            analysis.argument_size_in_bytes
            + analysis.output_size_in_bytes
            - analysis.alias_size_in_bytes
            + analysis.temp_size_in_bytes
        )
        return float(used), "XLA buffer assignment, longest batch"


# ----------------------------------------------------------------------------- PyTorch


class TorchRunner:
    """The authors' recipe in plain PyTorch: forward x, forward the perturbed rows, eq. 4.

    transformers' model with SDPA attention, float32 weights (the master copy) under bf16
    autocast on a GPU, fused AdamW; with `compile_mode`, the model under `torch.compile` (one
    graph per padded shape, `dynamic=False`; CUDA graphs in the modes that use them). PyTorch
    has no packed path here: it gets the same passages padded (x to the batch max, the real pi(x)
    rows to theirs).
    """

    def __init__(self, args, student, batches, *, total_steps: int, compile_mode: str = "none",
                 compile_backend: str = "inductor"):  # fmt: skip
        import torch

        self.torch = torch
        self.name = "torch" if compile_mode == "none" else "torch_compiled"
        self.on_gpu = torch.cuda.is_available()
        self.device = "cuda" if self.on_gpu else "cpu"
        torch.set_num_threads(host.usable_cores())
        self.model = common.torch_model(student, device=self.device)  # dropout off, as in JAX
        self.model.train()
        self.forward = self.model
        self.cudagraphs = False
        if compile_mode != "none":
            self.forward = torch_reference.compile_model(
                self.model, mode=compile_mode, backend=compile_backend,
                shapes=2 * len(batches),  # x and pi(x) of each batch
            )  # fmt: skip
            self.cudagraphs = self.on_gpu and torch_reference.uses_cudagraphs(
                compile_mode, compile_backend
            )
        spec = {key: args.config.optim[key] for key in OPTIM_FIELDS}
        self.optimizer, self.scheduler = torch_reference.make_optimizer(
            self.model, {**spec, "total_steps": total_steps}
        )
        self.clip_norm = spec["clip_norm"]
        static, weights = train.loss_arguments(args.config)
        if static["objective"] != "caliber" or static["structure_weight"] or static["query_weight"]:
            raise ValueError(
                "the PyTorch reference implements eq. 4 only (loss.objective='caliber', no "
                "structure or query term)"
            )
        self.loss_args = dict(
            lam=float(weights["lam"]), margin=float(weights["margin"]),
            reduction=static["reduction"], perturb_weight=static["perturb_weight"],
        )  # fmt: skip
        self.autocast = torch.autocast(
            device_type=self.device, dtype=torch.bfloat16, enabled=self.on_gpu
        )
        self.batches = [self._to_torch(b) for b in batches]

    def _to_torch(self, batch):
        """x padded to the batch max; the real pi(x) rows padded to their own max."""
        x_len = int(batch["attention_mask"].sum(axis=1).max())
        rows, x_rows = common.pert_rows(batch)
        p_len = int(batch["pert_attention_mask"][rows].sum(axis=1).max(initial=0))
        out = {
            "ids": batch["input_ids"][:, :x_len],
            "mask": batch["attention_mask"][:, :x_len],
            "pert_ids": batch["pert_input_ids"][rows, :p_len],
            "pert_mask": batch["pert_attention_mask"][rows, :p_len],
            "pert": x_rows,
            "t_x": batch["teacher_x"],
            "t_px": batch["teacher_px"][x_rows],
        }
        return {
            k: self.torch.from_numpy(np.ascontiguousarray(v)).to(self.device)
            for k, v in out.items()
        }

    def run(self, index: int):
        torch = self.torch
        tb = self.batches[index]
        if self.cudagraphs:  # a new step: the graphs' earlier outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        with self.autocast:
            s_x = torch_reference.embed(self.forward, tb["ids"], tb["mask"])
            s_px = s_x[:0]
            if tb["pert"].numel():
                s_px = torch_reference.embed(self.forward, tb["pert_ids"], tb["pert_mask"])
            loss = torch_reference.caliber_loss(
                s_x, s_px, tb["t_x"], tb["t_px"], tb["pert"], **self.loss_args
            )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.on_gpu:
            torch.cuda.synchronize()
        return loss.detach()

    def peak_memory(self) -> tuple[float, str]:
        if not self.on_gpu:
            return float("nan"), "n/a on CPU"
        return float(self.torch.cuda.max_memory_allocated()), "max_memory_allocated"


def make_torch_runners(args, student, batches, *, total_steps: int) -> list[TorchRunner]:
    """Eager PyTorch, and with `--torch-compile` the same model compiled (its own weights and
    optimizer, the same initial values); both schedules `total_steps` long, as JAX's."""
    runners = [TorchRunner(args, student, batches, total_steps=total_steps)]
    if args.torch_compile != "none":
        runners.append(TorchRunner(args, student, batches, total_steps=total_steps,
                                   compile_mode=args.torch_compile,
                                   compile_backend=args.torch_compile_backend))  # fmt: skip
    return runners


# ----------------------------------------------------------------------------- report


def summarise(name, result, batches, student, peak) -> float:
    """Prints one framework's figures; returns its sequences/s."""
    seconds = sum(float(np.median(t)) for t in result["wall"])
    cpu_seconds = sum(float(np.median(t)) for t in result["cpu"])
    rows = sum(b["has_pert"].shape[0] for b in batches)
    lengths = [t for b in batches for t in common.real_lengths(b)]
    flops = common.model_flops(student, lengths, backward=True)
    seq_per_s = rows / seconds
    print(f"{name}_warmup_s={result['warmup_s']:.1f}")
    print(f"{name}_first_loss={result['first_loss']:.6f}")
    print(f"{name}_step_s={seconds / len(batches):.4f}")
    print(f"{name}_process_cpu_s_per_step={cpu_seconds / len(batches):.4f}")
    print(f"{name}_real_tokens_per_s={sum(lengths) / seconds:.1f}")
    print(f"{name}_mfu_real_tokens={flops / seconds / peak:.4f}")
    used, source = result["memory"]
    print(f"{name}_peak_memory={common.format_bytes(used) if used == used else '-'} ({source})")
    print(f"{name}_peak_memory_bytes={used:.0f}")
    print(f"{name}_seq_per_s={seq_per_s:.3f}")
    return seq_per_s


def measure(
    jax_runner, compiling, make_torch, num_batches: int, *, repeats: int, budget_s: float,
    min_steps: int, compile_first: bool = False,
):  # fmt: skip
    """Warm-up step per runner, then rounds in which the runners alternate step by step.

    `make_torch` returns a PyTorch runner or a list of them (eager, compiled). `compiling` is the
    future of `jax_runner.compile_all`, running while PyTorch builds and warms up, or, with
    `compile_first`, awaited before PyTorch touches the device: XLA's GPU autotuner times
    candidate kernels on the GPU, and PyTorch's work there would skew its picks. Rounds stop
    after `repeats`, or once the next round would pass `budget_s` (0: no budget), but not before
    every runner has `min_steps` timed steps. Returns ({name: {"wall", "cpu": [per batch [per
    round seconds]], ...}}, rounds run).
    """
    results = {}
    if compile_first:
        print(f"jax_compile_s={compiling.result():.1f} (every batch shape, before PyTorch)")
    made = [] if make_torch is None else make_torch()
    runners = list(made) if isinstance(made, list | tuple) else [made]
    runners.append(jax_runner)
    for runner in runners:
        if runner is jax_runner and not compile_first:
            print(f"jax_compile_s={compiling.result():.1f} (background, every batch shape)")
        start = time.perf_counter()
        first_loss = float(runner.run(0))
        results[runner.name] = {
            "warmup_s": time.perf_counter() - start,
            "first_loss": first_loss,
            "wall": [[] for _ in range(num_batches)],
            "cpu": [[] for _ in range(num_batches)],
        }
    min_rounds = -(-min_steps // num_batches)
    start = time.perf_counter()
    rounds = 0
    while rounds < max(repeats, min_rounds):
        round_start = time.perf_counter()
        for i in range(num_batches):
            for runner in runners:
                wall, cpu = time.perf_counter(), time.process_time()
                runner.run(i)
                results[runner.name]["wall"][i].append(time.perf_counter() - wall)
                results[runner.name]["cpu"][i].append(time.process_time() - cpu)
        rounds += 1
        now = time.perf_counter()
        over_budget = budget_s and now - start + (now - round_start) > budget_s
        if rounds >= min_rounds and (over_budget or rounds >= repeats):
            break
    for runner in runners:
        results[runner.name]["memory"] = runner.peak_memory()
    return results, rounds


def profile(jax_runner, directory: str, *, steps: int) -> None:
    """Traces `steps` more JAX steps (every shape is compiled by now) and prints the summary's
    `profile_*` lines; the summary itself goes to DIRECTORY/summary.json."""
    with jax.profiler.trace(directory, create_perfetto_trace=True):
        for i in range(steps):
            jax_runner.run(i % len(jax_runner.batches))
    summary = profile_summary.summarize(profile_summary.read_trace(directory), steps=steps)
    path = Path(directory) / "summary.json"
    path.write_text(json.dumps(summary, indent=1))
    print("\n".join(profile_summary.key_values(summary)))
    print(f"profile_summary={path}")


def main(argv=None) -> None:
    args = parse_args(argv)
    host_malloc = common.apply_host_malloc(args.host_malloc)
    print(f"cpu={common.cpu_description()}")
    print(f"host_malloc={host_malloc}")
    print(f"load_average_1m={os.getloadavg()[0]:.2f}")
    # As the entry points set it (`--compilation_cache`): the same compile options, so a program
    # `train` compiled into this directory loads from there. Timed steps never include either.
    cli.enable_compilation_cache(args.compile_cache)
    cli.COMPILE_STATS.start()
    clock = time.perf_counter()
    student, tokenizer = build_student(args)
    dim = student.spec.out_dim or student.config.width
    device = jax.devices()[0]
    mesh = sharding.make_mesh(devices=[device])
    with tempfile.TemporaryDirectory(prefix="train_throughput_") as tmp:
        if args.data_dir:  # train's split, and the token lengths train kept beside it
            source = train.make_source(args.config, "train", dim)
            tokenizer_dir = train.student_tokenizer_dir(args.config)
            cache = train.lengths_cache(args.config, "train", tokenizer_dir)
            print(f"source={args.data_dir} ({len(source)} passages: train's epoch)")
        else:
            texts, perturbed = build_rows(args, tokenizer)
            source = common.write_source(tmp, texts, perturbed, dim=dim, seed=args.seed)
            cache = None
            print(f"source={args.lengths} ({len(source)} passages)")
        epoch, jax_epoch = epoch_steps(args, source, tokenizer, mesh=mesh, lengths_cache=cache)
        # The schedule of a `train` run over this source: its constants are in the step program.
        total_steps = train.total_steps(args.config, len(source))
    picks = common.stratified_picks(
        [int(b["attention_mask"].sum()) for b in epoch], num_batches=args.num_batches
    )
    batches = [epoch[i] for i in picks]
    jax_batches = [jax_epoch[i] for i in picks]
    peak, peak_source = args.peak_flops, "--peak-flops"
    if not peak:
        peak, peak_source = common.peak_flops(device, dtype=args.dtype)  # before anything else runs
    jax_runner = JaxRunner(args, student, jax_batches, mesh=mesh, total_steps=total_steps)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        compiling = pool.submit(jax_runner.compile_all)
        pert = np.mean([b["has_pert"].mean() for b in batches])
        shapes = sorted({JaxRunner._shape_key(b) for b in jax_batches})
        shapes = [JaxRunner.ids_shapes(key) for key in shapes]
        print(f"preset={args.preset} device={device.device_kind} cores={host.usable_cores()}")
        print(
            f"model={args.init_dir or args.model} layers={student.config.num_hidden_layers} "
            f"nonembedding_params={student.nonembedding_params} dtype={args.dtype} "
            f"batch={args.batch_size} pert_frac={pert:.3f} lengths={args.lengths} "
            f"max_length={args.max_length} pert_rows_multiple={args.pert_rows_multiple} "
            f"bucket_growth={args.bucket_growth} pack_length={args.pack_length} "
            f"length_group_window={args.length_group_window} "
            f"jax_attention={args.jax_attention} remat={args.remat} "
            f"schedule_steps={total_steps} xla_flags={os.environ.get('XLA_FLAGS', '')!r}"
        )
        print(f"jax_step={jax_runner.train_step.path.describe()}")
        print(f"jax_batch_shapes(token ids)={shapes}")
        print(f"peak_flops={peak:.4g} ({peak_source})")
        padding_study(epoch, jax_epoch)
        lengths = [t for b in batches for t in common.real_lengths(b)]
        print(
            f"timed_batches={len(batches)} real_tokens_per_batch={sum(lengths) / len(batches):.0f}"
        )
        make_torch = None
        if not args.skip_torch:
            make_torch = functools.partial(
                make_torch_runners, args, student, batches, total_steps=total_steps
            )
            print(f"torch_compile={args.torch_compile} backend={args.torch_compile_backend} "
                  "(PyTorch: the same passages, padded; it has no packed path)")  # fmt: skip
        print(f"setup_s={time.perf_counter() - clock:.1f}")
        results, rounds = measure(
            jax_runner, compiling, make_torch, len(batches), repeats=args.repeats,
            budget_s=args.time_budget_s, min_steps=args.min_steps,
            compile_first=jax_runner.compile_first,
        )  # fmt: skip
    print(f"timed_rounds={rounds} (steps per framework: {rounds * len(batches)})")
    seq = {
        name: summarise(name, result, batches, student, peak) for name, result in results.items()
    }
    epoch_s = PAPER_PASSAGES / seq["jax"]
    print(
        f"jax_projected_epoch_s={epoch_s:.0f} ({PAPER_PASSAGES} passages at this throughput; "
        f"paper: {PAPER_EPOCH_SECONDS:.0f} s on one GPU)"
    )
    if args.profile_dir:
        profile(jax_runner, args.profile_dir, steps=args.profile_steps)
    print(f"total_s={time.perf_counter() - clock:.1f}")
    if "torch" in seq:
        # Against the strongest PyTorch row (eager or compiled); each row's ratio too.
        strongest = max((name for name in seq if name != "jax"), key=seq.get)
        for name in sorted(set(seq) - {"jax"}):
            row = "torch_eager" if name == "torch" else name
            print(f"ratio_jax_over_{row}={seq['jax'] / seq[name]:.3f}")
        print(f"torch_strongest={strongest}")
        print(f"ratio_jax_over_torch={seq['jax'] / seq[strongest]:.3f}")


if __name__ == "__main__":
    common.run_main(main)
