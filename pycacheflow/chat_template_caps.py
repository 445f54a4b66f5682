"""What a Jinja chat template can render, for ``GET /props``' ``chat_template_caps``.

llama-server reports the capabilities its own Jinja engine finds by running the template on
probe conversations and watching which input values the template reads
(common/jinja/caps.cpp of the pinned tree). jinja2 cannot watch reads, so the probes here use
markers instead: a capability holds when the probe renders without an error and its marker
appears in the output, written as text rather than as a Python repr of a list or dict. The
keys are llama-server's; for the usual templates the answers are the same (a template that
reads a value without printing it, e.g. only to test it, reads as lacking the capability).
``supports_reasoning_effort`` asks whether the template mentions the variable at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pycacheflow.chat_template import ChatTemplate

_TEXT = "<CF_PROBE_TEXT>"
_SYSTEM = "<CF_PROBE_SYSTEM>"
_TOOL = "cf_probe_tool"
_CALL_ARG = "<CF_PROBE_ARG>"
_CALLS = ("cf_probe_call_1", "cf_probe_call_2")
_REASONING = "<CF_PROBE_REASONING>"
_REPR_MARK = "{'"  # how jinja2 prints a dict (tojson writes '{"')


def template_caps(template: ChatTemplate) -> dict[str, bool]:
    """llama-server's ``chat_template_caps`` of ``template`` (renders it about eight times;
    cache the result).

    Returns:
        {"supports_string_content", "supports_typed_content", "supports_tools",
        "supports_tool_calls", "supports_parallel_tool_calls", "supports_system_role",
        "supports_preserve_reasoning", "supports_reasoning_effort",
        "supports_object_arguments"}: bool each.
    """
    typed = _shows(template, [_user([{"type": "text", "text": _TEXT}])], _TEXT)
    string_out = _render(template, [_user(_TEXT)])
    tools = [_tool_definition()]
    object_args = _render(template, _tool_conversation({"arg": _CALL_ARG}), tools)
    string_args = _render(template, _tool_conversation('{"arg": "' + _CALL_ARG + '"}'), tools)
    with_object_args = _clean(object_args, _CALL_ARG)
    args: object = {"arg": "x"} if with_object_args else '{"arg": "x"}'
    parallel = _render(template, _tool_conversation(args, calls=2), tools)
    return {
        # llama-server: a template that reads string content (even one that also takes
        # parts) supports it unless rendering fails or drops the text
        "supports_string_content": string_out is not None and (_TEXT in string_out or not typed),
        "supports_typed_content": typed,
        "supports_tools": any(_has(out, _TOOL) for out in (object_args, string_args)),
        "supports_tool_calls": any(_has(out, _CALLS[0]) for out in (object_args, string_args)),
        "supports_parallel_tool_calls": _has(parallel, _CALLS[1]),
        "supports_system_role": _shows(template, [_system(), _user("User message")], _SYSTEM),
        "supports_preserve_reasoning": _has(
            _render(template, _reasoning_conversation(), kwargs={"enable_thinking": True}),
            _REASONING,
        ),
        "supports_reasoning_effort": "reasoning_effort" in template.variables(),
        "supports_object_arguments": with_object_args,
    }


def _render(
    template: ChatTemplate,
    messages: list[dict[str, object]],
    tools: list[dict[str, object]] | None = None,
    kwargs: dict[str, object] | None = None,
) -> str | None:
    """The rendered probe, or None when the template failed on it (any exception: a probe
    may feed a template input it does not expect)."""
    try:
        return template.render(messages, True, tools=tools, kwargs=kwargs)
    except Exception:  # noqa: BLE001 - a failed probe is an answer, not an error
        return None


def _has(out: str | None, marker: str) -> bool:
    return out is not None and marker in out


def _clean(out: str | None, marker: str) -> bool:
    """The marker is in the output, and no value was printed as a Python repr."""
    return _has(out, marker) and _REPR_MARK not in out


def _shows(template: ChatTemplate, messages: list[dict[str, object]], marker: str) -> bool:
    return _clean(_render(template, messages), marker)


def _user(content: object) -> dict[str, object]:
    return {"role": "user", "content": content}


def _system() -> dict[str, object]:
    return {"role": "system", "content": _SYSTEM}


def _tool_definition() -> dict[str, object]:
    arg = {"type": "string", "description": "Arg description"}
    parameters = {"type": "object", "required": ["arg"], "properties": {"arg": arg}}
    function = {"name": _TOOL, "description": "Tool description", "parameters": parameters}
    return {"type": "function", "function": function}


def _tool_conversation(arguments: object, calls: int = 1) -> list[dict[str, object]]:
    """user, assistant with ``calls`` tool calls, tool answer, assistant, user."""
    tool_calls = [{"id": f"call0000{i + 1}", "type": "function",
                   "function": {"name": _CALLS[i], "arguments": arguments}}
                  for i in range(calls)]  # fmt: skip
    return [
        _user("User message"),
        {"role": "assistant", "content": "", "tool_calls": tool_calls},
        {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "The tool response was 'tool response'"},
        _user("User message"),
    ]


def _reasoning_conversation() -> list[dict[str, object]]:
    """Reasoning in an earlier assistant turn (not the last), which a template that keeps
    reasoning in the history renders."""
    return [
        _user("User message"),
        {"role": "assistant", "content": "Assistant message", "reasoning_content": _REASONING},
        _user("User message"),
        {"role": "assistant", "content": "Assistant message", "reasoning_content": "Reasoning"},
        _user("User message"),
    ]
