"""One GPU run's figures for the real job, as one JSON file grown part by part.

    python benchmarks/device_report.py --out runs/device_report.json   # via gpu_on_device.sh
    CALIBER_DEVICE_REHEARSAL=1 python benchmarks/device_report.py --out /tmp/r.json   # CPU, tiny

Parts, in order (the plan that fits one GPU's time is in gpu_on_device.sh's header), each a
subprocess under its own time limit and all of them under `--limit-s`:
  setup: a random-weights Qwen3-Embedding-0.6B directory (HF layout, Qwen3 tokenizer); the
    training passages: the shared filings' whole training split as `gpu_on_device.sh prepare`
    wrote it here (`--passages-gz`, 144,696 passages: too big to prepare on the device in time
    and small enough gzipped to carry), or, without it, `caliber_jax.prepare` over the carried
    filings (the rehearsal: capped at a few passages); and teacher vectors drawn here (random,
    seeded: timing only) as .npy and imported with `caliber_jax.embed_teacher --import_x
    --import_px`, the import path a user with vectors computed elsewhere takes.
  train_epoch: `python -m caliber_jax.train --config configs/caliber.py` over that split, launch
    to exit: wall seconds, the first step's time after launch, XLA compile
    seconds in total (train's own `compile:` line), the steady step (median over the logged
    windows after the first), real tokens per second and MFU over the whole epoch and over its
    steady steps; metrics.jsonl and the log are kept. Cut short by its limit, it reports the
    steps it ran and the launch-to-exit time they project.
  train_warm: the same command launched again with the epoch's compilation cache, stopped after
    a few steps: the warm launch to the first step.
  student_packed: `benchmarks/train_throughput.py --preset gpu-qwen3-0.6b --data-dir --init-dir`
    on setup's split and model at the epoch's batch (the config's: the paper's 32 passages): one
    of the epoch's first steps (train's own batches and row ladder), its JAX step program the one
    `train_epoch` compiled, read from the epoch's compilation cache (`jax_step_cache_hits`: no
    compile here); step time, real tokens/s, MFU, peak memory, a profile of three more steps.
    JAX only, so its figures never wait on PyTorch's compile.
  student_torch: the same step beside, on the same passages (padded: PyTorch has no packed
    path), PyTorch eager and PyTorch under `torch.compile` (`TORCH_COMPILE`, default
    reduce-overhead: CUDA graphs of the fixed shapes), SDPA, fused AdamW, bf16 autocast over
    float32 weights; `ratio_jax_over_torch` is against the faster PyTorch row.
  student_packed_16k: the same step at >= 16K real tokens per step (112 passages), JAX only,
    with its profile: another batch, so another program, compiled here (with
    the epoch's cache directory, XLA's per-fusion autotuning results are shared).
  student_autotune0: student_packed's JAX step compiled again with `--xla_gpu_autotune_level=0`
    in a cache of its own, JAX only: its compile seconds against the same program's build at the
    default level in the epoch (train_epoch's `first_program_compile_s`: the first step's
    program, built alone into a cold cache) and its step time against student_packed's (the
    autotuner's trade).
  teacher_8b_encode: `benchmarks/encode_throughput.py --preset gpu-qwen3-8b-encode` (random
    Qwen3-Embedding-8B-shaped weights, bf16, JAX only) over 10,240 real passages through
    `Embedder.encode_ids`, the length-sorted, bucket-padded batches `embed_teacher` runs (a
    warm-up pass compiles every bucket, then one timed pass): texts/s, MFU on real tokens and
    the hours projected for the paper's 839K texts.
  worst_shape_compile: `benchmarks/compile_real_shape.py` for the epoch's largest batch: XLA's
    compile seconds and buffer assignment of the step, layers scanned and unrolled.
  attention_gpu_test: `tests/models/test_attention_gpu.py -k packed`: cuDNN's fused attention on
    packed rows (sequence offsets) against XLA's masked attention, forward and gradients; pytest's
    counts (on the CPU they skip themselves).
The train launches and the student parts share one compilation cache (`train_cache`), which the
epoch starts cold; the 8B encode keeps its own. The student parts read setup's split and model
from `--work` (call 1's, on the same machine; else PARTS=setup,... first: without the epoch's
cache their JAX step compiles, `jax_step_cache_hits=0`).
Each part's result is printed when it ends and the JSON file is rewritten atomically, so a run
cut short keeps every part it finished. `CALIBER_DEVICE_REHEARSAL=1` runs the same parts on the
CPU with a two-layer toy Qwen3 (`common.QWEN3_TINY`; one layer in worst_shape_compile), 64
tokens, small batches, `torch.compile` through the aot_eager backend: it checks the script, not
the numbers.
"""

import argparse
import gzip
import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402
from caliber_jax import provenance  # noqa: E402

REHEARSAL = os.environ.get("CALIBER_DEVICE_REHEARSAL", "") not in ("", "0")
# More `caliber_jax.train` flags for the train parts (recorded in the report), e.g.
# TRAIN_FLAGS=--config.model.scan_layers=True.
TRAIN_FLAGS = shlex.split(os.environ.get("TRAIN_FLAGS", ""))
CONFIG = "configs/caliber.py"
STUDENT_KEYS = ("jax_step_s", "jax_real_tokens_per_s", "jax_mfu_real_tokens",
                "jax_peak_memory_bytes", "jax_compile_s", "jax_step_cache_hits",
                "real_tokens_per_batch")  # fmt: skip
# benchmarks/profile_summary.py's figures of the traced steps (train_throughput --profile-dir).
PROFILE_KEYS = ("profile_busy_frac", "profile_ops_per_step", "profile_window_ms_per_step")
TORCH_KEYS = ("torch_step_s", "torch_real_tokens_per_s", "torch_compiled_step_s",
              "torch_compiled_real_tokens_per_s", "ratio_jax_over_torch",
              "ratio_jax_over_torch_eager", "ratio_jax_over_torch_compiled")  # fmt: skip
# The torch.compile mode of the PyTorch baseline's second row (train_throughput --torch-compile).
TORCH_COMPILE = os.environ.get("TORCH_COMPILE", "reduce-overhead")
# How each student part runs train_throughput.py: passages per step (None: the train launches'
# batch, so the step is the epoch's own program), whether PyTorch runs beside it (eager and
# compiled) and whether three more steps are traced (the profile).
STUDENT_PARTS = {
    # JAX alone first: its figures never wait on PyTorch's compile (`student_torch`).
    "student_packed": dict(batch=None, profile=True),
    "student_packed_16k": dict(batch=112, profile=True),
    "student_torch": dict(batch=None, torch=True),
    # The epoch's step again, compiled with XLA's GPU autotuner off (a cache of its own): the
    # compile seconds it saves against the step time it costs.
    "student_autotune0": dict(batch=None, xla_flags="--xla_gpu_autotune_level=0",
                              cache="xla_cache_autotune0"),
}  # fmt: skip
TRAIN_KEYS = ("first_step_s", "step_s", "steps_seen")
# Keys every finished part reports (finite numbers); tests/test_device_report.py checks them.
REQUIRED = {
    "setup": ("setup_s", "passages", "pert_share", "teacher_import_s"),
    "train_epoch": TRAIN_KEYS + (
        "exit_s", "steps", "compile_s", "real_tokens", "real_tokens_per_s", "mfu_epoch",
        "mfu_steady", "step_s_mean",
    ),
    "train_warm": TRAIN_KEYS,
    "student_packed": STUDENT_KEYS + PROFILE_KEYS,
    "student_packed_16k": STUDENT_KEYS + PROFILE_KEYS,
    "student_torch": STUDENT_KEYS + TORCH_KEYS,
    "student_autotune0": STUDENT_KEYS,
    "teacher_8b_encode": (
        "jax_passages_per_s", "jax_real_tokens_per_s", "jax_mfu_real_tokens",
        "jax_peak_memory_bytes", "jax_projected_teacher_hours", "passages",
    ),
    "worst_shape_compile": (
        "unrolled_compile_s", "unrolled_xla_temp_bytes", "scan_compile_s", "scan_xla_temp_bytes",
        "xla_argument_bytes",
    ),
    "attention_gpu_test": ("passed", "failed", "skipped"),
}  # fmt: skip
# Each part's own limit on the GPU (seconds); the run's `--limit-s` cuts the later ones shorter.
# A CPU rehearsal's toy parts take seconds on a quiet machine but minutes on a loaded one: there
# only `--limit-s` applies. From the H200 runs: setup 42 s (4a6f2a7, 2026-11-29), the epoch 529 s
# projected launch to exit at that commit (stopped at 518.7 s; ~460 s expected since, see
# gpu_on_device.sh); 71a747e (2026-11-28): a student step compiled in 71-82 s (the packed one
# in 127 s; student_packed now loads the epoch's), PyTorch eager beside it ~40 s, the 8B encode
# of one batch 46 s.
LIMITS = {"setup": 90, "train_epoch": 560, "train_warm": 60, "student_packed": 90,
          "student_packed_16k": 170, "student_torch": 240, "student_autotune0": 120,
          "teacher_8b_encode": 240,
          "worst_shape_compile": 110, "attention_gpu_test": 150}  # fmt: skip
if REHEARSAL:
    LIMITS = dict.fromkeys(LIMITS, math.inf)
# Sizes: the real shapes, or the rehearsal's toy ones.
SIZES = {
    "student": "qwen3-tiny" if REHEARSAL else "qwen3-0.6b",
    "teacher": "qwen3-tiny" if REHEARSAL else "qwen3-8b",
    # setup's prepare when no --passages-gz is carried (0: every passage of the filings); the
    # rehearsal's 64 are the student parts' --pool: an epoch of 8 steps at its batch of 8.
    "passages": 64 if REHEARSAL else 0,
    "train_steps": 4 if REHEARSAL else 8,
    "bench": (
        ["--num-batches", "1", "--repeats", "2", "--min-steps", "2", "--pool", "64",
         "--peak-flops", "1e12"]
        if REHEARSAL
        # One batch (the median of the epoch's first 1024 / B steps), so one program per
        # framework: the aea2ba0 run's H200 compiled each shape of this step in 50-100 s (the
        # student_packed part's JAX one now comes from the epoch's cache).
        else ["--num-batches", "1", "--repeats", "5", "--min-steps", "3", "--pool", "1024"]
    ),
    # Toy batches: the epoch's 8 passages and, for the ">= 16K tokens" part, 11 (just above 8:
    # another program, the part's point; a bigger one only lengthened the rehearsal).
    "bench_batch_scale": 0.1 if REHEARSAL else 1.0,
    "torch_backend": "aot_eager" if REHEARSAL else "inductor",
    "encode": (
        ["--max-length", "64", "--batch-size", "16", "--passages", "48", "--repeats", "1",
         "--record-stride", "1", "--peak-flops", "1e12"]
        if REHEARSAL
        # >= 10K real passages from the carried training split: every 12th
        # of its 144,696 passages.
        else ["--passages", "10240", "--repeats", "1", "--record-stride", "12"]
    ),
    "config": ["--config.data.max_length=64", "--config.batch_size=8"] if REHEARSAL else [],
    "log_every": ["--config.log_every=2"] if REHEARSAL else [],  # the config's 50 on the GPU
    "compile": (["--num-layers", "1", "--max-length", "64", "--batch-size", "8"]
                if REHEARSAL else []),  # fmt: skip
    "peak_flops": 1e12 if REHEARSAL else 0.0,  # 0: the GPU's data-sheet figure
}  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON file (rewritten after each part)")
    parser.add_argument("--work", default=str(common.REPO_ROOT / "runs" / "device_report"),
                        help="model, data, workdirs and the compilation cache")  # fmt: skip
    parser.add_argument("--filings", default=str(common.DEFAULT_FILINGS))
    parser.add_argument(
        "--passages-gz",
        default="",
        help="the training split, prepared before (gpu_on_device.sh prepare)",
    )
    parser.add_argument("--limit-s", type=float, default=450.0, help="all parts together")
    parser.add_argument("--parts", default=",".join(REQUIRED), help="comma-separated subset")
    parser.add_argument("--python", default=sys.executable)
    return parser.parse_args(argv)


def values_of(stdout: str) -> dict:
    """`key=value` lines of a benchmark's output: numbers as floats, the rest as strings."""
    values: dict = {}
    for line in stdout.splitlines():
        match = re.match(r"^(\w+)=(\S+)", line)
        if match:
            key, value = match.groups()
            try:
                values[key] = float(value)
            except ValueError:
                values[key] = value
    # train_throughput: the timed batches' real tokens (x and pi(x)) per step.
    if tokens := re.search(r"^timed_batches=\S+ real_tokens_per_batch=(\d+)", stdout, re.MULTILINE):
        values["real_tokens_per_batch"] = float(tokens.group(1))
    # encode_throughput: the passages encoded per pass.
    if passages := re.search(r"^model=.* passages=(\d+) ", stdout, re.MULTILINE):
        values["passages"] = float(passages.group(1))
    if device := re.search(r"^preset=\S+ device=(.*?) cores=", stdout, re.MULTILINE):
        values["device_kind"] = device.group(1)
    # train_throughput: the seconds at which each step shape finished compiling, in order.
    compiled = re.findall(r"^jax_compiled shape=.* at_s=([\d.]+)", stdout, re.MULTILINE)
    if compiled:
        values["jax_compiled_at_s"] = [float(t) for t in compiled]
    return values


def run_benchmark(args, script: str, flags: list[str], limit: float, env=None) -> dict:
    """A benchmark script's `key=value` figures (and its exit status); `env`: its environment
    (default: this process's)."""
    command = [args.python, str(common.REPO_ROOT / "benchmarks" / script), *flags]
    # Its own process group: a timeout stops its subprocesses too (compile_real_shape's parts).
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=common.REPO_ROOT, start_new_session=True, env=env)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=limit)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = "timeout"
    result = {**values_of(out), "rc": rc}
    if rc != 0:
        result["stderr_tail"] = err.strip().splitlines()[-5:]
    return result


def setup(args, work: Path) -> dict:
    """Model directory, the training passages and their imported teacher vectors."""
    from caliber_jax import prepare, tokenization, train
    from caliber_jax.data import pipeline
    from caliber_jax.models import embedding

    start = time.perf_counter()
    config = common.load_config(CONFIG)
    student = common.random_qwen3(common.QWEN3_SHAPES[SIZES["student"]], seed=0)
    embedding.save_pretrained(
        work / "model", student.spec, student.flat, tokenizer=tokenization.build_qwen3_tokenizer(),
        max_seq_length=config.data.max_length,
    )  # fmt: skip
    dim = student.config.width
    del student
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    if args.passages_gz and Path(args.passages_gz).is_file():
        with gzip.open(args.passages_gz, "rb") as f, (data / "train.jsonl").open("wb") as g:
            shutil.copyfileobj(f, g, 1 << 24)
        source = f"{args.passages_gz} (prepared from the shared filings before the run)"
    else:
        config.prepare.input = args.filings
        config.data.dir = str(data)
        config.prepare.max_passages = SIZES["passages"]
        config.prepare.numgap = False
        config.prepare.numfine_items = 0
        prepare.prepare_from_config(config)
        (data / "val.jsonl").unlink(missing_ok=True)  # the epoch trains; no validation pass
        source = f"caliber_jax.prepare over {args.filings}, capped at {SIZES['passages']} (0: all)"
    # The student's token lengths, kept where train reads them, as `caliber_jax.prepare` keeps
    # them for a user's data: the launches below read them instead of tokenizing.
    config.data.dir, config.model.init_dir = str(data), str(work / "model")
    config.data.max_length = train_setting("data.max_length")
    lengths_start = time.perf_counter()
    train.keep_token_lengths(config)
    token_lengths_s = time.perf_counter() - lengths_start
    texts, perturbed = pipeline.load_passages(data / "train.jsonl")
    # Random teacher vectors (the step's cost does not depend on their values), seeded, imported
    # as a user's own vectors would be.
    rng = np.random.default_rng(0)
    t_x = rng.standard_normal((len(texts), dim), dtype=np.float32)
    t_px = t_x + np.float32(0.05) * rng.standard_normal(t_x.shape, dtype=np.float32)
    np.save(work / "teacher_x.npy", t_x)
    np.save(work / "teacher_px.npy", t_px)
    del t_x, t_px
    imported = time.perf_counter()
    command = [
        args.python, "-m", "caliber_jax.embed_teacher", f"--config={CONFIG}",
        f"--config.data.dir={data}", f"--config.model.init_dir={work / 'model'}",
        f"--import_x={work / 'teacher_x.npy'}", f"--import_px={work / 'teacher_px.npy'}",
        "--splits=train", "--teacher_name=random (timing only)",
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, cwd=common.REPO_ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"embed_teacher --import_x: {proc.stderr.strip().splitlines()[-3:]}")
    for name in ("teacher_x.npy", "teacher_px.npy"):
        (work / name).unlink()
    pert_share = sum(map(bool, perturbed)) / len(texts)
    (work / "setup.json").write_text(json.dumps({"passages": len(texts), "pert_share": pert_share}))
    return {
        "setup_s": time.perf_counter() - start,
        "passages": float(len(texts)),
        "pert_share": pert_share,
        "passages_source": source,
        "teacher_import_s": time.perf_counter() - imported,
        "token_lengths_s": token_lengths_s,
    }


def train_cache(work: Path) -> Path:
    """The train launches' persistent compilation cache, which the student parts read."""
    return work / "xla_cache"


def train_command(args, work: Path, name: str, extra: list[str]) -> list[str]:
    """`caliber_jax.train --config configs/caliber.py` on setup's data, workdir WORK/name."""
    return [
        args.python, "-m", "caliber_jax.train", f"--config={CONFIG}", f"--workdir={work / name}",
        f"--compilation_cache={train_cache(work)}", f"--config.model.init_dir={work / 'model'}",
        f"--config.data.dir={work / 'data'}", "--config.data.validate=False", *SIZES["config"],
        *extra, *TRAIN_FLAGS,
    ]  # fmt: skip


def train_launch(args, work: Path, name: str, limit: float, *, to_exit: bool) -> dict:
    """Launches `caliber_jax.train` and times it from its log and metrics lines: to its exit
    (`to_exit`: the whole epoch), or stopped after a few logged steps (a launch's first step)."""
    workdir = work / name
    # A fresh workdir each time: one left by an earlier report on this --work would be resumed
    # from its checkpoints, and its metrics.jsonl lines read as this launch's timings.
    if workdir.exists():
        shutil.rmtree(workdir)
    metrics = workdir / "metrics.jsonl"
    # Every step logged for a short launch; the config's cadence for the epoch (a metrics line
    # fetches from the device). Neither changes the step's program, so both share the cache.
    extra = [*SIZES["log_every"]] if to_exit else ["--config.log_every=1"]
    command = train_command(args, work, name, extra)
    cache = train_cache(work)
    cached = _files(cache)
    log_path = work / f"{name}.log"
    log = log_path.open("w")
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=common.REPO_ROOT,
                            start_new_session=True)  # fmt: skip
    seen: dict[int, tuple[float, dict]] = {}
    first = None
    while True:
        now = time.perf_counter() - start
        if metrics.exists():
            # Whole lines only: the run may be half-way through appending one.
            for line in metrics.read_text().splitlines(keepends=True):
                if line.endswith("\n"):
                    row = json.loads(line)
                    seen.setdefault(int(row["step"]), (now, row))
        if first is None and "first step done" in log_path.read_text(errors="replace"):
            first = now
        if to_exit:
            done = False
        else:  # enough steps, or later steps wait on compiles for longer than the part allows
            late = first is not None and now - first > limit / 3
            done = len(seen) >= SIZES["train_steps"] or late
        if done or proc.poll() is not None or now > limit:
            break
        time.sleep(0.05)
    exit_s = time.perf_counter() - start
    finished = proc.poll() is not None
    if not finished:  # stopped here (a short launch's own end would save a checkpoint)
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    log.close()
    text = log_path.read_text(errors="replace")
    result: dict = {"steps_seen": float(len(seen)), "rc": proc.returncode,
                    "cache_files_before": float(cached),
                    "cache_files_added": float(_files(cache) - cached)}  # fmt: skip
    # train.py's own split of the time to its first step (weights, data, state, first step).
    if startup := re.search(r"first step done .*", text):
        result["startup"] = startup.group(0)
    if first is None:
        return {**result, "error": "no step logged", "log_tail": text.strip().splitlines()[-5:]}
    result["first_step_s"] = first
    rows = [seen[s] for s in sorted(seen)]
    steps = sorted(seen)
    if not to_exit:
        times = [t for t, _ in rows]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        step_s = statistics.median(gaps) if gaps else math.nan
        return {**result, "step_gaps_s": gaps, "step_s": step_s}
    if metrics.exists():
        shutil.copyfile(metrics, work / f"{name}_metrics.jsonl")  # comes back with the logs
    return {**result, **epoch_figures(work, steps, [r for _, r in rows], text, exit_s, finished)}


def epoch_figures(work: Path, steps: list[int], rows: list[dict], log: str, exit_s: float,
                  finished: bool) -> dict:  # fmt: skip
    """The epoch's figures from its metrics lines (one per `log_every` steps: passages/s and real
    tokens/s of the window since the last) and its log's `compile:` line; without a metrics line
    (the launch ended or was stopped before its first), the log's figures and an error."""
    setup_record = json.loads((work / "setup.json").read_text())
    batch = train_setting("batch_size")
    total_steps = setup_record["passages"] // batch  # drop_remainder
    if not rows:
        return {
            "finished": finished,
            "steps": 0.0,
            "epoch_steps": float(total_steps),
            "exit_s": exit_s,
            "error": "no metrics line before the launch ended: no step times",
            **_log_figures(log),
        }
    # A window's seconds are its passages over its passages/s; its tokens follow.
    windows = [(b - a, batch * (b - a) / row["train/seq_per_s"], row["train/tokens_per_s"])
               for a, b, row in zip([0, *steps], steps, rows, strict=False)]  # fmt: skip
    real_tokens = sum(seconds * rate for _, seconds, rate in windows)
    steady = windows[1:] or windows  # the first window holds the first step's compile
    step_s = statistics.median(seconds / count for count, seconds, _ in steady)
    # The mean over the same windows less those holding a stall (over twice the median: a
    # checkpoint save, a validation pass, a compile): with `data.pack_first_steps` the first
    # windows hold one row count only, so the median alone leans on them.
    usual = [(count, seconds) for count, seconds, _ in steady if seconds / count <= 2 * step_s]
    step_s_mean = sum(seconds for _, seconds in usual) / max(1, sum(count for count, _ in usual))
    steady_tokens = statistics.median(rate for _, _, rate in steady)
    sequences = batch * (1 + setup_record["pert_share"])  # x and pi(x) per step, on average
    tokens_per_sequence = real_tokens / max(1, steps[-1] * sequences)
    per_token = _flops_per_token(tokens_per_sequence)
    peak = _peak_flops()
    result = {
        "finished": finished,
        "steps": float(steps[-1]),
        "epoch_steps": float(total_steps),
        "exit_s": exit_s,
        "step_s": step_s,
        "step_s_mean": step_s_mean,
        "real_tokens": real_tokens,
        "real_tokens_per_s": real_tokens / exit_s,
        "steady_real_tokens_per_s": steady_tokens,
        "mfu_epoch": per_token * real_tokens / exit_s / peak,
        "mfu_steady": per_token * steady_tokens / peak,
        "peak_flops": peak,
    }
    if not finished:  # cut short: what its steps project for the whole epoch
        result["projected_exit_s"] = exit_s + (total_steps - steps[-1]) * step_s
    return {**result, **_log_figures(log)}


def _log_figures(log: str) -> dict:
    """The compile seconds train's log gives: in all, or up to its first step when killed before
    its end; and the first step's program's build."""
    result = {}
    if compiled := re.search(r"^compile: (\d+) train-step shapes.*?([\d.]+) s compiling or loading",
                             log, re.MULTILINE):  # fmt: skip
        result["step_programs"] = float(compiled.group(1))
        result["compile_s"] = float(compiled.group(2))
    else:  # killed before its end: the compile seconds counted up to its first step
        if startup := re.search(r"XLA compiling or loading so far: ([\d.]+) s", log):
            result["compile_s_to_first_step"] = float(startup.group(1))
    if first := re.search(r"step programs built in ([\d.]+) s \(the first, alone\)", log):
        # The autotuner's trade (student_autotune0) is read against this program's build.
        result["first_program_compile_s"] = float(first.group(1))
    return result


def train_setting(field: str):
    """A config field as the train launches run it: the config's value, or its override in the
    rehearsal's sizes or TRAIN_FLAGS (`batch_size`, `model.remat`, ...; bool, int or str)."""
    value = common.load_config(CONFIG)
    for key in field.split("."):
        value = value[key]
    for flag in SIZES["config"] + TRAIN_FLAGS:
        name, _, text = flag.partition("=")
        if name == f"--config.{field}":
            if isinstance(value, bool):
                value = text.lower() in ("true", "1")
            else:
                value = type(value)(text)
    return value


def _flops_per_token(tokens_per_sequence: float) -> float:
    """Training FLOPs per real token of the student (`common.model_flops`) at this mean length."""
    from caliber_jax.models import hf

    config = common.QWEN3_SHAPES[SIZES["student"]]
    shapes = hf.expected_shapes("qwen3", config)
    flat = {f"encoder.{k}": np.broadcast_to(np.float32(0), v) for k, v in shapes.items()}
    student = common.Student(spec=embedding_spec(config), flat=flat)
    length = max(1.0, tokens_per_sequence)
    return common.model_flops(student, [length], backward=True) / length


def embedding_spec(config):
    """The student's `ModelSpec` (mean pooling, no W_out), as `common.random_qwen3` builds it."""
    from caliber_jax.models import embedding

    return embedding.ModelSpec("qwen3", config, "mean", None, config.to_hf())


def _peak_flops() -> float:
    """The rehearsal's nominal peak, or the GPU's data-sheet bf16 figure (nvidia-smi's name; this
    process never opens the GPU, which the parts' own processes use)."""
    if SIZES["peak_flops"]:
        return SIZES["peak_flops"]
    query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
    name = subprocess.run(query, capture_output=True, text=True).stdout.strip().splitlines()[0]
    for prefix, value in common.GPU_PEAK_BF16.items():
        if name.startswith(prefix):
            return value
    raise ValueError(f"no data-sheet bf16 peak for {name!r} (common.GPU_PEAK_BF16)")


def worst_shape_compile(args, work: Path, remat: str, limit: float) -> dict:
    """compile_real_shape.py's two compile parts at the worst batch, flattened."""
    out = work / "worst_shape_compile.json"
    flags = ["--out", str(out), "--pert-share", "1.0", "--model", SIZES["student"],
             "--parts", f"compile-scan-{remat},compile-unrolled-{remat}", "--timeout-s",
             str(int(limit) - 10), *SIZES["compile"]]  # fmt: skip
    result = run_benchmark(args, "compile_real_shape.py", flags, limit)
    parts = json.loads(out.read_text())["parts"] if out.exists() else {}
    for layout in ("unrolled", "scan"):
        part = parts.get(f"compile-{layout}-{remat}", {})
        for key in ("trace_s", "lower_s", "compile_s", "hlo_instructions", "xla_temp_bytes",
                    "error"):  # fmt: skip
            if key in part:
                result[f"{layout}_{key}"] = part[key]
        if "xla_argument_bytes" in part:
            result["xla_argument_bytes"] = float(part["xla_argument_bytes"])
    result["remat"] = remat
    return {k: float(v) if isinstance(v, int) and k != "rc" else v for k, v in result.items()}


def attention_gpu_test(args, limit: float) -> dict:
    """`tests/models/test_attention_gpu.py`'s packed-rows tests: cuDNN's fused attention with
    sequence offsets against XLA's masked attention, forward and gradients (they skip off a GPU,
    as in the rehearsal): pytest's passed / failed / skipped counts."""
    command = [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "tests/models/test_attention_gpu.py", "-k", "packed"]  # fmt: skip
    # tests/conftest.py sets JAX_PLATFORMS=cpu where it is unset: on the device, name the GPU.
    env = os.environ if REHEARSAL else {**os.environ, "JAX_PLATFORMS": "cuda"}
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=limit,
                              cwd=common.REPO_ROOT, env=env)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"rc": "timeout"}
    counts = dict.fromkeys(("passed", "failed", "skipped"), 0.0)
    for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", proc.stdout):
        counts["failed" if word.startswith("error") else word] += float(number)
    result = {**counts, "rc": proc.returncode}
    if proc.returncode not in (0, 5):  # 5: nothing collected
        result["stdout_tail"] = proc.stdout.strip().splitlines()[-15:]
    if counts["skipped"] and not REHEARSAL:  # a skip on the device is no answer
        result["error"] = f"{counts['skipped']:.0f} GPU tests skipped on the device"
        result["stdout_tail"] = proc.stdout.strip().splitlines()[-15:]
    return result


def _files(directory: Path) -> int:
    """Files under `directory` (the persistent cache's entries, the autotuner's included)."""
    return sum(1 for path in directory.rglob("*") if path.is_file()) if directory.exists() else 0


def run_part(args, work: Path, name: str, limit: float) -> dict:
    if name == "setup":
        return setup(args, work)
    if name in ("train_epoch", "train_warm"):
        return train_launch(args, work, name, limit, to_exit=name == "train_epoch")
    if name in STUDENT_PARTS:
        part = STUDENT_PARTS[name]
        batch = train_setting("batch_size")
        if part["batch"] is not None:
            batch = max(4, round(part["batch"] * SIZES["bench_batch_scale"]))
        # Setup's split and model, the train launches' model settings and their cache: at the
        # epoch's batch, the JAX step is the program train_epoch compiled (train_throughput.py).
        flags = ["--preset", "gpu-qwen3-0.6b", "--data-dir", str(work / "data"), "--init-dir",
                 str(work / "model"), "--batch-size", str(batch),
                 "--max-length", str(train_setting("data.max_length")),
                 "--dtype", train_setting("model.dtype"), "--remat", train_setting("model.remat"),
                 "--jax-attention", train_setting("model.attention"),
                 "--scan-layers", str(int(train_setting("model.scan_layers"))),
                 "--compile-cache", str(work / part["cache"] if "cache" in part
                                        else train_cache(work)),
                 *SIZES["bench"]]  # fmt: skip
        if part.get("torch"):
            flags += ["--torch-compile", TORCH_COMPILE,
                      "--torch-compile-backend", SIZES["torch_backend"]]  # fmt: skip
        else:
            flags.append("--skip-torch")
        if part.get("profile"):
            flags += ["--profile-dir", str(work / f"profile_{name}")]
        env = None
        if part.get("xla_flags"):
            env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} "
                                              f"{part['xla_flags']}".strip()}  # fmt: skip
        result = run_benchmark(args, "train_throughput.py", flags, limit, env=env)
        result["batch_size"] = float(batch)
        if env is not None:
            result["xla_flags"] = env["XLA_FLAGS"]
        summary = work / f"profile_{name}" / "summary.json"
        if part.get("profile") and summary.exists():
            result["profile"] = json.loads(summary.read_text())
        return result
    if name == "worst_shape_compile":
        return worst_shape_compile(args, work, train_setting("model.remat"), limit)
    if name == "attention_gpu_test":
        return attention_gpu_test(args, limit)
    if name == "teacher_8b_encode":
        # The training split's passages (carried gzipped), else the filings.
        texts = args.passages_gz if Path(args.passages_gz or "-").is_file() else args.filings
        flags = ["--preset", "gpu-qwen3-8b-encode", "--model", SIZES["teacher"], "--skip-torch",
                 "--filings", texts, "--compile-cache", str(work / "xla_cache_teacher"),
                 *SIZES["encode"]]  # fmt: skip
        return run_benchmark(args, "encode_throughput.py", flags, limit)
    raise ValueError(f"unknown part {name!r}")


def write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def main(argv=None) -> None:
    args = parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if unknown := sorted(set(parts) - set(REQUIRED)):
        raise SystemExit(f"--parts: unknown {unknown}; expected some of {list(REQUIRED)}")
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    report = {
        "commit": source_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rehearsal": REHEARSAL,
        "config": CONFIG,
        "train_flags": TRAIN_FLAGS,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),  # every part inherits them
        "host_cpu": common.cpu_description(),
        "sizes": {k: v for k, v in SIZES.items() if isinstance(v, str | int)},
        "parts": {},
    }
    write_atomic(out, report)
    clock = time.perf_counter()
    for name in parts:
        left = args.limit_s - (time.perf_counter() - clock) - 5
        limit = min(LIMITS[name], left)
        if limit < 20:
            result = {"skipped": f"{left:.0f} s left of --limit-s"}
        else:
            print(f"== {name} (limit {limit:.0f} s)", flush=True)
            start = time.perf_counter()
            try:
                result = run_part(args, work, name, limit)
            except Exception as error:  # a broken part must not lose the others
                result = {"error": f"{type(error).__name__}: {error}"}
            result["wall_s"] = time.perf_counter() - start
        missing = [k for k in REQUIRED[name] if not _finite(result.get(k))]
        if missing and "skipped" not in result:
            result["missing"] = missing
        report["parts"][name] = result
        write_atomic(out, report)
        shown = {k: v for k, v in result.items() if k in REQUIRED[name] or k in (
            "rc", "wall_s", "missing", "skipped", "error", "device_kind", "startup",
            "jax_step_programs")}  # fmt: skip
        print(f"{name}: {json.dumps(shown, default=str)}", flush=True)
    print(f"wrote {out} ({time.perf_counter() - clock:.0f} s)")


def source_commit() -> str:
    """The code's commit: the checkout's own, or (the device tool copies a working tree without
    .git) the one `gpu_on_device.sh prepare` recorded in $CALIBER_COMMIT, marked as such."""
    commit = provenance.git_commit(common.REPO_ROOT)
    if commit == provenance.UNKNOWN and os.environ.get("CALIBER_COMMIT"):
        return f"{os.environ['CALIBER_COMMIT']} (recorded at prepare)"
    return commit


def _finite(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


if __name__ == "__main__":
    common.run_main(main)
