"""serve.accuracy: the server's next-token distributions against a BF16 reference of the same model.

The reference (a file `--record-reference` wrote, or one computed now from a local model folder with
transformers, reference.py) holds, per matrix prompt, its greedy continuation and at each position its
top-K tokens. The server scores that same continuation (vLLM's prompt_logprobs on /v1/completions, the
prompt as token ids), so both distributions are conditioned on the same prefix at every position. Top-1
agreement: the server's most likely token is the reference's. KL(reference || server) over the reference's
top-K tokens and the rest of the mass (a coarsening: a lower bound of the full KL). Every repeat must meet the
matrix's thresholds; the record carries each repeat's numbers.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from qualify.core.errors import ConfigError
from qualify.core.fsutil import canonical_json
from qualify.core.readlimit import read_small, strict_json
from qualify.deploy.servecheck.client import Client, ServerError, token_id
from qualify.deploy.servecheck.result import CheckResult, failed, not_run, passed, significant
from qualify.host import cmd
from qualify.probe import servematrix as sm

ACCURACY = "serve.accuracy"
REFERENCE_SCHEMA = "https://blackwell-qualify.dev/serve-reference/v1"
MAX_REFERENCE_BYTES = 16 << 20
CHILD_TIMEOUT_S = 900
PACKAGE_PARENT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Reference:
    """Per prompt: its token ids, the reference's continuation, and the top-K at each position."""

    source: str  # "transformers" (computed on a host) or "server" (recorded from a deployment)
    model: str
    dtype: str
    created: str
    matrix_sha256: str
    prompts: Tuple[Mapping[str, Any], ...]  # {"prompt", "prompt_tokens", "tokens", "top": [[[id, logprob]...]...]}
    sha256: str = ""

    def as_json(self) -> Dict[str, Any]:
        return {"schema": REFERENCE_SCHEMA, "source": self.source, "model": self.model, "dtype": self.dtype,
                "created": self.created, "matrix_sha256": self.matrix_sha256, "prompts": [dict(p) for p in self.prompts]}

    def to_bytes(self) -> bytes:
        return canonical_json(self.as_json())

    def entry(self, prompt: str) -> Optional[Mapping[str, Any]]:
        return next((p for p in self.prompts if p.get("prompt") == prompt), None)


def load_reference(path: Path) -> Reference:
    data = read_small(path, MAX_REFERENCE_BYTES, "reference file", ConfigError)
    doc = strict_json(data, str(path), ConfigError)
    if not isinstance(doc, dict) or doc.get("schema") != REFERENCE_SCHEMA:
        raise ConfigError(f"{path}: not a serve-check reference ({REFERENCE_SCHEMA})",
                          hint="record one with `python -m qualify serve-check --record-reference FILE`")
    prompts = doc.get("prompts")
    ok = isinstance(prompts, list) and all(
        isinstance(p, dict) and isinstance(p.get("prompt"), str) and _ids(p.get("prompt_tokens"))
        and _ids(p.get("tokens")) and isinstance(p.get("top"), list) and len(p["top"]) == len(p["tokens"])
        and all(isinstance(row, list) and all(isinstance(x, list) and len(x) == 2 and isinstance(x[0], int)
                                              and isinstance(x[1], (int, float)) for x in row) for row in p["top"])
        for p in prompts)
    if not ok:
        raise ConfigError(f"{path}: its prompts are not a reference's (prompt, prompt_tokens, tokens, top)",
                          hint="hand in the file --record-reference wrote, unchanged")
    return Reference(str(doc.get("source")), str(doc.get("model")), str(doc.get("dtype")), str(doc.get("created")),
                     str(doc.get("matrix_sha256")), tuple(prompts), hashlib.sha256(data).hexdigest())


def _ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, int) and not isinstance(v, bool)
                                                          for v in value)


# --- making a reference ------------------------------------------------------------------------------------


def from_transformers(model_dir: Path, prompts: Sequence[str], prompt_ids: Sequence[List[int]], a: sm.Accuracy,
                      matrix_sha256: str, created: str, python: str = "") -> Reference:
    """Computed now on this host (reference.py in a child interpreter); ConfigError says why it cannot be."""
    request = {"model": str(model_dir), "prompts": [list(p) for p in prompt_ids], "tokens": a.tokens,
               "top": a.top_logprobs}
    env = {"PYTHONPATH": str(PACKAGE_PARENT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = cmd.output([python or sys.executable, "-m", "qualify.deploy.servecheck.reference"],
                      input_bytes=json.dumps(request).encode(), timeout=CHILD_TIMEOUT_S, env=env)
    if done.returncode in (124, 127):  # did not finish, or could not start
        raise ConfigError(f"the BF16 reference could not be computed: {done.stderr.decode(errors='replace')}")
    if done.returncode != 0:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["(no output)"])[-1]
        raise ConfigError(f"the BF16 reference could not be computed from {model_dir} with transformers: {last[:300]}",
                          hint="a Python with torch and transformers (pip install -e '.[test]'; --reference-python), "
                          "or --reference FILE")
    answer = strict_json(done.stdout, "the BF16 reference's answer (qualify.deploy.servecheck.reference)", ConfigError)
    entries = tuple({"prompt": p, "prompt_tokens": list(ids), "tokens": r["tokens"], "top": r["top"]}
                    for p, ids, r in zip(prompts, prompt_ids, answer["prompts"]))
    ref = Reference("transformers", str(model_dir), answer["dtype"], created, matrix_sha256, entries)
    return Reference(**{**ref.__dict__, "sha256": hashlib.sha256(ref.to_bytes()).hexdigest()})


def from_server(client: Client, prompts: Sequence[str], prompt_ids: Sequence[List[int]], a: sm.Accuracy,
                matrix_sha256: str, created: str, dtype: str) -> Reference:
    """This deployment's own greedy continuations and top-K (`--record-reference`: run it on the BF16 one)."""
    entries = []
    for p, ids in zip(prompts, prompt_ids):
        body = client.complete_ids(ids, max_tokens=a.tokens, temperature=0, seed=0, logprobs=a.top_logprobs,
                                   return_tokens_as_token_ids=True)
        lp = body["choices"][0].get("logprobs") or {}
        tokens = [token_id(t) for t in lp.get("tokens") or []]
        top = [sorted(([token_id(k), float(v)] for k, v in (row or {}).items()), key=lambda x: -x[1])
               for row in lp.get("top_logprobs") or []]
        if not tokens or None in tokens or len(top) != len(tokens) or any(x[0] is None for row in top for x in row):
            raise ServerError("/v1/completions: no token ids and top log-probabilities to record "
                              "(logprobs, return_tokens_as_token_ids)")
        entries.append({"prompt": p, "prompt_tokens": list(ids), "tokens": tokens, "top": top})
    ref = Reference("server", client.model, dtype or "unknown", created, matrix_sha256, tuple(entries))
    return Reference(**{**ref.__dict__, "sha256": hashlib.sha256(ref.to_bytes()).hexdigest()})


# --- comparing ---------------------------------------------------------------------------------------------


def kl_coarse(reference: Sequence[Sequence[float]], server: Mapping[int, float]) -> float:
    """KL(P || Q) over the reference's top tokens that the server also reports, plus one bucket for the rest."""
    p_known = q_known = kl = 0.0
    for tid, lp in reference:
        if tid in server:
            p, q = math.exp(lp), math.exp(server[tid])
            p_known, q_known = p_known + p, q_known + q
            kl += p * (lp - server[tid])
    p_rest, q_rest = max(1e-12, 1.0 - p_known), max(1e-12, 1.0 - q_known)
    return max(0.0, kl + p_rest * math.log(p_rest / q_rest))


def _score(client: Client, entry: Mapping[str, Any], a: sm.Accuracy) -> Tuple[int, List[float], int]:
    """(positions agreeing on top-1, KL per position, positions) for one prompt, scored by the server."""
    prompt, tokens = list(entry["prompt_tokens"]), list(entry["tokens"])
    body = client.complete_ids(prompt + tokens, max_tokens=1, temperature=0, prompt_logprobs=a.top_logprobs)
    rows = body["choices"][0].get("prompt_logprobs")
    if not isinstance(rows, list) or len(rows) < len(prompt) + len(tokens):
        raise ServerError("/v1/completions: no prompt_logprobs for the continuation (vLLM's prompt_logprobs)")
    agree, kls = 0, []
    for i, top in enumerate(entry["top"]):
        row = rows[len(prompt) + i] or {}
        server = {int(k): float(v["logprob"]) for k, v in row.items() if str(k).isdigit() and isinstance(v, dict)}
        best = next((int(k) for k, v in row.items() if isinstance(v, dict) and v.get("rank") == 1), None)
        agree += best == tokens[i]
        kls.append(kl_coarse(top, server))
    return agree, kls, len(tokens)


def accuracy(client: Client, a: sm.Accuracy, reference: Optional[Reference], why_none: str,
             prompt_ids: Sequence[List[int]]) -> CheckResult:
    if reference is None:
        return not_run(ACCURACY, f"no BF16 reference: {why_none}")
    about = {"source": reference.source, "model": reference.model, "dtype": reference.dtype,
             "created": reference.created, "sha256": reference.sha256}
    evidence: Dict[str, Any] = {"reference": about, "tokens": a.tokens, "top_logprobs": a.top_logprobs,
                                "min_top1_agreement": a.min_top1_agreement, "max_mean_kl": a.max_mean_kl}
    entries = []
    for p, ids in zip(a.prompts, prompt_ids):
        entry = reference.entry(p)
        if entry is None:
            return not_run(ACCURACY, f"the reference has no entry for the matrix prompt {p!r} (another matrix?)",
                           evidence)
        if list(entry["prompt_tokens"]) != list(ids):
            return not_run(ACCURACY, f"the reference tokenized {p!r} differently from this server: another model "
                           "or tokenizer", evidence)
        entries.append(entry)
    repeats = []
    try:
        for _ in range(a.repeats):
            agree = positions = 0
            kls: List[float] = []
            for entry in entries:
                ok, kl, n = _score(client, entry, a)
                agree, positions, kls = agree + ok, positions + n, kls + kl
            repeats.append({"top1_agreement": significant(agree / positions), "mean_kl": significant(sum(kls) / len(kls)),
                            "max_kl": significant(max(kls)), "positions": positions})
    except ServerError as exc:
        return failed(ACCURACY, str(exc), evidence)
    evidence["repeats"] = repeats
    worst_agree = min(r["top1_agreement"] for r in repeats)
    worst_kl = max(r["mean_kl"] for r in repeats)
    figures = {"accuracy_top1_agreement": worst_agree, "accuracy_mean_kl": worst_kl}
    numbers = (f"top-1 agreement {worst_agree:.3f} (at least {a.min_top1_agreement:g}), mean KL {worst_kl:.2g} "
               f"(at most {a.max_mean_kl:g}) over {repeats[0]['positions']} positions, {len(repeats)} repeats, "
               f"against a {reference.dtype} reference ({reference.source})")
    if worst_agree < a.min_top1_agreement or worst_kl > a.max_mean_kl:
        return failed(ACCURACY, numbers, evidence, **figures)
    return passed(ACCURACY, numbers, evidence, **figures)
