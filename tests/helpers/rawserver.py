"""Small misbehaving servers on loopback, written on raw sockets so that they can do what no
real HTTP server library allows: never answer, answer a byte at a time, send what is not HTTP."""

from __future__ import annotations

import socket
import threading

MODELS = b'{"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "test"}]}'
MODELS_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(MODELS), MODELS)


class RawServer:
    """Accepts on 127.0.0.1 (a free port) and hands each connection to ``serve`` in a thread;
    ``closing`` is set by ``close`` (a serving loop waits on it rather than sleeping)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port: int = self.sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.closing = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve_closing, args=(conn,), daemon=True).start()

    def _serve_closing(self, conn: socket.socket) -> None:
        with conn:
            try:
                self.serve(conn)
            except OSError:
                return

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.closing.set()
        self.sock.close()


def is_models(head: bytes) -> bool:
    """A request for the model list (its request line asks for /models)."""
    return head.startswith(b"GET ") and b"/models" in head.split(b"\r\n")[0]
