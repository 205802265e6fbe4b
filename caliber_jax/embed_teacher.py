"""Teacher vectors for every passage x and perturbation pi(x) (and training query q, when the
passages have them), MRL-truncated to the student's dim.

    python -m caliber_jax.embed_teacher --config configs/caliber.py
    python -m caliber_jax.embed_teacher --config configs/caliber.py \
        --import_x=x.npy --import_px=px.npy --splits=train         # vectors computed elsewhere
    python -m caliber_jax.embed_teacher --config configs/caliber.py \
        --reuse_from=runs/old/data          # data prepared again: encode only the changed texts

Writes `<data.dir>/teacher_<split>/{x,px[,q]}` TensorStore arrays with metadata. Resumable: a
killed job continues with the chunks it had not finished. Multi-host: each process writes its own
rows.
"""

import functools
import sys
from collections.abc import Sequence
from pathlib import Path

import jax
import ml_collections
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from caliber_jax import cli, embedder, hub, paths, sharding
from caliber_jax.data import pipeline, teacher
from caliber_jax.models import embedding


def student_dim(config) -> int:
    spec = embedding.read_spec(
        config.model.init_dir,
        pooling=config.model.pooling,
        num_layers=config.model.num_layers,
        out_dim=config.model.out_dim,
    )
    return spec.out_dim or spec.config.width


def load_teacher(teacher_config):
    """The teacher encoder of `config.teacher`: our Flax Embedder or the PyTorch backend."""
    if teacher_config.backend == "torch":
        from caliber_jax.data import torch_teacher  # torch only when asked for

        return torch_teacher.TorchEncoder(
            hub.resolve_model_dir(teacher_config.model_dir),
            pooling=teacher_config.pooling,
            dtype=teacher_config.dtype,
            device=teacher_config.device,
        )
    if teacher_config.backend != "flax":
        raise ValueError(f"config.teacher.backend={teacher_config.backend!r} not in flax/torch")
    return embedder.Embedder.from_pretrained(
        teacher_config.model_dir,
        pooling=teacher_config.pooling,
        dtype=teacher_config.dtype,
        param_dtype=teacher_config.get("param_dtype", "float32"),
        attention=teacher_config.get("attention", "xla"),
        data_parallel=teacher_config.get("data_parallel", False),
    )


def compute_dtype(teacher_config, model) -> str:
    """The dtype the teacher computed in, a config's "auto" resolved on this machine."""
    if teacher_config.backend == "torch":
        return "bfloat16" if model.autocast else teacher_config.dtype
    return embedder.resolve_dtype_name(teacher_config.dtype)


def teacher_metadata(config, model: embedder.Embedder) -> dict:
    """What a store records about the teacher that wrote it (`teacher.REUSE_FIELDS` and more)."""
    metadata = {
        "teacher": str(config.teacher.model_dir),
        "pooling": model.pooling if config.teacher.backend == "torch" else model.spec.pooling,
        "native_dim": model.dim,
        "max_length": config.teacher.max_length,
        "compute_dtype": compute_dtype(config.teacher, model),
    }
    if config.teacher.backend == "torch":  # flax stores keep their metadata (and so resume)
        metadata["backend"] = "torch"
    return metadata


def split_rows(passages) -> dict[str, list[str]]:
    """The rows of each store of a split: "x" passages, "px" perturbations (empty: none), "q"
    training queries (field "query", `prepare.make_queries`) when the passages have them."""
    texts, perturbed = pipeline.load_passages(passages)
    return {"x": texts, "px": perturbed, "q": pipeline.load_queries(passages) or []}


def reusable_vectors(source_dir: str, dim: int, expect: dict) -> dict[str, np.ndarray]:
    """Text -> teacher vector from every finished store of another prepared data directory
    (`--reuse_from`), checked against this run's teacher (`teacher.known_vectors`)."""
    source = paths.as_path(source_dir)
    known: dict[str, np.ndarray] = {}
    for store_dir in sorted(source.glob("teacher_*")):
        passages = source / f"{store_dir.name.removeprefix('teacher_')}.jsonl"
        if not passages.exists():
            continue
        for name, rows in split_rows(passages).items():
            if (store_dir / name).exists():
                known.update(teacher.known_vectors(store_dir / name, rows, dim=dim, expect=expect))
    if not known:
        raise ValueError(f"{source}: no finished teacher store to reuse (teacher_<split>/x, ...)")
    return known


def passage_teacher(teacher_config):
    """`teacher_config` with `passage_model_dir` as its model (None when it names none): the
    encoder of the passages and their perturbations."""
    other = teacher_config.get("passage_model_dir", "")
    if not other:
        return None
    config = teacher_config.copy_and_resolve_references()
    with config.unlocked():
        config.model_dir = other
    return config


def embed_split(
    config, split: str, model: embedder.Embedder, dim: int, known: dict | None = None,
    passage_model: embedder.Embedder | None = None,
) -> list[Path]:
    """Encodes the split's passages, perturbations and queries into its stores; texts in `known`
    (`reusable_vectors`) are copied instead. `passage_model` (`teacher.passage_model_dir`), when
    given, encodes the passages and perturbations; `model` the queries."""
    passages = paths.as_path(config.data.dir) / f"{split}.jsonl"
    out = paths.as_path(config.data.dir) / f"teacher_{split}"
    metadata = {**teacher_metadata(config, model), "passages": str(passages)}
    # Each store's encoder and metadata: the passage model (when given) for x and pi(x).
    by_store = dict.fromkeys(("x", "px", "q"), (model, metadata))
    if passage_model is not None:
        of_passages = ml_collections.ConfigDict({"teacher": passage_teacher(config.teacher)})
        passage_metadata = {**teacher_metadata(of_passages, passage_model),
                            "passages": str(passages)}  # fmt: skip
        by_store.update(dict.fromkeys(("x", "px"), (passage_model, passage_metadata)))

    # Either backend fills batches by token budget when the config gives one
    # (`padding.batch_plan`); 0 = `batch_size` rows a batch.
    budget = config.teacher.get("tokens_per_batch", 0)
    extra = {"tokens_per_batch": budget} if budget else {}

    written = []
    for name, rows in split_rows(passages).items():
        encoder, store_metadata = by_store[name]
        encode_fn = functools.partial(
            encoder.encode, batch_size=config.teacher.batch_size,
            max_length=config.teacher.max_length, **extra,
        )  # fmt: skip
        if name != "x" and not any(rows):
            continue
        if known:
            reused = sum(1 for text in rows if text and text in known)
            print(f"[caliber_jax] {out / name}: {reused} of {sum(map(bool, rows))} texts reuse "
                  "stored vectors", file=sys.stderr)  # fmt: skip
        teacher.embed_to_store(
            encode_fn,
            rows,
            out / name,
            batch_rows=config.teacher.chunk_rows,
            dim=dim,
            chunk_rows=config.teacher.chunk_rows,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
            metadata=store_metadata,
            known=known,
        )
        written.append(out / name)
    return written


def import_split(
    config, split: str, dim: int, vectors_x: str, vectors_px: str | None, *, teacher_name: str
) -> list[Path]:
    """Stores vectors computed elsewhere (black-box or API teachers) for the split."""
    passages = paths.as_path(config.data.dir) / f"{split}.jsonl"
    texts, perturbed = pipeline.load_passages(passages)
    out = paths.as_path(config.data.dir) / f"teacher_{split}"
    metadata = {"teacher": teacher_name, "pooling": "external", "passages": str(passages)}
    files = (("x", texts, vectors_x), ("px", perturbed, vectors_px))
    # Every file is checked before any store is made, so a wrong one leaves nothing behind that
    # the corrected run would then refuse.
    for _, rows, npy in files:
        if npy is not None:
            teacher.load_npy_checked(npy, num_rows=len(rows), dim=dim)
    if vectors_px is None and any(perturbed):
        raise ValueError(f"{passages}: has perturbations; pass --import_px too")
    written = []
    for name, rows, npy in files:
        if npy is None:
            continue
        teacher.import_npy(
            out / name,
            vectors_npy=npy,
            texts=rows,
            dim=dim,
            chunk_rows=config.teacher.chunk_rows,
            metadata=metadata,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )
        if jax.process_count() > 1:
            first, last = teacher.process_rows(
                len(rows), config.teacher.chunk_rows, jax.process_index(), jax.process_count()
            )
            print(f"[caliber_jax] process {jax.process_index()}/{jax.process_count()}: rows "
                  f"[{first}, {last}) of {out / name}", file=sys.stderr)  # fmt: skip
        written.append(out / name)
    return written


def main(argv: Sequence[str]) -> None:
    del argv
    values = flags.FLAGS
    config = values.config
    sharding.initialize_distributed(config.multihost)
    dim = student_dim(config)
    if values.import_x:
        if len(values.splits) != 1:
            raise app.UsageError("--import_x needs exactly one --splits entry")
        stores = import_split(
            config, values.splits[0], dim, values.import_x, values.import_px,
            teacher_name=values.teacher_name,
        )  # fmt: skip
    else:
        model = load_teacher(config.teacher)
        passage_config = passage_teacher(config.teacher)
        if passage_config is not None and values.reuse_from:
            raise app.UsageError("--reuse_from with config.teacher.passage_model_dir: the stores "
                                 "come from two models; encode them afresh")  # fmt: skip
        passage_model = load_teacher(passage_config) if passage_config is not None else None
        for name, encoder in (("teacher", model), ("passage model", passage_model)):
            if encoder is not None and encoder.dim < dim:
                raise ValueError(f"{name} dim {encoder.dim} < student dim {dim}: cannot "
                                 "MRL-truncate")  # fmt: skip
        known = None
        if values.reuse_from:
            known = reusable_vectors(values.reuse_from, dim, teacher_metadata(config, model))
        stores = []
        for split in present_splits(config.data.dir, values.splits):
            stores += embed_split(config, split, model, dim, known, passage_model=passage_model)
    for path in stores:
        print(path)


def present_splits(data_dir: str, splits: list[str]) -> list[str]:
    """The `splits` whose `<data_dir>/<split>.jsonl` exists; ValueError naming the folder when
    none does (a mistyped data folder or split wrote nothing and exited 0) or when a split other
    than "val" (absent when nothing was held out) is missing."""
    folder = paths.as_path(data_dir)
    present = [split for split in splits if (folder / f"{split}.jsonl").exists()]
    missing = [f"{split}.jsonl" for split in splits if split not in present]
    if not present or any(name != "val.jsonl" for name in missing):
        raise ValueError(f"{folder}: no {', '.join(missing)} (the folder `prepare` wrote, "
                         f"--config.data.dir, and --splits name them)")  # fmt: skip
    return present


if __name__ == "__main__":
    # Flags are defined only when run as a script, so tests can import this module.
    config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
    flags.DEFINE_list("splits", ["train", "val"], "Prepared splits to embed (if present).")
    flags.DEFINE_string("import_x", None, ".npy [N, D] teacher vectors of the passages.")
    flags.DEFINE_string("import_px", None, ".npy [N, D] vectors of the perturbations.")
    flags.DEFINE_string("teacher_name", "external", "Name recorded for imported vectors.")
    flags.DEFINE_string(
        "reuse_from", None, "Another prepared data dir: copy its teacher vectors of equal texts."
    )
    flags.mark_flag_as_required("config")
    cli.run(main)
