"""Tests for benchmarks/: FLOP counts, batch layouts, stratified batches, a tiny end-to-end run."""

import re

import numpy as np
import pytest

from benchmarks import common, train_throughput
from caliber_jax.models import bert, embedding, qwen3


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


def make_passages():
    ids = [[101, *range(1000, 1000 + n), 102] for n in (3, 10, 5, 20, 7, 1, 12, 4)]
    pert = [[*row[:-2], 7, 102] if i % 2 == 0 else None for i, row in enumerate(ids)]
    return common.Passages(ids=ids, pert_ids=pert, empty_ids=[101, 102])


def test_pipeline_and_compact_batches():
    passages = make_passages()
    rows = np.array([3, 0, 2, 1])
    has_pert = common.choose_perturbed(passages, rows, count=5, seed=0)
    # Only rows 0 and 2 of the corpus (slots 1 and 2) have a perturbation.
    np.testing.assert_array_equal(has_pert, [False, True, True, False])
    batch = common.pipeline_batch(
        passages, rows, has_pert, pad_id=0, multiple=8, max_length=64, dim=4, seed=0
    )
    assert batch["input_ids"].shape == (4, 24)  # longest x: 22 tokens -> 24
    assert batch["pert_input_ids"].shape == (4, 8)  # longest pi(x): 7 tokens -> 8
    np.testing.assert_array_equal(batch["pert_input_ids"][0, :3], [101, 102, 0])
    np.testing.assert_array_equal(batch["teacher_px"][[0, 3]], 0.0)
    assert sorted(common.real_lengths(batch)) == sorted([22, 5, 7, 12, 5, 7])

    compact = common.compact_batch(batch, rows_multiple=4, multiple=8, max_length=64, pad_id=0)
    np.testing.assert_array_equal(compact["pert_index"], [1, 2, 4, 4])
    np.testing.assert_array_equal(compact["pert_input_ids"][:2], batch["pert_input_ids"][[1, 2]])
    np.testing.assert_array_equal(compact["pert_attention_mask"][2:].sum(axis=1), [1, 1])
    assert common.real_lengths(compact) == common.real_lengths(batch)


def test_stratified_batches_take_quantiles():
    passages = make_passages()
    plan = np.arange(8).reshape(8, 1)  # one row per batch; tokens = the row's length
    picks = common.stratified_batches(passages, plan, num_batches=2)
    # Lengths sorted: rows 5, 0, 7, 2, 4, 1, 6, 3; quantiles 1/4 and 3/4 -> positions 2 and 6.
    assert [int(p[0]) for p in picks] == [7, 6]
    with pytest.raises(ValueError, match="8 passages give 8 < 9 batches"):
        common.stratified_batches(passages, plan, num_batches=9)


def test_train_benchmark_runs_both_frameworks(capsys, tmp_path):
    train_throughput.main(
        [
            "--preset", "cpu-minilm", "--lengths", "fixed:12", "--num-layers", "1",
            "--batch-size", "4", "--num-batches", "2", "--repeats", "1", "--time-budget-s", "0",
            "--compile-cache", str(tmp_path / "cache"),
        ]
    )  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"ratio_jax_over_torch=\d+\.\d+", lines[-1])
    values = dict(line.split("=", 1) for line in lines if "=" in line and " " not in line)
    for name in ("jax", "torch"):
        assert float(values[f"{name}_seq_per_s"]) > 0
    # Same weights, same batch: both frameworks start from the same loss.
    assert float(values["jax_first_loss"]) == pytest.approx(
        float(values["torch_first_loss"]), rel=1e-4
    )
    assert float(values["ratio_jax_over_torch"]) == pytest.approx(
        float(values["jax_seq_per_s"]) / float(values["torch_seq_per_s"]), rel=1e-2
    )
