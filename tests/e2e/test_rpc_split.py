"""Layer split over two local rpc-server processes (issue 17, first half; README "Several devices").

Two rpc-servers of this build (pycacheflow/lib/rpc-server, CPU devices, one thread each) on free
ports of 127.0.0.1 hold the tiny model's layers: with tensor_split (1, 3) layer 0 lands on the first
and layer 1 (and the output) on the second. Each server computes its layers' nodes, in paged mode the
paged attention op (GGML_OP_PAGED_ATTN crosses the wire as op enum + op_params + sources) over the
K/V pools that live in that server's memory. Greedy outputs must equal the local CPU run token for
token: the servers run the same ggml-cpu kernels on the same data, so nothing changes but where.
Block accounting stays per engine: one pool of the same number of blocks, whatever the devices.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
from serve_helpers import ServerProcess

from cli.devices import rpc_server_path
from pycacheflow import SamplingParams
from pycacheflow.errors import InvalidArgumentError

pytestmark = pytest.mark.e2e

CONFIG = {"max_num_seqs": 4, "n_ctx": 1024}  # 64 blocks of 16 rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rpc-server on port {port} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"rpc-server on port {port} did not listen within {timeout_s} s")


@pytest.fixture(scope="module")
def rpc_servers() -> Iterator[tuple[str, str]]:
    """Two rpc-server processes on free local ports, as ("127.0.0.1:P1", "127.0.0.1:P2")."""
    path = rpc_server_path()
    if not path.is_file():
        pytest.skip(f"no rpc-server at {path} (a build with CACHEFLOW_RPC=OFF)")
    procs, endpoints = [], []
    try:
        for _ in range(2):
            port = free_port()
            proc = subprocess.Popen([str(path), "-H", "127.0.0.1", "-p", str(port), "-t", "1"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            procs.append(proc)
            wait_listening(port, proc)
            endpoints.append(f"127.0.0.1:{port}")
        yield tuple(endpoints)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)


def prompts(n: int) -> list[list[int]]:
    """n distinct prompts of 20..(19 + n) token ids."""
    return [list(range(500 + 97 * i, 520 + 97 * i + i)) for i in range(n)]


GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)


@pytest.mark.parametrize("kv_mode", ["paged", "stock"])
def test_layer_split_over_two_rpc_servers_equals_the_local_run(tiny_model_path, make_llm, rpc_servers,
                                                               kv_mode):  # fmt: skip
    local = make_llm(tiny_model_path, kv_mode=kv_mode, **CONFIG)
    expected = [o.token_ids for o in local.generate(prompts(4), GREEDY)]
    split = make_llm(tiny_model_path, kv_mode=kv_mode, rpc_servers=rpc_servers, n_gpu_layers=-1,
                     tensor_split=(1, 3), **CONFIG)  # fmt: skip
    outs = split.generate(prompts(4), GREEDY)
    assert [o.token_ids for o in outs] == expected  # token for token
    info, s, s_local = split.info, split.stats(), local.stats()
    assert info.kv_mode_name == kv_mode
    if kv_mode == "paged":
        # each layer's K/V pools on the device that runs the layer: one layer per server
        assert len(info.kv_devices) == 2 and info.kv_devices[0] != info.kv_devices[1]
        assert all(d.startswith("RPC") for d in info.kv_devices)
        assert local.info.kv_devices == ("CPU", "CPU")
        # one pool and one block table per engine, not per device
        assert s.kv_blocks_total == s_local.kv_blocks_total == 64
    else:
        assert info.kv_devices == ()
    assert s.kv_blocks_used == 0 and s.num_running == 0


def test_swaps_and_forks_with_pools_on_rpc_servers(tiny_model_path, make_llm, rpc_servers):
    """Swap preemption (llama_paged_swap_blocks: tensor get/set per block and layer, over RPC) and
    copy-on-write forks (llama_paged_copy_blocks: a copy between two views of one server's pool) give
    the tokens of the local run under the same schedule."""
    config = {"kv_mode": "paged", "max_num_seqs": 16, "n_ctx": 256, "preemption_mode": "swap",
              "swap_space_bytes": 16 << 20}  # fmt: skip
    params = SamplingParams(max_tokens=48, ignore_eos=True)

    def run(llm) -> tuple[list[list[int]], object]:
        # 16 x (20..35 prompt + 48 output) tokens in 16 blocks of 16 rows: preempted by swap
        tokens = [list(o.token_ids) for o in llm.generate(prompts(16), params)]
        ids = llm.add_choices(prompts(1)[0], [GREEDY] * 3)  # 3 forks of one prompt's blocks
        tokens += [[t for d in llm.iter_outputs(i, timeout=60) for t in d.token_ids] for i in ids]
        return tokens, llm.stats()

    expected, s_local = run(make_llm(tiny_model_path, **config))
    got, s = run(make_llm(tiny_model_path, rpc_servers=rpc_servers, n_gpu_layers=-1,
                          tensor_split=(1, 3), **config))  # fmt: skip
    assert s.num_preemptions_swap > 0 and s.swap_in_bytes == s.swap_out_bytes > 0
    assert s.block_copy_bytes > 0
    assert (s.num_preemptions_swap, s.swap_out_bytes) == (s_local.num_preemptions_swap, s_local.swap_out_bytes)
    assert got == expected
    assert s.kv_blocks_used == 0 and s.swap_blocks_used == 0


def test_bad_rpc_and_device_values_name_the_field(tiny_model_path, make_llm, rpc_servers):
    with pytest.raises(InvalidArgumentError, match=r"rpc_servers: cannot connect to rpc-server at 127\.0\.0\.1:"):
        make_llm(tiny_model_path, rpc_servers=(f"127.0.0.1:{free_port()}",), n_gpu_layers=-1)
    with pytest.raises(InvalidArgumentError, match="rpc_servers: 'localhost' is not host:port"):
        make_llm(tiny_model_path, rpc_servers="localhost", n_gpu_layers=-1)
    with pytest.raises(InvalidArgumentError, match="devices: unknown device 'GPU7'"):
        make_llm(tiny_model_path, rpc_servers=rpc_servers, devices="GPU7", n_gpu_layers=-1)
    with pytest.raises(InvalidArgumentError, match="tensor_split has 3 proportions for 2 devices"):
        make_llm(tiny_model_path, rpc_servers=rpc_servers, tensor_split=(1, 1, 1), n_gpu_layers=-1)
    with pytest.raises(InvalidArgumentError, match="rpc_servers needs n_gpu_layers != 0"):
        make_llm(tiny_model_path, rpc_servers=rpc_servers)


def test_endpoints_that_do_not_answer_the_rpc_handshake_fail_by_name(tiny_model_path, make_llm, rpc_servers):
    """ggml-rpc waits forever for a handshake answer (and aborts the process on a wrong one): a port that
    accepts but stays silent (like an rpc-server busy with another client), one that closes at once, and
    one rpc-server under two names each fail before any connection is handed to ggml-rpc, naming why."""
    import threading

    silent = socket.create_server(("127.0.0.1", 0))  # accepts (kernel backlog) and never answers
    closing = socket.create_server(("127.0.0.1", 0))

    def close_each() -> None:
        while True:
            try:
                conn, _ = closing.accept()
            except OSError:
                return
            conn.recv(64)
            conn.close()

    threading.Thread(target=close_each, daemon=True).start()
    try:
        t0 = time.monotonic()
        with pytest.raises(InvalidArgumentError, match="did not answer the RPC handshake within 5 s"):
            make_llm(tiny_model_path, rpc_servers=(f"127.0.0.1:{silent.getsockname()[1]}",), n_gpu_layers=-1)
        assert time.monotonic() - t0 < 30
        with pytest.raises(InvalidArgumentError, match="closed the connection at the RPC handshake"):
            make_llm(tiny_model_path, rpc_servers=(f"127.0.0.1:{closing.getsockname()[1]}",), n_gpu_layers=-1)
    finally:
        silent.close()
        closing.close()
    port = rpc_servers[0].rsplit(":", 1)[1]
    with pytest.raises(InvalidArgumentError, match="name the same address"):
        make_llm(tiny_model_path, rpc_servers=(f"localhost:{port}", f"127.0.0.1:{port}"), n_gpu_layers=-1)


def test_split_mode_none_puts_the_model_on_main_gpu(tiny_model_path, make_llm, rpc_servers):
    llm = make_llm(tiny_model_path, kv_mode="paged", rpc_servers=rpc_servers, n_gpu_layers=-1,
                   split_mode="none", main_gpu=1, **CONFIG)  # fmt: skip
    from pycacheflow._native import list_devices

    names = {d.name: d.description for d in list_devices(rpc_servers)}
    assert len(set(llm.info.kv_devices)) == 1
    assert names[llm.info.kv_devices[0]] == rpc_servers[1]


def test_generate_cli_over_rpc(tiny_model_path, rpc_servers):
    """`cacheflow generate --rpc ...` (layers on the servers without -ngl) and --list-devices."""
    import sys

    base = [sys.executable, "-m", "cli.main"]
    listed = subprocess.run([*base, "generate", "--rpc", ",".join(rpc_servers), "--list-devices"],
                            check=False, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert rpc_servers[0] in listed.stdout and rpc_servers[1] in listed.stdout
    out = subprocess.run([*base, "generate", "-m", str(tiny_model_path), "--rpc", ",".join(rpc_servers),
                          "-ts", "1,3", "-n", "8", "--json", "-q", "Hello"],
                         check=False, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    bad = subprocess.run([*base, "generate", "-m", str(tiny_model_path), "--rpc", f"127.0.0.1:{free_port()}",
                          "-n", "1", "Hi"], check=False, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "Invalid value for --rpc: rpc_servers: cannot connect" in bad.stderr


def test_serve_over_rpc(tiny_model_path, make_llm, rpc_servers):
    """`cacheflow serve --rpc ...` (-ngl auto: every layer on the servers): /completion's greedy tokens
    equal the local engine's for the same prompt ids."""
    prompt = prompts(1)[0]
    expected = make_llm(tiny_model_path, kv_mode="paged", **CONFIG).generate([prompt], GREEDY)[0].token_ids
    server = ServerProcess(["-m", str(tiny_model_path), "-np", "4", "-c", "1024", "--kv-mode", "paged",
                            "--rpc", ",".join(rpc_servers), "-ts", "1,3"])  # fmt: skip
    try:
        server.wait_ready(timeout_s=60)
        body = {"prompt": prompt, "n_predict": 24, "temperature": 0, "ignore_eos": True, "return_tokens": True}
        answer = httpx.post(server.base_url + "/completion", json=body, timeout=60).json()
        assert answer["tokens"] == list(expected), server.log()
    finally:
        server.close()
