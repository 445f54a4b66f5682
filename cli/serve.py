"""``cacheflow serve``: an HTTP server that can replace llama.cpp's ``llama-server``.

Same flags (and LLAMA_ARG_* environment variables) for the common options, same endpoints and
response formats, plus CacheFlow's engine options. Every other llama-server flag is a usage error
that names it (cli/serve_compat.py). Exit codes: 0 after a clean shutdown
(SIGINT/SIGTERM); 1 runtime error (model cannot load, port taken); 2 usage error.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

import pycacheflow
from cli import kv_stream
from cli.common import (
    BLOCK_SIZE_OPTION,
    KV_CACHE_MEMORY_HELP,
    KV_STREAM_OPTION_NAMES,
    KV_STREAM_PARAMS,
    PAGED_ATTENTION_OPTION,
    LONG_PREFILL_OPTION,
    PREEMPTION_OPTION,
    SWAP_SPACE_OPTION,
    kv_stream_config,
    kv_stream_options,
    ByteSize,
    explicit_fields,
    load_llm,
    swap_space_bytes,
)
from cli.devices import (
    DEVICE_OPTION_NAMES,
    DEVICE_PARAMS,
    device_kwargs,
    device_options,
    list_devices_and_exit,
)
from cli.serve_compat import ServeCommand
from cli.serve_context import ContextPlan, plan_context, read_model_shape
from cli.serve_flags import (
    chat_template_kwargs,
    chat_template_option,
    request_defaults,
    serve_flag_options,
)
from pycacheflow.config import KV_MODES, POLICIES
from pycacheflow.errors import CacheFlowError
from pycacheflow.server.config import DEFAULT_MAX_BODY_BYTES
from pycacheflow.server.router_policy import DEFAULT_SLACK, POLICY_NAMES

if TYPE_CHECKING:
    import uvicorn

    from pycacheflow.llm import LLM



def _check_cache_type(value: str) -> str:
    if value != "f16":
        raise click.BadParameter(
            f"CacheFlow's KV cache is f16 (llama.cpp's other cache types are not implemented); "
            f"got {value!r}"
        )
    return value


_POLL_S = 0.1  # how often the shutdown watcher looks at uvicorn's should_exit
_FLUSH_S = 2.0  # after aborting at shutdown, time for handlers to send their last bytes


def _env(name: str) -> str:
    return f"LLAMA_ARG_{name}"


@click.command(
    cls=ServeCommand, context_settings={"help_option_names": ["-h", "--help", "--usage"]}
)
@click.version_option(pycacheflow.__version__, "--version", prog_name="cacheflow serve")
@click.option(
    "-m",
    "--model",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    envvar=_env("MODEL"),
    help="GGUF model file. Default: the default model (downloaded on first use).",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    envvar=_env("HOST"),
    help="Address to listen on.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    envvar=_env("PORT"),
    help="Port to listen on.",
)
@click.option(
    "-c",
    "--ctx-size",
    type=click.IntRange(min=0),
    default=0,
    envvar=_env("CTX_SIZE"),
    help="Context size in tokens, split over the -np slots as llama-server splits it (each "
    "slot's share padded to 256; shared with -kvu or -np automatic); 0 = the model's trained "
    "context for every slot, less if that does not fit in memory (llama-server's --fit).",
)
@click.option(
    "-np",
    "--parallel",
    type=click.IntRange(min=-1),
    default=-1,
    envvar=_env("N_PARALLEL"),
    help="Sequences decoded at once (max_num_seqs); more requests wait in the scheduler. -1 or 0 "
    "= automatic (16).",
)
@click.option(
    "-b",
    "--batch-size",
    type=click.IntRange(min=1),
    default=2048,
    show_default=True,
    envvar=_env("BATCH"),
    help="Logical batch size; the engine's per-step token budget is min(-b, -ub).",
)
@click.option(
    "-ub",
    "--ubatch-size",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    envvar=_env("UBATCH"),
    help="Physical batch size (see -b).",
)
@click.option(
    "-t",
    "--threads",
    type=click.IntRange(min=-1),
    default=-1,
    envvar=_env("THREADS"),
    help="CPU threads for decode; -1 = one per physical core (llama-server's count without -t).",
)
@click.option(
    "-ngl",
    "--gpu-layers",
    "--n-gpu-layers",
    "gpu_layers",
    default="auto",
    envvar=_env("N_GPU_LAYERS"),
    help="Layers offloaded to the GPU (CUDA builds): a number, 'auto' or 'all'.",
)
@click.option(
    "-fa",
    "--flash-attn",
    type=click.Choice(["on", "off", "auto"]),
    default="auto",
    is_flag=False,
    flag_value="on",
    envvar=_env("FLASH_ATTN"),
    help="Flash attention (stock KV modes).",
)
@click.option(
    "-n",
    "--n-predict",
    "--predict",
    "n_predict",
    type=click.IntRange(min=-1),
    default=-1,
    envvar=_env("N_PREDICT"),
    help="Default tokens to generate when a request sets none; -1 = until EOS or "
    "the slot's context is full.",
)
@click.option(
    "--api-key",
    envvar="LLAMA_API_KEY",
    help="API key(s), comma-separated; requests need 'Authorization: Bearer KEY' "
    "(or X-Api-Key). /health stays public.",
)
@click.option(
    "--metrics",
    "enable_metrics",
    is_flag=True,
    envvar=_env("ENDPOINT_METRICS"),
    help="Serve Prometheus metrics at /metrics.",
)
@click.option(
    "--slots/--no-slots",
    "enable_slots",
    default=True,
    show_default=True,
    envvar=_env("ENDPOINT_SLOTS"),
    help="Serve the /slots monitoring endpoint.",
)
@click.option(
    "-a",
    "--alias",
    envvar=_env("ALIAS"),
    help="Model name(s) for the API, comma-separated (default: the -m path).",
)
@click.option(
    "--chat-template",
    envvar=_env("CHAT_TEMPLATE"),
    help="Chat template: a llama.cpp built-in name (chatml, llama3, ...) or template "
    "text. Default: the model's own.",
)
@click.option(
    "-to",
    "--timeout",
    type=click.IntRange(min=1),
    default=3600,
    show_default=True,
    envvar=_env("TIMEOUT"),
    help="Seconds an idle keep-alive connection stays open.",
)
@click.option(
    "--max-body-size",
    type=ByteSize(),
    default=DEFAULT_MAX_BODY_BYTES,
    show_default="16MiB",
    help="The largest HTTP request body (e.g. 16MiB, 1GiB; bytes without a unit): a larger one "
    "is answered 413 without being read into memory; 0 = no limit.",
)
@click.option(
    "--cache-prompt/--no-cache-prompt",
    default=True,
    show_default=True,
    envvar=_env("CACHE_PROMPT"),
    help="Prefix caching: requests reuse the KV blocks of prompt prefixes any earlier request "
    "computed (timings.cache_n, usage.prompt_tokens_details.cached_tokens); "
    "--no-cache-prompt turns it off for the server, the request field cache_prompt per request.",
)
@click.option(
    "--sse-ping-interval",
    type=click.IntRange(min=-1),
    default=30,
    show_default=True,
    envvar=_env("SSE_PING_INTERVAL"),
    help="Seconds of silence after which a stream gets an SSE comment ping; -1 or 0 = never.",
)
@click.option(
    "--cors-origins",
    default="*",
    show_default=True,
    envvar=_env("CORS_ORIGINS"),
    help="Comma-separated origins browsers may call from; 'localhost' = localhost origins only.",
)
@click.option(
    "--cors-methods",
    default="GET, POST, DELETE, OPTIONS",
    show_default=True,
    envvar=_env("CORS_METHODS"),
    help="Comma-separated methods a CORS preflight allows.",
)
@click.option(
    "--cors-headers",
    default="*",
    show_default=True,
    envvar=_env("CORS_HEADERS"),
    help="Comma-separated request headers a CORS preflight allows.",
)
@click.option(
    "--cors-credentials/--no-cors-credentials",
    default=True,
    show_default=True,
    envvar=_env("CORS_CREDENTIALS"),
    help="Allow credentials; with --cors-origins '*' each request's Origin is echoed back.",
)
@click.option("-cb", "--cont-batching", is_flag=True, hidden=True)  # always on; accepted
# llama-server's opt-in to in-graph sampling, which CacheFlow does whenever a request's samplers
# allow it (greedy, a logit bias, top-k/top-p/min-p/temperature with a random seed); accepted
@click.option("-bs", "--backend-sampling", is_flag=True, hidden=True)
@click.option(
    "-ctk",
    "--cache-type-k",
    default="f16",
    envvar=_env("CACHE_TYPE_K"),
    callback=lambda ctx, param, value: _check_cache_type(value),
    help="KV cache type of K; CacheFlow's KV cache is f16 (the only value accepted).",
)
@click.option(
    "-ctv",
    "--cache-type-v",
    default="f16",
    envvar=_env("CACHE_TYPE_V"),
    callback=lambda ctx, param, value: _check_cache_type(value),
    help="KV cache type of V (f16, as -ctk).",
)
@click.option(
    "-fit",
    "--fit",
    type=click.Choice(["on", "off"]),
    default="on",
    envvar=_env("FIT"),
    help="With -c 0: reduce the trained context per slot when the KV cache and the model would "
    "leave less than --fit-target of the host's memory (on, llama-server's default), or keep "
    "it (off).",
)
@click.option(
    "-fitt",
    "--fit-target",
    type=click.IntRange(min=0),
    default=1024,
    envvar=_env("FIT_TARGET"),
    help="MiB of memory --fit leaves free (one value: CacheFlow fits host memory only).",
)
@click.option(
    "-fitc",
    "--fit-ctx",
    type=click.IntRange(min=1),
    default=4096,
    envvar=_env("FIT_CTX"),
    help="The smallest context per slot --fit sets, tokens.",
)
@click.option(
    "-kvu",
    "--kv-unified",
    is_flag=True,
    envvar=_env("KV_UNIFIED"),
    help="One KV buffer shared by all sequences: makes --kv-mode stock stock-unified (the "
    "paged KV cache is one shared pool anyway).",
)
@click.option(
    "--kv-mode",
    type=click.Choice(KV_MODES),
    default="auto",
    show_default=True,
    help="KV cache: paged (CacheFlow's block tables), stock / stock-unified (llama.cpp), or auto.",
)
@click.option(
    "--kv-cache-memory",
    type=ByteSize(),
    default=0,
    envvar=_env("KV_CACHE_MEMORY"),
    help=KV_CACHE_MEMORY_HELP,
)
@BLOCK_SIZE_OPTION
@PAGED_ATTENTION_OPTION
@click.option(
    "--policy",
    type=click.Choice(POLICIES),
    default="fcfs",
    show_default=True,
    help="Scheduling policy; 'priority' honours the request field priority (smaller first).",
)
@click.option(
    "--priority-aging-ms",
    type=click.IntRange(min=0),
    default=1000,
    show_default=True,
    help="--policy priority: a queued request's effective priority improves by 1 for every this many "
    "ms it waits, so low-priority work cannot starve; 0 = no aging.",
)
@PREEMPTION_OPTION
@SWAP_SPACE_OPTION
@LONG_PREFILL_OPTION
@kv_stream_options
@device_options
@click.option(
    "--shutdown-timeout",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="On SIGINT/SIGTERM: seconds in-flight requests may still run before they are aborted.",
)
@click.option(
    "-dp",
    "--data-parallel",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Engine replicas, each a serve process of its own (on GPU i of a GPU machine; the CPU "
    "threads split between them without -t), behind a router on --host/--port.",
)
@click.option(
    "--router-policy",
    type=click.Choice(POLICY_NAMES),
    default="prefix",
    show_default=True,
    help="With -dp > 1: which replica takes a request; prefix = the one that last served the "
    "longest shared start of the prompt, unless it is busier than the least-loaded one by more "
    "than --router-slack.",
)
@click.option(
    "--router-slack",
    type=click.IntRange(min=0),
    default=DEFAULT_SLACK,
    show_default=True,
    help="Requests in flight a prefix-matched replica may carry above the least-loaded one.",
)
@click.option(
    "-v", "--verbose", "--log-verbose", is_flag=True, help="Access log, llama.cpp and engine logs."
)
@serve_flag_options
def serve(**options: object) -> None:
    """Serve a model over HTTP, compatible with llama.cpp's llama-server.

    \b
    Endpoints: GET /health /props /models /v1/models /slots /metrics;
    POST /completion /completions /v1/completions /v1/chat/completions
    /tokenize /detokenize /apply-template. Streaming uses server-sent events.

    \b
    Examples:
      cacheflow serve -m model.gguf --port 8080 -np 32 --metrics
      cacheflow serve --alias smollm2 --api-key secret --policy priority
      cacheflow serve -dp 2 --metrics     # two replicas behind a prefix-aware router
    """
    list_devices_and_exit(options)
    if int(options["data_parallel"]) > 1 and options["rpc"]:
        raise click.UsageError(
            "--rpc with -dp/--data-parallel > 1: one rpc-server serves one engine at a time; "
            "run one serve --rpc per set of rpc-servers behind your own router"
        )
    if int(options["data_parallel"]) > 1:
        from cli.serve_router import RAW_ARGS_KEY, serve_data_parallel

        serve_data_parallel(options, click.get_current_context().meta[RAW_ARGS_KEY])
        return
    kv_stream.check_flags(options)
    config_kwargs = _engine_kwargs(options)
    defaults = request_defaults(options)
    chat_template = chat_template_option(options)
    template_kwargs = chat_template_kwargs(options)
    # Bound before the model loads: a taken port fails at once, with one line instead of
    # uvicorn's log and exit status 3 after the load.
    socks = _listen_all(_hosts(str(options["host"])), int(options["port"]))
    try:
        model = _model_path(options)
        plan = _context_plan(options, model)
        config_kwargs["n_ctx"] = plan.n_ctx
        if plan.note:
            click.echo(plan.note, err=True)
        llm = load_llm(model, config_kwargs, "-c/--ctx-size, --kv-cache-memory or -np",
                       SERVE_OPTION_NAMES, explicit_fields(SERVE_PARAMS),
                       n_ctx_slot=plan.n_ctx_slot,
                       ctx_size=int(options["ctx_size"]))  # fmt: skip
        for line in kv_stream.flag_warnings(llm):
            click.echo(line, err=True)
        try:
            app = _make_app(llm, options, defaults, chat_template, template_kwargs,
                            plan.n_ctx_slot)  # fmt: skip
            _run(app, socks, options)
        finally:
            llm.close()
    finally:
        for sock in socks:
            sock.close()


# EngineConfig field -> the serve option that sets it (the engine validates the values).
SERVE_OPTION_NAMES = {
    "n_ctx": "-c/--ctx-size",
    "max_num_seqs": "-np/--parallel",
    "kv_cache_bytes": "--kv-cache-memory",
    "block_size": "--block-size",
    "max_num_batched_tokens": "-b/--batch-size or -ub/--ubatch-size",
    "n_threads": "-t/--threads",
    "n_gpu_layers": "-ngl/--gpu-layers",
    "long_prefill_token_threshold": "--long-prefill-token-threshold",
    **KV_STREAM_OPTION_NAMES,
    **DEVICE_OPTION_NAMES,
}

# EngineConfig field -> the click parameter of that option.
SERVE_PARAMS = {
    "n_ctx": "ctx_size",
    "max_num_seqs": "parallel",
    "kv_cache_bytes": "kv_cache_memory",
    "block_size": "block_size",
    "max_num_batched_tokens": "batch_size",
    "n_threads": "threads",
    "n_gpu_layers": "gpu_layers",
    "long_prefill_token_threshold": "long_prefill_token_threshold",
    **KV_STREAM_PARAMS,
    **DEVICE_PARAMS,
}


def _hosts(value: str) -> list[str]:
    """--host: one address or several, comma-separated (as llama-server)."""
    hosts = _split(value)
    if not hosts:
        raise click.BadParameter("expected an address", param_hint="--host")
    return list(hosts)


def _cached_default_model() -> Path:
    """--offline without -m: the default model, which must be in the cache already."""
    from pycacheflow.model_hub import default_model_path

    path = default_model_path()
    if not path.is_file():
        raise click.ClickException(
            f"--offline: the default model is not in the cache ({path}); run `cacheflow model "
            "pull` once, or pass -m"
        )
    return path


def _model_path(options: dict[str, object]) -> Path:
    """-m, else the default model (fetched into the cache if needed; with --offline it must be
    there already)."""
    if options["model"] is not None:
        return Path(options["model"])
    if options["offline"]:
        return _cached_default_model()
    from pycacheflow import model_hub

    try:
        return model_hub.ensure_default_model(progress=True)
    except CacheFlowError as exc:
        raise click.ClickException(str(exc)) from None


def _context_plan(options: dict[str, object], model: Path) -> ContextPlan:
    """The KV tokens and the context per slot of -c, -np and -kvu, as llama-server sizes them
    (cli/serve_context.py); with --kv-cache-memory the budget sizes the cache instead (-c must
    be 0 then, as the engine checks) and a sequence may use the engine's context per sequence."""
    ctx_size, parallel = int(options["ctx_size"]), int(options["parallel"])
    if int(options["kv_cache_memory"]) > 0:
        return ContextPlan(ctx_size, 0)
    shape = read_model_shape(model) if ctx_size == 0 else None
    return plan_context(
        ctx_size,
        parallel,
        bool(options["kv_unified"]),
        shape,
        fit=options["fit"] == "on",
        fit_target_bytes=int(options["fit_target"]) << 20,
        fit_min_ctx=int(options["fit_ctx"]),
    )


def _engine_kwargs(options: dict[str, object]) -> dict[str, object]:
    parallel = int(options["parallel"])
    kwargs: dict[str, object] = {
        "n_ctx": options["ctx_size"],
        "kv_cache_bytes": options["kv_cache_memory"],
        "max_num_batched_tokens": min(int(options["batch_size"]), int(options["ubatch_size"])),
        "n_threads": max(0, int(options["threads"])),
        "n_gpu_layers": _gpu_layers(str(options["gpu_layers"])),
        "flash_attn": {"on": True, "off": False, "auto": None}[str(options["flash_attn"])],
        "kv_mode": _kv_mode(str(options["kv_mode"]), bool(options["kv_unified"])),
        "block_size": options["block_size"],
        "paged_attention": options["paged_attention"],
        "enable_prefix_caching": bool(options["cache_prompt"]),
        "preemption_mode": options["preemption"],
        "swap_space_bytes": swap_space_bytes(float(options["swap_space"])),
        "long_prefill_token_threshold": int(options["long_prefill_token_threshold"]),
        **kv_stream_config(options),
        "policy": options["policy"],
        "priority_aging_ms": int(options["priority_aging_ms"]),
        "log_level": "info" if options["verbose"] else "error",
    }
    if parallel > 0:
        kwargs["max_num_seqs"] = parallel
    try:
        kwargs.update(device_kwargs(options))
    except click.BadParameter as exc:
        raise click.UsageError(exc.format_message()) from None
    return kwargs


def _kv_mode(kv_mode: str, kv_unified: bool) -> str:
    """--kv-mode with llama-server's -kvu applied (only llama.cpp's split cache changes)."""
    return "stock-unified" if kv_unified and kv_mode == "stock" else kv_mode


def _gpu_layers(value: str) -> int:
    if value in ("auto", "all"):
        return -1
    try:
        layers = int(value)
    except ValueError:
        raise click.BadParameter(
            f"expected a number, 'auto' or 'all', got {value!r}", param_hint="-ngl"
        ) from None
    if layers < -1:
        raise click.BadParameter(f"must be >= -1, got {layers}", param_hint="-ngl")
    return layers


def _make_app(
    llm: LLM,
    options: dict[str, object],
    defaults: object,
    chat_template: str | None,
    template_kwargs: dict[str, object],
    n_ctx_slot: int,
) -> object:
    try:
        from pycacheflow.server import ServerConfig, create_app
    except ImportError as exc:
        raise click.ClickException(
            f"{exc}; cacheflow serve needs starlette and uvicorn (pip install starlette uvicorn)"
        ) from None
    jinja = bool(options["jinja"])
    try:  # fail at start-up rather than on every chat request
        llm.apply_chat_template([{"role": "user", "content": "x"}], True, chat_template,
                                jinja=jinja, chat_template_kwargs=template_kwargs)  # fmt: skip
    except CacheFlowError as exc:
        if chat_template is not None:
            raise click.BadParameter(str(exc), param_hint="--chat-template") from None
        # the model has no usable template: chat requests will say so
    try:
        config = ServerConfig(
            **_server_fields(llm, options, chat_template),
            defaults=defaults,
            jinja=jinja,
            chat_template_kwargs=template_kwargs,
            prefill_assistant=bool(options["prefill_assistant"]),
            tags=_split(options["tags"]),
            enable_ui=bool(options["enable_ui"]),
            verbose=bool(options["verbose"]),
            n_ctx_slot=n_ctx_slot,
        )
    except ValueError as exc:  # e.g. an empty --cors-methods
        raise click.UsageError(str(exc)) from None
    return create_app(llm, config)


def _server_fields(llm: LLM, options: dict[str, object], chat_template: str | None) -> dict:
    aliases = _split(options["alias"])
    model_path = str(llm.config.model_path)
    return dict(
        # llama-server keeps its aliases in a std::set: the model id is the smallest
        model_name=min(aliases) if aliases else str(options["model"] or model_path),
        model_path=model_path,
        aliases=aliases,
        api_keys=_split(options["api_key"]),
        n_predict=int(options["n_predict"]),
        chat_template=chat_template,
        enable_metrics=bool(options["enable_metrics"]),
        enable_slots=bool(options["enable_slots"]),
        cache_prompt=bool(options["cache_prompt"]),
        shutdown_timeout_s=float(options["shutdown_timeout"]),
        sse_ping_s=(
            float(options["sse_ping_interval"]) if options["sse_ping_interval"] > 0 else None
        ),
        cors_origins=_split(options["cors_origins"]),
        cors_methods=_split(options["cors_methods"]),
        cors_headers=_split(options["cors_headers"]),
        cors_credentials=bool(options["cors_credentials"]),
        max_body_bytes=int(options["max_body_size"]),
    )


def _split(value: object) -> tuple[str, ...]:
    return tuple(part.strip() for part in str(value or "").split(",") if part.strip())


def _listen_all(hosts: list[str], port: int) -> list[socket.socket]:
    """One listening socket per address (all closed again if one cannot be bound)."""
    socks: list[socket.socket] = []
    try:
        for host in hosts:
            socks.append(_listen(host, port))
    except click.ClickException:
        for sock in socks:
            sock.close()
        raise
    return socks


def _listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (uvicorn listens on it).

    Raises:
        click.ClickException: the port is in use, or the address cannot be bound (exit 1).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        if family == socket.AF_INET6:  # "::" is IPv6 only, so "0.0.0.0,::" can both bind
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise click.ClickException(f"port {port} on {host} is already in use") from None
        raise click.ClickException(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None
    return sock


def _run(app: object, socks: list[socket.socket], options: dict[str, object]) -> None:
    import uvicorn

    from pycacheflow.server.http_protocol import protocol_class

    verbose = bool(options["verbose"])
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    grace_s = float(options["shutdown_timeout"])
    config = uvicorn.Config(
        app,
        host=_hosts(str(options["host"]))[0],
        port=int(options["port"]),
        timeout_keep_alive=int(options["timeout"]),
        # Backstop only: _abort_after_grace ends in-flight requests cleanly at grace_s.
        timeout_graceful_shutdown=grace_s + _FLUSH_S,
        log_level="info" if verbose else "warning",
        access_log=verbose,
        lifespan="off",
        http=protocol_class(),  # httptools, with llama-server's header-name casing
    )
    server = uvicorn.Server(config)
    # uvicorn handles SIGINT/SIGTERM (stop accepting, wait for requests in flight) and
    # afterwards re-raises the signal to the handlers that were installed before it started.
    # With these no-op handlers in place that re-raise is harmless: a signalled shutdown exits 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    urls = []
    for sock in socks:
        host, port = sock.getsockname()[:2]  # the real port when --port 0
        urls.append(f"http://{_url_host(host)}:{port}")
    click.echo(f"cacheflow serve: {' '.join(urls)} (Ctrl-C to stop)", err=True)
    asyncio.run(_serve(server, socks, app, grace_s))
    if not server.started:
        sys.exit(1)  # uvicorn logged why


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def _serve(
    server: uvicorn.Server, socks: list[socket.socket], app: object, grace_s: float
) -> None:
    watcher = asyncio.create_task(_abort_after_grace(server, app, grace_s))
    try:
        await server.serve(sockets=socks)
    finally:
        watcher.cancel()


async def _abort_after_grace(server: uvicorn.Server, app: object, grace_s: float) -> None:
    """Once shutdown began, give requests ``grace_s`` seconds, then abort the rest so that
    they end with a proper answer (503 / an SSE error event) instead of a cut connection."""
    from pycacheflow.server.app import abort_in_flight

    while not server.should_exit:
        await asyncio.sleep(_POLL_S)
    await asyncio.sleep(grace_s)
    num_aborted = abort_in_flight(app)
    if num_aborted:
        logging.getLogger("cacheflow.server").warning(
            "shutdown: aborted %d request(s) still running after %.1f s", num_aborted, grace_s
        )
