"""cli/kv_stream.py without the native library: the engine's KV streaming messages in flag terms, the usage
error for tuning flags with --kv-streaming off (before anything loads), and the summary line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from cli.kv_stream import flag_message, summary_line
from cli.main import cacheflow, format_summary


@pytest.mark.parametrize(
    ("message", "flags"),
    [
        ("kv_stream_blocks=65536 needs as many host slots of the swap space, one KV block of 368640 bytes "
         "each (22.5 GiB), but swap_space_bytes=4294967296 holds 11650; raise swap_space_bytes or lower "
         "kv_stream_blocks",
         "--kv-stream-blocks 65536 needs as many host slots of the swap space, one KV block of 368640 bytes "
         "each (22.5 GiB), but --swap-space 4 holds 11650; raise --swap-space or lower --kv-stream-blocks"),
        ("kv_streaming=on does not work with rpc_servers: the paged attention op of an rpc-server cannot "
         "read the engine's host memory",
         "--kv-streaming on does not work with --rpc: the paged attention op of an rpc-server cannot read "
         "the engine's host memory"),
        ("kv_streaming=on needs the paged KV cache (kv_mode paged or auto)",
         "--kv-streaming on needs the paged KV cache (--kv-mode paged or auto)"),
        ("out of KV blocks with KV streaming on: request 3 holds 80 blocks; raise kv_stream_blocks (with "
         "swap_space_bytes) or the KV cache size",
         "out of KV blocks with KV streaming on: request 3 holds 80 blocks; raise --kv-stream-blocks (with "
         "--swap-space) or the KV cache size"),
        # a message about something else keeps the engine's words
        ("max_num_seqs must be >= 1, got 0", "max_num_seqs must be >= 1, got 0"),
    ],
)  # fmt: skip
def test_flag_message(message, flags):
    assert flag_message(message) == flags


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kv-stream-blocks", "8"], "--kv-stream-blocks tunes KV streaming, which --kv-streaming off "
         "turns off; drop it or use --kv-streaming on"),
        (["--kv-stream-blocks", "8", "--kv-stream-depth", "3"], "--kv-stream-blocks and --kv-stream-depth "
         "tune KV streaming, which --kv-streaming off turns off; drop them or use --kv-streaming on"),
    ],
)  # fmt: skip
def test_tuning_flags_with_streaming_off_are_a_usage_error(tmp_path, args, message):
    # refused before the model is loaded: this one is not a GGUF
    model = tmp_path / "not-a-model.gguf"
    model.write_bytes(b"")
    result = CliRunner().invoke(cacheflow, ["generate", "-m", str(model), "--kv-streaming", "off", *args,
                                            "hi"])  # fmt: skip
    assert result.exit_code == 2 and message in result.output


def test_help_states_the_host_slot_constraint():
    result = CliRunner().invoke(cacheflow, ["generate", "--help"])
    text = " ".join(result.output.split())
    assert "Needs as many host slots of --swap-space, one KV block each" in text
    assert "65536]" not in text  # no range that suggests any value up to it works


def _stats(**fields: int) -> SimpleNamespace:
    base = dict(kv_streaming=0, kv_stream_demotions=0, kv_stream_promotions=0, kv_staged_blocks=0,
                kv_staged_bytes=0, kv_staging_decodes=0, num_preemptions=0, num_lookahead_decodes=0)  # fmt: skip
    return SimpleNamespace(**{**base, **fields})


def test_summary_shows_streaming_counters_when_on():
    assert summary_line(_stats()) is None
    on = _stats(kv_streaming=1, kv_stream_demotions=30, kv_stream_promotions=2, kv_staged_blocks=502,
                kv_staged_bytes=502 * 368640, kv_staging_decodes=18)  # fmt: skip
    line = ("KV streaming: 30 blocks demoted to the host, 2 promoted back, 502 staged (176.5 MiB over 18 "
            "decodes)")  # fmt: skip
    assert summary_line(on) == line
    assert format_summary([], 1.0, on).endswith("\n" + line)
    assert "KV streaming" not in format_summary([], 1.0, _stats())
