"""Teacher-style inference throughput (passages/s, MFU) of the JAX `Embedder` against PyTorch.

    python benchmarks/encode_throughput.py --preset cpu-minilm           # this CPU box
    python benchmarks/encode_throughput.py --preset gpu-qwen3-8b-encode  # one H100 / H200
    python benchmarks/encode_throughput.py --preset cpu-mpnet            # the MPNet study's teacher
    python benchmarks/encode_throughput.py --preset cpu-mpnet --model-dir DIR   # any local HF dir
    python benchmarks/encode_throughput.py --preset cpu-mpnet --model-dir DIR --dtype bfloat16 \
        --float32-baseline          # bfloat16 against float32 in each framework, in one run

JAX runs `Embedder.encode_ids`, the path `embed_teacher` takes: passages sorted by length, cut into
batches, padded to a few bucket lengths (`padding.bucket_length`), one jit-compiled forward per
batch, vectors copied back to the host. PyTorch runs what a sentence-transformers user gets:
transformers' model with SDPA attention in inference mode (bf16 weights on GPU, float32 weights
under bfloat16 autocast on the CPU, as the library's torch teacher with dtype "auto"), the same
length-sorted batches padded to the batch max, mean pooling, normalisation, vectors to the host.
Both encode the same real filings passages. After a warm-up pass (JAX compiles every bucket
shape), the frameworks alternate timed passes over all passages; each one's time is the median.
The last line printed is `ratio_jax_over_torch=<jax passages/s / torch passages/s>`.

MFU counts forward FLOPs on real tokens: 2 x non-embedding params x tokens + 4 x layers x t^2 x
(heads x head dim) per passage, halved for causal attention.
"""

import argparse
import dataclasses
import os
import statistics
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
from caliber_jax import embedder, host, tokenization  # noqa: E402
from caliber_jax.data import padding  # noqa: E402
from caliber_jax.models import embedding, hf  # noqa: E402

PRESETS = {
    "cpu-minilm": {
        "model": "minilm",
        "dtype": "float32",
        "batch_size": 64,
        "max_length": 256,
        "passages": 256,
        "repeats": 2,
    },
    # all-mpnet-base-v2 (scripts/fetch_mpnet.py) at the MPNet study's teacher settings
    # (configs/study_mpnet.py: float32, batch 32, the 128-token data); real weights both sides.
    "cpu-mpnet": {
        "model": "dir",
        "model_dir": "runs/models/all-mpnet-base-v2",
        "dtype": "float32",
        "batch_size": 32,
        "max_length": 128,
        "passages": 128,
        "repeats": 2,
    },
    "gpu-qwen3-8b-encode": {
        "model": "qwen3-8b",
        "dtype": "bfloat16",
        "batch_size": 64,
        # embed_teacher's budget (configs/caliber.py's teacher.tokens_per_batch)
        "tokens_per_batch": common.load_config("configs/caliber.py").teacher.tokens_per_batch,
        "max_length": 512,
        "passages": 4096,
        "repeats": 3,
    },
}
# The paper's corpus: 606K passages plus 233K perturbations for the teacher to encode (Sec. 5.1).
PAPER_TEACHER_TEXTS = 606_000 + 233_000


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="compute dtype")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument(
        "--tokens-per-batch",
        type=int,
        help="token slots per batch (`Embedder.encode_ids`: rows of a length rung fill it; "
        "0 = --batch-size rows; default: the preset's)",
    )
    parser.add_argument("--max-length", type=int)
    parser.add_argument("--passages", type=int, help="passages encoded per timed pass")
    parser.add_argument("--repeats", type=int, help="timed passes per framework")
    parser.add_argument("--num-layers", type=int, help="keep the first N layers")
    parser.add_argument(
        "--model",
        choices=("minilm", "dir", *common.QWEN3_SHAPES),
        help="architecture (default: the preset's; qwen3-tiny: CPU rehearsals)",
    )
    parser.add_argument(
        "--peak-flops",
        type=float,
        default=0.0,
        help="FLOP/s that MFU divides by (0: data sheet, else measured)",
    )
    parser.add_argument(
        "--model-dir", help="a local HF / sentence-transformers directory (presets with model=dir)"
    )
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument(
        "--float32-baseline",
        action="store_true",
        help="with --dtype bfloat16: also time both frameworks in float32, alternating in the "
        "same run (the bfloat16 speed-up of each, on this machine)",
    )
    parser.add_argument("--filings", default=str(common.DEFAULT_FILINGS))
    parser.add_argument("--record-stride", type=int, default=18)
    parser.add_argument(
        "--compile-cache",
        default=str(common.REPO_ROOT / "runs" / "xla_cache"),
        help="JAX persistent compilation cache directory ('' = off)",
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
    if args.tokens_per_batch is None:
        args.tokens_per_batch = 0
    return args


def build_models(args):
    """(spec, JAX `Embedder`, torch model factory, tokenizer)."""
    dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    if args.model == "minilm":
        student = common.load_minilm(num_layers=args.num_layers)
        spec = student.spec
        graphdef, params = embedding.split_model(
            spec, student.flat, dtype=dtype, attention=args.jax_attention
        )
        tokenizer = tokenization.load_tokenizer(common.minilm_dir())
        make_torch = lambda device: common.torch_model(student, device=device)  # noqa: E731
    elif args.model == "dir":
        model_dir = Path(args.model_dir)
        spec = embedding.read_spec(model_dir, pooling="mean", num_layers=args.num_layers)
        flat = embedding.load_flat_params(model_dir, spec)
        graphdef, params = embedding.split_model(
            spec, flat, dtype=dtype, attention=args.jax_attention
        )
        tokenizer = tokenization.load_tokenizer(model_dir)
        make_torch = lambda device: common.torch_from_dir(  # noqa: E731
            model_dir, num_layers=args.num_layers, device=device
        )
    else:
        config = common.QWEN3_SHAPES[args.model]
        if args.num_layers:
            config = dataclasses.replace(config, num_hidden_layers=args.num_layers)
        spec = embedding.ModelSpec("qwen3", config, "mean", None, config.to_hf())
        graphdef, params = common.random_model(
            spec, dtype=dtype, seed=args.seed, attention=args.jax_attention
        )
        tokenizer = tokenization.build_qwen3_tokenizer()
        make_torch = lambda device: common.torch_random_qwen3(config, device=device)  # noqa: E731
    # No tokenizer object: both sides get the same token ids; the pad id is the config's.
    model = embedder.Embedder(spec, graphdef, params, None, max_length=args.max_length)
    return spec, model, make_torch, tokenizer


class TorchEncoder:
    """Length-sorted batches padded to the batch max, mean pooled, as sentence-transformers does."""

    def __init__(self, make_model, *, pad_id: int, plan_fn, bf16: bool, name="torch"):
        import torch

        self.name = name
        self.torch = torch
        self.on_gpu = torch.cuda.is_available()
        self.device = "cuda" if self.on_gpu else "cpu"
        torch.set_num_threads(host.usable_cores())
        model = make_model(self.device)
        if bf16 and self.on_gpu:
            model = model.to(torch.bfloat16)
        # On the CPU, float32 weights under bfloat16 autocast: the library's torch teacher with
        # dtype "auto" (`data.torch_teacher`), float32 norms as in the JAX side.
        self.autocast = bf16 and not self.on_gpu
        self.model = model.eval()
        self.pad_id = pad_id
        self.plan_fn = plan_fn  # lengths -> JAX's batches (`padding.batch_plan`)

    def encode(self, seqs: list[list[int]]) -> np.ndarray:
        torch = self.torch
        out = np.zeros((len(seqs), self.model.config.hidden_size), np.float32)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast)
        with torch.inference_mode(), autocast:
            for rows, _, _ in self.plan_fn([len(s) for s in seqs]):
                length = max(len(seqs[r]) for r in rows)  # the batch max, not a rung
                ids, mask = padding.pad_rows(
                    [seqs[r] for r in rows], rows=len(rows), length=length, pad_id=self.pad_id
                )
                ids = torch.from_numpy(ids).to(self.device)
                mask = torch.from_numpy(mask).to(self.device)
                hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
                weights = mask.unsqueeze(-1).float()
                pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
                out[rows] = torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy()
        return out

    def peak_memory(self) -> str:
        if not self.on_gpu:
            return "n/a on CPU"
        return (
            f"{common.format_bytes(self.torch.cuda.max_memory_allocated())} (max_memory_allocated)"
        )


class JaxEncoder:
    """`Embedder.encode_ids`: the production teacher path."""

    def __init__(
        self, model: embedder.Embedder, *, batch_size: int, tokens_per_batch: int, name="jax"
    ):
        self.name = name
        self.model = model
        self.batch_size = batch_size
        self.tokens_per_batch = tokens_per_batch

    def encode(self, seqs: list[list[int]]) -> np.ndarray:
        return self.model.encode_ids(
            seqs, batch_size=self.batch_size, tokens_per_batch=self.tokens_per_batch
        )

    def peak_memory(self) -> str:
        return f"{common.format_bytes(self.peak_memory_bytes())} ({self.memory_source()})"

    def peak_memory_bytes(self) -> float:
        """The device's peak; on a CPU (no memory stats) the params' bytes."""
        stats = jax.devices()[0].memory_stats()
        if stats and "peak_bytes_in_use" in stats:
            return float(stats["peak_bytes_in_use"])
        return float(sum(x.nbytes for x in jax.tree.leaves(self.model.params)))

    def memory_source(self) -> str:
        stats = jax.devices()[0].memory_stats()
        if stats and "peak_bytes_in_use" in stats:
            return "peak_bytes_in_use"
        return "params only: no device memory stats on CPU"


def main(argv=None) -> None:
    args = parse_args(argv)
    host_malloc = common.apply_host_malloc(args.host_malloc)
    if args.compile_cache:
        jax.config.update("jax_compilation_cache_dir", args.compile_cache)
    print(f"cpu={common.cpu_description()}")
    print(f"host_malloc={host_malloc}")
    print(f"load_average_1m={os.getloadavg()[0]:.2f}")
    clock = time.perf_counter()
    spec, model, make_torch, tokenizer = build_models(args)
    texts = common.sample_texts(
        args.filings, count=args.passages, record_stride=args.record_stride, seed=args.seed
    )
    seqs = tokenization.tokenize(tokenizer, texts, max_length=args.max_length)
    lengths = [len(s) for s in seqs]
    device = jax.devices()[0]
    peak, peak_source = args.peak_flops, "--peak-flops"
    if not peak:
        peak, peak_source = common.peak_flops(device, dtype=args.dtype)
    student = common.Student(spec=spec, flat=_flat_shapes(model.params))
    flops = common.model_flops(student, lengths, backward=False)

    def plan_fn(lengths):  # the batches encode_ids makes (one device)
        return padding.batch_plan(
            lengths, batch_size=args.batch_size, max_length=args.max_length,
            tokens_per_batch=args.tokens_per_batch,
        )  # fmt: skip

    plan = plan_fn(lengths)
    buckets = sorted({(rows, length) for _, rows, length in plan}, key=lambda b: b[1])
    print(f"preset={args.preset} device={device.device_kind} cores={host.usable_cores()}")
    print(
        f"model={args.model} layers={spec.config.num_hidden_layers} "
        f"nonembedding_params={student.nonembedding_params} dtype={args.dtype} "
        f"batch={args.batch_size} tokens_per_batch={args.tokens_per_batch} "
        f"passages={len(seqs)} mean_tokens={np.mean(lengths):.1f} "
        f"max_length={args.max_length} jax_buckets={buckets} jax_attention={args.jax_attention}"
    )
    print(f"peak_flops={peak:.4g} ({peak_source})")
    slots_jax = sum(rows * length for _, rows, length in plan)
    slots_torch = sum(len(rows) * max(lengths[r] for r in rows) for rows, _, _ in plan)
    print(f"jax_padding_frac={1 - sum(lengths) / slots_jax:.3f}")
    print(f"torch_padding_frac={1 - sum(lengths) / slots_torch:.3f}")

    def torch_encoder(*, bf16: bool, name: str) -> TorchEncoder:
        return TorchEncoder(make_torch, pad_id=model.pad_id, plan_fn=plan_fn, bf16=bf16, name=name)

    encoders = [
        JaxEncoder(model, batch_size=args.batch_size, tokens_per_batch=args.tokens_per_batch)
    ]
    if not args.skip_torch:
        encoders.insert(0, torch_encoder(bf16=args.dtype == "bfloat16", name="torch"))
    if args.float32_baseline:
        if args.dtype != "bfloat16":
            raise SystemExit("--float32-baseline compares bfloat16 with float32: add --dtype "
                             "bfloat16")  # fmt: skip
        _, model32, _, _ = build_models(argparse.Namespace(**{**vars(args), "dtype": "float32"}))
        encoders.append(
            JaxEncoder(
                model32,
                batch_size=args.batch_size,
                tokens_per_batch=args.tokens_per_batch,
                name="jax_float32",
            )
        )
        if not args.skip_torch:
            encoders.append(torch_encoder(bf16=False, name="torch_float32"))
    vectors = {}
    for encoder in encoders:
        start = time.perf_counter()
        vectors[encoder.name] = encoder.encode(seqs)
        print(f"{encoder.name}_warmup_s={time.perf_counter() - start:.1f}")
    if "torch" in vectors and args.model in ("minilm", "dir"):
        # Same weights in both frameworks: the vectors must agree.
        cosine = np.sum(vectors["jax"] * vectors["torch"], axis=-1)
        print(f"min_cosine_jax_vs_torch={cosine.min():.6f}")
    for name in ("jax", "torch"):
        if f"{name}_float32" in vectors:  # what bfloat16 moves, against float32
            cosine = np.sum(vectors[name] * vectors[f"{name}_float32"], axis=-1)
            print(f"min_cosine_{name}_bfloat16_vs_float32={cosine.min():.6f}")
    times = {encoder.name: [] for encoder in encoders}
    for _ in range(args.repeats):
        for encoder in encoders:
            start = time.perf_counter()
            encoder.encode(seqs)
            times[encoder.name].append(time.perf_counter() - start)
    rates = {}
    for encoder in encoders:
        seconds = statistics.median(times[encoder.name])
        rates[encoder.name] = len(seqs) / seconds
        print(f"{encoder.name}_pass_s={seconds:.3f}")
        print(f"{encoder.name}_real_tokens_per_s={sum(lengths) / seconds:.1f}")
        print(f"{encoder.name}_mfu_real_tokens={flops / seconds / peak:.4f}")
        print(f"{encoder.name}_peak_memory={encoder.peak_memory()}")
        if isinstance(encoder, JaxEncoder):
            print(f"{encoder.name}_peak_memory_bytes={encoder.peak_memory_bytes():.0f}")
        print(f"{encoder.name}_passages_per_s={rates[encoder.name]:.2f}")
    hours = PAPER_TEACHER_TEXTS / rates["jax"] / 3600
    print(f"jax_projected_teacher_hours={hours:.2f} ({PAPER_TEACHER_TEXTS} texts, one device)")
    print(f"total_s={time.perf_counter() - clock:.1f}")
    for name in ("jax", "torch"):
        if f"{name}_float32" in rates:
            print(f"ratio_{name}_bfloat16_over_float32="
                  f"{rates[name] / rates[f'{name}_float32']:.3f}")  # fmt: skip
    if "torch" in rates:
        print(f"ratio_jax_over_torch={rates['jax'] / rates['torch']:.3f}")


def _flat_shapes(params) -> dict[str, np.ndarray]:
    """Flat `encoder.*` names with zero-stride placeholders of the param shapes (for counting)."""
    pure = nnx.to_pure_dict(params)
    flat = hf.flatten(pure)
    return {k: np.broadcast_to(np.float32(0), v.shape) for k, v in flat.items()}


if __name__ == "__main__":
    common.run_main(main)
