"""Read metadata of a GGUF file (its Jinja chat template, its trained context, ...) without
loading it.

A GGUF file starts with a header (magic "GGUF", version, tensor count, key/value count) and its
key/value pairs (see ggml's docs/gguf.md); this module walks those pairs and returns the values
asked for. Arrays not asked for (the tokenizer's vocabulary) are skipped over, not decoded.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, Union

from pycacheflow.errors import InvalidArgumentError

GGUF_MAGIC = b"GGUF"
KEY_CHAT_TEMPLATE = "tokenizer.chat_template"

# GGUF value types -> struct format of one scalar (strings and arrays are handled apart).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_TYPE_STRING = 8
_TYPE_ARRAY = 9
_MAX_KEY_BYTES = 1 << 16  # a longer "key" means a corrupt file, not a real key

Value = Union[str, int, float, bool, list]


def architecture_key(arch: str, name: str) -> str:
    """The per-architecture key of llama.cpp's LLM_KV, e.g. ("llama", "context_length") ->
    "llama.context_length"."""
    return f"{arch}.{name}"


def read_metadata(path: str | Path, keys: Iterable[str]) -> dict[str, Value]:
    """The values of ``keys`` in the GGUF file at ``path`` (absent keys are left out): str,
    int, float or bool for scalars, a list of them for arrays.

    Raises:
        InvalidArgumentError: the file is not a GGUF file (version 2 or 3) or is truncated.
        OSError: it cannot be read.
    """
    wanted = set(keys)
    found: dict[str, Value] = {}
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise InvalidArgumentError(f"{path}: not a GGUF file")
        version, _num_tensors, num_kv = _unpack(f, "<IQQ")
        if version not in (2, 3):
            raise InvalidArgumentError(f"{path}: GGUF version {version} is not supported")
        for _ in range(num_kv):
            key = _read_bytes(f, _MAX_KEY_BYTES).decode("utf-8", errors="replace")
            (value_type,) = _unpack(f, "<I")
            if key in wanted:
                found[key] = _read_value(f, value_type)
                if len(found) == len(wanted):
                    break
            else:
                _skip_value(f, value_type)
    return found


def read_string_metadata(path: str | Path, keys: Iterable[str]) -> dict[str, str]:
    """The string values of ``keys`` in the GGUF file at ``path`` (absent keys, and keys whose
    value is not a string, are left out).

    Raises:
        As ``read_metadata``.
    """
    return {k: v for k, v in read_metadata(path, keys).items() if isinstance(v, str)}


def chat_template_of(path: str | Path) -> str | None:
    """The model's default Jinja chat template, or None when its GGUF has none."""
    return read_string_metadata(path, [KEY_CHAT_TEMPLATE]).get(KEY_CHAT_TEMPLATE)


def _unpack(f: BinaryIO, fmt: str) -> tuple:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise InvalidArgumentError("truncated GGUF metadata")
    return struct.unpack(fmt, data)


def _read_bytes(f: BinaryIO, limit: int | None = None) -> bytes:
    (length,) = _unpack(f, "<Q")
    if limit is not None and length > limit:
        raise InvalidArgumentError(f"corrupt GGUF metadata (a key of {length} bytes)")
    data = f.read(length)
    if len(data) != length:
        raise InvalidArgumentError("truncated GGUF metadata")
    return data


def _read_value(f: BinaryIO, value_type: int) -> Value:
    if value_type in _SCALARS:
        (value,) = _unpack(f, "<" + _SCALARS[value_type])
        return value
    if value_type == _TYPE_STRING:
        return _read_bytes(f).decode("utf-8", errors="replace")
    if value_type == _TYPE_ARRAY:
        item_type, count = _unpack(f, "<IQ")
        return [_read_value(f, item_type) for _ in range(count)]
    raise InvalidArgumentError(f"corrupt GGUF metadata (value type {value_type})")


def _skip_value(f: BinaryIO, value_type: int) -> None:
    if value_type in _SCALARS:
        f.seek(struct.calcsize("<" + _SCALARS[value_type]), 1)
    elif value_type == _TYPE_STRING:
        (length,) = _unpack(f, "<Q")
        f.seek(length, 1)
    elif value_type == _TYPE_ARRAY:
        item_type, count = _unpack(f, "<IQ")
        if item_type in _SCALARS:
            f.seek(count * struct.calcsize("<" + _SCALARS[item_type]), 1)
        else:
            for _ in range(count):
                _skip_value(f, item_type)
    else:
        raise InvalidArgumentError(f"corrupt GGUF metadata (value type {value_type})")
