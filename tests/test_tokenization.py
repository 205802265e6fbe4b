"""The offline Qwen3 tokenizer equals tiktoken on the real vocabulary and real filings text."""

import unicodedata

import tiktoken
from tiktoken.load import load_tiktoken_bpe

from caliber_jax import tokenization


def test_ids_equal_tiktoken_on_filings(qwen_tokenizer_dir, filing_passages):
    tokenizer = tokenization.load_tokenizer(qwen_tokenizer_dir)
    ranks = load_tiktoken_bpe(str(tokenization.default_qwen_vocab_file()))
    assert len(ranks) == 151_643
    reference = tiktoken.Encoding(
        "qwen", pat_str=tokenization.QWEN_PATTERN, mergeable_ranks=ranks, special_tokens={}
    )
    texts = filing_passages + ["Revenue grew 12.4% to $1,234.5 million in FY2022 (Q3 2021: −3.2%)."]
    total = 0
    for text in texts:
        # The HF tokenizer applies NFC like Qwen2TokenizerFast; tiktoken does not normalise.
        expected = reference.encode(unicodedata.normalize("NFC", text))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids == expected
        total += len(ids)
    assert total > 5000


def test_appends_endoftext_and_special_ids(qwen_tokenizer_dir):
    tokenizer = tokenization.load_tokenizer(qwen_tokenizer_dir)
    assert len(tokenizer) == 151_669
    ids = tokenizer("net income")["input_ids"]
    assert ids[-1] == 151_643
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == 151_644
    assert tokenizer.convert_tokens_to_ids("</think>") == 151_668
    truncated = tokenization.tokenize(tokenizer, ["word " * 100], max_length=16)[0]
    assert len(truncated) == 16 and truncated[-1] == 151_643


def test_query_format():
    assert tokenization.format_query(
        "What was revenue?", "Given a question, retrieve passages"
    ) == ("Instruct: Given a question, retrieve passages\nQuery:What was revenue?")
    assert tokenization.format_query("doc text", None) == "doc text"


def test_training_tokenize_fn_keeps_each_threads_length(minilm_dir, filing_passages):
    """The loader tokenizes passages (max_length) and training queries (query_length) from
    different threads; a fast tokenizer shared between them truncates one at the other's length."""
    import pickle
    from concurrent import futures

    from caliber_jax.train import TokenizeFn

    tokenize_fn = pickle.loads(pickle.dumps(TokenizeFn(str(minilm_dir))))
    texts = [text for text in filing_passages if len(text) > 600][:8]
    expected = {n: [len(row) for row in tokenize_fn(texts, n)] for n in (16, 128)}
    assert expected[16] == [16] * len(texts) and max(expected[128]) == 128

    def hammer(max_length: int) -> bool:
        return all([len(row) for row in tokenize_fn(texts, max_length)] == expected[max_length]
                   for _ in range(200))  # fmt: skip

    with futures.ThreadPoolExecutor(4) as pool:
        assert all(pool.map(hammer, [16, 128, 16, 128]))


def test_tokenize_from_threads_keeps_each_calls_length(minilm_dir):
    """Loaders tokenize query and passage fields in threads with different limits; the fast
    tokenizer's truncation length is shared state, so each call must encode under its own."""
    import concurrent.futures

    tokenizer = tokenization.load_tokenizer(minilm_dir)
    texts = ["Revenue increased 4% to $3.2 billion in fiscal 2019, driven by pricing. " * 8] * 16

    def lengths(max_length: int) -> set[int]:
        return {len(ids) for ids in tokenization.tokenize(tokenizer, texts, max_length=max_length)}

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        limits = [8, 64] * 200
        found = list(pool.map(lengths, limits))
    assert all(got == {limit} for got, limit in zip(found, limits, strict=True))
