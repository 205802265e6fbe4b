"""Where a recorded result came from: git commit, config and data hashes, machine, date.

Every results file `evaluate` writes carries a `provenance` block, and the study scripts stamp
the copies they record under records/. A later run restores a recorded result only when its config
and data hashes equal the run's own (`check`); a restored result keeps its block with
`restored: true`, and `mark` puts that in every table row it reaches. Records made before these
fields existed say "unknown" for what cannot be established; they are refused unless the user
asks (`--restore_unverified`), and then marked "restored, provenance unknown" (a known hash that
differs is never restored). jax-free.
"""

import datetime
import hashlib
import json
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

KEY = "provenance"  # the block's key in a results dict
UNKNOWN = "unknown"
_CPU_FLAGS = ("avx2", "avx512f", "amx_tile", "asimd", "sve")
_REPO = Path(__file__).resolve().parents[1]


def git_commit(repo: str | os.PathLike = _REPO) -> str:
    """The checkout's HEAD commit (short), '+dirty' when files outside docs/ and records/ differ:
    tracked files edited, or new files the checkout does not ignore (a module not yet committed).
    A study writing its records into records/ does not change the code that made them, nor do
    ignored run folders and caches. UNKNOWN outside a git checkout (an installed wheel)."""
    git = dict(cwd=repo, check=True, capture_output=True, text=True)
    try:
        # Only this package's own checkout: an installed copy inside another repository (a venv
        # under someone's project) must not report that project's commit.
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], **git).stdout.strip()
        if Path(top).resolve() != Path(repo).resolve():
            return UNKNOWN
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], **git).stdout.strip()
        # Untracked files count too (`--porcelain` lists them, less what .gitignore ignores).
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=normal", "--",
                                ".", ":(exclude)docs", ":(exclude)records"],
                               **git).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return UNKNOWN
    return head + ("+dirty" if dirty else "")


def machine() -> str:
    """'<arch> <cpu flags>' from /proc/cpuinfo, plus the accelerator when jax is already loaded
    with one (this module never imports jax itself)."""
    flags = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith(("flags", "Features")):
                flags.update(line.split(":", 1)[1].split())
                break
    parts = [platform.machine(), *(flag for flag in _CPU_FLAGS if flag in flags)]
    jax = __import__("sys").modules.get("jax")
    if jax is not None:
        try:
            device = jax.devices()[0]
            if device.platform != "cpu":
                parts.append(f"{device.platform}:{device.device_kind}")
        except RuntimeError:  # no backend could start
            pass
    return " ".join(parts)


def _normalise(value: Any) -> Any:
    """Paths differ per machine and run folder: an absolute path or URL counts by its last part
    (what it holds is the data hash's business)."""
    if isinstance(value, Mapping):
        return {str(key): _normalise(value[key]) for key in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [_normalise(item) for item in value]
    if isinstance(value, str) and (value.startswith("/") or "://" in value):
        return value.rstrip("/").rsplit("/", 1)[-1]
    if isinstance(value, str) and "=/" in value:  # a flag with a path: --numgap=/x/y.jsonl
        flag, path = value.split("=", 1)
        return f"{flag}={_normalise(path)}"
    return value


def config_hash(config: Any) -> str:
    """A 16-hex sha256 of a resolved config (ConfigDict, dict or argv-like list), with absolute
    paths reduced to their last part."""
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    text = json.dumps(_normalise(config), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def data_hash(paths: Iterable[str | os.PathLike | None]) -> str:
    """A 16-hex sha256 over the bytes of the evaluation data files, in order (None skipped; a
    missing file counts by its name, so that it differs from any present one)."""
    digest = hashlib.sha256()
    for path in paths:
        if path is None:
            continue
        path = Path(path)
        digest.update(path.name.encode() + b"\0")
        if path.is_file():
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
        else:
            digest.update(b"<missing>")
    return digest.hexdigest()[:16]


def stamp(*, config: str, data: str) -> dict[str, Any]:
    """The provenance block of a result computed now, from its config and data hashes."""
    return {
        "commit": git_commit(),
        "config_hash": config,
        "data_hash": data,
        "machine": machine(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "restored": False,
    }


def check(
    recorded: Mapping[str, Any], *, config: str, data: str, restore_unverified: bool
) -> str | None:
    """Why a recorded result must not be restored into a run with these hashes, or None (one
    line, for the caller to print).

    A known hash must equal this run's. A hash recorded as UNKNOWN (records older than these
    fields) cannot be checked: refused unless `restore_unverified` (the user's
    `--restore_unverified`), and then restored and marked "provenance unknown".
    """
    block = recorded.get(KEY) or {}
    commit = block.get("commit", UNKNOWN)
    for name, current in (("config", config), ("data", data)):
        value = block.get(f"{name}_hash", UNKNOWN)
        if value == UNKNOWN and not restore_unverified:
            return (f"{name} hash unknown (recorded at commit {commit} before hashes were kept), "
                    "so it cannot be checked against this run; --restore_unverified restores it "
                    "anyway, marked 'provenance unknown'")  # fmt: skip
        if value != UNKNOWN and value != current:
            return f"{name} hash differs (recorded {value} at commit {commit}, this run {current})"
    return None


def restored(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """The provenance block of a recorded result as restored into a run."""
    block = dict(recorded.get(KEY) or {})
    for field in ("commit", "config_hash", "data_hash", "machine", "date"):
        block.setdefault(field, UNKNOWN)
    block["restored"] = True
    return block


def blocks(run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A run's provenance blocks: one (evaluate's file) or one per task group (a study's row)."""
    block = run.get(KEY)
    if not isinstance(block, Mapping) or not block:
        return []
    if "restored" in block or "commit" in block:
        return [block]
    return [value for value in block.values() if isinstance(value, Mapping)]


def is_restored(run: Mapping[str, Any]) -> bool:
    """Whether any part of a results row was restored from a record rather than computed now."""
    return any(block.get("restored") for block in blocks(run))


def mark(run: Mapping[str, Any]) -> str:
    """'' for a row computed now; ' (restored @<commit>)' for one restored (in part) from a
    record, ' (restored @<commit>, provenance unknown)' when a hash of it was never recorded: the
    suffix of its label in every table."""
    restored_blocks = [block for block in blocks(run) if block.get("restored")]
    if not restored_blocks:
        return ""
    commits = sorted({str(block.get("commit", UNKNOWN)) for block in restored_blocks} - {UNKNOWN})
    at = f" @{','.join(commits)}" if commits else ""
    unknown = any(
        block.get(field, UNKNOWN) == UNKNOWN
        for block in restored_blocks
        for field in ("commit", "config_hash", "data_hash")
    )
    return f" (restored{at}{', provenance unknown' if unknown else ''})"


def summary_lines(runs: Mapping[str, Mapping[str, Any]], *, prefix: str) -> list[str]:
    """The lines a study prints at its end: which rows were computed now, which restored."""
    computed = [label for label, run in runs.items() if not is_restored(run)]
    restored_rows = [f"{label}{mark(run)}" for label, run in runs.items() if is_restored(run)]
    return [
        f"{prefix}: computed now: {', '.join(computed) or 'none'}",
        f"{prefix}: restored from records: {', '.join(restored_rows) or 'none'}",
    ]


def merged(runs: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """The provenance blocks of several rows as one row's (a seed mean's), keyed '<label>' or
    '<label>: <group>'."""
    blocks: dict[str, Mapping[str, Any]] = {}
    for label, run in runs.items():
        block = run.get(KEY)
        if isinstance(block, Mapping) and ("restored" in block or "commit" in block):
            blocks[label] = block
        elif isinstance(block, Mapping):
            blocks.update({f"{label}: {group}": value for group, value in block.items()})
    return blocks


def format_table(runs: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown: where each row's results come from (computed now or restored, commit, hashes,
    machine, date), one line per results file."""
    lines = [
        "## Provenance",
        "",
        "| model | results | computed | commit | config hash | data hash | machine | date |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, block in merged(runs).items():
        model, _, group = label.partition(": ")
        state = "restored" if block.get("restored") else "now"
        cells = [block.get(field, UNKNOWN) for field in
                 ("commit", "config_hash", "data_hash", "machine", "date")]  # fmt: skip
        lines.append("| " + " | ".join([model, group, state, *map(str, cells)]) + " |")
    return "\n".join(lines) + "\n"


def mark_cells(markdown: str, runs: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown tables whose cells name rows of `runs` (paired comparisons, which parse the
    plain labels) with each restored row's `mark` after its label."""
    for label, run in runs.items():
        suffix = mark(run)
        if suffix:
            markdown = markdown.replace(f"| {label} |", f"| {label}{suffix} |")
    return markdown
