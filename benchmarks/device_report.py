"""One GPU run's figures for the real job (issue #35), as one JSON file that grows part by part.

    python benchmarks/device_report.py --out runs/device_report.json   # via gpu_on_device.sh
    CALIBER_DEVICE_REHEARSAL=1 python benchmarks/device_report.py --out /tmp/r.json   # CPU, tiny

Parts, in order (most wanted first: aea2ba0's H200 run measured the first step and the XLA
student step; d37e027's the cuDNN step, the scanned compile and the first step again, and its
8B part compiled the random init for 200 s), each a subprocess under its own time limit and all
of them under `--limit-s`:
  setup: a random-weights Qwen3-Embedding-0.6B directory (HF layout, Qwen3 tokenizer), prepared
    passages of the carried filings (`caliber_jax.prepare`, configs/caliber.py, capped at
    `--passages`) and random teacher vectors in `embed_teacher`'s layout.
  teacher_8b_encode: `benchmarks/encode_throughput.py --preset gpu-qwen3-8b-encode` (random
    Qwen3-Embedding-8B-shaped weights drawn leaf by leaf, bf16 compute, JAX only), one batch of
    64 passages: passages/s, tokens/s, MFU.
  student_cudnn: `benchmarks/train_throughput.py --preset gpu-qwen3-0.6b` with the config's
    scan/remat settings and attention "cudnn" (JAX only) on one batch (one compile): step time,
    tokens/s on real tokens, MFU against the data-sheet bf16 peak, peak device memory; then three
    more steps traced by `jax.profiler`, summarised by `benchmarks/profile_summary.py` (the GPU's
    busy share, kernel time by kind, the top kernels) under "profile".
  student_cudnn_scan: the same with the layers scanned (`model.scan_layers`): the step time that
    the scan's shorter compile (32 s against 50 s per shape) would cost.
  student_packed: the step with the packed layout (`data.pack_length` 512, XLA attention, JAX
    only): the aea2ba0 run found 42.5% of an epoch's tokens to be padding with padded rows.
  worst_shape_compile: `benchmarks/compile_real_shape.py` for the epoch's largest batch (512
    tokens, a pi(x) for every row): XLA's compile seconds and buffer assignment (device memory)
    of the config's step with its layers scanned, then unrolled (the config's remat).
  train_cold, train_warm: `python -m caliber_jax.train --config configs/caliber.py` launched twice
    on that data with one `--compilation_cache` directory, empty before the first: seconds from
    launch to the first step's metrics line (`first_step_s`), then the seconds between later
    steps' lines (`step_s`, median) and the loop's own `train/tokens_per_s` (real tokens).
  student_xla: as student_cudnn with attention "xla", against the PyTorch reference step of
    `benchmarks/torch_reference.py` for `ratio_jax_over_torch`.
The benchmark parts share a compilation cache of their own, so the train launches start cold.
Each part's result is printed when it ends and the JSON file is rewritten atomically, so a run
cut short keeps every part it finished. `CALIBER_DEVICE_REHEARSAL=1` runs the same parts on the
CPU with a two-layer toy Qwen3 (`common.QWEN3_TINY`), 64 tokens, batch 8 and "xla" attention
in place of cuDNN: it checks the script, not the numbers.
"""

import argparse
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402
from caliber_jax import provenance  # noqa: E402

REHEARSAL = os.environ.get("CALIBER_DEVICE_REHEARSAL", "") not in ("", "0")
# More `caliber_jax.train` flags for the train parts (recorded in the report), e.g.
# TRAIN_FLAGS=--config.model.scan_layers=True.
TRAIN_FLAGS = shlex.split(os.environ.get("TRAIN_FLAGS", ""))
CONFIG = "configs/caliber.py"
STUDENT_KEYS = ("jax_step_s", "jax_real_tokens_per_s", "jax_mfu_real_tokens",
                "jax_peak_memory_bytes", "jax_compile_s")  # fmt: skip
# benchmarks/profile_summary.py's figures of the traced steps (train_throughput --profile-dir).
PROFILE_KEYS = ("profile_busy_frac", "profile_ops_per_step", "profile_window_ms_per_step")
# How each student part runs train_throughput.py: attention, layers scanned, packed rows, and
# whether PyTorch runs beside it (the ratio) or the device's time is traced (the profile).
STUDENT_PARTS = {
    "student_cudnn": dict(attention="cudnn", profile=True),
    "student_cudnn_scan": dict(attention="cudnn", scan=True, profile=True),
    "student_packed": dict(attention="xla", pack=True),
    "student_xla": dict(attention="xla", torch=True),
}
# Keys every finished part reports (finite numbers); tests/test_device_report.py checks them.
REQUIRED = {
    "setup": ("setup_s", "passages"),
    "teacher_8b_encode": (
        "jax_passages_per_s", "jax_real_tokens_per_s", "jax_mfu_real_tokens",
        "jax_peak_memory_bytes",
    ),
    "student_cudnn": STUDENT_KEYS + PROFILE_KEYS,
    "student_cudnn_scan": STUDENT_KEYS + PROFILE_KEYS,
    "student_packed": STUDENT_KEYS,
    "worst_shape_compile": (
        "unrolled_compile_s", "unrolled_xla_temp_bytes", "scan_compile_s", "scan_xla_temp_bytes",
        "xla_argument_bytes",
    ),
    "train_cold": ("first_step_s", "step_s", "tokens_per_s", "steps_seen"),
    "train_warm": ("first_step_s", "step_s", "tokens_per_s", "steps_seen"),
    "student_xla": STUDENT_KEYS + (
        "torch_step_s", "torch_real_tokens_per_s", "ratio_jax_over_torch",
    ),
}  # fmt: skip
# Each part's own limit on the GPU (seconds); the run's `--limit-s` cuts the later ones shorter.
# A CPU rehearsal's toy parts take seconds on a quiet machine but minutes on a loaded one: there
# only `--limit-s` applies.
# d37e027's H200: setup 28 s, student_cudnn 108 s (81 s of it compiling), the scanned worst
# batch compiled in 32 s; the profile adds a few seconds to the cuDNN parts. 71a747e's: the 8B
# encode 46 s, the scanned step 104 s, student_xla with PyTorch 127 s, the packed step compiled
# in 127 s (stopped at 150 s before its timed steps).
LIMITS = {"setup": 60, "teacher_8b_encode": 170, "student_cudnn": 140, "student_cudnn_scan": 110,
          "student_packed": 190, "worst_shape_compile": 110, "train_cold": 110, "train_warm": 45,
          "student_xla": 150}  # fmt: skip
if REHEARSAL:
    LIMITS = dict.fromkeys(LIMITS, math.inf)
# Sizes: the real shapes, or the rehearsal's toy ones.
SIZES = {
    "student": "qwen3-tiny" if REHEARSAL else "qwen3-0.6b",
    "teacher": "qwen3-tiny" if REHEARSAL else "qwen3-8b",
    "passages": 128 if REHEARSAL else 4096,
    "train_steps": 4 if REHEARSAL else 8,
    "bench": (
        ["--max-length", "64", "--batch-size", "8", "--num-batches", "1", "--repeats", "2",
         "--min-steps", "2", "--pool", "64", "--peak-flops", "1e12"]
        if REHEARSAL
        # One batch (the median of 512 passages), so one compile: the aea2ba0 run's H200 compiled
        # each shape of this step in 50-100 s, and two shapes ran every part out of time.
        else ["--num-batches", "1", "--repeats", "5", "--min-steps", "3", "--pool", "512"]
    ),
    "encode": (
        ["--max-length", "64", "--batch-size", "16", "--passages", "32", "--repeats", "1",
         "--peak-flops", "1e12"]
        if REHEARSAL else ["--passages", "64", "--repeats", "3"]  # one batch of 64: one shape
    ),
    "config": ["--config.data.max_length=64", "--config.batch_size=8"] if REHEARSAL else [],
    "pack_length": 64 if REHEARSAL else 512,
    "compile": ["--max-length", "64", "--batch-size", "8"] if REHEARSAL else [],
}  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON file (rewritten after each part)")
    parser.add_argument("--work", default=str(common.REPO_ROOT / "runs" / "device_report"),
                        help="model, data, workdirs and the compilation cache")  # fmt: skip
    parser.add_argument("--filings", default=str(common.DEFAULT_FILINGS))
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
    if device := re.search(r"^preset=\S+ device=(.*?) cores=", stdout, re.MULTILINE):
        values["device_kind"] = device.group(1)
    # train_throughput: the seconds at which each step shape finished compiling, in order.
    compiled = re.findall(r"^jax_compiled shape=.* at_s=([\d.]+)", stdout, re.MULTILINE)
    if compiled:
        values["jax_compiled_at_s"] = [float(t) for t in compiled]
    return values


def run_benchmark(args, script: str, flags: list[str], limit: float) -> dict:
    """A benchmark script's `key=value` figures (and its exit status)."""
    command = [args.python, str(common.REPO_ROOT / "benchmarks" / script), *flags]
    # Its own process group: a timeout stops its subprocesses too (compile_real_shape's parts).
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=common.REPO_ROOT, start_new_session=True)  # fmt: skip
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
    """Model directory, prepared passages and teacher vectors (in this process)."""
    from caliber_jax import prepare, tokenization
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
    config.prepare.input = args.filings
    config.data.dir = str(work / "data")
    config.prepare.max_passages = SIZES["passages"]
    config.prepare.numgap = False
    config.prepare.numfine_items = 0
    stats = prepare.prepare_from_config(config)
    texts, perturbed = pipeline.load_passages(work / "data" / "train.jsonl")
    common.write_teacher_stores(work / "data" / "teacher_train", texts, perturbed, dim=dim, seed=0)
    return {"setup_s": time.perf_counter() - start, "passages": float(stats["train_passages"])}


def train_launch(args, work: Path, name: str, limit: float) -> dict:
    """Launches `caliber_jax.train`; times its metrics lines; stops it after a few steps."""
    workdir = work / name
    metrics = workdir / "metrics.jsonl"
    steps = SIZES["train_steps"]
    command = [
        args.python, "-m", "caliber_jax.train", f"--config={CONFIG}", f"--workdir={workdir}",
        f"--compilation_cache={work / 'xla_cache'}", f"--config.model.init_dir={work / 'model'}",
        f"--config.data.dir={work / 'data'}", f"--config.total_steps={steps}",
        "--config.log_every=1", "--config.data.validate=False", *SIZES["config"],
        *TRAIN_FLAGS,
    ]  # fmt: skip
    cache = work / "xla_cache"
    cached = _files(cache)
    log = (work / f"{name}.log").open("w")
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
        if seen and first is None:
            first = min(t for t, _ in seen.values())
        # Enough steps, or the later steps wait on compiles for longer than the part allows.
        done = len(seen) >= steps or (first is not None and now - first > limit / 3)
        if done or proc.poll() is not None or now > limit:
            break
        time.sleep(0.05)
    if proc.poll() is None:  # the run's own end would save a checkpoint: not what is timed
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    log.close()
    # rc -9: stopped here after its steps (its own end would save a checkpoint, not timed).
    result: dict = {"steps_seen": float(len(seen)), "rc": proc.returncode,
                    "cache_files_added": float(_files(cache) - cached)}  # fmt: skip
    # train.py's own split of the time to its first step (weights, data, state, first step).
    startup = re.search(r"first step done .*", (work / f"{name}.log").read_text())
    if startup:
        result["startup"] = startup.group(0)
    if first is None:
        tail = (work / f"{name}.log").read_text().strip().splitlines()[-5:]
        return {**result, "error": "no step logged", "log_tail": tail}
    times = [seen[s][0] for s in sorted(seen)]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    tokens = [seen[s][1]["train/tokens_per_s"] for s in sorted(seen)[1:]]
    # Later steps of a new batch shape may wait for its compile (built ahead, in the background):
    # every gap is kept; the benchmark parts time steps with every shape compiled.
    return {
        **result,
        "step_gaps_s": gaps,
        "first_step_s": first,
        "step_s": statistics.median(gaps) if gaps else math.nan,
        "tokens_per_s": statistics.median(tokens) if tokens else math.nan,
    }


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


def _files(directory: Path) -> int:
    """Files under `directory` (the persistent cache's entries, the autotuner's included)."""
    return sum(1 for path in directory.rglob("*") if path.is_file()) if directory.exists() else 0


def run_part(args, work: Path, name: str, limit: float) -> dict:
    config = common.load_config(CONFIG)
    model = config.model
    if name == "setup":
        return setup(args, work)
    if name.startswith("train_"):
        return train_launch(args, work, name, limit)
    if name in STUDENT_PARTS:
        part = STUDENT_PARTS[name]
        scan = part.get("scan", model.scan_layers)
        # cuDNN's kernel needs a GPU: the CPU rehearsal runs the same part with XLA attention.
        attention = "xla" if REHEARSAL else part["attention"]
        flags = ["--preset", "gpu-qwen3-0.6b", "--model", SIZES["student"], "--filings",
                 args.filings, "--record-stride", "1", "--scan-layers", str(int(scan)),
                 "--remat", model.remat, "--jax-attention", attention,
                 "--compile-cache", str(work / "xla_cache_bench"), *SIZES["bench"]]  # fmt: skip
        if not part.get("torch"):
            flags.append("--skip-torch")
        if part.get("pack"):  # the CPU configs' layout: rows of 512 tokens
            flags += ["--pack-length", str(SIZES["pack_length"])]
        if part.get("profile"):
            flags += ["--profile-dir", str(work / f"profile_{name}")]
        result = run_benchmark(args, "train_throughput.py", flags, limit)
        summary = work / f"profile_{name}" / "summary.json"
        if part.get("profile") and summary.exists():
            result["profile"] = json.loads(summary.read_text())
        return result
    if name == "worst_shape_compile":
        return worst_shape_compile(args, work, model.remat, limit)
    if name == "teacher_8b_encode":
        flags = ["--preset", "gpu-qwen3-8b-encode", "--model", SIZES["teacher"], "--skip-torch",
                 "--filings", args.filings, "--record-stride", "1",
                 "--compile-cache", str(work / "xla_cache_teacher"), *SIZES["encode"]]  # fmt: skip
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
            "rc", "wall_s", "missing", "skipped", "error", "device_kind", "startup")}  # fmt: skip
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
