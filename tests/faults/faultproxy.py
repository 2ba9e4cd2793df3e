"""A fault-injecting HTTP/1.1 proxy for the S3 fault tests (issue 20).

`FaultProxy(upstream_port)` listens on 127.0.0.1 (a free port) and forwards every request to
the S3 server at 127.0.0.1:`upstream_port`. It parses each request and response (head, then a
body by Content-Length, chunked encoding or end of stream), so a mode switch applies to the
next request even on a kept-alive connection. Bytes are forwarded unchanged: the Host header
stays the proxy's address, the one the client signed.

Modes (`set_mode(mode, **params)`, at any time):
- `pass`      forward;
- `refuse`    the port refuses connections (the listening socket is closed; the port stays
              reserved by a bound, not listening socket: connects get ECONNREFUSED), and every
              open connection is reset;
- `reset`     connections are accepted and reset at once (RST); open ones at their next request
              or while idle;
- `http503`   every request is read in full and answered `503 SlowDown` (an S3 XML error), the
              connection kept alive;
- `stall`     every request is read in full, then held without a byte of answer until
              `stall_seconds` passed or the mode changed; then it is forwarded and answered
              (a client that gave up meanwhile is counted, with how long it waited);
- `truncate`  a request with a body (an upload) is forwarded with half of its body, then both
              connections are closed: the server sees the upload cut, the client no answer
              (with `truncate_side="response"`, uploads are forwarded whole and their response
              cut instead: the object is stored, the client does not know); any other request
              is forwarded and its response cut: its head and half of its body (half of its
              head when it has no body), then the connection is closed;
- `trickle`   the request is forwarded, the response sent `trickle_bytes` every
              `trickle_interval` seconds (the rest at once when the mode changes).

The request modes (`http503`, `stall`, `truncate`, `trickle`) apply to the requests whose
method is in `methods` (a tuple; None: any) and whose target matches the regular expression
`paths` (None: any); the others pass.

`stats()` counts connections, requests and each fault injected; `stop()` closes every socket
and joins every thread.
"""
import collections
import re
import select
import socket
import struct
import threading
import time

MODES = ("pass", "refuse", "reset", "http503", "stall", "truncate", "trickle")
TICK = 0.05
MAX_HEAD = 64 * 1024


class _Gone(Exception):
    """The peer closed, the proxy is stopping, or the connection must be dropped."""


def _rst(sock):
    """Closes `sock` with a TCP reset."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def _close(sock):
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Reader:
    """Buffered reads from a socket that give up when `abort()` is true (checked every tick)."""

    def __init__(self, sock, abort):
        self.sock = sock
        self.abort = abort
        self.buf = bytearray()

    def _fill(self):
        while True:
            if self.abort():
                raise _Gone("aborted")
            try:
                ready, _, _ = select.select([self.sock], [], [], TICK)
            except (OSError, ValueError):
                raise _Gone("socket closed")
            if not ready:
                continue
            try:
                data = self.sock.recv(65536)
            except OSError as e:
                raise _Gone(str(e))
            if not data:
                raise _Gone("eof")
            self.buf += data
            return

    def idle(self):
        """True when nothing is buffered (no request has begun)."""
        return not self.buf

    def until(self, marker, limit=MAX_HEAD):
        while True:
            i = self.buf.find(marker)
            if i >= 0:
                out = bytes(self.buf[:i + len(marker)])
                del self.buf[:i + len(marker)]
                return out
            if len(self.buf) > limit:
                raise _Gone("head too long")
            self._fill()

    def exact(self, n):
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def to_eof(self):
        try:
            while True:
                self._fill()
        except _Gone as e:
            if str(e) != "eof":
                raise
        out = bytes(self.buf)
        self.buf.clear()
        return out


def _parse_head(head):
    """(start line parts, {lower-case name: value}) of an HTTP head."""
    lines = head.decode("latin-1").split("\r\n")
    start = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    return start, headers


def _read_body(reader, headers):
    """The raw bytes of a message body framed by `headers` (None: framed by end of stream)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        out = bytearray()
        while True:
            line = reader.until(b"\r\n")
            out += line
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the empty line
                    t = reader.until(b"\r\n")
                    out += t
                    if t == b"\r\n":
                        return bytes(out)
            out += reader.exact(size + 2)
    if "content-length" in headers:
        return reader.exact(int(headers["content-length"]))
    return None


class FaultProxy:
    def __init__(self, upstream_port, upstream_host="127.0.0.1", stall_seconds=30.0,
                 trickle_bytes=4, trickle_interval=0.25, truncate_side="auto", methods=None,
                 paths=None):
        self.upstream = (upstream_host, upstream_port)
        self._defaults = {"stall_seconds": stall_seconds, "trickle_bytes": trickle_bytes,
                       "trickle_interval": trickle_interval,
                       "truncate_side": truncate_side, "methods": methods, "paths": paths}
        self.params = dict(self._defaults)
        self.mode = "pass"
        self._lock = threading.Lock()
        self._counts = collections.Counter()
        self._waits = collections.defaultdict(list)  # kind → seconds a client waited
        self._closing = threading.Event()
        self._conns = set()  # open client and upstream sockets
        self._threads = set()
        self._listening = False
        self._sock = self._bound(0)
        self.port = self._sock.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._accept_thread = None

    # --- control -------------------------------------------------------------------------

    def start(self):
        self._sock.listen(128)
        self._listening = True
        self._accept_thread = threading.Thread(target=self._accept_loop, name="faultproxy",
                                               daemon=True)
        self._accept_thread.start()
        return self

    def set_mode(self, mode, **params):
        """Switches to `mode`; `params` override the constructor's for this mode."""
        assert mode in MODES, mode
        unknown = set(params) - set(self._defaults)
        assert not unknown, unknown
        with self._lock:
            self.params = dict(self._defaults, **params)
            self.mode = mode
            self._counts[f"mode_{mode}"] += 1
        if mode == "refuse":
            # The accept loop closes the listener; wait until connects are refused.
            deadline = time.monotonic() + 5
            while self._listening and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not self._listening, "the listener did not close"
        elif mode != "refuse" and not self._listening:
            deadline = time.monotonic() + 5
            while not self._listening and time.monotonic() < deadline:
                time.sleep(0.01)
            assert self._listening, "the listener did not reopen"

    def stats(self):
        """Counters: connections, requests, forwarded, and one per fault injected; plus
        `<kind>_client_waits`: how long clients waited before giving up on a stalled or
        trickled answer (seconds)."""
        with self._lock:
            out = dict(self._counts)
            for kind, waits in self._waits.items():
                out[f"{kind}_client_waits"] = [round(w, 2) for w in waits]
            return out

    def stop(self):
        self._closing.set()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=10)
        _close(self._sock)
        with self._lock:
            conns = list(self._conns)
            threads = list(self._threads)
        for s in conns:
            _close(s)
        for t in threads:
            t.join(timeout=10)
        alive = [t.name for t in threads if t.is_alive()]
        assert not alive, f"proxy threads still running: {alive}"

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # --- internals -----------------------------------------------------------------------

    def _count(self, key, n=1):
        with self._lock:
            self._counts[key] += n

    def _bound(self, port):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        return s

    def _track(self, sock):
        with self._lock:
            self._conns.add(sock)

    def _untrack(self, sock):
        with self._lock:
            self._conns.discard(sock)

    def _accept_loop(self):
        while not self._closing.is_set():
            mode = self.mode
            if mode == "refuse" and self._listening:
                # Closing the listener refuses new connects; the bound socket keeps the port.
                _close(self._sock)
                self._sock = self._bound(self.port)
                self._listening = False
            elif mode != "refuse" and not self._listening:
                self._sock.listen(128)
                self._listening = True
            if not self._listening:
                time.sleep(0.01)
                continue
            try:
                ready, _, _ = select.select([self._sock], [], [], TICK)
                if not ready:
                    continue
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self._count("connections")
            if self.mode == "reset":
                self._count("reset")
                _rst(conn)
                continue
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                 name=f"faultproxy-conn-{self._counts['connections']}")
            with self._lock:
                self._threads.add(t)
            t.start()

    def _serve(self, conn):
        self._track(conn)
        up = None
        up_reader = None
        try:
            def abort_idle():
                # While no request has begun, a refuse/reset mode kills the connection.
                return self._closing.is_set() or (
                    client.idle() and self.mode in ("refuse", "reset"))
            client = _Reader(conn, abort_idle)
            while True:
                head = client.until(b"\r\n\r\n")
                mode = self.mode
                if mode in ("refuse", "reset"):
                    self._count("reset")
                    _rst(conn)
                    return
                start, headers = _parse_head(head)
                method = start[0].upper()
                if mode != "pass" and not self._targeted(method, start[1]):
                    mode = "pass"
                if headers.get("expect", "").lower() == "100-continue":
                    self._count("expect_continue")
                    conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = _read_body(client, headers) or b""
                self._count("requests")
                client_close = headers.get("connection", "").lower() == "close"
                if mode == "http503":
                    self._count("http503")
                    self._answer_503(conn, method)
                    if client_close:
                        return
                    continue
                if mode == "stall":
                    self._count("stalled")
                    if not self._stall(conn):
                        return
                cut = mode == "truncate"
                if up is None:
                    up = socket.create_connection(self.upstream, timeout=10)
                    self._track(up)
                    up_reader = _Reader(up, self._closing.is_set)
                if cut and body and self.params["truncate_side"] != "response":
                    self._count("truncated_uploads")
                    up.sendall(head + body[:len(body) // 2])
                    return
                up.sendall(head + body)
                self._count("forwarded")
                rhead, rbody, up_close = self._response(up_reader, method)
                if cut:
                    self._count("truncated_responses")
                    if rbody:
                        conn.sendall(rhead + rbody[:len(rbody) // 2])
                    else:
                        conn.sendall(rhead[:len(rhead) // 2])
                    return
                if mode == "trickle" and self.mode == "trickle":
                    self._count("trickled")
                    if not self._trickle(conn, rhead + rbody):
                        return
                else:
                    conn.sendall(rhead + rbody)
                if up_close:
                    return
                if client_close:
                    return
        except (_Gone, OSError, ValueError):
            if not self._closing.is_set() and self.mode in ("refuse", "reset"):
                self._count("reset")
                _rst(conn)
            return
        finally:
            self._untrack(conn)
            _close(conn)
            if up is not None:
                self._untrack(up)
                _close(up)
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _targeted(self, method, target):
        methods, paths = self.params["methods"], self.params["paths"]
        return ((methods is None or method in methods)
                and (paths is None or re.search(paths, target) is not None))

    def _response(self, reader, method):
        """(head, body, close after it) of the next final response from upstream."""
        while True:
            head = reader.until(b"\r\n\r\n")
            start, headers = _parse_head(head)
            status = int(start[1])
            if 100 <= status < 200:
                continue  # interim (100 Continue): the client already got ours
            break
        close = headers.get("connection", "").lower() == "close"
        if method == "HEAD" or status in (204, 304):
            return head, b"", close
        body = _read_body(reader, headers)
        if body is None:
            return head, reader.to_eof(), True
        return head, body, close

    def _answer_503(self, conn, method):
        rid = f"{self._counts['http503']:016X}"
        xml = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
               '<Message>Please reduce your request rate.</Message>'
               f'<RequestId>{rid}</RequestId></Error>').encode()
        body = b"" if method == "HEAD" else xml
        head = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(body)}\r\nx-amz-request-id: {rid}\r\n"
                "Retry-After: 1\r\n\r\n").encode()
        conn.sendall(head + body)

    def _client_gone(self, conn):
        """True when the client closed its side (it never sends more while awaiting an
        answer: no pipelining)."""
        try:
            ready, _, _ = select.select([conn], [], [], 0)
            if not ready:
                return False
            return conn.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _stall(self, conn):
        """Holds a request; False when the client gave up (or the proxy stops)."""
        began = time.monotonic()
        while time.monotonic() - began < self.params["stall_seconds"] and self.mode == "stall":
            if self._closing.is_set():
                return False
            if self._client_gone(conn):
                with self._lock:
                    self._counts["stall_abandoned"] += 1
                    self._waits["stall"].append(time.monotonic() - began)
                return False
            time.sleep(TICK)
        self._count("stall_released")
        return True

    def _trickle(self, conn, data):
        """Sends `data` a few bytes at a time; False when the client gave up."""
        began = time.monotonic()
        pos = 0
        while pos < len(data):
            if self._closing.is_set():
                return False
            gone = self._client_gone(conn)
            if not gone:
                if self.mode != "trickle":
                    try:
                        conn.sendall(data[pos:])
                        return True
                    except OSError:
                        gone = True
                else:
                    n = self.params["trickle_bytes"]
                    try:
                        conn.sendall(data[pos:pos + n])
                        pos += n
                    except OSError:
                        gone = True
            if gone:
                with self._lock:
                    self._counts["trickle_abandoned"] += 1
                    self._waits["trickle"].append(time.monotonic() - began)
                return False
            time.sleep(self.params["trickle_interval"])
        return True
