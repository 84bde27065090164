"""Recorded model outputs and what the parsers must make of them."""

from __future__ import annotations

WEATHER = '{"city": "Paris", "unit": "celsius"}'

# (model output, expected content, expected [(name, arguments JSON)])
HERMES = [
    ('<tool_call>\n{"name": "get_weather", "arguments": ' + WEATHER + '}\n</tool_call>',
     None, [("get_weather", WEATHER)]),
    ('Let me check both cities.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
     '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Berlin"}}\n</tool_call>',
     "Let me check both cities.\n", [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Berlin"}')]),
    # Braces, quotes, a closing tag and non-ASCII text inside argument strings.
    ('<tool_call>{"name":"search","arguments":{"q":"a {b} \\"c\\" </tool_call> caf\u00e9 \u65e5\u672c",'
     '"opts":{"n":[1,2,{"k":null}],"exact":true,"score":-1.5e3}}}</tool_call>',
     None, [("search", '{"q":"a {b} \\"c\\" </tool_call> caf\u00e9 \u65e5\u672c",'
                       '"opts":{"n":[1,2,{"k":null}],"exact":true,"score":-1.5e3}}')]),
    # Arguments written before the name; text after the calls is not content (vLLM's rule).
    ('<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call> done', None, [("f", '{"x": 1}')]),
    # Arguments written as a string: one holding JSON is decoded, any other stays a JSON string.
    ('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', None, [("f", '{"x": 1}')]),
    ('<tool_call>{"name": "f", "arguments": "Paris"}</tool_call>', None, [("f", '"Paris"')]),
    # No arguments at all; the model stopped before the closing tag.
    ('<tool_call>{"name": "now"}', None, [("now", "{}")]),
    # Plain answers, including ones with a '<' that is not a tag.
    ("It is 21 degrees < 30 in Paris. <tool is not a tag", "It is 21 degrees < 30 in Paris. <tool is not a tag", []),
    ("", "", []),
]

LLAMA3_JSON = [
    ('<|python_tag|>{"name": "get_weather", "parameters": ' + WEATHER + '}', None, [("get_weather", WEATHER)]),
    ('{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {"y": [1, 2], "z": "s;t"}}',
     None, [("a", '{"x": 1}'), ("b", '{"y": [1, 2], "z": "s;t"}')]),
    ('{"name": "f", "parameters": {"x": 1}} and some words after', " and some words after", [("f", '{"x": 1}')]),
    # A call after some leading text is still found (vLLM drops the text; forkless keeps it).
    ('Here is the result: {"name": "get_weather", "parameters": {"city": "Paris"}}',
     "Here is the result: ", [("get_weather", '{"city": "Paris"}')]),
    ('I will look both up.\n{"name": "a", "parameters": {}} ; {"name": "b", "parameters": {"q": "{x}"}} Done.',
     "I will look both up.\n Done.", [("a", "{}"), ("b", '{"q": "{x}"}')]),
    ("The capital of France is Paris.", "The capital of France is Paris.", []),
]

# Outputs that are not calls although they look like the start of one.
MALFORMED = {
    "hermes": ['<tool_call>not json</tool_call> sorry', '<tool_call>{"name": "f", "arguments": {"x": 1'],
    "llama3_json": [
        '{"answer": 42}', '{"name": 3, "parameters": {}}',
        '  {"name": "noargs"}',  # a name without parameters or arguments is not a call (as in vLLM)
        'Use {braces} like this: {"name": "f", "parameters": {}}',  # a "{" that is not JSON
    ],
}

# Not calls either, but only the end shows it: a stream has sent the first call by then.
MALFORMED_AFTER_A_CALL = {
    "llama3_json": ['{"name": "f", "parameters": {}}; {"name": "g"}'],  # every object must be a call
}

# (model output, expected reasoning, expected content). As in vLLM, the reasoning is ""
# (not None) when the think block is there but empty.
QWEN3 = [
    ("<think>\nThe user wants the weather.\n</think>\n\nIt is sunny.", "\nThe user wants the weather.\n",
     "\n\nIt is sunny."),
    # The chat template opened the block: the output starts inside it.
    ("The template opened the block.</think>It is sunny.", "The template opened the block.", "It is sunny."),
    ("\n<think>A newline first.</think>Answer.", "A newline first.", "Answer."),
    ("<think>\nstopped while thinking", "\nstopped while thinking", None),
    ("Stopped while thinking, no tag at all", "Stopped while thinking, no tag at all", None),
    ("<think></think>Only an answer.", "", "Only an answer."),
    # A <tool_call> that starts a call ends the reasoning (Qwen3.5 may skip </think>).
    ('Paris needs a lookup.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "Paris needs a lookup.\n",
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("Let me call it.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
     "</tool_call>", "Let me call it.\n",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"),
    # ... but a <tool_call> merely mentioned does not, nor one before </think>.
    ("I could write <tool_call> here and keep thinking", "I could write <tool_call> here and keep thinking", None),
    ('<think>maybe <tool_call>{"name": "f"}</tool_call>?</think>No.', 'maybe <tool_call>{"name": "f"}</tool_call>?',
     "No."),
]

# enable_thinking=False in chat_template_kwargs: everything is content.
QWEN3_NO_THINKING = [
    ("<think>x</think>y", None, "<think>x</think>y"),
    ("It is sunny.", None, "It is sunny."),
]

DEEPSEEK_R1 = [
    ("Okay, 2 + 2 is 4.\n</think>\n\nThe answer is 4.", "Okay, 2 + 2 is 4.\n", "\n\nThe answer is 4."),
    ("<think>reason</think>answer", "reason", "answer"),
    ("still thinking, no end tag </thi", "still thinking, no end tag </thi", None),
    ("\n<think>This is a reasoning section</think>\nThis is the rest", "This is a reasoning section",
     "\nThis is the rest"),
    ("</think>This is the rest", "", "This is the rest"),
    ("<think>This is a reasoning section", "This is a reasoning section", None),
    ("", "", None),
]
