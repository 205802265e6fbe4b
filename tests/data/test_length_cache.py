"""Token lengths written once per (passages, tokenizer, max_length) and read back at launch."""

import numpy as np

from caliber_jax.data import length_cache


def _inputs(tmp_path):
    passages = tmp_path / "train.jsonl"
    passages.write_text('{"text": "a"}\n')
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")
    return passages, tokenizer


def test_the_name_follows_what_decides_the_lengths(tmp_path):
    passages, tokenizer = _inputs(tmp_path)

    def path(max_length=32):
        return length_cache.cache_path(tmp_path, "train", passages=passages,
                                       tokenizer_dir=tokenizer, max_length=max_length)  # fmt: skip

    first = path()
    assert first == path() and first.parent == tmp_path / "token_lengths"
    assert first.name.startswith("train_") and first.suffix == ".npz"
    assert path(max_length=64) != first
    (tokenizer / "tokenizer.json").write_text('{"changed": 1}')
    second = path()
    assert second != first
    passages.write_text('{"text": "b"}\n')
    assert path() not in (first, second)


def test_round_trip_and_mismatched_rows(tmp_path):
    path = tmp_path / "token_lengths" / "train_x.npz"
    assert length_cache.load(path, 3) is None
    length_cache.save(path, np.array([5, 7, 9]), np.array([3, 3, 0]))
    lengths, pert = length_cache.load(path, 3)
    assert lengths.tolist() == [5, 7, 9] and pert.tolist() == [3, 3, 0]
    assert lengths.dtype == np.int64
    assert length_cache.load(path, 4) is None  # another corpus size: not these lengths
    assert not list(path.parent.glob(".*tmp"))


class _Source:
    def __init__(self, texts, perturbed):
        self.texts, self.perturbed = texts, perturbed

    def __len__(self):
        return len(self.texts)

    def read_texts(self, rows):
        return [self.texts[i] for i in rows], [self.perturbed[i] for i in rows]


def test_train_tokenizes_the_corpus_once(tmp_path):
    from caliber_jax import train

    calls = []

    def tokenize_fn(texts, max_length):
        calls.append(len(texts))
        return [list(range(min(len(t.split()) + 2, max_length))) for t in texts]

    source = _Source(["a b c", "d", "e f g h i j"], ["a b x", "", ""])
    cache = tmp_path / "token_lengths" / "train_k.npz"
    first = train.corpus_lengths(source, tokenize_fn, max_length=6, cache=cache)
    assert [x.tolist() for x in first] == [[5, 3, 6], [5, 2, 2]]
    assert calls and cache.exists()
    calls.clear()
    again = train.corpus_lengths(source, tokenize_fn, max_length=6, cache=cache)
    assert calls == [] and [x.tolist() for x in again] == [[5, 3, 6], [5, 2, 2]]
