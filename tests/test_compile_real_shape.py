"""benchmarks/compile_real_shape.py at toy size: every phase timed, the JSON resumable."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import with_opt_level

REPO = Path(__file__).resolve().parents[1]


def run(out, *parts):
    command = [
        sys.executable, str(REPO / "benchmarks" / "compile_real_shape.py"), "--out", str(out),
        "--model", "qwen3-tiny", "--num-layers", "1", "--max-length", "32", "--batch-size", "4",
        "--min-available-gib", "0", "--parts", ",".join(parts),
    ]  # fmt: skip
    # One CPU device, as every process the tests launch (tests/conftest.py), and its programs
    # built at LLVM level 0 like the tests' own: each part compiles one toy step and runs it at
    # most once, so XLA's default level only lengthened the compiles whose figures are checked
    # here (compile_cpu_s 5.3 -> 2.6 s a part; the test 27 -> 23.5 CPU-s). Flags given outside win.
    env = {**os.environ, "XLA_FLAGS": with_opt_level(os.environ.get("XLA_FLAGS"), 0)}
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, json.loads(out.read_text())["parts"]


def test_compile_and_step_parts_report_their_figures(tmp_path):
    out = tmp_path / "c.json"
    _, parts = run(out, "compile-scan-dots", "step-unrolled-none")
    compiled = parts["compile-scan-dots"]
    for key in ("trace_s", "lower_s", "compile_s", "compile_cpu_s", "peak_rss_bytes"):
        assert compiled[key] > 0, key
    assert compiled["hlo_instructions"] > 100 and compiled["xla_argument_bytes"] > 0
    # 4 x and round(0.5 x 4) = 2 pi(x) of 32 tokens: one per packed row of 32
    assert compiled["batch_shapes"]["packed_ids"] == [6, 32] and compiled["layers"] == 1
    stepped = parts["step-unrolled-none"]
    assert len(stepped["step_s"]) == 1 and stepped["step_s"][0] > 0
    assert 0 < stepped["real_tokens"] <= stepped["token_slots"]
    # A second run skips what the JSON already holds.
    stdout, again = run(out, "compile-scan-dots")
    assert "already in" in stdout and again == parts
