"""`cacheflow serve` flag handling (cli/serve.py): llama-server flags map onto EngineConfig and
ServerConfig; nothing is loaded (the model loader is replaced)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import cli.serve
from cli.llama_server_flags import LLAMA_SERVER_FLAGS
from cli.main import cacheflow
from cli.serve_compat import IGNORED

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "vendor" / "llama.cpp" / "tools" / "server" / "README.md"


class Loaded(Exception):
    """Raised by the stub loader to stop `serve` before it loads anything."""


N_CTX_TRAIN = 8192  # the trained context of the metadata-only model below (the default model's)


def write_metadata_gguf(path: Path, n_ctx_train: int = N_CTX_TRAIN) -> Path:
    """A GGUF file with the default model's shape in its metadata and no tensors: what serve
    reads before loading (llama.cpp could not load it)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(n_ctx_train)
    writer.add_block_count(30)
    writer.add_embedding_length(576)
    writer.add_head_count(9)
    writer.add_head_count_kv(3)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(autouse=True)
def default_model(monkeypatch, tmp_path) -> Path:
    """The default model, as serve finds it without -m: a metadata-only file (nothing is
    downloaded or loaded)."""
    import pycacheflow.model_hub

    path = write_metadata_gguf(tmp_path / "default.gguf")
    monkeypatch.setattr(pycacheflow.model_hub, "ensure_default_model", lambda progress=True: path)
    return path


@pytest.fixture
def engine_kwargs(monkeypatch) -> list[dict[str, object]]:
    seen: list[dict[str, object]] = []

    def stub(model, config_kwargs, memory_options="", *option_args, **option_kwargs):
        seen.append(config_kwargs)
        raise Loaded

    monkeypatch.setattr(cli.serve, "load_llm", stub)
    return seen


def invoke(*args: str):
    """Run `cacheflow serve ARGS` in-process; port 0 (any free port) unless ARGS choose one, so that
    a server already on 8080 (llama-server's default) does not fail the test."""
    port = [] if "--port" in args else ["--port", "0"]
    return CliRunner().invoke(cacheflow, ["serve", *port, *args])


def test_llama_server_flags_map_to_engine_config(engine_kwargs):
    result = invoke("-np", "4", "-n", "5", "-c", "2048", "-b", "256", "-ub", "1024", "-t", "-1",
                    "-fa", "-ngl", "all", "--kv-mode", "paged", "--block-size", "32",
                    "--policy", "priority", "--priority-aging-ms", "250", "-cb", "--preemption", "swap",
                    "--swap-space", "0.5")  # fmt: skip
    assert isinstance(result.exception, Loaded), result.output
    assert engine_kwargs == [{
        "n_ctx": 2048, "kv_cache_bytes": 0, "max_num_seqs": 4, "max_num_batched_tokens": 256, "n_threads": 0,
        "n_gpu_layers": -1, "flash_attn": True, "kv_mode": "paged", "block_size": 32,
        "paged_attention": "invariant", "enable_prefix_caching": True, "policy": "priority",
        "priority_aging_ms": 250, "log_level": "error", "preemption_mode": "swap", "swap_space_bytes": 2**29,
        "kv_streaming": "auto", "kv_stream_blocks": 64, "kv_stream_depth": 2,
        "long_prefill_token_threshold": -1,
    }]  # fmt: skip


def test_device_flags_map_to_engine_config(engine_kwargs):
    """llama-server's --rpc, -dev, -sm, -mg, -ts (cli/devices.py); flags at their defaults are left out."""
    result = invoke("--rpc", "127.0.0.1:50052,10.0.0.2:50052", "-dev", "RPC0,RPC1", "-ts", "3/1",
                    "-sm", "none", "-mg", "1")  # fmt: skip
    assert isinstance(result.exception, Loaded), result.output
    kwargs = engine_kwargs[0]
    assert kwargs["rpc_servers"] == ("127.0.0.1:50052", "10.0.0.2:50052")
    assert kwargs["devices"] == ("RPC0", "RPC1") and kwargs["tensor_split"] == (3.0, 1.0)
    assert kwargs["split_mode"] == "none" and kwargs["main_gpu"] == 1
    engine_kwargs.clear()
    assert isinstance(invoke().exception, Loaded)
    assert not set(engine_kwargs[0]) & {"rpc_servers", "devices", "tensor_split", "split_mode", "main_gpu"}


@pytest.mark.parametrize(
    "args,message",
    [
        (["-sm", "row"], "Invalid value for -sm/--split-mode: row split is not supported"),
        (["-sm", "tensor"], "Invalid value for -sm/--split-mode: tensor split is not supported"),
        (["-ts", "3,x"], "Invalid value for -ts/--tensor-split: expected comma-separated numbers"),
        (["--rpc", "a:1,,b:2"], "Invalid value for --rpc: an empty entry"),
        (["-dev", "RPC0,"], "Invalid value for -dev/--device: an empty entry"),
        (["--rpc", "127.0.0.1:50052", "-dp", "2"], "one rpc-server serves one engine at a time"),
    ],
)
def test_bad_device_flags_are_usage_errors(engine_kwargs, args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert engine_kwargs == []


def test_kv_cache_memory(engine_kwargs):
    result = invoke("--kv-cache-memory", "1.5GiB")
    assert isinstance(result.exception, Loaded), result.output
    assert engine_kwargs[0]["kv_cache_bytes"] == 3 * 2**29 and engine_kwargs[0]["n_ctx"] == 0


def test_defaults_and_env_vars(engine_kwargs, monkeypatch):
    monkeypatch.setenv("LLAMA_ARG_CTX_SIZE", "4096")
    monkeypatch.setenv("LLAMA_ARG_N_PARALLEL", "8")
    result = invoke("-fa", "off")
    assert isinstance(result.exception, Loaded), result.output
    kwargs = engine_kwargs[0]
    assert (kwargs["n_ctx"], kwargs["max_num_seqs"]) == (4096, 8)
    assert kwargs["max_num_batched_tokens"] == 512  # min(-b 2048, -ub 512)
    assert kwargs["flash_attn"] is False and kwargs["n_gpu_layers"] == -1  # -ngl auto


@pytest.mark.parametrize(
    "args,message",
    [
        (["-lm", "mlock"], "unsupported llama-server flag -lm (--load-mode): "),
        (["--hf-repo", "x/y"], "unsupported llama-server flag -hf (-hfr, --hf-repo): "),
        (["--bogus"], "no such option: --bogus"),
        (["-ctk", "q8_0"], "CacheFlow's KV cache is f16"),
        (["-ngl", "many"], "-ngl"),
        (["-fa", "maybe"], "maybe"),
        (["-np", "-3"], "-np"),
        (["--preemption", "sometimes"], "'sometimes' is not one of"),
        (["--kv-cache-memory", "much"], "is not a size"),
    ],
)
def test_bad_flags_are_usage_errors(engine_kwargs, args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert engine_kwargs == []


# Multi-letter short flags of llama-server that click used to split into one-letter clusters
# (-ctk q8_0 was "-c tk", -mg 0 was "-m g", -hf printed the help).
@pytest.mark.parametrize(
    "args,message",
    [
        (["-tb", "4"], "unsupported llama-server flag -tb (--threads-batch): CacheFlow runs"),
        (["-ot", "x=CPU"], "unsupported llama-server flag -ot (--override-tensor): "),
        (["-nocb"], "unsupported llama-server flag -nocb (--no-cont-batching): continuous"),
        (["-no-kvu"], "unsupported llama-server flag -no-kvu (--no-kv-unified): "),
        (["-hf", "user/model"], "unsupported llama-server flag -hf (-hfr, --hf-repo): "),
        (["-hf"], "unsupported llama-server flag -hf (-hfr, --hf-repo): "),  # value missing
        (["-np", "2", "--adaptive-target", "0.5"],
         "unsupported llama-server flag --adaptive-target: "),
        (["--context-shift"], "unsupported llama-server flag --context-shift: CacheFlow does"),
        (["-ctv", "q4_0"], "CacheFlow's KV cache is f16 (llama.cpp's other cache types"),
    ],
)
def test_multi_letter_llama_server_flags_fail_by_name(engine_kwargs, args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert engine_kwargs == []


def test_every_llama_server_flag_is_accepted_or_named(engine_kwargs):
    """Each spelling of each flag in llama-server's README either is a serve option or fails
    with a message naming it (never click's one-letter clusters or "no such option")."""
    defined = {opt for p in cli.serve.serve.params if not p.name.startswith("llama_server_flag_")
               for opt in (*p.opts, *p.secondary_opts)} | {"-h", "--help", "--usage"}  # fmt: skip
    for names, num_values in LLAMA_SERVER_FLAGS:
        for name in names:
            if name in defined or any(n in IGNORED for n in names):
                continue
            result = invoke(name, *["1"] * num_values)
            assert result.exit_code == 2, (name, result.output)
            assert "unsupported llama-server flag " in result.output and name in result.output
    assert engine_kwargs == []


def test_flags_that_change_nothing_are_accepted_with_a_note(engine_kwargs):
    """llama-server launch scripts pass --log-disable, --threads-http, --cache-reuse, --keep, and
    --mlock, --no-mmap, --mmap of earlier releases: the server starts, with one note per flag
    saying why it is ignored."""
    result = invoke("--log-disable", "--threads-http", "4", "--cache-reuse", "256", "--keep", "10",
                    "--mlock", "--no-mmap", "--mmap")  # fmt: skip
    assert isinstance(result.exception, Loaded), result.output
    for flag in ("--log-disable", "--threads-http", "--cache-reuse", "--keep", "--mlock",
                 "--no-mmap", "--mmap"):  # fmt: skip
        assert f"note: llama-server flag {flag} accepted and ignored: " in result.output, flag
    assert "loads the model in llama.cpp's default mode (memory-mapped" in result.output
    assert len(engine_kwargs) == 1


@pytest.mark.parametrize(
    "args,kv_mode",
    [(["-kvu", "--kv-mode", "stock"], "stock-unified"), (["-kvu"], "auto"),
     (["-kvu", "--kv-mode", "paged"], "paged"), (["--kv-mode", "stock"], "stock")],
)  # fmt: skip
def test_kv_unified_makes_stock_unified(engine_kwargs, args, kv_mode):
    result = invoke(*args)
    assert isinstance(result.exception, Loaded), result.output
    assert engine_kwargs[0]["kv_mode"] == kv_mode


def test_llama_server_spellings_with_the_same_meaning(engine_kwargs, monkeypatch):
    monkeypatch.setenv("LLAMA_ARG_CACHE_TYPE_V", "f16")
    result = invoke("-ctk", "f16", "-cb", "--log-verbose")
    assert isinstance(result.exception, Loaded), result.output
    assert engine_kwargs[0]["log_level"] == "info"
    assert invoke("--version").output.startswith("cacheflow serve, version ")
    assert "Usage: cacheflow serve" in invoke("--usage").output
    monkeypatch.setenv("LLAMA_ARG_CACHE_TYPE_K", "q8_0")
    result = invoke()
    assert result.exit_code == 2 and "CacheFlow's KV cache is f16" in result.output


@pytest.mark.skipif(not README.is_file(), reason="no vendored llama.cpp tree (vendor/llama.cpp)")
def test_flag_table_matches_the_vendored_readme():
    script = REPO_ROOT / "scripts" / "gen_llama_server_flags.py"
    cmd = [sys.executable, str(script), "--check"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_port_in_use_is_one_line_before_loading(engine_kwargs):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke("--port", str(port))
        assert result.exit_code == 1, result.output
        assert result.output.strip() == f"Error: port {port} on 127.0.0.1 is already in use"
        assert engine_kwargs == []  # failed before loading the model
        cmd = [sys.executable, "-m", "cli", "serve", "--port", str(port)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, check=False)
    assert proc.returncode == 1
    assert proc.stderr == f"Error: port {port} on 127.0.0.1 is already in use\n"


class _StubLLM:
    """Enough of an LLM for serve's start-up checks."""

    config = type("Config", (), {"model_path": "stub.gguf"})()

    def apply_chat_template(self, messages, add_generation_prompt=True, template=None, **kw):
        return "prompt"

    def close(self) -> None:
        pass


@pytest.fixture
def server_configs(monkeypatch) -> list[object]:
    """serve runs up to building the app; the ServerConfigs it built are collected, each with
    the EngineConfig fields it was loaded with as ``engine_kwargs``."""
    import pycacheflow.server

    seen: list[object] = []
    loaded: list[dict[str, object]] = []

    def fake_create_app(llm, config):
        object.__setattr__(config, "engine_kwargs", loaded[-1])
        seen.append(config)
        raise Loaded

    def fake_load_llm(model, config_kwargs, *args, **kwargs):
        loaded.append(config_kwargs)
        return _StubLLM()

    monkeypatch.setattr(cli.serve, "load_llm", fake_load_llm)
    monkeypatch.setattr(pycacheflow.server, "create_app", fake_create_app)
    return seen


def test_server_wide_sampling_defaults_and_chat_flags(server_configs, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    result = invoke("--temp", "0", "--top-k", "5", "--top-p", "0.5", "--min-p", "0.1", "-s", "42",
                    "--repeat-penalty", "1.1", "--repeat-last-n", "32", "--presence-penalty",
                    "0.5", "--frequency-penalty", "0.25", "--ignore-eos", "--no-jinja",
                    "--chat-template-file", str(template), "--chat-template-kwargs", '{"x": 1}',
                    "--no-prefill-assistant", "--tags", "chat,small", "--offline",
                    "--no-context-shift", "--no-warmup", "-c", "512", "-np", "2")  # fmt: skip
    assert isinstance(result.exception, Loaded), result.output
    (config,) = server_configs
    d = config.defaults
    assert (d.temperature, d.top_k, d.top_p, d.min_p, d.seed) == (0.0, 5, 0.5, 0.1, 42)
    assert (d.repeat_penalty, d.repeat_last_n, d.presence_penalty, d.frequency_penalty) == (
        1.1, 32, 0.5, 0.25)  # fmt: skip
    assert d.ignore_eos and not config.jinja and not config.prefill_assistant
    assert config.chat_template == template.read_text()
    assert config.chat_template_kwargs == {"x": 1} and config.tags == ("chat", "small")
    assert config.n_ctx_slot == 256  # llama-server's -c split over -np slots


def test_server_wide_defaults_of_llama_servers_other_samplers(server_configs):
    """--dry-*, --xtc-*, --typical, --mirostat*, --dynatemp-*, --top-nsigma and --min-keep set
    the request defaults, read as llama-server reads them (common/arg.cpp)."""
    result = invoke("--dry-multiplier", "0.8", "--dry-base", "2", "--dry-allowed-length", "3",
                    "--dry-penalty-last-n", "-1", "--dry-sequence-breaker", "\n",
                    "--dry-sequence-breaker", "x y", "--xtc-probability", "0.5",
                    "--xtc-threshold", "0.2", "--typical", "0.9", "--mirostat", "2",
                    "--mirostat-lr", "0.3", "--mirostat-ent", "4", "--dynatemp-range", "0.5",
                    "--dynatemp-exp", "2", "--top-nsigma", "1.5", "--min-keep", "4")  # fmt: skip
    assert isinstance(result.exception, Loaded), result.output
    d = server_configs[0].defaults
    assert (d.dry_multiplier, d.dry_base, d.dry_allowed_length, d.dry_penalty_last_n) == (
        0.8, 2.0, 3, -1)  # fmt: skip
    assert d.dry_sequence_breakers == ("\n", "x y")  # the first one replaced the defaults
    assert (d.xtc_probability, d.xtc_threshold, d.typical_p) == (0.5, 0.2, 0.9)
    assert (d.mirostat, d.mirostat_eta, d.mirostat_tau) == (2, 0.3, 4.0)
    assert (d.dynatemp_range, d.dynatemp_exponent, d.top_n_sigma, d.min_keep) == (0.5, 2.0, 1.5, 4)
    # the other spellings; --dry-base below 1 keeps the default; "none" clears the breakers
    result = invoke("--typical-p", "0.8", "--top-n-sigma", "2", "--dry-base", "0.5",
                    "--dry-sequence-breaker", "none")  # fmt: skip
    assert isinstance(result.exception, Loaded), result.output
    d = server_configs[1].defaults
    assert (d.typical_p, d.top_n_sigma, d.dry_base, d.dry_sequence_breakers) == (0.8, 2.0, 1.75, ())
    result = invoke()  # llama-server's defaults: all off
    d = server_configs[2].defaults
    assert (d.dry_multiplier, d.dry_base, d.dry_allowed_length, d.dry_penalty_last_n) == (
        0.0, 1.75, 2, 64)  # fmt: skip
    assert d.dry_sequence_breakers == ("\n", ":", '"', "*")
    assert (d.xtc_probability, d.xtc_threshold, d.typical_p, d.mirostat) == (0.0, 0.1, 1.0, 0)
    assert (d.mirostat_tau, d.mirostat_eta, d.dynatemp_range, d.dynatemp_exponent) == (
        5.0, 0.1, 0.0, 1.0)  # fmt: skip
    assert (d.top_n_sigma, d.min_keep) == (-1.0, 0)


@pytest.mark.parametrize(
    "args,n_ctx,n_ctx_slot",
    [(["-c", "512", "-np", "2", "-kvu"], 512, 512), (["-c", "512"], 512, 512),
     (["-c", "512", "-np", "2"], 512, 256),
     # llama-context.cpp pads each slot's share to 256: -c 5 -np 4 is 4 slots of 256
     (["-c", "5", "-np", "4"], 1024, 256), (["-c", "1000", "-np", "3"], 1536, 512),
     # -c 0 (llama-server's --fit default): the trained context for every slot, in one shared
     # stream with -np automatic or -kvu, else one stream per slot
     ([], N_CTX_TRAIN, N_CTX_TRAIN), (["-np", "4", "-kvu"], N_CTX_TRAIN, N_CTX_TRAIN),
     (["-np", "4"], 4 * N_CTX_TRAIN, N_CTX_TRAIN)],
)  # fmt: skip
def test_context_per_slot(server_configs, args, n_ctx, n_ctx_slot):
    result = invoke(*args)
    assert isinstance(result.exception, Loaded), result.output
    assert server_configs[0].engine_kwargs["n_ctx"] == n_ctx
    assert server_configs[0].n_ctx_slot == n_ctx_slot
    assert server_configs[0].defaults.temperature == 0.8  # llama-server's default


def test_trained_context_that_does_not_fit_is_reduced(server_configs, monkeypatch):
    """-np 300 -c 0 wanted 300 x 8192 tokens of KV (53 GiB for the default model's 23040 bytes
    a token): as llama-server's --fit, the context shrinks to what fits with 1 GiB left, not
    below 4096 tokens a slot, and a note says so (it allocated 2048 a slot, silently)."""
    import cli.serve_context

    monkeypatch.setattr(cli.serve_context, "host_memory_bytes", lambda: 32 * 2**30)
    result = invoke("-np", "300")
    assert isinstance(result.exception, Loaded), result.output
    (config,) = server_configs
    n_ctx = config.engine_kwargs["n_ctx"]
    assert 300 * 4096 <= n_ctx < 300 * 8192 and n_ctx % (300 * 256) == 0
    assert n_ctx * 23040 <= 31 * 2**30 and config.n_ctx_slot == n_ctx // 300
    note = "cacheflow: -c 0: 300 x the trained context (8192 tokens) needs 52.7 GiB"
    assert note in result.output
    assert f"using {n_ctx // 300} tokens per slot" in result.output
    monkeypatch.setattr(cli.serve_context, "host_memory_bytes", lambda: 16 * 2**30)
    result = invoke("-np", "300")
    assert server_configs[-1].engine_kwargs["n_ctx"] == 300 * 4096  # the minimum; the engine
    assert "not even 4096 tokens per slot fit" in result.output  # then says it does not fit
    result = invoke("-np", "300", "--fit", "off")  # llama-server's flag: the trained context
    assert server_configs[-1].engine_kwargs["n_ctx"] == 300 * 8192
    assert "trained context" not in result.output  # and no note
    result = invoke("-np", "300", "-fit", "on", "-fitt", "512", "-fitc", "2048")
    assert 300 * 2048 <= server_configs[-1].engine_kwargs["n_ctx"] < 300 * 4096


def test_kv_cache_memory_sizes_the_pool_instead(server_configs):
    result = invoke("--kv-cache-memory", "256MiB", "-np", "4")
    assert isinstance(result.exception, Loaded), result.output
    assert server_configs[0].engine_kwargs["n_ctx"] == 0 and server_configs[0].n_ctx_slot == 0


@pytest.mark.parametrize(
    "args,message",
    [(["--chat-template-kwargs", "[1]"], "must be a JSON object"),
     (["--chat-template-kwargs", "{"], "not JSON"),
     (["--chat-template", "chatml", "--chat-template-file", __file__], "not both"),
     (["--repeat-last-n", "-2"], "--repeat-last-n must be >= -1, got -2"),
     (["--mirostat", "3"], "--mirostat must be 0, 1 or 2, got 3"),
     (["--dry-allowed-length", "-1"], "--dry-allowed-length must be in [0, 2147483647], got -1"),
     (["--dry-penalty-last-n", "-2"], "--dry-penalty-last-n must be in [-1, 2147483647], got -2"),
     (["--min-keep", "-1"], "--min-keep must be in [0, 2147483647], got -1")],
)  # fmt: skip
def test_bad_chat_and_sampling_flags(server_configs, args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_reasoning_flags(server_configs, monkeypatch):
    """--reasoning-format (LLAMA_ARG_THINK) is the requests' default; -rea on / off and
    --reasoning-effort become template variables, as in llama-server's default kwargs."""
    result = invoke("--reasoning-format", "none", "-rea", "off", "--reasoning-effort", "high",
                    "--reasoning-budget", "-1", "--chat-template-kwargs", '{"x": 1}')  # fmt: skip
    assert isinstance(result.exception, Loaded), result.output
    config = server_configs[-1]
    assert config.defaults.reasoning_format == "none"
    assert config.defaults.reasoning_budget == -1
    assert config.chat_template_kwargs == {"x": 1, "enable_thinking": False,
                                           "reasoning_effort": "high"}  # fmt: skip
    result = invoke("--reasoning-budget", "16", "--reasoning-budget-message", "Time is up.")
    assert isinstance(result.exception, Loaded), result.output
    defaults = server_configs[-1].defaults
    assert (defaults.reasoning_budget, defaults.reasoning_budget_message) == (16, "Time is up.")
    monkeypatch.setenv("LLAMA_ARG_THINK_BUDGET", "0")
    result = invoke()
    assert isinstance(result.exception, Loaded), result.output
    assert server_configs[-1].defaults.reasoning_budget == 0
    monkeypatch.delenv("LLAMA_ARG_THINK_BUDGET")
    monkeypatch.setenv("LLAMA_ARG_THINK", "deepseek-legacy")
    result = invoke("--reasoning", "enabled")  # llama.cpp's spellings of on
    assert isinstance(result.exception, Loaded), result.output
    config = server_configs[-1]
    assert config.defaults.reasoning_format == "deepseek-legacy"
    assert config.chat_template_kwargs == {"enable_thinking": True}
    result = invoke()
    assert server_configs[-1].chat_template_kwargs == {}  # auto: the template decides


@pytest.mark.parametrize(
    "args,message",
    [(["--reasoning-budget", "-2"], "-2 is not in the range x>=-1"),
     (["--reasoning-budget", "4294967299"], "--reasoning-budget must be in [-2147483648, "),
     (["--top-k", "99999999999"], "--top-k must be in [-2147483648, 2147483647], got 99999999999"),
     (["--seed", "99999999999"], "--seed must be in [-2147483648, 4294967295]"),
     (["-rea", "maybe"], "unknown value for --reasoning: 'maybe'"),
     (["--reasoning-format", "think"], "'think' is not one of")],
)  # fmt: skip
def test_bad_reasoning_flags(server_configs, args, message):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_max_body_size(server_configs):
    """--max-body-size (ServerConfig.max_body_bytes): 16 MiB by default, a size with a unit, 0 =
    no limit; a bad size is a usage error."""
    for args, expected in (((), 16 * 2**20), (("--max-body-size", "1KiB"), 1024),
                           (("--max-body-size", "0"), 0)):  # fmt: skip
        result = invoke(*args)
        assert isinstance(result.exception, Loaded), result.output
        assert server_configs[-1].max_body_bytes == expected
    result = invoke("--max-body-size", "lots")
    assert result.exit_code == 2 and "Invalid value for '--max-body-size'" in result.output
