"""Text that crosses into native code: str to UTF-8 bytes, with an error that says what is wrong.

A Python str can hold lone surrogates, which have no UTF-8 form: bytes that were not UTF-8,
decoded with "surrogateescape" (command-line arguments, stdin, file names), or JSON escapes
such as "\\ud800" in a request body. ``str.encode`` fails on them with a UnicodeEncodeError deep
inside a call; ``encode_utf8`` turns that into an InvalidArgumentError naming the value.
Token ids cross too: ``is_exact_int_list`` tells a tokenizer's output (plain ints) apart cheaply.
"""

from __future__ import annotations

from pycacheflow.errors import InvalidArgumentError

_ESCAPED_BYTES = range(0xDC80, 0xDD00)  # surrogateescape's stand-ins for bytes 0x80..0xff


def encode_utf8(text: str, what: str) -> bytes:
    """``text`` as UTF-8 bytes.

    Args:
        text: the text.
        what: what it is, for the message (e.g. "prompt 2", "stop string").

    Returns:
        The UTF-8 encoding.

    Raises:
        InvalidArgumentError (a ValueError): ``text`` holds a lone surrogate; the message names
            ``what``, the character index and, for an escaped byte, the byte.
    """
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        if code in _ESCAPED_BYTES:
            found = f"undecodable byte 0x{code - 0xDC00:02x}"
        else:
            found = f"lone surrogate U+{code:04X}"
        raise InvalidArgumentError(
            f"{what} is not valid UTF-8 text: {found} at character {exc.start}"
        ) from None


def is_exact_int_list(values: object) -> bool:
    """``values`` is a list of plain ints (a tokenizer's output), checked by one pass in C."""
    return type(values) is list and set(map(type, values)) <= {int}
