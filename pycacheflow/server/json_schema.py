"""JSON schemas of requests (``json_schema``, OpenAI ``response_format``) as GBNF grammars.

The conversion is llama.cpp's own (common/json-schema-to-grammar.cpp, through
``cf_json_schema_to_grammar``); this module only picks the schema out of a request the way
llama-server does (tools/server/server-common.cpp and server-schema.cpp of the pinned tree):

  - /completion, /v1/completions: ``json_schema`` gives the grammar unless ``grammar`` is set;
  - chat: ``json_schema`` and ``grammar`` together are an error; ``response_format``
    ``{"type": "json_object"[, "schema": S]}`` and ``{"type": "json_schema", "json_schema":
    {"schema": S}}`` set the schema; ``"text"`` (or no type) sets nothing; another type is an
    error;
  - an empty schema ``{}`` (json_object without a schema) means any JSON object.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from pycacheflow import _native
from pycacheflow.errors import InvalidArgumentError


class SchemaError(ValueError):
    """A request's schema fields cannot give a grammar (answered as HTTP 400)."""


def grammar_of_schema(schema: object) -> str:
    """The GBNF grammar of a decoded JSON schema (llama.cpp's converter).

    Args:
        schema: the schema as decoded JSON (normally a dict; {} = any object).

    Raises:
        SchemaError: the converter rejects it (the message gives its reason).
    """
    try:
        return _native.json_schema_to_grammar(json.dumps(schema, ensure_ascii=False))
    except InvalidArgumentError as exc:
        raise SchemaError(str(exc)) from None


def json_object_grammar() -> str:
    """The grammar of any JSON object (what ``response_format`` json_object without a schema
    asks for)."""
    return grammar_of_schema({"type": "object"})


def completion_grammar(body: Mapping[str, object]) -> str:
    """The grammar of a completion body: ``grammar``, else the ``json_schema``'s, else "".

    Raises:
        SchemaError: the schema cannot be converted.
    """
    grammar = body.get("grammar")
    if isinstance(grammar, str) and grammar:
        return grammar
    if body.get("json_schema") is not None:
        return grammar_of_schema(body["json_schema"])
    return ""


def chat_schema(body: Mapping[str, object]) -> object | None:
    """The JSON schema a chat body asks for (``json_schema`` or ``response_format``), or None.

    Raises:
        SchemaError: both a schema and a grammar, a response_format that is not an object, or
            one of an unknown type.
    """
    schema = body.get("json_schema")
    if schema is not None and body.get("grammar"):
        raise SchemaError("Cannot use both json_schema and grammar")
    response_format = body.get("response_format")
    if response_format is not None:
        if not isinstance(response_format, dict):
            raise SchemaError("Field 'response_format': expected an object")
        kind = response_format.get("type") or "text"
        if kind == "json_object":
            if "schema" in response_format or not schema:
                schema = response_format.get("schema", {})
        elif kind == "json_schema":
            wrapper = response_format.get("json_schema")
            schema = wrapper.get("schema", {}) if isinstance(wrapper, dict) else {}
        elif kind != "text":
            raise SchemaError(
                'response_format type must be one of "text", "json_object" or "json_schema", '
                f"but got: {kind}"
            )
    if schema is not None and body.get("grammar"):
        raise SchemaError("Cannot use both a JSON response_format and grammar")
    return schema


def chat_grammar(body: Mapping[str, object]) -> str:
    """The grammar of a chat body: its schema's (see ``chat_schema``), else ``grammar``, else "".

    Raises:
        SchemaError: as ``chat_schema``, or the schema cannot be converted.
    """
    schema = chat_schema(body)
    if schema is not None:
        return grammar_of_schema(schema)
    grammar = body.get("grammar")
    return grammar if isinstance(grammar, str) else ""
