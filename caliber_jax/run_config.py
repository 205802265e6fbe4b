"""A training run's config checks: what `train` refuses before any work (a config it would stop
on later, an input the objective cannot use), and what a run resumed in its workdir may change.
"""

import json
from typing import Any

import ml_collections
from etils import epath

from caliber_jax import checkpoint, losses, w_out_init

# Fields a resumed run may change: how it runs, logs and saves, not what it computes (train never
# reads prepare's or the teacher's settings: the teacher's vectors are in the store). Not
# data.worker_count: the loader's saved position (Grain's iterator state) has one layout without
# workers and another, per worker, with them; restored under another count it fails or replays.
RESUME_MAY_CHANGE = (
    "prepare", "teacher", "mesh", "multihost", "compile_ahead", "watchdog_factor",
    "watchdog_min_s", "log_every", "eval_every", "eval_at_start", "checkpoint_every",
    "keep_checkpoints", "keep_period", "tensorboard", "data.read_threads",
    "data.validate", "model.remat", "model.attention",
)  # fmt: skip
# Top-level fields every training config.json has (what tells it from a model's config.json).
_TRAIN_CONFIG_KEYS = frozenset({"model", "optim", "loss", "data"})


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def resume_conflicts(saved: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, the run's value, the new value) for each field both JSON configs hold that differ
    and that `RESUME_MAY_CHANGE` does not cover; fields only one of them holds (a version that
    added or dropped a field) are not compared."""
    old_flat, new_flat = _flatten(saved), _flatten(new)
    return [
        (field, old_flat[field], value)
        for field, value in new_flat.items()
        if field in old_flat and old_flat[field] != value
        and not any(field == f or field.startswith(f + ".") for f in RESUME_MAY_CHANGE)
    ]  # fmt: skip


def check_workdir_config(config: ml_collections.ConfigDict, workdir: epath.Path) -> None:
    """Before anything is written to `workdir`: its config.json, if any, must be a training run's,
    and a run with checkpoints resumes only with its own settings (up to `RESUME_MAY_CHANGE`):
    another learning rate, length or step count would continue the run silently under a
    config.json that then misdescribes it (and export reads the model's shape from it)."""
    path = workdir / "config.json"
    if not path.exists():
        return
    try:
        saved = json.loads(path.read_text())
    except ValueError as error:
        raise ValueError(f"{path}: not JSON ({error}); move the folder aside or choose another "
                         f"--workdir") from None  # fmt: skip
    if not isinstance(saved, dict) or not _TRAIN_CONFIG_KEYS <= saved.keys():
        raise ValueError(f"{path} is not a training run's config (a model folder?): --workdir "
                         f"must be a run's own folder; choose another")  # fmt: skip
    steps = checkpoint.saved_steps(workdir / "checkpoints")
    if not steps:
        return  # nothing trained yet: the new settings stand
    conflicts = resume_conflicts(saved, json.loads(config.to_json_best_effort()))
    if conflicts:
        shown = "; ".join(
            f"{field}={new!r} (the run's {old!r})" for field, old, new in conflicts[:3]
        )
        more = f" and {len(conflicts) - 3} more" if len(conflicts) > 3 else ""
        raise ValueError(f"{workdir} holds a run trained to step {steps[-1]} with other settings: "
                         f"{shown}{more}. Resume it with its own ({path}), or train in a new "
                         f"--workdir")  # fmt: skip


def check_config(config: ml_collections.ConfigDict, *, backend: str, devices: int) -> None:
    """Raises one ValueError naming the field for a config the run would otherwise stop on
    later (a division by zero at the first log, a loss setting found only when the step is
    traced, after the weights and inputs are loaded, cuDNN attention without a GPU, a batch the
    devices do not divide), on a machine of `backend` ("cpu", "gpu", "tpu") with `devices`
    devices in all processes."""
    fields = ("log_every", "checkpoint_every", "eval_every", "optim.accum_steps",
              "keep_checkpoints", "batch_size")  # fmt: skip
    for field in fields:
        value = config
        for part in field.split("."):
            value = value[part]
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"config.{field}={value!r}: expected an integer >= 1")
    if not isinstance(config.total_steps, int) or config.total_steps < 0:
        raise ValueError(f"config.total_steps={config.total_steps!r}: expected an integer >= 1, "
                         f"or 0 for config.num_epochs over the training passages")  # fmt: skip
    if not config.total_steps and not config.num_epochs > 0:
        raise ValueError(f"config.num_epochs={config.num_epochs!r}: expected > 0 (or set "
                         f"config.total_steps)")  # fmt: skip
    loss = config.loss
    choices = {"objective": losses.OBJECTIVES, "reduction": losses.REDUCTIONS}
    for field, allowed in choices.items():
        if loss.get(field, allowed[0]) not in allowed:
            raise ValueError(f"config.loss.{field}={loss[field]!r}: expected one of {allowed}")
    if loss.get("contrastive_weight", 0.0) and not loss.get("contrastive_temperature", 0.05) > 0:
        raise ValueError(f"config.loss.contrastive_temperature="
                         f"{loss.contrastive_temperature!r}: expected > 0")  # fmt: skip
    if config.model.w_out_init not in w_out_init.METHODS:
        raise ValueError(f"config.model.w_out_init={config.model.w_out_init!r}, expected one of "
                         f"{w_out_init.METHODS}")  # fmt: skip
    # What the machine decides: its backend and device count (the mesh `train` builds).
    if config.model.attention == "cudnn" and backend != "gpu":
        raise ValueError(
            f"config.model.attention='cudnn' needs a GPU (cuDNN's fused attention); this run's "
            f"backend is {backend!r}: use 'xla'"
        )
    if config.mesh.fsdp < 1 or devices % config.mesh.fsdp:
        raise ValueError(f"config.mesh.fsdp={config.mesh.fsdp}: fsdp={config.mesh.fsdp} must "
                         f"divide the device count {devices}")  # fmt: skip
    if config.batch_size % devices:
        raise ValueError(f"config.batch_size={config.batch_size}: not divisible by {devices} "
                         f"devices (each device takes an equal share of every batch)")  # fmt: skip


def check_source(config: ml_collections.ConfigDict, source: Any) -> None:
    """The "neighbour" objective needs each training passage's neighbour (`source`, a
    `pipeline.TrainSource`, holds them or not): without them its hinge covers no row and the run
    would train the alignment alone, logging num = 0."""
    if config.loss.get("objective", "caliber") == "neighbour" and source.neighbours is None:
        raise ValueError(
            f"config.loss.objective='neighbour' needs a neighbour per training passage: "
            f"{source.passages_path} has no 'neighbour' field (prepare it with "
            f"config.prepare.neighbour_k > 0)"
        )
