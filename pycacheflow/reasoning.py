"""Reasoning ("thinking") blocks of chat output: found and split off as llama-server does.

llama-server of the pinned tree looks for no fixed ``<think>`` tag. Its differential analyzer
(common/chat-diff-analyzer.cpp) renders the model's chat template on probe conversations and
takes as reasoning markers what the template writes around an assistant message's
``reasoning_content`` (or adds to the generation prompt when ``enable_thinking`` is switched);
a template without such markers (SmolLM2's, for one) has no reasoning, and its output stays
content whatever ``reasoning_format`` says. ``detect_markers`` does the same for a jinja2
template: the presence and thinking-switch probes, the marker syntax (``<...>`` or ``[...]``),
the segment-wise diff, and the workaround for old Qwen/DeepSeek templates that only strip
``</think>`` from history. Not covered: the templates llama.cpp handles with a dedicated
parser (gpt-oss channels and the like), Granite's ``<response>`` wrapping, and reasoning that
only appears with tool calls.

``split_reasoning`` is llama-server's generated parser for such a template (chat-auto-parser-
generator.cpp, parsed leniently as every chat output is): whitespace, then an optional
``start ... end`` block at the very start (the reasoning), then the rest (the content). An
unclosed block is all reasoning; a trailing piece of a marker is held back (nothing yet). The
text parsed is the generation prompt from its start marker on (a prompt that opens the block
itself, as DeepSeek-R1's and QwQ's do) followed by the output. With ``extract`` False
(``reasoning_format`` "none") nothing is split off, but the leading whitespace still goes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from pycacheflow.chat_template import ChatTemplate

REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")
# common_params.reasoning_format; every format but "none" extracts
DEFAULT_REASONING_FORMAT = "deepseek"

# llama.cpp's probe texts (chat-diff-analyzer.cpp)
_USER = "U_USER_MSG Hello END_U"
_ASSISTANT = "A_ASST_MSG I can help END_A"
_THINKING = "REASON_PART I am thinking END_R"
WHITESPACE = " \t\n\v\f\r"  # C's isspace, which llama.cpp's space() and trim_whitespace use
_WS = WHITESPACE
_S = r"[ \t\n\v\f\r]*"
_MARKER = r"(?:<[^>]*>|\[[^\]]*\])"  # common_peg_parser_builder::marker()
_WRAPPED = re.compile(rf"({_MARKER}{_S}){re.escape(_THINKING)}({_S}{_MARKER}{_S})")
_DELIMITED = re.compile(rf"{re.escape(_THINKING)}{_S}({_MARKER}{_S})?")
_SEGMENTS = re.compile(r"<[^>]*>|\[[^\]]*\]")
_ANCHOR_CHARS = 64  # the tail-anchoring probe's window


@dataclass(frozen=True)
class ReasoningMarkers:
    """The text a chat template writes around reasoning, whitespace included as rendered.

    Attributes:
        start: e.g. "<think>\\n"; "" when only the end is marked (the block then starts at the
            beginning of the output).
        end: e.g. "\\n</think>\\n\\n"; never empty.
    """

    start: str
    end: str


class ReasoningSplit(NamedTuple):
    """A chat output parsed: ``reasoning`` ("" when none) and ``content``."""

    reasoning: str
    content: str


def detect_markers(template: ChatTemplate) -> ReasoningMarkers | None:
    """The reasoning markers of ``template``, or None when it has none (renders it four times;
    cache the result)."""
    start, end = _presence_markers(template)
    start, end = _thinking_switch_markers(template, start, end)
    if not start and not end and _is_old_qwen(template.source):
        start, end = "<think>", "</think>"
    return ReasoningMarkers(start, end) if start.strip(_WS) or end.strip(_WS) else None


def generation_prompt(with_prompt: str, without_prompt: str) -> str:
    """llama-server's generation prompt: what the template adds for add_generation_prompt
    (``with_prompt`` after the common prefix of the two renderings of the same messages)."""
    i = 0
    for a, b in zip(with_prompt, without_prompt):
        if a != b:
            break
        i += 1
    return with_prompt[i:]


def open_tail(markers: ReasoningMarkers, gen_prompt: str) -> str:
    """The part of a generation prompt from its reasoning start marker on ("" if it has none),
    which is parsed in front of the output."""
    start = markers.start.strip(_WS)
    at = gen_prompt.find(start) if start else -1
    return gen_prompt[at:] if at >= 0 else ""


def split_reasoning(text: str, markers: ReasoningMarkers, extract: bool = True) -> ReasoningSplit:
    """Parse a chat output (``open_tail`` + the generated text) as llama-server does.

    Args:
        text: the text to parse; the output so far while streaming (the parse is lenient:
            the same text always gives the same split, and more text only extends it).
        markers: the template's markers.
        extract: split the reasoning off ("none" as reasoning_format: False).
    """
    text = text.lstrip(_WS)  # space() between the generation prompt and the output
    end = markers.end.strip(_WS)
    if not extract or not end:
        return ReasoningSplit("", text)
    pos = 0
    if markers.start:
        core = markers.start.strip(_WS)
        opened = _optspace(text, 0, markers.start)
        if opened is None:  # no block; or its start marker is not complete yet: nothing so far
            return ReasoningSplit("", "" if core.startswith(text) and text != core else text)
        pos = opened
    at = text.find(end, pos)
    if at < 0:  # unclosed: all reasoning so far, but a trailing piece of the end marker
        cut = next((i for i in range(max(pos, len(text) - len(end) + 1), len(text))
                    if end.startswith(text[i:])), len(text))  # fmt: skip
        return ReasoningSplit(_visible(text[pos:cut]), "")
    after = _optspace(text, at, markers.end)
    return ReasoningSplit(_visible(text[pos:at]), text[after:] if after is not None else "")


def _optspace(text: str, pos: int, tag: str) -> int | None:
    """chat-peg-parser's optspace(tag): the tag's core with each of its surrounding whitespace
    characters optional; the end position, or None when the core is not there (or not yet)."""
    core = tag.strip(_WS)
    lead, trail = tag[: tag.index(core)], tag[tag.index(core) + len(core) :]
    for ch in lead:
        pos += text.startswith(ch, pos)
    if not text.startswith(core, pos):
        return None
    pos += len(core)
    for ch in trail:
        pos += text.startswith(ch, pos)
    return pos


def _visible(reasoning: str) -> str:
    """Whitespace-only reasoning counts as none (e.g. an empty <think></think> block)."""
    return reasoning if reasoning.strip(" \n\r\t") else ""


# ---------------------------------------------------------------------------- the probes


def _render(template: ChatTemplate, messages: list[dict], add_generation_prompt: bool,
            enable_thinking: bool) -> str | None:  # fmt: skip
    try:
        return template.render(messages, add_generation_prompt,
                               kwargs={"enable_thinking": enable_thinking})  # fmt: skip
    except Exception:  # noqa: BLE001 - a probe the template refuses tells nothing
        return None


def _presence_markers(template: ChatTemplate) -> tuple[str, str]:
    """compare_reasoning_presence: the markers around reasoning_content in a rendered turn."""
    user = {"role": "user", "content": _USER}
    plain = {"role": "assistant", "content": _ASSISTANT}
    with_reasoning = {**plain, "reasoning_content": _THINKING}
    a = _render(template, [user, plain], False, True)
    b = _render(template, [user, with_reasoning], False, True)
    if a is None or b is None or _THINKING not in _diff(a, b)[1]:
        return "", ""
    wrapped = _WRAPPED.search(b)
    if wrapped:
        return wrapped.group(1), wrapped.group(2)
    delimited = _DELIMITED.search(b)
    return "", (delimited.group(1) or "") if delimited else ""


def _thinking_switch_markers(template: ChatTemplate, start: str, end: str) -> tuple[str, str]:
    """compare_thinking_enabled: what the generation prompt gains or loses with
    enable_thinking (e.g. an opened ``<think>``, or an empty block when thinking is off)."""
    user = [{"role": "user", "content": _USER}]
    a = _render(template, user, True, False)
    b = _render(template, user, True, True)
    if a is None or b is None:
        return start, end
    left, right = _diff(a, b)
    if not left.strip(_WS) and right:
        if right.strip(_WS) and b.endswith(right.strip(_WS)) and not start:
            start = right
    elif not right.strip(_WS) and left:
        if left.strip(_WS) and a.endswith(left.strip(_WS)) and not end:
            segments = _segments(a)
            if len(segments) >= 2 and segments[-1] == left.strip(_WS) and _is_marker(segments[-2]):
                start = segments[-2]
            end = left
    elif left.strip(_WS) and right.strip(_WS):
        start, end = _tail_anchored(a, b, start, end)
    return start, end


def _tail_anchored(a: str, b: str, start: str, end: str) -> tuple[str, str]:
    """One rendering's last characters found in the other with exactly two markers after them."""
    for base, extended in ((b, a), (a, b)):
        anchor = base[-_ANCHOR_CHARS:]
        at = extended.rfind(anchor)
        if at < 0 or at + len(anchor) >= len(extended):
            continue
        extra = _segments(extended[at + len(anchor) :].strip(_WS))
        if len(extra) == 2 and all(_is_marker(s) for s in extra):
            return start or extra[0], end or extra[1]
    return start, end


def _is_old_qwen(source: str) -> bool:
    """Old Qwen/DeepSeek reasoning templates strip ``</think>`` from history but never render
    reasoning_content (llama.cpp's first workaround)."""
    return ("content.split('</think>')" in source and "reasoning_content" not in source
            and "<SPECIAL_12>" not in source)  # fmt: skip


def _segments(text: str) -> list[str]:
    """segmentize_markers + prune_whitespace_segments: markers and the text between them, the
    whitespace-only pieces dropped."""
    pieces, last = [], 0
    for m in _SEGMENTS.finditer(text):
        pieces += [text[last : m.start()], m.group()]
        last = m.end()
    pieces.append(text[last:])
    return [p for p in pieces if p.strip(_WS)]


def _is_marker(segment: str) -> bool:
    return _SEGMENTS.fullmatch(segment) is not None


def _split_segments(text: str) -> list[tuple[bool, str]]:
    """(is_marker, text) segments of ``text`` in order (segmentize_markers)."""
    out, last = [], 0
    for m in _SEGMENTS.finditer(text):
        if m.start() > last:
            out.append((False, text[last : m.start()]))
        out.append((True, m.group()))
        last = m.end()
    if last < len(text):
        out.append((False, text[last:]))
    return out


def _diff(left: str, right: str) -> tuple[str, str]:
    """calculate_diff_split's (left, right), ported as it is (chat-auto-parser-helpers.cpp):
    what differs between two renderings after their common prefix and suffix, taken segment by
    segment and then, inside text segments at the edges, character by character."""
    ls, rs = _split_segments(left), _split_segments(right)
    if not ls:
        return "", right
    if not rs:
        return left, ""
    l0, l1, r0, r1 = 0, len(ls) - 1, 0, len(rs) - 1  # [start, end] of what is left, inclusive
    l_done = r_done = False  # all of a side taken by the prefix and suffix
    while l0 != l1 and r0 != r1:
        advanced = False
        if ls[l0] == rs[r0]:
            l0, r0, advanced = l0 + 1, r0 + 1, True
        if ls[l1] == rs[r1]:
            if l0 != l1:
                l1 -= 1
            else:
                l_done = True
            if r0 != r1:
                r1 -= 1
            else:
                r_done = True
            advanced = True
        if not advanced:
            break
    if l0 == l1 and r0 != r1:
        if ls[l0] == rs[r1]:
            r1, l_done = r1 - 1, True
        elif ls[l0] == rs[r0]:
            r0, l_done = r0 + 1, True
    elif r0 == r1 and l0 != l1:
        if ls[l1] == rs[r0]:
            l1, r_done = l1 - 1, True
        elif ls[l0] == rs[r0]:
            l0, r_done = l0 + 1, True
    elif l0 == l1 and r0 == r1 and ls[l0] == rs[r0] and ls[l0][0]:
        l_done = r_done = True
    text_suffix = not ls[l1][0] and not rs[r1][0]
    text_prefix = not rs[r0][0] and not ls[l0][0]
    rest_l = "".join(v for _, v in ls[l0 : l1 + (0 if l_done else 1)])
    rest_r = "".join(v for _, v in rs[r0 : r1 + (0 if r_done else 1)])
    suffix = _common_suffix(rest_l, rest_r) if text_suffix else 0
    prefix = (_common_prefix(rest_l[: len(rest_l) - suffix], rest_r[: len(rest_r) - suffix])
              if text_prefix else 0)  # fmt: skip
    out_l = rest_l[prefix : len(rest_l) - suffix]
    out_r = rest_r[prefix : len(rest_r) - suffix]
    if not out_l and out_r and right.startswith(left):
        out_r = right[len(left) :]  # left is all shared with right: the rest of right
    return out_l, out_r


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _common_suffix(a: str, b: str) -> int:
    return _common_prefix(a[::-1], b[::-1])
