"""Entry point: evaluate one model directory (or BM25) and write results JSON + a Markdown table.

    python -m caliber_jax.evaluate --model runs/caliber/hf --output runs/caliber/results.json \\
        --tasks financebench,numgap,mrl --financebench financebench_open_source.jsonl.gz \\
        --numgap numgap_test.jsonl --query_prompt "Given a financial question, ..."
    python -m caliber_jax.evaluate --model bm25 --output bm25.json --financebench FILE

Results: {"financebench": {8 metrics}, "numgap": {"overall": {"D", "M", "n"}, category: ...},
"mrl": {"dim_<k>" | "int8" | "binary": {8 metrics}}, "asymmetric": {8 metrics}, "bm25": {8 metrics},
"per_query": {"financebench" | "bm25": {metric: {query id: value}}, "numgap": {"D" | "M":
{record id: value}}} (paired tests: `python -m caliber_jax.compare`), "model": DIR, "label": NAME,
"settings": {...}}, with only the tasks that were run. `results.md` (the output path with suffix
.md) holds the same as tables. The core is `run_evaluation`.
"""

import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from absl import app, flags

from caliber_jax import cli, hub, paths, provenance
from caliber_jax.eval import (
    PER_QUERY,
    EncodeFn,
    asymmetric,
    embednum,
    mrl,
    numfine,
    numgap,
    retrieval,
    within_doc,
)

BM25 = "bm25"
RETRIEVAL_METRICS = tuple(
    f"{name}_at_{k}" for name in ("ndcg", "recall", "mrr", "map") for k in (10, 100)
)


@dataclasses.dataclass(frozen=True)
class EvalInputs:
    """Data and settings the tasks read; a task fails when what it needs is None.

    Attributes:
      financebench: (queries, corpus, qrels) of `retrieval.load_financebench`.
      numgap: NumGap records of `numgap.load_numgap`.
      query_prompt: instruction for retrieval queries (`Instruct: {prompt}\\nQuery:{query}`).
      teacher_encode_fn: the teacher, encoding documents for the asymmetric task.
      mrl_dims: truncation dims of the MRL study.
      numfine: NumFinE units of `numfine.load_numfine` (e.g. prepare's numfine_test.jsonl).
      embednum_per_format: EmbedNum-style items generated per numeric format.
      nash_fn: NASH `score(texts_a, texts_b)`; when set, numfine/embednum also report NASH.
    """

    financebench: tuple[dict, dict, dict] | None = None
    numgap: list[dict[str, str]] | None = None
    query_prompt: str | None = None
    teacher_encode_fn: EncodeFn | None = None
    mrl_dims: tuple[int, ...] = mrl.DIMS
    numfine: list[dict] | None = None
    embednum_per_format: int = 50
    nash_fn: Callable[[Sequence[str], Sequence[str]], np.ndarray] | None = None
    # FinanceBench within-document ranking (paper 001 VI): items of `within_doc.load_items`,
    # and an optional baseline model for Cohen's d.
    within_doc_items: list[dict] | None = None
    within_doc_baseline: EncodeFn | None = None


def _financebench(encode_fn: EncodeFn | None, inputs: EvalInputs) -> dict:
    queries, corpus, qrels = inputs.financebench
    if encode_fn is None:  # the BM25 model
        return _bm25(None, inputs)
    run = retrieval.dense_run(
        encode_fn, queries=queries, corpus=corpus, query_prompt=inputs.query_prompt, top_k=100
    )
    return _with_per_query(qrels, run)


def _bm25(encode_fn: EncodeFn | None, inputs: EvalInputs) -> dict:
    del encode_fn  # lexical: the model is not used
    queries, corpus, qrels = inputs.financebench
    return _with_per_query(qrels, retrieval.bm25_run(queries, corpus, top_k=100))


def _with_per_query(qrels: Mapping, run: Mapping) -> dict:
    """The run's mean metrics, and under PER_QUERY each query's (6 decimals), which
    `run_evaluation` moves to `results["per_query"][task]` for `significance`."""
    per_query = retrieval.per_query_metrics(qrels, run)
    rounded = {m: {q: round(v, 6) for q, v in values.items()} for m, values in per_query.items()}
    return {**retrieval.mean_metrics(per_query), PER_QUERY: rounded}


def _numgap(encode_fn: EncodeFn, inputs: EvalInputs) -> dict:
    records = inputs.numgap
    return numgap.evaluate(encode_fn, records, per_record=True)


def _mrl(encode_fn: EncodeFn, inputs: EvalInputs) -> dict:
    queries, corpus, qrels = inputs.financebench
    return mrl.evaluate(
        encode_fn,
        queries=queries,
        corpus=corpus,
        qrels=qrels,
        query_prompt=inputs.query_prompt,
        dims=inputs.mrl_dims,
    )


def _asymmetric(encode_fn: EncodeFn, inputs: EvalInputs) -> dict:
    queries, corpus, qrels = inputs.financebench
    teacher = inputs.teacher_encode_fn
    return asymmetric.evaluate(
        encode_fn,
        teacher,
        queries=queries,
        corpus=corpus,
        qrels=qrels,
        query_task=inputs.query_prompt,
    )


# Task name -> fn(encode_fn, inputs) -> results. Tasks run in the order asked for.
def _numfine(encode_fn: EncodeFn, inputs: EvalInputs) -> dict:
    units = inputs.numfine
    return numfine.evaluate_scorers(numfine.evaluate, encode_fn, units, inputs.nash_fn)


def _embednum(encode_fn: EncodeFn, inputs: EvalInputs) -> dict:
    items = embednum.build_embednum(seed=0, per_format=inputs.embednum_per_format)
    return numfine.evaluate_scorers(embednum.evaluate, encode_fn, items, inputs.nash_fn)


def _within_doc(encode_fn: EncodeFn, inputs: EvalInputs) -> dict:
    items = inputs.within_doc_items
    return within_doc.evaluate(encode_fn, items, k=5, query_instruction=inputs.query_prompt,
                               baseline_encode_fn=inputs.within_doc_baseline)  # fmt: skip


TASKS: dict[str, Callable[[EncodeFn | None, EvalInputs], dict]] = {
    "within_doc": _within_doc,
    "financebench": _financebench,
    "numgap": _numgap,
    "mrl": _mrl,
    "asymmetric": _asymmetric,
    BM25: _bm25,
    "numfine": _numfine,
    "embednum": _embednum,
}
# Tasks that need no encoder, i.e. that the BM25 model can run.
LEXICAL_TASKS = ("financebench", BM25)
# What each task reads from `EvalInputs` (field, and what its error calls it): checked for every
# task before the first runs, so a missing --numgap is not found after the corpus is encoded.
_FINANCEBENCH = ("financebench", "FinanceBench data")
TASK_NEEDS = {
    "financebench": (_FINANCEBENCH,),
    BM25: (_FINANCEBENCH,),
    "mrl": (_FINANCEBENCH,),
    "asymmetric": (_FINANCEBENCH, ("teacher_encode_fn", "a teacher (--teacher)")),
    "numgap": (("numgap", "NumGap records"),),
    "numfine": (("numfine", "NumFinE units (--numfine)"),),
    "within_doc": (("within_doc_items", "--financebench and --filings"),),
}


def cache_encodings(encode_fn: EncodeFn) -> EncodeFn:
    """`encode_fn` that encodes each distinct text once (tasks share queries and passages)."""
    cache: dict[str, np.ndarray] = {}

    def cached_fn(texts: list[str]) -> np.ndarray:
        missing = list(dict.fromkeys(text for text in texts if text not in cache))
        if missing:
            vectors = np.asarray(encode_fn(missing), np.float32)
            if vectors.shape[0] != len(missing):
                raise ValueError(
                    f"encode_fn gave {vectors.shape[0]} vectors for {len(missing)} texts"
                )
            cache.update(zip(missing, vectors, strict=True))
        if not texts:
            return np.zeros((0, 0), np.float32)
        return np.stack([cache[text] for text in texts])

    return cached_fn


def run_evaluation(
    encode_fn: EncodeFn | None, tasks: Sequence[str], inputs: EvalInputs
) -> dict[str, Any]:
    """Runs `tasks` with one encoder.

    Args:
      encode_fn: `texts -> [n, D]` unit vectors; None for the BM25 model, whose "financebench"
        results are BM25's.
      tasks: names from TASKS.
      inputs: the data the tasks need.

    Returns:
      {task: results} in the order of `tasks`, and for the tasks that keep them ("financebench",
      "bm25", "numgap") `"per_query": {task: {metric: {query or record id: value}}}`.
    """
    unknown = [task for task in tasks if task not in TASKS]
    if unknown:
        raise ValueError(f"unknown tasks {unknown}; known: {sorted(TASKS)}")
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"tasks {list(tasks)} repeat a task")
    if encode_fn is None and any(task not in LEXICAL_TASKS for task in tasks):
        raise ValueError(f"the BM25 model runs only {LEXICAL_TASKS}, not {list(tasks)}")
    for task in tasks:  # the task functions read these fields unchecked
        for field, what in TASK_NEEDS.get(task, ()):
            if getattr(inputs, field) is None:
                raise ValueError(f"task {task!r} needs {what}")
    if encode_fn is not None:
        encode_fn = cache_encodings(encode_fn)
    results: dict[str, Any] = {}
    for task in tasks:
        start = time.perf_counter()
        results[task] = dict(TASKS[task](encode_fn, inputs))
        if PER_QUERY in results[task]:
            results.setdefault(PER_QUERY, {})[task] = results[task].pop(PER_QUERY)
        print(f"evaluate: {task} took {time.perf_counter() - start:.1f} s")
    return results


def save_results(results: Mapping[str, Any], output: str | os.PathLike) -> tuple[Path, Path]:
    """Writes `results` to `output` (JSON) and `output` with suffix .md, each atomically.

    Returns:
      (json path, markdown path).
    """
    output = Path(output)
    label = results.get("label") or output.stem
    markdown = output.with_suffix(".md")
    if markdown == output:
        raise ValueError(f"{output}: the results file must not end in .md")
    paths.write_text_whole(output, json.dumps(results, indent=2) + "\n")
    paths.write_text_whole(markdown, format_markdown({label: results}))
    return output, markdown


def _number(value) -> str:
    return "" if value is None else f"{value:.4f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def format_markdown(runs: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown tables of one or more results dicts, keyed by label (one row per model).

    Sections appear only for tasks present in some run: retrieval (financebench, one BM25 row,
    asymmetric: student queries against teacher documents), NumGap-D/M per category, and the
    MRL/quantization variants. A row restored from a record says so after its label
    (`provenance.mark`).
    """
    runs = {f"{label}{provenance.mark(run)}": run for label, run in runs.items()}
    lines = []
    short = ("nDCG@10", "nDCG@100", "R@10", "R@100", "MRR@10", "MRR@100", "MAP@10", "MAP@100")
    retrieval_rows = [(label, run, "financebench") for label, run in runs.items()]
    # BM25 does not depend on the model: one reference row, from the first run that has it.
    retrieval_rows += [(BM25, run, BM25) for run in runs.values() if BM25 in run][:1]
    retrieval_rows += [(f"{label} (asymmetric)", run, "asymmetric") for label, run in runs.items()]
    rows = [
        [label, *(_number(run[task].get(m)) for m in RETRIEVAL_METRICS)]
        for label, run, task in retrieval_rows
        if task in run
    ]
    if rows:
        lines += ["## FinanceBenchRetrieval", "", *_table(("model", *short), rows), ""]
    categories = list(dict.fromkeys(c for run in runs.values() for c in run.get("numgap", {})))
    if categories:
        header = ["model", *(f"{c} D" for c in categories), *(f"{c} M" for c in categories)]
        rows = [
            [
                label,
                *(_number(run["numgap"].get(c, {}).get("D")) for c in categories),
                *(_number(run["numgap"].get(c, {}).get("M")) for c in categories),
            ]
            for label, run in runs.items()
            if "numgap" in run
        ]
        lines += ["## NumGap (D: higher is better, random 0.5; M: mean s_d - s_p)", ""]
        lines += [*_table(header, rows), ""]
    variants = list(dict.fromkeys(v for run in runs.values() for v in run.get("mrl", {})))
    if variants:
        rows = [
            [label, *(_number(run["mrl"].get(v, {}).get("ndcg_at_10")) for v in variants)]
            for label, run in runs.items()
            if "mrl" in run
        ]
        lines += ["## MRL and quantization, nDCG@10", "", *_table(["model", *variants], rows), ""]
    rows = [
        [f"{label} ({scorer})", *(_number(v) for v in _numfine_row(result))]
        for label, run in runs.items()
        for scorer, result in run.get("numfine", {}).items()
    ]
    if rows:
        header = ["model", "triplet easy", "medium", "hard", "listwise tau_b", "cross-pair"]
        lines += ["## NumFinE", "", *_table(header, rows), ""]
    rows = [
        [f"{label} ({scorer})", _number(result.get("overall"))]
        for label, run in runs.items()
        for scorer, result in run.get("embednum", {}).items()
    ]
    if rows:
        lines += ["## EmbedNum-style accuracy", "", *_table(["model", "overall"], rows), ""]
    return "\n".join(lines)


def _numfine_row(result: Mapping[str, Any]) -> list[float | None]:
    triplet = result.get("triplet", {})
    return [triplet.get("easy"), triplet.get("medium"), triplet.get("hard"),
            result.get("listwise_tau_b"), result.get("cross_pair")]  # fmt: skip


def _define_flags() -> None:
    """Defined only when run as a script, so that tests can import `evaluate` freely."""
    flags.DEFINE_multi_string(
        "model",
        None,
        f"Model directory, Hub id (org/name[@revision]) or {BM25!r}; repeat it to evaluate "
        "several models in "
        "one process (data loaded once; --output is then a directory).",
        required=True,
    )
    flags.DEFINE_string("output", None, "Results JSON path (results.md is written beside); with "
                        "several --model, a directory that gets <label>.json/.md per model.",
                        required=True)  # fmt: skip
    flags.DEFINE_list(
        "tasks",
        None,
        f"Tasks, from {sorted(TASKS)} (default: financebench,numgap; BM25: financebench).",
    )
    flags.DEFINE_string("financebench", None, "financebench_open_source.jsonl[.gz].")
    flags.DEFINE_string("numgap", None, "NumGap JSONL (e.g. numgap_test.jsonl).")
    flags.DEFINE_string("numfine", None, "NumFinE units JSONL (e.g. numfine_test.jsonl).")
    flags.DEFINE_integer("embednum_per_format", 50, "EmbedNum-style items per numeric format.")
    flags.DEFINE_bool("nash", False, "Also score numfine/embednum with NASH (our token vectors).")
    flags.DEFINE_string("query_prompt", None, "Instruction for retrieval queries (Qwen3 style).")
    flags.DEFINE_alias("query_task", "query_prompt")
    flags.DEFINE_string("teacher", None, "Teacher model directory or Hub id (asymmetric task).")
    flags.DEFINE_string("pooling", None, "Model pooling override (mean/last/cls).")
    flags.DEFINE_string("teacher_pooling", None, "Teacher pooling override (mean/last/cls).")
    # "torch": any local sentence-transformers/transformers directory, of architectures with no
    # Flax port here too (caliber_jax.data.torch_teacher).
    flags.DEFINE_enum("backend", "flax", ["flax", "torch"], "How the model is run.")
    flags.DEFINE_enum("teacher_backend", "flax", ["flax", "torch"], "How the teacher is run.")
    flags.DEFINE_string("device", "auto", "torch backend: auto, cpu, cuda, cuda:1, ...")
    flags.DEFINE_list("mrl_dims", [str(d) for d in mrl.DIMS], "MRL truncation dims.")
    flags.DEFINE_list(
        "num_layers",
        None,
        "Evaluate only the model's first N encoder layers: one "
        "value for every --model, or one per --model (0 = all layers).",
    )
    flags.DEFINE_integer("batch_size", 32, "Texts per encoder call.")
    flags.DEFINE_integer("max_length", None, "Token limit (default: the model's, at most 512).")
    flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype.")
    flags.DEFINE_multi_string(
        "label",
        None,
        "Row name in tables and plots, one per --model (default: the model directory's name).",
    )
    flags.DEFINE_string("filings", None, "Filings JSONL(.gz) with the FinanceBench evidence "
                        "filings (task within_doc).")  # fmt: skip
    flags.DEFINE_integer("within_doc_max_docs", 0, "within_doc: evidence filings used (0: all).")
    flags.DEFINE_string("within_doc_baseline", None, "within_doc: baseline model dir (Cohen's d).")


def _load(model_dir: str, *, pooling, dtype: str, num_layers=None):
    from caliber_jax.embedder import Embedder  # jax and transformers: only for dense models

    embedder = Embedder.from_pretrained(
        model_dir, pooling=pooling, dtype=dtype, num_layers=num_layers
    )
    print(f"evaluate: {model_dir}: dim {embedder.dim}, pooling {embedder.spec.pooling}")
    return embedder


def _encode_fn(
    model_dir: str, *, pooling, dtype: str, batch_size: int, max_length, backend="flax", device=""
) -> tuple[EncodeFn, int]:
    """The model's encode function and the token limit it cuts at (`max_length`, else the
    model's own)."""
    if backend == "torch":
        from caliber_jax.data import torch_teacher  # torch only when asked for

        encoder = torch_teacher.TorchEncoder(
            hub.resolve_model_dir(model_dir), pooling=pooling, dtype=dtype, device=device
        )
        print(f"evaluate: {model_dir}: dim {encoder.dim}, pooling {encoder.pooling} (torch)")
        limit = max_length or encoder.model_max_length()
        return encoder.encode_fn(batch_size=batch_size, max_length=max_length), limit
    embedder = _load(model_dir, pooling=pooling, dtype=dtype)
    limit = max_length or embedder.max_length
    return embedder.encode_fn(batch_size=batch_size, max_length=max_length), limit


def _nash_fn(embedder, units: list[dict] | None):
    """NASH scorer fitted (IDF, alignment threshold) on the NumFinE anchors, else FinanceBench-free
    generic financial sentences from the EmbedNum templates."""
    from caliber_jax.eval import nash

    texts = (
        [u["anchor"] for u in units]
        if units
        else [item["question"] for item in embednum.build_embednum(seed=1, per_format=20)]
    )
    scorer = nash.make_scorer(embedder, idf_texts=texts, threshold_texts=texts, seed=0,
                              num_pairs=2000)  # fmt: skip
    return scorer.score


def _with_within_doc(inputs: EvalInputs, values, encode: dict) -> EvalInputs:
    """Adds the within_doc items (chunked as `caliber_jax.mine` chunks) and the baseline."""
    if not values.financebench or not values.filings:
        raise ValueError("task within_doc needs --financebench and --filings")
    items = within_doc.load_items(values.financebench, values.filings, min_chars=500,
                                  max_chars=1000, ngram=5, min_fraction=1 / 3,
                                  max_docs=values.within_doc_max_docs)  # fmt: skip
    baseline = None
    if values.within_doc_baseline:
        model = _load(values.within_doc_baseline, pooling=values.pooling, dtype=values.dtype)
        baseline = model.encode_fn(batch_size=values.batch_size, max_length=values.max_length)
    return dataclasses.replace(inputs, within_doc_items=items, within_doc_baseline=baseline)


def slug(label: str) -> str:
    """File name of a label's results: spaces to underscores, no '='."""
    return label.replace(" ", "_").replace("=", "")


def _depths(num_layers: Sequence[str] | None, count: int) -> list[int | None]:
    """--num_layers per model: absent (all layers), one value for all, or one per model; 0 = all."""
    values = list(num_layers or ["0"])
    if len(values) == 1:
        values *= count
    if len(values) != count:
        raise ValueError(f"--num_layers: {len(values)} values for {count} --model")
    return [int(n) or None for n in values]


def _inputs(values, encode: dict) -> EvalInputs:
    """The data every model is scored on (and the asymmetric task's teacher), loaded once."""
    units = numfine.load_numfine(values.numfine) if values.numfine else None
    teacher_fn = None
    if values.teacher:
        teacher_fn = cache_encodings(
            _encode_fn(values.teacher, pooling=values.teacher_pooling,
                       backend=values.teacher_backend, device=values.device, **encode)[0]
        )  # fmt: skip
    inputs = EvalInputs(
        financebench=retrieval.load_financebench(values.financebench)
        if values.financebench
        else None,
        numgap=numgap.load_numgap(values.numgap) if values.numgap else None,
        query_prompt=values.query_prompt,
        teacher_encode_fn=teacher_fn,
        mrl_dims=tuple(int(d) for d in values.mrl_dims),
        numfine=units,
        embednum_per_format=values.embednum_per_format,
    )
    if "within_doc" in (values.tasks or ()):
        inputs = _with_within_doc(inputs, values, encode)
    return inputs


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    values = flags.FLAGS
    models = list(values.model)
    labels = list(values.label or [None] * len(models))
    if len(labels) != len(models):
        raise ValueError(f"--label: {len(labels)} labels for {len(models)} --model")
    labels = [label or (BM25 if model == BM25 else Path(model).name)
              for model, label in zip(models, labels, strict=True)]  # fmt: skip
    if len(set(labels)) != len(labels):
        raise ValueError(f"--label: labels must differ, got {labels}")
    if len(models) > 1:  # each writes <output>/<slug(label)>.json
        files = [slug(label) for label in labels]
        same = sorted({label for label, name in zip(labels, files, strict=True)
                       if files.count(name) > 1})  # fmt: skip
        if same:
            raise ValueError(f"--label: {same} would write the same results file "
                             f"({slug(same[0])}.json): choose labels whose file names "
                             f"differ")  # fmt: skip
    if values.max_length is not None and values.max_length < 0:
        raise ValueError(f"--max_length={values.max_length}: a token count >= 0 (0: the model's "
                         f"own limit)")  # fmt: skip
    depths = _depths(values.num_layers, len(models))
    encode = dict(dtype=values.dtype, batch_size=values.batch_size, max_length=values.max_length)
    inputs = _inputs(values, encode)
    for model, label, num_layers in zip(models, labels, depths, strict=True):
        output = Path(values.output) / f"{slug(label)}.json" if len(models) > 1 else values.output
        _evaluate_one(values, model, label, num_layers, output, encode, inputs)


def _evaluate_one(values, model: str, label: str, num_layers, output, encode, inputs) -> None:
    """Evaluates one model on `inputs` and writes its results."""
    is_bm25 = model == BM25
    settings = {
        "query_prompt": values.query_prompt,
        "dtype": values.dtype,
        "max_length": values.max_length,
        "pooling": values.pooling,
        "num_layers": num_layers,
        "teacher": values.teacher,
        "financebench": values.financebench,
        "numgap": values.numgap,
        "backend": values.backend,
    }
    torch_model = values.backend == "torch" and not is_bm25
    if torch_model and (num_layers is not None or values.nash):
        raise ValueError("--num_layers and --nash need --backend=flax")
    encode_fn, embedder = None, None
    if torch_model:
        encode_fn, settings["max_length"] = _encode_fn(
            model, pooling=values.pooling, backend="torch", device=values.device, **encode
        )
    elif not is_bm25:
        embedder = _load(model, pooling=values.pooling, dtype=values.dtype, num_layers=num_layers)
        encode_fn = embedder.encode_fn(batch_size=values.batch_size, max_length=values.max_length)
        # The limit the texts were cut at, the flag's or the model's own (they differ by model).
        settings["max_length"] = values.max_length or embedder.max_length
    if values.nash and embedder is not None:
        inputs = dataclasses.replace(inputs, nash_fn=_nash_fn(embedder, inputs.numfine))
    tasks = values.tasks or (["financebench"] if is_bm25 else ["financebench", "numgap"])
    results = run_evaluation(encode_fn, tasks, inputs)
    results.update(model=model, label=label, settings=settings)
    # What produced these numbers: the settings (paths by name) and tasks, and the bytes of the
    # evaluation data (scripts/ compare both before restoring a recorded copy).
    results[provenance.KEY] = provenance.stamp(
        config=provenance.config_hash({"settings": settings, "tasks": list(tasks)}),
        data=provenance.data_hash([values.financebench, values.numgap, values.numfine]),
    )
    json_path, markdown_path = save_results(results, output)
    print(Path(markdown_path).read_text())
    print(f"evaluate: wrote {json_path} and {markdown_path}")


if __name__ == "__main__":
    _define_flags()
    cli.run(main)
