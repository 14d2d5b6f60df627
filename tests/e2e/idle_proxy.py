"""A TCP proxy with an idle timeout, like a load balancer's (AWS ALB, nginx
``proxy_read_timeout``; 60 s is a common default): a connection over which no byte went either
way for ``idle_s`` seconds is closed, both sides. ``cut`` counts the connections it closed so."""

from __future__ import annotations

import selectors
import socket
import threading
import time

from tests.e2e.tcp_proxy import TcpProxy, close_quietly


class IdleTimeoutProxy(TcpProxy):
    """``start()`` listens on 127.0.0.1 (``port``, bound by the OS) and forwards every
    connection to ``target`` (host, port); ``stop()`` closes everything."""

    def __init__(self, target: tuple[str, int], idle_s: float) -> None:
        super().__init__(target)
        self.idle_s = idle_s
        self.cut = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self, client: socket.socket, upstream: socket.socket) -> None:
        threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        """Both directions on one thread; closes both after ``idle_s`` without a byte."""
        peer = {client: upstream, upstream: client}
        sel = selectors.DefaultSelector()
        for s in peer:
            s.setblocking(True)
            sel.register(s, selectors.EVENT_READ)
        last = time.monotonic()
        try:
            while not self._closed.is_set():
                left = self.idle_s - (time.monotonic() - last)
                if left <= 0:
                    with self._lock:
                        self.cut += 1
                    return
                ready = sel.select(timeout=left)
                for key, _ in ready:
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = src.recv(65536)
                    if not data:
                        return
                    peer[src].sendall(data)
                    last = time.monotonic()
        except OSError:
            return
        finally:
            sel.close()
            close_quietly(*peer)
