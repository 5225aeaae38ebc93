"""serve.determinism, serve.niah and serve.tools: what a server must answer, and how exactly."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

from qualify.core.errors import ConfigError
from qualify.core.readlimit import strict_json
from qualify.deploy.servecheck.client import Client, ServerError, chosen
from qualify.deploy.servecheck.result import CheckResult, failed, not_run, passed, significant
from qualify.probe import servematrix as sm

DETERMINISM, NIAH, TOOLS = "serve.determinism", "serve.niah", "serve.tools"


# --- serve.determinism ---------------------------------------------------------------------------------


def _greedy(client: Client, prompt: str, d: sm.Determinism) -> Tuple[List[Any], List[float]]:
    body = client.chat(prompt, temperature=0, seed=0, max_tokens=d.max_tokens, logprobs=True,
                       return_tokens_as_token_ids=True)
    tokens, logprobs = chosen(body)
    if not tokens:  # a server without log-probabilities: its text, token by token unknown
        return [body["choices"][0]["message"].get("content") or ""], []
    return tokens, logprobs


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def determinism(client: Client, d: sm.Determinism) -> CheckResult:
    """Each prompt `repeats` times one request after another, then every prompt's repeats sent together (the
    server batches them): the same tokens every time, log-probabilities within the tolerance."""
    try:
        alone = {p: [_greedy(client, p, d) for _ in range(d.repeats)] for p in d.prompts}
        jobs = [p for p in d.prompts for _ in range(d.repeats)]
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            together = list(pool.map(lambda p: _greedy(client, p, d), jobs))
    except ServerError as exc:
        return failed(DETERMINISM, str(exc))
    batched: Dict[str, list] = {p: [] for p in d.prompts}
    for p, answer in zip(jobs, together):
        batched[p].append(answer)
    rows, worst_alone, worst_batched, problems = [], 0.0, 0.0, []
    for n, p in enumerate(d.prompts, 1):
        ref_tokens, ref_lp = alone[p][0]
        row: Dict[str, Any] = {"prompt": n, "tokens": len(ref_tokens)}
        for kind, runs in (("alone", alone[p][1:]), ("batched", batched[p])):
            delta = 0.0
            for tokens, lp in runs:
                if tokens != ref_tokens:
                    at = _first_difference(tokens, ref_tokens)
                    problems.append(f"prompt {n} ({kind}): tokens differ from position {at} of {len(ref_tokens)}")
                elif lp and ref_lp:
                    delta = max(delta, max(abs(x - y) for x, y in zip(lp, ref_lp)))
            row[f"max_logprob_delta_{kind}"] = significant(delta)
        worst_alone = max(worst_alone, row["max_logprob_delta_alone"])
        worst_batched = max(worst_batched, row["max_logprob_delta_batched"])
        rows.append(row)
    evidence = {"prompts": rows, "repeats": d.repeats, "max_tokens": d.max_tokens,
                "logprob_tolerance": d.logprob_tolerance, "max_logprob_delta_alone": worst_alone,
                "max_logprob_delta_batched": worst_batched,
                "logprobs": all(alone[p][0][1] for p in d.prompts)}
    figures = {"determinism_max_logprob_delta": max(worst_alone, worst_batched)}
    if problems:
        return failed(DETERMINISM, "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3
                                                              else ""), evidence, **figures)
    if not evidence["logprobs"]:
        return not_run(DETERMINISM, "the tokens repeat, but the server returned no log-probabilities to compare "
                       "(logprobs=true)", evidence, **figures)
    over = max(worst_alone, worst_batched)
    if over > d.logprob_tolerance:
        return failed(DETERMINISM, f"the same tokens, but their log-probabilities moved by {over:.3g} "
                      f"(tolerance {d.logprob_tolerance:g})", evidence, **figures)
    return passed(DETERMINISM, f"{len(d.prompts)} prompts x {d.repeats} alone and batched: the same tokens; "
                  f"log-probabilities within {over:.2g} (tolerance {d.logprob_tolerance:g})", evidence, **figures)


# --- serve.niah ------------------------------------------------------------------------------------------


def niah(client: Client, n: sm.Niah, max_model_len: int) -> CheckResult:
    if max_model_len <= 0:
        return not_run(NIAH, "the server's context length is unknown (/v1/models names no max_model_len; set "
                       "--max-model-len)")
    try:
        cases = sm.niah_cases(n, max_model_len, client.count)
        rows = []
        for c in cases:
            body = client.chat(c.message, temperature=0, seed=0, max_tokens=n.max_tokens)
            text = body["choices"][0]["message"].get("content") or ""
            named = sm.answer_words(n, text)
            rows.append({"fraction": c.fraction, "depth": c.depth, "word": c.word,
                         "prompt_tokens": int((body.get("usage") or {}).get("prompt_tokens") or 0),
                         "answer": text[:60], "retrieved": named == (c.word,)})
    except ServerError as exc:
        return failed(NIAH, str(exc))
    missed = [r for r in rows if not r["retrieved"]]
    longest = max(r["prompt_tokens"] for r in rows)
    evidence = {"max_model_len": max_model_len, "cases": rows, "longest_prompt_tokens": longest,
                "context_fractions": list(n.context_fractions), "depths": list(n.depths)}
    figures = {"niah_retrieved": float(len(rows) - len(missed)), "niah_cases": float(len(rows)),
               "niah_longest_prompt_tokens": float(longest)}
    if missed:
        where = ", ".join(f"{r['prompt_tokens']} tokens at depth {r['depth']:g}: {r['answer']!r}" for r in missed[:3])
        return failed(NIAH, f"{len(missed)} of {len(rows)} needles missed ({where})", evidence, **figures)
    return passed(NIAH, f"{len(rows)} of {len(rows)} needles retrieved, contexts up to {longest} tokens "
                  f"({max(n.context_fractions):g} of MAX_MODEL_LEN {max_model_len}) at depths "
                  f"{', '.join(f'{x:g}' for x in n.depths)}", evidence, **figures)


# --- serve.tools -----------------------------------------------------------------------------------------


def tools(client: Client, t: sm.Tools, parser: str) -> CheckResult:
    """`parser`: the tool-call parser the server was started with ("" when the deployment has none)."""
    if parser == "":
        return not_run(TOOLS, "the deployment serves no tool calls (TOOL_CALL_PARSER is empty); set it and deploy "
                       "again to check them")
    evidence: Dict[str, Any] = {"parser": parser, "tool": t.name, "expected": dict(t.expect)}
    try:
        body = client.chat(t.prompt, tools=[t.tool], tool_choice="auto", temperature=0, seed=0,
                           max_tokens=t.max_tokens)
    except ServerError as exc:
        return failed(TOOLS, f"the tool-call request was refused: {exc}", evidence)
    choice = body["choices"][0]
    message = choice.get("message") or {}
    calls = message.get("tool_calls") or []
    evidence.update(finish_reason=choice.get("finish_reason"), calls=len(calls))
    if len(calls) != 1:
        return failed(TOOLS, f"{len(calls)} tool calls where one was asked for; the answer: "
                      f"{str(message.get('content'))[:200]!r}", evidence)
    fn = calls[0].get("function") or {}
    evidence.update(name=fn.get("name"), arguments=str(fn.get("arguments"))[:500])
    problem = _call_problem(t, fn, choice.get("finish_reason"), message.get("content"))
    if problem:
        return failed(TOOLS, problem, evidence)
    arguments = strict_json(fn["arguments"], "the tool call's arguments", ConfigError)  # _call_problem read it
    evidence["as_expected"] = arguments == dict(t.expect)
    return passed(TOOLS, f"{t.name}({fn['arguments']}) parsed by the {parser} parser; its arguments validate "
                  "against the tool's schema" + ("" if evidence["as_expected"] else
                                                 f" (other values than the expected {json.dumps(t.expect)})"),
                  evidence)


def _call_problem(t: sm.Tools, fn: Dict[str, Any], finish: Optional[str], content: Any) -> str:
    import jsonschema

    if fn.get("name") != t.name:
        return f"called {fn.get('name')!r}, not the offered {t.name!r}"
    if finish != "tool_calls":
        return f"finish_reason is {finish!r}, not 'tool_calls'"
    if isinstance(content, str) and "<tool_call>" in content:
        return "the tool-call markup is left in the answer's text: the parser did not take it"
    raw = fn.get("arguments")
    try:
        arguments = strict_json(raw if isinstance(raw, str) else "", "the tool call's arguments", ConfigError)
    except ConfigError:
        return f"the arguments are not JSON: {str(fn.get('arguments'))[:200]!r}"
    errors = sorted(jsonschema.Draft202012Validator(t.schema).iter_errors(arguments), key=lambda e: list(e.path))
    if errors:
        at = "/".join(str(p) for p in errors[0].absolute_path) or "the arguments"
        return f"the arguments do not validate against the tool's schema: {at}: {errors[0].message[:200]}"
    return ""
