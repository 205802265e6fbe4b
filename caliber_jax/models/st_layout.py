"""The sentence-transformers directory layout (`modules.json`, `1_Pooling/config.json`), read
without jax or torch, for the Flax encoders and the PyTorch backend alike; and `read_json`, which
every JSON file of a model directory is read through."""

import json
from pathlib import Path
from typing import Any

# sentence-transformers Pooling flags -> our pooling names.
POOLING_FLAGS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}


def read_json(path: str | Path) -> Any:
    """The parsed JSON file at `path`; a file that is not JSON is a ValueError naming it and the
    place it goes wrong, in one line."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{path}: not valid JSON ({error.msg} at line {error.lineno} column {error.colno})"
        ) from error
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path}: not valid JSON (not UTF-8 text at byte {error.start})"
        ) from error


def is_sentence_transformers_dir(model_dir: str | Path) -> bool:
    """True when the directory holds a sentence-transformers pipeline (`modules.json`)."""
    return (Path(model_dir) / "modules.json").is_file()


def module_paths(model_dir: str | Path, kind: str) -> list[str]:
    """The paths (relative to `model_dir`) of the modules of type `kind` ("Pooling", "Dense")
    that `modules.json` lists, in pipeline order: the only ones sentence-transformers loads."""
    modules = read_json(Path(model_dir) / "modules.json")
    return [m["path"] for m in modules if m["type"].endswith(f"models.{kind}")]


def read_st_pooling(model_dir: str | Path) -> str:
    """The pooling of a sentence-transformers directory, from its Pooling module's config: one of
    POOLING_FLAGS' names; several modes at once (concatenated by sentence-transformers) or none is
    an error naming the file."""
    model_dir = Path(model_dir)
    listed = module_paths(model_dir, "Pooling")
    if not listed:
        raise ValueError(f"{model_dir}/modules.json: no sentence_transformers Pooling module")
    config_path = model_dir / listed[0] / "config.json"
    config = read_json(config_path)
    modes = [name for flag, name in POOLING_FLAGS.items() if config.get(flag)]
    if len(modes) != 1:
        raise ValueError(f"{config_path}: expected one pooling mode, found {modes}")
    return modes[0]
