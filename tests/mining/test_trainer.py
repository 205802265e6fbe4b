"""Triplet retraining on the project's machinery: the loss falls, resume, export round trip."""

import json
import shutil

import jax
import numpy as np
import pytest

from caliber_jax import export, sharding
from caliber_jax.embedder import Embedder
from caliber_jax.mining import trainer
from configs import mine

# configs/mine.py's optimiser fields, at a constant 1e-3 without weight decay or warm-up.
OPTIM = dict(mine.get_config().optim, lr=1e-3, weight_decay=0.0, warmup_frac=0.0,
             schedule="constant")  # fmt: skip


@pytest.fixture(autouse=True)
def two_device_mesh(monkeypatch):
    """The trainer's mesh over 2 of the tests' 8 simulated devices: the same sharded programs
    (batch split over the data axis), built and run faster on 2 cores (as test_train.py's
    `packed_run`)."""
    make_mesh = sharding.make_mesh

    def two_devices(*, devices=None, **kwargs):
        return make_mesh(devices=jax.devices()[:2] if devices is None else devices, **kwargs)

    monkeypatch.setattr(sharding, "make_mesh", two_devices)


def _train_args(workdir, minilm_dir, **overrides) -> dict:
    """`trainer.train_triplets` arguments: one MiniLM layer, batch 8, one log line a step.

    Every test trains at the same 16 passage and 8 question tokens (the passages below are 9-13
    tokens, the questions 7-10, cut at 8), so the step programs one test compiles the next reads
    from the session's compilation cache."""
    return dict(
        workdir=workdir, init_dir=str(minilm_dir), num_layers=1, pooling=None, dtype="float32",
        batch_size=8, max_length=16, query_max_length=8, query_instruction=None, num_epochs=6.0,
        max_steps=0, margin=0.5, distance="cosine", optim_config=OPTIM, seed=0,
        checkpoint_every=3, log_every=1, log_fn=lambda m: None,
    ) | overrides  # fmt: skip


def _triplets():
    topics = [
        "revenue grew in the year",
        "the lease liabilities",
        "litigation reserves",
        "share repurchases",
        "goodwill impairment",
        "pension obligations",
        "income tax rate",
        "inventory levels",
    ]
    return [
        (
            f"What about {topic}?",
            f"The filing discusses {topic} in detail.",
            f"An unrelated paragraph on {topics[(i + 3) % 8]}.",
        )
        for i, topic in enumerate(topics)
    ]


def test_triplet_training_learns_resumes_and_exports(tmp_path, minilm_dir):
    triplets = _triplets()
    args = _train_args(tmp_path / "train", minilm_dir)
    summary = trainer.train_triplets(triplets, triplets, **args)
    assert summary["steps"] == 6
    assert summary["val/loss_after"] < summary["val/loss_before"]
    losses = [
        json.loads(line)["train/loss"]
        for line in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    assert len(losses) == 6 and losses[-1] < losses[0]
    # A rerun finds the final checkpoint and does not train again.
    again = trainer.train_triplets(triplets, triplets, **args)
    assert len((tmp_path / "train" / "metrics.jsonl").read_text().splitlines()) == 6
    np.testing.assert_allclose(again["val/loss_after"], summary["val/loss_after"], rtol=1e-5)
    # Export writes bi-enc(i+1) as a HF directory the Embedder loads (one layer, trained).
    out = export.export(tmp_path / "train", tmp_path / "model")
    student = Embedder.from_pretrained(out)
    assert student.spec.config.num_hidden_layers == 1
    base = Embedder.from_pretrained(minilm_dir, num_layers=1)
    texts = [t[1] for t in triplets[:2]]
    assert np.abs(student.encode(texts) - base.encode(texts)).max() > 1e-3


def test_accumulated_updates_follow_the_schedule():
    """With accum_steps=4, 32 micro-batches are 8 updates: warm-up (25%) is 2 updates and the
    linear decay ends at the last one. The applied learning rate is read off the parameter
    change of Adam under a constant gradient (|update| = lr there)."""
    config = dict(OPTIM, lr=1.0, warmup_frac=0.25, schedule="linear", clip_norm=0.0, accum_steps=4)
    micro_steps, optimizer, schedule = trainer.make_optimizer(config, micro_steps=33)
    assert micro_steps == 32  # whole updates only
    params = {"w": np.zeros((2, 2), np.float32)}
    state = optimizer.init(params)
    update = jax.jit(optimizer.update)
    applied, logged = [], []
    for micro in range(micro_steps):
        updates, state = update({"w": np.ones((2, 2), np.float32)}, state, params)
        if micro % 4 == 3:
            applied.append(-float(updates["w"][0, 0]))
        logged.append(float(schedule(micro)))
    expected = [0.0, 0.5, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6]
    np.testing.assert_allclose(applied, expected, atol=2e-5)  # float32 Adam moments
    np.testing.assert_allclose(logged, np.repeat(expected, 4), atol=1e-6)
    assert float(schedule(micro_steps)) == 0.0  # the decay's end value, one update later


def test_triplet_training_with_accumulation_logs_the_update_lr(tmp_path, minilm_dir):
    """8 micro-batches with accum_steps=2 are 4 updates; the lr logged with each micro-batch is
    that of the update it belongs to."""
    config = dict(OPTIM, lr=1e-3, warmup_frac=0.5, schedule="linear", accum_steps=2)
    args = _train_args(tmp_path / "train", minilm_dir, num_epochs=8.0, optim_config=config,
                       checkpoint_every=100)  # fmt: skip
    trainer.train_triplets(_triplets(), [], **args)
    logged = [
        json.loads(line)["train/lr"]
        for line in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    # Updates 0..3 run at 0, 1/2, 1, 1/2 of lr (warm-up 2, linear decay to 0 at update 4).
    np.testing.assert_allclose(logged, np.repeat([0.0, 5e-4, 1e-3, 5e-4], 2), atol=1e-9)


def test_resume_leaves_one_metrics_row_per_step(tmp_path, minilm_dir):
    """A kill after step 4's row was written but before its checkpoint: the rerun restores
    step 2 and replays 3 and 4, whose earlier rows are dropped, not duplicated."""
    args = _train_args(tmp_path / "train", minilm_dir, num_epochs=4.0, checkpoint_every=2)
    trainer.train_triplets(_triplets(), [], **args)
    metrics = tmp_path / "train" / "metrics.jsonl"
    before = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [row["step"] for row in before] == [1, 2, 3, 4]
    shutil.rmtree(tmp_path / "train" / "checkpoints" / "4")
    trainer.train_triplets(_triplets(), [], **args)
    after = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [row["step"] for row in after] == [1, 2, 3, 4]
    np.testing.assert_allclose(
        [row["train/loss"] for row in after], [row["train/loss"] for row in before], rtol=1e-5
    )
