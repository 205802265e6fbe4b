"""The sentence-transformers directory layout (`modules.json`, `1_Pooling/config.json`), read
without jax or torch, for the Flax encoders and the PyTorch backend alike."""

import json
from pathlib import Path

# sentence-transformers Pooling flags -> our pooling names.
POOLING_FLAGS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}


def is_sentence_transformers_dir(model_dir: str | Path) -> bool:
    """True when the directory holds a sentence-transformers pipeline (`modules.json`)."""
    return (Path(model_dir) / "modules.json").is_file()


def read_st_pooling(model_dir: str | Path) -> str:
    """The pooling of a sentence-transformers directory, from its Pooling module's config: one of
    POOLING_FLAGS' names; several modes at once (concatenated by sentence-transformers) or none is
    an error naming the file."""
    model_dir = Path(model_dir)
    modules = json.loads((model_dir / "modules.json").read_text())
    for module in modules:
        if module["type"].endswith("models.Pooling"):
            config_path = model_dir / module["path"] / "config.json"
            config = json.loads(config_path.read_text())
            modes = [name for flag, name in POOLING_FLAGS.items() if config.get(flag)]
            if len(modes) != 1:
                raise ValueError(f"{config_path}: expected one pooling mode, found {modes}")
            return modes[0]
    raise ValueError(f"{model_dir}/modules.json: no sentence_transformers Pooling module")
