"""The loopback TCP proxy the test proxies share: a listener on 127.0.0.1 (port bound by the OS),
one upstream connection to ``target`` per accepted client, handed to the subclass's ``_serve``;
``stop()`` closes the listener and every connection."""

from __future__ import annotations

import socket
import threading
from typing import Self


def close_quietly(*socks: socket.socket) -> None:
    """Close each socket, ignoring one that is already gone."""
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


class TcpProxy:
    """``start()`` listens (``port``) and forwards each connection to ``target`` (host, port)
    through ``_serve(client, upstream)``, which the subclass defines."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.port = self._srv.getsockname()[1]
        self._closed = threading.Event()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> Self:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._srv.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, upstream]
            self._serve(client, upstream)

    def _serve(self, client: socket.socket, upstream: socket.socket) -> None:
        """Relay one connection (threads of its own: the accept loop goes on)."""
        raise NotImplementedError

    def stop(self) -> None:
        self._closed.set()
        self._srv.close()
        with self._lock:
            close_quietly(*self._socks)
