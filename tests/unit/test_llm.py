"""LLM, EngineRunner and the CLI over a toy libcacheflow (tests/fakes/fake_cacheflow.c).

The fake implements cacheflow.h without llama.cpp: byte tokens, each request "generates" its
prompt over and over, one token per request per 1 ms step. It checks the Python layer
(threads, routing, streaming, stop strings, errors) in milliseconds; model behaviour is tested
end to end elsewhere. Needs a C compiler (skipped without one).
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from pycacheflow import SamplingParams, errors

REPO = Path(__file__).resolve().parents[2]
FAKE_SOURCE = REPO / "tests" / "fakes" / "fake_cacheflow.c"
FAKE_CTX_PER_SEQ = 256  # as in fake_cacheflow.c


@pytest.fixture(scope="session")
def fake_lib_path(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the fake libcacheflow")
    out = tmp_path_factory.mktemp("fakecf") / "libcacheflow_fake.so"
    subprocess.run(
        [
            cc,
            "-std=c11",
            "-O1",
            "-shared",
            "-fPIC",
            f"-I{REPO / 'native' / 'include'}",
            str(FAKE_SOURCE),
            "-o",
            str(out),
            "-lpthread",
        ],
        check=True,
    )
    return out


@pytest.fixture
def native(fake_lib_path, monkeypatch):
    """pycacheflow._native bound to the fake library for this test."""
    from pycacheflow import _ffi

    fake = _ffi.ffi.dlopen(str(fake_lib_path))
    try:
        import pycacheflow._native as module
    except ImportError:  # no real library built: import against the fake
        monkeypatch.setattr(_ffi, "_lib", fake)
        import pycacheflow._native as module
    monkeypatch.setattr(module, "lib", fake)
    return module


@pytest.fixture
def model_file(tmp_path) -> Path:
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"GGUF")
    return path


@pytest.fixture
def llm(native, model_file):
    from pycacheflow.llm import LLM

    with LLM(model_file, max_num_seqs=4) as instance:
        yield instance


def test_generate_in_input_order(llm):
    outs = llm.generate(["abc", "Hello ", [104, 105]], SamplingParams(max_tokens=7))
    assert [o.text for o in outs] == ["abcabca", "Hello H", "hihihih"]
    assert [o.prompt for o in outs] == ["abc", "Hello ", None]
    assert outs[2].prompt_token_ids == (104, 105) and outs[2].token_ids[:2] == (104, 105)
    for o in outs:
        assert o.finish_reason == "length" and o.metrics.num_output_tokens == 7
        assert 0 < o.metrics.ttft_s <= o.metrics.e2e_s and o.metrics.tpot_s > 0
        assert len(o.metrics.itl_s) == 6


def test_per_prompt_params_and_chat_template(llm):
    outs = llm.generate(["ab", "cd"], [SamplingParams(max_tokens=1), SamplingParams(max_tokens=3)])
    assert [o.text for o in outs] == ["a", "cdc"]
    chat = llm.generate("Hi", SamplingParams(max_tokens=10), use_chat_template=True)[0]
    assert chat.text == "<user>Hi|A" and chat.prompt == "Hi"
    assert llm.apply_chat_template([{"role": "user", "content": "x"}]) == "<user>x|A:"


def test_stop_string_cut_in_text_and_stream(llm):
    params = SamplingParams(max_tokens=40, stop=["STOP"])
    assert llm.generate("xyz STOP", params)[0].text == "xyz "
    assert "".join(llm.stream("xyz STOP", params)) == "xyz "


def test_the_engine_stops_at_a_stop_string_spanning_tokens_and_names_it(llm):
    # The engine alone matches stop strings (Python has no matcher): "lo w" spans 4 tokens and
    # stops the request right there; the streamed text is the engine's, held back while "l",
    # "lo", "lo " could still become the stop string.
    params = SamplingParams(max_tokens=60, stop=["q1", "q2", "q3", "lo w"])
    request_id = llm.add_request("Hello world. ", params)
    deltas = list(llm.iter_outputs(request_id))
    out = deltas[-1].output
    assert "".join(d.text for d in deltas) == out.text == "Hel"
    assert out.finish_reason == "stop" and out.token_ids == tuple(b"Hello w")
    assert out.stop_string == "lo w"


def test_stream_splits_no_utf8_character(llm):
    pieces = list(llm.stream("aé", SamplingParams(max_tokens=6)))  # é = 2 tokens
    assert "".join(pieces) == "aéaé" and "\ufffd" not in "".join(pieces)


def test_bad_prompt_raises_before_anything_is_submitted(llm):
    first = llm.generate("a", SamplingParams(max_tokens=1))[0].request_id
    with pytest.raises(errors.PromptTooLongError, match=r"prompts\[1\] has 256 tokens"):
        llm.generate(["ok", "x" * FAKE_CTX_PER_SEQ])
    with pytest.raises(errors.InvalidArgumentError, match="out of range"):
        llm.generate([[1, 2], [999]])
    with pytest.raises(errors.InvalidArgumentError, match="empty"):
        llm.generate([""])
    with pytest.raises(TypeError, match="list of lists"):
        llm.generate([1, 2, 3])
    assert llm.generate("a", SamplingParams(max_tokens=1))[0].request_id == first + 1


def test_a_prompt_of_no_accepted_type_is_named_with_the_accepted_types(llm):
    """generate([None]) raised iter()'s bare "'NoneType' object is not iterable"."""
    first = llm.generate("a", SamplingParams(max_tokens=1))[0].request_id
    with pytest.raises(TypeError) as info:
        llm.generate([None])
    assert str(info.value) == "prompts[0] must be a str or a list of int token ids, got None"
    with pytest.raises(TypeError, match=r"^prompts\[1\] must be a str or a list of int token ids, "
                       r"got 1\.5$"):  # fmt: skip
        llm.generate(["ok", 1.5])
    with pytest.raises(TypeError, match="^prompt must be a str or a list of int token ids, "
                       "got None$"):  # fmt: skip
        llm.add_request(None)
    # nothing was submitted
    assert llm.generate("a", SamplingParams(max_tokens=1))[0].request_id == first + 1


def test_prompts_of_no_order_are_a_type_error(llm):
    """generate({"prompt": "Hello"}) ran the dict's keys as prompts, generate({"a", "b"}) a set's
    arbitrary order; any non-sequence iterable is refused like None, before any submission."""
    first = llm.generate("a", SamplingParams(max_tokens=1))[0].request_id
    cases = [({"prompt": "Hello"}, "dict"), ({"a", "b"}, "set"), (iter(["a"]), "list_iterator")]
    for prompts, name in cases:
        with pytest.raises(TypeError) as info:
            llm.generate(prompts, SamplingParams(max_tokens=1))
        assert str(info.value) == (
            f"prompts must be a str, a list of str or a list of token-id lists, got {name}"
        )
    assert llm.generate(("a", "b"), SamplingParams(max_tokens=1))[1].text == "b"  # tuples stay
    assert llm.generate("a", SamplingParams(max_tokens=1))[0].request_id == first + 3


def test_abort(llm):
    request_id = llm.add_request("hello", SamplingParams(max_tokens=10_000))
    outputs = llm.iter_outputs(request_id)
    first = next(outputs)
    assert first.text.startswith("h") and not first.finished
    assert llm.abort(request_id)
    last = [d for d in outputs][-1]
    assert last.output.finish_reason == "abort"
    assert not llm.abort(request_id) and not llm.abort(123456)
    with pytest.raises(errors.NotFoundError):
        next(llm.iter_outputs(request_id))


def test_closing_a_stream_early_aborts(llm):
    stream = llm.stream("abc", SamplingParams(max_tokens=10_000))
    assert next(stream).startswith("a")
    stream.close()
    assert llm.generate("z", SamplingParams(max_tokens=2))[0].text == "zz"


def test_take_outputs_with_notify(llm):
    woken = threading.Event()
    request_id = llm.add_request("ab", SamplingParams(max_tokens=5), notify=woken.set)
    deltas = []
    while not (deltas and deltas[-1].finished):
        assert woken.wait(5)
        woken.clear()
        deltas += llm.take_outputs(request_id)
    assert "".join(d.text for d in deltas) == "ababa"
    with pytest.raises(errors.NotFoundError):
        llm.take_outputs(request_id)


def test_many_threads_share_one_llm(llm):
    results = {}

    def worker(i):
        results[i] = llm.generate([f"p{i}-{j} " for j in range(10)], SamplingParams(max_tokens=8))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, outs in results.items():
        assert [o.text for o in outs] == [(f"p{i}-{j} " * 2)[:8] for j in range(10)]


def test_tokenize_detokenize_info_stats(llm):
    assert llm.tokenize("hé") == [104, 0xC3, 0xA9]
    assert llm.detokenize([104, 256]) == "h"
    assert llm.detokenize([104, 256], skip_special=False) == "h<eos>"
    assert llm.info.n_vocab == 258 and llm.info.kv_mode_name == "stock"
    llm.generate("ab", SamplingParams(max_tokens=3))
    assert llm.stats().num_generated_tokens >= 3


def test_close_is_idempotent_and_final(native, model_file):
    from pycacheflow.llm import LLM

    instance = LLM(model_file)
    instance.close()
    instance.close()
    with pytest.raises(errors.ShutdownError):
        instance.generate("x")


def test_errors_map_to_classes(native, model_file):
    from pycacheflow.llm import LLM

    with pytest.raises(errors.ModelLoadError, match="cannot open"):
        LLM(model_file.parent / "missing.gguf")
    with pytest.raises(errors.NotFoundError, match="unknown"):
        with native.Engine(native_config(model_file)) as engine:
            engine.abort(42)


def native_config(model_file):
    from pycacheflow import EngineConfig

    return EngineConfig(model=model_file)


def test_text_buffers_grow_on_buffer_too_small(native, model_file):
    calls = []

    def call(handle, prefix, buf, capacity, out):
        calls.append((prefix, capacity))
        out[0] = 10
        if capacity < 10:
            return native.lib.CF_STATUS_BUFFER_TOO_SMALL
        native.ffi.memmove(buf, b"0123456789", 10)
        return native.lib.CF_STATUS_OK

    with native.Engine(native_config(model_file)) as engine:
        assert engine._text_call(call, ("p",), capacity=4) == b"0123456789"
    assert calls == [("p", 4), ("p", 10)]


def test_close_waits_for_calls_in_flight_and_wakes_drains(native, model_file):
    engine = native.Engine(native_config(model_file))
    engine.start()
    drained = []

    def drain_forever():
        try:
            drained.append(engine.drain(timeout_ms=-1))
        except errors.ShutdownError:  # close() came first
            drained.append("closed")

    drainer = threading.Thread(target=drain_forever)
    drainer.start()
    time.sleep(0.05)  # let it block in cf_engine_drain
    engine.close()  # must wake the blocked drain, wait for it, then free
    drainer.join(5)
    assert not drainer.is_alive() and drained in ([[]], ["closed"]) and engine.closed
    with pytest.raises(errors.ShutdownError):
        engine.tokenize("x")


def separate_streams_runner() -> CliRunner:
    """A CliRunner keeping stderr out of stdout (the default from click 8.2 on)."""
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:  # click >= 8.2 has no mix_stderr
        return CliRunner()


def test_cli_generate_json_and_stream(native, model_file):
    import json

    from cli.main import cacheflow

    runner = separate_streams_runner()
    result = runner.invoke(
        cacheflow, ["generate", "-m", str(model_file), "--json", "-n", "3", "ab", "cd"]
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["prompt"], r["text"], r["finish_reason"]) for r in lines] == [
        ("ab", "aba", "length"),
        ("cd", "cdc", "length"),
    ]
    assert "requests: 2" in result.stderr
    result = runner.invoke(
        cacheflow,
        ["generate", "-m", str(model_file), "--stream", "-q", "-n", "20", "--stop", "lo", "Hello"],
    )
    assert result.exit_code == 0 and result.stdout == "Hel\n" and result.stderr == ""


def test_cli_prompt_too_long_is_a_usage_error(native, model_file):
    from cli.main import cacheflow

    result = CliRunner().invoke(cacheflow, ["generate", "-m", str(model_file), "x" * 300])
    assert result.exit_code == 2 and "Error: prompt 1 has" in result.output
    # this model's trained context (256 tokens) is the limit here, which --ctx-size cannot raise
    assert "trained context, 256 tokens, caps a sequence" in result.output
    assert "Traceback" not in result.output
