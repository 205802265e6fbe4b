"""A training run's data, from its config: the splits' sources, what decides each step's batch,
and the token lengths (`length_cache`) over the run's processes.

`train` builds its loaders from these; `prepare` keeps the token lengths its first launch needs.
"""

import math
from typing import TYPE_CHECKING

import jax
import ml_collections
import numpy as np
from etils import epath
from jax.experimental import multihost_utils

from caliber_jax import paths, tokenization
from caliber_jax.data import length_cache, pipeline

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class TokenizeFn:
    """Picklable `tokenize_fn` for the pipeline: one tokenizer (the one given, or loaded from
    `tokenizer_dir`, as again in each process it is unpickled in) shared by the loader's threads.

    A fast tokenizer keeps its truncation length as state (`enable_truncation`), so two threads
    tokenizing at different lengths (the loader's passages at `max_length`, another batch's
    queries at `query_length`) could truncate each other's texts: `tokenization.tokenize` makes
    the calls one at a time. One tokenizer, not one per thread: Qwen3's (151K tokens) takes ~1.2 s
    of CPU to load, and four loader threads each loading their own held the first batch of
    configs/caliber.py back by ~5 s on 2 cores (docs/benchmarks_history.md, 2026-11-28)."""

    def __init__(self, tokenizer_dir: str, tokenizer: "PreTrainedTokenizerBase | None" = None):
        self.tokenizer_dir = tokenizer_dir
        if tokenizer is None:
            tokenizer = tokenization.load_tokenizer(tokenizer_dir)
        self.tokenizer = tokenizer

    def __call__(self, texts: list[str], max_length: int) -> list[list[int]]:
        return tokenization.tokenize(self.tokenizer, texts, max_length=max_length)

    def __getstate__(self):
        return {"tokenizer_dir": self.tokenizer_dir}

    def __setstate__(self, state):
        self.__init__(state["tokenizer_dir"])


def exists_for_all(path: epath.Path) -> bool:
    """Whether `path` exists as process 0 sees it, the same answer in every process.

    What exists decides which programs and collectives a process runs (a validation split, the
    perturbed rows' store): a process that found otherwise on its own (per-host data copies, a
    second job writing mid-launch) would wait in a collective the others never enter. A process
    missing what process 0 has then fails on opening it, with the path named."""
    found = path.exists()
    if jax.process_count() == 1:
        return found
    return bool(multihost_utils.broadcast_one_to_all(np.asarray(found)))


def passages_path(data_dir: str, split: str) -> epath.Path:
    """A split's passages file, as `prepare` writes it (no collective: any process may ask)."""
    return paths.as_path(data_dir) / f"{split}.jsonl"


def data_paths(data_dir: str, split: str) -> tuple[epath.Path, epath.Path, epath.Path | None]:
    """Passages file and teacher stores of a split, as `prepare` and `embed_teacher` write them;
    the perturbed rows' store None where process 0 has none (`exists_for_all`: a collective, so
    every process calls this together)."""
    passages = passages_path(data_dir, split)
    teacher_dir = paths.as_path(data_dir) / f"teacher_{split}"
    px = teacher_dir / "px"
    return passages, teacher_dir / "x", px if exists_for_all(px) else None


def make_source(
    config: ml_collections.ConfigDict,
    split: str,
    dim: int,
    neighbour_source: pipeline.TrainSource | None = None,
) -> pipeline.TrainSource:
    """A split's rows; `neighbour_source` (the training split) resolves a validation split's
    "train_neighbour" rows (`prepare.mine_heldout_neighbours`)."""
    passages, teacher_x, teacher_px = data_paths(config.data.dir, split)
    # The training queries' store (`embed_teacher`), read only when the query term is on.
    loss = config.loss
    uses_queries = any(loss.get(term, 0.0) for term in ("query_weight", "contrastive_weight",
                                                         "query_align_weight"))  # fmt: skip
    teacher_q = teacher_x.parent / "q" if uses_queries else None
    for path in (passages, teacher_x, *([teacher_q] if teacher_q else [])):
        if not path.exists():
            raise FileNotFoundError(
                f"{path}: missing; run `python -m caliber_jax.prepare` and "
                "`python -m caliber_jax.embed_teacher` with this config first"
            )
    return pipeline.TrainSource(
        passages,
        teacher_x_path=teacher_x,
        teacher_px_path=teacher_px,
        dim=dim,
        neighbour_source=neighbour_source,
        teacher_q_path=teacher_q,
    )


def batch_options(config, tokenize_fn, *, pad_id, train: bool, process_rows, lengths) -> dict:
    """What decides each step's batch (`pipeline.make_batch_fn`'s arguments after the source)."""
    return dict(
        batch_size=config.batch_size,
        seed=config.seed,
        shuffle=train,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        tokenize_fn=tokenize_fn,
        max_length=config.data.max_length,
        pad_id=pad_id,
        pad_to_multiple=config.data.pad_to_multiple,
        length_group_window=config.data.length_group_window if train else 1,
        drop_remainder=train and config.data.drop_remainder,
        pack_length=config.data.pack_length,
        # Packed rows split evenly over this process's devices.
        pack_rows_multiple=math.lcm(config.data.pack_rows_multiple, jax.local_device_count()),
        pack_rungs=config.data.pack_rungs,
        pack_first_steps=config.data.pack_first_steps if train else 0,
        process_rows=process_rows,
        lengths=lengths,
        query_length=config.data.query_length,
    )


def corpus_lengths(source, tokenize_fn, *, max_length: int, cache=None):
    """`length_cache.corpus_lengths` over this run's processes."""
    processes = length_cache.Processes(
        index=jax.process_index(),
        count=jax.process_count(),
        gather=multihost_utils.process_allgather,
        first=multihost_utils.broadcast_one_to_all,
    )
    return length_cache.corpus_lengths(
        source, tokenize_fn, max_length=max_length, cache=cache, processes=processes
    )


def lengths_cache(config: ml_collections.ConfigDict, split: str, tokenizer_dir: str):
    """Where a split's token lengths are kept (`length_cache`): tokenized once per corpus,
    tokenizer and max_length, not at every launch."""
    return length_cache.cache_path(
        config.data.dir,
        split,
        passages=passages_path(config.data.dir, split),
        tokenizer_dir=tokenizer_dir,
        max_length=config.data.max_length,
    )


def student_tokenizer_dir(config: ml_collections.ConfigDict) -> str:
    """The student's tokenizer directory: `model.tokenizer_dir`, else the init dir."""
    return config.model.tokenizer_dir or config.model.init_dir


def keep_token_lengths(config: ml_collections.ConfigDict) -> list[str] | None:
    """Tokenizes each prepared split with the student's tokenizer and keeps the lengths where
    `train` reads them (`lengths_cache`), so that its first launch tokenizes nothing (`prepare`
    calls this). Returns the splits whose lengths are now kept, not a split whose file could not
    be written (a warning says why); None when the tokenizer directory is not there yet. `train`
    tokenizes what is not kept at its first launch, as before."""
    tokenizer_dir = student_tokenizer_dir(config)
    if not tokenizer_dir or not paths.as_path(tokenizer_dir).is_dir():
        return None
    tokenize_fn = TokenizeFn(tokenizer_dir)
    kept = []
    for split in ("train", "val"):
        passages = passages_path(config.data.dir, split)
        if passages.exists():
            cache = lengths_cache(config, split, tokenizer_dir)
            corpus_lengths(pipeline.PassageTexts(passages), tokenize_fn,
                           max_length=config.data.max_length, cache=cache)  # fmt: skip
            if cache.is_file():
                kept.append(split)
    return kept
