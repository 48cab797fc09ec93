"""A TCP proxy in front of a local HTTP server (moto S3) that can hold one chosen request.

A test that needs a request of the operator to be in flight at a given moment (a slow storage
answer, without making every request slow) arms ``hold_next(pattern, seconds)``: the next
request whose bytes contain ``pattern`` waits ``seconds`` before it is forwarded; ``holding``
is set meanwhile. Everything else passes through unchanged.

``down()`` makes the storage unreachable (an outage, for as long as a test wants): every open
connection is cut and every new one is closed at once; ``up()`` ends it.
"""

from __future__ import annotations

import socket
import threading
import time


class HoldProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self._pattern: bytes | None = None
        self._seconds = 0.0
        self.holding = threading.Event()
        self.held = 0  # requests held so far
        self._stop = threading.Event()
        self._down = threading.Event()
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hold_next(self, pattern: bytes, seconds: float) -> None:
        with self._lock:
            self._pattern, self._seconds = pattern, seconds

    def down(self) -> None:
        """The storage is unreachable: open connections are cut, new ones closed at once."""
        self._down.set()
        with self._lock:
            cut, self._open = list(self._open), set()
        for s in cut:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def up(self) -> None:
        self._down.clear()

    def close(self) -> None:
        self._stop.set()
        self._server.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self._down.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, upstream))
            if self._down.is_set():  # went down meanwhile
                self.down()
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while data := src.recv(65536):
                if requests:
                    self._maybe_hold(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.difference_update((src, dst))
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _maybe_hold(self, data: bytes) -> None:
        with self._lock:
            if self._pattern is None or self._pattern not in data:
                return
            seconds, self._pattern = self._seconds, None
            self.held += 1
        self.holding.set()
        time.sleep(seconds)
        self.holding.clear()
