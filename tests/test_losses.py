"""Tests for caliber_jax/losses.py against values worked out by hand."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from caliber_jax import losses

# A hand-made batch of 2-D unit vectors (B=3, D=2); rows 0 and 1 have a perturbation, row 2 not.
# row 0: s_x=(1,0)   t_x=(.6,.8)  s_px=(.8,.6) t_px=(.6,.8)
#   La(x)  = |(.4,-.8)|  = sqrt(.16+.64) = sqrt(.8)
#   La(px) = |(.2,-.2)|  = sqrt(.04+.04) = sqrt(.08)
#   Ds = 1 - (1*.8 + 0*.6) = .2 ; Dt = 1 - (.36+.64) = 0 ; hinge = max(0, 0 + .05 - .2) = 0
# row 1: s_x=(0,1)   t_x=(0,1)    s_px=(0,1)   t_px=(.6,.8)
#   La(x) = 0 ; La(px) = |(-.6,.2)| = sqrt(.36+.04) = sqrt(.4)
#   Ds = 0 ; Dt = 1 - .8 = .2 ; hinge = .2 + .05 - 0 = .25 (active)
# row 2: s_x=(1,0)   t_x=(0,1)    La(x) = sqrt(2); its s_px/t_px are never read.
S_X = [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]
T_X = [[0.6, 0.8], [0.0, 1.0], [0.0, 1.0]]
S_PX = [[0.8, 0.6], [0.0, 1.0], [0.3, -0.1]]
T_PX = [[0.6, 0.8], [0.6, 0.8], [-0.5, 0.2]]
HAS_PERT = [True, True, False]

ROW0 = math.sqrt(0.8) + math.sqrt(0.08) + 0.5 * 0.0
ROW1 = 0.0 + math.sqrt(0.4) + 0.5 * 0.25
ROW2 = math.sqrt(2.0)


def _batch(**overrides):
    arrays = {
        "s_x": jnp.array(S_X, jnp.float32),
        "s_px": jnp.array(S_PX, jnp.float32),
        "t_x": jnp.array(T_X, jnp.float32),
        "t_px": jnp.array(T_PX, jnp.float32),
        "has_pert": jnp.array(HAS_PERT),
    }
    arrays.update(overrides)
    return arrays


def test_align_loss_hand_values():
    s = jnp.array([[1.0, 0.0], [1.0, 0.0], [0.6, 0.8]])
    t = jnp.array([[0.0, 1.0], [1.0, 0.0], [0.8, 0.6]])
    # (1,0)-(0,1) -> sqrt(2); identical -> 0; (-.2,.2) -> sqrt(.08)
    np.testing.assert_allclose(losses.align_loss(s, t), [math.sqrt(2), 0.0, math.sqrt(0.08)], 1e-6)
    # Three dimensions: (1,0,0) vs (0,0,1) -> sqrt(2); (1,0,0) vs (.6,0,.8) -> sqrt(.16+.64).
    s3 = jnp.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    t3 = jnp.array([[0.0, 0.0, 1.0], [0.6, 0.0, 0.8]])
    np.testing.assert_allclose(losses.align_loss(s3, t3), [math.sqrt(2), math.sqrt(0.8)], 1e-6)


def test_discrimination_and_hinge_hand_values():
    a = jnp.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    b = jnp.array([[0.6, 0.0, 0.8], [0.0, -1.0, 0.0], [2.0, 0.0, 0.0]])
    # cos = .6, -1, 1 (the last one is not unit length; cosine divides by the norms).
    np.testing.assert_allclose(losses.discrimination(a, b), [0.4, 2.0, 0.0], atol=1e-6)
    delta_s = jnp.array([0.2, 0.0, 0.3])
    delta_t = jnp.array([0.0, 0.2, 0.25])
    # max(0, .05 - .2) = 0 ; .2 + .05 - 0 = .25 ; max(0, .25 + .05 - .3) = 0
    np.testing.assert_allclose(
        losses.numeric_hinge(delta_s, delta_t, 0.05), [0.0, 0.25, 0.0], atol=1e-7
    )


def test_caliber_loss_hand_values():
    loss, parts = losses.caliber_loss(**_batch(), lam=0.5, margin=0.05)
    np.testing.assert_allclose(loss, (ROW0 + ROW1 + ROW2) / 3, rtol=1e-6)
    expected = {
        "align_x": (math.sqrt(0.8) + 0.0 + math.sqrt(2.0)) / 3,
        "align_px": (math.sqrt(0.08) + math.sqrt(0.4)) / 2,
        "num": (0.0 + 0.25) / 2,
        "delta_s": (0.2 + 0.0) / 2,
        "delta_t": (0.0 + 0.2) / 2,
        "hinge_active_frac": 0.5,
        "pert_frac": 2 / 3,
    }
    assert set(parts) == set(expected)
    for name, value in expected.items():
        assert parts[name].dtype == jnp.float32, name
        np.testing.assert_allclose(parts[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def test_lam_zero_is_leaf():
    loss, _ = losses.caliber_loss(**_batch(), lam=0.0, margin=0.05)
    leaf = (math.sqrt(0.8) + math.sqrt(0.08) + math.sqrt(0.4) + math.sqrt(2.0)) / 3
    np.testing.assert_allclose(loss, leaf, rtol=1e-6)
    batch = _batch()
    align_x = losses.align_loss(batch["s_x"], batch["t_x"])
    align_px = losses.align_loss(batch["s_px"], batch["t_px"]) * batch["has_pert"]
    assert float(loss) == pytest.approx(float(jnp.mean(align_x + align_px)), rel=1e-7)


def test_per_term_reduction_matches_authors_code():
    loss, parts = losses.caliber_loss(**_batch(), lam=0.5, margin=0.05, reduction="per_term")
    by_hand = (math.sqrt(0.8) + math.sqrt(2.0)) / 3 + (math.sqrt(0.08) + math.sqrt(0.4)) / 2
    np.testing.assert_allclose(loss, by_hand + 0.5 * 0.125, rtol=1e-6)
    np.testing.assert_allclose(loss, parts["align_x"] + parts["align_px"] + 0.5 * parts["num"])
    with pytest.raises(ValueError, match="reduction"):
        losses.caliber_loss(**_batch(), lam=0.5, margin=0.05, reduction="sum")


def test_batch_without_perturbations():
    loss, parts = losses.caliber_loss(**_batch(has_pert=jnp.zeros(3, bool)), lam=0.5, margin=0.05)
    np.testing.assert_allclose(loss, (math.sqrt(0.8) + 0.0 + math.sqrt(2.0)) / 3, rtol=1e-6)
    for name in ("align_px", "num", "delta_s", "delta_t", "hinge_active_frac", "pert_frac"):
        assert float(parts[name]) == 0.0, name


def _loss_only(s_x, s_px, t_x, t_px, has_pert, **kwargs):
    return losses.caliber_loss(s_x, s_px, t_x, t_px, has_pert, lam=0.5, margin=0.05, **kwargs)[0]


def test_garbage_in_unperturbed_rows_does_not_leak():
    nan_px = jnp.array(S_PX).at[2].set(jnp.nan)
    inf_tpx = jnp.array(T_PX).at[2].set(jnp.array([jnp.inf, -jnp.inf]))
    batch = _batch(s_px=nan_px, t_px=inf_tpx)
    clean, _ = losses.caliber_loss(**_batch(), lam=0.5, margin=0.05)
    loss, parts = losses.caliber_loss(**batch, lam=0.5, margin=0.05)
    assert float(loss) == float(clean)
    assert all(bool(jnp.isfinite(value)) for value in parts.values())
    grads = jax.grad(_loss_only, argnums=(0, 1, 2, 3))(*batch.values())
    for grad in grads:
        assert bool(jnp.all(jnp.isfinite(grad)))
    # Nothing flows into the unused row of s_px.
    np.testing.assert_array_equal(grads[1][2], [0.0, 0.0])


def test_gradient_finite_when_student_equals_teacher():
    same = jnp.array(T_X)
    batch = _batch(s_x=same, s_px=jnp.array(T_PX))
    grads = jax.grad(_loss_only, argnums=(0, 1))(*batch.values())
    for grad in grads:
        assert bool(jnp.all(jnp.isfinite(grad)))
    # Row 2 of s_x sits exactly on its teacher and has no perturbation: its gradient is 0.
    np.testing.assert_array_equal(grads[0][2], [0.0, 0.0])
    np.testing.assert_array_equal(jax.grad(lambda x: losses.safe_norm(x))(jnp.zeros(4)), 0.0)


def test_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(4, 5, 3)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=-1, keepdims=True)
    has_pert = jnp.array([True, False, True, True, False])
    args = [jnp.asarray(v) for v in vectors]

    def loss_of_s_px(s_px):
        return _loss_only(args[0], s_px, args[2], args[3], has_pert)

    grad = np.asarray(jax.grad(loss_of_s_px)(args[1]))
    eps = 1e-2
    numeric = np.zeros_like(grad)
    for index in np.ndindex(grad.shape):
        step = np.zeros_like(grad)
        step[index] = eps
        numeric[index] = (loss_of_s_px(args[1] + step) - loss_of_s_px(args[1] - step)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, atol=2e-3)


def test_weights_mask_padding_rows():
    weights = jnp.array([1.0, 1.0, 0.0])
    # Row 2 is padding: its (garbage) s_x must not count either.
    batch = _batch(s_x=jnp.array(S_X).at[2].set(jnp.nan))
    loss, parts = losses.caliber_loss(**batch, lam=0.5, margin=0.05, weights=weights)
    np.testing.assert_allclose(loss, (ROW0 + ROW1) / 2, rtol=1e-6)
    np.testing.assert_allclose(parts["align_x"], math.sqrt(0.8) / 2, rtol=1e-6)
    np.testing.assert_allclose(parts["pert_frac"], 1.0)
    # Padding a perturbed row removes it from the perturbed-row means too.
    _, parts = losses.caliber_loss(
        **_batch(), lam=0.5, margin=0.05, weights=jnp.array([0.0, 1.0, 1.0])
    )
    np.testing.assert_allclose(parts["num"], 0.25, rtol=1e-6)
    np.testing.assert_allclose(parts["hinge_active_frac"], 1.0)
    np.testing.assert_allclose(parts["pert_frac"], 0.5)
    ones, _ = losses.caliber_loss(**_batch(), lam=0.5, margin=0.05, weights=jnp.ones(3))
    default, _ = losses.caliber_loss(**_batch(), lam=0.5, margin=0.05)
    assert float(ones) == float(default)


def test_padding_row_with_nan_keeps_gradient_finite():
    weights = jnp.array([1.0, 1.0, 0.0])
    batch = _batch(s_x=jnp.array(S_X).at[2].set(jnp.nan))
    grads = jax.grad(functools.partial(_loss_only, weights=weights), argnums=(0, 1, 2, 3))(
        *batch.values()
    )
    for grad in grads:
        assert bool(jnp.all(jnp.isfinite(grad)))
        np.testing.assert_array_equal(grad[2], [0.0, 0.0])


def test_jit_matches_eager():
    fn = jax.jit(functools.partial(losses.caliber_loss, lam=0.5, margin=0.05))
    loss, parts = fn(**_batch())
    eager_loss, eager_parts = losses.caliber_loss(**_batch(), lam=0.5, margin=0.05)
    np.testing.assert_allclose(loss, eager_loss, rtol=1e-6)
    for name, value in eager_parts.items():
        np.testing.assert_allclose(parts[name], value, rtol=1e-6, err_msg=name)
    weighted = jax.jit(functools.partial(losses.caliber_loss, lam=0.0, margin=0.05))
    loss, _ = weighted(**_batch(), weights=jnp.array([1.0, 1.0, 0.0]))
    np.testing.assert_allclose(loss, (ROW0 + ROW1 - 0.5 * 0.25) / 2, rtol=1e-6)


def test_bfloat16_inputs_compute_in_float32():
    batch = {k: v.astype(jnp.bfloat16) if v.dtype != bool else v for k, v in _batch().items()}
    loss, parts = losses.caliber_loss(**batch, lam=0.5, margin=0.05)
    assert loss.dtype == jnp.float32
    assert all(value.dtype == jnp.float32 for value in parts.values())


def test_shape_errors():
    with pytest.raises(ValueError, match="s_px"):
        losses.caliber_loss(**_batch(s_px=jnp.zeros((3, 4))), lam=0.5, margin=0.05)
    with pytest.raises(ValueError, match="has_pert"):
        losses.caliber_loss(**_batch(has_pert=jnp.zeros(2, bool)), lam=0.5, margin=0.05)
    with pytest.raises(ValueError, match="weights"):
        losses.caliber_loss(**_batch(), lam=0.5, margin=0.05, weights=jnp.ones(4))


# --- Issue #16 objectives (`calibration_loss`), on the hand-made batch above. ---
# Neighbours: row 0 has x_nb with t_nb=(1,0), so the teacher threshold cos(t_x, t_nb) = .6;
# row 1 is perturbed but has no neighbour; row 2 is unperturbed.
T_NB = [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]
HAS_NB = [True, False, True]


def _calibration(objective, **options):
    batch = _batch()
    if objective == "neighbour":
        batch.update(t_nb=jnp.array(T_NB, jnp.float32), has_nb=jnp.array(HAS_NB))
    return losses.calibration_loss(**batch, objective=objective, **options)


def test_absolute_and_neighbour_hinge_hand_values():
    np.testing.assert_allclose(losses.absolute_hinge(jnp.array([0.2, 0.0, 0.5]), 0.3),
                               [0.1, 0.3, 0.0], atol=1e-7)  # fmt: skip
    # sim_p - sim_nb + m: .8 - .6 + .05 = .25; .5 - .6 + .05 < 0 -> 0; .6 - .6 + 0 = 0.
    np.testing.assert_allclose(
        losses.neighbour_hinge(jnp.array([0.8, 0.5, 0.6]), jnp.array([0.6, 0.6, 0.6]), 0.05),
        [0.25, 0.0, 0.05],
        atol=1e-7,
    )


def test_calibration_caliber_objective_is_eq4():
    for reduction in ("batch", "per_term"):
        want, want_parts = losses.caliber_loss(**_batch(), lam=0.5, margin=0.05,
                                               reduction=reduction)  # fmt: skip
        got, parts = _calibration("caliber", lam=0.5, margin=0.05, perturb_weight=1.0,
                                  reduction=reduction)  # fmt: skip
        np.testing.assert_allclose(got, want, rtol=1e-7)
        for name, value in want_parts.items():
            np.testing.assert_allclose(parts[name], value, rtol=1e-7, err_msg=name)


def test_calibration_perturb_weight_hand_values():
    # Rows 0 and 1 with their L_a(pi x) at half weight: the hinge is unchanged (0 and .25).
    loss, _ = _calibration("caliber", lam=0.5, margin=0.05, perturb_weight=0.5)
    row0 = math.sqrt(0.8) + 0.5 * math.sqrt(0.08)
    row1 = 0.5 * math.sqrt(0.4) + 0.5 * 0.25
    np.testing.assert_allclose(loss, (row0 + row1 + ROW2) / 3, rtol=1e-6)
    # perturb_weight = 0: the pair is no longer pulled towards t(pi x) at all.
    loss, _ = _calibration("caliber", lam=0.0, margin=0.05, perturb_weight=0.0)
    np.testing.assert_allclose(loss, (math.sqrt(0.8) + ROW2) / 3, rtol=1e-6)


def test_calibration_absolute_hand_values():
    # m = .3: row 0 has Delta_s = .2 -> .1; row 1 has Delta_s = 0 -> .3 (teacher ignored).
    loss, parts = _calibration("absolute", lam=1.0, margin=0.3, perturb_weight=0.5)
    row0 = math.sqrt(0.8) + 0.5 * math.sqrt(0.08) + 0.1
    row1 = 0.5 * math.sqrt(0.4) + 0.3
    np.testing.assert_allclose(loss, (row0 + row1 + ROW2) / 3, rtol=1e-6)
    np.testing.assert_allclose(parts["num"], 0.2, rtol=1e-6)
    np.testing.assert_allclose(parts["hinge_active_frac"], 1.0)
    np.testing.assert_allclose(parts["sim_p"], (0.8 + 1.0) / 2, rtol=1e-6)
    # The per-term reduction: mean La(x) + w * mean La(px) + lam * mean hinge over perturbed rows.
    loss, _ = _calibration("absolute", lam=1.0, margin=0.3, perturb_weight=0.5,
                           reduction="per_term")  # fmt: skip
    align_x = (math.sqrt(0.8) + math.sqrt(2.0)) / 3
    align_px = (math.sqrt(0.08) + math.sqrt(0.4)) / 2
    np.testing.assert_allclose(loss, align_x + 0.5 * align_px + 0.2, rtol=1e-6)


def test_calibration_neighbour_hand_values():
    # Row 0: sim_p = cos((1,0), (.8,.6)) = .8, threshold .6 -> .8 - .6 + .05 = .25. Row 1 has
    # no neighbour, row 2 no perturbation: no numeric term, and the mean is over row 0 only.
    loss, parts = _calibration("neighbour", lam=2.0, margin=0.05, perturb_weight=0.0)
    np.testing.assert_allclose(loss, (math.sqrt(0.8) + 2.0 * 0.25 + ROW2) / 3, rtol=1e-6)
    np.testing.assert_allclose(parts["num"], 0.25, rtol=1e-6)
    np.testing.assert_allclose(parts["sim_nb"], 0.6, rtol=1e-6)
    np.testing.assert_allclose(parts["hinge_active_frac"], 1.0)
    # A neighbour the teacher finds more similar (.96) than the pair (.8): hinge 0.
    batch = _batch(t_nb=jnp.array([[0.8, 0.6], [0.0, 1.0], [1.0, 0.0]]), has_nb=jnp.array(HAS_NB))
    loss, parts = losses.calibration_loss(**batch, objective="neighbour", lam=2.0, margin=0.05,
                                          perturb_weight=0.0)  # fmt: skip
    np.testing.assert_allclose(loss, (math.sqrt(0.8) + ROW2) / 3, rtol=1e-6)
    np.testing.assert_allclose(parts["hinge_active_frac"], 0.0)


def test_calibration_neighbour_gradient_pushes_pair_apart():
    """The neighbour term's gradient on s(pi x) points away from s(x), and matches finite
    differences; NaN in rows without a neighbour or perturbation never reaches it."""
    t_nb = jnp.array([[1.0, 0.0], [jnp.nan, jnp.nan], [jnp.nan, 0.0]])

    def loss_of_s_px(s_px):
        batch = _batch(s_px=s_px, t_nb=t_nb, has_nb=jnp.array(HAS_NB))
        return losses.calibration_loss(**batch, objective="neighbour", lam=2.0, margin=0.05,
                                       perturb_weight=0.0)[0]  # fmt: skip

    s_px = jnp.array(S_PX, jnp.float32)
    grad = np.asarray(jax.grad(loss_of_s_px)(s_px))
    assert np.all(np.isfinite(grad))
    # d/ds_px of (2/3) cos(s_x, s_px) at s_x=(1,0), s_px=(.8,.6): (2/3) * (s_x - .8 s_px).
    np.testing.assert_allclose(grad[0], (2 / 3) * np.array([1 - 0.64, -0.48]), atol=1e-6)
    np.testing.assert_allclose(grad[1:], 0.0)
    eps = 1e-3
    for index in np.ndindex(2):
        step = np.zeros((3, 2), np.float32)
        step[(0, *index)] = eps
        numeric = (loss_of_s_px(s_px + step) - loss_of_s_px(s_px - step)) / (2 * eps)
        np.testing.assert_allclose(grad[(0, *index)], numeric, atol=2e-3)


def test_structure_loss_hand_values():
    """Rows 0 and 1 real, row 2 padding (garbage, invalid). s = t except pi(x_0), which moved
    to (e1 + e2)/sqrt2 while its teacher vector is e1. Pairs: (x0, x1) dev 0; (pi x0, x1):
    cos_s = 1/sqrt2, cos_t = 0 -> 0.5; the own pair (x0, pi x0) is left out. Row 0 pools its two
    texts' pairs with x1: (0 + 0.5) / 2; row 1 pools its pairs with x0 and pi x0: the same."""
    e1, e2, r = [1.0, 0.0], [0.0, 1.0], 1 / math.sqrt(2)
    t_x = jnp.array([e1, e2, [5.0, 5.0]])
    s_x = jnp.array([e1, e2, [7.0, -3.0]])
    t_px = jnp.array([e1, [0.0, 0.0], [0.0, 0.0]])
    s_px = jnp.array([[r, r], [0.0, 0.0], [0.0, 0.0]])
    valid, pert = jnp.array([True, True, False]), jnp.array([True, False, False])
    structure = losses.structure_loss(s_x, s_px, t_x, t_px, valid, pert)
    np.testing.assert_allclose(structure[:2], [0.25, 0.25], rtol=1e-6)
    # Through calibration_loss: + structure_weight * the mean over valid rows.
    batch = dict(s_x=s_x, s_px=s_px, t_x=t_x, t_px=t_px, has_pert=pert,
                 weights=jnp.array([1.0, 1.0, 0.0]))  # fmt: skip
    args = dict(objective="absolute", lam=1.0, margin=0.0, perturb_weight=0.0)
    base, parts = losses.calibration_loss(**batch, **args)
    assert "structure" not in parts
    loss, parts = losses.calibration_loss(**batch, **args, structure_weight=2.0)
    np.testing.assert_allclose(parts["structure"], 0.25, rtol=1e-6)
    np.testing.assert_allclose(loss - base, 2.0 * 0.25, rtol=1e-6)
    # A rotation of everything (s = R t) preserves every similarity: zero structure loss.
    angle = 0.3
    rot = jnp.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    rotated = losses.structure_loss(t_x @ rot.T, t_px @ rot.T, t_x, t_px, valid, pert)
    np.testing.assert_allclose(rotated[:2], 0.0, atol=1e-6)


def _near_teacher_batch(noise: float, rows: int = 8, dim: int = 384):
    """Unit teacher vectors t_x, t_px (= t_x moved by 5%) and students within `noise` of them."""
    keys = jax.random.split(jax.random.PRNGKey(0), 4)

    def unit(x):
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

    t_x = unit(jax.random.normal(keys[0], (rows, dim)))
    t_px = unit(t_x + 0.05 * jax.random.normal(keys[1], (rows, dim)))
    s_x = unit(t_x + noise * jax.random.normal(keys[2], (rows, dim)))
    s_px = unit(t_px + noise * jax.random.normal(keys[3], (rows, dim)))
    present = jnp.ones(rows, bool)
    return s_x, s_px, t_x, t_px, present, present


@pytest.mark.parametrize("default", ["bfloat16", "tensorfloat32", "float32"])
def test_structure_loss_is_float32_whatever_the_default_matmul_precision(default):
    """Both similarity matmuls are lowered at HIGHEST precision under every default setting (the
    CPU ignores the setting, so the lowered program is what a GPU or TPU would run), and the
    value does not move."""
    batch = _near_teacher_batch(noise=1e-3)
    reference = jax.jit(losses.structure_loss)(*batch)
    with jax.default_matmul_precision(default):
        structure_fn = jax.jit(losses.structure_loss)
        text = structure_fn.lower(*batch).as_text()
        value = structure_fn(*batch)
    dots = [line for line in text.splitlines() if "dot_general" in line]
    assert len(dots) == 2, text
    for line in dots:
        assert "precision = [HIGHEST, HIGHEST]" in line, line
    np.testing.assert_array_equal(value, reference)


def test_structure_loss_needs_more_than_bfloat16_operands():
    """Why: a student within ~1e-3 of its teacher has a structure term of ~2e-6 per row; operands
    rounded to bfloat16 (one bfloat16 MXU pass, a TPU's default) move it by up to ~9%."""
    batch = _near_teacher_batch(noise=1e-3)
    full = losses.structure_loss(*batch)
    rounded = [x.astype(jnp.bfloat16).astype(jnp.float32) for x in batch[:4]]
    coarse = losses.structure_loss(*rounded, *batch[4:])
    assert 1e-6 < float(full.min()) and float(full.max()) < 5e-6, full
    assert float(jnp.max(jnp.abs(coarse / full - 1))) > 0.05


def test_calibration_errors():
    with pytest.raises(ValueError, match="objective"):
        _calibration("triplet-ish", lam=1.0, margin=0.1, perturb_weight=1.0)
    with pytest.raises(ValueError, match="t_nb"):
        losses.calibration_loss(**_batch(), objective="neighbour", lam=1.0, margin=0.1,
                                perturb_weight=1.0)  # fmt: skip


# ---- triplet loss (paper 001, issue 17) ----


def test_triplet_loss_hand_computed():
    """q=(1,0); pos at cos .8 and .6, neg at cos .6 and .8; alpha .1, d = 1 - cos:
    row 0: max(0, .1 + .2 - .4) = 0; row 1: max(0, .1 + .4 - .2) = .3; mean .15."""
    q = jnp.array([[1.0, 0.0], [2.0, 0.0]])  # row 1 unnormalised: cosine divides by the norms
    pos = jnp.array([[0.8, 0.6], [0.6, 0.8]])
    neg = jnp.array([[0.6, 0.8], [0.8, 0.6]])
    loss, parts = losses.triplet_loss(q, pos, neg, margin=0.1, distance="cosine")
    np.testing.assert_allclose(loss, 0.15, atol=1e-6)
    np.testing.assert_allclose(parts["d_pos"], (0.2 + 0.4) / 2, atol=1e-6)
    np.testing.assert_allclose(parts["d_neg"], (0.4 + 0.2) / 2, atol=1e-6)
    np.testing.assert_allclose(parts["active_frac"], 0.5)
    np.testing.assert_allclose(parts["accuracy"], 0.5)


def test_triplet_loss_euclidean_and_weights():
    """d = ||q - c|| on unit vectors = sqrt(2 - 2 cos): row 1 gives .1 + sqrt(.8) - sqrt(.4);
    a zero-weight NaN row counts for nothing, in the loss and in the gradient."""
    q = jnp.array([[1.0, 0.0], [1.0, 0.0], [jnp.nan, 0.0]])
    pos = jnp.array([[0.8, 0.6], [0.6, 0.8], [jnp.nan, jnp.nan]])
    neg = jnp.array([[0.6, 0.8], [0.8, 0.6], [0.0, 1.0]])
    weights = jnp.array([1.0, 1.0, 0.0])
    loss, _ = losses.triplet_loss(q, pos, neg, margin=0.1, distance="euclidean", weights=weights)
    row1 = 0.1 + np.sqrt(0.8) - np.sqrt(0.4)
    row0 = max(0.0, 0.1 + np.sqrt(0.4) - np.sqrt(0.8))
    np.testing.assert_allclose(loss, (row0 + row1) / 2, atol=1e-6)
    grad = jax.grad(
        lambda p: losses.triplet_loss(q, p, neg, margin=0.1, distance="euclidean", weights=weights)[
            0
        ]  # fmt: skip
    )(pos)
    assert np.all(np.isfinite(np.asarray(grad)))
    np.testing.assert_allclose(grad[2], 0.0)
    with pytest.raises(ValueError, match="distance"):
        losses.triplet_loss(q, pos, neg, margin=0.1, distance="dot")


# Query geometry (issue #37), 2-D unit vectors, 2 queries x 3 passages (passage 2 absent):
# q0: s (1,0), t (0,1).  q1: s = t = (.6,.8).
# p0: s (1,0), t (0,1).  p1: s (0,1), t (1,0).  p2: absent (NaN).
#   q0: cos(s q0, s p0) = 1 = cos(t q0, t p0); cos(s q0, s p1) = 0 = cos(t q0, t p1) -> 0.
#   q1: p0: s .6, t .8 -> .04; p1: s .8, t .6 -> .04 -> mean .04.
QS = [[1.0, 0.0], [0.6, 0.8]]
QT = [[0.0, 1.0], [0.6, 0.8]]
PS = [[1.0, 0.0], [0.0, 1.0], [np.nan, np.nan]]
PT = [[0.0, 1.0], [1.0, 0.0], [np.nan, 0.5]]


def _query_args(**overrides):
    args = dict(s_q=jnp.array(QS), t_q=jnp.array(QT), s_p=jnp.array(PS), t_p=jnp.array(PT),
                q_valid=jnp.array([True, True]),
                p_valid=jnp.array([True, True, False]))  # fmt: skip
    return {**args, **overrides}


def test_query_geometry_loss_hand_values():
    values = losses.query_geometry_loss(**_query_args())
    np.testing.assert_allclose(values, [0.0, 0.04], atol=1e-6)
    # Cosines, not dot products: scaled inputs give the same values.
    values = losses.query_geometry_loss(**_query_args(s_q=2.0 * jnp.array(QS)))
    np.testing.assert_allclose(values, [0.0, 0.04], atol=1e-6)
    # An absent query gets 0; so does a query with no present passage.
    values = losses.query_geometry_loss(**_query_args(q_valid=jnp.array([True, False])))
    np.testing.assert_allclose(values, [0.0, 0.0], atol=1e-7)
    none = jnp.array([False, False, False])
    np.testing.assert_allclose(losses.query_geometry_loss(**_query_args(p_valid=none)), [0, 0])
    # Student = teacher: 0 everywhere.
    same = _query_args(s_q=jnp.array(QT), s_p=jnp.array(PT))
    np.testing.assert_allclose(losses.query_geometry_loss(**same), [0.0, 0.0], atol=1e-7)
    with pytest.raises(ValueError, match="p_valid"):
        losses.query_geometry_loss(**_query_args(p_valid=jnp.array([True, True])))


def test_query_geometry_loss_nan_rows_keep_gradients_finite():
    """Absent passages hold NaN (and a zero student vector, the norm's kink): the value and
    both gradients stay finite."""
    args = _query_args(s_q=jnp.array([[1.0, 0.0], [0.0, 0.0]]))

    def total(s_q, s_p):
        return losses.query_geometry_loss(**{**args, "s_q": s_q, "s_p": s_p}).sum()

    value = total(args["s_q"], args["s_p"])
    grads = jax.grad(total, argnums=(0, 1))(args["s_q"], args["s_p"])
    assert bool(jnp.isfinite(value))
    for grad in grads:
        assert bool(jnp.all(jnp.isfinite(grad)))
    np.testing.assert_array_equal(grads[1][2], [0.0, 0.0])  # the absent passage gets nothing


@pytest.mark.parametrize("default", ["bfloat16", "tensorfloat32", "float32"])
def test_query_geometry_loss_is_float32_whatever_the_default_matmul_precision(default):
    """Both cosine matmuls are lowered at HIGHEST precision under every default setting (as in
    `structure_loss`: the two matrices are nearly equal and their difference is squared), and
    the value does not move."""
    s_x, s_px, t_x, t_px, _, _ = _near_teacher_batch(noise=1e-3)
    present = jnp.ones(s_x.shape[0], bool)
    args = dict(s_q=s_x, t_q=t_x, s_p=s_px, t_p=t_px, q_valid=present, p_valid=present)
    reference = jax.jit(losses.query_geometry_loss)(**args)
    with jax.default_matmul_precision(default):
        query_fn = jax.jit(losses.query_geometry_loss)
        text = query_fn.lower(**args).as_text()
        value = query_fn(**args)
    dots = [line for line in text.splitlines() if "dot_general" in line]
    assert len(dots) == 2, text
    for line in dots:
        assert "precision = [HIGHEST, HIGHEST]" in line, line
    np.testing.assert_array_equal(value, reference)


def test_query_geometry_loss_gradient_matches_finite_differences():
    rng = np.random.default_rng(3)
    s_q, t_q = rng.normal(size=(2, 4, 5))
    s_p, t_p = rng.normal(size=(2, 6, 5))
    q_valid = jnp.array([True, False, True, True])
    p_valid = jnp.array([True, True, False, True, True, True])

    def total(s_q, s_p):
        values = losses.query_geometry_loss(s_q, jnp.asarray(t_q), s_p, jnp.asarray(t_p),
                                            q_valid, p_valid)  # fmt: skip
        return values.sum()

    s_q, s_p = jnp.asarray(s_q, jnp.float32), jnp.asarray(s_p, jnp.float32)
    grads = jax.grad(total, argnums=(0, 1))(s_q, s_p)
    eps = 1e-2  # central differences in float32 (the loss computes in float32)
    for which, (base, grad) in enumerate(zip((s_q, s_p), grads, strict=True)):
        numeric = np.zeros(base.shape, np.float32)
        for index in np.ndindex(base.shape):
            up, down = [s_q, s_p], [s_q, s_p]
            up[which] = base.at[index].add(eps)
            down[which] = base.at[index].add(-eps)
            numeric[index] = (total(*up) - total(*down)) / (2 * eps)
        np.testing.assert_allclose(grad, numeric, atol=2e-3)
    assert float(np.abs(grads[0]).sum()) > 0 and float(np.abs(grads[1]).sum()) > 0


def test_contrastive_loss_hand_values():
    """Two queries, two passages, tau 0.5: q0 = (1,0) against p0 = (1,0), p1 = (.6,.8) gives
    logits (2, 1.2), loss log(1 + e^-0.8); q1 = (0,1) gives (0, 1.6), loss log(1 + e^-1.6)."""
    s_q = jnp.array([[1.0, 0.0], [0.0, 1.0]])
    s_p = jnp.array([[1.0, 0.0], [0.6, 0.8]])
    both = jnp.array([True, True])
    per_query, correct = losses.contrastive_loss(s_q, s_p, both, both, temperature=0.5)
    np.testing.assert_allclose(
        per_query, [math.log1p(math.exp(-0.8)), math.log1p(math.exp(-1.6))], rtol=1e-6
    )
    np.testing.assert_array_equal(correct, [1.0, 1.0])
    # Swapped passages: each query's own passage is now the worse one.
    per_query, correct = losses.contrastive_loss(s_q, s_p[::-1], both, both, temperature=0.5)
    np.testing.assert_allclose(
        per_query, [math.log1p(math.exp(0.8)), math.log1p(math.exp(1.6))], rtol=1e-6
    )
    np.testing.assert_array_equal(correct, [0.0, 0.0])
    # Vectors that are not unit length are normalised first (cosines, not dot products).
    scaled, _ = losses.contrastive_loss(3 * s_q, 2 * s_p, both, both, temperature=0.5)
    np.testing.assert_allclose(scaled[0], math.log1p(math.exp(-0.8)), rtol=1e-6)


def test_contrastive_loss_masks_absent_rows_and_keeps_gradients_finite():
    """An absent passage leaves every softmax (its column drops out); an absent query scores 0;
    NaN in absent rows reaches neither the value nor the gradient."""
    s_q = jnp.array([[1.0, 0.0], [0.0, 1.0], [jnp.nan, 1.0]])
    s_p = jnp.array([[1.0, 0.0], [0.6, 0.8], [jnp.nan, jnp.nan]])
    q_valid = jnp.array([True, True, True])  # query 2's passage is absent: it scores 0
    p_valid = jnp.array([True, True, False])

    def total(q, p):
        per_query, _ = losses.contrastive_loss(q, p, q_valid, p_valid, temperature=0.5)
        return per_query.sum(), per_query

    (value, per_query), grads = jax.value_and_grad(total, argnums=(0, 1), has_aux=True)(s_q, s_p)
    np.testing.assert_allclose(
        per_query, [math.log1p(math.exp(-0.8)), math.log1p(math.exp(-1.6)), 0.0], rtol=1e-6
    )
    assert bool(jnp.isfinite(value))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
    np.testing.assert_array_equal(grads[1][2], [0.0, 0.0])
    with pytest.raises(ValueError, match="temperature must be > 0"):
        losses.contrastive_loss(s_q, s_p, q_valid, p_valid, temperature=0.0)


def test_contrastive_loss_gradient_pulls_the_positive_closer():
    """One gradient step on the loss raises cos(q, own passage) and lowers the rival's."""
    s_q = jnp.array([[0.8, 0.6], [0.6, 0.8]])
    s_p = jnp.array([[0.6, 0.8], [0.8, 0.6]])  # each query is nearer the other's passage
    both = jnp.array([True, True])

    def mean_loss(p):
        return losses.contrastive_loss(s_q, p, both, both, temperature=0.1)[0].mean()

    moved = s_p - 0.05 * jax.grad(mean_loss)(s_p)
    assert float(mean_loss(moved)) < float(mean_loss(s_p))
    own = losses.cosine(s_q, moved)
    assert bool(jnp.all(own > losses.cosine(s_q, s_p)))
