"""Response heads keep llama-server's header-name casing under uvicorn's httptools protocol."""

from __future__ import annotations

from pycacheflow.server.http_protocol import capitalize_head, protocol_class


def test_a_response_head_gets_capitalized_names_and_untouched_values():
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"access-control-allow-origin: web.mydomain.fr\r\nprocess-start-time-unix: 17\r\n"
            b"x-accel-buffering: no\r\n\r\n")  # fmt: skip
    assert capitalize_head(head) == (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Access-Control-Allow-Origin: web.mydomain.fr\r\nProcess-Start-Time-Unix: 17\r\n"
        b"X-Accel-Buffering: no\r\n\r\n")  # fmt: skip


def test_bodies_and_chunks_pass_through_unchanged():
    for data in (b'{"content": "a\r\nb: c"}', b"2a\r\ndata: {}\r\n\r\n", b"", b"0\r\n\r\n",
                 b"data: x\r\nfoo: bar\r\n\r\n"):  # fmt: skip
        assert capitalize_head(data) is data


def test_the_protocol_is_uvicorns_httptools_one_when_installed():
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    assert issubclass(protocol_class(), HttpToolsProtocol)
