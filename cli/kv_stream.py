"""KV streaming's flags on the command line: what they may be combined with, the engine's messages in
flag terms, and the summary line of a run that streamed.

The engine's messages about KV streaming name EngineConfig fields (``kv_stream_blocks=64``), the words
of the Python API; a command reports them under the flags instead (``--kv-stream-blocks 64``). Flags
that would change nothing are refused or noted, never dropped silently:

- ``--kv-stream-blocks`` / ``--kv-stream-depth`` with ``--kv-streaming off``: a usage error (the
  command line contradicts itself);
- the same with ``--kv-streaming auto`` when the engine leaves streaming off: a warning on stderr (auto
  decides at start-up, as llama.cpp warns about a flag that does not apply to the build or device);
- ``--kv-stream-depth`` with streaming on the CPU: a warning (the CPU stages each layer just before its
  attention, one layer at a time: there is no depth to set).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from pycacheflow.llm import LLM
    from pycacheflow.outputs import EngineStats

# EngineConfig field -> the flag that sets it, for messages about KV streaming.
FLAG_OF_FIELD = {
    "kv_streaming": "--kv-streaming",
    "kv_stream_blocks": "--kv-stream-blocks",
    "kv_stream_depth": "--kv-stream-depth",
    "swap_space_bytes": "--swap-space",
    "rpc_servers": "--rpc",
    "kv_mode": "--kv-mode",
}
# The click parameters of the flags that tune streaming (they do nothing while it is off).
TUNING_PARAMS = {"kv_stream_blocks": "--kv-stream-blocks", "kv_stream_depth": "--kv-stream-depth"}

_MESSAGE_STARTS = ("kv_stream", "out of KV blocks with KV streaming")
_FIELD_VALUE = re.compile(r"\b(" + "|".join(FLAG_OF_FIELD) + r")=([\w.]+)")
_FIELD = re.compile(r"\b(" + "|".join(FLAG_OF_FIELD) + r")\b")


def flag_message(message: str) -> str:
    """An engine message about KV streaming with its fields named as flags; any other unchanged.

    ``field=value`` becomes ``--flag value`` (``swap_space_bytes`` in GiB, as ``--swap-space`` takes
    it), and a bare field name its flag.
    """
    if not message.startswith(_MESSAGE_STARTS):
        return message

    def with_value(match: re.Match[str]) -> str:
        field, value = match.group(1), match.group(2)
        if field == "swap_space_bytes" and value.isdigit():
            value = f"{int(value) / 2**30:.4g}"
        return f"{FLAG_OF_FIELD[field]} {value}"

    message = _FIELD_VALUE.sub(with_value, message)
    return _FIELD.sub(lambda match: FLAG_OF_FIELD[match.group(1)], message)


def given_tuning_flags() -> list[str]:
    """The tuning flags (``TUNING_PARAMS``) the user gave on the command line or in the environment."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return []
    given = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    return [flag for name, flag in TUNING_PARAMS.items() if ctx.get_parameter_source(name) in given]


def check_flags(options: dict[str, object]) -> None:
    """Refuse tuning flags given with ``--kv-streaming off``, before anything is loaded.

    Raises:
        click.UsageError: naming the flags (exit 2).
    """
    flags = given_tuning_flags()
    if flags and str(options["kv_streaming"]) == "off":
        raise click.UsageError(
            f"{' and '.join(flags)} {'tune' if len(flags) > 1 else 'tunes'} KV streaming, which --kv-streaming off "
            "turns off; drop "
            f"{'them' if len(flags) > 1 else 'it'} or use --kv-streaming on"
        )


def flag_warnings(llm: LLM) -> list[str]:
    """Lines for stderr about tuning flags the loaded engine does not use (see the module docstring).

    Args:
        llm: the engine, just loaded with the command's flags.
    """
    flags = given_tuning_flags()
    if not flags:
        return []
    if llm.stats().kv_streaming == 0:
        return [
            f"cacheflow: warning: {flag} has no effect: KV streaming is off (--kv-streaming auto "
            "leaves it off on this device for now; --kv-streaming on turns it on)"
            for flag in flags
        ]
    on_cpu = all(device == "CPU" for device in llm.info.kv_devices)
    if on_cpu and "--kv-stream-depth" in flags:
        return [
            "cacheflow: warning: --kv-stream-depth has no effect on the CPU: it stages each layer's "
            "host-resident blocks just before that layer's attention, one layer at a time"
        ]
    return []


def summary_line(stats: EngineStats) -> str | None:
    """The run's streaming counters for the stats summary; None when streaming was off."""
    if not stats.kv_streaming:
        return None
    return (
        f"KV streaming: {stats.kv_stream_demotions} blocks demoted to the host, "
        f"{stats.kv_stream_promotions} promoted back, {stats.kv_staged_blocks} staged "
        f"({stats.kv_staged_bytes / 2**20:.1f} MiB over {stats.kv_staging_decodes} decodes)"
    )
