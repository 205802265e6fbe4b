"""Caliber losses: L2 alignment to the teacher and the teacher-relative numeric hinge.

Pure `jnp` functions of precomputed, L2-normalised vectors (paper eqs. 1-4). Everything runs in
float32 whatever the input dtype. Shapes: B batch, D embedding dim.
"""

from collections.abc import Mapping

import jax
import jax.numpy as jnp

REDUCTIONS = ("batch", "per_term")


def safe_norm(x: jax.Array) -> jax.Array:
    """Euclidean norm over the last axis whose gradient is finite (zero) at x == 0.

    `jnp.linalg.norm` has a NaN gradient at zero; the double `where` keeps sqrt away from 0
    in both the forward and the backward pass.
    """
    squared = jnp.sum(jnp.square(x), axis=-1)
    positive = squared > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, squared, 1.0)), 0.0)


def align_loss(s: jax.Array, t: jax.Array) -> jax.Array:
    """Eq. 1: per-row ||s - t||_2 of `[B, D]` inputs, returned as `[B]` float32."""
    return safe_norm(s.astype(jnp.float32) - t.astype(jnp.float32))


def cosine(a: jax.Array, b: jax.Array) -> jax.Array:
    """Per-row cosine of `[B, D]` inputs, `[B]` float32.

    The inputs are meant to be unit vectors already; dividing the dot product by the norms keeps
    the value a true cosine when they drift from 1 (bfloat16 compute), and a zero row gives 0.
    """
    a = a.astype(jnp.float32)
    b = b.astype(jnp.float32)
    norms = safe_norm(a) * safe_norm(b)
    return jnp.sum(a * b, axis=-1) / jnp.maximum(norms, 1e-12)


def discrimination(a: jax.Array, b: jax.Array) -> jax.Array:
    """Eq. 2: Delta_f = 1 - cos(f(x), f(pi(x))) per row, in [0, 2]."""
    return 1.0 - cosine(a, b)


def numeric_hinge(delta_s: jax.Array, delta_t: jax.Array, margin: float) -> jax.Array:
    """Eq. 3: max(0, Delta_t + m - Delta_s); zero once the student out-separates the teacher."""
    return jnp.maximum(0.0, delta_t + margin - delta_s)


def _unit_rows(x: jax.Array, valid: jax.Array) -> jax.Array:
    """`[N, D]` rows scaled to unit length in float32; rows not `valid` are zeroed first, so NaN
    there reaches neither the value nor the gradient (a zero row stays zero)."""
    x = jnp.where(valid[:, None], x.astype(jnp.float32), 0.0)
    return x / jnp.maximum(safe_norm(x), 1e-12)[:, None]


def _weighted_mean(values: jax.Array, weights: jax.Array) -> jax.Array:
    """sum(w * v) / sum(w), or 0 when the weights sum to 0."""
    return jnp.sum(weights * values) / jnp.maximum(jnp.sum(weights), 1e-12)


def caliber_loss(
    s_x: jax.Array,
    s_px: jax.Array,
    t_x: jax.Array,
    t_px: jax.Array,
    has_pert: jax.Array,
    *,
    lam: float,
    margin: float,
    weights: jax.Array | None = None,
    reduction: str = "batch",
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Eq. 4: L_a(x) + 1[pi](L_a(pi x) + lam * L_n(x)), averaged over the batch.

    Rows without a perturbation only contribute L_a(x). Their `s_px`/`t_px` rows are replaced by
    zeros before any arithmetic, so garbage or NaN there never reaches the loss or its gradient.
    The numeric terms of those rows are exactly 0, so the perturbed-row means in `parts` ignore
    them.
    lam = 0 is the LEAF objective exactly.

    Args:
      s_x: `[B, D]` student vectors of the texts x (L2-normalised).
      s_px: `[B, D]` student vectors of the perturbations pi(x).
      t_x: `[B, D]` teacher vectors of x.
      t_px: `[B, D]` teacher vectors of pi(x).
      has_pert: `[B]` bool, whether row b has a perturbation.
      lam: weight lambda_num of the numeric hinge (0 recovers LEAF).
      margin: hinge margin m >= 0.
      weights: optional `[B]` float row weights, 1 for real rows and 0 for the padding rows of a
        partially filled last batch. Every mean below becomes a weighted mean, and rows of
        weight 0 are zeroed before use, so padding rows (even NaN ones) count for nothing in the
        loss or its gradient. None means all ones.
      reduction: "batch" divides every term by the (weighted) batch size, as eq. 4 is written.
        "per_term" is the authors' released PyTorch code (`caliber/train.py:caliber_loss`):
        mean L_a(x) over the batch plus mean L_a(pi x) and lam * mean L_n over the perturbed rows
        only, i.e. `loss = align_x + align_px + lam * num`; the totals of the paper's Table 4 add
        up this way.

    Returns:
      `(loss, parts)`: loss is a float32 scalar; parts holds float32 scalars "align_x" (mean over
      the batch), "align_px", "num", "delta_s", "delta_t" (means over perturbed rows, 0 when
      there are none), "hinge_active_frac" (fraction of perturbed rows with a positive hinge) and
      "pert_frac" (fraction of rows with a perturbation).
    """
    loss, parts = calibration_loss(
        s_x, s_px, t_x, t_px, has_pert, objective="caliber", lam=lam, margin=margin,
        perturb_weight=1.0, weights=weights, reduction=reduction,
    )  # fmt: skip
    del parts["sim_p"]  # not one of eq. 4's parts
    return loss, parts


# Objectives of `calibration_loss`; "caliber" is eq. 4.
OBJECTIVES = ("caliber", "absolute", "neighbour")


def absolute_hinge(delta_s: jax.Array, margin: float) -> jax.Array:
    """max(0, m - Delta_s): a fixed discrimination target, not relative to the teacher's."""
    return jnp.maximum(0.0, margin - delta_s)


def neighbour_hinge(sim_p: jax.Array, sim_nb: jax.Array, margin: float) -> jax.Array:
    """max(0, cos(s x, s pi x) - sim_nb + m): pi(x) must end up farther than a topical neighbour.

    NumGap-D counts anchors whose perturbation is *less* similar than a topical distractor, so
    this hinge is zero exactly on rows NumGap would count (with margin m to spare). `sim_nb` is a
    fixed threshold, the teacher's cos(t x, t x_nb): taking the student's own neighbour
    similarity instead lets it lower the loss by raising every similarity (collapse).
    """
    return jnp.maximum(0.0, sim_p - sim_nb + margin)


def structure_loss(
    s_x: jax.Array, s_px: jax.Array, t_x: jax.Array, t_px: jax.Array,
    valid: jax.Array, pert: jax.Array,
) -> jax.Array:  # fmt: skip
    """Per-row similarity preservation (Tung & Mori 2019, "similarity-preserving" distillation):
    mean of (cos(s a, s b) - cos(t a, t b))^2 over the in-batch pairs of row b's texts (x_b and,
    if perturbed, pi(x_b)) with every *other* row's texts. Unit vectors in, `[B]` out.

    A row's own pair (x_b, pi x_b) is left out: the numeric term is what separates it. The term
    lets the student move a passage away from its teacher only in directions that leave its
    similarity to other passages (hence to the queries that retrieve them) unchanged.

    The two similarity matrices are nearly equal and their difference is squared, so their matmuls
    run at full float32 precision whatever `jax.default_matmul_precision` says: the default is
    TF32 on Ampere/Hopper GPUs and one bfloat16 pass on TPUs. Operands rounded to bfloat16 move
    the term by up to 9% once the student is within ~1e-3 of its teacher (`tests/test_losses.py`).
    """
    rows = s_x.shape[0]
    s = jnp.concatenate([s_x, s_px]).astype(jnp.float32)
    t = jnp.concatenate([t_x, t_px]).astype(jnp.float32)
    present = jnp.concatenate([valid, pert]).astype(jnp.float32)
    row_of = jnp.concatenate([jnp.arange(rows), jnp.arange(rows)])
    other = (row_of[:, None] != row_of[None, :]).astype(jnp.float32)
    pairs = present[:, None] * present[None, :] * other
    highest = jax.lax.Precision.HIGHEST
    similarity_s = jnp.matmul(s, s.T, precision=highest)
    similarity_t = jnp.matmul(t, t.T, precision=highest)
    squared = (similarity_s - similarity_t) ** 2 * pairs
    # Both texts of row b (x_b at b, pi x_b at B + b) pool into row b.
    total = squared.sum(1)[:rows] + squared.sum(1)[rows:]
    count = pairs.sum(1)[:rows] + pairs.sum(1)[rows:]
    return total / jnp.maximum(count, 1.0)


def calibration_loss(
    s_x: jax.Array,
    s_px: jax.Array,
    t_x: jax.Array,
    t_px: jax.Array,
    has_pert: jax.Array,
    *,
    objective: str,
    lam: float,
    margin: float,
    perturb_weight: float,
    structure_weight: float = 0.0,
    t_nb: jax.Array | None = None,
    has_nb: jax.Array | None = None,
    weights: jax.Array | None = None,
    reduction: str = "batch",
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """L_a(x) + 1[pi](perturb_weight * L_a(pi x) + lam * L_obj(x)) + structure_weight * L_s(x),
    averaged over the batch (L_s: `structure_loss`, left out of the graph when its weight is 0).

    objective "caliber": L_obj = eq. 3, so perturb_weight = 1 is `caliber_loss` exactly.
    "absolute": L_obj = `absolute_hinge(Delta_s, m)`. "neighbour": L_obj =
    `neighbour_hinge(cos(s x, s pi x), cos(t x, t x_nb), m)` on rows that have both a
    perturbation and a neighbour (`has_nb`); other rows get no numeric term. perturb_weight < 1
    loosens the pull of s(pi x) towards t(pi x), which sits almost on t(x).

    Args:
      s_x, s_px, t_x, t_px, has_pert, weights, reduction: as in `caliber_loss`.
      objective: one of `OBJECTIVES`.
      lam: weight of the numeric term.
      margin: m of the chosen hinge.
      perturb_weight: weight of ||s(pi x) - t(pi x)|| (the authors' `perturb_weight`).
      structure_weight: weight of `structure_loss` (0: off).
      t_nb: `[B, D]` teacher vectors of each row's neighbour x_nb ("neighbour" only).
      has_nb: `[B]` bool, whether row b has a neighbour ("neighbour" only).

    Returns:
      `(loss, parts)` with the parts of `caliber_loss` ("num" is the chosen hinge; "delta_t" is
      the teacher's Delta_t whatever the objective) plus "sim_p" (mean cos(s x, s pi x)) and,
      for "neighbour", "sim_nb" (mean teacher threshold), all over the rows the term covers;
      "structure" (batch mean of `structure_loss`) when structure_weight > 0.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r}; expected one of {OBJECTIVES}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r}; expected one of {REDUCTIONS}")
    if s_x.ndim != 2 or not s_x.shape == s_px.shape == t_x.shape == t_px.shape:
        raise ValueError(
            "expected four [B, D] arrays of one shape, got "
            f"s_x {s_x.shape}, s_px {s_px.shape}, t_x {t_x.shape}, t_px {t_px.shape}"
        )
    rows = s_x.shape[:1]
    if has_pert.shape != rows:
        raise ValueError(f"has_pert shape {has_pert.shape} != batch {rows}")
    if objective == "neighbour":
        if t_nb is None or has_nb is None:
            raise ValueError("objective 'neighbour' needs t_nb and has_nb (prepare.neighbour_k)")
        if t_nb.shape != s_x.shape or has_nb.shape != rows:
            raise ValueError(f"t_nb {t_nb.shape} / has_nb {has_nb.shape} do not match {s_x.shape}")
    weights = jnp.ones(rows, jnp.float32) if weights is None else weights
    if weights.shape != rows:
        raise ValueError(f"weights shape {weights.shape} != batch {rows}")
    weights = weights.astype(jnp.float32)
    valid = weights > 0
    pert = has_pert.astype(bool) & valid
    pert_f = pert.astype(jnp.float32)
    # The numeric term's rows: perturbed, and for "neighbour" also with a neighbour.
    term = pert & has_nb.astype(bool) if objective == "neighbour" else pert
    term_f = term.astype(jnp.float32)

    # Zero the unused rows before any arithmetic: masking only the outputs would still let NaN
    # inputs turn the backward pass into 0 * NaN = NaN.
    s_x = jnp.where(valid[:, None], s_x.astype(jnp.float32), 0.0)
    t_x = jnp.where(valid[:, None], t_x.astype(jnp.float32), 0.0)
    s_px = jnp.where(pert[:, None], s_px.astype(jnp.float32), 0.0)
    t_px = jnp.where(pert[:, None], t_px.astype(jnp.float32), 0.0)

    align_x = align_loss(s_x, t_x)
    align_px = align_loss(s_px, t_px) * pert_f
    delta_s = discrimination(s_x, s_px) * pert_f
    delta_t = discrimination(t_x, t_px) * pert_f
    parts_extra = {}
    if objective == "caliber":
        num = numeric_hinge(delta_s, delta_t, margin)
    elif objective == "absolute":
        num = absolute_hinge(delta_s, margin)
    else:
        t_nb = jnp.where(term[:, None], t_nb.astype(jnp.float32), 0.0)
        sim_nb = cosine(t_x, t_nb) * term_f
        num = neighbour_hinge(1.0 - delta_s, sim_nb, margin)
        parts_extra["sim_nb"] = _weighted_mean(sim_nb, weights * term_f)
    num = num * term_f

    structure = jnp.zeros_like(align_x)
    if structure_weight:
        structure = structure_loss(s_x, s_px, t_x, t_px, valid, pert) * valid
        parts_extra["structure"] = _weighted_mean(structure, weights)

    pert_weights = weights * pert_f
    term_weights = weights * term_f
    parts = {
        "align_x": _weighted_mean(align_x, weights),
        "align_px": _weighted_mean(align_px, pert_weights),
        "num": _weighted_mean(num, term_weights),
        "delta_s": _weighted_mean(delta_s, pert_weights),
        "delta_t": _weighted_mean(delta_t, pert_weights),
        "sim_p": _weighted_mean((1.0 - delta_s) * pert_f, pert_weights),
        "hinge_active_frac": _weighted_mean((num > 0).astype(jnp.float32), term_weights),
        "pert_frac": _weighted_mean(pert_f, weights),
        **parts_extra,
    }
    if reduction == "batch":
        rows_loss = align_x + perturb_weight * align_px + lam * num + structure_weight * structure
        loss = _weighted_mean(rows_loss, weights)
    else:
        loss = parts["align_x"] + perturb_weight * parts["align_px"] + lam * parts["num"]
        loss = loss + structure_weight * parts.get("structure", 0.0)
    return loss, parts


def loss_from_parts(
    parts: Mapping[str, float], *, reduction: str, lam: float, perturb_weight: float = 1.0,
    structure_weight: float = 0.0, query_weight: float = 0.0, contrastive_weight: float = 0.0,
    query_align_weight: float = 0.0, pert_frac: float = 1.0, term_frac: float = 1.0,
) -> float:  # fmt: skip
    """The trained loss from its parts, each the mean over its own rows (`calibration_loss`'s
    parts, "query" and "contrastive" of `step.loss_fn`): what the loss of one batch holding every
    row would be. "batch" divides the perturbed terms by the batch size, so "align_px" counts at
    the fraction of rows perturbed (`pert_frac`) and "num" at the fraction its term covers
    (`term_frac`); "per_term" adds the means as they are. Over a split it turns the validation
    parts into the validation loss: a row-weighted mean of batch losses is that only for "batch"
    without query terms (a "per_term" batch's perturbed means weigh its few perturbed rows as
    much as another batch's many)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r}; expected one of {REDUCTIONS}")
    p, t = (pert_frac, term_frac) if reduction == "batch" else (1.0, 1.0)
    return float(
        parts["align_x"] + perturb_weight * p * parts["align_px"] + lam * t * parts["num"]
        + structure_weight * parts.get("structure", 0.0)
        + query_weight * parts.get("query", 0.0)
        + contrastive_weight * parts.get("contrastive", 0.0)
        + query_align_weight * parts.get("query_align", 0.0)
    )  # fmt: skip


TRIPLET_DISTANCES = ("cosine", "euclidean")


def triplet_distance(a: jax.Array, b: jax.Array, distance: str) -> jax.Array:
    """Per-row d(a, b) of `[B, D]` inputs, `[B]` float32.

    "cosine": 1 - cos(a, b), in [0, 2]. "euclidean": ||a/|a| - b/|b|||_2 on the normalised
    vectors, in [0, 2] (= sqrt(2 - 2 cos)); its gradient is finite at a == b (`safe_norm`).
    """
    if distance == "cosine":
        return 1.0 - cosine(a, b)
    if distance == "euclidean":
        a = a.astype(jnp.float32)
        b = b.astype(jnp.float32)
        a = a / jnp.maximum(safe_norm(a), 1e-12)[:, None]
        b = b / jnp.maximum(safe_norm(b), 1e-12)[:, None]
        return safe_norm(a - b)
    raise ValueError(f"distance={distance!r}; expected one of {TRIPLET_DISTANCES}")


def triplet_loss(
    q: jax.Array,
    pos: jax.Array,
    neg: jax.Array,
    *,
    margin: float,
    distance: str,
    weights: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Paper 001 step 5: mean of max(0, alpha + d(q, c_rel) - d(q, c_irrel)) over the batch.

    Args:
      q: `[B, D]` query vectors.
      pos: `[B, D]` vectors of the more relevant chunks c_rel.
      neg: `[B, D]` vectors of the less relevant chunks c_irrel (same document).
      margin: alpha (the paper's best: 0.1).
      distance: "cosine" (1 - cos) or "euclidean" (on normalised vectors).
      weights: optional `[B]` row weights (0 for padding rows, whose inputs are zeroed before
        any arithmetic so even NaN there never reaches the loss or gradient); None is all ones.

    Returns:
      `(loss, parts)`: float32 scalars; parts has "d_pos", "d_neg" (mean distances),
      "active_frac" (rows with a positive hinge) and "accuracy" (rows with d_pos < d_neg).
    """
    if q.ndim != 2 or not q.shape == pos.shape == neg.shape:
        raise ValueError(f"expected three [B, D] arrays, got {q.shape}, {pos.shape}, {neg.shape}")
    if weights is None:
        weights = jnp.ones(q.shape[:1], jnp.float32)
    elif weights.shape != q.shape[:1]:
        raise ValueError(f"weights shape {weights.shape} != batch {q.shape[:1]}")
    weights = weights.astype(jnp.float32)
    valid = (weights > 0)[:, None]
    # Padding rows get a fixed unit vector, so cosines and norms stay finite there.
    unit = jnp.zeros(q.shape[-1], jnp.float32).at[0].set(1.0)
    q, pos, neg = (jnp.where(valid, x.astype(jnp.float32), unit) for x in (q, pos, neg))
    d_pos = triplet_distance(q, pos, distance)
    d_neg = triplet_distance(q, neg, distance)
    hinge = jnp.maximum(0.0, margin + d_pos - d_neg)
    parts = {
        "d_pos": _weighted_mean(d_pos, weights),
        "d_neg": _weighted_mean(d_neg, weights),
        "active_frac": _weighted_mean((hinge > 0).astype(jnp.float32), weights),
        "accuracy": _weighted_mean((d_pos < d_neg).astype(jnp.float32), weights),
    }
    return _weighted_mean(hinge, weights), parts


def query_geometry_loss(
    s_q: jax.Array,
    t_q: jax.Array,
    s_p: jax.Array,
    t_p: jax.Array,
    q_valid: jax.Array,
    p_valid: jax.Array,
) -> jax.Array:
    """Query-passage geometry preservation, one value per query, `[Q]` float32.

    For query q: the mean over the present passages p of (cos(s q, s p) - cos(t q, t p))^2. With
    the batch's x and pi(x) as the passages, the student may move a passage (separate pi(x) from
    x) only in directions that leave its similarity to queries as the teacher has it: what
    retrieval reads. Rows that are not present (`q_valid`, `p_valid` false) are zeroed before any
    arithmetic, so NaN there reaches neither the value nor the gradient; a query without any
    present passage, or not present itself, gets 0.

    Args:
      s_q, t_q: `[Q, D]` student and teacher vectors of the queries.
      s_p, t_p: `[P, D]` student and teacher vectors of the passages.
      q_valid: `[Q]` bool, the queries that count.
      p_valid: `[P]` bool, the passages that count.
    """
    if s_q.ndim != 2 or s_q.shape != t_q.shape or s_p.shape != t_p.shape:
        raise ValueError(
            f"expected [Q, D] queries and [P, D] passages, got s_q {s_q.shape}, t_q {t_q.shape}, "
            f"s_p {s_p.shape}, t_p {t_p.shape}"
        )
    if q_valid.shape != s_q.shape[:1] or p_valid.shape != s_p.shape[:1]:
        raise ValueError(f"q_valid {q_valid.shape} / p_valid {p_valid.shape} do not match")
    q_valid, p_valid = q_valid.astype(bool), p_valid.astype(bool)

    # The two cosine matrices are nearly equal and their difference is squared: as in
    # `structure_loss`, full float32 whatever `jax.default_matmul_precision` says (TF32 on GPUs,
    # one bfloat16 pass on TPUs would swamp the difference).
    highest = jax.lax.Precision.HIGHEST
    s_sim = jnp.matmul(_unit_rows(s_q, q_valid), _unit_rows(s_p, p_valid).T, precision=highest)
    t_sim = jnp.matmul(_unit_rows(t_q, q_valid), _unit_rows(t_p, p_valid).T, precision=highest)
    pairs = (q_valid[:, None] & p_valid[None, :]).astype(jnp.float32)
    squared = jnp.square(s_sim - t_sim) * pairs
    return squared.sum(1) / jnp.maximum(pairs.sum(1), 1.0)


def contrastive_loss(
    s_q: jax.Array,
    s_p: jax.Array,
    q_valid: jax.Array,
    p_valid: jax.Array,
    *,
    temperature: float,
) -> tuple[jax.Array, jax.Array]:
    """In-batch contrastive loss (InfoNCE, the usual embedding fine-tuning loss), one per query.

    Query i's positive is passage i (`s_p[i]`, the passage its question was mined from); every
    other present passage of the batch is a negative. Per query: -log softmax_i(cos(s q_i, s p_j)
    / temperature over the present j). Rows that are not present are zeroed before any
    arithmetic and left out of every softmax, so NaN there reaches neither value nor gradient; a
    query that is not present, or whose own passage is not, gets 0.

    Args:
      s_q: `[B, D]` student vectors of the queries (row i asks about passage i).
      s_p: `[B, D]` student vectors of the passages.
      q_valid: `[B]` bool, the queries that count.
      p_valid: `[B]` bool, the passages that may be ranked (positives and negatives).
      temperature: tau > 0 (0.05 is usual for unit vectors).

    Returns:
      `(per_query, correct)`: `[B]` float32 losses and `[B]` float32 1.0 where the query's own
      passage has the highest similarity in the batch (0 elsewhere and on absent queries).
    """
    if s_q.ndim != 2 or s_q.shape != s_p.shape:
        raise ValueError(f"expected [B, D] queries and passages, got {s_q.shape}, {s_p.shape}")
    if q_valid.shape != s_q.shape[:1] or p_valid.shape != s_p.shape[:1]:
        raise ValueError(f"q_valid {q_valid.shape} / p_valid {p_valid.shape} do not match")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    p_valid = p_valid.astype(bool)
    q_valid = q_valid.astype(bool) & p_valid

    highest = jax.lax.Precision.HIGHEST
    sim = jnp.matmul(_unit_rows(s_q, q_valid), _unit_rows(s_p, p_valid).T, precision=highest)
    # A large finite negative, not -inf, for absent passages: no inf reaches the backward pass.
    logits = jnp.where(p_valid[None, :], sim / temperature, -1e9)
    log_probs = jax.nn.log_softmax(jnp.where(q_valid[:, None], logits, 0.0), axis=-1)
    per_query = -jnp.where(q_valid, jnp.diagonal(log_probs), 0.0)
    own = jnp.diagonal(sim)
    rival = jnp.max(jnp.where(jnp.eye(sim.shape[0], dtype=bool) | ~p_valid[None, :], -2.0, sim), 1)
    correct = (q_valid & (own > rival)).astype(jnp.float32)
    return per_query, correct
