"""A PyTorch reference training loop for the Caliber objective, shaped like the authors' script.

    python benchmarks/torch_reference.py --spec runs/bench_e2e/.../torch_spec.json

One epoch over a prepared split (`train.jsonl` and its teacher stores from `caliber_jax.prepare` /
`caliber_jax.embed_teacher`), in the batch order given as row indices (the benchmark reads it from
`pipeline.make_epoch_batches`, so both frameworks see the same batches). Per step, as the authors'
released `caliber/train.py` does it: tokenize the batch with dynamic padding to its longest text,
forward x, forward the perturbed rows only, eq. 4 (`losses.caliber_loss`, either reduction), clip,
AdamW on HF's linear warmup/decay schedule, and a `torch.save` of model and optimizer at the
checkpoint cadence. Dropout is off, as in the JAX port, so both do the same arithmetic.

This module never imports jax (its wall time is the PyTorch side of the end-to-end benchmark);
`benchmarks/train_throughput.py` reuses `embed`, `caliber_loss`, `make_optimizer` and
`compile_model` (its `--torch-compile` row). Legend: B batch, P perturbed
rows, T tokens, D width.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

# Run from anywhere: the repo root (for `caliber_jax`) goes first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caliber_jax import host  # noqa: E402
from caliber_jax.data import corpus, teacher  # noqa: E402  (neither imports jax)


def embed(model, ids_bt: torch.Tensor, mask_bt: torch.Tensor) -> torch.Tensor:
    """[B, D] float32 unit vectors: masked mean of the last hidden states, L2-normalised."""
    hidden = model(input_ids=ids_bt, attention_mask=mask_bt).last_hidden_state.float()
    weights = mask_bt.unsqueeze(-1).float()
    pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
    return torch.nn.functional.normalize(pooled, dim=-1)


def caliber_loss(
    s_x: torch.Tensor,
    s_px: torch.Tensor,
    t_x: torch.Tensor,
    t_px: torch.Tensor,
    pert: torch.Tensor,
    *,
    lam: float,
    margin: float,
    reduction: str,
    perturb_weight: float = 1.0,
) -> torch.Tensor:
    """Eq. 4 on s_x, t_x [B, D] and the P perturbed rows s_px, t_px [P, D] (`pert` [P] rows of x).

    "batch": every term summed over its rows and divided by B (eq. 4 as written); "per_term": mean
    L_a(x) + mean over the P rows of perturb_weight * L_a(pi x) + lam * hinge (the authors' code).
    """
    align_x = (s_x - t_x).norm(dim=-1)
    if not len(pert):
        return align_x.mean()
    cosine = torch.nn.functional.cosine_similarity
    delta_s = 1 - cosine(s_x[pert], s_px, dim=-1)
    delta_t = 1 - cosine(t_x[pert], t_px, dim=-1)
    hinge = torch.relu(delta_t + margin - delta_s)
    pert_terms = perturb_weight * (s_px - t_px).norm(dim=-1) + lam * hinge
    if reduction == "batch":
        return (align_x.sum() + pert_terms.sum()) / s_x.shape[0]
    if reduction == "per_term":
        return align_x.mean() + pert_terms.mean()
    raise ValueError(f"reduction={reduction!r}: expected 'batch' or 'per_term'")


def load_student(model_dir: str, *, num_layers: int | None):
    """transformers' model of `model_dir` (SDPA attention, dropout off), cut to `num_layers`."""
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.AutoConfig.from_pretrained(model_dir, local_files_only=True)
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "attention_dropout"):
        if hasattr(config, name):
            setattr(config, name, 0.0)
    if num_layers:
        config.num_hidden_layers = num_layers  # keeps the first layers' weights, as the library
    kwargs = {"add_pooling_layer": False} if config.model_type == "bert" else {}
    return transformers.AutoModel.from_pretrained(
        model_dir, config=config, attn_implementation="sdpa", local_files_only=True, **kwargs
    )


def compile_model(model, *, mode: str, backend: str = "inductor", shapes: int = 8):
    """`model` under `torch.compile` with fixed shapes (`dynamic=False`), room for `shapes`
    distinct input shapes before dynamo would fall back to eager (its default limit is 8).

    `mode`: torch.compile's mode ("default", "reduce-overhead": CUDA graphs, "max-autotune-no-
    cudagraphs": Inductor's GEMM autotuning, "max-autotune": both). `backend` "inductor"
    generates code; "eager" / "aot_eager" only trace (tests of the wiring on a CPU).
    """
    import torch._dynamo

    limit = max(8, shapes + 2)
    for name in ("recompile_limit", "cache_size_limit"):  # renamed in recent torch
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), limit))
    if backend != "inductor":
        return torch.compile(model, backend=backend, dynamic=False)  # modes are Inductor's
    return torch.compile(model, mode=mode, backend=backend, dynamic=False)


def uses_cudagraphs(mode: str, backend: str) -> bool:
    """Whether `compile_model(mode, backend)` replays CUDA graphs (on a GPU)."""
    return backend == "inductor" and mode in ("reduce-overhead", "max-autotune")


def make_optimizer(model, spec: dict):
    """AdamW (decay on >= 2-D params, as `optim.decay_mask`) and HF's linear warmup/decay.

    The fused implementation (one kernel per step for all parameters, on CUDA and on a CPU): the
    strongest PyTorch has, as the baseline should be."""
    import transformers

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": spec["weight_decay"]},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ],
        lr=spec["lr"],
        betas=(spec["b1"], spec["b2"]),
        eps=spec["eps"],
        fused=True,
    )
    total = spec["total_steps"]
    scheduler = transformers.get_linear_schedule_with_warmup(
        optimizer, int(spec["warmup_frac"] * total), total
    )
    return optimizer, scheduler


def train(spec: dict) -> dict:
    """Runs the epoch `spec` describes (`train_end_to_end.run_torch`); returns a summary."""
    torch.manual_seed(spec["seed"])
    torch.set_num_threads(spec.get("threads") or host.usable_cores())  # as many as JAX has
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"], local_files_only=True)
    records = corpus.load_jsonl(spec["passages"])
    texts = [r["text"] for r in records]
    perturbed = [r.get("perturbed") or "" for r in records]
    dim = spec["dim"]
    t_x_all = teacher.open_reader(spec["teacher_x"], expect_rows=len(texts), expect_dim=dim)
    t_px_all = teacher.open_reader(spec["teacher_px"], expect_rows=len(texts), expect_dim=dim)
    plan = np.load(spec["plan"])
    model = load_student(spec["model_dir"], num_layers=spec["num_layers"])
    model.train()
    optimizer, scheduler = make_optimizer(model, spec)
    workdir = Path(spec["workdir"])
    workdir.mkdir(parents=True, exist_ok=True)

    def tokenize(batch_texts):
        return tokenizer(
            batch_texts,
            padding="longest",
            truncation=True,
            max_length=spec["max_length"],
            return_tensors="pt",
        )

    rows_done, loss_value = 0, float("nan")
    first_loss = None
    for step_num, rows in enumerate(plan, start=1):
        rows = rows[rows >= 0]
        pert_slots = [i for i, r in enumerate(rows) if perturbed[r]]
        x = tokenize([texts[r] for r in rows])
        t_x = torch.from_numpy(t_x_all[rows])
        s_x = embed(model, x["input_ids"], x["attention_mask"])
        s_px = t_px = s_x[:0]
        if pert_slots:
            px = tokenize([perturbed[rows[i]] for i in pert_slots])
            t_px = torch.from_numpy(t_px_all[rows[pert_slots]])
            s_px = embed(model, px["input_ids"], px["attention_mask"])
        loss = caliber_loss(
            s_x, s_px, t_x, t_px, torch.tensor(pert_slots, dtype=torch.long),
            lam=spec["lam"], margin=spec["margin"], reduction=spec["reduction"],
            perturb_weight=spec["perturb_weight"],
        )  # fmt: skip
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip_norm"])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        rows_done += len(rows)
        if step_num % spec["log_every"] == 0 or step_num == len(plan) or first_loss is None:
            loss_value = float(loss.detach())
            if first_loss is None:
                first_loss = loss_value
            if not np.isfinite(loss_value):
                raise FloatingPointError(f"step {step_num}: loss {loss_value}")
        if step_num % spec["checkpoint_every"] == 0 or step_num == len(plan):
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state, workdir / "checkpoint.pt")
    return {
        "step": len(plan),
        "rows": rows_done,
        "first_loss": first_loss,
        "train/loss": loss_value,
        "threads": torch.get_num_threads(),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True, help="JSON written by train_end_to_end.py")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    spec = json.loads(Path(args.spec).read_text())
    summary = train(spec)
    summary["loop_s"] = time.perf_counter() - start
    (Path(spec["workdir"]) / "summary.json").write_text(json.dumps(summary, indent=2))
    print("final: " + ", ".join(f"{k}={v}" for k, v in sorted(summary.items())))


if __name__ == "__main__":
    main()
