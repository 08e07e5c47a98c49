"""A loopback TCP proxy that drops, delays and resets connections on purpose: faults
between the archiver and the S3 server at the network level."""

from __future__ import annotations

import random
import socket
import struct
import threading
import time


class FaultyProxy:
    """Forwards 127.0.0.1:<port> to ``target``. Every chunk a client sends (a request, or
    part of an upload) meets a fault with probability ``fault_rate``: ``drop`` (both
    connections closed), ``reset`` (both reset: RST) or ``delay`` (0.3 s, then forwarded).
    Clients keep connections alive, so faults are drawn per chunk, not per connection.
    ``bytes_per_second`` (with ``fault_rate=0``: a slow link, not a faulty one) paces what
    each connection sends upstream: a slow upload whose duration tests can bound. ``down``
    set: an outage, every chunk dropped."""

    def __init__(
        self,
        target: tuple[str, int],
        *,
        seed: int = 0,
        fault_rate: float = 0.3,
        bytes_per_second: float | None = None,
    ):
        self.target = target
        self.bytes_per_second = bytes_per_second
        self.rng = random.Random(seed)
        self.fault_rate = fault_rate
        self.down = False
        self.faults = 0
        self._lock = threading.Lock()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _fate(self) -> str | None:
        with self._lock:
            if self.down:  # an outage: every request dropped until it is cleared
                self.faults += 1
                return "drop"
            if self.rng.random() >= self.fault_rate:
                return None
            self.faults += 1
            return self.rng.choice(("drop", "reset", "delay"))

    def _accept(self) -> None:
        self.listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=30)
        except OSError:
            client.close()
            return

        def end(reset: bool) -> None:
            for s in (client, upstream):
                try:
                    if reset:
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    s.close()
                except OSError:
                    pass

        def pump(source: socket.socket, sink: socket.socket, faulty: bool) -> None:
            try:
                while True:
                    data = source.recv(65536)
                    if not data:
                        break
                    fate = self._fate() if faulty else None
                    if fate in ("drop", "reset"):
                        end(reset=fate == "reset")
                        return
                    if fate == "delay":
                        time.sleep(0.3)
                    if faulty and self.bytes_per_second:
                        time.sleep(len(data) / self.bytes_per_second)
                    sink.sendall(data)
            except OSError:
                pass
            end(reset=False)

        threading.Thread(target=pump, args=(client, upstream, True), daemon=True).start()
        pump(upstream, client, False)

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        self._thread.join()
