"""The GPU session's script (`benchmarks/gpu_on_device.sh`) rehearsed on the CPU at toy size."""

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import device_report
from tests.conftest import IN_PROCESS_OPT_LEVEL, with_opt_level

REPO = Path(__file__).resolve().parents[1]


def test_values_of_reads_key_value_lines():
    out = (
        "preset=gpu-qwen3-0.6b device=NVIDIA H100 80GB HBM3 cores=14\njax_step_s=0.25\nx=a b\n"
        "jax_compiled shape=((32, 96), (16, 96)) at_s=21.5\n"
        "jax_compiled shape=((32, 160), (32, 160)) at_s=40.0\n"
        "timed_batches=1 real_tokens_per_batch=16512\n"
        "model=qwen3-8b layers=36 nonembedding_params=1 dtype=bfloat16 batch=64 passages=10240 "
        "mean_tokens=99.8\n"
    )
    values = device_report.values_of(out)
    assert values["jax_step_s"] == 0.25 and values["x"] == "a"
    assert values["device_kind"] == "NVIDIA H100 80GB HBM3"
    assert values["jax_compiled_at_s"] == [21.5, 40.0]
    assert values["real_tokens_per_batch"] == 16512 and values["passages"] == 10240


def test_source_commit_falls_back_to_the_prepared_record(monkeypatch):
    # The device tool's copy has no .git: the commit recorded at prepare stands in, marked.
    monkeypatch.setattr(device_report.provenance, "git_commit", lambda repo: "unknown")
    monkeypatch.setenv("CALIBER_COMMIT", "aea2ba0c1234")
    assert device_report.source_commit() == "aea2ba0c1234 (recorded at prepare)"
    monkeypatch.delenv("CALIBER_COMMIT")
    assert device_report.source_commit() == "unknown"
    monkeypatch.setattr(device_report.provenance, "git_commit", lambda repo: "0123456789ab")
    monkeypatch.setenv("CALIBER_COMMIT", "aea2ba0c1234")
    assert device_report.source_commit() == "0123456789ab"  # a checkout's own commit wins


# Ten Python launches (the teacher import, two of caliber_jax.train, four benchmarks, two
# compiles; PyTorch traced by aot_eager): minutes on 2 cores even at toy size (BENCHMARKS.md).
# student_packed is also the test that train_throughput.py's JAX step is the one train compiled
# (its persistent-cache key is a hash of the program: the schedule, the loss, the model settings
# and the row count all in it).
@pytest.mark.slow(140)
def test_gpu_script_rehearsal_reports_every_part(tmp_path):
    env = {
        **os.environ,
        "CALIBER_DEVICE_REHEARSAL": "1",
        "PYTHON": sys.executable,
        "FILINGS": str(REPO / "data" / "sample" / "filings.jsonl.gz"),
        "OUT": str(tmp_path / "out"),
        "WORK": str(tmp_path / "work"),
        "JAX_PLATFORMS": "cpu",
        "PASSAGES_GZ": "",  # prepare's toy split, even where runs/device holds the real one
        # Every part at the tests' LLVM level (tests/conftest.py): the rehearsal checks that each
        # part runs and reports, not its figures, and its launches mostly compile.
        "XLA_FLAGS": with_opt_level(os.environ.get("XLA_FLAGS"), IN_PROCESS_OPT_LEVEL),
    }
    result = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_on_device.sh"), "3000"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=3000,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "device_report.json").read_text())
    assert report["rehearsal"] is True
    assert report["commit"] not in ("", "unknown") and report["date"].endswith("Z")
    # The settings every part ran under (inherited XLA flags, no extra train flags here).
    assert report["xla_flags"] == env.get("XLA_FLAGS", "") and report["train_flags"] == []
    assert list(report["parts"]) == list(device_report.REQUIRED)
    for name, keys in device_report.REQUIRED.items():
        part = report["parts"][name]
        for key in keys:
            assert isinstance(part.get(key), float) and math.isfinite(part[key]), (name, key, part)
        # Each part's result was printed when it ended, before the next part started.
        assert f"\n{name}: {{" in "\n" + result.stdout
    parts = report["parts"]
    # Setup imported its teacher vectors through embed_teacher into the split's stores.
    data = tmp_path / "work" / "data"
    assert (data / "teacher_train" / "x").is_dir() and (data / "teacher_train" / "px").is_dir()
    assert parts["setup"]["passages_source"].startswith("caliber_jax.prepare over")
    # Setup kept the student's token lengths as prepare does; the launches read that one file.
    assert len(list((tmp_path / "work" / "data" / "token_lengths").glob("train_*.npz"))) == 1
    # The epoch ran launch to exit, every step of it; its metrics and log came back.
    epoch = parts["train_epoch"]
    assert epoch["rc"] == 0 and epoch["finished"] is True, epoch
    assert epoch["steps"] == epoch["epoch_steps"] == parts["setup"]["passages"] // 8
    assert 0 < epoch["first_step_s"] < epoch["exit_s"] and 1 <= epoch["step_programs"] <= 4
    assert 0 < epoch["mfu_steady"] and 0 < epoch["mfu_epoch"]
    # The first step's program, built alone: the autotuner's trade is read against it.
    assert 0 < epoch["first_program_compile_s"] <= epoch["compile_s"] + epoch["exit_s"]
    assert "after train() began: weights" in epoch["startup"]
    metrics = (tmp_path / "out" / "train_epoch_metrics.jsonl").read_text().splitlines()
    assert json.loads(metrics[-1])["step"] == epoch["steps"]
    assert (tmp_path / "out" / "train_epoch.log").exists()
    # The warm launch read the programs the epoch compiled from the shared cache.
    assert parts["train_warm"]["cache_files_added"] < epoch["cache_files_added"]
    student = parts["student_packed"]
    # At the epoch's batch the packed step is the epoch's program: read from its cache, not
    # compiled again (train_throughput.py builds it as train does); the 16K batch is another.
    # JAX alone: no PyTorch figure waits on torch.compile there.
    assert student["batch_size"] == 8
    assert student["jax_step_cache_hits"] == student["jax_step_programs"] >= 1, student
    # The first 64 passages of the epoch (--pool), as train's loader orders them; launched, the
    # benchmark retains freed host memory as the entry points do (where glibc can).
    assert student["epoch_steps"] == 64 // 8 and student["host_malloc"] in ("retain", "default")
    assert not any(key.startswith("torch") for key in student), student
    # PyTorch eager and compiled beside the same step; the ratio is against the faster.
    torch_part = parts["student_torch"]
    assert torch_part["batch_size"] == 8 and torch_part["jax_step_cache_hits"] >= 1
    assert torch_part["torch_strongest"] in ("torch", "torch_compiled")
    assert torch_part["ratio_jax_over_torch"] == pytest.approx(
        min(torch_part["ratio_jax_over_torch_eager"],
            torch_part["ratio_jax_over_torch_compiled"]),
        rel=1e-3,
    )  # fmt: skip
    assert parts["student_packed_16k"]["batch_size"] > student["batch_size"]
    assert parts["teacher_8b_encode"]["passages"] == 48
    # The autotuner's trade: the same step compiled again (its own cache) under the flag.
    autotune = parts["student_autotune0"]
    assert (
        autotune["jax_step_cache_hits"] == 0
        and "--xla_gpu_autotune_level=0" in autotune["xla_flags"]
    )
    # The cuDNN packed-attention tests ran and, on this CPU, skipped themselves (GPU only).
    attention = parts["attention_gpu_test"]
    assert attention["skipped"] == 3 and attention["passed"] == attention["failed"] == 0


def test_train_setting_follows_the_train_flags(monkeypatch):
    # The student parts time the train launches' step: their batch and model settings, with
    # TRAIN_FLAGS's overrides (bool, int and str fields).
    monkeypatch.setattr(device_report, "SIZES", {**device_report.SIZES, "config": []})
    monkeypatch.setattr(device_report, "TRAIN_FLAGS", [
        "--config.model.scan_layers=True", "--config.batch_size=96", "--config.model.remat=full",
    ])  # fmt: skip
    assert device_report.train_setting("model.scan_layers") is True
    assert device_report.train_setting("batch_size") == 96
    assert device_report.train_setting("model.remat") == "full"
    assert device_report.train_setting("model.attention") == "xla"  # the config's
    assert device_report.train_setting("data.max_length") == 512


def test_train_flags_come_from_the_environment(monkeypatch):
    import importlib

    monkeypatch.setenv("TRAIN_FLAGS", "--config.model.scan_layers=True  --config.x='a b'")
    try:
        assert importlib.reload(device_report).TRAIN_FLAGS == [
            "--config.model.scan_layers=True",
            "--config.x=a b",
        ]
    finally:
        monkeypatch.delenv("TRAIN_FLAGS")
        assert importlib.reload(device_report).TRAIN_FLAGS == []


# A stand-in for `python -m caliber_jax.train` (argv: its workdir): notes what the workdir held
# when it started, prints train's "first step done" line, appends two metrics lines (steps 2
# and 4, or none with NO_ROWS) and exits.
FAKE_TRAIN = """
import json, os, sys
workdir = sys.argv[1]
held = sorted(os.listdir(workdir)) if os.path.isdir(workdir) else []
with open(os.path.join(os.path.dirname(workdir), "held.json"), "w") as f:
    json.dump(held, f)
os.makedirs(os.path.join(workdir, "checkpoints", "4"), exist_ok=True)
print("first step done 1.0 s after train() began: weights 0.1 s", flush=True)
if not os.environ.get("NO_ROWS"):
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
        for step in (2, 4):
            row = {"step": step, "train/seq_per_s": 16.0, "train/tokens_per_s": 1000.0}
            f.write(json.dumps(row) + "\\n")
print("compile: 2 train-step shapes, 3.5 s compiling or loading", flush=True)
"""


@pytest.fixture
def fake_launch(tmp_path, monkeypatch):
    """`train_launch` and `epoch_figures` on the CPU: the fake train above in place of
    `caliber_jax.train`, setup's record of 32 passages, batch 8, a nominal peak (no nvidia-smi)."""
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    monkeypatch.setattr(
        device_report, "train_command",
        lambda args, work, name, extra: [sys.executable, str(script), str(work / name)],
    )  # fmt: skip
    monkeypatch.setattr(device_report, "TRAIN_FLAGS", [])
    monkeypatch.setattr(device_report, "SIZES", {
        **device_report.SIZES, "student": "qwen3-tiny", "peak_flops": 1e12,
        "config": ["--config.batch_size=8"], "train_steps": 2,
    })  # fmt: skip
    work = tmp_path / "work"
    work.mkdir()
    (work / "setup.json").write_text(json.dumps({"passages": 32, "pert_share": 0.5}))
    return work


@pytest.mark.parametrize("name", ["train_epoch", "train_warm"])
def test_a_rerun_launch_starts_from_an_empty_workdir(fake_launch, name):
    """A second report run on the same --work: the launch's workdir from the first (its
    checkpoints, its metrics.jsonl) is cleared, so train starts afresh instead of resuming, and
    only this launch's metrics lines are read as its timings."""
    work = fake_launch
    stale = work / name
    (stale / "checkpoints" / "100").mkdir(parents=True)
    rows = [{"step": s, "train/seq_per_s": 1.0, "train/tokens_per_s": 1.0} for s in (50, 100)]
    (stale / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = argparse.Namespace(python=sys.executable)
    result = device_report.train_launch(args, work, name, 120.0, to_exit=name == "train_epoch")
    assert (work / "held.json").exists(), "stopped at once: the old run's lines were read"
    assert json.loads((work / "held.json").read_text()) == []  # nothing left to resume
    assert sorted(p.name for p in (stale / "checkpoints").iterdir()) == ["4"]
    assert result["steps_seen"] == 2 and result["first_step_s"] > 0, result
    if name == "train_epoch":
        assert result["finished"] is True and result["steps"] == 4.0, result
        assert result["step_s"] == pytest.approx(0.5)  # 8 passages a step at 16 a second
        assert result["compile_s"] == 3.5 and result["step_programs"] == 2


def test_an_epoch_without_metrics_lines_keeps_its_first_step(fake_launch, monkeypatch):
    """A launch that exits (or is stopped) before its first metrics line: the figures the log
    gives (first step, exit, compile seconds) are kept, with an error naming what is missing,
    instead of the whole part failing on an empty list."""
    monkeypatch.setenv("NO_ROWS", "1")
    args = argparse.Namespace(python=sys.executable)
    result = device_report.train_launch(args, fake_launch, "train_epoch", 120.0, to_exit=True)
    assert result["first_step_s"] > 0 and result["exit_s"] >= result["first_step_s"], result
    assert result["steps"] == 0.0 and result["finished"] is True
    assert result["compile_s"] == 3.5
    assert "no metrics line" in result["error"]
    assert "step_s" not in result
    figures = device_report.epoch_figures(fake_launch, [], [], "", 12.0, False)
    assert figures["exit_s"] == 12.0 and figures["finished"] is False and "error" in figures
