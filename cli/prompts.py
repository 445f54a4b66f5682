"""Reading prompts for ``cacheflow generate --prompts-file``."""

from __future__ import annotations

import json
from pathlib import Path


class PromptsFileError(ValueError):
    """A prompts file could not be parsed; the message names the line."""


def read_prompts_file(path: str | Path, text: str | bytes | None = None) -> list[str]:
    """Read prompts from a file: JSONL objects with a "prompt" key, or one prompt per line.

    The file is JSONL if its name ends in ``.jsonl`` or its first non-blank character is ``{``.
    Blank lines are skipped in both formats.

    Args:
        path: the file (used for the format decision and messages).
        text: the file's content if already read (e.g. stdin's bytes); None = read ``path``.
            Bytes must be UTF-8.

    Returns:
        The prompts in file order.

    Raises:
        PromptsFileError: the file is not UTF-8, or a JSONL line is not an object with a string
            "prompt".
        OSError: the file cannot be read.
    """
    if text is None:
        text = Path(path).read_bytes()
    if isinstance(text, bytes):
        text = _decode(text, path)
    is_jsonl = str(path).endswith(".jsonl") or text.lstrip().startswith("{")
    if not is_jsonl:
        return [line for line in text.splitlines() if line.strip()]
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            prompts.append(_jsonl_prompt(line, f"{path}:{number}"))
    return prompts


def _jsonl_prompt(line: str, where: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise PromptsFileError(f"{where}: invalid JSON ({exc.msg})") from None
    if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
        raise PromptsFileError(f'{where}: expected an object with a string "prompt" key')
    return record["prompt"]


def _decode(data: bytes, path: str | Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise PromptsFileError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
