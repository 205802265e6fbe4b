"""The training entry point, run as users run it: overrides, crash + resume, non-finite stop."""

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from etils import epath

from caliber_jax import checkpoint, cli, run_config, watchdog
from caliber_jax.data import pipeline
from tests.conftest import device_env, prepare_sample

REPO = Path(__file__).resolve().parents[1]
LR = 1e-3
TINY = [
    "--config.model.num_layers=1",
    "--config.data.max_length=48",
    "--config.batch_size=8",
    "--config.total_steps=6",
    "--config.checkpoint_every=2",
    "--config.eval_every=3",
    "--config.log_every=1",
    f"--config.optim.lr={LR}",
]


@pytest.fixture(scope="module")
def data_dir(teacher_data_dir):
    """Prepared demo-sample passages and real all-MiniLM-L6-v2 teacher vectors (small), shared
    with the multi-process tests (tests/conftest.py)."""
    return teacher_data_dir


def run_module(module, *args, wait=True, devices=1):
    """`module` with configs/demo.py; the process sees `devices` CPU devices (tests/conftest.py)."""
    command = [sys.executable, "-m", module, f"--config={REPO / 'configs' / 'demo.py'}", *args]
    env = dict(os.environ if devices == 1 else device_env(devices), PYTHONUNBUFFERED="1")
    if not wait:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)


def train(data_dir, workdir, *extra, wait=True, devices=1):
    return run_module(
        "caliber_jax.train", f"--config.data.dir={data_dir}", f"--workdir={workdir}", *TINY, *extra,
        wait=wait, devices=devices,
    )  # fmt: skip


def train_in_process(data_dir, workdir, *extra, devices=1):
    """`train`'s run (configs/demo.py, TINY, then `extra` as `--config.a.b=value` overrides) as
    `caliber_jax.train.train(config, workdir)` in this process, its mesh over the first `devices`
    of the tests' 8 simulated ones: the same sharded programs as a launch on `devices` devices,
    without a launch's ~3 s of imports, and built from this process's caches (each step finishes
    before the next is issued, `TrainingPath.in_order`: the process has 8 devices). For what
    needs no process boundary (the CLI's flags, exit statuses and one-line errors are checked by
    the launches above). Returns the summary `train()` returns."""
    import jax

    from caliber_jax import sharding
    from caliber_jax import train as train_lib
    from configs import demo

    count = devices
    config = demo.get_config()
    config.lock()  # a mistyped override fails, as with the CLI's lock_config=True
    for override in (f"--config.data.dir={data_dir}", *TINY, *extra):
        path, _, value = override.removeprefix("--config.").partition("=")
        *nodes, name = path.split(".")
        node = config
        for part in nodes:
            node = node[part]
        # As the CLI reads a value: a Python literal, except for a string field.
        node[name] = value if isinstance(node[name], str) else ast.literal_eval(value)
    make_mesh = sharding.make_mesh

    def first_devices(*, fsdp=1, devices=None):
        assert devices is None
        return make_mesh(fsdp=fsdp, devices=jax.devices()[:count])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sharding, "make_mesh", first_devices)
        return train_lib.train(config, str(workdir))


def test_overrides_reach_the_config_and_typos_fail(data_dir, tmp_path):
    result = train(data_dir, tmp_path / "run", "--config.loss.lam=0.25", "--config.total_steps=2")
    assert result.returncode == 0, result.stderr[-3000:]
    written = json.loads((tmp_path / "run" / "config.json").read_text())
    assert written["loss"]["lam"] == 0.25 and written["total_steps"] == 2
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["step"] == 2 and np.isfinite(summary["train/loss"])
    for key in ("align_x", "align_px", "num", "delta_s", "delta_t", "lr", "grad_norm",
                "seq_per_s", "tokens_per_s"):  # fmt: skip
        assert f"train/{key}" in summary
    typo = train(data_dir, tmp_path / "typo", "--config.loss.lamda=1")
    assert typo.returncode != 0 and "lamda" in typo.stderr


@pytest.mark.slow(65)
def test_killed_run_resumes_bit_identically(data_dir, tmp_path):
    straight = train(data_dir, tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr[-3000:]

    workdir = tmp_path / "killed"
    proc = train(data_dir, workdir, wait=False)
    wait_for(lambda: (workdir / "checkpoints" / "2").is_dir(), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps and steps[-1] < 6
    resumed = train(data_dir, workdir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr
    # Running a finished run again changes nothing and keeps its summary of the steps trained.
    summary = (workdir / "summary.json").read_text()
    again = train(data_dir, workdir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already trained to step 6" in again.stderr
    assert (workdir / "summary.json").read_text() == summary
    # Resumed with another setting that changes what it computes: refused, config.json kept
    # (export reads the model's shape and length from it).
    config_json = (workdir / "config.json").read_text()
    changed = train(data_dir, workdir, "--config.data.max_length=32")
    assert changed.returncode == 2 and "Traceback" not in changed.stderr
    assert (
        changed.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"error: {workdir} holds a run trained to step 6 with other settings: "
            "data.max_length=32 (the run's 48)"
        )
    )
    assert (workdir / "config.json").read_text() == config_json
    assert json.loads(summary)["steps_run"] == 6 - steps[-1]

    # One metrics row per step, as the straight run logs them: the rows the killed run wrote
    # after its last checkpoint are replaced, not repeated, and the losses are the same.
    def rows_of(run):
        return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]

    rows, rows_straight = rows_of(workdir), rows_of(tmp_path / "straight")
    assert [row["step"] for row in rows] == [row["step"] for row in rows_straight]
    assert [row.get("train/loss") for row in rows] == [
        row.get("train/loss") for row in rows_straight
    ]

    a, step_a = checkpoint.restore_params(tmp_path / "straight" / "checkpoints")
    b, step_b = checkpoint.restore_params(workdir / "checkpoints")
    assert step_a == step_b == 6
    flat_a, flat_b = _flatten(a), _flatten(b)
    assert flat_a.keys() == flat_b.keys()
    for name in flat_a:
        np.testing.assert_array_equal(flat_a[name], flat_b[name], err_msg=name)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_checkpoints_and_exits(data_dir, tmp_path, signum):
    """SIGTERM (preemption) and one Ctrl-C (SIGINT; it was a KeyboardInterrupt traceback and
    the steps since the last checkpoint lost) both save the step reached and stop."""
    workdir = tmp_path / "term"
    proc = train(data_dir, workdir, "--config.total_steps=400", "--config.checkpoint_every=100",
                 wait=False)  # fmt: skip
    wait_for(lambda: (workdir / "metrics.jsonl").is_file(), proc)
    time.sleep(2)  # a few steps in
    proc.send_signal(signum)
    # Not finished: status 75 (EX_TEMPFAIL) stops `train && export`; no final summary.
    assert proc.wait(timeout=120) == 75
    stderr = proc.stderr.read()
    assert f"stopped by {signal.Signals(signum).name} at step" in stderr
    assert "the same command resumes it" in stderr and "Traceback" not in stderr
    assert not (workdir / "summary.json").exists()
    steps = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert steps and 0 < max(steps) < 400
    # The stop step's checkpoint (saved asynchronously) was finished before the exit: restorable,
    # and no temporary directory of an unfinished write is left.
    metrics = (workdir / "metrics.jsonl").read_text().splitlines()
    logged = [json.loads(line)["step"] for line in metrics]
    assert checkpoint.restore_params(workdir / "checkpoints")[1] == max(logged) == max(steps)
    assert all(p.name.isdigit() for p in (workdir / "checkpoints").iterdir())


def test_watchdog_ends_a_run_that_hangs_in_start_up(data_dir, tmp_path):
    """config.watchdog_*: the watchdog runs from the top of train(), so a start-up that never
    ends (here its passages file is a FIFO nobody writes: a stuck network filesystem) dumps every
    thread's stack on stderr and exits 124 (watchdog.EXIT_STALLED), not a hang."""
    hung = tmp_path / "data"
    hung.mkdir()
    for entry in Path(data_dir).iterdir():
        (hung / entry.name).symlink_to(entry)
    (hung / "train.jsonl").unlink()
    os.mkfifo(hung / "train.jsonl")
    # A start-up limit of 10 s: time for a loaded machine to reach the passages file (at 0.2 s
    # the stack was dumped while the weights were still loading, on a busy 2-core machine).
    proc = train(hung, tmp_path / "stall", "--config.watchdog_factor=1",
                 "--config.watchdog_min_s=10", wait=False)  # fmt: skip
    try:
        _, stderr = proc.communicate(timeout=120)  # the limit, a 1 s poll, a 5 s grace period
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("train hung in start-up: no watchdog")
    assert proc.returncode == watchdog.EXIT_STALLED, stderr[-3000:]
    assert "watchdog: " in stderr and "in start-up before the first step" in stderr
    assert "in load_passages" in stderr  # faulthandler's frame of the stuck main thread
    assert re.search(r'train\.py", line \d+ in _?train\n', stderr), stderr[-3000:]
    assert not (tmp_path / "stall" / "summary.json").exists()


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(data_dir, tmp_path):
    # FloatingPointError is one of the CLI's one-line user errors (cli.USER_ERRORS, exit 2).
    with pytest.raises(FloatingPointError, match="non-finite"):
        train_in_process(data_dir, tmp_path / "nan", "--config.optim.lr=1e30",
                         "--config.optim.clip_norm=0", "--config.checkpoint_every=1")  # fmt: skip
    steps = [int(p.name) for p in (tmp_path / "nan" / "checkpoints").iterdir() if p.name.isdigit()]
    if steps:  # every checkpoint left behind holds finite params
        params, _ = checkpoint.restore_params(tmp_path / "nan" / "checkpoints")
        assert all(np.isfinite(v).all() for v in _flatten(params).values())


def test_prepared_splits_load_with_their_teacher_stores(data_dir):
    texts, perturbed = pipeline.load_passages(data_dir / "train.jsonl")
    assert len(texts) == 64 and any(perturbed)
    source = pipeline.TrainSource(
        data_dir / "train.jsonl",
        teacher_x_path=data_dir / "teacher_train" / "x",
        teacher_px_path=data_dir / "teacher_train" / "px",
        dim=384,
    )
    row = source[0]
    assert row["teacher_x"].shape == (384,)
    np.testing.assert_allclose(np.linalg.norm(row["teacher_x"]), 1.0, atol=1e-5)


def wait_for(predicate, proc, timeout=300):
    deadline = time.time() + timeout
    while not predicate():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.time() < deadline, "timed out"
        time.sleep(0.2)


def _flatten(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = np.asarray(value)
    return out


@pytest.mark.slow(40)
def test_demo_loss_falls_over_two_dozen_steps(data_dir, tmp_path):
    summary = train_in_process(data_dir, tmp_path / "fall", "--config.total_steps=24",
                               "--config.checkpoint_every=24", "--config.eval_every=24",
                               "--config.eval_at_start=True")  # fmt: skip
    assert summary["step"] == 24
    lines = (tmp_path / "fall" / "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(line)["train/loss"] for line in lines if "train/loss" in line]
    assert len(losses) == 24
    assert np.mean(losses[-6:]) < 0.85 * np.mean(losses[:6]), losses
    # validation before the first step (eval_at_start) and after the last: the curve falls
    val = {row["step"]: row for row in map(json.loads, lines) if "val/loss" in row}
    assert sorted(val) == [0, 24]
    assert val[24]["val/align_x"] < val[0]["val/align_x"], val


def test_accumulation_counts_updates(data_dir, tmp_path):
    """The logged lr is the optimizer's own schedule, counted in updates, with the config's
    `end_lr_frac` (a schedule built apart from the optimizer once logged it without)."""
    summary = train_in_process(data_dir, tmp_path / "acc", "--config.total_steps=6",
                               "--config.optim.accum_steps=2", "--config.optim.warmup_frac=0.34",
                               "--config.optim.end_lr_frac=0.5")  # fmt: skip
    assert summary["step"] == 6
    lines = [
        json.loads(line) for line in (tmp_path / "acc" / "metrics.jsonl").read_text().splitlines()
    ]
    lrs = [line["train/lr"] for line in lines if "train/lr" in line]
    # 6 micro-batches = 3 updates, int(0.34 * 3) = 1 warm-up update: lr 0 (update 0), then the
    # linear decay over the 2 others from 1e-3 to 0.5e-3 at the end: 1e-3, 1e-3 * (1 - 0.5 / 2).
    np.testing.assert_allclose(lrs, [0.0, 0.0, 1e-3, 1e-3, 0.75e-3, 0.75e-3], atol=1e-9)


class PackedRun(NamedTuple):
    params: dict[str, np.ndarray]
    summary: dict
    workdir: Path


@pytest.fixture(scope="module")
def packed_run(data_dir, tmp_path_factory):
    """`packed_run(compile_ahead)`: a finished run of TINY at batch 16 in packed rows of 48
    tokens on 2 devices (`train_in_process`), each setting trained once per module.

    About one sequence per row, the row counts a multiple of 2 devices (data parallel): the 16 x
    and their pi(x) take one of the ladder's row counts by step, so a run meets two or more step
    programs. (2 devices, not the tests' 8: the same sharded programs, built ~30% faster.)"""
    root = tmp_path_factory.mktemp("packed")
    done = {}

    def run(ahead: bool) -> PackedRun:
        if ahead not in done:
            workdir = root / f"ahead_{ahead}"
            summary = train_in_process(data_dir, workdir, f"--config.compile_ahead={ahead}",
                                       "--config.batch_size=16", "--config.data.pack_length=48",
                                       devices=2)  # fmt: skip
            params = _flatten(checkpoint.restore_params(workdir / "checkpoints")[0])
            done[ahead] = PackedRun(params, summary, workdir)
        return done[ahead]

    return run


@pytest.mark.slow(40)
def test_compile_ahead_trains_the_same_params(packed_run):
    """Programs built on the compile-ahead threads are the programs jit builds: same params."""
    (params_on, on, _), (params_off, off, _) = (packed_run(ahead) for ahead in (True, False))
    assert 2 <= on["compile/step_programs"] == off["compile/step_programs"] <= 3
    assert 1 <= on["compile/step_programs_ahead"] <= on["compile/step_programs"]
    assert off["compile/step_programs_ahead"] == 0
    for name in params_off:
        np.testing.assert_array_equal(params_on[name], params_off[name], err_msg=name)


def test_second_identical_launch_compiles_nothing(data_dir, tmp_path):
    """The persistent compilation cache: a relaunch reads every program instead of compiling."""
    cache = f"--compilation_cache={tmp_path / 'xla'}"
    first = train(data_dir, tmp_path / "first", cache, "--config.total_steps=3")
    assert first.returncode == 0, first.stderr[-3000:]
    second = train(data_dir, tmp_path / "second", cache, "--config.total_steps=3")
    assert second.returncode == 0, second.stderr[-3000:]
    one = json.loads((tmp_path / "first" / "summary.json").read_text())
    two = json.loads((tmp_path / "second" / "summary.json").read_text())
    assert one["compile/compiled"] > 0 and one["compile/step_programs"] >= 1
    assert two["compile/compiled"] == 0
    assert two["compile/cache_hits"] == two["compile/programs"] == one["compile/programs"]
    assert two["compile/step_programs"] == one["compile/step_programs"]
    # The train log states it too.
    assert "0 compiled," in second.stdout and "train-step shapes" in second.stdout
    # ...and where the time to the first step went: the phases add up to the total.
    for run in (first, second):
        line = re.search(
            r"first step done ([\d.]+) s after train\(\) began: (.*) \(XLA", run.stderr
        )
        assert line, run.stderr[-2000:]
        phases = dict(part.rsplit(" ", 2)[:2] for part in line.group(2).split(", "))
        assert list(phases) == [
            "weights",
            "inputs and W_out",
            "model state",
            "token lengths and loader",
            "train state",
            "first step",
        ]
        # Each figure is rounded to 0.1 s: the sum may be off by 0.05 per phase.
        assert abs(sum(map(float, phases.values())) - float(line.group(1))) <= 0.05 * 6 + 1e-9


def test_startup_line_splits_the_time_to_the_first_step():
    from caliber_jax.cli import startup_line

    marks = [("began", 10.0), ("weights", 12.5), ("model state", 13.0), ("first step", 40.25)]
    stats = {"compile_seconds": 21.0, "trace_seconds": 3.25, "lower_seconds": 1.0,
             "programs": 7, "cache_hits": 2}  # fmt: skip
    assert startup_line(marks, stats) == (
        "first step done 30.2 s after train() began: weights 2.5 s, model state 0.5 s, "
        "first step 27.2 s (XLA compiling or loading so far: 21.0 s; tracing 3.2 s, lowering "
        "1.0 s; 7 programs, 2 from the cache)"
    )


def test_input_errors_are_one_line(data_dir, tmp_path):
    missing = train(tmp_path / "nowhere", tmp_path / "run")
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'nowhere' / 'train.jsonl'}: missing; run `python -m "
        "caliber_jax.prepare` and `python -m caliber_jax.embed_teacher` with this config first"
    ]
    assert not (tmp_path / "run" / "config.json").exists()  # nothing written by a failed start
    # A model folder given as --workdir: its config.json is not replaced by the run's.
    model_dir = tmp_path / "exported"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"model_type": "bert"}')
    into_model = train(data_dir, model_dir)
    assert into_model.returncode == 2
    assert into_model.stderr.strip().splitlines()[-1] == (
        f"error: {model_dir / 'config.json'} is not a training run's config (a model folder?): "
        "--workdir must be a run's own folder; choose another"
    )
    assert (model_dir / "config.json").read_text() == '{"model_type": "bert"}'
    typo = train(data_dir, tmp_path / "typo", "--config.optim.lr=fast")
    assert typo.returncode == 2 and "Traceback" not in typo.stderr
    assert typo.stderr.strip().splitlines()[-1].startswith("error: flag --config.optim.lr=fast")
    shown = train(tmp_path / "nowhere", tmp_path / "run", "--traceback")
    assert shown.returncode != 0 and "Traceback" in shown.stderr
    cudnn = train(data_dir, tmp_path / "cudnn", "--config.model.attention=cudnn")
    assert cudnn.returncode == 2 and "Traceback" not in cudnn.stderr
    assert cudnn.stderr.strip().splitlines()[-1] == (
        "error: config.model.attention='cudnn' needs a GPU (cuDNN's fused attention); this "
        "run's backend is 'cpu': use 'xla'"
    )
    assert not (tmp_path / "cudnn").exists()  # refused before config.json and W_out's fit


def test_least_squares_w_out_starts_near_the_teacher_and_export_blends_from_it(
    tmp_path_factory, tmp_path, capsys
):
    """model.w_out_init="lstsq": W_out (384 -> 128, teacher MRL-truncated to 128) is fitted once
    before step 0, kept in the workdir, and `export --interpolate 0` writes exactly that start."""
    from safetensors import safe_open

    from caliber_jax import w_out_init
    from caliber_jax.models import hf

    data = prepare_sample(tmp_path_factory.mktemp("data128"))
    dim = ["--config.model.out_dim=128"]
    result = run_module("caliber_jax.embed_teacher", f"--config.data.dir={data}",
                        "--config.teacher.max_length=48", *dim)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    first = {}
    for init in ("xavier", "lstsq"):
        summary = train_in_process(data, tmp_path / init, *dim, f"--config.model.w_out_init={init}",
                                   "--config.total_steps=1")  # fmt: skip
        assert summary["step"] == 1
        lines = (tmp_path / init / "metrics.jsonl").read_text().splitlines()
        first[init] = next(json.loads(line) for line in lines if "train/loss" in line)
    fitted = tmp_path / "lstsq" / w_out_init.FILE
    assert fitted.is_file() and not (tmp_path / "xavier" / w_out_init.FILE).exists()
    with safe_open(fitted, framework="np") as opened:
        report = json.loads(opened.metadata()["report"])
    assert report["rows"] == 64 and report["heldout_rows"] == 6
    assert "W_out fitted by least squares" in capsys.readouterr().err
    # A random projection starts at cos ~0 to the teacher (||s - t|| ~ sqrt 2); the fitted one
    # points at it on the passages it was fitted on.
    assert first["xavier"]["train/align_x"] > 1.2
    assert first["lstsq"]["train/align_x"] < 0.5 * first["xavier"]["train/align_x"], first

    out = tmp_path / "blend0"
    result = subprocess.run(
        [sys.executable, "-m", "caliber_jax.export", f"--workdir={tmp_path / 'lstsq'}",
         f"--output={out}", "--interpolate=0"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    dense = hf.read_safetensors(out / "2_Dense")
    np.testing.assert_allclose(
        dense["linear.weight"], w_out_init.load(fitted)["dense.kernel"].T, atol=1e-7
    )


@pytest.mark.parametrize(
    "field, value, message",
    [("log_every", 0, "config.log_every=0: expected an integer >= 1"),
     ("checkpoint_every", 0, "config.checkpoint_every=0"),
     ("eval_every", 0, "config.eval_every=0"),
     ("optim.accum_steps", 0, "config.optim.accum_steps=0"),
     ("keep_checkpoints", 0, "config.keep_checkpoints=0: expected an integer >= 1"),
     ("batch_size", 0, "config.batch_size=0: expected an integer >= 1"),
     ("total_steps", -5, "config.total_steps=-5: expected an integer >= 1, or 0 for"),
     ("num_epochs", 0.0, "config.num_epochs=0.0: expected > 0"),
     ("loss.objective", "neighbor", "config.loss.objective='neighbor': expected one of"),
     ("loss.reduction", "mean", "config.loss.reduction='mean'"),
     ("loss.contrastive_temperature", 0.0, "config.loss.contrastive_temperature=0.0"),
     ("model.w_out_init", "pca", "config.model.w_out_init='pca', expected one of")],
)  # fmt: skip
def test_a_config_the_run_would_stop_on_later_is_one_line_first(field, value, message):
    """Zero where the loop divides by it, or a loss setting read only when the step is traced:
    refused before any weight is read, naming the field."""
    from configs import caliber

    config = caliber.get_config()
    config.loss.contrastive_weight = 1.0
    run_config.check_config(config, backend="cpu", devices=8)  # the shipped config passes
    node, _, name = field.rpartition(".")
    (config[node] if node else config)[name] = value
    with pytest.raises(ValueError, match=re.escape(message)):
        run_config.check_config(config, backend="cpu", devices=8)


def test_a_config_error_found_only_on_the_machine_is_refused_first_too():
    """cuDNN attention off a GPU, and a batch the devices do not divide: `check_config` refuses
    them, before the workdir's config.json is written and W_out fitted (here on a CPU machine of
    8 devices)."""
    from configs import caliber

    config = caliber.get_config()
    config.model.attention = "cudnn"
    with pytest.raises(ValueError, match=re.escape("config.model.attention='cudnn' needs a GPU")):
        run_config.check_config(config, backend="cpu", devices=8)
    config = caliber.get_config()
    config.batch_size = 12
    with pytest.raises(ValueError, match=re.escape("config.batch_size=12: not divisible by 8")):
        run_config.check_config(config, backend="cpu", devices=8)
    config = caliber.get_config()
    config.mesh.fsdp = 3
    with pytest.raises(ValueError, match=re.escape("fsdp=3 must divide the device count 8")):
        run_config.check_config(config, backend="cpu", devices=8)


def test_train_gives_the_callers_signal_handlers_back(data_dir, tmp_path):
    """`train()` catches SIGTERM and Ctrl-C while it runs (checkpoint and stop); once it returns,
    the caller's handlers are back: a notebook or script that trains keeps its own Ctrl-C."""

    def mine(signum, frame):
        del signum, frame

    before = {signum: signal.signal(signum, mine) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        summary = train_in_process(data_dir, tmp_path / "run", "--config.total_steps=1",
                                   "--config.data.validate=False")  # fmt: skip
        assert summary["step"] == 1
        assert signal.getsignal(signal.SIGINT) is mine
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_validation_keeps_one_batch_in_flight(monkeypatch):
    """`evaluate` issues the next batch before it pulls the last one's sums to the host, so the
    loader's host work and the host-to-device copy overlap the device's work on a batch."""
    import jax
    import jax.numpy as jnp

    from caliber_jax import sharding
    from caliber_jax import train as train_lib

    events = []

    def loader():
        for index in range(3):
            events.append(f"next {index}")
            yield {"x": np.full((8, 2), index + 1.0, np.float32)}

    jitted = jax.jit(lambda params, batch: {
        "loss": jnp.sum(batch["x"]) * params, "rows": jnp.float32(8.0),
        "pert_rows": jnp.float32(4.0), "term_rows": jnp.float32(2.0),
    })  # fmt: skip

    def eval_fn(params, batch):
        events.append("issue")
        return jitted(params, batch)

    device_get = jax.device_get

    def fetch(tree):
        events.append("fetch")
        return device_get(tree)

    monkeypatch.setattr(jax, "device_get", fetch)
    out = train_lib.evaluate(eval_fn, jnp.float32(0.5), loader, sharding.make_mesh())
    assert events == ["next 0", "issue", "next 1", "issue", "fetch", "next 2", "issue", "fetch",
                      "fetch"]  # fmt: skip
    assert out["val/loss"] == 0.5 * 16 * (1 + 2 + 3) / 24 and out["val/term_frac"] == 0.25


def test_a_run_resumes_only_with_its_own_settings(tmp_path):
    """With checkpoints in the workdir, a field that changes what the run computes (length,
    learning rate, step count, layers) is refused, naming it; how it logs and saves may change;
    before the first checkpoint the new settings stand; fields only one version has are not
    compared."""
    from caliber_jax import train as train_lib
    from configs import caliber

    workdir = epath.Path(tmp_path)
    config = caliber.get_config()
    train_lib.write_config(config, workdir)
    run_config.check_workdir_config(config, workdir)
    other = caliber.get_config()
    other.optim.lr, other.total_steps = 3e-4, 10
    run_config.check_workdir_config(other, workdir)  # nothing trained yet
    (workdir / "checkpoints" / "20").mkdir(parents=True)
    (workdir / "checkpoints" / "40.orbax-checkpoint-tmp-1").mkdir()
    message = (
        f"{workdir} holds a run trained to step 20 with other settings: total_steps=10 (the "
        "run's 0); optim.lr=0.0003 (the run's 0.0001). Resume it with its own"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        run_config.check_workdir_config(other, workdir)
    operational = caliber.get_config()
    operational.log_every, operational.keep_checkpoints, operational.model.attention = 7, 9, "cudnn"
    operational.teacher.batch_size = 8
    run_config.check_workdir_config(operational, workdir)
    saved = json.loads((workdir / "config.json").read_text())
    del saved["loss"]["lam"]
    saved["loss"]["a_field_of_an_older_version"] = 1
    assert run_config.resume_conflicts(saved, json.loads(config.to_json_best_effort())) == []
    (workdir / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json: not JSON"):
        run_config.check_workdir_config(config, workdir)


def test_a_run_resumes_only_with_its_own_loader_worker_count(tmp_path):
    """Grain's saved iterator position has one layout without workers and another with them (and
    one entry per worker): a resume with another data.worker_count failed with a KeyError once
    weights, lengths and compiles had started (0 -> 2, 2 -> 0), or restored a position that
    replays or skips batches (2 -> 3). Refused up front, naming the field."""
    from caliber_jax import train as train_lib
    from configs import caliber

    workdir = epath.Path(tmp_path)
    config = caliber.get_config()
    config.data.worker_count = 0
    train_lib.write_config(config, workdir)
    (workdir / "checkpoints" / "20").mkdir(parents=True)
    for before, after in ((0, 2), (2, 0), (2, 3)):
        config.data.worker_count = before
        train_lib.write_config(config, workdir)
        config.data.worker_count = after
        message = f"data.worker_count={after} (the run's {before})"
        with pytest.raises(ValueError, match=re.escape(message)):
            run_config.check_workdir_config(config, workdir)
    config.data.worker_count, config.data.read_threads = 2, 1  # read threads may change
    run_config.check_workdir_config(config, workdir)


def test_neighbour_objective_without_neighbours_is_refused(tmp_path):
    """Without a "neighbour" per training passage the neighbour hinge covers no row: the run
    would train the alignment alone and log num = 0. It is refused, naming both fields."""
    from types import SimpleNamespace

    from configs import caliber

    config = caliber.get_config()
    source = SimpleNamespace(neighbours=None, passages_path=tmp_path / "train.jsonl")
    run_config.check_source(config, source)  # "caliber" needs none
    config.loss.objective = "neighbour"
    with pytest.raises(ValueError, match=r"objective='neighbour' needs .*prepare.neighbour_k"):
        run_config.check_source(config, source)
    run_config.check_source(config, SimpleNamespace(neighbours=np.zeros(4, np.int64)))


def test_micro_batches_are_cut_to_whole_updates(capsys):
    """With accumulation a remainder of micro-batches would be accumulated and never applied:
    the run trains whole updates and says so; fewer than one update is an error."""
    from caliber_jax import train as train_lib
    from configs import caliber

    config = caliber.get_config()
    config.optim.accum_steps = 4
    config.total_steps = 10
    assert train_lib.total_steps(config, 1000) == 8
    assert "10 micro-batches cut to 8" in capsys.readouterr().err
    config.total_steps = 3
    with pytest.raises(ValueError, match="accum_steps=4: the run has 3 micro-batches"):
        train_lib.total_steps(config, 1000)


def test_compile_summary_names_the_first_program_and_the_longest(capsys):
    """The first step's program (built alone) is what the autotuner's trade is read against."""

    summary = cli.compile_summary(3, ahead=2, build_seconds=[5.0, 2.0, 7.5])
    assert summary["compile/first_program_s"] == 5.0 and summary["compile/program_s_max"] == 7.5
    assert "step programs built in 5.0 s (the first, alone), 7.5 s the longest" in (
        capsys.readouterr().out
    )
    assert "compile/first_program_s" not in cli.compile_summary(1)
