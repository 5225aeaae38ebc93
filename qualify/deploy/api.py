"""The OpenAI-compatible API of the served model: health, routing, canary and the deeper checks."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Tuple

from qualify.core.readlimit import strict_json
from qualify.core.serving import CANARY_ANSWER, CANARY_PROMPT, LONG_PROMPT, TOOL_PROMPT, WEATHER_TOOL
from qualify.deploy.errors import DeployError


@dataclass(frozen=True)
class ApiCheck:
    ok: bool
    detail: str


def api_url(bind_address: str, port: int) -> str:
    """Where this host reaches the server: loopback when it listens on every address."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(bind_address, bind_address)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def http_json(url: str, payload: Optional[Mapping[str, Any]] = None, timeout: float = 30.0) -> Tuple[int, Any]:
    """(status, decoded JSON or text); status 0 when nothing answered."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(getattr(exc, "reason", exc))
    text = body.decode("utf-8", errors="replace")
    try:
        return status, strict_json(text, url, DeployError) if text.strip() else None
    except DeployError:
        return status, text


def health(base_url: str, timeout: float = 5.0) -> ApiCheck:
    status, body = http_json(f"{base_url}/health", timeout=timeout)
    return ApiCheck(status == 200, f"/health: HTTP {status}" if status else f"/health: no answer ({body})")


def models(base_url: str, model: str) -> ApiCheck:
    status, body = http_json(f"{base_url}/v1/models")
    ids = [m.get("id") for m in (body or {}).get("data", [])] if isinstance(body, dict) else []
    if status != 200:
        return ApiCheck(False, f"/v1/models: HTTP {status}: {body}")
    return ApiCheck(model in ids, f"/v1/models serves {ids}" + ("" if model in ids else f", not {model!r}"))


def chat(base_url: str, model: str, messages: Sequence[Mapping[str, Any]], timeout: float = 120.0,
         **params: Any) -> Mapping[str, Any]:
    payload = {"model": model, "messages": list(messages), **params}
    status, body = http_json(f"{base_url}/v1/chat/completions", payload, timeout=timeout)
    if status != 200 or not isinstance(body, dict) or not body.get("choices"):
        raise DeployError(f"/v1/chat/completions: HTTP {status}: {str(body)[:500]}")
    return body


def _message(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body["choices"][0].get("message") or {}


def canary(base_url: str, model: str) -> ApiCheck:
    """A deterministic arithmetic question whose answer we know."""
    try:
        body = chat(base_url, model, [{"role": "user", "content": CANARY_PROMPT}], temperature=0, max_tokens=64)
    except DeployError as exc:
        return ApiCheck(False, str(exc))
    answer = (_message(body).get("content") or "").strip()
    ok = CANARY_ANSWER in answer
    return ApiCheck(ok, f"{CANARY_PROMPT!r} -> {answer[:200]!r}" + ("" if ok else f" (expected {CANARY_ANSWER})"))


def determinism(base_url: str, model: str, max_tokens: int = 512) -> ApiCheck:
    """A long greedy decode, twice: the texts must be identical."""
    texts = []
    try:
        for _ in range(2):
            body = chat(base_url, model, [{"role": "user", "content": LONG_PROMPT}], temperature=0, seed=0,
                        max_tokens=max_tokens)
            texts.append(_message(body).get("content") or "")
    except DeployError as exc:
        return ApiCheck(False, str(exc))
    if not texts[0].strip():
        return ApiCheck(False, "greedy decode returned no text")
    if texts[0] != texts[1]:
        at = next((i for i, (a, b) in enumerate(zip(texts[0], texts[1])) if a != b), min(map(len, texts)))
        return ApiCheck(False, f"two greedy decodes differ from character {at}: "
                           f"{texts[0][at:at + 40]!r} vs {texts[1][at:at + 40]!r}")
    return ApiCheck(True, f"two greedy decodes of up to {max_tokens} tokens are identical ({len(texts[0])} chars)")


def tool_call(base_url: str, model: str) -> ApiCheck:
    """The server must answer with a well-formed call of the one tool offered."""
    messages = [{"role": "user", "content": TOOL_PROMPT}]
    try:
        body = chat(base_url, model, messages, tools=[WEATHER_TOOL], tool_choice="auto", temperature=0,
                    max_tokens=128)
    except DeployError as exc:
        return ApiCheck(False, str(exc))
    calls = _message(body).get("tool_calls") or []
    if not calls:
        return ApiCheck(False, f"no tool call in the answer: {str(_message(body))[:300]}")
    function = calls[0].get("function") or {}
    raw = function.get("arguments")
    try:
        arguments = strict_json(raw if isinstance(raw, str) else "", "tool call arguments", DeployError)
    except DeployError:
        return ApiCheck(False, f"tool call arguments are not JSON: {function.get('arguments')!r}")
    ok = function.get("name") == "get_weather" and "paris" in str(arguments.get("city", "")).lower()
    return ApiCheck(ok, f"tool call {function.get('name')}({json.dumps(arguments)})")


def load_json_text(text: str, what: str) -> Mapping[str, Any]:
    doc = strict_json(text, what, DeployError)
    if not isinstance(doc, dict):
        raise DeployError(f"{what}: not a JSON object")
    return doc


@dataclass(frozen=True)
class Throughput:
    """What this host serves: time to first token and decode rate of one streamed greedy request.

    The rate is tokens over the decode interval: from the first content chunk to the last. vLLM's CPU build
    sends its stream in bursts, so chunks cannot be timed one by one, but the last burst comes when decoding
    ends. A server that holds everything back until the end (the whole reply within 1 ms of the first chunk:
    115,288 "tokens/s") leaves no interval to measure; then the rate is over the whole request (first byte
    sent to last received), which can only understate it, and `basis` says which."""

    ttft_s: float
    tokens_per_s: float
    tokens: int
    interval_s: float = 0.0  # the interval the rate is over
    basis: str = "stream"  # "stream": first to last chunk; "request": the whole request


# A decode interval shorter than this, or than this share of the request, is a burst, not a measurement.
MIN_STREAM_INTERVAL_S = 0.05
MIN_STREAM_SHARE = 0.2


def stream_events(resp) -> Any:
    """The JSON objects of a server-sent event stream, until [DONE]; reads are line-bounded."""
    while True:
        line = resp.readline(MAX_EVENT_BYTES)
        if not line:
            return
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        try:
            yield strict_json(data, "a server-sent event", DeployError)
        except DeployError:
            continue


MAX_EVENT_BYTES = 1 << 20


def throughput(base_url: str, model: str, max_tokens: int = 256, timeout: float = 300.0) -> Throughput:
    """Stream LONG_PROMPT greedily for exactly `max_tokens` tokens (vLLM's ignore_eos: a model that stops early
    leaves too few to time); tokens are the server's usage count, else one per content chunk."""
    payload = {"model": model, "messages": [{"role": "user", "content": LONG_PROMPT}], "temperature": 0,
               "max_tokens": max_tokens, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(f"{base_url}/v1/chat/completions", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.monotonic()
    arrivals = []
    usage = None
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            for event in stream_events(resp):
                if event.get("usage"):
                    usage = event["usage"].get("completion_tokens")
                for choice in event.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        arrivals.append(time.monotonic())
    except (urllib.error.URLError, OSError) as exc:
        raise DeployError(f"streamed completion: {getattr(exc, 'reason', exc)}") from None
    end = time.monotonic()
    if not arrivals:
        raise DeployError("streamed completion: the server sent no content")
    tokens = int(usage or len(arrivals))
    first, last = arrivals[0], arrivals[-1]
    if last - first >= max(MIN_STREAM_INTERVAL_S, MIN_STREAM_SHARE * (end - start)) and tokens > 1:
        rate, interval, basis = (tokens - 1) / (last - first), last - first, "stream"
    else:
        rate, interval, basis = tokens / (end - start), end - start, "request"
    return Throughput(round(first - start, 4), round(rate, 1), tokens, round(interval, 4), basis)


def throughput_check(base_url: str, model: str) -> ApiCheck:
    """The streamed decode rate, measured (never a burst's figure)."""
    try:
        t = throughput(base_url, model)
    except DeployError as exc:
        return ApiCheck(False, str(exc))
    ok = t.tokens > 1 and t.tokens_per_s > 0
    return ApiCheck(ok, f"{t.tokens_per_s:g} tokens/s ({t.tokens} tokens in {t.interval_s:.2f} s, measured over the "
                        f"{'stream' if t.basis == 'stream' else 'whole request'}); time to first token {t.ttft_s:.3f} s")
