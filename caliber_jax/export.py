"""Export a trained student: Orbax checkpoint -> Hugging Face / sentence-transformers directory.

    python -m caliber_jax.export --workdir runs/caliber [--step N] --output runs/caliber/hf

Restores only the params (single-device targets, whatever topology wrote them), applies the weight
table in reverse, writes `model.safetensors`, `config.json`, the tokenizer files and the
sentence-transformers modules (pooling, Dense W_out when present, Normalize), so `AutoModel` and
`SentenceTransformer` load the student. `--workdir` and `--output` may be URLs (gs://...).
"""

import json
import os
import tempfile
from collections.abc import Sequence

import ml_collections
from absl import flags
from etils import epath

from caliber_jax import checkpoint, cli, paths, tokenization
from caliber_jax.models import embedding, hf


def export(workdir: str | os.PathLike, output: str | os.PathLike, *, step: int | None = None,
           query_prompt: str | None = None) -> epath.Path:  # fmt: skip
    """Writes the student of `workdir` (its resolved config.json + checkpoint) to `output`."""
    workdir, output = paths.as_path(workdir), paths.as_path(output)
    if paths.is_remote(output):  # write locally, then copy the finished directory over
        with tempfile.TemporaryDirectory() as local:
            export(workdir, local, step=step, query_prompt=query_prompt)
            _copy_tree(epath.Path(local), output)
        return output
    config_path = workdir / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path}: not a training workdir (no resolved config)")
    config = ml_collections.ConfigDict(json.loads(config_path.read_text()))
    model = config.model
    spec = embedding.read_spec(
        model.init_dir, pooling=model.pooling, num_layers=model.num_layers, out_dim=model.out_dim
    )
    params, step = checkpoint.restore_params(workdir / "checkpoints", step=step)
    flat = embedding.params_to_flat(params)
    tokenizer = tokenization.load_tokenizer(model.tokenizer_dir or model.init_dir)
    # Tensors the encoder never uses (BERT's pooler) go out as they came in, so AutoModel
    # loads the full original architecture without re-initialising anything.
    source = hf.read_safetensors(model.init_dir)
    passthrough = {k: v for k, v in source.items() if k.removeprefix("bert.").startswith("pooler.")}
    embedding.save_pretrained(
        output,
        spec,
        flat,
        tokenizer=tokenizer,
        max_seq_length=config.data.max_length,
        query_prompt=query_prompt,
        passthrough={k.removeprefix("bert."): v for k, v in passthrough.items()},
    )
    hf.save_json({"workdir": str(workdir), "step": int(step)}, output / "caliber_export.json")
    return output


def _copy_tree(source: epath.Path, target: epath.Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for child in source.iterdir():
        if child.is_dir():
            _copy_tree(child, target / child.name)
        else:
            child.copy(target / child.name, overwrite=True)


def main(argv: Sequence[str]) -> None:
    del argv
    values = flags.FLAGS
    print(export(values.workdir, values.output, step=values.step, query_prompt=values.query_prompt))


if __name__ == "__main__":
    # Flags are defined only when run as a script, so tests can import `export`.
    flags.DEFINE_string("workdir", None, "Training run directory (has config.json).", required=True)
    flags.DEFINE_string("output", None, "Directory to write the HF model to.", required=True)
    flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
    flags.DEFINE_string("query_prompt", None, "sentence-transformers 'query' prompt to record.")
    cli.run(main)
