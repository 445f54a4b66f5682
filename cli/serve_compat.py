"""llama-server's flags in ``cacheflow serve``: those it does not implement fail by name; a few
that change nothing CacheFlow does (``IGNORED``) are accepted with a note.

click reads an unknown multi-letter short flag as a cluster of one-letter flags: llama-server's
``-ctk q8_0`` became ``-c tk``, ``-mg 0`` became ``-m g`` and ``-hf`` printed the help. So every
llama-server flag (cli/llama_server_flags.py, generated from llama.cpp's README) that the command
does not define becomes a hidden option with llama-server's number of values, whose callback is
a usage error naming it (exit 2):

    Error: unsupported llama-server flag -tb (--threads-batch): CacheFlow runs prompt
    processing and generation on the same -t threads
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import click

from cli.llama_server_flags import LLAMA_SERVER_FLAGS

_DOWNLOAD = "CacheFlow does not download models; fetch the GGUF file and pass it with -m"
_TEXT_ONLY = "CacheFlow serves text generation only"
_LOAD_MODE = (
    "a flag of earlier llama-server releases (the pinned one has -lm/--load-mode); CacheFlow "
    "loads the model in llama.cpp's default mode (memory-mapped, not locked in RAM)"
)

# Why a flag is missing, where more can be said than "not implemented"; keyed by any of its names.
_WHY: dict[str, str] = {
    "--threads-batch": "CacheFlow runs prompt processing and generation on the same -t threads",
    "--no-cont-batching": "continuous batching is always on in CacheFlow",
    "--no-kv-unified": "the paged KV cache is one pool shared by all sequences; llama.cpp's "
    "per-sequence slices are --kv-mode stock",
    **dict.fromkeys(
        ("--hf-repo", "--hf-file", "--hf-token", "--model-url", "--docker-repo"), _DOWNLOAD
    ),
    "--context-shift": "CacheFlow does not shift the context: a request stops (truncated) "
    "when its slot's context is full, as llama-server's default --no-context-shift",
    **dict.fromkeys(("--embedding", "--rerank", "--pooling", "--mmproj"), _TEXT_ONLY),
    "--log-file": "cacheflow serve logs to stderr; redirect it (cacheflow serve ... 2>> FILE)",
}
# llama-server flags whose meaning CacheFlow already has, or that change nothing it does: accepted
# with a note on stderr, so that llama-server launch scripts keep working; keyed by any of their names.
IGNORED: dict[str, str] = {
    "--log-disable": "cacheflow serve logs only errors unless -v is given",
    "--threads-http": "one asyncio event loop serves every connection, whatever the count",
    "--cache-reuse": "the prefix cache already reuses every cached block of a prompt's prefix "
    "across requests; llama-server's chunk shifting within a slot is not needed",
    "--keep": "tokens kept when the context shifts, and CacheFlow never shifts the context "
    "(as llama-server's default --no-context-shift)",
    **dict.fromkeys(("--mlock", "--no-mmap", "--mmap"), _LOAD_MODE),
    **dict.fromkeys(("--perf", "--no-perf"), "libllama's internal timings; CacheFlow's own timings (/metrics, "
                    "response timings) are always on"),
    **dict.fromkeys(("--prio", "--poll", "--prio-batch", "--poll-batch"), "thread priority and polling of "
                    "llama.cpp's CPU threads: CacheFlow runs them at llama.cpp's defaults"),
    "--numa": "llama.cpp's NUMA thread placement is not applied; CacheFlow's threads run where the OS puts them",
    "--verbosity": "cacheflow serve's log level is -v/--verbose (errors only without it)",
    "--slot-prompt-similarity": "the prefix cache shares cached blocks with any slot, so no slot is chosen "
    "by prompt similarity",
}
# Flags of earlier llama-server releases, still common in scripts (the pinned one replaced them
# with -lm/--load-mode); accepted with the note of IGNORED.
_EARLIER_FLAGS: tuple[tuple[tuple[str, ...], int], ...] = (
    (("--mlock",), 0), (("--no-mmap",), 0), (("--mmap",), 0)
)
_NOT_IMPLEMENTED = (
    "cacheflow serve does not implement it (`cacheflow serve --help` lists its flags)"
)


def unsupported_message(names: Sequence[str]) -> str:
    """The usage error for llama-server flag ``names`` (its spellings serve lacks), e.g.
    "unsupported llama-server flag -ctk (--cache-type-k): ..."."""
    spelled = names[0] + (f" ({', '.join(names[1:])})" if len(names) > 1 else "")
    why = next((_WHY[name] for name in names if name in _WHY), _NOT_IMPLEMENTED)
    return f"unsupported llama-server flag {spelled}: {why}"


class ServeCommand(click.Command):
    """A command that knows llama-server's flags: every one it does not define is a hidden
    option that fails with ``unsupported_message`` (also when its value is missing)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._unsupported: dict[str, str] = {}  # flag -> its usage error
        defined = set(self._defined_flags())
        for index, (names, num_values) in enumerate(LLAMA_SERVER_FLAGS + _EARLIER_FLAGS):
            missing = [name for name in names if name not in defined]
            why_ignored = next((IGNORED[name] for name in names if name in IGNORED), None)
            if missing and why_ignored is not None:
                spelled = missing[0] + (f" ({', '.join(missing[1:])})" if len(missing) > 1 else "")
                note = f"note: llama-server flag {spelled} accepted and ignored: {why_ignored}"
                self.params.append(_ignored_option(f"llama_server_flag_{index}", missing,
                                                   num_values, note))  # fmt: skip
            elif missing:
                message = unsupported_message(missing)
                self._unsupported.update(dict.fromkeys(missing, message))
                self.params.append(_failing_option(f"llama_server_flag_{index}", missing,
                                                   num_values, message))  # fmt: skip

    def _defined_flags(self) -> Iterable[str]:
        yield from self.context_settings.get("help_option_names", ("--help",))
        for param in self.params:
            yield from getattr(param, "opts", ())
            yield from getattr(param, "secondary_opts", ())

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        args = [_dashed(arg) for arg in args]
        ctx.meta["cacheflow.serve.raw_args"] = list(args)  # for the replicas of --data-parallel
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            exc.message = (
                f"no such option: {exc.option_name} (neither a cacheflow serve nor a "
                "llama-server flag)"
            )
            # "did you mean" among the flags that work, not the hidden failing ones
            hints = [p for p in exc.possibilities or () if p not in self._unsupported]
            exc.possibilities = hints or None
            raise
        except click.BadOptionUsage as exc:  # e.g. "-hf" with no value after it
            if exc.option_name in self._unsupported:
                raise click.UsageError(self._unsupported[exc.option_name], ctx) from None
            raise


def _dashed(arg: str) -> str:
    """A long flag with underscores spelled with dashes, as llama-server reads it
    (``--backend_sampling`` is ``--backend-sampling``); values and other arguments unchanged."""
    if not arg.startswith("--"):
        return arg
    name, sep, value = arg.partition("=")
    return name.replace("_", "-") + sep + value


def _ignored_option(name: str, flags: list[str], num_values: int, note: str) -> click.Option:
    def warn(ctx: click.Context, param: click.Parameter, value: object) -> object:
        if value is not None and value is not False:  # given
            click.echo(note, err=True)
        return value

    if num_values == 0:
        return click.Option([name, *flags], is_flag=True, hidden=True, expose_value=False,
                            callback=warn)  # fmt: skip
    return click.Option([name, *flags], nargs=num_values, hidden=True, expose_value=False,
                        callback=warn)  # fmt: skip


def _failing_option(name: str, flags: list[str], num_values: int, message: str) -> click.Option:
    def fail(ctx: click.Context, param: click.Parameter, value: object) -> object:
        if value is None or value is False:  # not given
            return value
        raise click.UsageError(message, ctx)

    if num_values == 0:
        return click.Option([name, *flags], is_flag=True, hidden=True, expose_value=False,
                            callback=fail)  # fmt: skip
    return click.Option([name, *flags], nargs=num_values, hidden=True, expose_value=False,
                        callback=fail)  # fmt: skip
