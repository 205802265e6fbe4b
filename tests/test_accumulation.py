"""Gradient accumulation (`optim.accum_steps`) against one big batch: where the mean of the
micro-batches' gradients is the big batch's gradient (so the accumulated update is the big
batch's, `tests/test_step.py`), and where it is not.

It is exactly where every term of the loss is a sum over rows divided by the batch's row count,
with every micro-batch carrying the same count: reduction "batch" with eq. 4 or another per-row
objective, and no padding rows. A term that compares a row with the other rows of its batch (the
structure term, the query-geometry term, the in-batch contrastive term of `configs/headline.py`)
or a mean over a micro-batch's own subset of rows (reduction "per_term", the question-alignment
term) is another function of two half batches than of the whole one.
"""

import jax
import numpy as np
import pytest
from flax import nnx

from caliber_jax import step
from tests.test_step import make_batch, make_model, with_queries

ROWS = 16


def big_batch() -> dict[str, np.ndarray]:
    """16 rows whose teacher is another init (the loss and its gradients are far from 0), every
    field a term may read: perturbations (2 in the first half, 6 in the second), neighbours,
    one question per row but rows 1 and 5."""
    teacher = make_model(1)
    batch = make_batch(7, rows=ROWS, teacher=teacher)
    batch["has_pert"] = np.isin(np.arange(ROWS), [0, 3, 8, 9, 10, 12, 13, 15])
    graphdef, params = teacher
    model = nnx.merge(graphdef, params)
    t_px = np.asarray(model(batch["pert_input_ids"], batch["pert_attention_mask"]))
    batch["teacher_px"] = t_px * batch["has_pert"][:, None]
    batch["teacher_nb"] = np.roll(batch["teacher_x"], 1, axis=0)
    batch["has_nb"] = np.arange(ROWS) % 4 != 3
    return with_queries(batch, teacher)


def halves(batch: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    return [{k: v[part] for k, v in batch.items()} for part in (slice(0, 8), slice(8, 16))]


def accumulation_gap(batch: dict[str, np.ndarray], **loss_args) -> float:
    """max |mean of the two halves' gradients - the whole batch's gradient|, relative to the
    largest gradient entry: 0 up to float rounding where accumulating equals the big batch."""
    graphdef, params = make_model(0)
    grad_fn = jax.jit(jax.grad(lambda p, b: step.loss_fn(p, b, graphdef=graphdef, **loss_args)[0]))
    whole = jax.device_get(grad_fn(params, batch))
    parts = [jax.device_get(grad_fn(params, half)) for half in halves(batch)]
    scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(whole))
    assert scale > 1e-3  # a gradient to compare
    gaps = [
        float(np.abs((a + b) / 2 - w).max())
        for a, b, w in zip(*map(jax.tree.leaves, (*parts, whole)), strict=True)
    ]
    return max(gaps) / scale


# reduction "batch": every term a per-row value over the batch's row count.
HOLDS = {
    "eq. 4": dict(lam=0.5, margin=0.05, reduction="batch"),
    "neighbour hinge, no pi(x) pull": dict(
        lam=8.0, margin=0.1, reduction="batch", objective="neighbour", perturb_weight=0.0
    ),
}
# configs/headline.py's recipe is the neighbour objective plus the structure term (50); its
# `query` variant adds the query-geometry term (50), its mined ones the in-batch contrastive term.
HEADLINE = dict(lam=8.0, margin=0.1, reduction="batch", objective="neighbour", perturb_weight=0.0)
DIFFERS = {
    "per_term means": dict(lam=0.5, margin=0.05, reduction="per_term"),
    "structure term": dict(HEADLINE, structure_weight=50.0),
    "query-geometry term": dict(HEADLINE, query_weight=50.0),
    "in-batch contrastive term": dict(
        lam=0.0,
        margin=0.05,
        reduction="batch",
        contrastive_weight=1.0,
        contrastive_temperature=0.05,
        contrastive_judge="none",
    ),  # fmt: skip
    "question alignment": dict(HEADLINE, query_align_weight=1.0),
}


@pytest.mark.parametrize("name", list(HOLDS))
def test_accumulating_per_row_terms_equals_the_big_batch(name):
    assert accumulation_gap(big_batch(), **HOLDS[name]) < 1e-5


@pytest.mark.parametrize("name", list(DIFFERS))
def test_accumulating_in_batch_or_per_term_means_is_another_gradient(name):
    """Two half batches see half the in-batch rivals (and their own subsets' means): their mean
    gradient is a different one, well above float rounding."""
    assert accumulation_gap(big_batch(), **DIFFERS[name]) > 1e-3


def test_padding_rows_in_one_micro_batch_break_the_equality():
    """Even eq. 4 with reduction "batch": a micro-batch with padding rows (an epoch's last,
    `drop_remainder=False`) divides by fewer rows, so its rows weigh more than in the big batch."""
    batch = big_batch()
    assert accumulation_gap(batch, **HOLDS["eq. 4"]) < 1e-5
    batch["weight"] = np.where(np.arange(ROWS) >= 12, 0.0, 1.0).astype(np.float32)
    assert accumulation_gap(batch, **HOLDS["eq. 4"]) > 1e-3
