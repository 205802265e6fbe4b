"""Export a trained student: Orbax checkpoint -> Hugging Face / sentence-transformers directory.

    python -m caliber_jax.export --workdir runs/caliber [--step N] --output runs/caliber/hf
    python -m caliber_jax.export --workdir runs/numeric --interpolate 0.5 --output runs/numeric/hf

Restores only the params (single-device targets, whatever topology wrote them), applies the weight
table in reverse, writes `model.safetensors`, `config.json`, the tokenizer files and the
sentence-transformers modules (pooling, Dense W_out when present, Normalize), so `AutoModel` and
`SentenceTransformer` load the student. `--workdir` and `--output` may be URLs (gs://...).
The export is written beside `--output` and moved there when complete, replacing a previous export
whole: the directory holds one export, and one cut short never looks finished (`DONE_FILE`). Only
an export (a folder holding `DONE_FILE`) is ever replaced, and `--output` may not be, hold or sit
inside the folders the export reads (`model.init_dir`, `--blend_with`).

`--interpolate alpha` writes (1 - alpha) * initial + alpha * trained weights instead (weight-space
ensembling, "WiSE-FT", Wortsman et al. 2022): the initial student is what `train.py` starts from
(`config.model.init_dir`, W_out from `config.seed` or its least-squares fit), so with a student
calibrating itself alpha trades the trained numeric separation against the teacher's retrieval
without retraining. `--blend_with <workdir>` puts another run's trained weights in place of the
initial student: (1 - alpha) * other + alpha * this ("model soup", Wortsman et al. 2022), for two
runs from the same start, e.g. a distilled student and one trained with the numeric objective:

    python -m caliber_jax.export --workdir runs/numeric --blend_with runs/leaf \
        --interpolate 0.5 --output runs/soup/hf

`--dtype float16` (or bfloat16) ships the weights in half the bytes: every tensor of
`model.safetensors` and of the Dense W_out is rounded once, after any blend was computed in float32,
and `config.json`'s `torch_dtype` says so. Both `Embedder.from_pretrained` and `SentenceTransformer`
read such a directory; the default, float32, writes the params exactly as trained.
"""

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Sequence

import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import flags
from etils import epath

from caliber_jax import checkpoint, cli, paths, tokenization, w_out_init
from caliber_jax.models import embedding, hf

# Written last, after the weights, config.json, the tokenizer and the sentence-transformers files:
# a directory without it is an export cut short. Every export writes it, and only a directory that
# holds it is replaced (a model folder that merely has `model.safetensors` is not an export).
DONE_FILE = "caliber_export.json"
# Written first into a remote output (a store without rename) and removed once `DONE_FILE` is
# there: what an export cut short in such a store leaves is still an export, which a rerun replaces.
PARTIAL_FILE = ".caliber_export.partial"
# The weight dtypes an export can write (`torch_dtype` names).
WEIGHT_DTYPES = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}


def export(workdir: str | os.PathLike, output: str | os.PathLike, *, step: int | None = None,
           query_prompt: str | None = None, interpolate: float | None = None,
           blend_with: str | os.PathLike | None = None,
           dtype: str = "float32") -> epath.Path:  # fmt: skip
    """Writes the student of `workdir` (its resolved config.json + checkpoint) to `output`.

    `interpolate` in [0, 1] blends the checkpoint with the initial student, or with the latest
    checkpoint of the run in `blend_with` (same student architecture), (module docstring).
    `dtype` ("float32", "float16" or "bfloat16") is the dtype of the written weights.
    A previous export in `output` is replaced whole, once the new one is complete; a directory
    that holds something else (`_check_replaceable`), or one that is, holds or sits inside a
    folder the export reads (`_check_apart`), is an error.
    """
    if dtype not in WEIGHT_DTYPES:
        raise ValueError(f"export: dtype={dtype!r}, expected one of {', '.join(WEIGHT_DTYPES)}")
    workdir, output = paths.as_path(workdir), paths.as_path(output)
    model = _read_config(workdir).model
    _check_apart(
        output,
        inside_allowed={"workdir": workdir},
        apart={
            "model.init_dir": model.init_dir,
            "model.tokenizer_dir": model.get("tokenizer_dir") or None,
            "blend_with": blend_with,
        },
    )
    _check_replaceable(output)
    if step is not None:
        _check_saved_step(workdir / "checkpoints", step)
    options = dict(step=step, query_prompt=query_prompt, interpolate=interpolate,
                   blend_with=blend_with, dtype=dtype)  # fmt: skip
    if paths.is_remote(output):  # write locally, then copy the finished directory over
        with tempfile.TemporaryDirectory() as local:
            _write_export(workdir, epath.Path(local), **options)
            _replace_remote(epath.Path(local), output)
        return output
    # A sibling folder (same filesystem), renamed into place when complete.
    staging = output.parent / f".{output.name}.export-{uuid.uuid4().hex[:12]}"
    try:
        staging.mkdir(parents=True)  # an unwritable output fails now, not after the restore
        _write_export(workdir, staging, **options)
        _move_into_place(staging, output)
    except OSError as error:
        renamed = _name_output(error, staging, output)
        if renamed is None:
            raise
        raise renamed from error
    finally:
        if staging.exists():  # an export cut short by an error
            shutil.rmtree(staging)
    return output


def _write_export(workdir: epath.Path, output: epath.Path, *, step: int | None,
                  query_prompt: str | None, interpolate: float | None,
                  blend_with: str | os.PathLike | None, dtype: str) -> None:  # fmt: skip
    """`export` into a new local directory `output`, `DONE_FILE` last."""
    config = _read_config(workdir)
    model = config.model
    spec = embedding.read_spec(
        model.init_dir, pooling=model.pooling, num_layers=model.num_layers, out_dim=model.out_dim
    )
    params, step = checkpoint.restore_params(workdir / "checkpoints", step=step)
    flat = embedding.params_to_flat(params)
    other_step = None
    if blend_with is not None and interpolate is None:
        raise ValueError("export: blend_with needs interpolate (the share of this run's weights)")
    if interpolate is not None and blend_with is not None:
        other_dir = paths.as_path(blend_with)
        other = _read_config(other_dir).model
        for field in ("init_dir", "num_layers", "out_dim", "pooling"):
            if other.get(field) != model.get(field):
                raise ValueError(
                    f"export: blend_with {other_dir}: model.{field} is {other.get(field)!r}, "
                    f"this run's {model.get(field)!r} (a soup needs the same student)"
                )
        # Its latest checkpoint, whose step the record keeps (the run may train on).
        other_params, other_step = checkpoint.restore_params(other_dir / "checkpoints")
        flat = interpolate_params(embedding.params_to_flat(other_params), flat, interpolate)
    elif interpolate is not None:
        initial = embedding.load_flat_params(model.init_dir, spec, seed=config.seed)
        fitted = workdir / w_out_init.FILE  # a least-squares start (model.w_out_init="lstsq")
        if fitted.exists():
            initial.update(w_out_init.load(fitted))
        flat = interpolate_params(initial, flat, interpolate)
    tokenizer = tokenization.load_tokenizer(model.tokenizer_dir or model.init_dir)
    # Tensors the encoder never uses (BERT's pooler) go out as they came in, so AutoModel
    # loads the full original architecture without re-initialising anything.
    source = hf.read_safetensors(model.init_dir)
    prefix = hf.FAMILIES[spec.family][3]  # "bert.", "mpnet.": a task model's base-model prefix
    passthrough = {
        k.removeprefix(prefix): v
        for k, v in source.items()
        if k.removeprefix(prefix).startswith("pooler.")
    }
    embedding.save_pretrained(
        output,
        spec,
        flat,
        tokenizer=tokenizer,
        max_seq_length=config.data.max_length,
        # The instruction as `evaluate --query_prompt` takes it; sentence-transformers prepends
        # the prompt to the query, so it records Qwen3's "Instruct: ...\nQuery:" prefix.
        query_prompt=tokenization.format_query("", query_prompt) if query_prompt else None,
        passthrough=passthrough,
    )
    if dtype != "float32":  # the params (and any blend) stay float32 until here: one rounding
        _cast_weights(output, dtype)
    record = {"workdir": str(workdir), "step": int(step), "dtype": dtype}
    if interpolate is not None:
        record["interpolate"] = float(interpolate)
    if blend_with is not None:
        record["blend_with"] = str(blend_with)
        record["blend_step"] = int(other_step)
    hf.save_json(record, output / DONE_FILE)


def _check_saved_step(directory: epath.Path, step: int) -> None:
    """Raises FileNotFoundError, in one line listing the saved steps, unless `directory` holds a
    finished checkpoint at `step` (Orbax's own error names a missing `_METADATA` file instead)."""
    saved = checkpoint.saved_steps(directory)
    if step not in saved:
        listed = ", ".join(str(saved_step) for saved_step in saved) or "none"
        raise FileNotFoundError(
            f"export: no checkpoint at step {step} in {directory}; saved steps: {listed}"
        )


def _name_output(error: OSError, staging: epath.Path, output: epath.Path) -> OSError | None:
    """`error`, raised while writing the export into `staging`, as an error of the same type that
    names the path under `output` (the user's path; the staging folder is gone by then), or None
    when `error` names no path in `staging`."""
    filename, prefix = str(error.filename or ""), os.fspath(staging)
    if filename != prefix and not filename.startswith(prefix + os.sep):
        return None
    target = os.fspath(output) + filename[len(prefix) :]
    return type(error)(f"export: cannot write {target}: {error.strerror or error}")


def _check_replaceable(output: epath.Path) -> None:
    """Raises ValueError unless `output` is absent, an empty directory or an export (it holds
    `DONE_FILE`, or `PARTIAL_FILE` where a remote export was cut short): an export replaces it
    whole, so a mistyped `--output` (a training workdir, a downloaded model folder, a folder of
    runs) must not be deleted."""
    if not output.exists():
        return
    if not output.is_dir():
        raise ValueError(f"export: output {output} is a file, not a directory")
    if any(output.iterdir()) and not any(
        (output / name).exists() for name in (DONE_FILE, PARTIAL_FILE)
    ):
        raise ValueError(
            f"export: output {output} is not empty and holds no export (no {DONE_FILE}, which "
            "every export writes); an export replaces its output whole, so choose another directory"
        )


def _check_apart(
    output: epath.Path,
    *,
    inside_allowed: dict[str, epath.Path],
    apart: dict[str, str | os.PathLike | None],
) -> None:
    """Raises ValueError when `output` is or holds a folder the export reads, or sits inside one
    of `apart` (named by their flag or config field; None: not used): replacing `output` whole
    would delete what it reads, e.g. the start an `--interpolate` blend comes from. An output
    inside the run's own workdir (`inside_allowed`) is the usual place for it."""
    target = _comparable(output)
    folders = [(name, path, False) for name, path in apart.items() if path]
    folders += [(name, path, True) for name, path in inside_allowed.items()]
    for name, path, inside_ok in folders:
        source = _comparable(path)
        if target == source:
            relation = "is"
        elif target.startswith(source + "/") and not inside_ok:
            relation = "is inside"
        elif source.startswith(target + "/"):
            relation = "holds"
        else:
            continue
        raise ValueError(
            f"export: output {output} {relation} {name} {path}, which the export reads; an export "
            "replaces its output whole, so choose a directory apart from it"
        )


def _comparable(path: str | os.PathLike) -> str:
    """`path` as `paths.as_path` gives it (local ones absolute, links resolved), to compare."""
    return os.fspath(paths.as_path(path)).rstrip("/")


def _replace_remote(source: epath.Path, output: epath.Path) -> None:
    """Puts the finished local export `source` in place of `output` on a store without rename:
    `PARTIAL_FILE` first (what a cut leaves stays replaceable), then the old export's files go
    (its `DONE_FILE` first), the new ones come (`DONE_FILE` last), and `PARTIAL_FILE` goes."""
    output.mkdir(parents=True, exist_ok=True)
    (output / PARTIAL_FILE).write_text("")
    for child in sorted(output.iterdir(), key=lambda child: child.name != DONE_FILE):
        if child.name == PARTIAL_FILE:
            continue
        if child.is_dir():
            child.rmtree()
        else:
            child.unlink()
    _copy_tree(source, output)
    (output / PARTIAL_FILE).unlink()


def _move_into_place(staging: epath.Path, output: epath.Path) -> None:
    """Renames the complete export `staging` to `output` (same folder), replacing the export there.

    At any moment `output` is the old export, absent (between the two renames), or the new one.
    """
    retired = staging.with_name(staging.name + "-replaced")
    if output.exists():
        os.replace(output, retired)
    os.replace(staging, output)
    if retired.exists():
        shutil.rmtree(retired)


def _cast_weights(output: epath.Path, dtype: str) -> None:
    """Rewrites the written float32 weights (encoder, Dense W_out) in `dtype`, and config.json's
    `torch_dtype`; raises ValueError naming a tensor that does not fit (float16 tops at 65504)."""
    target = WEIGHT_DTYPES[dtype]
    for folder in (output, output / embedding.DENSE_DIR):
        if not (folder / "model.safetensors").is_file():
            continue  # no W_out
        cast = {}
        for name, value in hf.read_safetensors(folder).items():
            cast[name] = value.astype(target) if np.issubdtype(value.dtype, np.floating) else value
            if not np.all(np.isfinite(cast[name].astype(np.float32))):
                raise ValueError(
                    f"export: tensor {name!r} overflows {dtype} (largest magnitude "
                    f"{np.max(np.abs(value)):.4g}); export it in float32 or bfloat16"
                )
        hf.save_safetensors(cast, folder / "model.safetensors")
    config = json.loads((output / "config.json").read_text())
    hf.save_json({**config, "torch_dtype": dtype}, output / "config.json")


def _read_config(workdir: epath.Path) -> ml_collections.ConfigDict:
    config_path = workdir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path}: not a training workdir (no resolved config)")
    return ml_collections.ConfigDict(json.loads(config_path.read_text()))


def interpolate_params(
    initial: dict[str, np.ndarray], trained: dict[str, np.ndarray], alpha: float
) -> dict[str, np.ndarray]:
    """(1 - alpha) * initial + alpha * trained, tensor by tensor (same names and shapes)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"interpolate: alpha must be in [0, 1], got {alpha}")
    if set(initial) != set(trained):
        raise ValueError(
            f"interpolate: parameter names differ: {sorted(set(initial) ^ set(trained))[:5]}"
        )
    blended = {}
    for name, value in trained.items():
        if initial[name].shape != value.shape:
            raise ValueError(
                f"interpolate: parameter {name!r}: shape {value.shape} trained, "
                f"{initial[name].shape} initial"
            )
        mixed = (1.0 - alpha) * initial[name].astype(np.float64) + alpha * value.astype(np.float64)
        blended[name] = mixed.astype(value.dtype)
    return blended


def _copy_tree(source: epath.Path, target: epath.Path) -> None:
    """Copies the files of `source` into `target`, `DONE_FILE` last: a remote store has no rename,
    so the marker appears only once every other file of the export is there."""
    target.mkdir(parents=True, exist_ok=True)
    for child in sorted(source.iterdir(), key=lambda child: child.name == DONE_FILE):
        if child.is_dir():
            _copy_tree(child, target / child.name)
        else:
            child.copy(target / child.name, overwrite=True)


def main(argv: Sequence[str]) -> None:
    del argv
    values = flags.FLAGS
    print(
        export(
            values.workdir,
            values.output,
            step=values.step,
            query_prompt=values.query_prompt,
            interpolate=values.interpolate,
            blend_with=values.blend_with,
            dtype=values.dtype,
        )
    )


if __name__ == "__main__":
    # Flags are defined only when run as a script, so tests can import `export`.
    flags.DEFINE_string("workdir", None, "Training run directory (has config.json).", required=True)
    flags.DEFINE_string("output", None, "Directory to write the HF model to.", required=True)
    flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
    flags.DEFINE_string("query_prompt", None, "Instruction for retrieval queries, as evaluate's "
                        "--query_prompt: recorded as the sentence-transformers 'query' prompt "
                        "'Instruct: {instruction}\\nQuery:'.")  # fmt: skip
    flags.DEFINE_float(
        "interpolate", None, "Blend alpha * trained + (1 - alpha) * initial weights (WiSE-FT)."
    )
    flags.DEFINE_string(
        "blend_with", None, "With --interpolate: another run's workdir whose trained weights take "
        "the initial student's place (a model soup of two runs from the same start).",
    )  # fmt: skip
    flags.DEFINE_string(
        "dtype", "float32", f"Dtype of the written weights: {', '.join(WEIGHT_DTYPES)}."
    )
    cli.run(main)
