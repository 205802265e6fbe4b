"""The openai backends against a local HTTP server speaking the OpenAI API (no network).

The server (http.server on 127.0.0.1, port 0) answers /v1/chat/completions and /v1/completions
with log-probabilities, can fail the next requests with chosen statuses, and counts requests.
"""

import email.utils
import http.server
import json
import threading
import time

import numpy as np
import pytest

from caliber_jax.mining import client as client_lib
from caliber_jax.mining import judge, querygen


class FakeServer(http.server.ThreadingHTTPServer):
    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[tuple[str, dict, dict]] = []  # (path, body, headers)
        # How to answer the next requests: a status (200: normal), (status, headers),
        # "truncated" (a body cut short), "malformed" (200, not JSON), "no choices" (200, JSON
        # without choices), "string message" (200, a choice whose message is a string).
        self.failures: list = []
        self.reply = lambda path, body: "1"
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        del args

    def do_POST(self):
        server: FakeServer = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with server.lock:
            server.requests.append((self.path, body, dict(self.headers)))
            status = server.failures.pop(0) if server.failures else 200
        if status in ("truncated", "malformed", "no choices", "string message"):
            data = {
                "truncated": b'{"id": "x", "choices": [{"text": "cut sh',
                "malformed": b'{"id": "x", "choices": [oops',
                "no choices": b'{"id": "x", "object": "text_completion"}',
                "string message": b'{"choices": [{"message": "3"}]}',
            }[status]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            # A truncated body promises more bytes than it sends, then the connection closes.
            self.send_header("Content-Length", str(len(data) + 50 * (status == "truncated")))
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True
            return
        headers = {}
        if isinstance(status, tuple):
            status, headers = status
        if status != 200:
            data = b'{"error": {"message": "try later"}}'
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        text = server.reply(self.path, body)
        # Token log-probs: -0.1 per token when the text contains "good", else -2.0.
        tokens = text.split() or [""]
        value = -0.1 if "good" in text else -2.0
        if self.path.endswith("/chat/completions"):
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": {"content": [{"token": t, "logprob": value} for t in tokens]}
                if body.get("logprobs")
                else None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": {"tokens": tokens, "token_logprobs": [value] * len(tokens)}
                if body.get("logprobs")
                else None,
            }
        data = json.dumps({"id": "x", "model": body["model"], "choices": [choice]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture()
def server():
    srv = FakeServer()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def make_client(server, tmp_path, *, sleeps=None, retries=3, concurrency=1, cache=True):
    return client_lib.OpenAIClient(
        base_url=server.url,
        model="local-model",
        api_key_env="CALIBER_TEST_KEY",
        cache_dir=tmp_path / "cache" if cache else None,
        max_retries=retries,
        backoff_seconds=0.5,
        max_backoff_seconds=10.0,
        concurrency=concurrency,
        timeout_seconds=10.0,
        sleep_fn=(sleeps.append if sleeps is not None else lambda s: None),
    )


def test_retries_with_backoff_then_success_and_api_key(server, tmp_path, monkeypatch):
    monkeypatch.setenv("CALIBER_TEST_KEY", "sk-test")
    sleeps = []
    client = make_client(server, tmp_path, sleeps=sleeps)
    server.failures = [500, 429, 503]
    server.reply = lambda path, body: "2"
    response = client.chat([{"role": "user", "content": "hi"}])
    assert client_lib.choice_texts(response) == ["2"]
    assert client.calls == 4 and len(server.requests) == 4
    assert sleeps == [0.5, 1.0, 2.0]  # exponential backoff
    path, body, headers = server.requests[-1]
    assert path == "/v1/chat/completions" and body["model"] == "local-model"
    assert {k.lower(): v for k, v in headers.items()}["authorization"] == "Bearer sk-test"


def test_gives_up_after_retries_and_on_client_errors(server, tmp_path):
    client = make_client(server, tmp_path, retries=2)
    server.failures = [500, 500, 500]
    assert client_lib.failure_reason(client.complete("x")) == "HTTP 500"
    assert len(server.requests) == 3
    server.failures = [400]
    assert client_lib.failure_reason(client.complete("y")) == "HTTP 400"
    assert len(server.requests) == 4  # 400 is not retried
    # No key in the environment: the placeholder, never another variable's value.
    headers = {k.lower(): v for k, v in server.requests[-1][2].items()}
    assert headers["authorization"] == f"Bearer {client_lib.NO_KEY}"


def test_cache_prevents_a_second_call(server, tmp_path):
    first = make_client(server, tmp_path)
    server.reply = lambda path, body: "3"
    a = first.complete("same prompt", max_tokens=2)
    # A new client (a rerun after a crash) with the same cache directory pays nothing.
    second = make_client(server, tmp_path)
    b = second.complete("same prompt", max_tokens=2)
    assert a == b and len(server.requests) == 1 and second.calls == 0
    second.complete("same prompt", max_tokens=3)  # a different request is sent
    assert len(server.requests) == 2
    assert len(list((tmp_path / "cache").rglob("*.json"))) == 2


def test_inpars_generation_selects_by_mean_logprob(server, tmp_path):
    """Chunk 'good' gets mean log-prob -0.1, the others -2.0; top-1 per document keeps it."""
    server.reply = lambda path, body: (
        "Relevant Query: what is the good number?"
        if "good chunk" in json.dumps(body)
        else "what is the other number?"
    )
    client = make_client(server, tmp_path, concurrency=3)
    generator = querygen.OpenAIQueryGenerator(
        client, endpoint="completions", max_tokens=16, temperature=0.0, max_document_chars=500
    )
    chunks = [
        {"id": f"D:{i}", "doc_name": "D", "text": text}
        for i, text in enumerate(["plain text", "a good chunk", "more text"])
    ]
    scored = generator.generate(chunks)
    assert [s[0] for s in scored] == [
        "what is the other number?",
        "what is the good number?",
        "what is the other number?",
    ]
    np.testing.assert_allclose([s[1] for s in scored], [-2.0, -0.1, -2.0])
    selected = querygen.select_top(chunks, scored, per_doc=1)
    assert [(q["chunk_id"], q["text"]) for q in selected] == [("D:1", "what is the good number?")]
    body = server.requests[0][1]
    assert body["logprobs"] == 1 and "Example 3:\nDocument:" in body["prompt"]
    # Chat endpoint: logprobs=True and the chat logprob layout.
    chat = querygen.OpenAIQueryGenerator(
        client, endpoint="chat", max_tokens=16, temperature=0.0, max_document_chars=500
    )
    assert chat.generate(chunks[1:2])[0][1] == pytest.approx(-0.1)
    assert server.requests[-1][1]["logprobs"] is True
    # A failed request and an empty generation give no query, counted by reason.
    server.failures = [400]
    server.reply = lambda path, body: "  "
    assert chat.generate([{"id": "E:0", "doc_name": "E", "text": t} for t in "xy"]) == [
        (None, None),
        (None, None),
    ]
    assert dict(chat.unusable) == {"request failed: HTTP 400": 1, "empty generation": 1}


def test_openai_judge_prompt_and_strict_parsing(server, tmp_path):
    replies = iter(["4", "Score: 2", "3 or 4", "five", "5", " "])
    server.reply = lambda path, body: next(replies)
    llm_judge = judge.OpenAIJudge(
        make_client(server, tmp_path), max_tokens=4, max_passage_chars=100
    )
    grades = llm_judge.grade(
        ["q1", "q2", "q3", "q4", "q5", "q6"], [{"text": f"passage {i}"} for i in range(6)]
    )
    assert grades == [4, 2, None, None, None, None]
    assert dict(llm_judge.unusable) == {
        "unparseable reply": 2,
        "off-scale grade": 1,
        "empty reply": 1,
    }
    prompt = server.requests[0][1]["messages"][0]["content"]
    for criteria in judge.TABLE_II.values():
        assert criteria in prompt
    assert "Query: q1" in prompt and "Passage: passage 0" in prompt


def test_synthetic_queries_few_shot(server, tmp_path):
    """Step 1a: exemplars from distinct clusters; list markers stripped; short, non-question
    and repeated lines rejected; stops at the requested number."""
    server.reply = lambda path, body: (
        "1. What drove the change in operating margin this year?\n"
        "- too short?\n"
        "Revenue grew a lot in the year under review\n"
        "How did free cash flow compare with the prior year?\n"
        "What drove the change in operating margin this year?"
    )
    exemplars = [f"What was item {i} in the year?" for i in range(6)]
    made = querygen.synthesize_queries(
        make_client(server, tmp_path),
        exemplars,
        [0, 0, 1, 1, 2, 2],
        num_queries=2,
        doc_class="10-K",
        per_prompt=3,
        min_words=5,
        max_prompts=5,
        seed=0,
        temperature=0.7,
    )
    assert made == [
        "What drove the change in operating margin this year?",
        "How did free cash flow compare with the prior year?",
    ]
    prompt = server.requests[0][1]["messages"][0]["content"]
    shots = [line for line in prompt.splitlines() if line.startswith("What was item")]
    assert len(shots) == 3 and len({int(s.split()[3]) // 2 for s in shots}) == 3  # 3 clusters
    assert len(server.requests) == 1


# ------------------------------------------------- what real servers do (issue #38 review)


def test_a_non_retryable_error_is_a_recorded_unusable_result(server, tmp_path):
    """A 400 (an over-long prompt) is not retried, does not raise out of `map`, is counted,
    is not cached (a rerun asks again), and the judge turns it into None with its reason."""
    client = make_client(server, tmp_path)
    server.failures = [200, 400, 200]
    server.reply = lambda path, body: "4"
    calls = [("chat", {"messages": [{"role": "user", "content": f"m{i}"}]}) for i in range(3)]
    responses = client.map(calls)
    assert [client_lib.failure_reason(r) for r in responses] == [None, "HTTP 400", None]
    assert [client_lib.choice_texts(r) for r in responses] == [["4"], [], ["4"]]
    assert len(server.requests) == 3 and dict(client.failures) == {"HTTP 400": 1}
    assert len(list((tmp_path / "cache").rglob("*.json"))) == 2
    again = make_client(server, tmp_path)
    assert client_lib.failure_reason(again.map(calls)[1]) is None
    assert len(server.requests) == 4  # only the failed request went out again
    # The judge: None for the failed request, with its reason counted.
    server.failures = [200, 400, 200]
    replies = iter(["4", "2"])
    server.reply = lambda path, body: next(replies)
    llm_judge = judge.OpenAIJudge(
        make_client(server, tmp_path, cache=False), max_tokens=4, max_passage_chars=100
    )
    grades = llm_judge.grade(["q1", "q2", "q3"], [{"text": f"p{i}"} for i in range(3)])
    assert grades == [4, None, 2]
    assert dict(llm_judge.unusable) == {"request failed: HTTP 400": 1}


def test_truncated_bodies_and_malformed_json_are_retried(server, tmp_path):
    sleeps = []
    client = make_client(server, tmp_path, sleeps=sleeps)
    server.failures = ["truncated", "malformed", "no choices", 200]
    server.reply = lambda path, body: "3"
    response = client.complete("x")
    assert client_lib.choice_texts(response) == ["3"] and len(server.requests) == 4
    assert sleeps == [0.5, 1.0, 2.0] and client.calls == 4
    # Retries exhausted: an unusable result with its reason, not an exception.
    server.failures = ["malformed"] * 4
    response = client.complete("y")
    assert client_lib.failure_reason(response) == "malformed response"
    assert client.failures["malformed response"] == 1 and len(server.requests) == 8


def test_a_choice_that_is_no_completion_is_a_failed_request_never_cached(server, tmp_path):
    """{"choices": [{"message": "3"}]} has a choices list but no completion in it: retried,
    then a failed request of this pair (counted, one line naming the URL and the field), never
    cached, so a rerun asks again; one cached before responses were checked is asked again."""
    server.reply = lambda path, body: "4"
    client = make_client(server, tmp_path, retries=1)
    llm_judge = judge.OpenAIJudge(client, max_tokens=4, max_passage_chars=100)
    server.failures = ["string message"] * 2
    assert llm_judge.grade(["q"], [{"text": "p"}]) == [None]
    assert dict(llm_judge.unusable) == {"request failed: malformed response": 1}
    assert dict(client.failures) == {"malformed response": 1}
    message = client.failure_examples["malformed response"]
    assert message.startswith(
        f"{server.url}/chat/completions: choices[0].message is str, not an object: "
    )
    assert "\n" not in message
    assert not list((tmp_path / "cache").rglob("*.json"))
    rerun = judge.OpenAIJudge(make_client(server, tmp_path), max_tokens=4, max_passage_chars=100)
    assert rerun.grade(["q"], [{"text": "p"}]) == [4] and len(server.requests) == 3
    # A malformed body in the cache (written before the check): asked again, overwritten.
    [path] = (tmp_path / "cache").rglob("*.json")
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "response": {"choices": [{"message": "3"}]}}))
    again = judge.OpenAIJudge(make_client(server, tmp_path), max_tokens=4, max_passage_chars=100)
    assert again.grade(["q"], [{"text": "p"}]) == [4] and len(server.requests) == 4
    assert client_lib.choice_texts(json.loads(path.read_text())["response"]) == ["4"]


@pytest.mark.parametrize(
    "endpoint, response, problem",
    [
        ("chat", {"choices": []}, None),
        ("chat", {"choices": [{"message": {"content": "3"}}]}, None),
        ("chat", {"choices": [{"message": {"content": None}}]}, None),  # the API allows null
        ("completions", {"choices": [{"text": "3", "logprobs": None}]}, None),
        ("chat", [], "no choices list"),
        ("chat", {"choices": ["3"]}, "choices[0] is str, not an object"),
        ("chat", {"choices": [{"message": "3"}]}, "choices[0].message is str, not an object"),
        ("chat", {"choices": [{"text": "3"}]}, "choices[0].message is NoneType, not an object"),
        ("chat", {"choices": [{"message": {"content": 3}}]},
         "choices[0].message.content is not a string"),
        ("completions", {"choices": [{"message": {"content": "3"}}]},
         "choices[0].text is not a string"),
        ("completions", {"choices": [{"text": "3", "logprobs": "-1"}]},
         "choices[0].logprobs is str, not an object"),
        ("chat", {"choices": [{"message": {"content": "3"}, "logprobs": {"content": [-1.0]}}]},
         "choices[0].logprobs.content is not a list of objects"),
        ("completions", {"choices": [{"text": "3", "logprobs": {"token_logprobs": ["-1"]}}]},
         "choices[0].logprobs.token_logprobs is not a list of numbers"),
    ],
)  # fmt: skip
def test_response_problem_names_what_is_wrong(endpoint, response, problem):
    assert client_lib.response_problem(endpoint, response) == problem
    if problem is None:  # what passes, the readers take without raising
        client_lib.choice_texts(response)
        client_lib.choice_mean_logprobs(response)


def test_retryable_statuses_honour_retry_after_then_give_up(server, tmp_path):
    sleeps = []
    client = make_client(server, tmp_path, sleeps=sleeps, retries=2)
    server.failures = [(429, {"Retry-After": "3"}), 503, 500]
    response = client.complete("z")
    assert client_lib.failure_reason(response) == "HTTP 500"
    assert sleeps == [3.0, 1.0] and len(server.requests) == 3


def test_configuration_errors_stop_with_one_line(server, tmp_path):
    """A wrong key, model or URL (401/403/404), a TLS mismatch or an unreachable server is not
    a property of one request: retrying the next request would fail the same way."""
    client = make_client(server, tmp_path)
    server.failures = [401]
    with pytest.raises(client_lib.RequestError, match="HTTP 401"):
        client.complete("a")
    assert len(server.requests) == 1
    sleeps = []
    tls = client_lib.OpenAIClient(
        base_url=server.url.replace("http://", "https://"),
        model="local-model",
        api_key_env=None,
        cache_dir=None,
        max_retries=2,
        backoff_seconds=0.5,
        max_backoff_seconds=10.0,
        concurrency=1,
        timeout_seconds=10.0,
        sleep_fn=sleeps.append,
    )
    with pytest.raises(client_lib.RequestError, match="cannot reach"):
        tls.complete("b")
    assert sleeps == [0.5, 1.0]  # retried (a server restarting), then stopped


def test_cache_key_includes_the_server(server, tmp_path):
    """Two servers under one model name: the second is asked, not answered from the first's
    cache."""
    other = FakeServer()
    thread = threading.Thread(target=other.serve_forever, daemon=True)
    thread.start()
    try:
        server.reply = lambda path, body: "from one"
        other.reply = lambda path, body: "from two"
        first = make_client(server, tmp_path)
        assert client_lib.choice_texts(first.complete("same")) == ["from one"]
        second = make_client(other, tmp_path)
        assert client_lib.choice_texts(second.complete("same")) == ["from two"]
        assert len(other.requests) == 1
    finally:
        other.shutdown()
        other.server_close()


def test_retry_after_negative_or_unparseable_never_reaches_sleep_as_negative(server, tmp_path):
    """A negative Retry-After (or -ms) waits 0 s; NaN and text that is no date fall back to the
    backoff; an HTTP date waits until then (0 s once past). With the real `time.sleep` a
    negative or NaN delay would raise."""
    sleeps = []
    client = make_client(server, tmp_path, sleeps=sleeps, retries=6)
    past = email.utils.formatdate(time.time() - 3600, usegmt=True)
    server.failures = [(429, {"Retry-After": "-5"}), (503, {"retry-after-ms": "-250"}),
                       (429, {"Retry-After": "nan"}), (429, {"Retry-After": "soon"}),
                       (503, {"Retry-After": past}), 200]  # fmt: skip
    assert client_lib.choice_texts(client.complete("wait")) == ["1"]
    assert sleeps == [0.0, 0.0, 2.0, 4.0, 0.0]
    future = email.utils.formatdate(time.time() + 5, usegmt=True)
    delay = client_lib._retry_after({"retry-after": future})
    assert 3.0 < delay <= 5.0
    real = make_client(server, tmp_path, retries=1, cache=False)
    real.sleep_fn = time.sleep
    server.failures = [(429, {"Retry-After": "-5"}), 200]
    assert client_lib.choice_texts(real.complete("real sleep")) == ["1"]


def test_cache_key_names_the_server_one_way(server, tmp_path):
    """localhost and 127.0.0.1, a trailing slash, the host's case and an explicit default port
    name the same server: one cache entry serves them all; another port is another server."""
    port = server.server_address[1]
    same = [f"http://127.0.0.1:{port}/v1", f"http://localhost:{port}/v1/",
            f"HTTP://LocalHost:{port}", f"http://127.0.0.1:{port}//"]  # fmt: skip
    keys = {client_lib.request_key(url, "chat", {"a": 1}) for url in same}
    assert len(keys) == 1
    assert client_lib.request_key("http://example.com:80/v1", "chat", {}) == (
        client_lib.request_key("http://EXAMPLE.com/v1/", "chat", {})
    )
    assert client_lib.request_key(f"http://127.0.0.1:{port + 1}/v1", "chat", {"a": 1}) not in keys
    assert client_lib.request_key("https://example.com/v1", "chat", {}) != (
        client_lib.request_key("http://example.com/v1", "chat", {})
    )
    first = make_client(server, tmp_path)
    assert client_lib.choice_texts(first.complete("once")) == ["1"]
    for url in same[1:]:
        other = client_lib.OpenAIClient(
            base_url=url, model="local-model", api_key_env=None, cache_dir=tmp_path / "cache",
            max_retries=0, backoff_seconds=0.5, max_backoff_seconds=10.0, concurrency=1,
            timeout_seconds=10.0,
        )  # fmt: skip
        assert client_lib.choice_texts(other.complete("once")) == ["1"]
    assert len(server.requests) == 1
