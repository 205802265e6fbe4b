"""Embedder options for large teachers and long sequences: bfloat16 parameters, the batch split
over local devices, attention implementations and per-layer rematerialisation."""

import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from caliber_jax import Embedder, sharding
from caliber_jax.data import padding
from caliber_jax.models import embedding, layers


@pytest.fixture(scope="module")
def reference(minilm_dir, filing_passages):
    """float32 parameters and compute on one device."""
    texts = filing_passages[:40]
    return texts, Embedder.from_pretrained(minilm_dir).encode(texts, batch_size=16)


def test_data_parallel_float32_equals_one_device(minilm_dir, reference):
    texts, expected = reference
    assert len(jax.local_devices()) == 8  # tests/conftest.py: 8 simulated CPU devices
    emb = Embedder.from_pretrained(minilm_dir, data_parallel=True)
    assert emb.mesh is not None and emb.mesh.size == 8
    # batch_size 12 is not a multiple of 8: the batch is padded to 16 rows, extra rows dropped.
    np.testing.assert_allclose(emb.encode(texts, batch_size=12), expected, atol=1e-5)


def test_bfloat16_parameters_data_parallel_close_to_float32(minilm_dir, reference):
    texts, expected = reference
    emb = Embedder.from_pretrained(
        minilm_dir, dtype="bfloat16", param_dtype="bfloat16", data_parallel=True
    )
    kernel = emb.params["encoder"]["layer"][0]["query"]["kernel"]
    norm = emb.params["encoder"]["layer"][0]["attention_layernorm"]["weight"]
    assert kernel[...].dtype == jnp.bfloat16 and norm[...].dtype == jnp.float32
    # Replicated over the 8 devices.
    assert len(kernel[...].sharding.device_set) == 8
    got = emb.encode(texts, batch_size=16)
    cosines = np.sum(got * expected, axis=1)
    assert cosines.min() >= 0.999, cosines.min()


def test_token_budget_batches_encode_the_same_vectors(minilm_dir, reference):
    """Batches filled by token budget (short passages many to a batch) give each row the vector
    fixed batches give it, on one device and split over 8."""
    texts, expected = reference
    one = Embedder.from_pretrained(minilm_dir)
    np.testing.assert_allclose(one.encode(texts, tokens_per_batch=1000), expected, atol=1e-5)
    split = Embedder.from_pretrained(minilm_dir, data_parallel=True)
    np.testing.assert_allclose(split.encode(texts, tokens_per_batch=1000), expected, atol=1e-5)


def test_batch_plan_fills_a_token_budget_with_one_row_count_per_rung():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 513, size=500).tolist() + [512, 512, 3]
    for multiple in (1, 8):
        plan = padding.batch_plan(
            lengths, batch_size=64, tokens_per_batch=8192, row_multiple=multiple
        )
        seen = np.concatenate([rows for rows, _, _ in plan])
        assert sorted(seen.tolist()) == list(range(len(lengths)))  # every row once
        rows_of = {}
        for rows, padded, length in plan:
            assert len(rows) <= padded and padded % multiple == 0
            assert (
                max(lengths[r] for r in rows)
                <= length
                == padding.bucket_length(max(lengths[r] for r in rows))
            )
            assert padded * length <= 8192 or padded == multiple
            rows_of.setdefault(length, set()).add(padded)
        # One program per rung: as many rows as the budget holds.
        assert rows_of == {length: {8192 // length // multiple * multiple} for length in rows_of}
        assert rows_of[512] == {16} and min(rows_of) < 100
    # Without a budget: batch_size rows (rounded up to the multiple), longest first (stable).
    plan = padding.batch_plan(lengths, batch_size=12, row_multiple=8)
    order = np.argsort(-np.asarray(lengths), kind="stable")
    assert [rows.tolist() for rows, _, _ in plan] == [
        order[i : i + 12].tolist() for i in range(0, len(order), 12)
    ]
    assert {padded for _, padded, _ in plan} == {16}
    with pytest.raises(ValueError, match="tokens_per_batch >= 0"):
        padding.batch_plan(lengths, batch_size=4, tokens_per_batch=-1)


def test_unknown_attention_implementation_fails(minilm_dir):
    with pytest.raises(ValueError, match="attention='flash'"):
        Embedder.from_pretrained(minilm_dir, attention="flash").encode(["a b c"])


@pytest.mark.parametrize("remat", ["full", "dots", True])
def test_remat_policies_give_the_same_gradients(minilm_dir, remat):
    spec = embedding.read_spec(minilm_dir, num_layers=2)
    flat = embedding.load_flat_params(minilm_dir, spec)
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 20000, size=(4, 24)).astype(np.int32)
    mask = (np.arange(24)[None, :] < np.array([[24], [10], [3], [17]])).astype(np.int32)

    def grads(remat_option):
        graphdef, params = embedding.split_model(spec, flat, dtype=jnp.float32, remat=remat_option)

        def loss(p):
            return jnp.sum(nnx.merge(graphdef, p)(ids, mask)[:, :8])

        return jax.tree.leaves(jax.jit(jax.grad(loss))(params))

    for a, b in zip(grads("none"), grads(remat), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_remat_rejects_unknown_policy():
    with pytest.raises(ValueError, match="remat='some'"):
        layers.resolve_remat("some")


@pytest.mark.parametrize(
    ("flags", "native"),
    [
        ("fpu avx2 avx512f avx512_bf16", True),  # Zen 4, Cooper Lake
        ("fpu avx2 amx_bf16 amx_tile", True),  # Sapphire Rapids
        ("fpu avx2 avx512f avx512bw", False),  # Skylake-SP: AVX-512 without bfloat16
        ("fpu avx avx2 fma", False),
    ],
)
def test_native_bf16_reads_the_cpu_flags(tmp_path, monkeypatch, flags, native):
    from caliber_jax import host

    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # no ISA hold

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: X\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    assert host.native_bf16(cpuinfo) is native
    arm = tmp_path / "arm"
    arm.write_text(f"processor\t: 0\nFeatures\t: fp asimd {'bf16' if native else 'sve'}\n")
    assert host.native_bf16(arm) is native
    assert host.native_bf16(tmp_path / "absent") is False


def test_an_xla_isa_hold_below_bf16_turns_native_bf16_off(tmp_path, monkeypatch):
    """benchmarks/hold_avx2.sh holds XLA to AVX2 on an AVX-512 CPU: "auto" must then pick
    float32, as on an AVX2-only CPU, whatever /proc/cpuinfo says."""
    from caliber_jax import host

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    for flags, native in (
        ("--xla_force_host_platform_device_count=8", True),
        ("--xla_cpu_max_isa=AVX2", False),
        ("--xla_cpu_max_isa=avx512", False),
        ("--xla_cpu_max_isa=AVX2 --xla_cpu_max_isa=AVX512_BF16", True),  # the last one wins
        ("--xla_cpu_max_isa=AMX", True),
    ):
        monkeypatch.setenv("XLA_FLAGS", flags)
        assert host.held_below_bf16() is (not native), flags
        assert host.native_bf16(cpuinfo) is native, flags
    assert host.held_below_bf16("--xla_cpu_max_isa=SSE4_2")


def test_auto_dtype_is_bfloat16_only_where_the_cpu_multiplies_it(monkeypatch):
    from caliber_jax import embedder, host

    for native, want in ((True, jnp.bfloat16), (False, jnp.float32)):
        monkeypatch.setattr(host, "native_bf16", lambda native=native: native)
        assert embedder.resolve_dtype("auto") == want
    assert embedder.resolve_dtype("float32") == jnp.float32
    with pytest.raises(ValueError, match="'float16'.*auto"):
        embedder.resolve_dtype("float16")


def _corrupt_copy(minilm_dir, tmp_path, name: str, content: bytes):
    """MiniLM's directory (links to its files) with file `name` replaced by `content`."""
    model = tmp_path / "model"
    for source in minilm_dir.rglob("*"):
        if source.is_file():
            target = model / source.relative_to(minilm_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)
    (model / name).unlink()
    (model / name).write_bytes(content)
    return model


@pytest.mark.parametrize(
    "name", ["config.json", "modules.json", "1_Pooling/config.json", "sentence_bert_config.json"]
)
def test_malformed_json_is_reported_with_its_file(minilm_dir, tmp_path, name):
    model = _corrupt_copy(minilm_dir, tmp_path, name, b'{\n  "max_seq_length": \n')
    message = f"{model / name}: not valid JSON (Expecting value at line 3 column 1)"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        Embedder.from_pretrained(model)


def test_truncated_safetensors_is_one_error_line_naming_the_file(minilm_dir, tmp_path):
    """A cut-off model.safetensors: ValueError naming the file from the API, and one `error:`
    line (exit status 2, no traceback) from `python -m caliber_jax.encode`."""
    weights = (minilm_dir / "model.safetensors").read_bytes()
    model = _corrupt_copy(minilm_dir, tmp_path, "model.safetensors", weights[: len(weights) // 2])
    message = f"{model / 'model.safetensors'}: cannot be read ("
    with pytest.raises(ValueError, match=f"^{re.escape(message)}.*incomplete metadata"):
        Embedder.from_pretrained(model)
    texts = tmp_path / "texts.txt"
    texts.write_text("one text\n")
    result = subprocess.run(
        [sys.executable, "-m", "caliber_jax.encode", f"--model={model}", f"--input={texts}",
         f"--output={tmp_path / 'vectors.npy'}"],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), result.stderr[-2000:]


def test_a_directory_without_tokenizer_files_is_named_when_text_is_encoded(minilm_dir, tmp_path):
    """It loads (ids can be encoded), and text is refused naming the directory."""
    from caliber_jax import tokenization

    bare = tmp_path / "bare"
    bare.mkdir()
    for item in minilm_dir.iterdir():
        if item.name not in tokenization.TOKENIZER_FILES + ("special_tokens_map.json",):
            (bare / item.name).symlink_to(item)
    embedder = Embedder.from_pretrained(bare)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(bare))}: no tokenizer files"):
        embedder.tokenize(["Revenue rose."])


def sequential_encode(emb: Embedder, texts, **plan_options) -> np.ndarray:
    """What `encode` computes, one batch at a time: each batch's vectors pulled to the host
    before the next is padded (the plan, padding and program `encode_ids` uses)."""
    seqs = emb.tokenize(texts)
    plan = padding.batch_plan(
        [len(s) for s in seqs], max_length=emb.max_length,
        row_multiple=emb.mesh.size if emb.mesh is not None else 1, **plan_options,
    )  # fmt: skip
    out = np.zeros((len(seqs), emb.dim), np.float32)
    for rows, padded_rows, length in plan:
        ids, mask = padding.pad_rows(
            [seqs[r] for r in rows], rows=padded_rows, length=length, pad_id=emb.pad_id
        )
        if emb.mesh is not None:
            ids, mask = jax.device_put((ids, mask), sharding.batch_sharding(emb.mesh))
        out[rows] = np.asarray(emb._embed(emb.params, ids, mask))[: len(rows)]
    return out


@pytest.mark.parametrize("data_parallel", [False, True], ids=["one device", "8 devices"])
def test_encode_with_a_batch_in_flight_gives_the_same_bits_in_order(
    minilm_dir, filing_passages, data_parallel
):
    """Padding the next batch while the device encodes the last changes no bit of any vector
    and no row's place, with fixed batches and with token budgets (several rungs)."""
    texts = filing_passages[:40]
    emb = Embedder.from_pretrained(minilm_dir, data_parallel=data_parallel)
    for options in (dict(batch_size=16), dict(batch_size=16, tokens_per_batch=1000)):
        expected = sequential_encode(emb, texts, **options)
        np.testing.assert_array_equal(emb.encode(texts, **options), expected)


def test_encode_pads_the_next_batch_before_pulling_the_last(minilm_dir, filing_passages,
                                                            monkeypatch):  # fmt: skip
    """One batch stays in flight: batch i + 1 is padded and sent before batch i's vectors are
    pulled to the host, so the host's work overlaps the device's; the last batch is pulled too."""
    from caliber_jax import embedder as embedder_module

    emb = Embedder.from_pretrained(minilm_dir)
    events = []

    class Pending:
        """A batch's device output that notes when the host pulls it."""

        def __init__(self, index, value):
            self.index, self.value = index, value

        def copy_to_host_async(self):
            self.value.copy_to_host_async()

        def __array__(self, dtype=None, copy=None):
            events.append(("pull", self.index))
            return np.asarray(self.value, dtype=dtype)

    pad_batch, embed = embedder_module.pad_batch, emb._embed

    def noting_pad(*args, **kwargs):
        events.append(("pad", sum(kind == "pad" for kind, _ in events)))
        return pad_batch(*args, **kwargs)

    def noting_embed(params, ids, mask):
        return Pending(sum(kind == "pad" for kind, _ in events) - 1, embed(params, ids, mask))

    monkeypatch.setattr(embedder_module, "pad_batch", noting_pad)
    monkeypatch.setattr(emb, "_embed", noting_embed)
    texts = filing_passages[:40]
    got = emb.encode(texts, batch_size=8)
    batches = -(-len(texts) // 8)
    assert sorted(events) == sorted([("pad", i) for i in range(batches)]
                                    + [("pull", i) for i in range(batches)])  # fmt: skip
    for i in range(1, batches):
        assert events.index(("pad", i)) < events.index(("pull", i - 1)), events
    monkeypatch.undo()
    np.testing.assert_array_equal(got, sequential_encode(emb, texts, batch_size=8))
