"""Incremental detokenization and stop-string handling for streamed output.

Two small, pure pieces (no native calls of their own, so they are unit-tested with a fake
vocabulary):

* ``IncrementalDetokenizer`` turns a growing list of token ids into new text. It detokenizes a
  short window of tokens twice (with and without the new ones) and keeps the byte difference,
  which stays correct for tokenizers that strip the leading space of the first token; a UTF-8
  incremental decoder holds back a character split across tokens until it is complete.
* ``StopStringMatcher`` cuts text at the earliest stop string and holds back any tail that could
  still grow into one, so streamed text never runs past a stop string.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence

DetokenizeFn = Callable[[Sequence[int]], bytes]


class IncrementalDetokenizer:
    """Turns output tokens into text piece by piece.

    Args:
        detokenize: maps a token id list to its UTF-8 bytes (the model's detokenizer with the
            same flags as the final text).

    Invariant: the concatenation of everything ``push`` and ``flush`` returned equals
    ``detokenize(all tokens)`` decoded with errors="replace", for tokenizers whose output for a
    sequence ``a + b`` starts with the output for ``a`` (all llama.cpp tokenizers do).
    """

    def __init__(self, detokenize: DetokenizeFn) -> None:
        self._detokenize = detokenize
        self._token_ids: list[int] = []
        # Token window [prefix_offset, read_offset) was decoded last time; bytes of tokens
        # from read_offset on are new.
        self._prefix_offset = 0
        self._read_offset = 0
        self._num_bytes_out = 0  # bytes handed to the UTF-8 decoder so far
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    @property
    def token_ids(self) -> list[int]:
        """All tokens pushed so far (do not mutate)."""
        return self._token_ids

    def push(self, token_ids: Sequence[int]) -> str:
        """Append tokens and return the text they complete (may be "").

        Args:
            token_ids: new output tokens, in order.

        Returns:
            New text; a trailing incomplete UTF-8 character is held back until completed.
        """
        if not token_ids:
            return ""
        self._token_ids.extend(token_ids)
        window = self._token_ids[self._prefix_offset :]
        num_old = self._read_offset - self._prefix_offset
        old = self._detokenize(window[:num_old]) if num_old else b""
        new = self._detokenize(window)
        if new.startswith(old):
            delta = new[len(old) :]
        else:  # tokenizer not prefix-stable on this window: fall back to a full decode
            delta = self._detokenize(self._token_ids)[self._num_bytes_out :]
        self._num_bytes_out += len(delta)
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        return self._utf8.decode(delta)

    def flush(self) -> str:
        """Return what is held back at the end of the output (an incomplete character as U+FFFD)."""
        return self._utf8.decode(b"", final=True)


class StopStringMatcher:
    """Cuts streamed text at the earliest stop string.

    Args:
        stop: stop strings (non-empty). With none, text passes through unchanged.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        self._stop = tuple(stop)
        self._max_len = max((len(s) for s in self._stop), default=0)
        self._text = ""
        self._emitted = 0  # chars of self._text already returned
        self.stopped = False  # True once a stop string occurred
        self.stop_string: str | None = None  # which one

    @property
    def text(self) -> str:
        """The output text so far, cut before the stop string once one occurred."""
        return self._text

    def push(self, text: str) -> str:
        """Add new output text; return the part that is safe to show now.

        Returns:
            Text that can no longer become part of a stop string; "" once stopped.
        """
        if self.stopped or not text:
            return ""
        self._text += text
        if not self._stop:
            return self._take(len(self._text))
        start = max(0, self._emitted - self._max_len + 1)
        hit = self._earliest_stop(start)
        if hit is not None:
            pos, s = hit
            self._text = self._text[:pos]
            self.stopped, self.stop_string = True, s
            return self._take(pos)
        return self._take(len(self._text) - self._held_back())

    def flush(self) -> str:
        """Return the held-back tail at the end of the output (no stop string completed)."""
        return "" if self.stopped else self._take(len(self._text))

    def _take(self, end: int) -> str:
        piece = self._text[self._emitted : end]
        self._emitted = max(self._emitted, end)
        return piece

    def _earliest_stop(self, start: int) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for s in self._stop:
            pos = self._text.find(s, start)
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, s)
        return best

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        text = self._text
        for k in range(min(self._max_len - 1, len(text) - self._emitted), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self._stop):
                return k
        return 0


def truncate_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut ``text`` right before the earliest occurrence of any stop string.

    Returns:
        (text, True) if a stop string occurred, else (text unchanged, False).
    """
    positions = [pos for pos in (text.find(s) for s in stop) if pos >= 0]
    if not positions:
        return text, False
    return text[: min(positions)], True
