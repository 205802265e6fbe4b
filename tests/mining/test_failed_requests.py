"""A judge request that fails for now (HTTP 500 after the retries) is no grade: every stage's
grade store (judgments, held-out grades, `GradeCache`) leaves it out, the run that saw it counts
the pair as not relevant and says how many failed, and the next run asks again. Against the
local OpenAI-compatible server of test_client (no network)."""

import threading

import pytest

from caliber_jax.data import corpus
from caliber_jax.mining import final_eval, judge, mining
from tests.mining.test_client import FakeServer, make_client
from tests.mining.test_final_eval import _run

CHUNKS = {f"D:{i}": {"id": f"D:{i}", "doc_name": "D", "text": f"chunk {i}"} for i in range(3)}
# retries=1: two 500s in a row fail a request for good.
FAIL = [500, 500]


@pytest.fixture()
def server():
    srv = FakeServer()
    srv.reply = lambda path, body: "4"
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _judge(server, tmp_path):
    return judge.OpenAIJudge(
        make_client(server, tmp_path, retries=1), max_tokens=4, max_passage_chars=100
    )


def test_judge_reports_which_requests_failed(server, tmp_path):
    server.failures = [200, *FAIL, 200]
    llm_judge = _judge(server, tmp_path)
    grades, failures = judge.grade_with_failures(llm_judge, ["q"] * 3, list(CHUNKS.values()))
    assert (grades, failures) == ([4, None, 4], [None, "HTTP 500", None])
    assert dict(llm_judge.unusable) == {"request failed: HTTP 500": 1}


def test_judging_stage_asks_again_for_failed_requests(server, tmp_path):
    candidates = [
        {"query_id": "q", "query": "q", "doc_name": "D", "chunk_id": f"D:{i}"} for i in range(3)
    ]
    path, logs = tmp_path / "judgments.jsonl", []
    server.failures = [200, *FAIL, 200]
    first = mining.judge_candidates(
        _judge(server, tmp_path), candidates, CHUNKS, path, batch_size=2, log_fn=logs.append
    )
    # This run: no grade for D:1 (not relevant, as a pair the judge could not grade), marked.
    assert [r["grade"] for r in first] == [4, None, 4]
    assert [r.get("failed") for r in first] == [None, "HTTP 500", None]
    assert mining.failed_count(first) == 1
    # A kill before the rename: the resumed partial file asks for D:1 again, then goes on.
    lines = path.read_text().splitlines(keepends=True)
    partial = tmp_path / "again.partial.jsonl"
    partial.write_text("".join(lines[:2]))
    sent = len(server.requests)
    resumed = mining.judge_candidates(
        _judge(server, tmp_path), candidates, CHUNKS, tmp_path / "again.jsonl", batch_size=2,
        log_fn=logs.append,
    )  # fmt: skip
    assert [r["grade"] for r in resumed] == [4, 4, 4] and mining.failed_count(resumed) == 0
    assert len(server.requests) == sent + 1  # D:1 only (D:2 is in the response cache)
    assert "asking again for 1 pairs of again.partial.jsonl" in logs[-1]
    # A finished file with a failed pair: the rerun asks for it and rewrites the file.
    again = mining.judge_candidates(
        _judge(server, tmp_path), candidates, CHUNKS, path, batch_size=2, log_fn=logs.append
    )
    assert again == resumed == corpus.load_jsonl(path)
    assert (tmp_path / "again.jsonl").read_bytes() == path.read_bytes()
    assert len(server.requests) == sent + 1  # D:1's grade came back above: response cache
    assert "asking again for 1 pairs of judgments.jsonl" in logs[-1]


def test_held_out_grades_of_failed_requests_are_not_cached(server, tmp_path):
    rankings = {"base": {("q1", "D"): ["D:0", "D:1"]}, "exp": {("q1", "D"): ["D:1", "D:0"]}}
    queries = [{"id": "q1", "text": "text of q1"}]
    cache, logs = tmp_path / "eval_judgments.jsonl", []
    server.failures = list(FAIL)  # D:0, asked first, fails
    per_model = mining.judged_eval(
        rankings, _judge(server, tmp_path), CHUNKS, cache, k=2, queries=queries,
        log_fn=logs.append,
    )  # fmt: skip
    assert per_model["base"]["mrr_at_2"] == [0.5]  # D:0 not relevant in this run
    assert [r["chunk_id"] for r in corpus.load_jsonl(cache)] == ["D:1"]
    assert logs and "1 grades failed (HTTP 500 x1)" in logs[0]
    sent = len(server.requests)
    per_model = mining.judged_eval(
        rankings, _judge(server, tmp_path), CHUNKS, cache, k=2, queries=queries, log_fn=print
    )
    assert per_model["base"]["mrr_at_2"] == [1.0]
    assert len(server.requests) == sent + 1
    assert {r["chunk_id"]: r["grade"] for r in corpus.load_jsonl(cache)} == {"D:1": 4, "D:0": 4}


def test_grade_cache_keeps_failed_requests_for_one_run_only(server, tmp_path):
    path = tmp_path / "grades.jsonl"
    items = [("q1", "text of q1", CHUNKS["D:0"]), ("q1", "text of q1", CHUNKS["D:1"])]
    llm_judge = _judge(server, tmp_path)
    cache = final_eval.GradeCache(path, "llm")
    server.failures = list(FAIL)
    assert cache.grade(llm_judge, items) == [None, 4]
    assert cache.failed == {("q1", "D:0"): "HTTP 500"}
    assert path.read_text().count("\n") == 1  # D:1 only
    sent = len(server.requests)
    assert cache.grade(llm_judge, items) == [None, 4]  # this run: not asked again
    assert len(server.requests) == sent
    assert final_eval.GradeCache(path, "llm").grade(llm_judge, items) == [4, 4]  # a rerun asks
    assert len(server.requests) == sent + 1


def test_final_evaluation_counts_failed_grades(server, tmp_path):
    # The toy of test_final_eval with P = 2: pair (q0, A), chunks A0 (asked first) and A1.
    server.failures = list(FAIL)
    logs = []
    [result] = _run(tmp_path, _judge(server, tmp_path), fraction_p=2, log_fn=logs.append)
    assert (result["judged_chunks"], result["failed_grades"]) == (2, 1)
    assert "1 of 2 grades failed" in logs[-1]
