"""The constraints the structured-output tests run on the default model, with prompts
that ask for what the schema describes (a small model follows a prompt it understands)."""

from __future__ import annotations

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "format": "email", "maxLength": 40},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}

NESTED = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "location": {
            "type": "object",
            "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
                           "lon": {"type": "number", "minimum": -180, "maximum": 180}},
            "required": ["lat", "lon"],
            "additionalProperties": False,
        },
    },
    "required": ["city", "location"],
    "additionalProperties": False,
}

ARRAY = {
    "type": "object",
    "properties": {
        "colors": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue", "yellow"]},
                   "minItems": 2, "maxItems": 3},
    },
    "required": ["colors"],
    "additionalProperties": False,
}

ANY_OF = {
    "type": "object",
    "properties": {
        "id": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 999}, {"type": "string", "pattern": "^[A-Z]{3}$"}]},
        "status": {"type": "string", "enum": ["open", "closed"]},
        "date": {"type": "string", "format": "date"},
    },
    "required": ["id", "status", "date"],
    "additionalProperties": False,
}

SCHEMAS = {"person": PERSON, "nested": NESTED, "array": ARRAY, "any_of": ANY_OF}

PROMPTS = {
    "person": "Describe a person (name, age, email) as JSON.",
    "nested": "Give the city of Paris with its latitude and longitude as JSON.",
    "array": "List two or three colors as JSON.",
    "any_of": "Give a ticket (id, status, date) as JSON.",
}

REGEX = r"[0-9]{3}-[0-9]{4}"
CHOICES = ["Paris", "London", "Berlin"]
EBNF = 'root ::= "The answer is " ("yes" | "no") "."'
LARK = 'start: "The answer is " ANSWER "."\nANSWER: "yes" | "no"'

# A tool for tool_choice tests.
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time in a timezone.",
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 30}},
                       "required": ["timezone"], "additionalProperties": False},
    },
}
