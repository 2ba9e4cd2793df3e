"""A TCP proxy that can cut a network path silently, for partition tests (issue 19).

`TcpProxy(upstream_port)` listens on 127.0.0.1 (a free port) and pumps bytes both ways between
each accepted connection and 127.0.0.1:`upstream_port`. `partition()` makes the path a black
hole, as a network partition looks to both ends: bytes already in flight and every later byte
are dropped (nothing is closed or reset), and new connections are accepted and never
forwarded. `heal()` forwards again for new connections (the stranded ones stay dead, as after
a real partition their peers have given up). `stop()` closes every socket and joins every
thread. `forwarded()` is how many bytes it has passed on so far,
`connections()` how many connections it has accepted, and `captured()` the first
`capture` bytes it passed on (both directions, in arrival order), to check what crosses the
wire.
"""
import select
import socket
import threading

TICK = 0.05


class TcpProxy:
    def __init__(self, upstream_port, upstream_host="127.0.0.1", capture=0):
        self.upstream = (upstream_host, upstream_port)
        self._cut = threading.Event()
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._socks = set()
        self._forwarded = 0
        self._accepted = 0
        self._capture = capture
        self._captured = bytearray()
        self._threads = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._spawn(self._accept_loop)

    def partition(self):
        self._cut.set()

    def forwarded(self):
        with self._lock:
            return self._forwarded

    def captured(self):
        with self._lock:
            return bytes(self._captured)

    def connections(self):
        with self._lock:
            return self._accepted

    def heal(self):
        self._cut.clear()

    def stop(self):
        self._closing.set()
        with self._lock:
            socks = list(self._socks) + [self._listener]
        for s in socks:
            try:
                s.close()
            except OSError:
                pass
        for t in self._threads:
            t.join(timeout=5)

    def _spawn(self, target, *args):
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _keep(self, sock):
        with self._lock:
            self._socks.add(sock)

    def _accept_loop(self):
        while not self._closing.is_set():
            ready, _, _ = select.select([self._listener], [], [], TICK)
            if not ready:
                continue
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._keep(client)
            with self._lock:
                self._accepted += 1
            if self._cut.is_set():
                continue  # accepted, never answered: a black hole
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            self._keep(upstream)
            self._spawn(self._pump, client, upstream)

    def _pump(self, a, b):
        peer = {a: b, b: a}
        while not self._closing.is_set():
            try:
                ready, _, _ = select.select([a, b], [], [], TICK)
            except (OSError, ValueError):
                return
            for s in ready:
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    for x in (a, b):
                        try:
                            x.close()
                        except OSError:
                            pass
                    return
                if self._cut.is_set():
                    continue  # dropped on the floor
                try:
                    peer[s].sendall(data)
                except OSError:
                    return
                with self._lock:
                    self._forwarded += len(data)
                    room = self._capture - len(self._captured)
                    if room > 0:
                        self._captured += data[:room]
