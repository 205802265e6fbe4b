"""sentence-transformers directories other than all-MiniLM-L6-v2's own layout: each one the Flax
encoder either encodes as sentence-transformers does or refuses in one line naming the file and
the setting (never other vectors in silence)."""

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import save_file

from caliber_jax import Embedder

TEXTS = ["Net sales rose 4.2% to $32.1 billion.", "Operating margin declined 150 bps."]


@pytest.fixture
def copy_minilm(minilm_dir, tmp_path):
    """A copy of all-MiniLM-L6-v2 to edit."""

    def make(name="m"):
        target = tmp_path / name
        shutil.copytree(minilm_dir, target)
        return target

    return make


def _edit(path, **changes):
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, **changes}))


def _add_dense(model, width, *, weights=True):
    """A square Dense (width -> width) between pooling and Normalize, as modules.json lists."""
    dense = model / "2_Dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({
        "in_features": width, "out_features": width, "bias": True,
        "activation_function": "torch.nn.modules.linear.Identity"}))  # fmt: skip
    if weights:
        rng = np.random.default_rng(0)
        save_file({"linear.weight": rng.normal(0, 0.05, (width, width)).astype(np.float32),
                   "linear.bias": rng.normal(0, 0.05, (width,)).astype(np.float32)},
                  str(dense / "model.safetensors"))  # fmt: skip
    modules = json.loads((model / "modules.json").read_text())
    normalize = modules.pop()
    modules.append({"idx": 2, "name": "2", "path": "2_Dense",
                    "type": "sentence_transformers.models.Dense"})  # fmt: skip
    modules.append({**normalize, "idx": 3, "name": "3", "path": "3_Normalize"})
    (model / "modules.json").write_text(json.dumps(modules))


def _sentence_transformers(model):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model), device="cpu").encode(TEXTS, normalize_embeddings=True)


def test_a_square_dense_is_applied(copy_minilm):
    """A Dense that keeps the width still projects: it was dropped as if it were no W_out."""
    model = copy_minilm()
    _add_dense(model, 384)
    ours = Embedder.from_pretrained(model).encode(TEXTS)
    np.testing.assert_allclose(ours, _sentence_transformers(model), atol=1e-5, rtol=0)


def test_newer_module_names_and_pooling_mode_string(copy_minilm):
    """Newer sentence-transformers names its classes by module path and writes `pooling_mode`
    as one string: read as the older flags."""
    model = copy_minilm()
    modules = json.loads((model / "modules.json").read_text())
    for module in modules:
        module["type"] = "sentence_transformers.base.modules." + module["type"].rsplit(".", 1)[-1]
    (model / "modules.json").write_text(json.dumps(modules))
    (model / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 384, "pooling_mode": "mean"})
    )
    ours = Embedder.from_pretrained(model).encode(TEXTS)
    reference = Embedder.from_pretrained(copy_minilm("plain")).encode(TEXTS)
    np.testing.assert_allclose(ours, reference, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "case, message",
    [("dense_bin", "the Dense module has no model.safetensors"),
     ("lower_case", "do_lower_case=true is not done by the Flax encoders"),
     ("default_prompt", "default_prompt_name='query'"),
     ("layer_norm", "module 'sentence_transformers.models.LayerNorm'"),
     ("include_prompt", "include_prompt=false is not done by the Flax encoders"),
     ("decoder", "is_decoder=true (causal attention) is not supported")],
)  # fmt: skip
def test_what_the_flax_encoder_does_not_do_is_refused_naming_the_file(copy_minilm, case, message):
    model = copy_minilm()
    if case == "dense_bin":  # older sentence-transformers saved the Dense as pytorch_model.bin
        _add_dense(model, 384, weights=False)
    elif case == "lower_case":
        _edit(model / "sentence_bert_config.json", do_lower_case=True)
    elif case == "default_prompt":
        _edit(model / "config_sentence_transformers.json",
              prompts={"query": "query: "}, default_prompt_name="query")  # fmt: skip
    elif case == "layer_norm":
        modules = json.loads((model / "modules.json").read_text())
        modules.insert(2, {"idx": 2, "name": "2", "path": "2_LayerNorm",
                           "type": "sentence_transformers.models.LayerNorm"})  # fmt: skip
        (model / "modules.json").write_text(json.dumps(modules))
    elif case == "include_prompt":
        _edit(model / "1_Pooling" / "config.json", include_prompt=False)
    else:
        _edit(model / "config.json", is_decoder=True)
    with pytest.raises(ValueError, match=f"^{model}.*{__import__('re').escape(message)}"):
        Embedder.from_pretrained(model)


def test_max_seq_length_is_cut_to_the_position_table(copy_minilm):
    """A recorded max_seq_length past the position table (sentence-transformers cuts there):
    the encoder's limit is the table's, so texts that fit encode."""
    from caliber_jax import embedder
    from caliber_jax.models import embedding

    model = copy_minilm()
    _edit(model / "config.json", max_position_embeddings=40)
    _edit(model / "sentence_bert_config.json", max_seq_length=128)
    assert embedder._max_length(model, embedding.read_spec(model)) == 40
    _edit(model / "sentence_bert_config.json", max_seq_length=32)
    assert embedder._max_length(model, embedding.read_spec(model)) == 32
