"""User-facing text names dates, commits, machines and targets by what they are.

A reader cannot check "session 24", "machine E6", "a lent H200" or "issue #57's target": the
README, BENCHMARKS.md, every Markdown page under docs/ and records/ (reports, indexes, model
cards), the shipped model's card, the configs' docstrings and comments, and the text the scripts,
benchmarks and package print or write into model cards (scanned whole: a comment is read too) must
name a date (YYYY-MM-DD), a commit and the machine ("2-core AMD EPYC Zen 4 with AVX-512", "one
NVIDIA H200") instead, and state a target as its number. Records' data (JSON, logs) are left as
they were.
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
# Issue numbers a user cannot look up: "issue #57", "issues #37 and #57", and a bare "#57" used as
# a reference ("since #39", "(#16)"). Not a Markdown heading ("## 2026"), an anchor
# ("results.md#2026-11-27-..." or "(#2026-11-27-...)"), a quoted colour ("#1f77b4", "#333")
# or "&#39;".
ISSUE_PATTERNS = [
    re.compile(r"\bissues? #\d", re.IGNORECASE),
    re.compile(r"(?<![\w&/#\"'])#\d{1,4}(?![\w-])"),
]


def user_facing_files(root: Path) -> list[Path]:
    """Every file whose text a user reads: docs, configs, and what the code prints or writes."""
    files = [root / "README.md", root / "BENCHMARKS.md"]
    files += sorted((root / "docs").rglob("*.md")) + sorted((root / "records").rglob("*.md"))
    files += sorted((root / "models").glob("*/README.md"))
    files += sorted((root / "configs").glob("*.py"))
    files += sorted((root / "scripts").glob("*.py"))
    files += sorted((root / "benchmarks").glob("*.py")) + sorted((root / "benchmarks").glob("*.sh"))
    files += sorted((root / "caliber_jax").rglob("*.py"))
    return [path for path in files if path.is_file()]


def offending_lines(root: Path, patterns=None) -> list[str]:
    """`file:line: text` for every line of the user-facing files that matches a pattern."""
    patterns = PATTERNS + ISSUE_PATTERNS if patterns is None else patterns
    found = []
    for path in user_facing_files(root):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if any(pattern.search(line) for pattern in patterns):
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
                 "scripts/model_card.py", "caliber_jax/train.py", "records/README.md",
                 "models/minilm-l6-caliber-finance/README.md"]:  # fmt: skip
        assert name in names, name
    assert any(name.endswith("/hf/README.md") for name in names)  # the recorded runs' cards


def test_the_issue_patterns_catch_issue_numbers_and_spare_headings_anchors_and_colours():
    caught = [
        "meets issue #57's 0.64 at 0.30",
        "Issues #37 and #57",
        "Since #39 the study keeps its",
        "the numeric objective (#16), the",
        "Still to do for #37: both",
        "ran #37's NumGap scoring",
    ]
    spared = [
        "## 2026-11-27 (38efa17): Late800 s1",
        "[history](history.md#2026-11-21-a2561a0-the-cpu-reproduction-study)",
        "[2026-11-27](#2026-11-27-commits-8148e50-ef5aad2)",
        'color="#1f77b4", edgecolor="#333"',
        "it&#39;s",
        "# 1 of 3: the comment of a loop",
        "runs/demo/Numeric_s0/hf",
    ]
    assert all(any(p.search(text) for p in ISSUE_PATTERNS) for text in caught), caught
    assert not [text for text in spared if any(p.search(text) for p in ISSUE_PATTERNS)]


def test_user_facing_text_names_no_session_nickname_or_lent_machine():
    found = offending_lines(REPO, PATTERNS)
    assert not found, "\n".join(found)


def test_user_facing_text_names_no_issue_number():
    found = offending_lines(REPO, ISSUE_PATTERNS)
    assert not found, f"{len(found)} issue numbers:\n" + "\n".join(found)
