"""Recorded model outputs and what the parsers must make of them."""

from __future__ import annotations

WEATHER = '{"city": "Paris", "unit": "celsius"}'

# (model output, expected content, expected [(name, arguments JSON)])
HERMES = [
    ('<tool_call>\n{"name": "get_weather", "arguments": ' + WEATHER + '}\n</tool_call>',
     None, [("get_weather", WEATHER)]),
    ('Let me check both cities.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
     '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Berlin"}}\n</tool_call>',
     "Let me check both cities.\n\n", [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Berlin"}')]),
    # Braces, quotes, a closing tag and non-ASCII text inside argument strings.
    ('<tool_call>{"name":"search","arguments":{"q":"a {b} \\"c\\" </tool_call> caf\u00e9 \u65e5\u672c",'
     '"opts":{"n":[1,2,{"k":null}],"exact":true,"score":-1.5e3}}}</tool_call>',
     None, [("search", '{"q":"a {b} \\"c\\" </tool_call> caf\u00e9 \u65e5\u672c",'
                       '"opts":{"n":[1,2,{"k":null}],"exact":true,"score":-1.5e3}}')]),
    # Arguments written before the name.
    ('<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call> done', " done", [("f", '{"x": 1}')]),
    # No arguments at all; the model stopped before the closing tag.
    ('<tool_call>{"name": "now"}', None, [("now", "{}")]),
    # Plain answers, including ones with a '<' that is not a tag.
    ("It is 21 degrees < 30 in Paris. <tool is not a tag", "It is 21 degrees < 30 in Paris. <tool is not a tag", []),
    ("", "", []),
]

LLAMA3_JSON = [
    ('<|python_tag|>{"name": "get_weather", "parameters": ' + WEATHER + '}', None, [("get_weather", WEATHER)]),
    ('{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {"y": [1, 2], "z": "s;t"}}',
     None, [("a", '{"x": 1}'), ("b", '{"y": [1, 2], "z": "s;t"}')]),
    ('  {"name": "noargs"}', None, [("noargs", "{}")]),
    ('{"name": "f", "parameters": {"x": 1}} and some words after', " and some words after", [("f", '{"x": 1}')]),
    ("The capital of France is Paris.", "The capital of France is Paris.", []),
]

# Outputs that are not calls although they look like the start of one.
MALFORMED = {
    "hermes": ['<tool_call>not json</tool_call> sorry', '<tool_call>{"name": "f", "arguments": {"x": 1'],
    "llama3_json": ['{"answer": 42}', '{"name": 3, "parameters": {}}'],
}

# (model output, expected reasoning, expected content)
QWEN3 = [
    ("<think>\nThe user wants the weather.\n</think>\n\nIt is sunny.", "\nThe user wants the weather.\n", "\n\nIt is sunny."),
    ("No thinking here, <think> later is just text.", None, "No thinking here, <think> later is just text."),
    ("<think>\nstopped while thinking", "\nstopped while thinking", None),
    ("<think></think>Only an answer.", None, "Only an answer."),
]

DEEPSEEK_R1 = [
    ("Okay, 2 + 2 is 4.\n</think>\n\nThe answer is 4.", "Okay, 2 + 2 is 4.\n", "\n\nThe answer is 4."),
    ("<think>reason</think>answer", "reason", "answer"),
    ("still thinking, no end tag </thi", "still thinking, no end tag </thi", None),
]
