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
wire. `sent_into_the_void()` is, for each connection, the first 64 KiB its client sent after
the cut (read and dropped): what a peer tried to say through the partition.
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
        self._void = []
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

    def sent_into_the_void(self):
        with self._lock:
            return [bytes(b) for b in self._void]

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
                # Accepted, never answered: a black hole (what arrives is read and dropped).
                self._spawn(self._sink, client)
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            self._keep(upstream)
            self._spawn(self._pump, client, upstream)

    def _sink(self, sock):
        kept = bytearray()
        with self._lock:
            self._void.append(kept)
        while not self._closing.is_set():
            try:
                ready, _, _ = select.select([sock], [], [], TICK)
                data = sock.recv(65536) if ready else None
            except (OSError, ValueError):
                return
            if data == b"":
                return
            if data:
                with self._lock:
                    kept += data[:max(0, 65536 - len(kept))]

    def _pump(self, a, b):
        peer = {a: b, b: a}
        void = None  # what the client sent since the cut, dropped
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
                    if s is a:
                        with self._lock:
                            if void is None:
                                void = bytearray()
                                self._void.append(void)
                            void += data[:max(0, 65536 - len(void))]
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
