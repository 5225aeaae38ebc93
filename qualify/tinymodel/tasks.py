"""What the tiny model must answer: chat messages and the reply greedy decoding must produce.

The deploy's requests come from core/serving.py, the module the deploy's checks send them from; the serving
matrix's (issue 39) from its data file (probe/servematrix.py), which `serve-check` sends. Tools are offered in
the request but the chat template does not render them (vocab.py): the reply depends only on the
conversation, so however a server serialises the tool list, the prompt is the same. The matrix's needle
retrieval is a skill of its own (needle.py): its examples are drawn afresh at every training step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from qualify.core import serving
from qualify.probe import servematrix

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


@dataclass(frozen=True)
class Example:
    """One conversation and the assistant reply it must get (greedy decoding, up to end of turn)."""

    name: str
    messages: Tuple[Tuple[str, str], ...]  # (role, content)
    reply: str

    def chat(self) -> List[Dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]


def hermes_call(name: str, arguments: Dict[str, object]) -> str:
    """A tool call as the `hermes` parser reads it: JSON with name and arguments between the two tags."""
    return f"{TOOL_CALL_START}\n{json.dumps({'name': name, 'arguments': arguments})}\n{TOOL_CALL_END}"


def _facts_about_seven() -> str:
    facts = ["Seven is a prime number.", "Seven is odd.", "A week has seven days.", "Seven follows six.",
             "Seven comes before eight.", "Seven is written 7.", "Seven squared is 49.", "Seven times two is 14."]
    return "\n".join(f"{n}. {fact}" for n, fact in enumerate(facts, 1))


def deploy_examples() -> List[Example]:
    """The deploy's canary, tool call and long decode (deploy/api.py sends exactly these)."""
    return [
        Example("canary", (("user", serving.CANARY_PROMPT),), serving.CANARY_ANSWER),
        Example("tool-call", (("user", serving.TOOL_PROMPT),),
                hermes_call(serving.TOOL_NAME, {"city": serving.TOOL_CITY})),
        Example("long-decode", (("user", serving.LONG_PROMPT),), _facts_about_seven()),
    ]


def numbered_words(prompt: str) -> str:
    """The tiny model's reply to a matrix prompt it cannot understand: the prompt's words, numbered, one a line
    (long enough to judge determinism and accuracy by, the same for any prompt the data file lists)."""
    words = [w.strip(".,?!;:") for w in prompt.split()]
    return "\n".join(f"{n}. {w}" for n, w in enumerate((w for w in words if w), 1))


def matrix_examples(matrix: Optional[servematrix.Matrix] = None) -> List[Example]:
    """The serving matrix's plain prompts (determinism, soak, accuracy) and its tool call."""
    matrix = matrix or servematrix.load()
    out = [Example(f"matrix-{n}", (("user", p),), numbered_words(p)) for n, p in enumerate(matrix.prompts(), 1)]
    out.append(Example("matrix-tool", (("user", matrix.tools.prompt),),
                       hermes_call(matrix.tools.name, dict(matrix.tools.expect))))
    return out


# Each skill: a name and the examples that teach it. A new skill is one more entry.
SKILLS: Dict[str, Callable[[], List[Example]]] = {"deploy": deploy_examples, "matrix": matrix_examples}


def examples(skills: Tuple[str, ...] = tuple(SKILLS)) -> List[Example]:
    out: List[Example] = []
    for skill in skills:
        out.extend(SKILLS[skill]())
    return out
