"""TEST DOUBLE for vLLM's OpenAI-compatible server (no GPU, no model).

The deploy tests start this in a container in place of a real vLLM image,
with the very command line start.sh gives vLLM
(`python3 -m vllm.entrypoints.openai.api_server --model ... --port 8000`);
the unit tests run it in-process. It answers /health, /v1/models and
/v1/chat/completions; it computes the arithmetic canary honestly ("What is 19
times 23?" -> 437, from the numbers in the prompt), returns deterministic text
at temperature 0, and a tool call when tools are offered. It proves the deploy
machinery (compose, health wait, canary, verify), never a model.

Environment: STANDIN_NEVER_HEALTHY=1 keeps /health at 503 forever (the
timeout path); STANDIN_STARTUP_S=N answers 503 for the first N seconds (a
model loading); STANDIN_FAIL_AT_START="ValueError: ..." refuses to start as
vLLM does: its log lines, a traceback ending in that line, the engine's
RuntimeError after it, exit 1 (compose then restarts it). Standard library
only; Python 3.9+.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional

_ARITH = re.compile(r"(-?\d+)\s*(times|multiplied by|x|\*|×|plus|\+|minus|-)\s*(-?\d+)", re.IGNORECASE)
_OPS = {"times": lambda a, b: a * b, "multiplied by": lambda a, b: a * b, "x": lambda a, b: a * b,
        "*": lambda a, b: a * b, "×": lambda a, b: a * b, "plus": lambda a, b: a + b, "+": lambda a, b: a + b,
        "minus": lambda a, b: a - b, "-": lambda a, b: a - b}
_WORDS = ("seven days make a week and the rainbow has colours while music counts notes in a scale "
          "sailors name seas the ancients listed wonders and a die shows pips on opposite faces").split()


@dataclass
class Settings:
    model: str
    served_model_name: str
    argv: List[str] = field(default_factory=list)
    never_healthy: bool = False
    startup_s: float = 0.0
    started: float = field(default_factory=time.monotonic)

    def healthy(self) -> bool:
        return not self.never_healthy and time.monotonic() - self.started >= self.startup_s


def arithmetic(prompt: str) -> Optional[str]:
    m = _ARITH.search(prompt)
    if not m:
        return None
    a, op, b = int(m.group(1)), m.group(2).lower(), int(m.group(3))
    return f"{a} {op} {b} is {_OPS[op](a, b)}."


def filler(prompt: str, max_tokens: int, rng: random.Random) -> str:
    """Numbered lines of words, `max_tokens` words in all: long and reproducible from `rng`."""
    lines, words = [], 0
    while words < max_tokens:
        n = min(rng.randint(4, 9), max_tokens - words)
        lines.append(f"{len(lines) + 1}. " + " ".join(rng.choice(_WORDS) for _ in range(n)) + ".")
        words += n
    return "\n".join(lines)


def tool_call(prompt: str, tool: Dict[str, Any]) -> Dict[str, Any]:
    """A call of `tool`; each required string argument is the place named after 'in' (or the last Name)."""
    fn = tool.get("function") or {}
    after_in = re.search(r"\bin ([A-Z][\w-]*)", prompt)
    names = re.findall(r"\b[A-Z][\w-]*", prompt)
    value = after_in.group(1) if after_in else (names[-1] if names else "")
    args = {name: value for name in (fn.get("parameters") or {}).get("required", [])}
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
    return {"id": f"call_{digest}", "type": "function", "function": {"name": fn.get("name"),
                                                                     "arguments": json.dumps(args)}}


def complete(request: Dict[str, Any]) -> Dict[str, Any]:
    """The choice for a chat request: message and finish_reason."""
    messages = request.get("messages") or []
    prompt = next((str(m.get("content") or "") for m in reversed(messages) if m.get("role") == "user"), "")
    tools = request.get("tools") or []
    if tools and request.get("tool_choice", "auto") != "none":
        return {"message": {"role": "assistant", "content": None, "tool_calls": [tool_call(prompt, tools[0])]},
                "finish_reason": "tool_calls"}
    answer = arithmetic(prompt)
    max_tokens = int(request.get("max_tokens") or 256)
    if answer is None:
        greedy = float(request.get("temperature", 1.0)) == 0.0
        seed = hashlib.sha256(prompt.encode()).digest() if greedy else request.get("seed", os.urandom(8))
        answer = filler(prompt, max_tokens, random.Random(seed))
        return {"message": {"role": "assistant", "content": answer}, "finish_reason": "length"}
    return {"message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}


def make_handler(settings: Settings):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:
            print(f"standin: {self.address_string()} {fmt % args}", file=sys.stderr, flush=True)

        def _send(self, status: int, body: Any = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, text: str) -> None:
            """Server-sent events, one word a chunk, then usage and [DONE] (vLLM's stream shape)."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            words = text.split(" ")
            for i, word in enumerate(words):
                delta = {"content": word if i == 0 else " " + word}
                self._event({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]})
            self._event({"object": "chat.completion.chunk", "choices": [],
                         "usage": {"prompt_tokens": 1, "completion_tokens": len(words)}})
            self.wfile.write(b"data: [DONE]\n\n")

        def _event(self, body: Any) -> None:
            self.wfile.write(b"data: " + json.dumps(body).encode() + b"\n\n")
            self.wfile.flush()

        def _error(self, status: int, message: str) -> None:
            self._send(status, {"error": {"message": message, "type": "BadRequestError", "code": status}})

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == "/health":
                self._send(200 if settings.healthy() else 503)
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{
                    "id": settings.served_model_name, "object": "model", "owned_by": "standin",
                    "root": settings.model, "standin_argv": settings.argv}]})
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/v1/chat/completions":
                return self._error(404, f"no route {self.path}")
            try:
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            except json.JSONDecodeError as exc:
                return self._error(400, f"body is not JSON: {exc}")
            if request.get("model") != settings.served_model_name:
                return self._error(404, f"The model `{request.get('model')}` does not exist.")
            choice = complete(request)
            text = choice["message"].get("content") or ""
            if request.get("stream"):
                return self._stream(text)
            self._send(200, {
                "id": f"chatcmpl-standin-{int(time.time() * 1000)}", "object": "chat.completion",
                "created": int(time.time()), "model": settings.served_model_name,
                "choices": [{"index": 0, **choice}],
                "usage": {"prompt_tokens": 1, "completion_tokens": len(text.split()),
                          "total_tokens": 1 + len(text.split())},
            })

    return Handler


def serve(settings: Settings, host: str, port: int) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), make_handler(settings))
    server.daemon_threads = True
    return server


def fail_at_start(error: str) -> None:
    """What vLLM prints when it refuses to start (its shape: log lines, the engine core's traceback, the
    front end's RuntimeError), with `error` as the cause; then exit 1."""
    for line in ("INFO 12-05 10:00:00 [__init__.py:239] Automatically detected platform cuda.",
                 "INFO 12-05 10:00:01 [api_server.py:1043] vLLM API server version 0.33.0 (standin)",
                 "(EngineCore_DP0 pid=7) ERROR 12-05 10:00:09 [core.py:708] EngineCore failed to start.",
                 "(EngineCore_DP0 pid=7) ERROR 12-05 10:00:09 [core.py:708] Traceback (most recent call last):",
                 '(EngineCore_DP0 pid=7) ERROR 12-05 10:00:09 [core.py:708]   File "gpu_worker.py", line 239, in '
                 "determine_available_memory",
                 f"(EngineCore_DP0 pid=7) ERROR 12-05 10:00:09 [core.py:708] {error}",
                 "Traceback (most recent call last):",
                 '  File "api_server.py", line 1920, in run_server',
                 "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"):
        print(line, file=sys.stderr, flush=True)
    sys.exit(1)


def main(argv: Optional[List[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if os.environ.get("STANDIN_FAIL_AT_START"):
        fail_at_start(os.environ["STANDIN_FAIL_AT_START"])
    parser = argparse.ArgumentParser(prog="standin")
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    args, _ = parser.parse_known_args(argv)  # vLLM's other options are accepted and ignored
    settings = Settings(args.model, args.served_model_name or args.model, list(argv),
                        never_healthy=os.environ.get("STANDIN_NEVER_HEALTHY") == "1",
                        startup_s=float(os.environ.get("STANDIN_STARTUP_S") or 0))
    server = serve(settings, args.host, args.port)
    # As PID 1 in a container, SIGTERM would otherwise be ignored until the engine kills us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"standin: TEST DOUBLE for vLLM serving {settings.model} as {settings.served_model_name} "
          f"on {args.host}:{args.port}", file=sys.stderr, flush=True)
    if settings.never_healthy:
        print("standin: STANDIN_NEVER_HEALTHY=1: /health will answer 503 forever", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
