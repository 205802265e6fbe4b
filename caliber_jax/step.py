"""Train state and the pure train / eval steps of the Caliber objective.

`TrainState` is a pytree (step, params, opt_state, rng); params are the float32 pure-dict state of
the `EmbeddingModel`, merged with its graphdef inside the jitted step. Legend: B batch, T tokens.
"""

import functools
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from caliber_jax import losses


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array


def init_state(params: Any, optimizer: optax.GradientTransformation, *, seed: int) -> TrainState:
    """Fresh state around given params (jit it with out_shardings to create it sharded)."""
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        rng=jax.random.key_data(jax.random.key(seed)),
    )


def _pad_to(x_bt: jax.Array, length: int) -> jax.Array:
    return jnp.pad(x_bt, ((0, 0), (0, length - x_bt.shape[1])))


def embed_pairs(
    graphdef: nnx.GraphDef, params: Any, batch: dict[str, jax.Array]
) -> tuple[jax.Array, jax.Array]:
    """Student vectors of x and pi(x) from one forward over x and the pi(x) rows, stacked.

    "stacked" layout: `pert_input_ids` has a row per x, [2B, T] in all; rows without a
    perturbation still run (static shapes) and the loss masks them out. "compact" layout:
    `pert_input_ids` holds only P perturbed rows and `pert_index` [P] names the x row of each
    (B on padding rows), so the forward runs B + P rows; s_px is scattered back to [B, E], zero
    where there is no perturbation. "packed" layout: `packed_ids`/`packed_slots`/
    `packed_positions` hold every x and existing pi(x) end to end (slot g for x row g, B + g for
    its pi(x)), so no token slot is wasted on padding; s_px is again zero where there is none.
    Each way both come back [B, E].
    """
    model = nnx.merge(graphdef, params)
    if "packed_ids" in batch:
        rows = batch["has_pert"].shape[0]
        vecs = model.embed_packed(
            batch["packed_ids"],
            batch["packed_slots"],
            batch["packed_positions"],
            num_segments=2 * rows,
        )
        return vecs[:rows], vecs[rows:]
    length = max(batch["input_ids"].shape[1], batch["pert_input_ids"].shape[1])
    ids = jnp.concatenate(
        [_pad_to(batch["input_ids"], length), _pad_to(batch["pert_input_ids"], length)]
    )
    mask = jnp.concatenate(
        [_pad_to(batch["attention_mask"], length), _pad_to(batch["pert_attention_mask"], length)]
    )
    vecs = model(ids, mask)
    rows = batch["input_ids"].shape[0]
    s_x, s_px = vecs[:rows], vecs[rows:]
    if "pert_index" in batch:
        # Padding rows carry index B, out of bounds: mode="drop" discards them.
        s_px = jnp.zeros_like(s_x).at[batch["pert_index"]].set(s_px, mode="drop")
    return s_x, s_px


def loss_fn(
    params: Any,
    batch: dict[str, jax.Array],
    *,
    graphdef: nnx.GraphDef,
    **loss_args: Any,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The objective of one batch: `embed_pairs`, then `vectors_loss` (`loss_args` are its).

    With `query_weight` > 0 the batch's training queries (`query_input_ids`, one per row, see
    `pipeline.make_loader`) run through the student too, for the query-geometry term.
    """
    s_x, s_px = embed_pairs(graphdef, params, batch)
    s_q = None
    query_terms = ("query_weight", "contrastive_weight", "query_align_weight")
    if any(loss_args.get(term) for term in query_terms):
        if "query_input_ids" not in batch:
            term = next(term for term in query_terms if loss_args.get(term))
            raise ValueError(f"loss.{term} > 0 needs training queries (prepare.queries)")
        model = nnx.merge(graphdef, params)
        s_q = model(batch["query_input_ids"], batch["query_attention_mask"])
    return vectors_loss(s_x, s_px, batch, s_q=s_q, **loss_args)


def vectors_loss(
    s_x: jax.Array,
    s_px: jax.Array,
    batch: dict[str, jax.Array],
    *,
    lam: float,
    margin: float,
    reduction: str,
    objective: str = "caliber",
    perturb_weight: float = 1.0,
    structure_weight: float = 0.0,
    query_weight: float = 0.0,
    query_passages: str = "both",
    contrastive_weight: float = 0.0,
    contrastive_temperature: float = 0.05,
    contrastive_judge: str = "none",
    query_align_weight: float = 0.0,
    s_q: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The objective on the student's [B, E] vectors of x and pi(x) and the batch's teacher rows.

    Eq. 4 (`losses.caliber_loss`), or with another `objective`, `perturb_weight` or
    `structure_weight` the numeric objectives of `losses.calibration_loss`; plus, with
    `query_weight` > 0, `query_weight` times `losses.query_geometry_loss` of the student's query
    vectors `s_q` [B, E] against every x and pi(x) of the batch, or with `query_passages="x"`
    against the x rows only, leaving pi(x) free to move (part "query": its mean over the rows
    with a query).

    With `contrastive_weight` > 0, also `contrastive_weight` times the in-batch contrastive loss
    (`losses.contrastive_loss` at `contrastive_temperature`) of each row's mined question against
    the batch's x rows, its own x the positive. `contrastive_judge` "teacher" keeps a
    question only where the teacher ranks its passage first in the batch (the embedding judge of
    the mining pipeline, applied to in-batch candidates); "none" keeps every question. Parts
    "contrastive" (mean over the kept questions), "contrastive_acc" (the student's in-batch
    top-1 accuracy on them) and "contrastive_kept" (their share of the rows with a question).

    With `query_align_weight` > 0, also that weight times ||s(q) - t(q)|| of each row's question
    (LEAF's alignment applied to the questions, as LEAF trains on queries and documents alike),
    part "query_align": its mean over the rows with a question.
    """
    loss, parts = _pair_loss(
        s_x, s_px, batch, lam=lam, margin=margin, reduction=reduction, objective=objective,
        perturb_weight=perturb_weight, structure_weight=structure_weight,
    )  # fmt: skip
    if contrastive_weight:
        if s_q is None:
            raise ValueError("loss.contrastive_weight > 0 needs the student's query vectors (s_q)")
        term, extra = _contrastive_term(
            s_q, s_x, batch, temperature=contrastive_temperature, judge=contrastive_judge
        )
        loss = loss + contrastive_weight * term
        parts = {**parts, **extra}
    if query_align_weight:
        if s_q is None:
            raise ValueError("loss.query_align_weight > 0 needs the student's query vectors (s_q)")
        q_rows = batch["weight"].astype(jnp.float32) * batch["has_q"].astype(jnp.float32)
        per_query = losses.align_loss(s_q, batch["teacher_q"])
        align_q = jnp.sum(q_rows * per_query) / jnp.maximum(jnp.sum(q_rows), 1e-12)
        loss = loss + query_align_weight * align_q
        parts = {**parts, "query_align": align_q}
    if not query_weight:
        return loss, parts
    if s_q is None:
        raise ValueError("loss.query_weight > 0 needs the student's query vectors (s_q)")
    if query_passages not in ("x", "both"):
        raise ValueError(f"loss.query_passages must be 'x' or 'both', got {query_passages!r}")
    weights = batch["weight"].astype(jnp.float32)
    has_q = batch["has_q"].astype(bool) & (weights > 0)
    s_p, t_p, p_valid = s_x, batch["teacher_x"], weights > 0
    if query_passages == "both":
        s_p = jnp.concatenate([s_x, s_px])
        t_p = jnp.concatenate([t_p, batch["teacher_px"]])
        p_valid = jnp.concatenate([p_valid, batch["has_pert"].astype(bool) & (weights > 0)])
    per_query = losses.query_geometry_loss(s_q, batch["teacher_q"], s_p, t_p, has_q, p_valid)
    q_weights = weights * has_q
    query = jnp.sum(q_weights * per_query) / jnp.maximum(jnp.sum(q_weights), 1e-12)
    return loss + query_weight * query, {**parts, "query": query}


CONTRASTIVE_JUDGES = ("none", "teacher")


def _contrastive_term(
    s_q: jax.Array, s_x: jax.Array, batch: dict[str, jax.Array], *, temperature: float, judge: str
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`vectors_loss`'s contrastive term: its batch mean over the kept questions and its parts."""
    if judge not in CONTRASTIVE_JUDGES:
        raise ValueError(
            f"loss.contrastive_judge must be one of {CONTRASTIVE_JUDGES}, got {judge!r}"
        )
    weights = batch["weight"].astype(jnp.float32)
    valid = weights > 0
    has_q = batch["has_q"].astype(bool) & valid
    kept = has_q
    if judge == "teacher":
        _, teacher_first = losses.contrastive_loss(
            batch["teacher_q"], batch["teacher_x"], has_q, valid, temperature=temperature
        )
        kept = has_q & (teacher_first > 0)
    per_query, correct = losses.contrastive_loss(s_q, s_x, kept, valid, temperature=temperature)
    kept_weights = weights * kept
    count = jnp.maximum(jnp.sum(kept_weights), 1e-12)
    term = jnp.sum(kept_weights * per_query) / count
    return term, {
        "contrastive": term,
        "contrastive_acc": jnp.sum(kept_weights * correct) / count,
        "contrastive_kept": jnp.sum(kept_weights) / jnp.maximum(jnp.sum(weights * has_q), 1e-12),
    }


def _pair_loss(
    s_x: jax.Array,
    s_px: jax.Array,
    batch: dict[str, jax.Array],
    *,
    lam: float,
    margin: float,
    reduction: str,
    objective: str,
    perturb_weight: float,
    structure_weight: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`vectors_loss` without the query term: eq. 4 or `losses.calibration_loss`."""
    if objective != "caliber" or perturb_weight != 1.0 or structure_weight:
        # The numeric objectives; the neighbour rows come from `teacher_nb` / `has_nb`.
        return losses.calibration_loss(
            s_x,
            s_px,
            batch["teacher_x"],
            batch["teacher_px"],
            batch["has_pert"],
            objective=objective,
            lam=lam,
            margin=margin,
            perturb_weight=perturb_weight,
            structure_weight=structure_weight,
            # Splits without mined neighbours (validation) get no neighbour term.
            t_nb=batch.get("teacher_nb", jnp.zeros_like(batch["teacher_x"])),
            has_nb=batch.get("has_nb", jnp.zeros_like(batch["has_pert"])),
            weights=batch["weight"],
            reduction=reduction,
        )
    return losses.caliber_loss(
        s_x,
        s_px,
        batch["teacher_x"],
        batch["teacher_px"],
        batch["has_pert"],
        lam=lam,
        margin=margin,
        weights=batch["weight"],
        reduction=reduction,
    )


def _apply_gradients(
    state: TrainState,
    batch: dict[str, jax.Array],
    bound_loss_fn: Callable[[Any, dict[str, jax.Array]], tuple[jax.Array, dict[str, jax.Array]]],
    *,
    optimizer: optax.GradientTransformation,
    schedule: Callable[[jax.Array], jax.Array],
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer step on `bound_loss_fn(params, batch) -> (loss, parts)`.

    Returns the new state and `train/*` metrics (scalars): the parts, loss, grad and param norms
    and the learning rate.
    """
    (loss, parts), grads = jax.value_and_grad(bound_loss_fn, has_aux=True)(state.params, batch)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        **{f"train/{k}": v for k, v in parts.items()},
        "train/loss": loss,
        "train/grad_norm": optax.tree.norm(grads),
        "train/param_norm": optax.tree.norm(params),
        "train/lr": schedule(state.step),
    }
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics


def _row_sums(
    loss: jax.Array,
    parts: dict[str, jax.Array],
    batch: dict[str, jax.Array],
    *,
    row_parts: tuple[str, ...],
    pert_parts: tuple[str, ...] = (),
) -> dict[str, jax.Array]:
    """Eval sums over the real rows of a batch: each mean times the row count it averages over.

    The loss and `row_parts` cover every real row ("rows"); `pert_parts` cover only the perturbed
    ones ("pert_rows", present when `pert_parts` is).
    """
    rows = jnp.sum(batch["weight"])
    sums = {"loss": loss * rows, "rows": rows, **{k: parts[k] * rows for k in row_parts}}
    if pert_parts:
        pert_rows = jnp.sum(batch["weight"] * batch["has_pert"])
        sums.update({k: parts[k] * pert_rows for k in pert_parts}, pert_rows=pert_rows)
    return sums


def train_step(
    state: TrainState,
    batch: dict[str, jax.Array],
    *,
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    schedule: Callable[[jax.Array], jax.Array],
    **loss_args: Any,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One AdamW step on eq. 4 (or `objective`, see `losses.calibration_loss`).

    `loss_args` are those of `loss_fn` (lam, margin, reduction, objective, perturb_weight).
    Returns the new state and `train/*` metrics (scalars).
    """
    bound = functools.partial(loss_fn, graphdef=graphdef, **loss_args)
    return _apply_gradients(state, batch, bound, optimizer=optimizer, schedule=schedule)


# The rows each part of `losses.calibration_loss` is a mean over, for `eval_step`'s sums and
# `train.evaluate`'s means: the perturbed rows, or the numeric term's ("term_rows": perturbed and,
# under objective "neighbour", with a neighbour); every other part (and the loss) every real row.
EVAL_PART_ROWS = {
    "align_px": "pert_rows",
    "delta_s": "pert_rows",
    "delta_t": "pert_rows",
    "sim_p": "pert_rows",
    "num": "term_rows",
    "hinge_active_frac": "term_rows",
    "sim_nb": "term_rows",
    "query": "query_rows",
    "query_align": "query_rows",
    "contrastive": "contrastive_rows",
    "contrastive_acc": "contrastive_rows",
    "contrastive_kept": "query_rows",
}


def eval_step(
    params: Any, batch: dict[str, jax.Array], *, graphdef: nnx.GraphDef, **loss_args: Any
) -> dict[str, jax.Array]:
    """Validation loss and every part of it as sums over the batch's real rows, with the counts
    ("rows", "pert_rows", "term_rows") that turn each back into the mean it is in training.

    The loss is the trained one: a validation split with mined neighbours ("train_neighbour",
    `prepare.mine_heldout_neighbours`) gets the "neighbour" term too. `loss_args` are `loss_fn`'s.
    """
    loss, parts = loss_fn(params, batch, graphdef=graphdef, **loss_args)
    weight = batch["weight"].astype(jnp.float32)
    pert = weight * batch["has_pert"]
    term = pert
    if loss_args.get("objective") == "neighbour":
        term = pert * batch.get("has_nb", jnp.zeros_like(batch["has_pert"]))
    counts = {"rows": jnp.sum(weight), "pert_rows": jnp.sum(pert), "term_rows": jnp.sum(term)}
    if "has_q" in batch:
        counts["query_rows"] = jnp.sum(weight * batch["has_q"])
    if "contrastive_kept" in parts:
        counts["contrastive_rows"] = parts["contrastive_kept"] * counts["query_rows"]
    sums = {k: v * counts[EVAL_PART_ROWS.get(k, "rows")] for k, v in parts.items()}
    return {"loss": loss * counts["rows"], **sums, **counts}


def embed_triplets(
    graphdef: nnx.GraphDef, params: Any, batch: dict[str, jax.Array]
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Query, c_rel and c_irrel vectors `[B, E]` each: one forward over the `[B, Tq]` queries and
    one over the `[2B, T]` stack of chunks (queries are short: padding them to T would waste).

    The batch holds `query_*`, `pos_*` and `neg_*` `input_ids`/`attention_mask` int32 arrays.
    """
    model = nnx.merge(graphdef, params)
    q = model(batch["query_input_ids"], batch["query_attention_mask"])
    length = max(batch["pos_input_ids"].shape[1], batch["neg_input_ids"].shape[1])
    ids = jnp.concatenate([_pad_to(batch[f"{name}_input_ids"], length) for name in ("pos", "neg")])
    mask = jnp.concatenate(
        [_pad_to(batch[f"{name}_attention_mask"], length) for name in ("pos", "neg")]
    )
    chunks = model(ids, mask)
    rows = q.shape[0]
    return q, chunks[:rows], chunks[rows:]


def triplet_loss_fn(
    params: Any,
    batch: dict[str, jax.Array],
    *,
    graphdef: nnx.GraphDef,
    margin: float,
    distance: str,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    q, pos, neg = embed_triplets(graphdef, params, batch)
    return losses.triplet_loss(
        q, pos, neg, margin=margin, distance=distance, weights=batch["weight"]
    )


def triplet_train_step(
    state: TrainState,
    batch: dict[str, jax.Array],
    *,
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    schedule: Callable[[jax.Array], jax.Array],
    margin: float,
    distance: str,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One AdamW step on the triplet loss of paper 001 (mining). Returns state and metrics."""
    bound = functools.partial(triplet_loss_fn, graphdef=graphdef, margin=margin, distance=distance)
    return _apply_gradients(state, batch, bound, optimizer=optimizer, schedule=schedule)


def triplet_eval_step(
    params: Any, batch: dict[str, jax.Array], *, graphdef: nnx.GraphDef, margin: float,
    distance: str,
) -> dict[str, jax.Array]:  # fmt: skip
    """Sums over the real rows of a batch: loss, accuracy (d_pos < d_neg) and the row count."""
    loss, parts = triplet_loss_fn(params, batch, graphdef=graphdef, margin=margin,
                                  distance=distance)  # fmt: skip
    return _row_sums(loss, parts, batch, row_parts=("accuracy",))
