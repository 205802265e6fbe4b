"""One epoch of training, end to end: `python -m caliber_jax.train` vs a PyTorch reference loop.

    python benchmarks/train_end_to_end.py                       # configs/study.py scale, ~10 min
    python benchmarks/train_end_to_end.py --max-passages 640    # a smaller epoch

Data: real filing passages cut and perturbed by `python -m caliber_jax.prepare`, teacher vectors
from `python -m caliber_jax.embed_teacher` (the study's all-MiniLM-L6-v2 teacher), both run once
into `runs/bench_e2e/<filings>_<max passages>/data` and reused (not timed). Hyperparameters come
from the config (`configs/study.py`: the 3-layer MiniLM student, batch 32, max length 128, lr
5e-4, linear warmup/decay, lambda 0.5, margin 0.05), with validation off (the reference has none).

Both frameworks run as subprocesses, timed from launch to exit, so imports, model loading,
tokenization, XLA compiles (a fresh `--compilation_cache` unless `--compilation-cache DIR`),
the input pipeline and checkpoints are all counted:
  - JAX: `python -m caliber_jax.train --config <config> --config.*=<overrides>`, exactly as a user
    runs it; steps from its `summary.json`.
  - PyTorch: `benchmarks/torch_reference.py`, the authors' loop structure (transformers model,
    dynamic padding to the batch max, a second forward over the perturbed rows only, eq. 4, AdamW
    on the same schedule, same batch size), on the same batches in the same order: the row
    indices of `pipeline.make_epoch_batches` with the config's seed and length-grouping window,
    which is what the JAX loader plays.
Rows per framework = the real rows of the steps it ran. Prints the CPU model and flags first, and
last `ratio_jax_over_torch=<JAX seq/s / PyTorch seq/s>` (= PyTorch wall / JAX wall).
"""

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# Run from anywhere, installed or not: the repo root (for `caliber_jax`, `benchmarks`) goes first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from caliber_jax import embed_teacher, tokenization, train  # noqa: E402
from caliber_jax.data import pipeline  # noqa: E402

REPO_ROOT = common.REPO_ROOT
TORCH_REFERENCE = Path(__file__).resolve().parent / "torch_reference.py"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/study.py", help="config file (as train)")
    parser.add_argument("--filings", default=str(common.DEFAULT_FILINGS), help="corpus .jsonl.gz")
    parser.add_argument(
        "--max-passages", type=int, help="training passages (prepare.max_passages); config's"
    )
    parser.add_argument("--batch-size", type=int, help="override config.batch_size")
    parser.add_argument("--num-layers", type=int, help="override config.model.num_layers")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="more config overrides for every step, e.g. --set data.max_length=64 (repeatable)",
    )
    parser.add_argument("--workdir", default=str(REPO_ROOT / "runs" / "bench_e2e"))
    parser.add_argument(
        "--compilation-cache",
        default="",
        help="JAX persistent compilation cache to reuse; default: a fresh empty one per run, so "
        "every compile is counted",
    )
    parser.add_argument("--repeats", type=int, default=1, help="runs per framework (alternating)")
    parser.add_argument("--skip-torch", action="store_true", help="time JAX only")
    parser.add_argument(
        "--prepare-only", action="store_true",
        help="make the (untimed) data folder and stop: e.g. while the machine is still busy",
    )  # fmt: skip
    return parser.parse_args(argv)


@dataclasses.dataclass(frozen=True)
class Setup:
    """The config file, the overrides both frameworks get, and the resolved config."""

    config_path: str
    overrides: dict[str, object]  # dotted config field -> value
    config: object

    def flags(self) -> list[str]:
        """`--config.<field>=<value>` for `caliber_jax.train` / `prepare` / `embed_teacher`."""
        return [f"--config.{key}={value}" for key, value in self.overrides.items()]


def make_setup(args) -> Setup:
    """Applies the benchmark's overrides to the config (the same ones every subprocess gets)."""
    config = common.load_config(args.config)
    max_passages = args.max_passages or config.prepare.max_passages
    overrides: dict[str, object] = {
        "prepare.input": str(Path(args.filings).resolve()),
        "prepare.max_passages": max_passages,
        # Only the training split matters here: no NumGap / NumFinE files, no validation.
        "prepare.numgap": False,
        "prepare.numfine_items": 0,
        "data.validate": False,
    }
    if args.batch_size:
        overrides["batch_size"] = args.batch_size
    if args.num_layers:
        overrides["model.num_layers"] = args.num_layers
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE")
        overrides[key] = _parse(value, like=_get(config, key))
    # The data depend on the corpus, prepare's and the teacher's settings: one folder per choice.
    data_fields = {
        key: value for key, value in overrides.items() if key.startswith(("prepare.", "teacher."))
    }
    digest = hashlib.sha1(json.dumps([args.config, data_fields]).encode()).hexdigest()[:8]
    name = f"{Path(args.filings).name.split('.')[0]}_{max_passages}_{digest}"
    overrides["data.dir"] = str(Path(args.workdir).resolve() / name / "data")
    for key, value in overrides.items():
        node = config
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return Setup(config_path=args.config, overrides=overrides, config=config)


def _get(config, key: str):
    """The config's value at a dotted key (KeyError naming the key if absent)."""
    node = config
    for part in key.split("."):
        if part not in node:
            raise KeyError(f"--set {key}: the config has no field {key!r}")
        node = node[part]
    return node


def _parse(text: str, *, like):
    """`text` as the type of the config value it replaces (str when that is None)."""
    if isinstance(like, bool):
        if text.lower() not in ("true", "false"):
            raise ValueError(f"--set: {text!r} is not true/false")
        return text.lower() == "true"
    return text if like is None else type(like)(text)


def run_timed(command: list[str], log: Path) -> float:
    """Runs `command` from the repo root with output to `log`; returns launch-to-exit seconds."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("w") as handle:
        code = subprocess.call(command, cwd=REPO_ROOT, stdout=handle, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if code:
        tail = log.read_text().strip().splitlines()[-15:]
        raise RuntimeError(f"{command[:4]} exited {code} (log {log}):\n" + "\n".join(tail))
    return seconds


def prepare_data(setup: Setup) -> Path:
    """Passages and teacher vectors of the training split, made once (not timed) and reused."""
    data_dir = Path(setup.config.data.dir)
    ready = data_dir / "bench_ready.json"
    if ready.is_file():
        return data_dir
    base = [sys.executable, "-m"]
    config = ["--config", setup.config_path, *setup.flags()]
    start = time.perf_counter()
    run_timed([*base, "caliber_jax.prepare", *config], data_dir.parent / "prepare.log")
    run_timed(
        [*base, "caliber_jax.embed_teacher", *config, "--splits=train"],
        data_dir.parent / "embed_teacher.log",
    )
    ready.write_text(json.dumps({"seconds": time.perf_counter() - start, **setup.overrides}))
    return data_dir


def epoch_plan(setup: Setup, data_dir: Path) -> np.ndarray:
    """[steps, B] row indices of the epoch, as `caliber_jax.train`'s loader cuts it."""
    config = setup.config
    texts, perturbed = pipeline.load_passages(data_dir / "train.jsonl")
    tokenizer = tokenization.load_tokenizer(train.student_tokenizer_dir(config))

    def tokenize_fn(batch, max_length):
        return tokenization.tokenize(tokenizer, batch, max_length=max_length)

    max_length = config.data.max_length
    lengths = pipeline.token_lengths(tokenize_fn, texts, max_length)
    pert_lengths = pipeline.token_lengths(tokenize_fn, perturbed, max_length)
    plan = pipeline.make_epoch_batches(
        np.maximum(lengths, pert_lengths),
        batch_size=config.batch_size,
        seed=config.seed,
        epoch=0,
        shuffle=True,
        length_group_window=config.data.length_group_window,
        drop_remainder=config.data.drop_remainder,
    )
    per_epoch = len(plan)
    steps = config.total_steps or int(np.ceil(config.num_epochs * per_epoch))
    if steps > per_epoch:
        raise ValueError(f"{steps} steps: the benchmark runs at most one epoch ({per_epoch})")
    return plan[:steps]


def check_reference_supports(config) -> None:
    """The PyTorch loop implements eq. 4 with AdamW and HF's linear schedule, nothing else."""
    unsupported = {
        "loss.objective": (config.loss.get("objective", "caliber"), "caliber"),
        "optim.schedule": (config.optim.schedule, "linear"),
        "optim.accum_steps": (config.optim.accum_steps, 1),
        "model.out_dim": (config.model.out_dim, None),
        "model.dtype": (config.model.dtype, "float32"),
    }
    for key, (value, supported) in unsupported.items():
        if value != supported:
            raise ValueError(f"config.{key}={value!r}: the PyTorch reference needs {supported!r}")


def run_jax(setup: Setup, run_dir: Path, cache: str) -> dict:
    """`python -m caliber_jax.train` on a fresh workdir; returns its summary plus the wall time."""
    workdir = run_dir / "jax"
    shutil.rmtree(workdir, ignore_errors=True)
    if not cache:
        cache = str(run_dir / "xla_cache")
        shutil.rmtree(cache, ignore_errors=True)
    command = [
        sys.executable, "-m", "caliber_jax.train", "--config", setup.config_path, *setup.flags(),
        "--workdir", str(workdir), f"--compilation_cache={cache}",
    ]  # fmt: skip
    seconds = run_timed(command, run_dir / "jax.log")
    summary = json.loads((workdir / "summary.json").read_text())
    return {"wall_s": seconds, **summary}


def run_torch(setup: Setup, run_dir: Path, data_dir: Path, plan: np.ndarray) -> dict:
    """`benchmarks/torch_reference.py` over the same plan; returns its summary plus wall time."""
    config = setup.config
    workdir = run_dir / "torch"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    np.save(workdir / "plan.npy", plan)
    model_dir = config.model.init_dir
    spec = {
        "passages": str(data_dir / "train.jsonl"),
        "teacher_x": str(data_dir / "teacher_train" / "x"),
        "teacher_px": str(data_dir / "teacher_train" / "px"),
        "plan": str(workdir / "plan.npy"),
        "workdir": str(workdir),
        "model_dir": model_dir,
        "num_layers": config.model.num_layers,
        "dim": embed_teacher.student_dim(config),
        "max_length": config.data.max_length,
        "seed": config.seed,
        "total_steps": len(plan),
        "lam": config.loss.lam,
        "margin": config.loss.margin,
        "reduction": config.loss.reduction,
        "perturb_weight": config.loss.get("perturb_weight", 1.0),
        "log_every": config.log_every,
        "checkpoint_every": config.checkpoint_every,
        **{
            key: config.optim[key]
            for key in ("lr", "weight_decay", "warmup_frac", "b1", "b2", "eps", "clip_norm")
        },
    }
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    command = [sys.executable, str(TORCH_REFERENCE), "--spec", str(spec_path)]
    seconds = run_timed(command, run_dir / "torch.log")
    summary = json.loads((workdir / "summary.json").read_text())
    return {"wall_s": seconds, **summary}


def report(name: str, results: list[dict], plan: np.ndarray) -> float:
    """Prints one framework's figures (median wall over repeats); returns its sequences/s."""
    walls = [r["wall_s"] for r in results]
    wall = float(np.median(walls))
    steps = int(results[0]["step"])
    rows = int(np.sum(plan[:steps] >= 0))
    seq_per_s = rows / wall
    print(f"{name}_wall_s={wall:.1f} (runs: {', '.join(f'{w:.1f}' for w in walls)})")
    print(f"{name}_steps={steps}")
    print(f"{name}_rows={rows}")
    print(f"{name}_final_loss={float(results[-1]['train/loss']):.6f}")
    extra = {
        "jax": ("compile/step_programs", "compile/compiled", "compile/compile_seconds"),
        "torch": ("loop_s", "threads"),
    }[name]
    print(f"{name}_details=" + " ".join(f"{k}={results[-1].get(k)}" for k in extra))
    print(f"{name}_seq_per_s={seq_per_s:.3f}")
    return seq_per_s


def main(argv=None) -> None:
    args = parse_args(argv)
    print(f"cpu={common.cpu_description()}")
    print(f"load_average_1m_before={os.getloadavg()[0]:.2f}")
    setup = make_setup(args)
    if not args.skip_torch:
        check_reference_supports(setup.config)
    print(f"config={args.config} overrides={json.dumps(setup.overrides)}")
    start = time.perf_counter()
    data_dir = prepare_data(setup)
    if args.prepare_only:
        print(f"data={data_dir} (ready in {time.perf_counter() - start:.1f} s)")
        return
    plan = epoch_plan(setup, data_dir)
    print(
        f"data={data_dir} (ready in {time.perf_counter() - start:.1f} s, not timed) "
        f"steps={len(plan)} batch={plan.shape[1]}"
    )
    run_dir = data_dir.parent / "runs"
    results: dict[str, list[dict]] = {"jax": [], "torch": []}
    for repeat in range(args.repeats):
        order = ["jax", "torch"] if repeat % 2 == 0 else ["torch", "jax"]
        for name in order:
            if name == "jax":
                results["jax"].append(run_jax(setup, run_dir, args.compilation_cache))
            elif not args.skip_torch:
                results["torch"].append(run_torch(setup, run_dir, data_dir, plan))
    print(f"load_average_1m_after={os.getloadavg()[0]:.2f}")
    seq = {name: report(name, runs, plan) for name, runs in results.items() if runs}
    if "torch" in seq:
        print(f"ratio_jax_over_torch={seq['jax'] / seq['torch']:.3f}")


if __name__ == "__main__":
    common.run_main(main)
