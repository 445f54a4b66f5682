"""SSE bytes templates (pycacheflow/server/sse.py): the same bytes as the events of the dicts
pycacheflow/server/responses.py builds, for texts JSON must escape. No engine."""

from __future__ import annotations

import pytest

from pycacheflow.server import responses, sse

TEXTS = ["", "a", "two words", 'quote " backslash \\ slash /', "tab\tnew\nline\r", "\x00\x1f\x7f",
         "é€😀", "\u2028\u2029", "x" * 300]  # fmt: skip


@pytest.mark.parametrize("text", TEXTS)
def test_templates_give_the_bytes_of_the_dict_events(text):
    ids = responses.ResponseIds("cmpl", 'model "m"/ü')
    for token_ids in [(), (7,), (1, 2, 300)]:
        assert sse.completion_partial_event(3, text, token_ids, 12, 5) == sse.event(
            responses.completion_partial(3, text, token_ids, 12, 5))  # fmt: skip
    envelope = sse.members(ids.envelope("text_completion"))
    assert sse.oai_completion_chunk_event(envelope, 1, text) == sse.event(
        responses.oai_completion_chunk(ids, 1, text, None))  # fmt: skip
    envelope = sse.members(ids.envelope("chat.completion.chunk"))
    for delta in [{"content": text}, {"reasoning_content": text}]:
        assert sse.chat_chunk_event(envelope, delta, 2) == sse.event(
            responses.chat_chunk(ids, delta, None, 2))  # fmt: skip
