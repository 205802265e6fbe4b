"""metrics.jsonl across a resume: one row per step."""

import json

from caliber_jax import metrics_log


def test_a_resumed_run_logs_each_step_once(tmp_path):
    """A run killed after logging steps 1-5 and a torn sixth row, resumed from its checkpoint at
    step 3: the writer drops rows 4, 5 and the torn one, then logs 4 again; nothing is rewritten
    when nothing is past the step."""
    log = tmp_path / "metrics.jsonl"
    rows = [json.dumps({"step": step, "train/loss": 1.0 / step}) + "\n" for step in range(1, 6)]
    log.write_text("".join(rows) + '{"step": 6, "train/lo')
    writer = metrics_log.MetricsWriter(tmp_path, tensorboard=False, start=3)
    writer.write({"train/loss": 0.25}, 4)
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [row["step"] for row in logged] == [1, 2, 3, 4]
    assert logged[3]["train/loss"] == 0.25
    before = log.stat().st_mtime_ns
    metrics_log.trim_after(log, last_step=4)
    assert log.stat().st_mtime_ns == before
    metrics_log.trim_after(tmp_path / "absent.jsonl", last_step=0)  # a fresh run: nothing to do
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_process_other_than_the_first_writes_nothing(tmp_path):
    """Only the first process logs: the others' writers touch no file, not even to trim one."""
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 5}\n')
    writer = metrics_log.MetricsWriter(tmp_path, tensorboard=True, start=3, active=False)
    writer.write({"train/loss": 0.25}, 4)
    writer.close()
    assert log.read_text() == '{"step": 5}\n' and not (tmp_path / "tensorboard").exists()
