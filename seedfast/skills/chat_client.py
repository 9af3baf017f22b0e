"""A small client for any OpenAI-compatible `/v1/chat/completions` endpoint (stdlib only).

Retries with exponential backoff on timeouts, connection errors, HTTP 429 and 5xx; fails at once on other
4xx and on answers that are not a chat completion. `complete_many` runs requests on a bounded thread pool.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

Messages = list[dict[str, str]]


class ChatError(RuntimeError):
    """A request that did not give a completion; `kind` is timeout, connection, http or bad_response."""

    def __init__(self, kind: str, message: str, attempts: int):
        super().__init__(f"{kind} after {attempts} attempt(s): {message}")
        self.kind, self.attempts = kind, attempts


@dataclass
class ChatClient:
    base_url: str  # e.g. "http://127.0.0.1:8000/v1"; "/chat/completions" is appended
    model: str
    api_key_env: str | None = None  # name of the environment variable that holds the key
    timeout_s: float = 60.0
    max_retries: int = 3
    backoff_s: float = 1.0
    max_concurrency: int = 8
    temperature: float = 0.0
    max_tokens: int = 512
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.base_url, str) or not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {self.base_url!r}")
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a non-empty str, got {self.model!r}")
        for name in ("timeout_s", "backoff_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0 or (name == "timeout_s" and value == 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        for name, low in (("max_retries", 0), ("max_concurrency", 1), ("max_tokens", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self._api_key = None
        if self.api_key_env:
            self._api_key = os.environ.get(self.api_key_env)
            if not self._api_key:
                raise ValueError(f"api_key_env names {self.api_key_env!r}, but that environment variable is unset")
        self.url = self.base_url.rstrip("/") + "/chat/completions"

    def complete(self, messages: Messages) -> str:
        """The assistant's text for one conversation; raises ChatError when every attempt failed."""
        body = json.dumps({"model": self.model, "messages": messages, "temperature": self.temperature,
                           "max_tokens": self.max_tokens, **self.extra_body}).encode()
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        attempt = 0
        while True:
            attempt += 1
            try:
                request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    payload = response.read()
                return _completion_text(payload, attempt)
            except urllib.error.HTTPError as err:
                retryable = err.code == 429 or err.code >= 500
                error = ChatError("http", f"HTTP {err.code} {err.reason}", attempt)
            except TimeoutError as err:
                retryable, error = True, ChatError("timeout", f"no answer within {self.timeout_s:g}s ({err})", attempt)
            except urllib.error.URLError as err:
                kind = "timeout" if isinstance(err.reason, TimeoutError) else "connection"
                retryable, error = True, ChatError(kind, str(err.reason), attempt)
            except (ConnectionError, OSError) as err:
                retryable, error = True, ChatError("connection", str(err), attempt)
            if not retryable or attempt > self.max_retries:
                raise error
            time.sleep(self.backoff_s * 2 ** (attempt - 1))

    def complete_many(self, conversations: Sequence[Messages]) -> list[str | ChatError]:
        """`complete` for each conversation, at most `max_concurrency` at a time; errors are returned."""
        def one(messages: Messages) -> str | ChatError:
            try:
                return self.complete(messages)
            except ChatError as err:
                return err

        if not conversations:
            return []
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(conversations))) as pool:
            return list(pool.map(one, conversations))


def _completion_text(payload: bytes, attempt: int) -> str:
    try:
        content = json.loads(payload)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise ChatError("bad_response", f"not a chat completion ({type(err).__name__}): {payload[:200]!r}",
                        attempt) from None
    if not isinstance(content, str):
        raise ChatError("bad_response", f"message content is {type(content).__name__}, not str", attempt)
    return content
