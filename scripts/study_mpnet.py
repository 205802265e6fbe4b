"""The paper-shaped study, run by `scripts/study.py --preset mpnet`; resumable.

    python scripts/study.py --preset mpnet --filings data/financebench/filings.jsonl.gz \
        --seeds 0,1

Teacher all-mpnet-base-v2 (PyTorch backend), student the full all-MiniLM-L6-v2 with a LEAF W_out
384 -> 768 (`configs/study_mpnet.py`) or aligned to the teacher truncated to 384 dims
(`configs/study_mpnet.py:trunc384`, whose teacher stores are derived from the 768-d ones, not
re-encoded). Every stage skips what is already done (prepared data, finished teacher chunks,
checkpoints, result files), so rerunning the command continues where a killed run stopped.
`<output>/study.json` and `study.md` are rewritten after every evaluation, so they always hold
what has been measured so far.

A run folder does not outlive its machine and the study takes many CPU hours, so every finished
evaluation (`results/<model>/<tasks>.json`) and the study state are also recorded under `--record`
(default `records/study_mpnet/`, tracked in git) and restored from there on the next run: a model
whose evaluations are all recorded is not trained or evaluated again. Each record carries its
provenance (`caliber_jax/provenance.py`: commit, config hash, data hash, machine, date); a model
is restored only when every one of its records has this run's config hash (the resolved training
config and the evaluation arguments, paths by name) and data hash (the bytes of FinanceBench and
NumGap), and the run names each refused record in one line. Records older than these fields are
refused unless `--restore_unverified`, then marked "restored, provenance unknown"; `--recompute`
ignores every record. A result an earlier run left in the output folder counts as done only
while its hashes are this run's (and, with `--recompute`, only when computed, not restored):
else it is moved to `<name>.stale`, with one line, and restored or computed again. The tables
mark each restored row, and the run ends with the rows computed now and those restored.
"""

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import fetch_mpnet  # noqa: E402  (scripts/ is on sys.path when study.py runs)
from stages import (  # noqa: E402
    Stage,
    drop_stale,
    keep_recorded,
    record_file,
    resolve_config,
    restore_result,
    run_stages,
    stamp_result,
    with_seed_means,
)

from caliber_jax import evaluate, paths, provenance  # noqa: E402
from caliber_jax.eval import plots, significance  # noqa: E402
from configs import study_mpnet  # noqa: E402

CONFIG = "configs/study_mpnet.py"
TEACHER_DIM = 768
STUDENT_WIDTH = 384
EVAL_MAX_LENGTH = 256  # one token limit for every model (MiniLM's own; mpnet's is 384)
MRL_DIMS = "768,512,384,256,128,64"
# Task groups, each evaluated into its own file (a killed run keeps every finished group);
# financebench and mrl share one process, which encodes the FinanceBench texts once for both.
TASKS_TEACHER = ("financebench,mrl", "numgap")
TASKS_STUDENT = ("financebench,mrl", "numgap", "asymmetric")
RunFn = Callable[[str, list[str], dict[str, float]], None]


slug = evaluate.slug


def students(seeds: list[int], *, long: bool = False) -> list[tuple[str, str, float | None, int]]:
    """(label, config variant, lambda, seed) in the order they train.

    The main pair, LEAF and Caliber from the least-squares W_out ("lp"), for every seed, the first
    seed's first; then, for the first seed only, the numeric objective (its lambda is the
    variant's own, None here), the pair aligned to the teacher cut to 384 dims, and LEAF from a
    random W_out (run 2026-11-25, recorded). `long`: only the main pair, for every seed, on the
    `long` variant's data and length.
    """
    if long:
        return [(f"{name} lp long s{seed}", "long", lam, seed)
                for seed in seeds for name, lam in (("LEAF", 0.0), ("Caliber", 0.5))]  # fmt: skip
    first = seeds[0]
    runs = [(f"LEAF lp s{first}", "", 0.0, first), (f"Caliber lp s{first}", "", 0.5, first),
            (f"Numeric lp s{first}", "numeric", None, first),
            (f"LEAF t384 s{first}", "trunc384", 0.0, first),
            (f"Caliber t384 s{first}", "trunc384", 0.5, first)]  # fmt: skip
    for seed in seeds[1:]:
        runs += [(f"LEAF lp s{seed}", "", 0.0, seed), (f"Caliber lp s{seed}", "", 0.5, seed)]
    return [*runs, (f"LEAF s{first}", "xavier", 0.0, first)]


def lacks_per_query(path: Path, tasks: str) -> bool:
    """A FinanceBench or NumGap results file written before per-query (per-record) values were
    saved (re-evaluated when its model is still on disk, so that the paired tests cover it)."""
    paired_tasks = {task for task, _ in significance.PAIRED}
    paired = [task for task in tasks.split(",") if task in paired_tasks]
    saved = json.loads(path.read_text()).get(significance.PER_QUERY, {})
    return any(task not in saved for task in paired)


def validation_curve(metrics: Path) -> list[dict[str, float]]:
    """The `val/*` rows of a training run's metrics.jsonl, one per step in step order (a resumed
    run may have logged a step twice: the later row wins)."""
    rows = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        val = {key: value for key, value in row.items() if key.startswith("val/")}
        if val:
            rows[row["step"]] = {"step": row["step"], **val}
    return [rows[step] for step in sorted(rows)]


def derive_neighbours(data: Path, data_nb: Path, *, k: int) -> None:
    """The training passages with a BM25 topical neighbour each (`prepare.mine_neighbours`, over
    the training passages only), for the `numeric` variant. The texts are the same, so the
    teacher stores and the validation split are `data`'s own (linked, not re-encoded)."""
    from caliber_jax import prepare
    from caliber_jax.data import corpus

    data_nb.mkdir(parents=True, exist_ok=True)
    for name in ("val.jsonl", "teacher_train", "teacher_val"):
        link = data_nb / name
        if not link.exists() and (data / name).exists():
            link.symlink_to(data / name)
    if (data_nb / "train.jsonl").is_file():
        return
    records = corpus.load_jsonl(data / "train.jsonl")
    neighbours = prepare.mine_neighbours([r["text"] for r in records], k=k)
    rows = [{**r, "neighbour": n} for r, n in zip(records, neighbours, strict=True)]
    corpus.save_jsonl(data_nb / "train.jsonl", rows)  # atomic: present means complete


def write_initial(
    output: Path, *, init_dir: str, out_dim: int | None, seed: int, max_length: int
) -> Path:
    """Exports the untrained student (MiniLM + the seed's fresh W_out) as an HF directory."""
    from caliber_jax import tokenization
    from caliber_jax.models import embedding, hf

    if (output / "modules.json").is_file():
        return output
    spec = embedding.read_spec(init_dir, pooling="mean", num_layers=None, out_dim=out_dim)
    flat = embedding.load_flat_params(init_dir, spec, seed=seed)  # what train.py starts from
    source = hf.read_safetensors(init_dir)
    passthrough = {
        k.removeprefix("bert."): v
        for k, v in source.items()
        if k.removeprefix("bert.").startswith("pooler.")
    }
    embedding.save_pretrained(
        output,
        spec,
        flat,
        tokenizer=tokenization.load_tokenizer(init_dir),
        max_seq_length=max_length,
        passthrough=passthrough,
    )
    return output


def derive_truncated(
    data: Path, data_384: Path, run: RunFn, common: list[str], times: dict[str, float]
) -> None:
    """Teacher stores for the trunc384 variant: the 768-d vectors cut to 384 and re-normalised."""
    from caliber_jax.data import pipeline, teacher

    data_384.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        link = data_384 / f"{split}.jsonl"
        if not link.exists():
            link.symlink_to(data / f"{split}.jsonl")
        if (data_384 / f"teacher_{split}" / "px" / "metadata.json").is_file() and not any(
            teacher.pending_ranges(data_384 / f"teacher_{split}" / name) for name in ("x", "px")
        ):
            continue
        texts, perturbed = pipeline.load_passages(data / f"{split}.jsonl")
        args = [f"--splits={split}", "--teacher_name=all-mpnet-base-v2[:384] (from 768-d store)"]
        for name, rows in (("x", texts), ("px", perturbed)):
            reader = teacher.open_reader(
                data / f"teacher_{split}" / name, expect_rows=len(rows), expect_dim=TEACHER_DIM
            )
            # Rows of empty texts (no perturbation) are zero and stay zero through the import.
            vectors = reader[np.arange(len(rows))]
            np.save(data_384 / f"teacher_{split}_{name}_768.npy", vectors)
            args.append(f"--import_{name}={data_384 / f'teacher_{split}_{name}_768.npy'}")
        run(
            f"teacher vectors 384 ({split})",
            [
                "-m",
                "caliber_jax.embed_teacher",
                f"--config={REPO / CONFIG}:trunc384",
                *common,
                f"--config.data.dir={data_384}",
                *args,
            ],
            times,
        )


def add_times(once: dict[str, float], into: dict[str, float], *, fresh: set[str]) -> None:
    """Adds the wall times of one invocation's stages to the study's record.

    A stage resumed from its own partial output (a later run on the same machine) adds to
    its latest entry: one stage, run in pieces. A stage in `fresh` started from nothing although
    the record already has a time for it (a new machine without the old `runs/`, where the
    teacher is encoded again) gets an entry of its own, "<stage> (run 2)", 3, ..., so the record
    keeps what one run of it costs.
    """
    for stage, seconds in once.items():
        runs = [stage] + [f"{stage} (run {k})" for k in range(2, 100)]
        present = [key for key in runs if key in into]
        if not present:
            key = stage
        elif stage in fresh:
            key = runs[len(present)]
        else:
            key = present[-1]
        into[key] = round(into.get(key, 0.0) + seconds, 1)


def run_study(args, run_stage: RunFn, *, long: bool = False) -> None:
    """The whole study; `run_stage(stage, argv, times)` runs one CLI stage as a subprocess.

    `long` (preset mpnet-long): the main LEAF/Caliber pair of every seed on the `long` variant
    (more passages, more steps), in its own output and record folders, with the teacher and the
    least-squares start as references; the short study's other models are not repeated.
    """
    name = "study_mpnet_long" if long else "study_mpnet"
    out = Path(args.output or f"runs/{name}").resolve()
    data, data_384, data_nb = out / "data", out / "data_384", out / "data_nb"
    common = [f"--config.prepare.input={Path(args.filings).resolve()}"] if args.filings else []
    base_config = f"--config={REPO / CONFIG}" + (":long" if long else "")
    config_args = [base_config, f"--config.data.dir={data}", *common]
    seeds = [int(s) for s in args.seeds.split(",")]
    record_dir = REPO / "records" / name if args.record is None else args.record
    record = Path(record_dir).resolve() if record_dir else None
    recompute = getattr(args, "recompute", False)
    restore_unverified = getattr(args, "restore_unverified", False)
    state_path = out / "study.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    recorded_path = None if record is None else record / "study.json"
    recorded_state = (
        json.loads(recorded_path.read_text())
        if recorded_path is not None and recorded_path.is_file() and not recompute
        else {}
    )
    # Wall times are a record of what each stage cost where it ran, kept across machines; the
    # results are rebuilt from the result files, restored one model at a time (`restore_model`).
    times: dict[str, float] = state.get("times", recorded_state.get("times", {}))
    results: dict[str, dict] = state.get("results", {})

    def run(stage: str, argv: list[str], times: dict[str, float], *, fresh: bool = False) -> None:
        once: dict[str, float] = {}
        run_stage(stage, argv, once)
        add_times(once, times, fresh={stage} if fresh else set())

    def save() -> None:
        stats = (
            json.loads((data / "stats.json").read_text()) if (data / "stats.json").is_file() else {}
        )
        # Atomic: a run killed mid-write must leave a state the next run can resume from.
        paths.write_text_whole(
            state_path, json.dumps({"results": results, "times": times, "data": stats}, indent=2)
        )
        models, paired = with_seed_means(results)
        table = evaluate.format_markdown(models) + paired
        timing = "\n".join(f"| {stage} | {seconds:.0f} |" for stage, seconds in times.items())
        report = (
            f"{table}\n\n## Wall-clock (s)\n\n| stage | seconds |\n| --- | --- |\n{timing}\n\n"
            f"{provenance.format_table(results)}"
        )
        paths.write_text_whole(out / "study.md", report)
        for path in (state_path, out / "study.md"):
            record_file(path, out, record)

    def draw() -> list[Path]:
        # After every student (and the first one's start), so a study stopped part way has its
        # figures up to date.
        figures = plots.plot_all(results, out / "figures")
        for figure in figures:
            record_file(figure, out, record)  # records/study_mpnet*/figures/
        return figures

    start = time.perf_counter()
    mpnet_dir = fetch_mpnet.fetch(
        REPO / fetch_mpnet.DEFAULT_OUTPUT, wheel_dir=REPO / f"{fetch_mpnet.DEFAULT_OUTPUT}.wheels"
    )
    times.setdefault("fetch mpnet", round(time.perf_counter() - start, 1))
    if not (data / "stats.json").is_file():
        run("prepare", ["-m", "caliber_jax.prepare", *config_args], times, fresh=True)
    save()

    numgap_path = data / "numgap_test.jsonl"
    # Every recorded NumGap result was scored on the recorded records. A rebuild can differ (BM25
    # ties were once broken in an unspecified order; docs/history.md, 2026-11-26): it stays, the
    # run says so, and the results scored on the recorded set fail the data hash (not restored).
    differs = keep_recorded(numgap_path, out, record)
    if differs:
        print(f"study: {differs}", flush=True)
    eval_common = [
        f"--financebench={args.financebench}",
        f"--numgap={numgap_path}",
        f"--max_length={EVAL_MAX_LENGTH}",
        f"--mrl_dims={MRL_DIMS}",
    ]
    teacher_args = ["--teacher", str(mpnet_dir), "--teacher_backend=torch"]
    data_hash = provenance.data_hash([args.financebench, numgap_path])
    row_configs: dict[str, str] = {}  # label -> hash of what makes the model (resolved config)
    said: set[str] = set()  # models whose refused records the run has named

    def result_path(label: str, tasks: str) -> Path:
        return out / "results" / slug(label) / f"{tasks.replace(',', '+')}.json"

    def config_hash(label: str, tasks: str) -> str:
        if label not in row_configs:
            row_configs[label] = provenance.config_hash(row_config(label))
        eval_args = [*eval_common, *teacher_args, tasks]
        return provenance.config_hash({"model": row_configs[label], "eval": eval_args})

    def drop_stale_results(label: str, groups: tuple[str, ...]) -> bool:
        """Sets aside the results of `label` an earlier run left in the run folder that this run
        must not use (`stages.stale_result`: another data or config hash, no provenance, or
        restored when `--recompute`); True when any was."""
        dropped = [
            drop_stale(result_path(label, tasks), out, config=config_hash(label, tasks),
                       data=data_hash, who="study", recompute=recompute,
                       restore_unverified=restore_unverified)
            for tasks in groups if result_path(label, tasks).is_file()
        ]  # fmt: skip
        return any(dropped)

    def restore_model(label: str, groups: tuple[str, ...]) -> bool:
        """Restores every recorded result of `label` when each one's hashes are this run's
        (else none: a model's rows all come from one run); True when all are now present."""
        if drop_stale_results(label, groups):
            results.pop(label, None)  # the state's row came from those files: rebuilt from files
        files = [result_path(label, tasks) for tasks in groups]
        if all(path.is_file() for path in files):
            return True
        if recompute or record is None:
            return False
        if any(not path.is_file() and not (record / path.relative_to(out)).is_file()
               for path in files):  # fmt: skip
            return False
        refused = [
            provenance.check(json.loads((record / path.relative_to(out)).read_text()),
                             config=config_hash(label, tasks), data=data_hash,
                             restore_unverified=restore_unverified)
            for path, tasks in zip(files, groups, strict=True) if not path.is_file()
        ]  # fmt: skip
        if any(refused):
            if label not in said:
                reason = next(reason for reason in refused if reason)
                print(f"study: {label} not restored: {reason}; computing it", flush=True)
                said.add(label)
            return False
        for path, tasks in zip(files, groups, strict=True):
            restore_result(path, out, record, config=config_hash(label, tasks), data=data_hash,
                           who="study", restore_unverified=restore_unverified)  # fmt: skip
        print(f"study: {label} restored from {record}", flush=True)
        # What the recorded state kept beside the results (training summary, validation curve).
        for key in ("train_summary", "validation"):
            if key in recorded_state.get("results", {}).get(label, {}):
                results.setdefault(label, {})[key] = recorded_state["results"][label][key]
        return True

    def evaluate_model(label: str, model_args: list[str], tasks: str) -> None:
        path = result_path(label, tasks)
        drop_stale_results(label, (tasks,))  # its row's keys are replaced by the new file's
        model_dir = Path(model_args[model_args.index("--model") + 1])
        again = path.is_file() and lacks_per_query(path, tasks) and model_dir.exists()
        if not path.is_file() or again:
            run(
                # A re-evaluation's wall time is kept apart from the first one's.
                f"{'re-evaluate' if again else 'evaluate'} {label} ({tasks})",
                [
                    "-m",
                    "caliber_jax.evaluate",
                    *model_args,
                    f"--label={label}",
                    f"--tasks={tasks}",
                    *eval_common,
                    f"--output={path}",
                ],
                times,
            )
        loaded = stamp_result(path, config=config_hash(label, tasks), data=data_hash)
        record_file(path, out, record)
        # Each file's per-query values join the model's others (financebench's, numgap's), and
        # its provenance the others' (one block per task group).
        per_query = results.get(label, {}).get(significance.PER_QUERY, {})
        per_query = {**per_query, **loaded.pop(significance.PER_QUERY, {})}
        blocks = {
            **results.get(label, {}).get(provenance.KEY, {}),
            tasks: loaded.pop(provenance.KEY),
        }
        results.setdefault(label, {}).update(loaded)
        results[label][provenance.KEY] = blocks
        if per_query:
            results[label][significance.PER_QUERY] = per_query
        save()

    init_dir = study_mpnet.get_config().model.init_dir
    data_dirs = {"": data, "xavier": data, "trunc384": data_384, "numeric": data_nb, "long": data}

    def train_argv(label: str, variant: str, lam: float | None, seed: int) -> list[str]:
        config = f"--config={REPO / CONFIG}" + (f":{variant}" if variant else "")
        return [
            "-m",
            "caliber_jax.train",
            config,
            f"--config.data.dir={data_dirs[variant]}",
            *common,
            *([f"--config.loss.lam={lam}"] if lam is not None else []),
            f"--config.seed={seed}",
            f"--workdir={out / slug(label)}",
        ]

    def trained(label: str) -> bool:
        return (out / slug(label) / "summary.json").is_file()

    def row_config(label: str) -> dict:
        """Everything that makes model `label` (paths by name), hashed into its records."""
        if label == "Teacher":
            return {"teacher": mpnet_dir.name, "backend": "torch"}
        if label == initial_lp:
            return {"start of": row_config(first_lp), "interpolate": 0}
        for run_label, variant, lam, seed in runs:
            if run_label == label:
                argv = train_argv(label, variant, lam, seed)[2:-1]  # no -m module, no workdir
                return {"train": resolve_config(argv).to_dict()}
        initial = {f"Initial{suffix} s{seeds[0]}": dim for suffix, dim in initial_dims}
        return {"initial": init_dir, "out_dim": initial[label], "seed": seeds[0],
                "max_length": EVAL_MAX_LENGTH}  # fmt: skip

    untrained = []
    initial_dims = () if long else (("", TEACHER_DIM), (" t384", None))
    for suffix, out_dim in initial_dims:
        label = f"Initial{suffix} s{seeds[0]}"
        hf_dir = write_initial(
            out / slug(label) / "hf",
            init_dir=init_dir,
            out_dim=out_dim,
            seed=seeds[0],
            max_length=EVAL_MAX_LENGTH,
        )
        untrained.append((label, ["--model", str(hf_dir), *teacher_args], TASKS_STUDENT))
    # MPNet on CPU is the slow one: last in each round, after the MiniLM students.
    untrained.append(("Teacher", ["--model", str(mpnet_dir), "--backend=torch"], TASKS_TEACHER))
    # Retrieval of every untrained model first, then NumGap, then the asymmetric mode.
    runs = students(seeds, long=long)
    # The untrained student with the least-squares W_out (`initial_lp`): the first lp student's
    # start, exported from its workdir with `--interpolate 0` (the fit is the same for every seed
    # and objective).
    first_lp = runs[0][0]
    initial_lp = first_lp.replace("LEAF", "Initial")
    for label, _, groups in untrained:
        restore_model(label, groups)
    for group in range(len(TASKS_STUDENT)):
        for label, model_args, groups in untrained:
            if group < len(groups):
                evaluate_model(label, model_args, groups[group])

    def finished(label: str) -> bool:
        return restore_model(label, TASKS_STUDENT)

    pending = [item for item in runs if not finished(item[0])]
    # After the evaluations that need no teacher vectors, so a short run measures those;
    # not at all once every student is evaluated (a restored study re-encodes nothing).
    if pending:
        fresh = not (data / "teacher_train").exists()  # else it resumes its own store
        run(
            "teacher vectors",
            ["-m", "caliber_jax.embed_teacher", *config_args],
            times,
            fresh=fresh,
        )
        save()
    variants = {variant for _, variant, _, _ in pending}
    if "trunc384" in variants:
        derive_truncated(data, data_384, run, common, times)
    if "numeric" in variants:
        k = study_mpnet.get_config("numeric").prepare.neighbour_k
        derive_neighbours(data, data_nb, k=k)
    # Students still to train, `--jobs` at a time, each on its own share of the cores: one
    # training keeps two cores only ~1.3x busier than one (single-threaded fusions, the input
    # pipeline), so two side by side finish a pair ~1.5x sooner (docs/history.md, 2026-11-26).
    untrained_runs = [item for item in pending if not trained(item[0])]
    jobs = getattr(args, "jobs", 1)
    if jobs > 1 and len(untrained_runs) > 1:
        plan = [Stage(f"train {item[0]}", tuple(train_argv(*item))) for item in untrained_runs]
        fresh = {
            stage.name
            for stage, item in zip(plan, untrained_runs, strict=True)
            if not (out / slug(item[0]) / "checkpoints").exists()
        }
        once: dict[str, float] = {}
        run_stages(plan, once, cwd=REPO, jobs=jobs, log_dir=out / "logs", pin_cores=True)
        add_times(once, times, fresh=fresh)
        save()
    for label, variant, lam, seed in runs:
        workdir = out / slug(label)
        if not finished(label):
            if not trained(label):
                fresh = not (workdir / "checkpoints").exists()
                run(f"train {label}", train_argv(label, variant, lam, seed), times, fresh=fresh)
            run(
                f"export {label}",
                ["-m", "caliber_jax.export", f"--workdir={workdir}", f"--output={workdir / 'hf'}"],
                times,
            )
        for tasks in TASKS_STUDENT:
            evaluate_model(label, ["--model", str(workdir / "hf"), *teacher_args], tasks)
        summary, metrics = workdir / "summary.json", workdir / "metrics.jsonl"
        if summary.is_file():
            results[label]["train_summary"] = json.loads(summary.read_text())
        if metrics.is_file():
            results[label]["validation"] = validation_curve(metrics)  # validation.png
        save()
        if label == first_lp:
            start_dir = out / slug(initial_lp) / "hf"
            if not finished(initial_lp):
                run(
                    f"export {initial_lp}",
                    ["-m", "caliber_jax.export", f"--workdir={workdir}", f"--output={start_dir}",
                     "--interpolate=0"],
                    times,
                )  # fmt: skip
            for tasks in TASKS_STUDENT:
                evaluate_model(initial_lp, ["--model", str(start_dir), *teacher_args], tasks)
        figures = draw()
    print((out / "study.md").read_text())
    print("figures: " + ", ".join(str(f) for f in figures))
    for line in provenance.summary_lines(results, prefix="study"):
        print(line, flush=True)
