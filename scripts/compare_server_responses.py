#!/usr/bin/env python3
"""Compare the HTTP answers of two checkouts' `cacheflow serve`, byte for byte (issue 14).

For server changes that must not change what clients receive (performance work): it starts
``python -m cli serve`` of each tree on the toy engine (tests/fakes/fake_cacheflow.c, compiled
with 20 ms steps, so that one stream's tokens arrive one per wake-up and the SSE chunking is the
same in both), sends the same requests to each over raw sockets, one at a time (all three
generating endpoints streamed and not; stop words, n_predict 0, several prompts and choices,
token and mixed prompts, a token inside a UTF-8 character, prompt progress, response_fields,
client errors, a wrong method, CORS preflight and origin, /slots, /props; then a server with
--api-key and a reasoning template), and compares the raw answers: status line, headers without
``date``, and the de-chunked body, with response ids, ``created``, timing floats, ``time_ms`` and
/props' ``media_marker`` masked (and Content-Length where such values are in the body). Exit
status 1 and a unified diff when they differ.

    python scripts/compare_server_responses.py /tmp/main-copy .
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
THINK_TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{% if m.reasoning_content %}<think>"
                  "{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}|{% endfor %}"
                  "{% if add_generation_prompt %}A:{% endif %}")  # fmt: skip


def build_fake(work: Path) -> Path:
    """The fake libcacheflow with 20 ms steps."""
    source = (REPO / "tests/fakes/fake_cacheflow.c").read_text()
    source = source.replace("{0, 1000000}", "{0, 20000000}")
    (work / "fake.c").write_text(source)
    lib = work / "libcacheflow_fake.so"
    subprocess.run(["cc", "-std=c11", "-O1", "-shared", "-fPIC", f"-I{REPO}/native/include",
                    str(work / "fake.c"), "-o", str(lib), "-lpthread"], check=True)  # fmt: skip
    return lib


def start(tree: Path, lib: Path, work: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "CACHEFLOW_LIB": str(lib), "PYTHONPATH": str(tree)}
    log = open(work / f"serve_{port}.log", "w")  # noqa: SIM115 - the child's, while it runs
    proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "-m", str(work / "m.gguf"),
                             "-np", "4", "--host", "127.0.0.1", "--port", str(port), *extra],
                            env=env, cwd=tree, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    for _ in range(400):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc, port
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit((work / f"serve_{port}.log").read_text())


def raw(port: int, method: str, path: str, body: object = None, headers: tuple = ()) -> bytes:
    """The whole answer to one request on its own connection (``Connection: close``)."""
    data = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    head += "".join(h + "\r\n" for h in headers)
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(head.encode() + b"\r\n" + data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def dechunk(head: bytes, body: bytes) -> bytes:
    """The body of a chunked answer (chunk boundaries are no part of the comparison)."""
    if b"transfer-encoding: chunked" not in head.lower():
        return body
    out = b""
    while True:
        line, _, body = body.partition(b"\r\n")
        size = int(line, 16)
        if size == 0:
            return out
        out += body[:size]
        body = body[size + 2 :]


def mask(text: str) -> str:
    """``text`` with what differs from run to run masked: ids, ``created``, ``time_ms``, the
    media marker and every float (timings)."""
    text = re.sub(r'"created":\d+', '"created":T', text)
    text = re.sub(r'"id":"(chat)?cmpl-[^"]+"', '"id":ID', text)
    text = re.sub(r'"media_marker":"[^"]+"', '"media_marker":M', text)
    text = re.sub(r'"time_ms":\d+', '"time_ms":F', text)
    text = re.sub(r"(?<=[:\[,])-?\d+\.\d+(e[-+]?\d+)?", "F", text)
    return re.sub(r"(?<=[:\[,])\d+e[-+]?\d+", "F", text)


def capture(port: int, requests: list) -> list:
    out = []
    for r in requests:
        head, _, body = raw(port, *r).partition(b"\r\n\r\n")
        lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")]
        if re.search(rb'"(created|timings|media_marker)"', body):
            lines = [b"Content-Length: *" if line.lower().startswith(b"content-length:") else line
                     for line in lines]  # fmt: skip
        out.append({"request": repr(r)[:200], "head": [line.decode() for line in lines],
                    "body": mask(dechunk(head, body).decode("utf-8", "replace"))})  # fmt: skip
    return out


P = "POST"
C, O, CH = "/completion", "/v1/completions", "/v1/chat/completions"
msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]
REQUESTS = [
    (P, C, {"prompt": "abc", "n_predict": 7, "return_tokens": True}),
    (P, C, {"prompt": "abc", "n_predict": 7, "return_tokens": True, "stream": True}),
    (P, "/completions", {"prompt": "abc", "n_predict": 5, "stream": True}),
    (P, C, {"prompt": "abcXdef", "n_predict": 20, "stop": ["Xd"], "stream": True}),
    (P, C, {"prompt": "abcXdef", "n_predict": 20, "stop": ["Xd"]}),
    (P, C, {"prompt": "abc", "n_predict": 0, "stream": True}),
    (P, C, {"prompt": "abc", "n_predict": 0}),
    (P, C, {"prompt": ["ab", "cd"], "n_predict": 3, "stream": True}),
    (P, C, {"prompt": ["ab", "cd"], "n_predict": 3}),
    (P, C, {"prompt": [104, 105], "n_predict": 3, "stream": True}),
    (P, C, {"prompt": ["ab", 99, "cd"], "n_predict": 3, "stream": True}),
    (P, C, {"prompt": "a€b", "n_predict": 6, "stream": True}),
    (P, C, {"prompt": "a€b", "n_predict": 6}),
    (P, C, {"prompt": "abc", "n_predict": 4, "stream": True, "return_progress": True, "timings_per_token": True}),
    (P, C, {"prompt": "abc", "n_predict": 4, "response_fields": ["content", "timings/prompt_n"]}),
    (P, C, {"prompt": "abc", "n_predict": 3, "n_probs": 2, "stream": True}),
    (P, C, {"prompt": "abc", "n_predict": 3, "n_cmpl": 2, "stream": True}),
    (P, C, {"prompt": "x" * 300, "n_predict": 3, "stream": True}),
    (P, C, {"prompt": "", "n_predict": 3, "stream": True}),
    (P, C, {"prompt": [999], "n_predict": 3, "stream": True}),
    (P, C, {"prompt": "abc", "temperature": "hot"}),
    (P, C, b"{not json"),
    (P, C, b'{"prompt": NaN}'),
    (P, C, {"prompt": "abc", "echo": True}),
    (P, C, {"prompt": "ab\ud800c", "n_predict": 2}),
    (P, C, {"prompt": "abc", "n_predict": 250, "stream": True}),
    (P, C, {"prompt": "abc", "n_predict": 3, "ignore_eos": True, "logit_bias": [["a", -1]], "stream": True}),
    (P, O, {"prompt": "abc", "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}),
    (P, O, {"prompt": "abc", "max_tokens": 5, "stream": True}),
    (P, O, {"prompt": "abc", "max_tokens": 5}),
    (P, O, {"prompt": ["abc", "de"], "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}),
    (P, O, {"prompt": "abc", "max_tokens": 5, "n": 2, "stream": True}),
    (P, O, {"prompt": "a€b", "max_tokens": 6, "stream": True, "return_progress": True}),
    (P, O, {"prompt": "abcXd", "max_tokens": 9, "stop": "Xd", "stream": True}),
    (P, CH, {"messages": msgs, "max_tokens": 5}),
    (P, CH, {"messages": msgs, "max_tokens": 5, "stream": True}),
    (P, CH, {"messages": msgs, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}),
    (P, CH, {"messages": msgs, "max_tokens": 5, "stream": True, "n": 2}),
    (P, CH, {"messages": msgs, "max_tokens": 5, "n": 2, "verbose": True}),
    (P, CH, {"messages": msgs, "max_tokens": 8, "stream": True, "stop": ["e"], "return_progress": True, "timings_per_token": True}),
    (P, CH, {"messages": [{"role": "user", "content": "a€b"}], "max_tokens": 7, "stream": True}),
    (P, CH, {"messages": "nope"}),
    (P, "/chat/completions", {"messages": msgs, "max_tokens": 2, "stream": True}),
    ("GET", C, None),
    (P, C + "/", {"prompt": "abc", "n_predict": 2}),
    ("OPTIONS", C, None, ("Origin: http://example.com", "Access-Control-Request-Method: POST")),
    (P, C, {"prompt": "abc", "n_predict": 2, "stream": True}, ("Origin: http://example.com",)),
    (P, CH, {"messages": msgs, "max_tokens": 2}, ("Origin: http://example.com",)),
    ("GET", "/slots", None),
    ("GET", "/props", None),
]



def answers(tree: Path, lib: Path, work: Path) -> dict:
    """Every answer of ``tree``'s server, normalized."""
    think = work / "think.jinja"
    think.write_text(THINK_TEMPLATE)
    result = {}
    proc, port = start(tree, lib, work, "--metrics")
    try:
        result["main"] = capture(port, REQUESTS)
        metrics = raw(port, "GET", "/metrics").decode()
        result["metrics"] = sorted({line.split("{")[0].split(" ")[0]
                                    for line in metrics.splitlines()
                                    if line and not line.startswith("#")})  # fmt: skip
    finally:
        proc.terminate()
        proc.wait()
    proc, port = start(tree, lib, work, "--api-key", "k1", "--reasoning-format", "deepseek",
                       "--chat-template-file", str(think), "--jinja")  # fmt: skip
    think_msgs = [{"role": "user", "content": "<think>r</think>x"}]
    try:
        result["api_key_and_reasoning"] = capture(port, [
            (P, C, {"prompt": "abc", "n_predict": 2}),
            (P, C, {"prompt": "abc", "n_predict": 2}, ("Authorization: Bearer k1",)),
            (P, CH, {"messages": think_msgs, "max_tokens": 12, "stream": True}, ("X-Api-Key: k1",)),
            (P, CH, {"messages": think_msgs, "max_tokens": 12}, ("X-Api-Key: k1",)),
        ])  # fmt: skip
    finally:
        proc.terminate()
        proc.wait()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree_a", type=Path)
    parser.add_argument("tree_b", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="compare-serve-") as tmp:
        # one fixed path for both servers: the model path is in the answers
        work = Path(tmp)
        (work / "m.gguf").write_bytes(b"GGUF")
        lib = build_fake(work)
        texts = [json.dumps(answers(t.resolve(), lib, work), indent=1, ensure_ascii=False)
                 for t in (args.tree_a, args.tree_b)]  # fmt: skip
    if texts[0] == texts[1]:
        print(f"same answers ({len(REQUESTS) + 4} requests)")
        return
    sys.stdout.writelines(difflib.unified_diff(texts[0].splitlines(True),
                                               texts[1].splitlines(True),
                                               str(args.tree_a), str(args.tree_b)))  # fmt: skip
    sys.exit(1)


if __name__ == "__main__":
    main()
