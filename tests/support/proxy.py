"""A TCP forwarder a test can cut: the database "goes away" for one process only.

``block()`` drops every open connection and refuses new ones (accepted, then closed at
once, as a dead server's port would behave behind a load balancer); ``unblock()``
forwards again. Used to take the ledger's database away from one worker without
stopping the PostgreSQL server the rest of the test suite shares.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class Proxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._blocked = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def block(self) -> None:
        self._blocked.set()
        with self._lock:
            for sock in list(self._open):
                _close(sock)
            self._open.clear()

    def unblock(self) -> None:
        self._blocked.clear()

    def close(self) -> None:
        self._closed = True
        self.block()
        _close(self._listener)

    def __enter__(self) -> Proxy:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:  # fmt: skip
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._blocked.is_set():
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                _close(sock)
                with self._lock:
                    self._open.discard(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
