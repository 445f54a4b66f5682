"""`cacheflow generate` end to end on the tiny model: JSON output, errors and exit codes.

Most cases run the click command in-process with CliRunner; one runs `python -m cli` in a
subprocess to cover the real entry point, stdout/stderr separation and the exit status.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cacheflow
from pycacheflow import SamplingParams

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]

PROMPTS = ["First prompt", "Second, longer prompt with more words in it", "Third"]


def run_cli(*args: str):
    """Invoke `cacheflow ARGS...` in-process; returns click's Result."""
    return CliRunner().invoke(cacheflow, list(args))


def test_generate_json_one_object_per_prompt_in_order(tiny_model_path, tiny_llm):
    result = run_cli("generate", "-m", str(tiny_model_path), "--json", "-q", "-n", "6",
                     "--ignore-eos", "-c", "2", *PROMPTS)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == len(PROMPTS)
    records = [json.loads(line) for line in lines]
    assert [r["prompt"] for r in records] == PROMPTS
    expected = tiny_llm.generate(PROMPTS, SamplingParams(max_tokens=6, ignore_eos=True))
    assert [r["token_ids"] for r in records] == [list(o.token_ids) for o in expected]
    assert [r["text"] for r in records] == [o.text for o in expected]
    assert {r["finish_reason"] for r in records} == {"length"}
    assert [r["metrics"]["num_output_tokens"] for r in records] == [6, 6, 6]


def test_generate_prompts_file_jsonl(tmp_path, tiny_model_path):
    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    result = run_cli("generate", "-m", str(tiny_model_path), "--json", "-q", "-n", "2",
                     "--prompts-file", str(prompts_file), "extra prompt")
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["prompt"] for line in result.stdout.splitlines()] == [
        "extra prompt", *PROMPTS]


def test_generate_takes_llama_servers_other_sampler_flags(tiny_model_path, tiny_llm):
    """--dry-*, --xtc-*, --typical, --mirostat*, --dynatemp-*, --top-nsigma, --min-keep: the
    tokens of SamplingParams with the same values."""
    flags = ["--dry-multiplier", "1.5", "--dry-base", "2", "--dry-allowed-length", "1",
             "--dry-sequence-breaker", "x", "--xtc-probability", "0.5", "--typical", "0.9",
             "--temperature", "0.9", "--seed", "4", "--top-nsigma", "2", "--dynatemp-range",
             "0.3", "--min-keep", "2"]  # fmt: skip
    result = run_cli("generate", "-m", str(tiny_model_path), "--json", "-q", "-n", "8",
                     "--ignore-eos", *flags, PROMPTS[0])  # fmt: skip
    assert result.exit_code == 0, result.output
    expected = tiny_llm.generate(PROMPTS[:1], SamplingParams(
        max_tokens=8, ignore_eos=True, temperature=0.9, seed=4, dry_multiplier=1.5, dry_base=2.0,
        dry_allowed_length=1, dry_sequence_breakers=("x",), xtc_probability=0.5, typical_p=0.9,
        top_n_sigma=2.0, dynatemp_range=0.3, min_keep=2))[0]  # fmt: skip
    assert json.loads(result.stdout)["token_ids"] == list(expected.token_ids)
    result = run_cli("generate", "-m", str(tiny_model_path), "--json", "-q", "-n", "8",
                     "--ignore-eos", "--temperature", "0.9", "--seed", "4", "--mirostat", "2",
                     "--mirostat-ent", "3", "--mirostat-lr", "0.2", PROMPTS[0])  # fmt: skip
    assert result.exit_code == 0, result.output
    expected = tiny_llm.generate(PROMPTS[:1], SamplingParams(
        max_tokens=8, ignore_eos=True, temperature=0.9, seed=4, mirostat=2, mirostat_tau=3.0,
        mirostat_eta=0.2))[0]  # fmt: skip
    assert json.loads(result.stdout)["token_ids"] == list(expected.token_ids)


def test_generate_stop_string(tiny_model_path, tiny_llm):
    full = tiny_llm.generate(["Stop here"], SamplingParams(max_tokens=16, ignore_eos=True))[0]
    pieces = [tiny_llm.detokenize([t]) for t in full.token_ids[4:]]
    stop = next(p for p in pieces if len(p.strip()) >= 2 and p.isprintable() and "\ufffd" not in p)
    result = run_cli("generate", "-m", str(tiny_model_path), "--json", "-q", "-n", "16",
                     "--ignore-eos", "--stop", stop, "Stop here")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["finish_reason"] == "stop"
    assert record["text"] == full.text[: full.text.index(stop)]


def test_unknown_flag_is_a_usage_error(tiny_model_path):
    result = run_cli("generate", "-m", str(tiny_model_path), "--no-such-flag", "hi")
    assert result.exit_code == 2
    assert "No such option" in result.output and "--no-such-flag" in result.output


# Engine settings are validated by the engine (one owner per value): its message, as is, under
# the option that set the field; a usage error (exit 2) before the model is loaded.
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ctx-size", "512", "--kv-cache-memory", "1GiB"], "Invalid value for --ctx-size: set --ctx-size or --kv-cache-memory, not both "
                                                           "(--ctx-size 512, --kv-cache-memory 1073741824)"),
        (["-c", "0"], "Invalid value for -c/--concurrency: max_num_seqs must be >= 1, got 0"),
        (["--ctx-size", "-1"], "Invalid value for --ctx-size: n_ctx must be >= 0, got -1"),
        (["--batch-tokens", "8"], "Invalid value for --batch-tokens: --batch-tokens (8) must "
                                  "be at least -c/--concurrency (16)"),
        (["--block-size", "0"], "Invalid value for --block-size: block_size must be >= 1, got 0"),
        (["--gpu-layers", "-2"], "Invalid value for --gpu-layers: n_gpu_layers must be >= -1, got -2"),
    ],
)
def test_engine_values_are_checked_by_the_engine(args, message, tmp_path):
    not_a_model = tmp_path / "m.gguf"  # never opened: the config is checked first
    not_a_model.write_bytes(b"GGUF")
    result = run_cli("generate", "-m", str(not_a_model), *args, "hi")
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-n", "0"], "--max-tokens"),
        (["--temperature", "-1"], "--temperature"),
        (["--top-p", "0"], "--top-p"),
        (["--kv-mode", "bogus"], "--kv-mode"),
        (["--stream", "--json"], "cannot be combined"),
    ],
)
def test_bad_option_values_are_usage_errors(args, message, tiny_model_path):
    result = run_cli("generate", "-m", str(tiny_model_path), *args, "hi")
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_missing_model_file(tmp_path):
    missing = tmp_path / "missing.gguf"
    result = run_cli("generate", "-m", str(missing), "hi")
    assert result.exit_code != 0
    assert str(missing) in result.output and "does not exist" in result.output


def test_corrupt_model_file(tmp_path):
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + bytes(1000))
    result = run_cli("generate", "-m", str(corrupt), "hi")
    assert result.exit_code == 1
    assert "ModelLoadError" in result.output and str(corrupt) in result.output


def test_prompt_too_long(tiny_model_path):
    result = run_cli("generate", "-m", str(tiny_model_path), "-c", "1", "--ctx-size", "64",
                     "word " * 600)
    assert result.exit_code == 2  # a usage error, like an empty prompt
    assert "Error: prompt 1 has 601 tokens" in result.output
    assert "--ctx-size sets the KV cache" in result.output and "-c/--ctx-size" not in result.output
    result = run_cli("generate", "-m", str(tiny_model_path), "-c", "1", "--ctx-size", "64",
                     "hi", "word " * 600)
    assert result.exit_code == 2
    assert "Error: prompt 2 has 601 tokens" in result.output  # numbered from 1, as other prompt errors
    # stock mode divides --ctx-size among the -c sequences, and the hint says so
    result = run_cli("generate", "-m", str(tiny_model_path), "-c", "2", "--kv-mode", "stock", "--ctx-size", "128",
                     "word " * 600)
    assert result.exit_code == 2
    assert "Error: prompt 1 has 601 tokens" in result.output
    assert "stock mode divides among the -c/--concurrency sequences" in result.output


@pytest.mark.parametrize(
    "args,notice",
    [
        (["-c", "4", "--kv-mode", "stock", "--ctx-size", "1000"],
         ("cacheflow: --ctx-size 1000 rounded to 1024 tokens of KV cache (llama.cpp allocates "
          "multiples of 256 per sequence); at most 256 tokens per sequence\n")),
        (["-c", "4", "--kv-mode", "paged", "--ctx-size", "1000"],
         ("cacheflow: --ctx-size 1000 rounded to 1024 tokens of KV cache (llama.cpp allocates "
          "multiples of 256); at most 1024 tokens per sequence\n")),
        (["-c", "4", "--kv-mode", "stock", "--ctx-size", "1024"], ""),
    ],
)  # fmt: skip
def test_rounded_ctx_size_is_a_notice(tiny_model_path, args, notice):
    result = run_cli("generate", "-m", str(tiny_model_path), "-q", "-n", "1", *args, "hi")
    assert result.exit_code == 0, result.output
    assert result.stderr == notice


def test_output_cut_by_the_context_limit_is_noted(tiny_model_path):
    prompt = " ".join(["word"] * 240)  # 240 tokens in a 256-token sequence: room for 16
    result = run_cli("generate", "-m", str(tiny_model_path), "-q", "--json", "-n", "100", "--ctx-size", "256",
                     "-c", "1", "--ignore-eos", prompt)  # fmt: skip
    assert result.exit_code == 0, result.output
    (out,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert out["finish_reason"] == "length" and out["truncated"] is True
    assert result.stderr == ("cacheflow: prompt 1 stopped at the context limit (256 tokens per sequence) "
                             "after 16 of 100 tokens\n")  # fmt: skip
    full = run_cli("generate", "-m", str(tiny_model_path), "-q", "--json", "-n", "4", "--ignore-eos", prompt)
    assert full.exit_code == 0 and full.stderr == ""  # -n reached: nothing to note
    (out,) = [json.loads(line) for line in full.stdout.splitlines()]
    assert out["finish_reason"] == "length" and out["truncated"] is False


def test_max_tokens_beyond_the_context_is_noted_before_the_run(tiny_model_path):
    # -n larger than a sequence's context: said at the start (a long run without --stream prints nothing until its
    # end), then the output's own note; -t -1 reads as 0 (the default count)
    result = run_cli("generate", "-m", str(tiny_model_path), "-q", "-n", "300", "--ctx-size", "256", "-c", "1",
                     "-t", "-1", "--ignore-eos", "hi")  # fmt: skip
    assert result.exit_code == 0, result.output
    first, second = result.stderr.splitlines()
    assert first == ("cacheflow: -n 300 does not fit a sequence's context (256 tokens) beside a prompt: each "
                     "output stops at the context limit")  # fmt: skip
    assert second.startswith("cacheflow: prompt 1 stopped at the context limit (256 tokens per sequence) after ")


def test_a_large_concurrency_with_the_default_context_is_warned_before_loading(tiny_model_path):
    """llama.cpp's users pass the context size to -c; the warning comes before the KV cache is allocated (here the
    run then stops at a usage error, so nothing is allocated)."""
    result = run_cli("generate", "-m", str(tiny_model_path), "-q", "-n", "1", "-c", "256", "--batch-tokens", "128",
                     "hi")  # fmt: skip
    assert result.exit_code == 2
    assert result.stderr.startswith(
        "cacheflow: warning: -c 256 runs up to 256 sequences at once, and the KV cache is sized to hold all of them "
        "at the default context per sequence (it may take much of this machine's memory); llama.cpp's -c, the "
        "context size, is --ctx-size here\n"
    )
    sized = run_cli("generate", "-m", str(tiny_model_path), "-q", "-n", "1", "-c", "256", "--batch-tokens", "128",
                    "--ctx-size", "512", "hi")  # fmt: skip
    assert sized.exit_code == 2 and "warning" not in sized.stderr


def test_paged_only_flags_with_a_stock_kv_cache_are_noted(tiny_model_path):
    result = run_cli("generate", "-m", str(tiny_model_path), "-q", "-n", "1", "--kv-mode", "stock",
                     "--paged-attention", "ggml", "--block-size", "32", "hi")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        "cacheflow: warning: --paged-attention has no effect: the engine runs llama.cpp's stock KV cache, and the "
        "option applies to --kv-mode paged\n"
        "cacheflow: warning: --block-size has no effect: the engine runs llama.cpp's stock KV cache, and the "
        "option applies to --kv-mode paged\n"
    )
    paged = run_cli("generate", "-m", str(tiny_model_path), "-q", "-n", "1", "--paged-attention", "ggml",
                    "--block-size", "32", "hi")  # fmt: skip
    assert paged.exit_code == 0 and paged.stderr == ""  # auto: paged on the CPU


def test_a_budget_rounded_down_is_a_notice(tiny_model_path, tiny_llm):
    per_token = tiny_llm.info.kv_bytes_per_token
    budget = 300 * per_token  # 300 tokens fit; llama.cpp's multiples of 256 keep 256 within it
    result = run_cli("generate", "-m", str(tiny_model_path), "-q", "-n", "1", "-c", "1",
                     "--kv-cache-memory", str(budget), "hi")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stderr == (f"cacheflow: --kv-cache-memory {budget} bytes fits 300 tokens; the KV cache "
                             "holds 256 (llama.cpp allocates multiples of 256, rounded down to stay "
                             "within it)\n")  # fmt: skip
    exact = run_cli("generate", "-m", str(tiny_model_path), "-q", "-n", "1", "-c", "1",
                    "--kv-cache-memory", str(256 * per_token), "hi")  # fmt: skip
    assert exact.exit_code == 0 and exact.stderr == ""


def test_kv_cache_beyond_memory(real_model_path):
    result = run_cli("generate", "-m", str(real_model_path), "--ctx-size", str(2**31 - 1), "hi")
    assert result.exit_code == 1, result.output
    assert "OutOfMemoryError: out of memory creating the llama.cpp context" in result.output
    assert "The KV cache does not fit: lower --ctx-size, --kv-cache-memory or -c" in result.output


def test_sjf_policy_runs_the_same_greedy_outputs(tiny_model_path):
    args = ("generate", "-m", str(tiny_model_path), "--json", "-q", "-n", "4", "-c", "1", *PROMPTS)
    fcfs = run_cli(*args)
    sjf = run_cli(*args, "--policy", "sjf")
    assert fcfs.exit_code == 0 and sjf.exit_code == 0, fcfs.output + sjf.output
    texts = [[json.loads(line)["text"] for line in r.stdout.splitlines()] for r in (fcfs, sjf)]
    assert texts[0] == texts[1]  # in prompt order either way


def test_seed_minus_one_is_random_as_in_llama_cpp(tiny_model_path):
    result = run_cli("generate", "-m", str(tiny_model_path), "-q", "--seed", "-1", "--temp", "0.8",
                     "-n", "2", "hi")  # fmt: skip
    assert result.exit_code == 0, result.output
    result = run_cli("generate", "-m", str(tiny_model_path), "-q", "--seed", "-2", "-n", "2", "hi")
    assert result.exit_code == 2 and "seed must be -1 (random) or in [0, 2**63), got -2" in result.output


def test_swap_without_swap_space_says_it_recomputes(tiny_model_path, capfd):
    result = run_cli("generate", "-m", str(tiny_model_path), "-q", "--preemption", "swap", "--swap-space", "0",
                     "-n", "1", "hi")  # fmt: skip
    assert result.exit_code == 0, result.output
    native_stderr = capfd.readouterr().err  # the engine writes the note to file descriptor 2
    assert "swap preemption with a swap space of 0 bytes, which holds no KV block" in native_stderr
    assert "preempted sequences are recomputed" in native_stderr


def test_swap_space_smaller_than_a_sequence_says_so(tiny_model_path, capfd):
    # about 20 KiB: a few blocks of the tiny model, less than one sequence may fill
    result = run_cli("generate", "-m", str(tiny_model_path), "-q", "--preemption", "swap", "--swap-space", "0.00002",
                     "-n", "1", "hi")  # fmt: skip
    assert result.exit_code == 0, result.output
    native_stderr = capfd.readouterr().err
    assert "cacheflow: the swap space holds" in native_stderr
    assert "less than one sequence may fill" in native_stderr and "is recomputed instead" in native_stderr


def test_swap_space_beyond_memory_names_the_flag(tiny_model_path):
    result = run_cli("generate", "-m", str(tiny_model_path), "--swap-space", "100000", "-n", "2", "hi")
    assert result.exit_code == 1, result.output
    assert "bytes of swap space (lower --swap-space)" in result.output
    assert "The swap space does not fit in host memory: lower --swap-space (GiB)." in result.output
    assert "KV cache" not in result.output


def test_subprocess_entry_point(tiny_model_path, tiny_llm):
    cmd = [sys.executable, "-m", "cli", "generate", "-m", str(tiny_model_path), "--json",
           "-n", "4", "--ignore-eos", "Hello", "World"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["prompt"] for r in records] == ["Hello", "World"]
    expected = tiny_llm.generate(["Hello", "World"], SamplingParams(max_tokens=4, ignore_eos=True))
    assert [r["token_ids"] for r in records] == [list(o.token_ids) for o in expected]
    assert "output tokens: 8" in result.stderr  # the stats summary goes to stderr


def test_subprocess_unknown_flag_exit_code():
    cmd = [sys.executable, "-m", "cli", "generate", "--bogus"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO_ROOT)
    assert result.returncode == 2
    assert "No such option" in result.stderr and "--bogus" in result.stderr


# Fresh-user findings: each message names the option to change and the real cause.
@pytest.mark.parametrize(
    ("args", "message"),
    [
        # was UnsupportedError "... kv_mode=stock may work" after llama.cpp's raw log lines
        (["--block-size", "100000", "--ctx-size", "512"],
         "Invalid value for --block-size: --block-size (100000) is larger than the KV cache (512 "
         "tokens), which must hold at least one block"),
        # -c is the concurrency here (llama.cpp's -c is the context size): it was blamed on
        # --batch-tokens, which the user never gave
        (["-c", "100000"], "Invalid value for -c/--concurrency: --batch-tokens (512) must "
                           "be at least -c/--concurrency (100000) (-c is the number of sequences run "
                           "at once; the KV context size is --ctx-size)"),
        # a C ABI width refused by EngineConfig: was "n_ctx must be ..." without the option
        (["--ctx-size", "10000000000"],
         "Invalid value for --ctx-size: n_ctx must be < 2**31 in magnitude, got 10000000000"),
    ],
)
def test_engine_value_messages_name_the_option_and_cause(args, message, tiny_model_path):
    result = run_cli("generate", "-m", str(tiny_model_path), "-n", "2", *args, "hi")
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert "kv_mode=stock may work" not in result.output


def test_corrupt_model_is_one_error_without_llama_cpp_log_lines(tmp_path, capfd):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"garbage, not a GGUF file")
    result = run_cli("generate", "-m", str(bad), "hi")
    assert result.exit_code == 1, result.output
    assert (f"Error: ModelLoadError: failed to load model from {bad} (corrupt or unsupported "
            "GGUF?): llama.cpp: gguf_init_from_reader: invalid magic characters: 'garb', "
            "expected 'GGUF'") in result.output
    native_stderr = capfd.readouterr().err  # what llama.cpp wrote to fd 2 itself
    assert "llama_model_load" not in native_stderr and "gguf_init" not in native_stderr
    result = run_cli("generate", "-v", "-m", str(bad), "hi")  # -v shows llama.cpp's own lines
    assert result.exit_code == 1
    assert "llama_model_load" in capfd.readouterr().err


def test_generate_chat_renders_the_gguf_template(tiny_model_path, tiny_llm):
    """--chat renders the GGUF's own Jinja template (SmolLM2's, copied into the tiny model:
    it adds the default system prompt the built-in matcher drops), the same text as
    LLM.apply_chat_template and the server's chat route (issue 15: the README's first
    command)."""
    from pycacheflow.gguf_metadata import chat_template_of

    rendered = tiny_llm.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert "You are a helpful AI assistant named SmolLM" in rendered
    assert "You are a helpful AI assistant named SmolLM" in chat_template_of(tiny_model_path)
    result = run_cli("generate", "-m", str(tiny_model_path), "--json", "-q", "-n", "3",
                     "--ignore-eos", "--chat", "Hi")  # fmt: skip
    assert result.exit_code == 0, result.output
    (record,) = [json.loads(line) for line in result.stdout.splitlines()]
    expected = tiny_llm.generate([rendered], SamplingParams(max_tokens=3, ignore_eos=True))[0]
    assert record["token_ids"] == list(expected.token_ids)
    assert record["metrics"]["num_prompt_tokens"] == len(expected.prompt_token_ids)


def test_gpu_layers_without_a_gpu_are_named_as_ignored(tiny_model_path, capfd):
    """As llama-server warns for --gpu-layers without a usable GPU: the layers run on the CPU, and stderr says so."""
    import shutil

    if shutil.which("nvidia-smi") is not None:
        pytest.skip("a GPU driver is present: the layers may go to a GPU")
    result = run_cli("generate", "-m", str(tiny_model_path), "-q", "--gpu-layers", "99", "-n", "1", "hi")
    assert result.exit_code == 0, result.output
    assert ("no GPU to offload to (no GPU backend in this build, or no device visible): n_gpu_layers=99 is ignored "
            "and every layer runs on the CPU") in capfd.readouterr().err  # fmt: skip
