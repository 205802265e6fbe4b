"""The jitted train step: 8-device data parallelism equals one device; the loss falls."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from caliber_jax import losses, optim, sharding, step
from caliber_jax.data import pipeline
from caliber_jax.models import bert, embedding

CONFIG = bert.BertConfig(
    vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, max_position_embeddings=64,
)  # fmt: skip


def make_model(seed, out_dim=None):
    spec = embedding.ModelSpec("bert", CONFIG, "mean", out_dim, {})
    model = embedding.EmbeddingModel(spec, dtype=jnp.float32, rngs=nnx.Rngs(seed))
    graphdef, params = nnx.split(model, nnx.Param)
    return graphdef, nnx.to_pure_dict(params)


def make_batch(seed, *, rows=8, length=16, teacher=None):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, length + 1, size=rows)
    ids = rng.integers(1, CONFIG.vocab_size, size=(rows, length)).astype(np.int32)
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    pert = ids.copy()
    pert[:, 1] = rng.integers(1, CONFIG.vocab_size, size=rows)
    has_pert = rng.random(rows) < 0.5
    batch = {
        "input_ids": ids * mask,
        "attention_mask": mask,
        "pert_input_ids": pert * mask,
        "pert_attention_mask": mask,
        "has_pert": has_pert,
        "weight": np.ones(rows, np.float32),
    }
    if teacher is None:
        vecs = rng.standard_normal((2, rows, CONFIG.hidden_size)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=-1, keepdims=True)
        batch["teacher_x"], batch["teacher_px"] = vecs
    else:
        graphdef, params = teacher
        model = nnx.merge(graphdef, params)
        batch["teacher_x"] = np.asarray(model(ids * mask, mask))
        batch["teacher_px"] = np.asarray(model(pert * mask, mask)) * has_pert[:, None]
    return batch


def make_optimizer(lr=1e-3):
    return optim.make_optimizer(
        lr=lr, weight_decay=0.01, warmup_frac=0.0, total_steps=100, schedule="constant",
        cycles=1, b1=0.9, b2=0.999, eps=1e-8, clip_norm=1.0, accum_steps=1,
    )  # fmt: skip


def run_steps(devices, batches, *, lam=0.5):
    """Steps on `batches` through one jitted `train_step`."""
    mesh = sharding.make_mesh(devices=devices)
    graphdef, params = make_model(0)
    optimizer = make_optimizer()
    schedule = optim.make_schedule(lr=1e-3, total_steps=100, warmup_frac=0.0, schedule="constant")
    abstract = jax.eval_shape(lambda p: step.init_state(p, optimizer, seed=0), params)
    shardings = sharding.param_shardings(mesh, abstract)
    state = jax.jit(lambda p: step.init_state(p, optimizer, seed=0), out_shardings=shardings)(
        params
    )
    train = jax.jit(
        functools.partial(
            step.train_step, graphdef=graphdef, optimizer=optimizer, schedule=schedule,
            lam=lam, margin=0.05, reduction="batch",
        ),
        in_shardings=(shardings, sharding.batch_sharding(mesh)),
        out_shardings=(shardings, sharding.replicated(mesh)),
        donate_argnums=0,
    )  # fmt: skip
    history = []
    for batch in batches:
        state, metrics = train(state, sharding.to_global(batch, mesh))
        history.append(jax.device_get(metrics))
    return jax.device_get(state.params), history


def test_eight_devices_equal_one_device():
    assert len(jax.devices()) == 8
    batches = [make_batch(s) for s in range(3)]
    one, hist_one = run_steps(jax.devices()[:1], batches)
    eight, hist_eight = run_steps(jax.devices(), batches)
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(eight), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    for m1, m8 in zip(hist_one, hist_eight, strict=True):
        np.testing.assert_allclose(m1["train/loss"], m8["train/loss"], rtol=1e-5)


def test_batch_is_split_across_devices():
    mesh = sharding.make_mesh()
    batch = sharding.to_global(make_batch(0), mesh)
    shards = batch["input_ids"].addressable_shards
    assert len(shards) == 8 and {s.data.shape for s in shards} == {(1, 16)}


def test_loss_falls_within_twenty_steps():
    teacher = make_model(seed=42)
    batches = [make_batch(s % 4, teacher=teacher) for s in range(20)]
    _, history = run_steps(jax.devices()[:1], batches)
    losses = np.array([m["train/loss"] for m in history])
    assert np.all(np.isfinite(losses))
    assert losses[-4:].mean() < 0.8 * losses[:4].mean(), losses
    assert history[0]["train/pert_frac"] > 0


def test_lambda_zero_step_ignores_hinge():
    """With lam = 0 the update does not depend on the numeric term (LEAF)."""
    batch = make_batch(1)
    flipped = dict(batch, teacher_px=-batch["teacher_px"])  # changes Delta_t, and L_a(pi x)
    leaf_a, _ = run_steps(jax.devices()[:1], [batch], lam=0.0)
    cal_a, _ = run_steps(jax.devices()[:1], [batch], lam=0.5)
    # The hinge changes the step when lam > 0 ...
    diffs = [
        np.abs(a - b).max()
        for a, b in zip(jax.tree.leaves(leaf_a), jax.tree.leaves(cal_a), strict=True)
    ]
    assert max(diffs) > 0
    # ... and the loss reported with lam = 0 is exactly mean(La(x) + 1[pi] La(pi x)).
    _, hist = run_steps(jax.devices()[:1], [flipped], lam=0.0)
    parts = hist[0]
    expected = parts["train/align_x"] + parts["train/pert_frac"] * parts["train/align_px"]
    np.testing.assert_allclose(parts["train/loss"], expected, rtol=1e-6)


def to_compact(batch, rows_multiple):
    """The compact layout of a stacked test batch (as `pipeline.make_loader` builds it)."""
    pert = np.flatnonzero(batch["has_pert"])
    count = max(rows_multiple, -(-len(pert) // rows_multiple) * rows_multiple)
    ids = np.zeros((count, batch["pert_input_ids"].shape[1]), np.int32)
    mask = np.zeros_like(ids)
    ids[: len(pert)] = batch["pert_input_ids"][pert]
    mask[: len(pert)] = batch["pert_attention_mask"][pert]
    ids[len(pert) :, 0], mask[len(pert) :, 0] = 7, 1  # padding rows: one dummy token
    index = np.full(count, len(batch["has_pert"]), np.int32)
    index[: len(pert)] = pert
    return {**batch, "pert_input_ids": ids, "pert_attention_mask": mask, "pert_index": index}


def test_compact_layout_matches_stacked():
    graphdef, params = make_model(0)
    batch = make_batch(6, rows=8)
    assert batch["has_pert"].sum() == 3
    kwargs = dict(graphdef=graphdef, lam=0.5, margin=0.05, reduction="batch")
    grad_fn = jax.jit(jax.value_and_grad(functools.partial(step.loss_fn, **kwargs), has_aux=True))
    (loss, parts), grads = grad_fn(params, batch)
    for rows_multiple in (1, 4):
        compact = to_compact(batch, rows_multiple)
        assert compact["pert_input_ids"].shape[0] < 8
        (loss_c, parts_c), grads_c = grad_fn(params, compact)
        np.testing.assert_allclose(loss_c, loss, rtol=1e-5)
        for key in parts:
            np.testing.assert_allclose(parts_c[key], parts[key], rtol=1e-5, atol=1e-7)
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), grads_c, grads
        )


class ArraySource:
    """A stacked test batch as a `pipeline.TrainSource`: each text is its space-separated ids."""

    neighbours = None
    teacher_q = None  # no training queries (the query-geometry term's store)

    def __init__(self, batch):
        def as_texts(prefix):
            rows = zip(batch[f"{prefix}input_ids"], batch[f"{prefix}attention_mask"], strict=True)
            return [" ".join(map(str, row[mask > 0])) for row, mask in rows]

        self.texts = as_texts("")
        pairs = zip(as_texts("pert_"), batch["has_pert"], strict=True)
        self.perturbed = [text if has_pert else "" for text, has_pert in pairs]
        self.teacher = batch["teacher_x"], batch["teacher_px"]

    def __len__(self):
        return len(self.texts)

    def read_texts(self, indices):
        return [self.texts[i] for i in indices], [self.perturbed[i] for i in indices]

    def read_teacher(self, indices):
        return tuple(vecs[indices].copy() for vecs in self.teacher)


def split_ids(texts, max_length):
    return [[int(token) for token in text.split()][:max_length] for text in texts]


def to_packed(batch, *, length, rows_multiple, rungs):
    """The packed layout of a stacked test batch, built by `pipeline.make_loader` itself."""
    loader = pipeline.make_loader(
        ArraySource(batch), batch_size=len(batch["has_pert"]), seed=0, num_epochs=1,
        shuffle=False, process_index=0, process_count=1, tokenize_fn=split_ids,
        max_length=length, pad_id=0, pad_to_multiple=1, length_group_window=1,
        drop_remainder=True, worker_count=0, read_threads=0, pack_length=length,
        pack_rows_multiple=rows_multiple, pack_rungs=rungs,
    )  # fmt: skip
    return next(iter(loader))


@pytest.mark.parametrize("fallback", [False, True], ids=["data_rung", "worst_case_rung"])
def test_packed_layout_matches_stacked(fallback):
    """Same loss, parts and gradients (hence the same training) with sequences packed in a
    fixed number of rows: the rung the batch fits, or the fallback that any batch fits (16
    rows, most of them padding, as `padding.pack_rows` fills them)."""
    graphdef, params = make_model(0)
    batch = make_batch(6, rows=8)
    kwargs = dict(graphdef=graphdef, lam=0.5, margin=0.05, reduction="batch")
    grad_fn = jax.jit(jax.value_and_grad(functools.partial(step.loss_fn, **kwargs), has_aux=True))
    (loss, parts), grads = grad_fn(params, batch)
    packed = to_packed(batch, length=32, rows_multiple=2, rungs=1)
    assert packed["packed_ids"].shape[0] == 4
    # Several sequences per row, and fewer token slots than the stacked layout.
    assert max(len(set(row.tolist()) - {16}) for row in packed["packed_slots"]) >= 2
    assert packed["packed_ids"].size < batch["input_ids"].size + batch["pert_input_ids"].size
    if fallback:
        empty = {"packed_ids": 0, "packed_slots": 16, "packed_positions": 0}
        for key, fill in empty.items():
            packed[key] = np.concatenate([packed[key], np.full((12, 32), fill, np.int32)])
    (loss_p, parts_p), grads_p = grad_fn(params, packed)
    assert np.isfinite(loss_p)
    np.testing.assert_allclose(loss_p, loss, rtol=1e-5, atol=1e-5)
    for key in parts:
        np.testing.assert_allclose(parts_p[key], parts[key], rtol=1e-5, atol=1e-5, err_msg=key)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-5), grads_p, grads)


def neighbour_batch(seed, teacher):
    """A calibration batch: the teacher is the student's own init; x_nb = the next row."""
    batch = make_batch(seed, teacher=teacher)
    batch["has_pert"] = np.ones_like(batch["has_pert"])
    graphdef, params = teacher
    model = nnx.merge(graphdef, params)
    batch["teacher_px"] = np.asarray(model(batch["pert_input_ids"], batch["pert_attention_mask"]))
    batch["teacher_nb"] = np.roll(batch["teacher_x"], 1, axis=0)
    batch["has_nb"] = np.arange(len(batch["weight"])) % 4 != 3  # a few rows without one
    return batch


def test_neighbour_objective_loss_fn_is_calibration_loss():
    graphdef, params = make_model(0)
    batch = neighbour_batch(2, (graphdef, params))
    options = dict(lam=2.0, margin=0.05, reduction="batch", perturb_weight=0.0)
    loss, parts = step.loss_fn(params, batch, graphdef=graphdef, objective="neighbour", **options)
    s_x, s_px = step.embed_pairs(graphdef, params, batch)
    want, want_parts = losses.calibration_loss(
        s_x, s_px, batch["teacher_x"], batch["teacher_px"], batch["has_pert"],
        objective="neighbour", t_nb=batch["teacher_nb"], has_nb=batch["has_nb"],
        weights=batch["weight"], **options,
    )  # fmt: skip
    np.testing.assert_allclose(loss, want, rtol=1e-6)
    np.testing.assert_allclose(parts["sim_nb"], want_parts["sim_nb"], rtol=1e-6)
    # Student == teacher: alignment is 0 and the loss is lam * the neighbour hinge alone.
    np.testing.assert_allclose(parts["align_x"], 0.0, atol=1e-6)
    # The default objective is eq. 4, bit for bit.
    eq4, _ = step.loss_fn(params, batch, graphdef=graphdef, lam=0.5, margin=0.05,
                          reduction="batch")  # fmt: skip
    want4, _ = losses.caliber_loss(s_x, s_px, batch["teacher_x"], batch["teacher_px"],
                                   batch["has_pert"], lam=0.5, margin=0.05,
                                   weights=batch["weight"])  # fmt: skip
    assert float(eq4) == float(want4)
    # The structure term reaches calibration_loss with its weight (and the eq. 4 objective too).
    for objective in ("neighbour", "caliber"):
        loss, parts = step.loss_fn(params, batch, graphdef=graphdef, objective=objective,
                                   structure_weight=3.0, **options)  # fmt: skip
        want, _ = losses.calibration_loss(
            s_x, s_px, batch["teacher_x"], batch["teacher_px"], batch["has_pert"],
            objective=objective, t_nb=batch["teacher_nb"], has_nb=batch["has_nb"],
            weights=batch["weight"], structure_weight=3.0, **options,
        )  # fmt: skip
        np.testing.assert_allclose(loss, want, rtol=1e-6)
        assert "structure" in parts


def test_eval_step_counts_each_part_over_its_own_rows():
    """Validation under "neighbour" scores the trained loss, each part divided back by the rows
    it is a mean over: `num` over perturbed rows *with a neighbour*, not over perturbed rows."""
    graphdef, params = make_model(0)
    batch = neighbour_batch(2, (graphdef, params))
    batch["has_pert"] = np.arange(len(batch["weight"])) % 3 != 1  # some rows unperturbed
    batch["weight"] = batch["weight"].copy()
    batch["weight"][-1] = 0.0  # a padding row
    options = dict(lam=2.0, margin=0.05, reduction="batch", perturb_weight=0.0,
                   structure_weight=3.0)  # fmt: skip
    sums = jax.device_get(
        step.eval_step(params, batch, graphdef=graphdef, objective="neighbour", **options)
    )
    loss, parts = step.loss_fn(params, batch, graphdef=graphdef, objective="neighbour", **options)
    weight, pert, nb = batch["weight"], batch["has_pert"], batch["has_nb"]
    want = {"rows": weight.sum(), "pert_rows": (weight * pert).sum(),
            "term_rows": (weight * pert * nb).sum()}  # fmt: skip
    assert want["term_rows"] < want["pert_rows"] < want["rows"]  # three different counts
    for name, count in want.items():
        assert float(sums[name]) == float(count), name
    np.testing.assert_allclose(sums["loss"] / sums["rows"], loss, rtol=1e-6)
    for name, value in parts.items():
        count = want[step.EVAL_PART_ROWS.get(name, "rows")]
        np.testing.assert_allclose(sums[name] / count, value, rtol=1e-5, atol=1e-7, err_msg=name)
    assert float(parts["num"]) > 0 and "structure" in sums and "sim_nb" in sums
    # Eq. 4: the term covers every perturbed row.
    sums4 = jax.device_get(step.eval_step(params, batch, graphdef=graphdef, lam=0.5, margin=0.05,
                                          reduction="batch"))  # fmt: skip
    assert float(sums4["term_rows"]) == float(want["pert_rows"])


def test_val_loss_is_the_trained_loss_of_the_whole_split():
    """`train.evaluate`'s val/loss over two batches with different perturbed fractions equals the
    trained loss of one batch holding both, under either reduction; the row-weighted mean of the
    two batch losses (val/loss before) equals it only under "batch". One batch's loss is
    `losses.loss_from_parts` of its own parts, the query and contrastive terms included."""
    import ml_collections

    from caliber_jax import train

    graphdef, params = make_model(0)
    teacher = make_model(1)
    first = neighbour_batch(2, teacher)
    first["has_pert"] = np.arange(len(first["weight"])) % 4 != 1  # 3 of 4 rows perturbed
    first["weight"] = first["weight"].copy()
    first["weight"][-1] = 0.0  # a padding row
    second = neighbour_batch(3, teacher)
    second["has_pert"] = np.arange(len(second["weight"])) % 4 == 0  # 1 of 4
    both = {key: np.concatenate([first[key], second[key]]) for key in first}
    mesh = sharding.make_mesh()
    for reduction in ("batch", "per_term"):
        # no in-batch terms (structure, query, contrastive) here: one batch of both rows would
        # pair each row with more rows than either batch does
        options = dict(lam=2.0, margin=0.05, reduction=reduction, perturb_weight=0.5,
                       structure_weight=0.0, objective="neighbour")  # fmt: skip
        config = ml_collections.ConfigDict({**options, "query_weight": 0.0,
                                            "contrastive_weight": 0.0})  # fmt: skip
        eval_fn = jax.jit(functools.partial(step.eval_step, graphdef=graphdef, **options))
        val = train.evaluate(eval_fn, params, lambda: [first, second], mesh, config)
        want, _ = step.loss_fn(params, both, graphdef=graphdef, **options)
        np.testing.assert_allclose(val["val/loss"], float(want), rtol=1e-5, err_msg=reduction)
        old = train.evaluate(eval_fn, params, lambda: [first, second], mesh)
        gap = abs(old["val/loss"] - float(want))
        assert gap < 1e-5 if reduction == "batch" else gap > 1e-3, (reduction, gap)
        # One batch, with the query-geometry and the contrastive term: the loss from its parts.
        queried = with_queries(first, teacher)
        extra = dict(structure_weight=3.0, query_weight=4.0, contrastive_weight=0.5)
        options.pop("structure_weight")
        loss, parts = step.loss_fn(params, queried, graphdef=graphdef, **options, **extra)
        sums = jax.device_get(step.eval_step(params, queried, graphdef=graphdef, **options,
                                             **extra))  # fmt: skip
        rows = float(sums["rows"])
        assert {"structure", "query", "contrastive"} <= set(parts)
        rebuilt = losses.loss_from_parts(
            {k: float(v) for k, v in parts.items()}, reduction=reduction, lam=2.0,
            perturb_weight=0.5, **extra,
            pert_frac=float(sums["pert_rows"]) / rows, term_frac=float(sums["term_rows"]) / rows,
        )  # fmt: skip
        np.testing.assert_allclose(rebuilt, float(loss), rtol=1e-5, err_msg=reduction)
    with pytest.raises(ValueError, match="reduction='mean'"):
        losses.loss_from_parts({}, reduction="mean", lam=1.0)


def with_queries(batch, teacher, seed=7, length=8):
    """`batch` plus one training query per row (rows 1 and 5 without), teacher = the init."""
    rng = np.random.default_rng(seed)
    rows = len(batch["weight"])
    ids = rng.integers(1, CONFIG.vocab_size, size=(rows, length)).astype(np.int32)
    mask = np.arange(length)[None] < rng.integers(2, length + 1, size=rows)[:, None]
    has_q = ~np.isin(np.arange(rows), [1, 5])
    graphdef, params = teacher
    t_q = np.asarray(nnx.merge(graphdef, params)(ids * mask, mask.astype(np.int32)))
    return {**batch, "query_input_ids": ids * mask, "query_attention_mask": mask.astype(np.int32),
            "teacher_q": t_q * has_q[:, None], "has_q": has_q}  # fmt: skip


def test_query_term_wiring_through_loss_fn_and_eval_step():
    """loss_fn with query_weight adds query_weight * the per-query mean of
    `losses.query_geometry_loss` (student queries against every present x and pi(x)); the
    validation sums count it over the rows with a query."""
    graphdef, params = make_model(0)
    teacher = make_model(1)  # another init, so the query geometry differs from the student's
    batch = with_queries(neighbour_batch(2, teacher), teacher)
    batch["has_pert"] = np.arange(len(batch["weight"])) % 3 != 1
    batch["weight"] = batch["weight"].copy()
    batch["weight"][-1] = 0.0
    options = dict(lam=2.0, margin=0.05, reduction="batch", perturb_weight=0.0,
                   objective="neighbour")  # fmt: skip
    base, base_parts = step.loss_fn(params, batch, graphdef=graphdef, **options)
    loss, parts = step.loss_fn(params, batch, graphdef=graphdef, query_weight=4.0, **options)
    model = nnx.merge(graphdef, params)
    s_q = model(batch["query_input_ids"], batch["query_attention_mask"])
    s_x, s_px = step.embed_pairs(graphdef, params, batch)
    weight = batch["weight"]
    q_valid = batch["has_q"] & (weight > 0)
    p_valid = np.concatenate([weight > 0, batch["has_pert"] & (weight > 0)])
    per_query = losses.query_geometry_loss(
        s_q, batch["teacher_q"], jnp.concatenate([s_x, s_px]),
        jnp.concatenate([batch["teacher_x"], batch["teacher_px"]]), q_valid, p_valid,
    )  # fmt: skip
    want = float(np.sum(per_query * q_valid) / q_valid.sum())
    assert want > 1e-4  # a real term, not a zero that any wiring would match
    np.testing.assert_allclose(parts["query"], want, rtol=1e-5)
    np.testing.assert_allclose(loss, base + 4.0 * want, rtol=1e-5)
    for name, value in base_parts.items():
        np.testing.assert_allclose(parts[name], value, rtol=1e-6)
    sums = jax.device_get(step.eval_step(params, batch, graphdef=graphdef, query_weight=4.0,
                                         **options))  # fmt: skip
    assert float(sums["query_rows"]) == float(q_valid.sum())
    np.testing.assert_allclose(sums["query"] / sums["query_rows"], want, rtol=1e-5)
    # The gradient reaches the encoder through the query forward too, and is finite.
    grads = jax.grad(lambda p: step.loss_fn(p, batch, graphdef=graphdef, query_weight=4.0,
                                            **options)[0])(params)  # fmt: skip
    base_grads = jax.grad(lambda p: step.loss_fn(p, batch, graphdef=graphdef,
                                                 **options)[0])(params)  # fmt: skip
    leaves = jax.tree.leaves(jax.tree.map(lambda a, b: jnp.abs(a - b).max(), grads, base_grads))
    assert max(float(x) for x in leaves) > 0
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    # Asked for without queries in the batch: one clear error.
    plain = {k: v for k, v in batch.items() if not k.startswith(("query_", "teacher_q", "has_q"))}
    with pytest.raises(ValueError, match="query_weight > 0 needs training queries"):
        step.loss_fn(params, plain, graphdef=graphdef, query_weight=4.0, **options)


def test_query_term_keeps_query_passage_cosines_while_pairs_separate():
    """Twenty steps of neighbour (+ query term) from the teacher itself: pi(x) moves away from x
    either way, and the query term keeps the query-passage cosines at the teacher's (measured:
    sim_p 0.988 -> 0.821 without / 0.907 with weight 50; query term 0.0167 / 0.00018)."""
    graphdef, params = make_model(0)
    batch = with_queries(neighbour_batch(3, (graphdef, params)), (graphdef, params))
    optimizer = make_optimizer(lr=3e-3)
    schedule = optim.make_schedule(lr=3e-3, total_steps=100, warmup_frac=0.0, schedule="constant")
    options = dict(lam=2.0, margin=0.05, reduction="batch", objective="neighbour",
                   perturb_weight=0.0)  # fmt: skip
    parts_of = jax.jit(
        lambda p: step.loss_fn(p, batch, graphdef=graphdef, query_weight=1.0, **options)[1]
    )
    start = jax.device_get(parts_of(params))
    assert start["query"] < 1e-8  # student = teacher
    end = {}
    for weight in (0.0, 50.0):
        train = jax.jit(
            functools.partial(
                step.train_step, graphdef=graphdef, optimizer=optimizer, schedule=schedule,
                query_weight=weight, **options,
            )
        )  # fmt: skip
        state = step.init_state(params, optimizer, seed=0)
        for _ in range(20):
            state, _ = train(state, batch)
        end[weight] = jax.device_get(parts_of(state.params))
    for weight in (0.0, 50.0):
        assert end[weight]["sim_p"] < start["sim_p"] - 0.05, (weight, start, end)
    assert end[50.0]["query"] < 0.05 * end[0.0]["query"], end


def test_neighbour_objective_separates_pairs_in_twenty_steps():
    """Calibrating a model against itself: the pi(x) pairs move apart while x stays aligned."""
    graphdef, params = make_model(0)
    batch = neighbour_batch(3, (graphdef, params))
    optimizer = make_optimizer(lr=3e-3)
    schedule = optim.make_schedule(lr=3e-3, total_steps=100, warmup_frac=0.0, schedule="constant")
    train = jax.jit(
        functools.partial(
            step.train_step, graphdef=graphdef, optimizer=optimizer, schedule=schedule, lam=2.0,
            margin=0.05, reduction="batch", objective="neighbour", perturb_weight=0.0,
        )
    )  # fmt: skip
    state = step.init_state(params, optimizer, seed=0)
    history = []
    for _ in range(20):
        state, metrics = train(state, batch)
        history.append(jax.device_get(metrics))
    first, last = history[0], history[-1]
    assert first["train/num"] > 0.1 and first["train/sim_p"] > first["train/sim_nb"]
    assert last["train/num"] < 0.5 * first["train/num"], (first, last)
    assert last["train/sim_p"] < first["train/sim_p"] - 0.05
    assert last["train/align_x"] < 0.5


def test_query_term_on_x_only_leaves_pi_x_free():
    """`query_passages="x"`: the query term compares each query with the batch's x rows alone,
    so it equals `losses.query_geometry_loss` over x and does not move with s(pi x)."""
    rng = np.random.default_rng(3)
    rows, dim = 6, 8
    unit = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731
    s_x, s_px, s_q, t_x, t_px, t_q = (unit(rng.normal(size=(rows, dim))).astype(np.float32)
                                      for _ in range(6))  # fmt: skip
    batch = {"weight": np.array([1, 1, 1, 1, 1, 0], np.float32),
             "has_pert": np.array([1, 0, 1, 1, 0, 1], bool), "teacher_x": t_x, "teacher_px": t_px,
             "teacher_q": t_q, "has_q": np.array([1, 1, 0, 1, 1, 1], bool)}  # fmt: skip
    options = dict(lam=0.5, margin=0.05, reduction="batch", query_weight=2.0, s_q=s_q)
    q_valid = batch["has_q"] & (batch["weight"] > 0)
    per_query = losses.query_geometry_loss(s_q, t_q, s_x, t_x, q_valid, batch["weight"] > 0)
    want = float(np.sum(np.asarray(per_query) * q_valid) / q_valid.sum())
    _, parts = step.vectors_loss(s_x, s_px, batch, query_passages="x", **options)
    np.testing.assert_allclose(parts["query"], want, rtol=1e-6)
    moved = unit(s_px + rng.normal(size=s_px.shape)).astype(np.float32)
    _, moved_parts = step.vectors_loss(s_x, moved, batch, query_passages="x", **options)
    np.testing.assert_allclose(moved_parts["query"], parts["query"], rtol=1e-7)
    _, both = step.vectors_loss(s_x, s_px, batch, query_passages="both", **options)
    _, both_moved = step.vectors_loss(s_x, moved, batch, query_passages="both", **options)
    assert abs(float(both["query"]) - float(both_moved["query"])) > 1e-4
    with pytest.raises(ValueError, match="query_passages must be 'x' or 'both'"):
        step.vectors_loss(s_x, s_px, batch, query_passages="px", **options)


def test_accumulated_steps_equal_one_big_batch_step():
    """`optim.accum_steps = 2` over the two halves of a 16-passage batch makes the update of the
    whole batch in one step (eq. 4 with reduction "batch" is a mean over rows, so the halves'
    mean gradient is the whole batch's): the tokens-per-update knob of configs/caliber.py.
    Adam with eps = 1 keeps the update linear in the gradient, so the comparison sees gradient
    differences, not the rounding noise Adam's g / |g| makes of near-zero gradients."""
    graphdef, params = make_model(0)
    batch = make_batch(7, rows=16)
    halves = [{k: v[part] for k, v in batch.items()} for part in (slice(0, 8), slice(8, 16))]

    def train(batches, accum_steps):
        optimizer = optim.make_optimizer(
            lr=1e-2, weight_decay=0.01, warmup_frac=0.0, total_steps=100, schedule="constant",
            cycles=1, b1=0.9, b2=0.999, eps=1.0, clip_norm=1.0, accum_steps=accum_steps,
        )  # fmt: skip
        schedule = optim.make_schedule(
            lr=1e-2, total_steps=100, warmup_frac=0.0, schedule="constant"
        )
        state = step.init_state(params, optimizer, seed=0)
        run = jax.jit(functools.partial(
            step.train_step, graphdef=graphdef, optimizer=optimizer, schedule=schedule,
            lam=0.5, margin=0.05, reduction="batch",
        ))  # fmt: skip
        for part in batches:
            state, _ = run(state, part)
        return jax.device_get(state.params)

    big, accumulated = train([batch], 1), train(halves, 2)
    moved = max(
        np.abs(a - b).max()
        for a, b in zip(jax.tree.leaves(big), jax.tree.leaves(params), strict=True)
    )
    assert moved > 1e-4  # the update happened
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-5), accumulated, big)
    # ...and the first half alone is not the same update
    alone = train(halves[:1], 1)
    assert (
        max(
            np.abs(a - b).max()
            for a, b in zip(jax.tree.leaves(alone), jax.tree.leaves(big), strict=True)
        )
        > 1e-5
    )


def test_contrastive_term_wiring_judge_and_eval_step():
    """loss_fn with contrastive_weight adds the weight times the mean `losses.contrastive_loss`
    of the kept questions against the batch's x rows; judge "teacher" keeps only the questions
    whose passage the teacher ranks first in the batch; the validation sums count the kept rows."""
    graphdef, params = make_model(0)
    teacher = make_model(1)
    batch = with_queries(neighbour_batch(2, teacher), teacher)
    batch["weight"] = batch["weight"].copy()
    batch["weight"][-1] = 0.0
    options = dict(lam=2.0, margin=0.05, reduction="batch", perturb_weight=0.0,
                   objective="neighbour")  # fmt: skip
    base, _ = step.loss_fn(params, batch, graphdef=graphdef, **options)
    model = nnx.merge(graphdef, params)
    s_q = model(batch["query_input_ids"], batch["query_attention_mask"])
    s_x, _ = step.embed_pairs(graphdef, params, batch)
    valid = batch["weight"] > 0
    has_q = batch["has_q"] & valid
    # The teacher's own in-batch ranking decides which questions the judge keeps.
    t_sim = np.asarray(batch["teacher_q"]) @ np.asarray(batch["teacher_x"]).T
    t_sim /= np.linalg.norm(batch["teacher_q"], axis=1, keepdims=True).clip(1e-12)
    t_sim /= np.linalg.norm(batch["teacher_x"], axis=1, keepdims=True).T.clip(1e-12)
    rivals = np.where(np.eye(len(valid), dtype=bool) | ~valid[None, :], -2.0, t_sim).max(1)
    teacher_first = has_q & (np.diagonal(t_sim) > rivals)
    for judge, kept in (("none", has_q), ("teacher", teacher_first)):
        per_query, _ = losses.contrastive_loss(s_q, s_x, jnp.asarray(kept), jnp.asarray(valid),
                                               temperature=0.05)  # fmt: skip
        want = float(np.sum(np.asarray(per_query) * kept) / kept.sum())
        loss, parts = step.loss_fn(params, batch, graphdef=graphdef, contrastive_weight=0.5,
                                   contrastive_judge=judge, **options)  # fmt: skip
        np.testing.assert_allclose(parts["contrastive"], want, rtol=1e-5, err_msg=judge)
        np.testing.assert_allclose(loss, base + 0.5 * want, rtol=1e-5, err_msg=judge)
        np.testing.assert_allclose(parts["contrastive_kept"], kept.sum() / has_q.sum(), rtol=1e-6)
        sums = jax.device_get(step.eval_step(params, batch, graphdef=graphdef,
                                             contrastive_weight=0.5, contrastive_judge=judge,
                                             **options))  # fmt: skip
        np.testing.assert_allclose(float(sums["contrastive_rows"]), kept.sum(), rtol=1e-6)
        np.testing.assert_allclose(sums["contrastive"] / sums["contrastive_rows"], want, rtol=1e-5)
    assert 0 < teacher_first.sum() < has_q.sum()  # the judge really drops some and keeps some
    grads = jax.grad(lambda p: step.loss_fn(p, batch, graphdef=graphdef, contrastive_weight=0.5,
                                            **options)[0])(params)  # fmt: skip
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    plain = {k: v for k, v in batch.items() if not k.startswith(("query_", "teacher_q", "has_q"))}
    with pytest.raises(ValueError, match="contrastive_weight > 0 needs training queries"):
        step.loss_fn(params, plain, graphdef=graphdef, contrastive_weight=0.5, **options)
    with pytest.raises(ValueError, match="contrastive_judge"):
        step.loss_fn(params, batch, graphdef=graphdef, contrastive_weight=0.5,
                     contrastive_judge="llm", **options)  # fmt: skip


def test_query_align_term_is_the_mean_distance_of_question_vectors_to_the_teacher():
    """loss_fn with query_align_weight adds the weight times the mean ||s(q) - t(q)|| over the
    rows that have a question (and weight); eval_step sums it over the same rows; the gradient
    moves the student's question vectors toward the teacher's."""
    graphdef, params = make_model(0)
    teacher = make_model(1)
    batch = with_queries(neighbour_batch(2, teacher), teacher)
    batch["weight"] = batch["weight"].copy()
    batch["weight"][-1] = 0.0
    batch["has_q"] = batch["has_q"].copy()
    batch["has_q"][0] = False
    options = dict(lam=2.0, margin=0.05, reduction="batch", perturb_weight=0.0,
                   objective="neighbour")  # fmt: skip
    base, _ = step.loss_fn(params, batch, graphdef=graphdef, **options)
    s_q = np.asarray(nnx.merge(graphdef, params)(batch["query_input_ids"],
                                                 batch["query_attention_mask"]))  # fmt: skip
    rows = (batch["weight"] > 0) & batch["has_q"]
    distances = np.linalg.norm(s_q - np.asarray(batch["teacher_q"], np.float32), axis=1)
    want = float(distances[rows].mean())
    assert 1 < rows.sum() < len(rows)
    loss, parts = step.loss_fn(params, batch, graphdef=graphdef, query_align_weight=0.5, **options)
    np.testing.assert_allclose(parts["query_align"], want, rtol=1e-5)
    np.testing.assert_allclose(loss, base + 0.5 * want, rtol=1e-5)
    sums = jax.device_get(step.eval_step(params, batch, graphdef=graphdef,
                                         query_align_weight=0.5, **options))  # fmt: skip
    np.testing.assert_allclose(sums["query_align"] / sums["query_rows"], want, rtol=1e-5)
    np.testing.assert_allclose(
        losses.loss_from_parts({"align_x": 0.0, "align_px": 0.0, "num": 0.0, "query_align": want},
                               reduction="batch", lam=2.0, query_align_weight=0.5),
        0.5 * want, rtol=1e-6)  # fmt: skip

    def question_distance(p):
        out = step.loss_fn(p, batch, graphdef=graphdef, query_align_weight=1.0, **options)
        return out[1]["query_align"]

    grads = jax.grad(lambda p: step.loss_fn(p, batch, graphdef=graphdef,
                                            query_align_weight=1.0, **options)[0])(params)  # fmt: skip
    moved = jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)
    assert float(question_distance(moved)) < float(question_distance(params))
    plain = {k: v for k, v in batch.items() if not k.startswith(("query_", "teacher_q", "has_q"))}
    with pytest.raises(ValueError, match="query_align_weight > 0 needs training queries"):
        step.loss_fn(params, plain, graphdef=graphdef, query_align_weight=0.5, **options)
