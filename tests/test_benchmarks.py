"""Tests for benchmarks/: FLOP counts, CPU flags, batches from the real loader, the PyTorch
reference's loss against the library's, the timing rounds, and tiny runs of both benchmarks."""

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from benchmarks import (
    common,
    compile_depth,
    encode_throughput,
    profile_summary,
    torch_reference,
    train_throughput,
)
from caliber_jax import host, losses, tokenization
from caliber_jax.data import pipeline
from caliber_jax.models import bert, embedding, qwen3

REPO = Path(__file__).resolve().parents[1]
# The benchmarks' mains run here in the test's own process: with glibc's default malloc, not the
# retained heap users get (`--host-malloc retain`, checked in a launched benchmark below), whose
# watcher thread (`hostmem.release_fragments`) cannot be stopped. One per main (7 in this module)
# took ~10% of a core for the rest of the pytest worker's session, and the retained heap's
# settings stayed on for every later test in that worker.
IN_PROCESS = ["--host-malloc", "default"]


def test_model_flops_by_hand():
    config = bert.BertConfig(
        vocab_size=50, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=2,
    )  # fmt: skip
    spec = embedding.ModelSpec("bert", config, "mean", None, {})
    flat = {
        "encoder.embeddings.word_embeddings.embedding": np.zeros((50, 8)),
        "encoder.layer.0.query.kernel": np.zeros((8, 8)),
        "encoder.layer.0.query.bias": np.zeros((8,)),
    }
    student = common.Student(spec=spec, flat=flat)
    assert student.nonembedding_params == 72
    # Forward, t = 3: 2 * 72 * 3 + 4 * 2 layers * 8 * 3^2; t = 1: 2 * 72 + 4 * 2 * 8.
    forward = (2 * 72 * 3 + 4 * 2 * 8 * 9) + (2 * 72 + 4 * 2 * 8)
    assert common.model_flops(student, [3, 1], backward=False) == forward
    assert common.model_flops(student, [3, 1], backward=True) == 3 * forward

    causal = qwen3.Qwen3Config(
        vocab_size=50, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=4,
    )  # fmt: skip
    student = common.Student(spec=embedding.ModelSpec("qwen3", causal, "mean", None, {}), flat={})
    # N * H = 16 wide attention, halved for the causal mask: 4 * 1 * 16 * 0.5 * 2^2.
    assert common.model_flops(student, [2], backward=False) == 4 * 16 * 0.5 * 4


def test_cpu_description_names_the_vector_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    avx512 = "fpu sse avx2 avx512f avx512bw fma avx amx_tile"
    cpuinfo.write_text(
        f"processor\t: 0\nmodel name\t: AMD EPYC 9B45\nflags\t\t: {avx512}\n\n"
        "processor\t: 1\nmodel name\t: other\nflags\t\t: sse\n"
    )
    usable = host.usable_cores()
    cores = f"{usable} cores" + ("" if usable == os.cpu_count() else f" (of {os.cpu_count()})")
    assert common.cpu_description(cpuinfo) == (
        f"AMD EPYC 9B45, {cores}, flags: amx_tile avx avx2 avx512bw avx512f fma"
    )
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: sse avx fma avx2\n")
    assert common.cpu_description(cpuinfo) == (
        f"AMD EPYC, {cores}, flags: avx avx2 fma (no avx512)"
    )


def test_cpu_description_counts_the_cores_of_the_affinity(tmp_path):
    """Pinned with taskset (or a cgroup cpuset), the benchmark names, and threads, only the cores
    it may use, not the machine's."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: sse avx fma avx2\n")
    first = min(os.sched_getaffinity(0))
    code = (
        f"import os; os.sched_setaffinity(0, {{{first}}}); from benchmarks import common; "
        "from caliber_jax import host; print(host.usable_cores()); "
        f"print(common.cpu_description({str(cpuinfo)!r}))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=common.REPO_ROOT,
                            capture_output=True, text=True, check=True)  # fmt: skip
    cores, description = result.stdout.splitlines()
    assert cores == "1"
    of = "" if os.cpu_count() == 1 else f" (of {os.cpu_count()})"
    assert description == f"AMD EPYC, 1 cores{of}, flags: avx avx2 fma (no avx512)"


def test_minilm_dir_follows_the_environment(tmp_path, monkeypatch):
    """benchmarks/cpu_on_device.sh points configs/demo.py and the benchmarks at random weights."""
    from configs import demo

    monkeypatch.setenv("CALIBER_MINILM_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="CALIBER_MINILM_DIR"):
        common.minilm_dir()
    (tmp_path / "config.json").write_text("{}")
    assert common.minilm_dir() == tmp_path
    assert demo.get_config().model.init_dir == demo.get_config().teacher.model_dir == str(tmp_path)


def _trace(*threads):
    """A Perfetto trace: `threads` of (process name, thread name, [(name, ts, dur, args)])."""
    events = []
    for pid, (process, thread, ops) in enumerate(threads):
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": process}})
        events.append({"ph": "M", "pid": pid, "tid": 7, "name": "thread_name",
                       "args": {"name": thread}})  # fmt: skip
        events += [{"ph": "X", "pid": pid, "tid": 7, "name": name, "ts": ts, "dur": dur,
                    "args": args} for name, ts, dur, args in ops]  # fmt: skip
    return {"traceEvents": events}


def test_profile_summary_reads_the_gpu_streams_by_hand():
    gpu = "/device:GPU:0"
    trace = _trace(
        # Two streams; 0-40 and 30-60 overlap, 60-100 idle, 100-140 busy: 100 of 140 us busy.
        (gpu, "Stream #13(Compute)", [("sm90_xmma_gemm_bf16", 0.0, 40.0, {}),
                                       ("loop_add_fusion", 100.0, 40.0, {})]),
        (gpu, "Stream #14(Compute)", [("cudnn_generated_fort_native_sdpa", 30.0, 30.0, {})]),
        # The derived line repeats the kernels' time; the host's spans are not device time.
        (gpu, "XLA Ops", [("fusion.1", 0.0, 140.0, {})]),
        ("/host:CPU", "python", [("PjitFunction(step)", 0.0, 500.0, {"hlo_op": "x"})]),
    )  # fmt: skip
    summary = profile_summary.summarize(trace, steps=2)
    assert summary["threads"] == ["Stream #13(Compute)", "Stream #14(Compute)"]
    assert summary["op_events"] == 3 and summary["ops_per_step"] == 1.5
    assert summary["busy_frac"] == pytest.approx(100 / 140)
    assert summary["window_ms_per_step"] == pytest.approx(0.140 / 2)
    assert summary["busy_ms_per_step"] == pytest.approx(0.100 / 2)
    assert summary["category_ms_per_step"] == pytest.approx(
        {"gemm": 0.040 / 2, "attention": 0.030 / 2, "other": 0.040 / 2}
    )
    assert summary["category_frac"] == pytest.approx(
        {"gemm": 40 / 110, "attention": 30 / 110, "other": 40 / 110}
    )
    assert [t["name"] for t in summary["top"]][:1] == ["sm90_xmma_gemm_bf16"]
    assert profile_summary.busy_time([(0, 5), (1, 2), (4, 9), (20, 21)]) == 10


def test_profile_summary_on_the_cpu_reads_the_ops_that_name_an_hlo_op():
    trace = _trace(
        ("/host:CPU", "tf_XLAEigen", [("dot.3", 10.0, 20.0, {"hlo_op": "dot.3"}),
                                      ("end: dot.3", 30.0, 0.0, {}),
                                      ("ThreadpoolListener::Record", 0.0, 90.0, {})]),
    )  # fmt: skip
    summary = profile_summary.summarize(trace, steps=1)
    assert summary["op_events"] == 1 and summary["category_frac"] == {"gemm": 1.0}
    assert summary["busy_frac"] == 1.0


def test_random_model_draws_each_parameter_by_its_kind():
    config = common.QWEN3_SHAPES["qwen3-tiny"]
    spec = embedding.ModelSpec("qwen3", config, "mean", None, config.to_hf())
    _, params = common.random_model(spec, dtype=jnp.bfloat16, seed=3)
    flat = {str(path): np.asarray(v) for path, v in jax.tree_util.tree_leaves_with_path(params)}
    norms = [v for k, v in flat.items() if "norm" in k]
    matrices = [v for k, v in flat.items() if "norm" not in k]
    assert norms and all((v == 1).all() for v in norms)
    assert all(v.dtype == np.float32 for v in flat.values())
    assert np.std(np.concatenate([v.ravel() for v in matrices])) == pytest.approx(0.02, rel=0.01)
    # Seeded: the same seed, the same weights; each matrix its own draw.
    _, again = common.random_model(spec, dtype=jnp.bfloat16, seed=3)
    again = [np.asarray(v) for v in jax.tree.leaves(again)]
    assert all(np.array_equal(a, b) for a, b in zip(flat.values(), again, strict=True))
    assert not np.array_equal(matrices[1][:1, :4], matrices[2][:1, :4])


def test_stratified_picks_take_quantiles():
    tokens = [30, 10, 80, 50, 20, 70, 40, 60]  # sorted positions: 1, 4, 0, 6, 3, 7, 5, 2
    # Quantiles 1/4 and 3/4 of 8 batches -> sorted positions 2 and 6.
    assert common.stratified_picks(tokens, num_batches=2) == [0, 5]
    with pytest.raises(ValueError, match="8 batches has fewer than 9"):
        common.stratified_picks(tokens, num_batches=9)


def test_pert_rows_of_both_layouts():
    stacked = {
        "input_ids": np.zeros((4, 8), np.int32),
        "attention_mask": np.array([[1] * 5 + [0] * 3] * 4, np.int32),
        "pert_attention_mask": np.array([[1, 1, 0, 0, 0, 0, 0, 0]] * 4, np.int32),
        "has_pert": np.array([False, True, False, True]),
    }
    stacked["pert_attention_mask"][3, :6] = 1
    rows, x_rows = common.pert_rows(stacked)
    np.testing.assert_array_equal(rows, [1, 3])
    np.testing.assert_array_equal(x_rows, [1, 3])
    assert common.real_lengths(stacked) == [5, 5, 5, 5, 2, 6]
    # Compact: the perturbed rows first, then padding rows whose pert_index is B = 4.
    compact = {**stacked, "pert_index": np.array([1, 3, 4], np.int32)}
    compact["pert_attention_mask"] = stacked["pert_attention_mask"][[1, 3, 0]]
    rows, x_rows = common.pert_rows(compact)
    np.testing.assert_array_equal(rows, [0, 1])
    np.testing.assert_array_equal(x_rows, [1, 3])
    assert common.real_lengths(compact) == common.real_lengths(stacked)


def test_choose_perturbations_takes_the_share(filing_passages):
    texts = filing_passages[:50]
    perturbed = common.choose_perturbations(texts, share=0.2, seed=0)
    assert sum(map(bool, perturbed)) == 10
    assert all(p != t for p, t in zip(perturbed, texts, strict=True) if p)
    assert perturbed == common.choose_perturbations(texts, share=0.2, seed=0)


def test_benchmark_batches_come_from_the_loader(tmp_path, minilm_dir):
    """`write_source` + `pipeline.make_loader`: the rows, teacher vectors and compact layout."""
    texts = [f"Revenue was {n} million dollars in {2000 + n}." * (1 + n % 3) for n in range(8)]
    perturbed = ["" if n % 2 else t.replace("million", "billion") for n, t in enumerate(texts)]
    source = common.write_source(tmp_path, texts, perturbed, dim=4, seed=0)
    assert source[2]["text"] == texts[2] and source[2]["has_pert"]
    tokenizer = tokenization.load_tokenizer(minilm_dir)
    loader = pipeline.make_loader(
        source, batch_size=4, seed=0, num_epochs=1, shuffle=True, process_index=0,
        process_count=1,
        tokenize_fn=lambda t, m: tokenization.tokenize(tokenizer, t, max_length=m),
        max_length=64, pad_id=0, pad_to_multiple=16, length_group_window=2, drop_remainder=True,
        worker_count=0, read_threads=1, pert_rows_multiple=4,
    )  # fmt: skip
    batches = list(loader)
    assert len(batches) == 2
    for batch in batches:
        rows, x_rows = common.pert_rows(batch)
        assert np.all(np.array(perturbed, dtype=object)[batch["index"][x_rows]] != "")
        np.testing.assert_allclose(np.linalg.norm(batch["teacher_x"], axis=1), 1.0, rtol=1e-5)
        np.testing.assert_array_equal(batch["teacher_px"][~batch["has_pert"]], 0.0)
        assert sorted(common.real_lengths(batch)[4:]) == sorted(
            len(tokenization.tokenize(tokenizer, [perturbed[i]], max_length=64)[0])
            for i in batch["index"][x_rows]
        )


@pytest.mark.parametrize("reduction", ["batch", "per_term"])
@pytest.mark.parametrize("perturb_weight", [1.0, 0.5])
def test_torch_reference_loss_is_the_library_loss(reduction, perturb_weight):
    rng = np.random.default_rng(0)

    def unit(shape):
        x = rng.standard_normal(shape).astype(np.float32)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    s_x, s_px, t_x, t_px = (unit((6, 8)) for _ in range(4))
    s_px[1] = s_x[1] + 0.01  # a near copy: the hinge is active on that row
    has_pert = np.array([False, True, True, False, True, False])
    expected, _ = losses.calibration_loss(
        jnp.asarray(s_x), jnp.asarray(s_px), jnp.asarray(t_x), jnp.asarray(t_px),
        jnp.asarray(has_pert), objective="caliber", lam=0.5, margin=0.05,
        perturb_weight=perturb_weight, reduction=reduction,
    )  # fmt: skip
    pert = np.flatnonzero(has_pert)
    got = torch_reference.caliber_loss(
        torch.from_numpy(s_x), torch.from_numpy(s_px[pert]), torch.from_numpy(t_x),
        torch.from_numpy(t_px[pert]), torch.from_numpy(pert), lam=0.5, margin=0.05,
        reduction=reduction, perturb_weight=perturb_weight,
    )  # fmt: skip
    assert float(got) == pytest.approx(float(expected), rel=1e-6)


class _FakeRunner:
    def __init__(self, name):
        self.name, self.steps = name, 0

    def run(self, index):
        self.steps += 1
        return 1.0

    def peak_memory(self):
        return "n/a"


def test_measure_takes_min_steps_whatever_the_budget():
    jax_runner, torch_runner = _FakeRunner("jax"), _FakeRunner("torch")
    compiling = concurrent.futures.Future()
    compiling.set_result(0.0)
    results, rounds = train_throughput.measure(
        jax_runner, compiling, lambda: torch_runner, 2, repeats=1, budget_s=1e-9, min_steps=9
    )
    assert rounds == 5  # ceil(9 / 2 batches)
    for name, runner in (("jax", jax_runner), ("torch", torch_runner)):
        assert sum(len(t) for t in results[name]["wall"]) == 10
        assert runner.steps == 11  # + the warm-up step
    _, rounds = train_throughput.measure(
        jax_runner, compiling, None, 3, repeats=4, budget_s=0.0, min_steps=1
    )
    assert rounds == 4


def test_measure_on_a_gpu_compiles_before_torch_touches_the_device():
    # The autotuner times kernels on the GPU: PyTorch may only start once every shape is built.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        compiling = pool.submit(lambda: time.sleep(0.2) or 0.2)

        def make_torch():
            assert compiling.done()
            return _FakeRunner("torch")

        results, _ = train_throughput.measure(
            _FakeRunner("jax"), compiling, make_torch, 1, repeats=1, budget_s=0.0, min_steps=1,
            compile_first=True,
        )  # fmt: skip
    assert set(results) == {"jax", "torch"}


def _watchers() -> int:
    return sum(thread.name == "hostmem-release" for thread in threading.enumerate())


def test_train_benchmark_runs_both_frameworks(capsys, tmp_path):
    watchers = _watchers()
    train_throughput.main(
        [
            "--preset", "cpu-minilm", "--lengths", "fixed:12", "--num-layers", "1",
            "--batch-size", "4", "--num-batches", "2", "--repeats", "1", "--time-budget-s", "0",
            "--min-steps", "2", "--compile-cache", str(tmp_path / "cache"),
            "--profile-dir", str(tmp_path / "profile"), "--profile-steps", "2",
            # The compiled PyTorch row's wiring, traced by AOTAutograd without Inductor's code
            # generation (a C++ compile of every graph takes minutes on this CPU).
            "--torch-compile", "reduce-overhead", "--torch-compile-backend", "aot_eager",
            *IN_PROCESS,
        ]
    )  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("cpu=") and "flags:" in lines[0]
    # JAX times the step `train` builds from the config (training_path.make_train_step).
    jax_step = next(line for line in lines if line.startswith("jax_step="))
    assert "training path: layout=packed, step=one_program" in jax_step, jax_step
    # The traced steps' summary (XLA:CPU: the host's op events).
    summary = json.loads((tmp_path / "profile" / "summary.json").read_text())
    assert summary["op_events"] > 0 and 0 < summary["busy_frac"] <= 1
    assert sum(summary["category_frac"].values()) == pytest.approx(1.0)
    assert f"profile_ops_per_step={summary['ops_per_step']:.1f}" in lines
    assert lines[1] == "host_malloc=default" and _watchers() == watchers
    assert re.fullmatch(r"ratio_jax_over_torch=\d+\.\d+", lines[-1])
    values = dict(line.split("=", 1) for line in lines if "=" in line and " " not in line)
    for name in ("jax", "torch", "torch_compiled"):
        assert float(values[f"{name}_seq_per_s"]) > 0
    # Each step shape reports when its compile ends (before the total, printed after all).
    compiled = [line for line in lines if line.startswith("jax_compiled shape=")]
    assert compiled and lines.index(compiled[-1]) < next(
        i for i, line in enumerate(lines) if line.startswith("jax_compile_s=")
    )
    # Same weights, same batch: both frameworks start from the same loss.
    assert float(values["jax_first_loss"]) == pytest.approx(
        float(values["torch_first_loss"]), rel=1e-4
    )
    # The compiled model is the same model: the same first loss as eager.
    assert float(values["torch_compiled_first_loss"]) == pytest.approx(
        float(values["torch_first_loss"]), rel=1e-5
    )
    assert (
        "torch_compile=reduce-overhead backend=aot_eager (PyTorch: the same passages, padded"
        in ("\n".join(lines))
    )
    # The ratio is against the strongest PyTorch row; each row's own ratio is printed too.
    torch_rates = {n: float(values[f"{n}_seq_per_s"]) for n in ("torch", "torch_compiled")}
    strongest = max(torch_rates, key=torch_rates.get)
    assert values["torch_strongest"] == strongest
    assert float(values["ratio_jax_over_torch"]) == pytest.approx(
        float(values["jax_seq_per_s"]) / torch_rates[strongest], rel=1e-2
    )
    assert float(values["ratio_jax_over_torch_eager"]) == pytest.approx(
        float(values["jax_seq_per_s"]) / torch_rates["torch"], rel=1e-2
    )
    assert float(values["ratio_jax_over_torch_compiled"]) == pytest.approx(
        float(values["jax_seq_per_s"]) / torch_rates["torch_compiled"], rel=1e-2
    )


def test_encode_benchmark_reads_any_model_directory(capsys, tmp_path, minilm_dir):
    """`--model-dir` (the cpu-mpnet preset's way in): the directory's own weights in both
    frameworks, so their vectors agree; here all-MiniLM-L6-v2 cut to one layer."""
    encode_throughput.main(
        [
            "--preset", "cpu-mpnet", "--model-dir", str(minilm_dir), "--num-layers", "1",
            "--passages", "6", "--batch-size", "4", "--repeats", "1", "--record-stride", "1",
            "--filings", str(REPO / "data" / "sample" / "filings.jsonl.gz"),
            "--compile-cache", str(tmp_path / "cache"), *IN_PROCESS,
        ]
    )  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    values = dict(line.split("=", 1) for line in lines if re.match(r"^\w+=", line))
    assert values["model"].startswith("dir layers=1 ")
    assert float(values["min_cosine_jax_vs_torch"]) >= 0.99999
    assert re.fullmatch(r"ratio_jax_over_torch=\d+\.\d+", lines[-1])


def test_encode_benchmark_times_bfloat16_against_float32_in_one_run(capsys, tmp_path, minilm_dir):
    """`--float32-baseline`: both frameworks in bfloat16 (the torch side under autocast on the
    CPU) and in float32, alternating; the bfloat16 vectors stay close to the float32 ones."""
    encode_throughput.main(
        [
            "--preset", "cpu-mpnet", "--model-dir", str(minilm_dir), "--num-layers", "1",
            "--passages", "6", "--batch-size", "4", "--repeats", "1", "--record-stride", "1",
            "--filings", str(REPO / "data" / "sample" / "filings.jsonl.gz"),
            "--compile-cache", str(tmp_path / "cache"), "--dtype", "bfloat16",
            "--float32-baseline", *IN_PROCESS,
        ]
    )  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    values = dict(line.split("=", 1) for line in lines if re.match(r"^\w+=", line))
    for name in ("jax", "torch", "jax_float32", "torch_float32"):
        assert float(values[f"{name}_passages_per_s"]) > 0
    for name in ("jax", "torch"):
        assert 0.99 < float(values[f"min_cosine_{name}_bfloat16_vs_float32"]) < 1.0
        assert float(values[f"ratio_{name}_bfloat16_over_float32"]) > 0
    assert float(values["min_cosine_jax_vs_torch"]) > 0.99


@pytest.mark.slow(50)
def test_end_to_end_benchmark_on_the_sample_filings(tmp_path):
    """prepare -> teacher vectors -> `caliber_jax.train` and the PyTorch loop, 4 steps each."""
    command = [
        sys.executable, str(REPO / "benchmarks" / "train_end_to_end.py"),
        "--filings", str(REPO / "data" / "sample" / "filings.jsonl.gz"), "--max-passages", "32",
        "--batch-size", "8", "--num-layers", "1", "--set", "data.max_length=32",
        "--set", "teacher.max_length=32", "--workdir", str(tmp_path),
    ]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("cpu=") and "flags:" in lines[0]
    assert re.fullmatch(r"ratio_jax_over_torch=\d+\.\d+", lines[-1])
    values = dict(line.split("=", 1) for line in lines if re.match(r"^\w+=", line))
    # The same epoch: 32 passages in 4 batches of 8 for both frameworks.
    for name in ("jax", "torch"):
        assert values[f"{name}_steps"] == "4" and values[f"{name}_rows"] == "32"
    # Same init, same batches in the same order, same loss and optimizer: same last loss.
    assert float(values["jax_final_loss"]) == pytest.approx(
        float(values["torch_final_loss"]), rel=1e-4
    )
    ratio = float(values["jax_seq_per_s"]) / float(values["torch_seq_per_s"])
    assert float(lines[-1].split("=")[1]) == pytest.approx(ratio, rel=1e-2)


@pytest.mark.parametrize("module", [train_throughput, encode_throughput])
def test_a_missing_filings_file_is_one_line_and_status_2(capsys, tmp_path, module):
    # As a fresh clone without ../shared meets the default path: one line, no traceback.
    missing = tmp_path / "none" / "filings.jsonl.gz"
    with pytest.raises(SystemExit) as exit_info:
        common.run_main(
            module.main, ["--preset", "cpu-minilm", "--filings", str(missing), *IN_PROCESS]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and str(missing) in err and "\n" not in err
    # --traceback shows the error itself.
    with pytest.raises(FileNotFoundError):
        common.run_main(module.main, ["--preset", "cpu-minilm", "--filings", str(missing),
                                      "--traceback", *IN_PROCESS])  # fmt: skip


@pytest.mark.parametrize("scan", [False, True])
def test_compile_depth_measures_every_phase(minilm_dir, scan):
    times = compile_depth.measure(
        str(minilm_dir), layers=2, scan=scan, batch=2, length=8, repeats=1
    )
    assert set(times) == {"trace", "lower", "compile", "step"}
    assert all(value > 0 for value in times.values())


@pytest.mark.parametrize("outside", ["", "--xla_dump_to=/tmp/x"])
def test_hold_avx2_keeps_outside_xla_flags_and_holds_every_library(outside):
    """benchmarks/hold_avx2.sh: XLA's flag appended to the caller's, every library held."""
    script = "source benchmarks/hold_avx2.sh && env -0"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if outside:
        env["XLA_FLAGS"] = outside
    out = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True,
                         check=True).stdout.decode()  # fmt: skip
    held = dict(line.split("=", 1) for line in out.split("\0") if "=" in line)
    assert held["XLA_FLAGS"] == f"{outside} --xla_cpu_max_isa=AVX2".strip()
    assert held["ONEDNN_MAX_CPU_ISA"] == held["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    assert held["ATEN_CPU_CAPABILITY"] == "avx2" and held["OPENBLAS_CORETYPE"] == "Haswell"
    assert "AVX512F" in held["NPY_DISABLE_CPU_FEATURES"].split()
