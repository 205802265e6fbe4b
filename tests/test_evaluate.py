"""Tests for caliber_jax/evaluate.py: run_evaluation with MiniLM, results layout, the BM25 CLI."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from caliber_jax import evaluate, paths, provenance
from caliber_jax.eval import numgap, retrieval

REPO = Path(__file__).resolve().parents[1]
FINANCEBENCH_SAMPLE = REPO / "data" / "sample" / "financebench_open_source.jsonl.gz"
METRICS = {f"{m}_at_{k}" for m in ("ndcg", "recall", "mrr", "map") for k in (10, 100)}


def _financebench_subset(num_queries):
    queries, corpus, qrels = retrieval.load_financebench(FINANCEBENCH_SAMPLE)
    kept = list(queries)[:num_queries]
    doc_ids = sorted({doc for qid in kept for doc in qrels[qid]})
    return (
        {qid: queries[qid] for qid in kept},
        {doc: corpus[doc] for doc in doc_ids},
        {qid: qrels[qid] for qid in kept},
    )


def _numgap_file(tmp_path, passages):
    """Four records from real filing paragraphs: one digit changed, the next paragraph distracts."""
    with_digits = [p for p in passages if any(c.isdigit() for c in p)][:5]
    records = []
    for index, (category, anchor) in enumerate(
        zip(["magnitude", "magnitude", "unit", "unit"], with_digits, strict=False)
    ):
        position = next(i for i, c in enumerate(anchor) if c.isdigit())
        digit = str((int(anchor[position]) + 5) % 10)
        perturbed = anchor[:position] + digit + anchor[position + 1 :]
        distractor = with_digits[index + 1]
        records.append(
            {
                "category": category,
                "anchor": anchor,
                "perturbed": perturbed,
                "distractor": distractor,
            }
        )
    path = tmp_path / "numgap_test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_run_evaluation_minilm_layout(minilm_dir, filing_passages, tmp_path):
    from caliber_jax.embedder import Embedder

    embedder = Embedder.from_pretrained(minilm_dir)
    calls = []

    def encode_fn(texts):
        calls.append(list(texts))
        return embedder.encode(texts, batch_size=16, max_length=128)

    inputs = evaluate.EvalInputs(
        financebench=_financebench_subset(12),
        numgap=numgap.load_numgap(_numgap_file(tmp_path, filing_passages)),
        query_prompt=retrieval.FINANCEBENCH_INSTRUCTION,
        # The student as its own teacher: asymmetric must then equal symmetric retrieval.
        teacher_encode_fn=lambda texts: embedder.encode(texts, batch_size=16, max_length=128),
        mrl_dims=(256, 64),
    )
    tasks = ["financebench", "numgap", "mrl", "asymmetric", "bm25"]
    results = evaluate.run_evaluation(encode_fn, tasks, inputs)
    per_query = results.pop("per_query")
    assert list(results) == tasks
    assert set(results["financebench"]) == METRICS
    # Each query's values (6 decimals) average to the reported means.
    assert set(per_query) == {"financebench", "bm25", "numgap"}
    # NumGap: each record's 1[s_p < s_d] and s_d - s_p, averaging to D and M.
    gaps = per_query.pop("numgap")
    assert set(gaps) == {"D", "M"} and len(gaps["D"]) == len(gaps["M"]) == 4
    for name in ("D", "M"):
        mean = sum(gaps[name].values()) / 4
        assert mean == pytest.approx(results["numgap"]["overall"][name], abs=1e-6), name
    per_query["numgap"] = gaps
    for task in ("financebench", "bm25"):
        assert set(per_query[task]) == METRICS
        for metric, values in per_query[task].items():
            assert set(values) == set(inputs.financebench[0])
            mean = sum(values.values()) / len(values)
            assert mean == pytest.approx(results[task][metric], abs=1e-5), (task, metric)
    assert set(results["numgap"]) == {"overall", "magnitude", "unit"}
    assert set(results["numgap"]["overall"]) == {"D", "M", "n"}
    assert results["numgap"]["overall"]["n"] == 4
    assert list(results["mrl"]) == ["dim_384", "dim_256", "dim_64", "int8", "binary"]
    assert all(set(metrics) == METRICS for metrics in results["mrl"].values())
    assert results["mrl"]["dim_384"] == results["financebench"]
    assert results["asymmetric"] == pytest.approx(results["financebench"], abs=1e-12)
    assert 0.3 < results["financebench"]["ndcg_at_10"] <= 1.0
    assert set(results["bm25"]) == METRICS
    # Encodings are cached across tasks: no text reaches the model twice.
    encoded = [text for call in calls for text in call]
    assert len(encoded) == len(set(encoded))

    results.update(model=str(minilm_dir), label="minilm", settings={"max_length": 128})
    results["per_query"] = per_query
    json_path, markdown_path = evaluate.save_results(results, tmp_path / "out" / "results.json")
    assert markdown_path == tmp_path / "out" / "results.md"
    saved = json.loads(json_path.read_text())
    assert set(saved) == {*tasks, "per_query", "model", "label", "settings"}
    assert saved["per_query"] == per_query
    assert saved["financebench"] == results["financebench"]
    assert saved["numgap"]["magnitude"]["D"] == results["numgap"]["magnitude"]["D"]
    markdown = markdown_path.read_text()
    assert "## FinanceBenchRetrieval" in markdown and "## NumGap" in markdown
    row = next(line for line in markdown.splitlines() if line.startswith("| minilm |"))
    assert f"{results['financebench']['ndcg_at_10']:.4f}" in row
    assert "| bm25 |" in markdown and "| minilm (asymmetric) |" in markdown
    assert not list((tmp_path / "out").glob(".results*"))  # no temporary files left behind


def test_bm25_model_and_task_errors():
    inputs = evaluate.EvalInputs(financebench=_financebench_subset(30))
    results = evaluate.run_evaluation(None, ["financebench"], inputs)
    queries, corpus, qrels = inputs.financebench
    run = retrieval.bm25_run(queries, corpus, 100)
    assert results.pop("financebench") == retrieval.retrieval_metrics(qrels, run)
    expected = retrieval.per_query_metrics(qrels, run)
    assert list(results) == ["per_query"] and list(results["per_query"]) == ["financebench"]
    saved = results["per_query"]["financebench"]
    assert list(saved) == list(expected)
    for metric, values in expected.items():
        assert saved[metric] == pytest.approx(values, abs=5e-7), metric
    with pytest.raises(ValueError, match="BM25 model runs only"):
        evaluate.run_evaluation(None, ["numgap"], inputs)
    with pytest.raises(ValueError, match="unknown tasks"):
        evaluate.run_evaluation(None, ["nope"], inputs)
    with pytest.raises(ValueError, match="needs NumGap records"):
        evaluate.run_evaluation(lambda texts: np.eye(2)[: len(texts)], ["numgap"], inputs)
    with pytest.raises(ValueError, match=r"needs a teacher"):
        evaluate.run_evaluation(lambda texts: np.eye(2)[: len(texts)], ["asymmetric"], inputs)
    # Every task's input is checked before the first task encodes anything.
    encoded = []
    with pytest.raises(ValueError, match="task 'numgap' needs NumGap records"):
        evaluate.run_evaluation(lambda texts: encoded.append(texts) or np.eye(2)[: len(texts)],
                                ["financebench", "numgap"], inputs)  # fmt: skip
    assert encoded == []


def test_cache_encodings_encodes_each_text_once():
    calls = []

    def encode_fn(texts):
        calls.append(list(texts))
        return np.array([[len(t), 1.0] for t in texts], np.float32)

    cached = evaluate.cache_encodings(encode_fn)
    first = cached(["a", "bb", "a"])
    second = cached(["bb", "ccc"])
    assert calls == [["a", "bb"], ["ccc"]]
    np.testing.assert_array_equal(first, [[1, 1], [2, 1], [1, 1]])
    np.testing.assert_array_equal(second, [[2, 1], [3, 1]])


def test_cli_bm25_writes_json_and_markdown(tmp_path):
    output = tmp_path / "bm25.json"
    subprocess.run(
        [sys.executable, "-m", "caliber_jax.evaluate", "--model=bm25", f"--output={output}",
         "--tasks=financebench", f"--financebench={FINANCEBENCH_SAMPLE}"],
        check=True, cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    saved = json.loads(output.read_text())
    assert set(saved) == {"financebench", "per_query", "model", "label", "settings", "provenance"}
    assert saved["model"] == "bm25" and saved["label"] == "bm25"
    # Where the numbers came from: this checkout's commit, the hash of the evaluation data's
    # bytes (the same as the scripts compute before restoring a record), a computed result.
    block = saved["provenance"]
    assert block["data_hash"] == provenance.data_hash([FINANCEBENCH_SAMPLE])
    assert block["commit"] == provenance.git_commit() and block["restored"] is False
    assert len(block["config_hash"]) == 16 and block["machine"] and block["date"].endswith("Z")
    queries, corpus, qrels = retrieval.load_financebench(FINANCEBENCH_SAMPLE)
    expected = retrieval.retrieval_metrics(qrels, retrieval.bm25_run(queries, corpus, 100))
    assert saved["financebench"] == pytest.approx(expected, abs=1e-12)
    assert "| bm25 |" in output.with_suffix(".md").read_text()


def test_cli_several_models_in_one_process(minilm_dir, filing_passages, tmp_path):
    """Two --model (MiniLM cut to 1 layer, and whole) in one call: one results file per label,
    each equal to that model evaluated on its own."""
    from caliber_jax.embedder import Embedder

    numgap_path = _numgap_file(tmp_path, filing_passages)
    output = tmp_path / "results"
    result = subprocess.run(
        [sys.executable, "-m", "caliber_jax.evaluate", f"--model={minilm_dir}",
         f"--model={minilm_dir}", "--label=one layer", "--label=Teacher", "--num_layers=1,0",
         "--tasks=numgap", f"--numgap={numgap_path}", f"--output={output}"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(p.name for p in output.iterdir()) == [
        "Teacher.json", "Teacher.md", "one_layer.json", "one_layer.md"
    ]  # fmt: skip
    records = numgap.load_numgap(numgap_path)
    for name, layers in (("one_layer", 1), ("Teacher", None)):
        saved = json.loads((output / f"{name}.json").read_text())
        assert saved["settings"]["num_layers"] == layers
        embedder = Embedder.from_pretrained(minilm_dir, num_layers=layers)
        # No --max_length: the results name the limit the texts were cut at, the model's own.
        assert saved["settings"]["max_length"] == embedder.max_length == 256
        alone = evaluate.run_evaluation(
            embedder.encode_fn(batch_size=32, max_length=None),
            ["numgap"],
            evaluate.EvalInputs(numgap=records),
        )
        for category, values in alone["numgap"].items():
            assert saved["numgap"][category] == pytest.approx(values, abs=1e-6), category
    one = json.loads((output / "one_layer.json").read_text())["numgap"]["overall"]["M"]
    full = json.loads((output / "Teacher.json").read_text())["numgap"]["overall"]["M"]
    assert one != full  # the depths reached the right models


def test_cli_labels_must_match_models(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "caliber_jax.evaluate", "--model=bm25", "--model=bm25",
         "--label=a", f"--output={tmp_path}", "--tasks=financebench",
         f"--financebench={FINANCEBENCH_SAMPLE}"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "--label: 1 labels for 2 --model" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--model=bm25", "--model=bm25", "--label=my model", "--label=my_model"],
         "--label: ['my model', 'my_model'] would write the same results file (my_model.json)"),
        (["--model=bm25", "--max_length=-5"], "--max_length=-5: a token count >= 0"),
    ],
)  # fmt: skip
def test_cli_refuses_labels_of_one_file_and_a_negative_length(tmp_path, flags, message):
    """Two labels of one file name: the second model's results overwrote the first's."""
    result = subprocess.run(
        [sys.executable, "-m", "caliber_jax.evaluate", *flags, f"--output={tmp_path / 'out'}",
         "--tasks=financebench", f"--financebench={FINANCEBENCH_SAMPLE}"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def test_results_files_have_the_usual_permissions(tmp_path):
    """A temporary file is created 0600 and the rename kept it: results others could not read."""
    import os

    previous = os.umask(0o022)
    try:
        paths.write_text_whole(tmp_path / "r.json", "{}")
    finally:
        os.umask(previous)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644


def test_numfine_and_embednum_tasks_with_and_without_nash():
    from caliber_jax.eval import numfine as numfine_lib

    sentences = [
        "Revenue increased 12.4% to $1,234.5 million in fiscal 2021, driven by higher volumes.",
        "Operating expenses were $845.2 million, compared with $790.1 million a year earlier.",
        "The company had 15,300 employees at December 31, 2021, up from 14,800.",
    ]
    units = numfine_lib.build_numfine(sentences, seed=0, max_items=3)
    assert units

    def encode_fn(texts):
        rng = [np.random.default_rng(abs(hash(t)) % 2**32).standard_normal(16) for t in texts]
        vecs = np.asarray(rng, np.float32)
        return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)

    def nash_fn(a, b):  # a toy scorer: negative absolute length difference
        return -np.abs(np.array([len(x) for x in a]) - np.array([len(y) for y in b])).astype(float)

    inputs = evaluate.EvalInputs(numfine=units, embednum_per_format=2, nash_fn=nash_fn)
    results = evaluate.run_evaluation(encode_fn, ["numfine", "embednum"], inputs)
    assert set(results["numfine"]) == {"cosine", "nash"}
    assert set(results["numfine"]["cosine"]["triplet"]) == {"easy", "medium", "hard"}
    assert 0.0 <= results["embednum"]["cosine"]["overall"] <= 1.0
    plain = evaluate.run_evaluation(
        encode_fn, ["embednum"], evaluate.EvalInputs(embednum_per_format=2)
    )
    assert set(plain["embednum"]) == {"cosine"}
    assert plain["embednum"]["cosine"] == results["embednum"]["cosine"]
    markdown = evaluate.format_markdown({"toy": results})
    assert "## NumFinE" in markdown and "## EmbedNum-style accuracy" in markdown
