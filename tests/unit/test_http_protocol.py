"""Response heads keep llama-server's header-name casing under uvicorn's httptools protocol, and
connections send without Nagle delays."""

from __future__ import annotations

import socket

from pycacheflow.server.http_protocol import capitalize_head, protocol_class, set_nodelay


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


class _Transport:
    def __init__(self, sock: object) -> None:
        self._sock = sock

    def get_extra_info(self, name: str) -> object:
        return self._sock if name == "socket" else None


def test_connections_send_without_nagle_delays():
    """Each response is several writes; with Nagle on, a kept-alive connection's writes waited for
    the client's delayed ACK (~40 ms per response): the protocol turns it off per connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    conn, _ = listener.accept()
    try:
        assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        set_nodelay(_Transport(conn))
        assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        set_nodelay(_Transport(None))  # no socket (e.g. a test transport): nothing to do
        unix_a, unix_b = socket.socketpair()
        set_nodelay(_Transport(unix_a))  # not TCP: left alone
        unix_a.close()
        unix_b.close()
    finally:
        for s in (conn, client, listener):
            s.close()
