"""PNG figures comparing results files of `caliber_jax.evaluate`, one model per file, in order.

    python -m caliber_jax.eval.plots --results initial.json,teacher.json,leaf.json,caliber.json \\
        --output_dir figures

Writes, for the tasks present: `retrieval_ndcg.png` (FinanceBench nDCG@10 per model),
`numgap_d.png` and `numgap_m.png` (grouped bars per category), `numgap_trajectory.png` ((D, M)
per category, one line per category connecting the models in order, as the paper's Figure 6)
and `mrl.png` (nDCG@10 against dim, with int8 and binary markers); for trained models whose
results carry a `validation` curve (the `val/*` rows of their training metrics), `validation.png`
(held-out alignment and perturbation distance against the step). No jax.
"""

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

Results = Mapping[str, Mapping[str, Any]]
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">")


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=150)
    plt.close(figure)
    return path


def _numgap_categories(runs: Results) -> list[str]:
    """Categories in first-seen order, "overall" last."""
    seen = dict.fromkeys(c for run in runs.values() for c in run.get("numgap", {}))
    return [c for c in seen if c != "overall"] + (["overall"] if "overall" in seen else [])


def plot_retrieval(runs: Results, path: Path) -> Path:
    """Bars of FinanceBench nDCG@10 per model (BM25 rows included)."""
    labels = [label for label, run in runs.items() if "financebench" in run]
    values = [runs[label]["financebench"]["ndcg_at_10"] for label in labels]
    figure, axes = plt.subplots(figsize=(1.2 * len(labels) + 2, 3.5))
    bars = axes.bar(labels, values, color=plt.cm.tab10(np.arange(len(labels)) % 10))
    axes.bar_label(bars, fmt="%.3f", fontsize=8)
    axes.set_ylabel("nDCG@10")
    axes.set_title("FinanceBenchRetrieval")
    axes.set_ylim(0, max(values) * 1.15 if values else 1)
    axes.tick_params(axis="x", labelrotation=20)
    return _save(figure, path)


def plot_numgap_bars(runs: Results, path: Path, *, metric: str) -> Path:
    """Grouped bars: one group per category (and overall), one bar per model.

    Args:
      runs: {label: results}.
      path: PNG to write.
      metric: "D" or "M".
    """
    if metric not in ("D", "M"):
        raise ValueError(f"metric={metric!r}, expected 'D' or 'M'")
    labels = [label for label, run in runs.items() if "numgap" in run]
    categories = _numgap_categories(runs)
    width = 0.8 / len(labels)
    figure, axes = plt.subplots(figsize=(1.6 * len(categories) + 2, 3.8))
    positions = np.arange(len(categories))
    for index, label in enumerate(labels):
        scores = runs[label]["numgap"]
        values = [scores.get(c, {}).get(metric, np.nan) for c in categories]
        axes.bar(positions + (index - (len(labels) - 1) / 2) * width, values, width, label=label)
    axes.set_xticks(positions, categories)
    axes.axhline(0.0, color="black", linewidth=0.8)
    if metric == "D":
        axes.set_ylabel("NumGap-D (higher is better; random 0.5)")
    else:
        axes.set_ylabel("NumGap-M = mean(s_d - s_p)")
    axes.set_title(f"NumGap-{metric} per category")
    axes.legend(fontsize=8)
    return _save(figure, path)


def plot_trajectory(runs: Results, path: Path) -> Path:
    """(NumGap-D, NumGap-M) per category; lines connect the models in order, one per category.

    Colour is the category, marker shape the model (the paper's Figure 6). "overall" is drawn
    only when it is the sole category.
    """
    labels = [label for label, run in runs.items() if "numgap" in run]
    categories = [c for c in _numgap_categories(runs) if c != "overall"] or ["overall"]
    figure, axes = plt.subplots(figsize=(7.5, 4.8))
    for color_index, category in enumerate(categories):
        color = plt.cm.tab10(color_index % 10)
        points = [
            (runs[label]["numgap"][category]["D"], runs[label]["numgap"][category]["M"], label)
            for label in labels
            if category in runs[label]["numgap"]
        ]
        axes.plot([p[0] for p in points], [p[1] for p in points], color=color, alpha=0.6)
        for d, m, label in points:
            marker = MARKERS[labels.index(label) % len(MARKERS)]
            axes.scatter(d, m, color=color, marker=marker, s=50, zorder=3, edgecolors="black")
        axes.plot([], [], color=color, label=category)
    for index, label in enumerate(labels):
        axes.scatter([], [], marker=MARKERS[index % len(MARKERS)], color="gray", label=label)
    axes.set_xlabel("NumGap-D (higher is better)")
    axes.set_ylabel("NumGap-M (less negative is better)")
    axes.set_title("Per-category trajectory across models")
    axes.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    axes.grid(alpha=0.3)
    return _save(figure, path)


def plot_mrl(runs: Results, path: Path) -> Path:
    """nDCG@10 against truncation dim per model; int8 and binary (full dim) as markers."""
    labels = [label for label, run in runs.items() if "mrl" in run]
    figure, axes = plt.subplots(figsize=(7.5, 4.2))
    all_dims = set()
    for index, label in enumerate(labels):
        color = plt.cm.tab10(index % 10)
        variants = runs[label]["mrl"]
        dims = sorted(
            int(name.removeprefix("dim_")) for name in variants if name.startswith("dim_")
        )
        all_dims.update(dims)
        values = [variants[f"dim_{d}"]["ndcg_at_10"] for d in dims]
        axes.plot(dims, values, marker="o", color=color, label=label)
        for name, marker in (("int8", "^"), ("binary", "x")):
            if name in variants and dims:
                axes.scatter(dims[-1], variants[name]["ndcg_at_10"], marker=marker, s=70,
                             color=color, zorder=3)  # fmt: skip
    # Marker key, in gray: what each shape means for every model.
    for name, marker in (("float32", "o"), ("int8 (full dim)", "^"), ("binary (full dim)", "x")):
        axes.scatter([], [], marker=marker, color="gray", label=name)
    axes.set_xscale("log", base=2)
    axes.set_xticks(sorted(all_dims), [str(d) for d in sorted(all_dims)])
    axes.minorticks_off()
    axes.set_xlabel("dimensions (MRL truncation, re-normalised)")
    axes.set_ylabel("FinanceBench nDCG@10")
    axes.set_title("MRL truncation and quantization")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(figure, path)


def plot_validation(runs: Results, path: Path) -> Path:
    """Held-out alignment ||s(x) - t(x)|| and the student's perturbation distance Delta_s against
    the training step, one line per trained model (`run["validation"]`: rows with "step" and the
    `val/*` metrics); the teacher's Delta_t dashed, from the first model (the same validation
    passages for all)."""
    labels = [label for label, run in runs.items() if run.get("validation")]
    figure, (align, delta) = plt.subplots(1, 2, figsize=(11, 4.2))
    for index, label in enumerate(labels):
        color = plt.cm.tab10(index % 10)
        rows = sorted(runs[label]["validation"], key=lambda row: row["step"])
        steps = [row["step"] for row in rows]
        align.plot(steps, [row["val/align_x"] for row in rows], marker="o", color=color,
                   label=label)  # fmt: skip
        delta.plot(steps, [row["val/delta_s"] for row in rows], marker="o", color=color,
                   label=label)  # fmt: skip
        if index == 0:
            delta.plot(steps, [row["val/delta_t"] for row in rows], linestyle="--", color="gray",
                       label="teacher Delta_t")  # fmt: skip
    align.set_xlabel("step")
    align.set_ylabel("held-out ||s(x) - t(x)||")
    align.set_title("Alignment to the teacher")
    delta.set_xlabel("step")
    delta.set_ylabel("held-out 1 - cos(f(x), f(pi x))")
    delta.set_title("Perturbation distance Delta_s")
    values = [row[key] for label in labels for row in runs[label]["validation"]
              for key in ("val/delta_s", "val/delta_t")]  # fmt: skip
    if min(values) > 0 and max(values) > 20 * min(values):  # objectives that differ 100-fold
        delta.set_yscale("log")
    for axes in (align, delta):
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
    return _save(figure, path)


def plot_all(results: Results, out_dir: str | Path) -> list[Path]:
    """Writes every figure whose task appears in some results dict.

    Args:
      results: {label: results dict of `caliber_jax.evaluate`}, in plotting order.
      out_dir: folder for the PNGs (created).

    Returns:
      The PNG paths written.
    """
    if not results:
        raise ValueError("plot_all needs at least one results dict")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    has = {task: any(task in run for run in results.values()) for task in ("financebench",
           "numgap", "mrl")}  # fmt: skip
    written = []
    if has["financebench"]:
        written.append(plot_retrieval(results, out_dir / "retrieval_ndcg.png"))
    if has["numgap"]:
        written.append(plot_numgap_bars(results, out_dir / "numgap_d.png", metric="D"))
        written.append(plot_numgap_bars(results, out_dir / "numgap_m.png", metric="M"))
        written.append(plot_trajectory(results, out_dir / "numgap_trajectory.png"))
    if has["mrl"]:
        written.append(plot_mrl(results, out_dir / "mrl.png"))
    if any(run.get("validation") for run in results.values()):
        written.append(plot_validation(results, out_dir / "validation.png"))
    return written


def load_results(paths: Sequence[str | Path]) -> dict[str, dict[str, Any]]:
    """{label: results} from results JSON files, in order; label = the file's "label" field,
    else its stem. Two files with one label fail."""
    runs = {}
    for path in paths:
        results = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(results, dict):
            raise ValueError(f"{path}: expected a JSON object of results")
        label = results.get("label") or Path(path).stem
        if label in runs:
            raise ValueError(f"{path}: label {label!r} is already used by another results file")
        runs[label] = results
    return runs


def _define_flags() -> None:
    """Defined only when run as a script, so that tests can import `plots` freely."""
    flags.DEFINE_list("results", None, "Results JSON files, in plotting order.", required=True)
    flags.DEFINE_string("output_dir", None, "Folder for the PNGs.", required=True)


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    for path in plot_all(load_results(flags.FLAGS.results), flags.FLAGS.output_dir):
        print(path)


if __name__ == "__main__":
    _define_flags()
    app.run(main)
