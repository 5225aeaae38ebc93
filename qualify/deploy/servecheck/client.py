"""The requests serve-check sends: OpenAI-compatible chat and completions, vLLM's /tokenize, streams.

Every request has a timeout and every answer is read bounded (deploy/api.py's readers); a server that does
not answer, or answers with an error, is a `ServerError` naming the endpoint, the status and the server's own
words (a test double without tool-call flags answers 400, as vLLM does).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from qualify.deploy import api
from qualify.deploy.errors import DeployError

TIMEOUT_S = 300.0


class ServerError(DeployError):
    """The server refused a request or did not answer."""


@dataclass(frozen=True)
class Client:
    url: str
    model: str

    def post(self, path: str, body: Mapping[str, Any], timeout: float = TIMEOUT_S) -> Dict[str, Any]:
        status, answer = api.http_json(f"{self.url}{path}", {"model": self.model, **body}, timeout=timeout)
        if status != 200 or not isinstance(answer, dict):
            said = answer.get("error", answer) if isinstance(answer, dict) else answer
            said = said.get("message", said) if isinstance(said, dict) else said
            raise ServerError(f"{path}: HTTP {status}: {str(said)[:300]}" if status else f"{path}: no answer ({said})")
        return answer

    def chat(self, content: str, **params: Any) -> Dict[str, Any]:
        body = self.post("/v1/chat/completions", {"messages": [{"role": "user", "content": content}], **params})
        if not body.get("choices"):
            raise ServerError(f"/v1/chat/completions: no choices in {str(body)[:200]}")
        return body

    def prompt_tokens(self, content: str) -> List[int]:
        """The prompt's token ids as the server's chat template and tokenizer make them (vLLM's /tokenize)."""
        body = self.post("/tokenize", {"messages": [{"role": "user", "content": content}],
                                       "add_generation_prompt": True})
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise ServerError(f"/tokenize: no token ids in {str(body)[:200]}")
        return tokens

    def count(self, content: str) -> int:
        """The prompt's length in tokens: /tokenize, else the usage of a one-token answer."""
        try:
            return len(self.prompt_tokens(content))
        except ServerError:
            usage = self.chat(content, max_tokens=1, temperature=0).get("usage") or {}
            if not isinstance(usage.get("prompt_tokens"), int):
                raise
            return usage["prompt_tokens"]

    def max_model_len(self) -> int:
        """What the server says its context is (/v1/models: vLLM's max_model_len), 0 when it does not say."""
        status, body = api.http_json(f"{self.url}/v1/models")
        for m in (body.get("data") or []) if status == 200 and isinstance(body, dict) else []:
            if isinstance(m, dict) and m.get("id") == self.model and isinstance(m.get("max_model_len"), int):
                return m["max_model_len"]
        return 0

    def complete_ids(self, prompt: Sequence[int], **params: Any) -> Dict[str, Any]:
        body = self.post("/v1/completions", {"prompt": list(prompt), **params})
        if not body.get("choices"):
            raise ServerError(f"/v1/completions: no choices in {str(body)[:200]}")
        return body


def token_id(text: Any) -> Optional[int]:
    """`token_id:123` (vLLM's return_tokens_as_token_ids) or a bare id string, as an int."""
    if isinstance(text, str):
        text = text[len("token_id:"):] if text.startswith("token_id:") else text
        if text.isdigit():
            return int(text)
    return None


def chosen(body: Mapping[str, Any]) -> Tuple[List[Any], List[float]]:
    """(tokens, their log-probabilities) of a chat answer asked with logprobs: token ids where the server gave
    them (return_tokens_as_token_ids), else the token texts; ([], []) when it returned no log-probabilities."""
    content = ((body["choices"][0].get("logprobs") or {}).get("content")) or []
    tokens = [token_id(t.get("token")) if token_id(t.get("token")) is not None else t.get("token") for t in content]
    return tokens, [float(t.get("logprob", 0.0)) for t in content]


@dataclass(frozen=True)
class Streamed:
    ttft_s: float
    latency_s: float
    tokens: int
    chunks: int


def stream_chat(url: str, model: str, content: str, max_tokens: int, timeout: float = TIMEOUT_S) -> Streamed:
    """One streamed greedy chat request: time to the first content chunk, to the end, and the tokens."""
    payload = {"model": model, "messages": [{"role": "user", "content": content}], "temperature": 0,
               "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.monotonic()
    first, chunks, usage = None, 0, None
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            for event in api.stream_events(resp):
                if event.get("usage"):
                    usage = event["usage"].get("completion_tokens")
                for choice in event.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        chunks += 1
                        first = first if first is not None else time.monotonic()
    except urllib.error.HTTPError as exc:
        raise ServerError(f"streamed chat: HTTP {exc.code}: {exc.read(300).decode('utf-8', 'replace')}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ServerError(f"streamed chat: {getattr(exc, 'reason', exc)}") from None
    end = time.monotonic()
    if first is None:
        raise ServerError("streamed chat: the server sent no content")
    return Streamed(first - start, end - start, int(usage or chunks), chunks)
