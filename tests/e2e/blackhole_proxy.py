"""A TCP proxy that can black-hole its traffic (case redis-outage without touching the shared
Redis server): ``forward`` relays bytes both ways; while ``blackhole`` is set, bytes from
clients are swallowed and nothing is answered, so calls time out like dropped packets."""

from __future__ import annotations

import socket
import threading


class BlackholeProxy:
    """``start()`` listens on 127.0.0.1 (``port``) and forwards to ``target``; ``stop()``."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.blackhole = threading.Event()
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.port = self._srv.getsockname()[1]
        self._closed = threading.Event()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> BlackholeProxy:
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
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def stop(self) -> None:
        self._closed.set()
        self._srv.close()
        with self._lock:
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass
