"""Resumable sweep of numeric objectives: objective x lambda x margin x perturb_weight.

    python scripts/sweep.py --output runs/sweep --grid screen      # short points first
    python scripts/sweep.py --output runs/sweep --grid frontier    # >= 1,000 steps each

Every point trains all-MiniLM-L6-v2 calibrating itself (`configs/numeric.py`: the student is the
teacher at full depth) with the user-facing CLIs (train, export, evaluate), then scores it on the
NumGap *dev* set (held-out documents; selection never sees the test set) per category and on
FinanceBenchRetrieval. A finished point leaves `<output>/points/<name>.json` and is skipped on the
next run; an unfinished one resumes from its Orbax checkpoint. After every point the script
rewrites `<output>/summary.json` (all points, the Pareto front of NumGap-D vs nDCG@10) and
`<output>/pareto.png`. Data (prepare + teacher vectors) is built once into `config.data.dir` if
missing. `--test NAME` scores finished points on the NumGap test set as well, for the report.

Derived points cost no training: `--checkpoints 600,800` also scores each trained point at those
mid-run steps (`<name>_at600`: its checkpoints are kept through `config.keep_period`), and
`--interpolate 0.5,0.7` scores weight-space blends of the final model with the initial student
(`<name>_w0.5`: `caliber_jax.export --interpolate`). Both are dev points like any other.

Finished points are also recorded under `--record` (default `records/sweep/`, tracked in git): a run
directory does not outlive its machine, a point takes hours on a CPU, so a later run (another
machine, a fresh clone) restores the recorded points into `<output>/points/` and skips them. Their
trained models are not recorded: `--test` on a restored point needs its model directory. A point
is restored only when its recorded config hash (the resolved config with the point's overrides
and the evaluation arguments) and data hash (FinanceBench and the NumGap split) are this run's
(`caliber_jax/provenance.py`); records older than these fields are refused unless
`--restore_unverified`, then marked "restored, provenance unknown"; `--recompute` ignores every
record. A point (or test score) an earlier run left in `<output>` is skipped only while its
hashes are this run's (and, with `--recompute`, only when computed, not restored): else it is
moved to `<name>.json.stale`, with one line, and restored or computed again. The tables mark
restored points, and the run ends with the points computed now and those restored.
"""

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from stages import (  # noqa: E402
    config_value,
    drop_stale,
    record_file,
    resolve_config,
    restore_result,
    stamp_result,
)

from caliber_jax import provenance  # noqa: E402

FINANCEBENCH = REPO / "data/sample/financebench_open_source.jsonl.gz"


@dataclasses.dataclass(frozen=True)
class Point:
    """One trained sweep point: the loss objective and its weights, the learning rate and the
    steps (the schedule's length)."""

    objective: str
    lam: float
    margin: float
    perturb_weight: float
    lr: float
    steps: int
    structure_weight: float = 0.0  # losses.structure_loss (0: off)

    @property
    def name(self) -> str:
        """A file-name-safe, unique name (points without a structure term keep their old names)."""
        name = f"{self.objective}_l{self.lam:g}_m{self.margin:g}_pw{self.perturb_weight:g}"
        if self.structure_weight:
            name += f"_sw{self.structure_weight:g}"
        return f"{name}_lr{self.lr:g}_s{self.steps}"

    def overrides(self) -> list[str]:
        """Config overrides (`--config.*`) that train this point."""
        return [
            f"--config.loss.objective={self.objective}",
            f"--config.loss.lam={self.lam}",
            f"--config.loss.margin={self.margin}",
            f"--config.loss.perturb_weight={self.perturb_weight}",
            f"--config.loss.structure_weight={self.structure_weight}",
            f"--config.optim.lr={self.lr}",
            f"--config.total_steps={self.steps}",
        ]

    def params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# "teacher" (the untrained model) is scored before every grid.
GRIDS: dict[str, list[Point]] = {
    # The paper's recipes calibrating the model (one epoch, the paper's length): LEAF (lambda 0)
    # and eq. 4 (lambda 0.5, m 0.05): the LEAF and Caliber rows of docs/numeric.md.
    "paper": [
        Point("caliber", 0.0, 0.05, 1.0, 1e-4, 100),
        Point("caliber", 0.5, 0.05, 1.0, 1e-4, 100),
    ],
    "screen": [
        Point("neighbour", 8.0, 0.1, 0.0, 1e-4, 100),
        Point("absolute", 4.0, 0.5, 0.0, 1e-4, 100),
        Point("neighbour", 2.0, 0.05, 0.0, 1e-4, 100),
        Point("neighbour", 8.0, 0.1, 1.0, 1e-4, 100),
    ],
    "frontier": [
        Point("neighbour", 8.0, 0.1, 0.0, 1e-4, 1000),
        # A quarter of the numeric weight: the alignment of x holds the student 4x harder.
        Point("neighbour", 2.0, 0.1, 0.0, 1e-4, 1000),
    ],
    # The frontier point plus in-batch similarity preservation (losses.structure_loss): the
    # frontier's students lose retrieval on the document side (docs/numeric.md).
    "structure": [
        Point("neighbour", 8.0, 0.1, 0.0, 1e-4, 1000, structure_weight=50.0),
    ],
    # The whole path in about a minute on the bundled sample, for the tests.
    "smoke": [Point("neighbour", 2.0, 0.05, 0.0, 5e-5, 2)],
}


def derived_points(
    name: str, steps: int, checkpoints: Sequence[int], alphas: Sequence[float]
) -> list[tuple[str, int | None, float | None]]:
    """(name, checkpoint step, interpolation alpha) of the points derived from trained point
    `name` without training: each listed step before its last, then each blend of its final
    model."""
    derived = [(f"{name}_at{step}", step, None) for step in checkpoints if 0 < step < steps]
    derived += [(f"{name}_w{alpha:g}", None, alpha) for alpha in alphas]
    return derived


def keep_period(checkpoints: Sequence[int]) -> int:
    """The `config.keep_period` that keeps every listed step (their gcd; 0 = none listed)."""
    return math.gcd(*checkpoints) if checkpoints else 0


def scores(results: Mapping[str, Any]) -> dict[str, float]:
    """Flat scores of one `caliber_jax.evaluate` results dict: D/M overall and per category,
    and every FinanceBench metric (`fb/<metric>`)."""
    flat = {}
    for category, values in results.get("numgap", {}).items():
        flat[f"D/{category}"] = values["D"]
        flat[f"M/{category}"] = values["M"]
    for metric, value in results.get("financebench", {}).items():
        flat[f"fb/{metric}"] = value
    return flat


def pareto_front(points: Sequence[Mapping[str, Any]], *, x: str, y: str) -> list[str]:
    """Names of the points no other point beats on both `x` and `y` (higher is better for both),
    ordered by `x`. Ties on both keep every tied point."""
    front = []
    for point in points:
        px, py = point["scores"][x], point["scores"][y]
        dominated = any(
            other["scores"][x] >= px
            and other["scores"][y] >= py
            and (other["scores"][x] > px or other["scores"][y] > py)
            for other in points
        )
        if not dominated:
            front.append(point)
    return [point["name"] for point in sorted(front, key=lambda point: point["scores"][x])]


def point_hashes(
    names: Sequence[str], common: list[str], common_eval: list[str], teacher_dir: str
) -> dict[str, str]:
    """The config hash of every point in `names` that this code can make: the teacher, a point
    of a grid (its resolved config), or one derived from such a point (`<name>_at<step>`,
    `<name>_w<alpha>`). A name no grid knows any more is left out."""
    eval_args = [*common_eval, "--tasks=financebench,numgap"]
    points = {point.name: point for grid in GRIDS.values() for point in grid}
    bases: dict[str, dict] = {}

    def base(name: str) -> dict:
        if name not in bases:
            config = resolve_config([*common, *points[name].overrides()]).to_dict()
            bases[name] = {"train": config, "eval": eval_args}
        return bases[name]

    hashes = {}
    for name in names:
        head, _, tail = name.rpartition("_")
        if name == "teacher":
            row = {"teacher": teacher_dir, "eval": eval_args}
        elif name in points:
            row = base(name)
        elif head in points and tail[:2] == "at" and tail[2:].isdigit():
            row = {"of": base(head), "step": int(tail[2:])}
        elif head in points and tail[:1] == "w":
            row = {"of": base(head), "interpolate": float(tail[1:])}
        else:
            continue
        hashes[name] = provenance.config_hash(row)
    return hashes


def restore_points(
    record: Path | None,
    out: Path,
    hashes: Mapping[str, str],
    data: str,
    *,
    restore_unverified: bool,
) -> list[str]:
    """Restores every recorded point (`points/<name>.json` with its `results/<name>.dev.json`)
    that `out` lacks and whose recorded hashes are `hashes[name]` and `data` (a hash never
    recorded: only with `restore_unverified`); returns their names. A refused or unknown point
    gets one line."""
    if record is None or not (record / "points").is_dir():
        return []
    restored = []
    for path in sorted((record / "points").glob("*.json")):
        name, target = path.stem, out / "points" / path.name
        if target.exists():
            continue
        if name not in hashes:
            print(f"sweep: {name} not restored: no grid of this code makes that point", flush=True)
            continue
        options = dict(config=hashes[name], data=data, who="sweep",
                       restore_unverified=restore_unverified)  # fmt: skip
        if restore_result(target, out, record, **options):
            dev = out / "results" / f"{name}.dev.json"
            restore_result(dev, out, record, **options)
            restored.append(name)
    return restored


def drop_stale_points(
    out: Path,
    hashes: Mapping[str, str],
    data: str,
    *,
    recompute: bool,
    restore_unverified: bool,
) -> list[str]:
    """Sets aside every point an earlier run left under `out` (`points/<name>.json`, its
    `results/<name>.dev.json`) that this run must not use (`stages.stale_result`: a data hash
    not `data`, a config hash not `hashes[name]` where this code makes the point, no provenance,
    or restored when `recompute`), one line each, so that it is restored or computed again;
    returns their names."""
    names = {path.stem for path in (out / "points").glob("*.json")}
    names |= {path.name.removesuffix(".dev.json") for path in (out / "results").glob("*.dev.json")}
    dropped = []
    for name in sorted(names):
        options = dict(config=hashes.get(name), data=data, who="sweep", recompute=recompute,
                       restore_unverified=restore_unverified)  # fmt: skip
        point, dev = out / "points" / f"{name}.json", out / "results" / f"{name}.dev.json"
        if drop_stale(point, out, **options):
            dropped.append(name)
            if dev.is_file():  # the point's own scores: computed or restored with it again
                dev.replace(dev.with_name(dev.name + ".stale"))
        elif drop_stale(dev, out, **options):
            dropped.append(name)
    return dropped


def load_points(directory: Path) -> list[dict[str, Any]]:
    """Every finished point JSON under `directory`, sorted by name."""
    return [json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))]


def summarise(points: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary: points sorted by NumGap-D, the Pareto front and the teacher reference."""
    x, y = "D/overall", "fb/ndcg_at_10"
    scored = [point for point in points if x in point["scores"] and y in point["scores"]]
    teacher = next((point for point in scored if point["name"] == "teacher"), None)
    return {
        "x": x,
        "y": y,
        "teacher": teacher["scores"] if teacher else None,
        "pareto": pareto_front(scored, x=x, y=y),
        "points": sorted(scored, key=lambda point: -point["scores"][x]),
    }


TABLE_COLUMNS = (
    ("D overall", "D/overall"), ("D magnitude", "D/magnitude"), ("D polarity", "D/polarity"),
    ("D unit", "D/unit"), ("D period", "D/period"), ("M overall", "M/overall"),
    ("nDCG@10", "fb/ndcg_at_10"), ("R@10", "fb/recall_at_10"), ("MRR@10", "fb/mrr_at_10"),
    ("MAP@10", "fb/map_at_10"), ("nDCG@100", "fb/ndcg_at_100"), ("R@100", "fb/recall_at_100"),
)  # fmt: skip


def format_table(summary: Mapping[str, Any]) -> str:
    """The sweep as a markdown table (what docs/numeric.md shows), best NumGap-D first; Pareto
    points in bold."""
    header = ["point", "steps", *(title for title, _ in TABLE_COLUMNS), "train s", "eval s"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for point in summary["points"]:
        name = point["name"]
        shown = name + provenance.mark(point)
        cells = [f"**{shown}**" if name in summary["pareto"] else shown,
                 str(point["params"].get("steps", 0))]  # fmt: skip
        cells += [f"{point['scores'][key]:.4f}" if key in point["scores"] else "-"
                  for _, key in TABLE_COLUMNS]  # fmt: skip
        times = point.get("times", {})
        cells += [f"{times.get('train', 0):.0f}", f"{times.get('evaluate', 0):.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


TEST_CATEGORIES = ("overall", "magnitude", "polarity", "unit")
FB_METRICS = tuple(f"{name}_at_{k}" for k in (10, 100) for name in ("ndcg", "recall", "mrr", "map"))


def format_test_table(rows: Sequence[tuple[str, Mapping[str, Any], Mapping[str, Any]]]) -> str:
    """The report table: per row (label, dev results, test results), NumGap-D per category and
    M overall on the *test* set, then all eight FinanceBench metrics (from the dev run: retrieval
    does not depend on the NumGap split)."""
    header = ["model", *(f"D {c}" for c in TEST_CATEGORIES), "M overall",
              *(m.replace("_at_", "@") for m in FB_METRICS)]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for label, dev, test in rows:
        numgap = test["numgap"]
        # Restored in part (the dev scores or the test ones): marked as in every other table.
        shown = label + provenance.mark(
            {provenance.KEY: {"dev": dev.get(provenance.KEY), "test": test.get(provenance.KEY)}}
        )
        cells = [shown, *(f"{numgap[c]['D']:.4f}" if c in numgap else "-" for c in TEST_CATEGORIES),
                 f"{numgap['overall']['M']:.4f}",
                 *(f"{dev['financebench'][m]:.4f}" for m in FB_METRICS)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_pareto(summary: Mapping[str, Any], path: Path) -> Path:
    """NumGap-D (dev) vs FinanceBench nDCG@10, one dot per point, the front joined by a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x, y = summary["x"], summary["y"]
    colours = {"teacher": "black", "caliber": "tab:blue", "absolute": "tab:orange",
               "neighbour": "tab:green"}  # fmt: skip
    figure, axes = plt.subplots(figsize=(7, 5))
    for point in summary["points"]:
        objective = point["params"].get("objective", "teacher")
        axes.scatter(point["scores"][x], point["scores"][y], color=colours.get(objective, "grey"),
                     label=objective)  # fmt: skip
        axes.annotate(point["name"], (point["scores"][x], point["scores"][y]), fontsize=6)
    front = [p for name in summary["pareto"] for p in summary["points"] if p["name"] == name]
    axes.plot([p["scores"][x] for p in front], [p["scores"][y] for p in front], "k--", lw=0.8)
    if summary["teacher"]:
        axes.axhline(summary["teacher"][y], color="grey", lw=0.6, ls=":")
    handles, labels = axes.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    axes.legend(unique.values(), unique.keys(), fontsize=8)
    axes.set_xlabel("NumGap-D overall (dev, held-out documents)")
    axes.set_ylabel("FinanceBench nDCG@10")
    axes.set_title("Numeric objectives: all-MiniLM-L6-v2 calibrating itself")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=150)
    plt.close(figure)
    return path


def run(args: list[str], log: Path) -> float:
    """Runs `python args...` in the repo, appending its output to `log`; returns wall seconds."""
    start = time.perf_counter()
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(f"\n== {' '.join(args)}\n")
        handle.flush()
        subprocess.run([sys.executable, *args], cwd=REPO, check=True, stdout=handle,
                       stderr=subprocess.STDOUT)  # fmt: skip
    return round(time.perf_counter() - start, 1)


def evaluate_model(model: str, label: str, numgap: Path, output: Path, common_eval: list[str],
                   log: Path, tasks: str = "financebench,numgap",
                   ) -> tuple[dict[str, Any], float]:  # fmt: skip
    """`caliber_jax.evaluate` on `tasks` (one NumGap file); returns (results, seconds)."""
    seconds = run(["-m", "caliber_jax.evaluate", f"--model={model}", f"--label={label}",
                   f"--tasks={tasks}", f"--numgap={numgap}", f"--output={output}",
                   *common_eval], log)  # fmt: skip
    return json.loads(output.read_text()), seconds


def write_summary(summary: Mapping[str, Any], out: Path) -> None:
    """summary.json, sweep.md (the table) and pareto.png under `out`."""
    write_json(out / "summary.json", summary)
    (out / "sweep.md").write_text(format_table(summary))
    plot_pareto(summary, out / "pareto.png")


def write_json(path: Path, value: Any) -> None:
    """Writes JSON atomically (a killed sweep never leaves a half-written point)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(value, indent=2) + "\n")
    partial.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="runs/sweep")
    parser.add_argument("--config", default="configs/numeric.py")
    parser.add_argument("--grid", default="screen",
                        help=f"one of {sorted(GRIDS)}, comma list, '' = only --test")  # fmt: skip
    parser.add_argument("--points", default="", help="comma list: only these points of the grids")
    parser.add_argument("--overrides", default="", help="extra --config.* flags, space separated")
    parser.add_argument("--financebench", default=str(FINANCEBENCH))
    parser.add_argument("--eval_max_length", type=int, default=128,
                        help="token limit of every evaluated model (the students' training "
                        "length)")  # fmt: skip
    parser.add_argument("--record", default=str(REPO / "records" / "sweep"),
                        help="directory (tracked) where finished points are recorded and "
                        "restored from; '' = off")  # fmt: skip
    parser.add_argument("--recompute", action="store_true",
                        help="ignore every record: compute each point again")  # fmt: skip
    parser.add_argument("--restore_unverified", action="store_true",
                        help="also restore records whose config or data hash was never "
                        "recorded (marked 'provenance unknown')")  # fmt: skip
    parser.add_argument("--checkpoints", default="", help="comma list of mid-run steps to also "
                        "score for every trained point (<name>_at<step>)")  # fmt: skip
    parser.add_argument("--interpolate", default="", help="comma list of alphas: also score "
                        "alpha * final + (1 - alpha) * initial weights "
                        "(<name>_w<alpha>)")  # fmt: skip
    parser.add_argument("--test", default="", help="comma list of finished points to also score "
                        "on numgap_test.jsonl ('teacher' included)")  # fmt: skip
    args = parser.parse_args()
    checkpoints = [int(step) for step in filter(None, args.checkpoints.split(","))]
    alphas = [float(alpha) for alpha in filter(None, args.interpolate.split(","))]

    out = Path(args.output).resolve()
    log = out / "log.txt"
    out.mkdir(parents=True, exist_ok=True)
    common = [f"--config={REPO / args.config}", *args.overrides.split()]
    data = Path(config_value(common, "data.dir"))
    if not data.is_absolute():
        data = REPO / data
    common.append(f"--config.data.dir={data}")
    if not (data / "teacher_train" / "x").exists():
        run(["-m", "caliber_jax.prepare", *common], log)
        run(["-m", "caliber_jax.embed_teacher", *common], log)
    teacher_dir = str(config_value(common, "teacher.model_dir"))
    # One token limit for every model: an exported student's own limit is its training length
    # (128 here) while the teacher's is 256, and retrieval must be compared at the same one.
    common_eval = [f"--financebench={Path(args.financebench).resolve()}",
                   f"--max_length={args.eval_max_length}"]  # fmt: skip
    points_dir = out / "points"
    record = Path(args.record).resolve() if args.record else None
    restore_from = None if args.recompute else record  # --recompute: records written, not read
    financebench = Path(args.financebench).resolve()
    dev_data = provenance.data_hash([financebench, data / "numgap_dev.jsonl"])
    test_data = provenance.data_hash([financebench, data / "numgap_test.jsonl"])
    recorded = sorted(p.stem for p in restore_from.glob("points/*.json")) if restore_from else []
    present = [p.stem for p in points_dir.glob("*.json")]
    hashes = point_hashes(sorted({*recorded, *present}), common, common_eval, teacher_dir)
    # Points an earlier run left here on other data or config (or restored, with --recompute)
    # are set aside first: then restored, or computed again, like missing ones.
    drop_stale_points(out, hashes, dev_data, recompute=args.recompute,
                      restore_unverified=args.restore_unverified)  # fmt: skip
    for name in restore_points(restore_from, out, hashes, dev_data,
                               restore_unverified=args.restore_unverified):  # fmt: skip
        print(f"sweep: {name} restored from {record}", flush=True)

    grid = [point for name in filter(None, args.grid.split(",")) for point in GRIDS[name]]
    if args.points:
        grid = [point for point in grid if point.name in args.points.split(",")]
    todo: list[tuple[str, Point | None]] = [("teacher", None)]
    todo += [(point.name, point) for point in grid]

    def finish(name: str, model: str, params: dict[str, Any], times: dict[str, float]) -> None:
        """Scores `model` on the dev set and writes (and records) point `name`."""
        results, times["evaluate"] = evaluate_model(
            model, name, data / "numgap_dev.jsonl", out / "results" / f"{name}.dev.json",
            common_eval, log,
        )  # fmt: skip
        config = point_hashes([name], common, common_eval, teacher_dir)[name]
        results = stamp_result(out / "results" / f"{name}.dev.json", config=config, data=dev_data)
        path = points_dir / f"{name}.json"
        write_json(path, {"name": name, "model": model, "params": params,
                          "scores": scores(results), "times": times,
                          provenance.KEY: results[provenance.KEY]})  # fmt: skip
        for recorded in (path, out / "results" / f"{name}.dev.json"):
            record_file(recorded, out, record)
        write_summary(summarise(load_points(points_dir)), out)

    keep = [f"--config.keep_period={keep_period(checkpoints)}"] if checkpoints else []
    for name, point in todo:
        if (points_dir / f"{name}.json").exists():
            print(f"sweep: {name} done, skipped", flush=True)
        elif point is None:
            print(f"sweep: {name}", flush=True)
            finish(name, teacher_dir, {}, {})
        else:
            print(f"sweep: {name}", flush=True)
            params = point.params()
            workdir = out / "runs" / name
            times = {"train": run(["-m", "caliber_jax.train", *common, *point.overrides(),
                                   *keep, f"--workdir={workdir}"], log)}  # fmt: skip
            times["export"] = run(["-m", "caliber_jax.export", f"--workdir={workdir}",
                                   f"--output={workdir / 'hf'}"], log)  # fmt: skip
            params["train_summary"] = json.loads((workdir / "summary.json").read_text())
            finish(name, str(workdir / "hf"), params, times)
        if point is None:
            continue
        workdir = out / "runs" / name
        for derived, step, alpha in derived_points(name, point.steps, checkpoints, alphas):
            if (points_dir / f"{derived}.json").exists():
                continue
            checkpoint = workdir / "checkpoints" / str(step or point.steps)
            if not checkpoint.exists():
                print(f"sweep: {derived} skipped: no {checkpoint} (a restored point, or trained "
                      "without keep_period?)", flush=True)  # fmt: skip
                continue
            print(f"sweep: {derived}", flush=True)
            params = {**point.params(), "steps": step or point.steps,
                      "schedule_steps": point.steps, "of": name}  # fmt: skip
            flags = [f"--step={step}"] if step else [f"--interpolate={alpha}"]
            if alpha is not None:
                params["interpolate"] = alpha
            model = workdir / f"hf{derived.removeprefix(name)}"
            times = {"export": run(["-m", "caliber_jax.export", f"--workdir={workdir}", *flags,
                                    f"--output={model}"], log)}  # fmt: skip
            finish(derived, str(model), params, times)

    for name in filter(None, args.test.split(",")):
        # FinanceBench does not depend on the NumGap split: only NumGap is re-scored on test.
        point = json.loads((points_dir / f"{name}.json").read_text())
        target = out / "results" / f"{name}.test.json"
        config = point_hashes([name], common, common_eval, teacher_dir).get(name, "")
        drop_stale(target, out, config=config or None, data=test_data, who="sweep",
                   recompute=args.recompute,
                   restore_unverified=args.restore_unverified)  # fmt: skip
        restore_result(target, out, restore_from, config=config, data=test_data, who="sweep",
                       restore_unverified=args.restore_unverified)  # fmt: skip
        if not target.exists() and not Path(point["model"]).exists():
            sys.exit(f"error: {points_dir / (name + '.json')}: model {point['model']} is gone "
                     "(a restored point?); delete its record and JSON to retrain")  # fmt: skip
        if not target.exists():
            evaluate_model(point["model"], name, data / "numgap_test.jsonl", target, common_eval,
                           log, tasks="numgap")  # fmt: skip
            stamp_result(target, config=config, data=test_data)
        record_file(target, out, record)
        print(f"sweep: {name} test scores in {target}", flush=True)
        test = scores(json.loads(target.read_text()))
        print(f"{name}: test " + ", ".join(f"{k}={v:.4f}" for k, v in test.items()), flush=True)
    tested = list(filter(None, args.test.split(",")))
    if tested:
        rows = [(name, json.loads((out / "results" / f"{name}.dev.json").read_text()),
                 json.loads((out / "results" / f"{name}.test.json").read_text()))
                for name in tested]  # fmt: skip
        (out / "test.md").write_text(format_test_table(rows))
        print(f"sweep: test table of {', '.join(tested)} in {out / 'test.md'}", flush=True)
    summary = summarise(load_points(points_dir))
    write_summary(summary, out)
    for point in summary["points"]:
        s = point["scores"]
        print(f"{point['name']:55s} D={s['D/overall']:.4f} nDCG@10={s['fb/ndcg_at_10']:.4f}")
    points = {point["name"]: point for point in summary["points"]}
    for line in provenance.summary_lines(points, prefix="sweep"):
        print(line, flush=True)


if __name__ == "__main__":
    main()
