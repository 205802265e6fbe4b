"""MTEB 2.x adapter: run an `Embedder` through `mteb.evaluate`, plus an in-memory retrieval task.

    encoder = EmbedderEncoder(Embedder.from_pretrained(DIR), use_task_prompt=True)
    scores = evaluate(encoder, mteb.get_tasks(tasks=["FinanceBenchRetrieval"]))

`EmbedderEncoder` implements mteb's `EncoderProtocol` (via `AbsEncoder`). Queries get Qwen3's
instruction (`Instruct: {task}\\nQuery:{query}`, as mteb's Qwen3-Embedding wrapper builds it)
when configured; documents never do. `make_retrieval_task` wraps {qid: text}, {doc id: text},
{qid: {doc id: grade}} dicts as an `AbsTaskRetrieval`, so local data runs with no hub access.
Needs the `mteb` package (a test dependency). No jax.
"""

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import mteb
import numpy as np
from datasets import Dataset
from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
from mteb.abstasks.task_metadata import TaskMetadata
from mteb.models.abs_encoder import AbsEncoder
from mteb.models.model_meta import ModelMeta, ScoringFunction
from mteb.types import PromptType


class TextEncoder(Protocol):
    """What the adapter needs of an `Embedder`."""

    dim: int

    def encode(
        self, texts: list[str], batch_size: int, max_length: int | None, *, query_task: str | None
    ) -> np.ndarray: ...


class EmbedderEncoder(AbsEncoder):
    """mteb encoder around an `Embedder` (or anything with its `encode` and `dim`)."""

    def __init__(
        self,
        embedder: TextEncoder,
        *,
        name: str = "caliber_jax/student",
        max_length: int | None = None,
        query_task: str | None = None,
        use_task_prompt: bool = False,
    ):
        """Wraps `embedder`.

        Args:
          embedder: encodes texts to unit vectors; `encode(texts, batch_size, max_length,
            query_task=...)`.
          name: model name for mteb, "organization/model".
          max_length: token limit per text (None: the embedder's).
          query_task: a fixed instruction for every query.
          use_task_prompt: take the query instruction from each task's metadata (e.g.
            FinanceBenchRetrieval's `prompt["query"]`), as mteb's Qwen3-Embedding wrapper does.
        """
        if query_task and use_task_prompt:
            raise ValueError("give either query_task or use_task_prompt, not both")
        self.model = embedder
        self.max_length = max_length
        self.query_task = query_task
        self.use_task_prompt = use_task_prompt
        self.mteb_model_meta = ModelMeta.create_empty(
            overwrites={
                "name": name,
                "revision": "local",
                "embed_dim": embedder.dim,
                "similarity_fn_name": ScoringFunction.COSINE,
                "framework": ["JAX"],
                "use_instructions": bool(query_task or use_task_prompt),
                "max_tokens": max_length,
            }
        )

    def query_instruction(self, task_metadata: TaskMetadata) -> str | None:
        """The instruction queries of this task get, or None."""
        if self.query_task:
            return self.query_task
        if self.use_task_prompt:
            return self.get_instruction(task_metadata, PromptType.query) or None
        return None

    def encode(
        self,
        inputs,
        *,
        task_metadata: TaskMetadata,
        hf_split: str,
        hf_subset: str,
        prompt_type: PromptType | None = None,
        **kwargs: Any,
    ) -> np.ndarray:
        """Encodes every text of the `DataLoader` `inputs` in one call; returns `[n, D]` float32.

        The whole loader is passed to the embedder at once so it can group texts by length.
        """
        del hf_split, hf_subset  # one model for every split and subset
        texts = [text for batch in inputs for text in batch["text"]]
        task = self.query_instruction(task_metadata) if prompt_type == PromptType.query else None
        vectors = self.model.encode(
            texts,
            batch_size=kwargs.get("batch_size", 32),
            max_length=self.max_length,
            query_task=task,
        )
        return np.asarray(vectors, np.float32)


class InMemoryRetrievalTask(AbsTaskRetrieval):
    """A retrieval task over in-memory dicts, one split "test"; build it with `make_retrieval_task`.

    mteb reads `metadata` from the class (it drops instance copies when unloading data), so
    each task gets its own subclass carrying its `TaskMetadata`.
    """

    def __init__(
        self,
        *,
        queries: Mapping[str, str],
        corpus: Mapping[str, str],
        qrels: Mapping[str, Mapping[str, int]],
    ):
        missing = sorted(set(qrels) - set(queries))
        if missing:
            raise ValueError(f"{len(missing)} qrels queries are not in queries, e.g. {missing[:3]}")
        self._data = (dict(queries), dict(corpus), {q: dict(d) for q, d in qrels.items()})
        super().__init__()

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        del num_proc, kwargs
        queries, corpus, qrels = self._data
        split = RetrievalSplitData(
            queries=Dataset.from_list([{"id": q, "text": t} for q, t in queries.items()]),
            corpus=Dataset.from_list(
                [{"id": d, "text": t, "title": ""} for d, t in corpus.items()]
            ),
            relevant_docs=qrels,
            top_ranked=None,
        )
        self.dataset = {"default": {"test": split}}
        self.data_loaded = True


def make_retrieval_task(
    *,
    name: str,
    queries: Mapping[str, str],
    corpus: Mapping[str, str],
    qrels: Mapping[str, Mapping[str, int]],
    query_prompt: str | None = None,
) -> InMemoryRetrievalTask:
    """An mteb retrieval task named `name` over the given data (no hub, no files).

    Args:
      name: task name in mteb's results.
      queries: {qid: text}.
      corpus: {doc id: text}.
      qrels: {qid: {doc id: grade}}.
      query_prompt: the task's query instruction (`metadata.prompt["query"]`), which encoders
        that take instructions from the task use (`EmbedderEncoder(use_task_prompt=True)`).
    """
    metadata = TaskMetadata(
        name=name,
        description=f"In-memory retrieval task {name} (caliber_jax).",
        reference=None,
        dataset={"path": f"local/{name}", "revision": "local"},
        type="Retrieval",
        category="t2t",
        modalities=["text"],
        eval_splits=["test"],
        eval_langs=["eng-Latn"],
        main_score="ndcg_at_10",
        date=None,
        domains=None,
        task_subtypes=None,
        license="not specified",
        annotations_creators=None,
        dialect=None,
        sample_creation=None,
        bibtex_citation=None,
        prompt={"query": query_prompt} if query_prompt else None,
    )
    task_class = type(name, (InMemoryRetrievalTask,), {"metadata": metadata})
    return task_class(queries=queries, corpus=corpus, qrels=qrels)


def evaluate(
    encoder: EmbedderEncoder, tasks: Iterable[mteb.AbsTask], *, batch_size: int
) -> dict[str, dict[str, dict[str, float]]]:
    """Runs `tasks` with `mteb.evaluate`, without mteb's result cache.

    Set HF_HUB_OFFLINE=1 to make sure nothing is fetched (hub tasks then need a local
    datasets cache; `InMemoryRetrievalTask` needs none).

    Returns:
      {task name: {split: {metric: value}}}, the numeric scores averaged over hf subsets.
    """
    result = mteb.evaluate(
        encoder,
        tasks=list(tasks),
        cache=None,
        overwrite_strategy="always",
        show_progress_bar=False,
        encode_kwargs={"batch_size": batch_size},
    )
    scores = {}
    for task_result in result.task_results:
        scores[task_result.task_name] = {
            split: _mean_numeric(subsets) for split, subsets in task_result.scores.items()
        }
    return scores


def _mean_numeric(subsets: list[dict[str, Any]]) -> dict[str, float]:
    names = [
        name
        for name, value in subsets[0].items()
        if isinstance(value, int | float | np.floating) and not isinstance(value, bool)
    ]
    return {name: float(np.mean([subset[name] for subset in subsets])) for name in names}
