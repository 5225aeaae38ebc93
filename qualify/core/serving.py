"""The requests the deploy sends a served model, and the answers it expects: spelled once.

The deploy's checks (`deploy/api.py`) send them; `qualify tiny-model` (`tinymodel/`) makes a model that
answers them, so the two cannot drift apart. Standard library only.
"""

from __future__ import annotations

CANARY_PROMPT = "What is 19 times 23?"
CANARY_ANSWER = "437"

# A long greedy decode, twice: the deploy's determinism check and its throughput figure.
LONG_PROMPT = "Write a numbered list of forty short, plain facts about the number seven."

TOOL_PROMPT = "What is the weather in Paris right now? Use the tool."
TOOL_NAME = "get_weather"
TOOL_CITY = "Paris"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
