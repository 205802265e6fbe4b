"""User-facing text names dates, commits and machines by what they are (issue #58).

A reader cannot check "session 24", "machine E6" or "a lent H200": the README, BENCHMARKS.md, every
Markdown page and report under docs/, the configs' docstrings and comments, and the text the
scripts, benchmarks and package print or write into model cards (scanned whole: a comment is read
too) must name a date (YYYY-MM-DD), a commit and the machine ("2-core AMD EPYC Zen 4 with AVX-512",
"one NVIDIA H200") instead. Records (JSON, logs, the scripts that ran) are left as they were.
"""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Session numbers, "lent" and "device session" in any case; the machine nicknames as written
# (upper case; E1-E9 and X1), so that embednum's format names ("e3") and the like are not flagged.
PATTERNS = [
    re.compile(r"\bsessions? [0-9]", re.IGNORECASE),
    re.compile(r"\b(?:E[1-9]|X1)\b"),
    re.compile(r"\blent\b", re.IGNORECASE),
    re.compile(r"\bdevice sessions?\b", re.IGNORECASE),
]


def user_facing_files(root: Path) -> list[Path]:
    """Every file whose text a user reads: docs, configs, and what the code prints or writes."""
    files = [root / "README.md", root / "BENCHMARKS.md"]
    files += sorted((root / "docs").rglob("*.md"))
    files += sorted((root / "configs").glob("*.py"))
    files += sorted((root / "scripts").glob("*.py"))
    files += sorted((root / "benchmarks").glob("*.py")) + sorted((root / "benchmarks").glob("*.sh"))
    files += sorted((root / "caliber_jax").rglob("*.py"))
    return [path for path in files if path.is_file()]


def offending_lines(root: Path) -> list[str]:
    """`file:line: text` for every line of the user-facing files that matches a pattern."""
    found = []
    for path in user_facing_files(root):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if any(pattern.search(line) for pattern in PATTERNS):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def test_the_patterns_catch_the_old_voice_and_spare_ordinary_words():
    caught = [
        "seed 0 on E5 (sessions 14-15)",
        "On a lent NVIDIA H200 (session 31;",
        "the next device session",
        "2-vCPU Sapphire Rapids (X1, Session 27)",
    ]
    spared = [
        "2026-11-28 (4a641c0), one NVIDIA H200",
        'embednum\'s format "e3" and E30',
        "x10 and /10, equivalent, silent",
        "a session-scoped pytest fixture",
    ]
    assert all(any(p.search(text) for p in PATTERNS) for text in caught)
    assert not any(p.search(text) for p in PATTERNS for text in spared)


def test_the_scan_reads_the_files_a_user_reads():
    names = {str(path.relative_to(REPO)) for path in user_facing_files(REPO)}
    for name in ["README.md", "BENCHMARKS.md", "docs/results.md", "configs/caliber.py",
                 "scripts/model_card.py", "caliber_jax/train.py"]:  # fmt: skip
        assert name in names, name
    assert any(name.endswith("/hf/README.md") for name in names)  # the checked-in model cards


def test_user_facing_text_names_no_session_nickname_or_lent_machine():
    found = offending_lines(REPO)
    assert not found, "\n".join(found)
