"""Token lengths written once per (passages, tokenizer, max_length) and read back at launch."""

import threading

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


def _run_processes(count, fn):
    """fn(processes) on `count` threads, each a process with gather / first collectives that
    block until every process has called them (as jax's do). Returns each process's result."""
    barrier = threading.Barrier(count, timeout=10)
    slots = [None] * count
    calls = []

    def exchange(index, value):
        slots[index] = value
        barrier.wait()
        everyone = list(slots)
        barrier.wait()
        return everyone

    results = [None] * count

    def run(index):
        def gather(x):
            calls.append(("gather", index))
            return np.stack(exchange(index, x))

        def first(tree):
            calls.append(("first", index))
            return exchange(index, tree)[0]

        processes = length_cache.Processes(index=index, count=count, gather=gather, first=first)
        results[index] = fn(processes)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert all(r is not None for r in results), "a process hung in a collective"
    return results, calls


def _tokenize(texts, max_length):
    return [list(range(min(len(t.split()) + 2, max_length))) for t in texts]


def test_process_0_decides_and_shares_the_kept_lengths(tmp_path):
    """Process 0's copy of the data holds the lengths, process 1's does not: both use process
    0's, nobody tokenizes, and nothing is written in process 1's copy."""
    source = _Source(["a b c", "d", "e f g h i j"], ["a b x", "", ""])
    kept = tmp_path / "copy0" / "train_k.npz"
    length_cache.save(kept, np.array([9, 8, 7]), np.array([1, 0, 0]))
    caches = [kept, tmp_path / "copy1" / "train_k.npz"]

    def fn(processes):
        def tokenize(texts, max_length):
            raise AssertionError(f"process {processes.index} tokenized")

        return length_cache.corpus_lengths(
            source, tokenize, max_length=6, cache=caches[processes.index], processes=processes
        )

    results, calls = _run_processes(2, fn)
    for lengths, pert in results:
        assert lengths.tolist() == [9, 8, 7] and pert.tolist() == [1, 0, 0]
        assert lengths.dtype == np.int64
    assert sorted(calls) == [("first", 0), ("first", 1)]
    assert not caches[1].parent.exists()


def test_without_kept_lengths_every_process_tokenizes_its_share_and_process_0_keeps_them(tmp_path):
    """Process 1's copy holds lengths process 0's lacks: ignored (process 0 decides); each
    tokenizes its share, the gather joins them, and process 0 writes them."""
    source = _Source(["a b c", "d", "e f g h i j"], ["a b x", "", ""])
    caches = [tmp_path / "copy0" / "train_k.npz", tmp_path / "copy1" / "train_k.npz"]
    length_cache.save(caches[1], np.array([1, 1, 1]), np.array([1, 1, 1]))

    def fn(processes):
        return length_cache.corpus_lengths(
            source, _tokenize, max_length=6, cache=caches[processes.index], processes=processes
        )

    results, calls = _run_processes(2, fn)
    for lengths, pert in results:
        assert lengths.tolist() == [5, 3, 6] and pert.tolist() == [5, 2, 2]
    assert sorted(calls) == [("first", 0), ("first", 1), ("gather", 0), ("gather", 1)]
    saved = length_cache.load(caches[0], 3)
    assert [x.tolist() for x in saved] == [[5, 3, 6], [5, 2, 2]]
