"""A TCP proxy that can black-hole its traffic (case redis-outage without touching the shared
Redis server): ``forward`` relays bytes both ways; while ``blackhole`` is set, bytes from
clients are swallowed and nothing is answered, so calls time out like dropped packets."""

from __future__ import annotations

import socket
import threading

from tests.e2e.tcp_proxy import TcpProxy, close_quietly


class BlackholeProxy(TcpProxy):
    """``start()`` listens on 127.0.0.1 (``port``) and forwards to ``target``; ``stop()``."""

    def __init__(self, target: tuple[str, int]) -> None:
        super().__init__(target)
        self.blackhole = threading.Event()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _serve(self, client: socket.socket, upstream: socket.socket) -> None:
        threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
        threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not self.blackhole.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            close_quietly(src, dst)
