"""Hub ids wherever a model folder is taken: resolved through a Hub cache built here, offline."""

import hashlib
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from huggingface_hub import HfApi, constants

from caliber_jax import Embedder, hub, tokenization
from caliber_jax.data import length_cache
from caliber_jax.models import embedding

REPO = "sentence-transformers/all-MiniLM-L6-v2"
MAIN = hashlib.sha1(b"main").hexdigest()
V1 = hashlib.sha1(b"v1").hexdigest()


def _no_network(*args, **kwargs):
    raise AssertionError("a test reached for the Hub")


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, minilm_dir):
    """A Hub cache holding REPO at two commits (refs main and v1), as `hf download` leaves it,
    with its files linked to the shipped all-MiniLM-L6-v2; offline, and any Hub call fails."""
    cache = tmp_path / "hub"
    storage = cache / ("models--" + REPO.replace("/", "--"))
    for ref, commit in (("main", MAIN), ("v1", V1)):
        shutil.copytree(minilm_dir, storage / "snapshots" / commit, copy_function=os.symlink)
        (storage / "refs").mkdir(parents=True, exist_ok=True)
        (storage / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads HF_HUB_OFFLINE at import: as if it was imported before the variable
    # was set, so only `hub.is_offline` reading the environment keeps the look-up local.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(HfApi, "repo_info", _no_network)
    monkeypatch.setattr(HfApi, "list_repo_tree", _no_network)
    hub._snapshot.cache_clear()
    yield storage
    hub._snapshot.cache_clear()


def test_hub_id_encodes_like_the_local_folder(hub_cache, minilm_dir, filing_passages):
    assert hub.resolve_model_dir(REPO) == hub_cache / "snapshots" / MAIN
    texts = filing_passages[:4]
    expected = Embedder.from_pretrained(minilm_dir).encode(texts, batch_size=4)
    got = Embedder.from_pretrained(REPO).encode(texts, batch_size=4)
    np.testing.assert_array_equal(got, expected)


def test_every_loader_takes_a_hub_id(hub_cache, minilm_dir, tmp_path):
    """The functions train, export and the mining trainer call with `model.init_dir` and
    `model.tokenizer_dir` resolve the id themselves."""
    spec = embedding.read_spec(REPO, out_dim=128)
    assert spec == embedding.read_spec(minilm_dir, out_dim=128)
    assert embedding.has_new_w_out(REPO, spec)
    flat = embedding.load_flat_params(REPO, spec, seed=0)
    local = embedding.load_flat_params(minilm_dir, spec, seed=0)
    assert flat.keys() == local.keys()
    assert all(np.array_equal(flat[k], local[k]) for k in flat)
    assert tokenization.load_tokenizer(REPO)("a 10-K").input_ids == (
        tokenization.load_tokenizer(minilm_dir)("a 10-K").input_ids
    )
    # The token-length cache is keyed by the tokenizer's files, found in the snapshot.
    passages = tmp_path / "passages.jsonl"
    passages.write_text('{"text": "x"}\n')
    keys = {
        length_cache.cache_path(
            tmp_path, "train", passages=passages, tokenizer_dir=name, max_length=64
        )  # fmt: skip
        for name in (REPO, minilm_dir)
    }
    assert len(keys) == 1


def test_revisions_resolve(hub_cache):
    assert hub.resolve_model_dir(f"{REPO}@v1") == hub_cache / "snapshots" / V1
    assert hub.resolve_model_dir(f"{REPO}@{V1}") == hub_cache / "snapshots" / V1
    assert hub.resolve_model_dir(f"{REPO}@main") == hub_cache / "snapshots" / MAIN
    with pytest.raises(FileNotFoundError) as error:
        hub.resolve_model_dir(f"{REPO}@v2")
    message = str(error.value)
    assert "\n" not in message
    assert f"hf download {REPO} --revision v2" in message


def test_uncached_id_offline_is_one_line_naming_it(hub_cache):
    with pytest.raises(FileNotFoundError) as error:
        hub.resolve_model_dir("Qwen/Qwen3-Embedding-0.6B")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("Qwen/Qwen3-Embedding-0.6B: ")
    assert "HF_HUB_OFFLINE" in message
    assert "`hf download Qwen/Qwen3-Embedding-0.6B`" in message
    assert "or pass a local folder" in message


@pytest.mark.parametrize(
    "name", ["./no-such-model", "/nonexistent/model", "~/no-such-model", "a/b/c", "model-folder"]
)
def test_missing_paths_stay_path_errors(hub_cache, name):
    with pytest.raises(FileNotFoundError, match=r"no such model folder") as error:
        hub.resolve_model_dir(name)
    assert str(error.value).startswith(f"{name}: ")
    assert "Hub cache" not in str(error.value)


def test_a_local_folder_wins_over_the_hub(hub_cache, tmp_path, monkeypatch, minilm_dir):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(minilm_dir, tmp_path / REPO, copy_function=os.symlink)
    assert hub.resolve_model_dir(REPO).resolve() == (tmp_path / REPO).resolve()


def test_encode_cli_uncached_id_one_line(hub_cache, tmp_path):
    source = tmp_path / "texts.txt"
    source.write_text("one\n")
    env = dict(os.environ, HF_HUB_CACHE=str(hub_cache.parent), HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-m", "caliber_jax.encode", "--model=nobody/uncached-model",
         f"--input={source}", f"--output={tmp_path / 'v.npy'}"],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "nobody/uncached-model: no local folder at this path" in last
    assert "`hf download nobody/uncached-model`" in last
