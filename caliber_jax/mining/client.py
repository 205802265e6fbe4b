"""A small client for OpenAI-compatible servers (vLLM, llama.cpp server, Ollama, hosted APIs).

Speaks `/v1/chat/completions` and `/v1/completions` over plain HTTP (`urllib`), retries 429/5xx and
connection errors with exponential backoff, bounds the number of requests in flight, and caches
every response on disk under the SHA-256 of the request JSON, so a rerun or a crash never sends
(or pays for) the same request twice. No jax.
"""

import concurrent.futures
import hashlib
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RETRY_STATUS = (408, 409, 429, 500, 502, 503, 504)
ENDPOINTS = ("chat", "completions")


class RequestError(RuntimeError):
    """A request failed for good (a non-retryable status, or retries exhausted)."""


def request_key(endpoint: str, payload: dict[str, Any]) -> str:
    """Cache key: SHA-256 of the canonical JSON of (endpoint, payload)."""
    blob = json.dumps({"endpoint": endpoint, "payload": payload}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ResponseCache:
    """One JSON file per request under `directory/<key[:2]>/<key>.json`, written atomically."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        path = self._path(key)
        if not path.is_file():
            return None
        return json.loads(path.read_text(encoding="utf-8"))["response"]

    def put(self, key: str, request: dict[str, Any], response: dict[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps({"request": request, "response": response}), encoding="utf-8")
        os.replace(tmp, path)


class OpenAIClient:
    """Cached, retrying, concurrency-limited calls to one model on one OpenAI-compatible server.

    Attributes:
      calls: HTTP requests actually sent (retries included); cache hits do not count.
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key_env: str | None,
        cache_dir: str | os.PathLike | None,
        max_retries: int,
        backoff_seconds: float,
        max_backoff_seconds: float,
        concurrency: int,
        timeout_seconds: float,
        sleep_fn: Callable[[float], None] = time.sleep,
    ):
        """Args:
        base_url: server root, e.g. "http://localhost:8000/v1" (a missing "/v1" is added).
        model: model name sent with every request.
        api_key_env: name of the environment variable holding the API key (None or unset:
          no Authorization header, as local servers need).
        cache_dir: response cache directory; None disables caching.
        max_retries: retries after the first attempt for 429/5xx/connection errors.
        backoff_seconds: first retry delay; doubles each retry (a Retry-After header wins).
        max_backoff_seconds: cap on one delay.
        concurrency: requests in flight at once in `map`.
        timeout_seconds: socket timeout per request.
        sleep_fn: how to wait between retries (tests pass a recorder).
        """
        if concurrency < 1 or max_retries < 0:
            raise ValueError(
                f"need concurrency >= 1 and max_retries >= 0, got {concurrency}, {max_retries}"
            )
        base = base_url.rstrip("/")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        self.model = model
        self.api_key = os.environ.get(api_key_env) if api_key_env else None
        self.cache = ResponseCache(cache_dir) if cache_dir else None
        self.max_retries = max_retries
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.concurrency = concurrency
        self.timeout_seconds = timeout_seconds
        self.sleep_fn = sleep_fn
        self.calls = 0
        self._lock = threading.Lock()

    def chat(self, messages: Sequence[dict[str, str]], **params: Any) -> dict[str, Any]:
        """POST /chat/completions with `messages` and extra params (n, logprobs, temperature)."""
        return self.request("chat", {"messages": list(messages), **params})

    def complete(self, prompt: str, **params: Any) -> dict[str, Any]:
        """POST /completions with `prompt` and extra params (n, logprobs, max_tokens)."""
        return self.request("completions", {"prompt": prompt, **params})

    def request(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        """One cached call; `endpoint` is "chat" or "completions"."""
        if endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint={endpoint!r}, expected one of {ENDPOINTS}")
        payload = {"model": self.model, **body}
        key = request_key(endpoint, payload)
        if self.cache is not None:
            cached = self.cache.get(key)
            if cached is not None:
                return cached
        response = self._send(endpoint, payload)
        if self.cache is not None:
            self.cache.put(key, payload, response)
        return response

    def map(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        """Runs (endpoint, body) calls with at most `concurrency` in flight; results in order."""
        if self.concurrency == 1 or len(calls) <= 1:
            return [self.request(endpoint, body) for endpoint, body in calls]
        with concurrent.futures.ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(lambda call: self.request(*call), calls))

    def _send(self, endpoint: str, payload: dict[str, Any]) -> dict[str, Any]:
        path = "/chat/completions" if endpoint == "chat" else "/completions"
        url = self.base_url + path
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(payload).encode("utf-8")
        delay = self.backoff_seconds
        for attempt in range(self.max_retries + 1):
            with self._lock:
                self.calls += 1
            retry_after = None
            try:
                request = urllib.request.Request(url, data=data, headers=headers, method="POST")
                with urllib.request.urlopen(request, timeout=self.timeout_seconds) as response:
                    return json.loads(response.read().decode("utf-8"))
            except urllib.error.HTTPError as error:
                detail = error.read().decode("utf-8", "replace")[:300]
                if error.code not in RETRY_STATUS or attempt == self.max_retries:
                    raise RequestError(f"{url}: HTTP {error.code}: {detail}") from error
                retry_after = _retry_after(error.headers.get("Retry-After"))
            except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
                if attempt == self.max_retries:
                    raise RequestError(f"{url}: {error}") from error
            self.sleep_fn(
                min(retry_after if retry_after is not None else delay, self.max_backoff_seconds)
            )
            delay *= 2
        raise AssertionError("unreachable")


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def choice_texts(response: dict[str, Any]) -> list[str]:
    """The generated text of every choice (chat `message.content` or completions `text`)."""
    texts = []
    for choice in response.get("choices", []):
        message = choice.get("message")
        texts.append(message.get("content") or "" if message else choice.get("text") or "")
    return texts


def choice_mean_logprobs(response: dict[str, Any]) -> list[float | None]:
    """Mean token log-probability of every choice, or None where the server sent none.

    Chat responses carry `logprobs.content[i].logprob`; completions carry
    `logprobs.token_logprobs` (vLLM, llama.cpp and OpenAI all follow one of the two).
    """
    means = []
    for choice in response.get("choices", []):
        logprobs = choice.get("logprobs") or {}
        if isinstance(logprobs.get("content"), list):
            values = [item.get("logprob") for item in logprobs["content"]]
        else:
            values = logprobs.get("token_logprobs") or []
        values = [float(v) for v in values if v is not None]
        means.append(sum(values) / len(values) if values else None)
    return means
