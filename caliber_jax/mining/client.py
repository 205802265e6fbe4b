"""A cached, concurrency-bounded client for OpenAI-compatible servers (vLLM, llama.cpp, Ollama,
hosted APIs) on the official `openai` package.

`openai` does the transport (connection pool, auth header, timeouts) and classifies failures into
its exception types. On top: one retry policy for every transient failure (408/409/429/5xx,
connection and read errors such as a body cut short, timeouts, and a 200 whose body is not a
completion, which the library does not retry), a bound on requests in flight, and a disk cache of
successful responses keyed by the SHA-256 of (server, endpoint, request), so a rerun or a crash
never sends (or pays for) the same request twice. A request that fails for good (a 400 for an
over-long prompt, retries exhausted) is returned as an error record with its reason and counted,
never raised: one bad request must not stop a stage. Failures that are not about one request (a
wrong key, model or URL: 401/403/404; a server that cannot be reached) raise `RequestError`. No
jax.
"""

import collections
import concurrent.futures
import datetime
import email.utils
import hashlib
import json
import math
import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import openai

RETRY_STATUS = (408, 409, 429, 500, 502, 503, 504)
# Statuses that say the configuration is wrong (key, model, URL), not the request.
FATAL_STATUS = (401, 403, 404)
ENDPOINTS = ("chat", "completions")
# Sent when no key is configured: local servers ignore it (vLLM's documented placeholder);
# `openai` refuses to build a client without one.
NO_KEY = "EMPTY"
# Names of this machine's loopback interface: one server whichever the config spells.
LOOPBACK = ("localhost", "127.0.0.1", "::1")
DEFAULT_PORTS = {"http": 80, "https": 443}


class RequestError(RuntimeError):
    """The server cannot serve any request as configured (wrong key/model/URL, unreachable)."""


class MalformedResponse(ValueError):
    """A 200 whose body is not a completion (see `response_problem`)."""


def api_root(base_url: str) -> str:
    """The server's API root as the client calls it: no trailing slash, "/v1" at the end."""
    base = base_url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


def server_name(base_url: str) -> str:
    """One spelling per server, for the cache key: scheme and host in lower case, loopback
    names (`LOOPBACK`) as "localhost", a scheme's default port dropped, the path as `api_root`
    gives it. "http://127.0.0.1:8000/" and "http://LocalHost:8000/v1" are one server."""
    parts = urllib.parse.urlsplit(api_root(base_url.strip()))
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    host = "localhost" if host in LOOPBACK else host
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address keeps its brackets
    port = parts.port
    netloc = shown if port in (None, DEFAULT_PORTS.get(scheme)) else f"{shown}:{port}"
    return urllib.parse.urlunsplit((scheme, netloc, parts.path, "", ""))


def request_key(base_url: str, endpoint: str, payload: dict[str, Any]) -> str:
    """Cache key: SHA-256 of the canonical JSON of (server, endpoint, payload), the server as
    `server_name` spells it."""
    blob = json.dumps(
        {"base_url": server_name(base_url), "endpoint": endpoint, "payload": payload},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def response_problem(endpoint: str, response: Any) -> str | None:
    """What makes a parsed 200 body no completion of `endpoint`, None if nothing does.

    A completion is an object with a `choices` list; each choice an object with, for "chat",
    a `message` object whose `content` is a string (or null, which the API allows: no text),
    for "completions" a string `text`; its `logprobs`, if any, an object whose `content` /
    `token_logprobs` are lists (of objects / of numbers or nulls). These are the fields
    `choice_texts` and `choice_mean_logprobs` read, so a response that passes never breaks
    them, cached or not.
    """
    if not isinstance(response, dict) or not isinstance(response.get("choices"), list):
        return "no choices list"
    for index, choice in enumerate(response["choices"]):
        where = f"choices[{index}]"
        if not isinstance(choice, dict):
            return f"{where} is {type(choice).__name__}, not an object"
        if endpoint == "chat":
            message = choice.get("message")
            if not isinstance(message, dict):
                return f"{where}.message is {type(message).__name__}, not an object"
            if not isinstance(message.get("content"), str | None):
                return f"{where}.message.content is not a string"
        elif not isinstance(choice.get("text"), str):
            return f"{where}.text is not a string"
        logprobs = choice.get("logprobs")
        if logprobs is None:
            continue
        if not isinstance(logprobs, dict):
            return f"{where}.logprobs is {type(logprobs).__name__}, not an object"
        content, tokens = logprobs.get("content"), logprobs.get("token_logprobs")
        if content is not None and not (
            isinstance(content, list) and all(isinstance(item, dict) for item in content)
        ):
            return f"{where}.logprobs.content is not a list of objects"
        if tokens is not None and not (
            isinstance(tokens, list) and all(_is_number_or_none(v) for v in tokens)
        ):
            return f"{where}.logprobs.token_logprobs is not a list of numbers"
    return None


def _is_number_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def failure_reason(response: dict[str, Any]) -> str | None:
    """Why a request failed for good ("HTTP 400", "malformed response", ...), None if it did
    not."""
    error = response.get("error")
    return error.get("reason") if isinstance(error, dict) and "reason" in error else None


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
      failures: reason -> number of requests that failed for good ("HTTP 400", "HTTP 500",
        "malformed response", "timeout", "connection").
      failure_examples: reason -> the one-line message of its first failure (the URL and what
        was wrong), for the log.
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
        api_key_env: name of the environment variable holding the API key (None or unset: a
          placeholder key, which local servers ignore).
        cache_dir: response cache directory; None disables caching.
        max_retries: retries after the first attempt of a transient failure.
        backoff_seconds: first retry delay; doubles each retry (a Retry-After header wins).
        max_backoff_seconds: cap on one delay.
        concurrency: requests in flight at once in `map`.
        timeout_seconds: timeout of one attempt.
        sleep_fn: how to wait between retries (tests pass a recorder).
        """
        if concurrency < 1 or max_retries < 0:
            raise ValueError(
                f"need concurrency >= 1 and max_retries >= 0, got {concurrency}, {max_retries}"
            )
        self.base_url = api_root(base_url)
        self.model = model
        api_key = os.environ.get(api_key_env) if api_key_env else None
        # Retries are ours (max_retries=0 here): one policy and one backoff for every transient
        # failure, including the malformed 200 that `openai` would hand back as success.
        self._openai = openai.OpenAI(
            base_url=self.base_url,
            api_key=api_key or NO_KEY,
            max_retries=0,
            timeout=timeout_seconds,
        )
        self.cache = ResponseCache(cache_dir) if cache_dir else None
        self.max_retries = max_retries
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.concurrency = concurrency
        self.sleep_fn = sleep_fn
        self.calls = 0
        self.failures: collections.Counter[str] = collections.Counter()
        self.failure_examples: dict[str, str] = {}
        self._lock = threading.Lock()

    def chat(self, messages: Sequence[dict[str, str]], **params: Any) -> dict[str, Any]:
        """POST /chat/completions with `messages` and extra params (n, logprobs, temperature)."""
        return self.request("chat", {"messages": list(messages), **params})

    def complete(self, prompt: str, **params: Any) -> dict[str, Any]:
        """POST /completions with `prompt` and extra params (n, logprobs, max_tokens)."""
        return self.request("completions", {"prompt": prompt, **params})

    def request(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        """One cached call; `endpoint` is "chat" or "completions".

        Returns:
          The server's JSON response (checked by `response_problem`), or {"error": {"reason",
          "message"}} when the request failed for good (see `failure_reason`; the message is one
          line naming the URL; not cached, so a rerun asks again).
        """
        if endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint={endpoint!r}, expected one of {ENDPOINTS}")
        payload = {"model": self.model, **body}
        key = request_key(self.base_url, endpoint, payload)
        if self.cache is not None:
            cached = self.cache.get(key)
            # A malformed body cached before responses were checked is asked again (and
            # overwritten), not handed on to break the caller.
            if cached is not None and response_problem(endpoint, cached) is None:
                return cached
        response = self._send(endpoint, payload)
        reason = failure_reason(response)
        if reason is not None:
            with self._lock:
                self.failures[reason] += 1
                self.failure_examples.setdefault(reason, response["error"]["message"])
        elif self.cache is not None:
            self.cache.put(key, payload, response)
        return response

    def map(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        """Runs (endpoint, body) calls with at most `concurrency` in flight; results in order."""
        if self.concurrency == 1 or len(calls) <= 1:
            return [self.request(endpoint, body) for endpoint, body in calls]
        with concurrent.futures.ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(lambda call: self.request(*call), calls))

    def _post(self, endpoint: str, payload: dict[str, Any]) -> dict[str, Any]:
        path = "/chat/completions" if endpoint == "chat" else "/completions"
        # cast_to=str: the raw body, parsed here, so a malformed one is ours to retry.
        text = self._openai.post(path, body=payload, cast_to=str)
        try:
            response = json.loads(text)
        except (json.JSONDecodeError, TypeError) as error:
            raise MalformedResponse(f"not JSON: {str(text)[:200]!r}") from error
        # Checked before `request` caches it: a cached malformed body would fail every rerun.
        problem = response_problem(endpoint, response)
        if problem is not None:
            raise MalformedResponse(f"{problem}: {str(text)[:200]!r}")
        return response

    def _send(self, endpoint: str, payload: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}/{'chat/completions' if endpoint == 'chat' else 'completions'}"
        delay = self.backoff_seconds
        for attempt in range(self.max_retries + 1):
            with self._lock:
                self.calls += 1
            retry_after = None
            try:
                return self._post(endpoint, payload)
            except openai.APIStatusError as error:
                status = error.status_code
                if status in FATAL_STATUS:
                    raise RequestError(
                        f"{url}: HTTP {status} (check config.llm.base_url, model and "
                        f"api_key_env): {error.message[:300]}"
                    ) from error
                reason, detail = f"HTTP {status}", error.message[:300]
                retryable = status in RETRY_STATUS or status >= 500
                retry_after = _retry_after(error.response.headers)
            except openai.APITimeoutError as error:
                reason, detail, retryable = "timeout", str(error), True
            except openai.APIConnectionError as error:
                cause = error.__cause__
                # Nothing reached the server (refused, DNS, TLS handshake): after the retries
                # this is the server or the URL, not this request.
                if attempt == self.max_retries and _is_connect_error(cause):
                    raise RequestError(f"{url}: cannot reach the server: {cause}") from error
                reason, detail, retryable = "connection", f"{error}: {cause}", True
            except MalformedResponse as error:
                reason, detail, retryable = "malformed response", str(error), True
            if not retryable or attempt == self.max_retries:
                # One line, naming the server: the log shows it as is.
                message = " ".join(f"{url}: {detail}".split())
                return {"error": {"reason": reason, "message": message}}
            self.sleep_fn(
                min(retry_after if retry_after is not None else delay, self.max_backoff_seconds)
            )
            delay *= 2
        raise AssertionError("unreachable")


def _is_connect_error(error: BaseException | None) -> bool:
    """Whether an `openai.APIConnectionError` failed before any byte reached the server."""
    return type(error).__name__ in ("ConnectError", "ConnectTimeout", "UnsupportedProtocol")


def _retry_after(headers: Any) -> float | None:
    """Seconds to wait from `retry-after-ms` or `retry-after` (seconds or an HTTP date), at
    least 0; None when neither header is there or makes sense (NaN, other text): the backoff
    then applies."""
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            seconds = _seconds_until(value) if name == "retry-after" else None
        if seconds is not None and not math.isnan(seconds):
            return max(0.0, seconds)  # a negative wait means none (time.sleep would raise)
    return None


def _seconds_until(http_date: str) -> float | None:
    """Seconds from now to an HTTP date ("Wed, 21 Oct 2015 07:28:00 GMT"), None if it is not
    one."""
    try:
        when = email.utils.parsedate_to_datetime(http_date)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000": UTC by RFC 5322
        when = when.replace(tzinfo=datetime.UTC)
    return (when - datetime.datetime.now(datetime.UTC)).total_seconds()


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
