"""The reasoning of one chat request's answers: how its output splits into ``content`` and
``reasoning_content`` (message and stream deltas), as llama-server does it for the request's
template and ``reasoning_format`` (pycacheflow/reasoning.py has the rules).

A template without reasoning markers has no ``ChatReasoning``: its answers are content, as
before. Streams send the growth of each part, reasoning first, one chunk each (llama-server's
diffs); a chunk of output that changes neither (a marker not complete yet) sends nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from pycacheflow.reasoning import ReasoningMarkers, ReasoningSplit, split_reasoning


@dataclass(frozen=True)
class ChatReasoning:
    """What parsing a chat request's output needs.

    Attributes:
        markers: its template's reasoning markers.
        extract: move the reasoning to ``reasoning_content`` (every reasoning_format but
            "none").
        tail: the generation prompt from its reasoning start marker on ("" when it opens no
            block), parsed in front of the output.
    """

    markers: ReasoningMarkers
    extract: bool
    tail: str = ""

    def split(self, output_text: str) -> ReasoningSplit:
        """The (reasoning, content) of an output (whole, or so far)."""
        return split_reasoning(self.tail + output_text, self.markers, self.extract)

    def stream(self) -> ReasoningStream:
        """A parser for one streamed choice."""
        return ReasoningStream(self)


class ReasoningStream:
    """The deltas of one streamed choice (the event loop's thread).

    Args:
        reasoning: the request's.
    """

    def __init__(self, reasoning: ChatReasoning) -> None:
        self._reasoning = reasoning
        self._text = ""
        self._sent = ReasoningSplit("", "")

    def feed(self, text: str) -> ReasoningSplit:
        """Add streamed output; returns what each part gained ("" for a part that did not)."""
        self._text += text
        now = self._reasoning.split(self._text)
        # a lenient parse only extends each part as the text grows; a part that would change
        # what was sent is left alone (never the case for the rules of pycacheflow.reasoning)
        reasoning = _growth(self._sent.reasoning, now.reasoning)
        content = _growth(self._sent.content, now.content)
        self._sent = ReasoningSplit(self._sent.reasoning + reasoning, self._sent.content + content)
        return ReasoningSplit(reasoning, content)


def _growth(sent: str, now: str) -> str:
    return now[len(sent) :] if now.startswith(sent) else ""
