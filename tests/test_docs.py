"""The commands written in README.md and docs/*.md name modules and config fields that exist.

Every fenced code block is read (continuation lines joined), and every inline code span of the
prose; each `python -m caliber_jax.<cmd>`
must be an importable module of the package (found by file, nothing imported), and each
`--config.<field>` must exist in the config the command line names (`--config configs/x.py[:arg]`)
or, where it names none, in some config under configs/ (any of their `get_config()` trees).
"""

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`\n]+)`")
MODULE = re.compile(r"python3? -m (caliber_jax(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
FIELD = re.compile(r"--config\.([A-Za-z_][A-Za-z0-9_.]*[A-Za-z0-9_])")
CONFIG_FILE = re.compile(
    r"--config[= ]+['\"]?(?:\$\w+/|\./)?(configs/[A-Za-z0-9_]+\.py)(?::(\w+))?"
)


def _commands() -> list[tuple[str, int, str]]:
    """(file, line number, command) of every logical line of every fenced code block and of
    every inline code span outside them."""
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        prose = FENCE.sub(lambda block: "\n" * block.group(0).count("\n"), text)
        for span in INLINE.finditer(prose):
            found.append((path.name, prose.count("\n", 0, span.start()) + 1, span.group(1)))
        for block in FENCE.finditer(text):
            first = text.count("\n", 0, block.start(1)) + 1
            joined, start = "", None
            for offset, line in enumerate(block.group(1).splitlines()):
                start = first + offset if start is None else start
                joined += line.rstrip().removesuffix("\\") + " "
                if not line.rstrip().endswith("\\"):
                    found.append((path.name, start, joined.strip()))
                    joined, start = "", None
    return found


COMMANDS = _commands()


def _load_config(name: str, arg: str | None):
    spec = importlib.util.spec_from_file_location(f"_docs_{Path(name).stem}", REPO / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg) if arg else module.get_config()


def _has(config, field: str) -> bool:
    node = config
    for part in field.split("."):
        try:
            node = node[part]
        except (KeyError, TypeError, AttributeError):
            return False
    return True


@pytest.fixture(scope="module")
def every_config():
    paths = [path for path in sorted((REPO / "configs").glob("*.py")) if path.stem != "__init__"]
    return {path.name: _load_config(f"configs/{path.name}", None) for path in paths}


def test_the_docs_have_commands_to_check():
    modules = [m for _, _, line in COMMANDS for m in MODULE.findall(line)]
    fields = [f for _, _, line in COMMANDS for f in FIELD.findall(line)]
    assert len(modules) >= 20 and len(fields) >= 5, (len(modules), len(fields))


def test_every_documented_module_exists():
    missing = []
    for name, number, line in COMMANDS:
        for module in MODULE.findall(line):
            parts = module.split(".")
            base = REPO.joinpath(*parts)
            if not (base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()):
                missing.append(f"{name}:{number}: {module}")
    assert not missing, "\n".join(missing)


def test_every_documented_config_field_exists(every_config):
    missing = []
    for name, number, line in COMMANDS:
        fields = FIELD.findall(line)
        if not fields:
            continue
        named = CONFIG_FILE.search(line)
        if named:
            configs = {named.group(0): _load_config(named.group(1), named.group(2))}
        else:
            configs = every_config
        for field in fields:
            if not any(_has(config, field) for config in configs.values()):
                where = named.group(1) if named else "any config"
                missing.append(f"{name}:{number}: --config.{field} is not a field of {where}")
    assert not missing, "\n".join(missing)
