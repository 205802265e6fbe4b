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


# The sentence-transformers modules the Flax encoders run (matched on the class name, so both
# `sentence_transformers.models.Dense` and newer paths such as `...modules.dense.Dense` count).
FLAX_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")
# Pooling's `pooling_mode` string (newer sentence-transformers) -> our pooling names.
POOLING_MODES = {
    "mean": "mean", "cls": "cls", "lasttoken": "last", "max": "max",
    "mean_sqrt_len_tokens": "mean_sqrt_len", "weightedmean": "weightedmean",
}  # fmt: skip


def module_kind(module: dict[str, Any]) -> str:
    """A `modules.json` entry's class name ("Transformer", "Pooling", "Dense", ...)."""
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def module_paths(model_dir: str | Path, kind: str) -> list[str]:
    """The paths (relative to `model_dir`) of the modules of type `kind` ("Pooling", "Dense")
    that `modules.json` lists, in pipeline order: the only ones sentence-transformers loads."""
    modules = read_json(Path(model_dir) / "modules.json")
    return [m["path"] for m in modules if module_kind(m) == kind]


def check_flax_pipeline(model_dir: str | Path) -> None:
    """Raises one ValueError naming the file and the setting when a sentence-transformers
    directory asks for something the Flax encoders do not do (they would encode other vectors
    than sentence-transformers): a module other than `FLAX_MODULES`, lower-casing, a default
    prompt, or a prompt left out of the pooling. The PyTorch backend (backend "torch") runs the
    directory's own pipeline."""
    model_dir = Path(model_dir)
    hint = '; the PyTorch backend (backend "torch") runs it'
    for module in read_json(model_dir / "modules.json"):
        if module_kind(module) not in FLAX_MODULES:
            raise ValueError(f"{model_dir}/modules.json: module {module.get('type')!r} "
                             f"(path {module.get('path')!r}) is not one the Flax encoders "
                             f"run ({', '.join(FLAX_MODULES)}){hint}")  # fmt: skip
    bert_config = model_dir / "sentence_bert_config.json"
    if bert_config.is_file() and read_json(bert_config).get("do_lower_case"):
        raise ValueError(f"{bert_config}: do_lower_case=true is not done by the Flax "
                         f"encoders{hint}")  # fmt: skip
    st_config = model_dir / "config_sentence_transformers.json"
    if st_config.is_file() and read_json(st_config).get("default_prompt_name"):
        raise ValueError(f"{st_config}: default_prompt_name="
                         f"{read_json(st_config)['default_prompt_name']!r} (a prompt before every "
                         f"text) is not added by the Flax encoders{hint}")  # fmt: skip
    for path in module_paths(model_dir, "Pooling"):
        pooling_config = model_dir / path / "config.json"
        if pooling_config.is_file() and read_json(pooling_config).get("include_prompt") is False:
            raise ValueError(f"{pooling_config}: include_prompt=false is not done by the Flax "
                             f"encoders{hint}")  # fmt: skip


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
    if isinstance(config.get("pooling_mode"), str):  # newer sentence-transformers: one string
        mode = config["pooling_mode"]
        if mode not in POOLING_MODES:
            raise ValueError(f"{config_path}: pooling_mode={mode!r}, known: "
                             f"{sorted(POOLING_MODES)}")  # fmt: skip
        return POOLING_MODES[mode]
    modes = [name for flag, name in POOLING_FLAGS.items() if config.get(flag)]
    if len(modes) != 1:
        raise ValueError(f"{config_path}: expected one pooling mode, found {modes}")
    return modes[0]
