"""encode_utf8 (pycacheflow/text.py): text with no UTF-8 form is an error naming the value."""

from __future__ import annotations

import pytest

from pycacheflow.errors import InvalidArgumentError
from pycacheflow.text import encode_utf8


def test_valid_text_is_its_utf8():
    assert encode_utf8("héllo ☃", "prompt 1") == "héllo ☃".encode()


def test_an_undecodable_byte_is_named():
    """Command-line arguments that are not UTF-8 arrive with the bytes escaped."""
    text = b"ab\xffc".decode("utf-8", errors="surrogateescape")
    with pytest.raises(InvalidArgumentError) as info:
        encode_utf8(text, "prompt 2")
    assert str(info.value) == "prompt 2 is not valid UTF-8 text: undecodable byte 0xff at character 2"
    assert isinstance(info.value, ValueError)


def test_a_lone_surrogate_is_named():
    """A JSON body may spell one, e.g. "\\ud800"."""
    with pytest.raises(InvalidArgumentError, match="stop string is not valid UTF-8 text: lone "
                       "surrogate U\\+D800 at character 1"):  # fmt: skip
        encode_utf8("x\ud800", "stop string")
