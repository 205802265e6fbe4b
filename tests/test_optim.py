"""Tests for caliber_jax/optim.py: schedules by hand, the decay mask, parity with torch AdamW."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from transformers import get_linear_schedule_with_warmup

from caliber_jax import optim


def _values(schedule, steps):
    return [float(schedule(step)) for step in steps]


def test_linear_schedule_hand_values():
    # total 100, warmup int(0.1 * 100) = 10 steps.
    schedule = optim.make_schedule(lr=2.0, total_steps=100, warmup_frac=0.1)
    # 0 -> 0; 5 -> 2 * 5/10; 10 (end of warmup) -> 2; 55 -> 2 * (100-55)/90 = 1; 100 and on -> 0.
    np.testing.assert_allclose(
        _values(schedule, [0, 5, 10, 55, 99, 100, 130]),
        [0.0, 1.0, 2.0, 1.0, 2.0 / 90, 0.0, 0.0],
        rtol=1e-6,
        atol=1e-7,
    )


def test_linear_schedule_with_floor_is_the_authors_lr_at():
    total, warmup_frac = 200, 0.05
    warmup = int(warmup_frac * total)

    def lr_at(step):  # caliber/train.py of the authors' release, verbatim arithmetic
        if step < warmup:
            return step / max(1, warmup)
        prog = (step - warmup) / max(1, total - warmup)
        return max(0.1, 1.0 - 0.9 * prog)

    schedule = optim.make_schedule(
        lr=1e-4, total_steps=total, warmup_frac=warmup_frac, end_lr_frac=0.1
    )
    steps = range(0, 260, 7)
    np.testing.assert_allclose(
        _values(schedule, steps), [1e-4 * lr_at(s) for s in steps], rtol=1e-6
    )
    # Middle of the decay: 1 - 0.9 * 0.5 = 0.55.
    np.testing.assert_allclose(float(schedule(warmup + (total - warmup) // 2)), 0.55e-4, rtol=1e-6)


def test_constant_schedule():
    schedule = optim.make_schedule(lr=1.0, total_steps=100, warmup_frac=0.1, schedule="constant")
    np.testing.assert_allclose(_values(schedule, [0, 5, 10, 50, 100]), [0, 0.5, 1, 1, 1])


def test_cyclic_linear_per_step():
    # LEAF shape: 3 cycles of 10 steps, 1e-4 -> 1e-5 in each, reset in between, no warmup.
    schedule = optim.make_schedule(
        lr=1e-4, total_steps=30, warmup_frac=0.0, schedule="cyclic_linear", cycles=3
    )
    # step 5 -> 1 - .9 * 5/10 = .55 ; step 9 -> 1 - .9 * .9 = .19 ; step 10 resets to 1.
    np.testing.assert_allclose(
        _values(schedule, [0, 5, 9, 10, 15, 20, 29, 30, 40]),
        [1e-4, 0.55e-4, 0.19e-4, 1e-4, 0.55e-4, 1e-4, 0.19e-4, 1e-5, 1e-5],
        rtol=1e-5,
    )


def test_cyclic_linear_per_epoch_is_leafs_staircase():
    # 3 cycles x 10 epochs x 10 steps: epoch k of a cycle runs at 1e-4 * (1 - .9 * k / 9).
    schedule = optim.make_schedule(
        lr=1e-4,
        total_steps=300,
        warmup_frac=0.0,
        schedule="cyclic_linear",
        cycles=3,
        epochs_per_cycle=10,
    )
    np.testing.assert_allclose(
        _values(schedule, [0, 9, 10, 19, 50, 95, 99, 100, 205, 299]),
        [1e-4, 1e-4, 0.9e-4, 0.9e-4, 0.5e-4, 1e-5, 1e-5, 1e-4, 1e-4, 1e-5],
        rtol=1e-5,
    )


def test_cyclic_linear_after_warmup():
    # warmup 10 of 50, then 2 cycles of 20 steps.
    schedule = optim.make_schedule(
        lr=1.0, total_steps=50, warmup_frac=0.2, schedule="cyclic_linear", cycles=2
    )
    np.testing.assert_allclose(
        _values(schedule, [5, 10, 20, 30, 40]), [0.5, 1.0, 0.55, 1.0, 0.55], rtol=1e-6
    )


def test_schedule_argument_errors():
    base = dict(lr=1.0, total_steps=10, warmup_frac=0.1)
    with pytest.raises(ValueError, match="schedule"):
        optim.make_schedule(**base, schedule="cosine")
    with pytest.raises(ValueError, match="cycles"):
        optim.make_schedule(**base, cycles=2)
    with pytest.raises(ValueError, match="warmup_frac"):
        optim.make_schedule(lr=1.0, total_steps=10, warmup_frac=1.0)
    with pytest.raises(ValueError, match="epochs_per_cycle"):
        optim.make_schedule(**base, epochs_per_cycle=3)


def test_decay_mask_selects_matrices():
    params = {
        "embed_tokens": jnp.zeros((5, 4)),
        "layers": [{"q_proj": {"kernel": jnp.zeros((4, 4)), "bias": jnp.zeros(4)}}],
        "norm": {"scale": jnp.zeros(4)},
        "stacked": jnp.zeros((2, 3, 4)),
    }
    mask = optim.decay_mask(params)
    assert mask == {
        "embed_tokens": True,
        "layers": [{"q_proj": {"kernel": True, "bias": False}}],
        "norm": {"scale": False},
        "stacked": True,
    }


HYPER = dict(lr=1e-2, weight_decay=0.1, b1=0.9, b2=0.98, eps=1e-6)


def _optimizer(**overrides):
    kwargs = dict(
        **HYPER,
        warmup_frac=0.2,
        total_steps=10,
        schedule="linear",
        cycles=1,
        clip_norm=None,
        accum_steps=1,
    )
    kwargs.update(overrides)
    return optim.make_optimizer(**kwargs)


def _gradients(steps, seed=0):
    rng = np.random.default_rng(seed)
    return [
        {
            "w": rng.normal(size=(3, 2)).astype(np.float32),
            "b": rng.normal(size=2).astype(np.float32),
        }
        for _ in range(steps)
    ]


@pytest.mark.parametrize("clip_norm", [None, 0.5])
def test_adamw_matches_torch_with_linear_schedule(clip_norm):
    rng = np.random.default_rng(1)
    init = {
        "w": rng.normal(size=(3, 2)).astype(np.float32),
        "b": rng.normal(size=2).astype(np.float32),
    }
    grads = _gradients(8)

    w = torch.nn.Parameter(torch.tensor(init["w"]))
    b = torch.nn.Parameter(torch.tensor(init["b"]))
    torch_opt = torch.optim.AdamW(
        [{"params": [w]}, {"params": [b], "weight_decay": 0.0}],
        lr=HYPER["lr"],
        betas=(HYPER["b1"], HYPER["b2"]),
        eps=HYPER["eps"],
        weight_decay=HYPER["weight_decay"],
    )
    # warmup int(0.2 * 10) = 2 steps, as make_schedule computes it.
    torch_sched = get_linear_schedule_with_warmup(torch_opt, 2, 10)

    optimizer = _optimizer(clip_norm=clip_norm)
    params = {k: jnp.asarray(v) for k, v in init.items()}
    state = optimizer.init(params)
    update = jax.jit(optimizer.update)
    for step, grad in enumerate(grads):
        w.grad, b.grad = torch.tensor(grad["w"]), torch.tensor(grad["b"])
        if clip_norm:
            torch.nn.utils.clip_grad_norm_([w, b], clip_norm)
        torch_opt.step()
        torch_sched.step()
        updates, state = update({k: jnp.asarray(v) for k, v in grad.items()}, state, params)
        params = optax.apply_updates(params, updates)
        np.testing.assert_allclose(params["w"], w.detach().numpy(), atol=1e-6, err_msg=str(step))
        np.testing.assert_allclose(params["b"], b.detach().numpy(), atol=1e-6, err_msg=str(step))
    # The run really moved: the first update had lr 0, the later ones did not.
    assert not np.allclose(params["w"], init["w"], atol=1e-4)


def test_accumulation_equals_one_big_batch():
    # Linear loss sum(c_i * p) over 8 examples: the big-batch gradient is the mean of c_i, and
    # each micro-batch of 2 examples has the mean of its own c_i as gradient.
    rng = np.random.default_rng(2)
    init = {"w": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32), "b": jnp.ones(2)}
    coefficients = _gradients(16, seed=3)  # 2 big batches of 8 examples
    big = _optimizer(accum_steps=1, clip_norm=1.0)
    accumulated = _optimizer(accum_steps=4, clip_norm=1.0)
    big_params, big_state = init, big.init(init)
    acc_params, acc_state = init, accumulated.init(init)
    big_update, acc_update = jax.jit(big.update), jax.jit(accumulated.update)
    for batch in range(2):
        examples = coefficients[batch * 8 : (batch + 1) * 8]
        mean = jax.tree.map(lambda *c: np.mean(c, axis=0), *examples)
        updates, big_state = big_update(mean, big_state, big_params)
        big_params = optax.apply_updates(big_params, updates)
        for micro in range(4):
            pair = examples[2 * micro : 2 * micro + 2]
            grad = jax.tree.map(lambda *c: np.mean(c, axis=0), *pair)
            updates, acc_state = acc_update(grad, acc_state, acc_params)
            if micro < 3:
                assert all(bool(jnp.all(u == 0)) for u in jax.tree.leaves(updates))
            acc_params = optax.apply_updates(acc_params, updates)
        for name in init:
            np.testing.assert_allclose(acc_params[name], big_params[name], atol=1e-6)
    # Both are past the lr-0 warmup step, so the params did change.
    assert not np.allclose(big_params["w"], init["w"], atol=1e-4)


def test_optimizer_argument_errors():
    with pytest.raises(ValueError, match="accum_steps"):
        _optimizer(accum_steps=0)
    with pytest.raises(ValueError, match="clip_norm"):
        _optimizer(clip_norm=-1.0)


def test_the_returned_schedule_is_the_one_the_optimizer_applies():
    """`make_optimizer_and_schedule`: with a constant gradient and no decay on a 1-D param, each
    Adam step moves it by lr_t / (1 + eps): the deltas are the returned schedule's values, floor
    (`end_lr_frac`) included: what train.py logs as train/lr is what was applied."""
    kwargs = dict(lr=1e-2, weight_decay=0.01, warmup_frac=0.2, total_steps=10, schedule="linear",
                  cycles=1, b1=0.9, b2=0.999, eps=1e-8, clip_norm=None, accum_steps=1,
                  end_lr_frac=0.1)  # fmt: skip
    optimizer, schedule = optim.make_optimizer_and_schedule(**kwargs)
    params = {"bias": jnp.zeros(3)}
    state = optimizer.init(params)
    deltas = []
    for _ in range(10):
        updates, state = optimizer.update({"bias": jnp.ones(3)}, state, params)
        deltas.append(-float(updates["bias"][0]))
        params = optax.apply_updates(params, updates)
    # warm-up 2 steps (0, 0.5 lr), then linear from lr to 0.1 lr over 8 steps (hand values).
    expected = [0.0, 5e-3] + [1e-2 * (1 - 0.9 * k / 8) for k in range(8)]
    np.testing.assert_allclose(deltas, expected, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose([float(schedule(k)) for k in range(10)], expected, rtol=1e-6)


@pytest.mark.parametrize(
    "name", ["caliber", "leaf", "leaf:paper", "demo", "study", "study_mpnet", "numeric"]
)
def test_every_config_sets_the_whole_schedule(name):
    """Each config's `optim` holds every schedule field (end_lr_frac and epochs_per_cycle
    included, so `--config.optim.<field>` works with the locked config) and builds."""
    import importlib

    module, _, arg = name.partition(":")
    config = importlib.import_module(f"configs.{module}").get_config(arg or None)
    assert {"end_lr_frac", "epochs_per_cycle"} <= set(config.optim)
    optimizer, schedule = optim.make_optimizer_and_schedule(total_steps=300, **config.optim)
    assert optimizer is not None and float(schedule(299)) > 0


def test_leaf_paper_variant_is_leafs_staircase():
    """configs/leaf.py:paper: 3 cycles of 10 epochs, 1e-4 lowered to 1e-5 at the end of each
    epoch (002 sec. 3.2), reset each cycle; 30 steps here = one step per epoch."""
    from configs import leaf

    config = leaf.get_config("paper")
    assert config.num_epochs == 30 and config.loss.lam == 0.0
    _, schedule = optim.make_optimizer_and_schedule(total_steps=30, **config.optim)
    cycle = [1e-4 * (1 - 0.9 * k / 9) for k in range(10)]
    np.testing.assert_allclose(_values(schedule, range(30)), cycle * 3, rtol=1e-6)
    assert leaf.get_config().optim.schedule == "linear"  # the Caliber paper's LEAF baseline
