"""TEST DOUBLE of a vLLM OpenAI-compatible server, for serve-check's failure paths (no model, no GPU).

    python tests/matrix_double.py --port PORT --mode honest|sampler|no-tool-flags

It answers what serve-check asks (/health, /v1/models with max_model_len, /tokenize, chat completions with
log-probabilities and streams, completions with prompt_logprobs) with made-up tokens:

- honest: greedy requests give the same tokens and log-probabilities every time (derived from the prompt);
  a needle is read back from the haystack; tool calls are answered;
- sampler: samples whatever the request says, temperature 0 or not: every answer is new random tokens
  (what serve.determinism must catch);
- no-tool-flags: as a vLLM started without --enable-auto-tool-choice, a request with tool_choice "auto" is
  refused with HTTP 400 and vLLM's words (what serve.tools must catch).

It proves serve-check's judgement, never a model. Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NO_TOOLS = ('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
VOCAB = 512


def _rng(request: dict, text: str, mode: str) -> random.Random:
    if mode == "sampler":
        return random.Random(os.urandom(16))
    return random.Random(hashlib.sha256(text.encode()).digest())


def _tokens(text: str) -> list:
    return [int(hashlib.sha256(w.encode()).hexdigest()[:6], 16) % VOCAB for w in text.split()] or [0]


def handler(mode: str, model: str):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet
            pass

        def _send(self, status: int, body) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            if self.path == "/health":
                return self._send(200, {})
            if self.path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": model, "max_model_len": 8192,
                                                                    "owned_by": "TEST DOUBLE"}]})
            self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/tokenize":
                text = " ".join(m.get("content") or "" for m in body.get("messages") or [])
                return self._send(200, {"count": len(_tokens(text)) + 3, "tokens": [1, 2, 3] + _tokens(text)})
            if self.path == "/v1/completions":
                return self._completions(body)
            if self.path == "/v1/chat/completions":
                return self._chat(body)
            self._send(404, {"error": {"message": f"no route {self.path}"}})

        def _completions(self, body: dict) -> None:
            prompt = body.get("prompt") or []
            rng = _rng(body, json.dumps(prompt), mode)
            rows = [None] + [{str(t): {"logprob": -0.1, "rank": 1}, str((t + 1) % VOCAB): {"logprob": -2.5, "rank": 2}}
                             for t in prompt[1:]]
            n = int(body.get("max_tokens") or 1)
            out = [rng.randrange(VOCAB) for _ in range(n)]
            logprobs = {"tokens": [f"token_id:{t}" for t in out], "token_logprobs": [-0.1] * n,
                        "top_logprobs": [{f"token_id:{t}": -0.1} for t in out]}
            self._send(200, {"choices": [{"index": 0, "text": "", "logprobs": logprobs, "prompt_logprobs": rows,
                                          "finish_reason": "length"}],
                             "usage": {"prompt_tokens": len(prompt), "completion_tokens": n}})

        def _chat(self, body: dict) -> None:
            content = " ".join(m.get("content") or "" for m in body.get("messages") or [])
            if body.get("tools") and body.get("tool_choice", "auto") == "auto":
                if mode == "no-tool-flags":
                    return self._send(400, {"error": {"message": NO_TOOLS, "type": "BadRequestError", "code": 400}})
                fn = body["tools"][0]["function"]
                call = {"id": "call_double", "type": "function",
                        "function": {"name": fn["name"], "arguments": json.dumps({"restaurant": "Luigi's", "people": 2,
                                                                                 "time": "20:00"})}}
                return self._send(200, {"choices": [{"index": 0, "finish_reason": "tool_calls",
                                                     "message": {"role": "assistant", "content": None,
                                                                 "tool_calls": [call]}}]})
            needle = re.search(r"The secret word is (\w+)\.", content)
            rng = _rng(body, content, mode)
            n = int(body.get("max_tokens") or 16)
            tokens = [rng.randrange(VOCAB) for _ in range(n)]
            text = needle.group(1) if needle else " ".join(f"w{t}" for t in tokens)
            if body.get("stream"):
                return self._stream(text, len(tokens))
            logprobs = {"content": [{"token": f"token_id:{t}", "logprob": -0.01 * (t % 7)} for t in tokens]} \
                if body.get("logprobs") else None
            self._send(200, {"choices": [{"index": 0, "finish_reason": "length", "logprobs": logprobs,
                                          "message": {"role": "assistant", "content": text}}],
                             "usage": {"prompt_tokens": len(_tokens(content)) + 3, "completion_tokens": n}})

        def _stream(self, text: str, n: int) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            for word in text.split(" "):
                chunk = {"choices": [{"index": 0, "delta": {"content": word + " "}}]}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n}}
            self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")

    return Handler


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", choices=("honest", "sampler", "no-tool-flags"), required=True)
    p.add_argument("--model", default="double")
    args = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(args.mode, args.model))
    print(f"TEST DOUBLE listening on 127.0.0.1:{args.port} ({args.mode})", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
