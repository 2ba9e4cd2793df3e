"""Hostile names and hostile HTTP clients (issue 20, "Names, on the admin API and the binary
protocol alike"), against one running service:

- a name Pulsar's rules refuse (NUL and other control characters; for tenants and namespaces
  anything outside `[-=:.\\w]`; a `/` inside a segment) is refused: 400 (or Pulsar's 412) on the
  admin API, an ERROR / failed lookup on the binary protocol; never a crash;
- `..`, encoded `/` (`%2F`), over-long and non-UTF-8 segments never cause a 5xx, never close a
  Pulsar connection whose frame was valid, and never reach a path outside the topic's own on
  disk or in the lake (checked last, over the whole data directory);
- a body over the size limit is refused with 413 before it is read;
- a slow-loris client (request head trickled a byte at a time) is disconnected in bounded time.

Requests are written on raw sockets so that every byte of the request target is exactly the one
under test (urllib would refuse or re-quote some). The official Python client runs in a child
process (a client that crashes on a hostile name cannot take the test run with it), through a
recording TCP relay that tells which names it actually sent to the service.
"""
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import warnings

import pulsar
from rawpulsar import (ERROR, LOOKUP, LOOKUP_RESPONSE, PARTITIONED_METADATA,
                       PARTITIONED_METADATA_RESPONSE, PRODUCER, SUBSCRIBE, RawPulsar,
                       fb as _fb, fv as _fv)

MARKER = "llesc"  # part of every traversal payload; no file or directory may be named after it
TENANT_BODY = b'{"adminRoles":[],"allowedClusters":["standalone"]}'

# The request-body limit: `server.max_request_body`, 2 MiB by default. A body twice that must
# be refused.
BODY_LIMIT = 2 * 1024 * 1024
# `server.http_header_read_timeout` is 30 s by default.
SLOW_LORIS_BOUND = 40


# ---------------------------------------------------------------------------------------------
# HTTP on raw sockets


def http_raw(svc, method, target, body=b"", headers=(), timeout=30):
    """One request whose request-target is sent byte for byte as given. Returns (status, body
    text); status None when the server closed the connection without an answer."""
    if isinstance(target, str):
        target = target.encode("latin-1")
    head = [method.encode() + b" " + target + b" HTTP/1.1", b"Host: 127.0.0.1",
            b"Connection: close", b"Content-Type: application/json",
            b"Content-Length: %d" % len(body), *headers]
    with socket.create_connection(("127.0.0.1", svc.http_port), timeout=timeout) as s:
        try:
            s.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        except OSError:
            pass  # answered (and closed) before the request was all sent: read what came
        data = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
    return _status(data)


def _status(data):
    m = re.match(rb"HTTP/1\.[01] (\d{3})", data)
    if not m:
        return None, data[:200].decode(errors="replace")
    return int(m.group(1)), data.split(b"\r\n\r\n", 1)[-1].decode(errors="replace")


def health(svc):
    return http_raw(svc, "GET", "/health/ready", timeout=10)[0]


# ---------------------------------------------------------------------------------------------
# The names (as URL path segments, percent-encoded where needed) and what each kind requires

REFUSE = "refused"        # PUT: 400 or 412 (Pulsar answers 412 for invalid names); GET: 400/404/412
NO_5XX = "no 5xx"         # any answer below 500; accepted names are checked on disk at the end

CONTROL = [("NUL", "%00"), ("NUL inside", "a%00b"), ("SOH", "a%01b"), ("LF", "a%0Ab"),
           ("CR", "a%0Db"), ("TAB", "a%09b"), ("ESC", "a%1Bb"), ("DEL", "a%7Fb"),
           ("C1 U+0085", "a%C2%85b")]
PATTERN = [("space", "a%20b"), ("bang", "a!b"), ("star", "a*b"), ("quote", "a%22b"),
           ("less-than", "a%3Cb"), ("backslash", "a%5Cb"), ("percent", "a%25b"),
           ("hash", "a%23b"), ("question", "a%3Fb"), ("e-acute", "caf%C3%A9"),
           ("emoji", "%F0%9F%92%A5")]
SLASH = [("%2F", "a%2Fb"), ("%2f", "a%2fb"), ("lone %2F", "%2F"),
         ("..%2F escape", f"..%2F..%2F..%2F{MARKER}"),
         ("%2e%2e%2f escape", f"%2e%2e%2f%2e%2e%2f{MARKER}")]
DOTDOT = [("..", ".."), (".", "."), ("...", "..."), ("%2E%2E", "%2E%2E"), ("a..b", "a..b"),
          ("..%5C escape", f"..%5C..%5C{MARKER}")]
LONG = [("300 chars", "l" * 300), ("300 mixed case", "Long" * 75), ("5000 chars", "m" * 5000),
        ("70000 chars", "x" * 70000)]
NON_UTF8 = [("%FF", "a%FFb"), ("truncated UTF-8", "a%C3b"), ("overlong dot", "%C0%AE%C0%AE"),
            ("surrogate", "%ED%A0%80"), ("lone continuation", "%80")]

# kind → (requirement for a topic's local name, requirement for a tenant or namespace)
KINDS = {
    "control": (CONTROL, REFUSE, REFUSE),
    "outside the pattern": (PATTERN, NO_5XX, REFUSE),
    "encoded slash": (SLASH, REFUSE, REFUSE),
    "dot segments": (DOTDOT, NO_5XX, NO_5XX),
    "over-long": (LONG, NO_5XX, NO_5XX),
    "non-UTF-8": (NON_UTF8, REFUSE, REFUSE),
}


def _judge(method, requirement, status):
    """None when `status` meets `requirement`, else why not."""
    if status is None:
        return "no answer (connection closed)"
    if status >= 500:
        return f"server error {status}"
    if requirement == REFUSE:
        wanted = (400, 412) if method in ("PUT", "POST") else (400, 404, 412)
        if status not in wanted:
            return f"got {status}, want one of {wanted}"
    return None


def test_admin_api_refuses_or_tolerates_hostile_names(service):
    svc = service
    failures = []

    def attempt(method, path, requirement, what, body=b""):
        status, text = http_raw(svc, method, path, body)
        why = _judge(method, requirement, status)
        if why:
            failures.append(f"{method} {path[:90]}{'…' if len(path) > 90 else ''} [{what}]: "
                            f"{why} {text[:120]!r}")

    for kind, (names, local_rule, part_rule) in KINDS.items():
        for label, seg in names:
            what = f"{kind}: {label}"
            # Tenants.
            attempt("PUT", f"/admin/v2/tenants/{seg}", part_rule, what, TENANT_BODY)
            attempt("GET", f"/admin/v2/tenants/{seg}", part_rule, what)
            # Namespaces: a bad namespace in a good tenant, a bad tenant.
            attempt("PUT", f"/admin/v2/namespaces/public/{seg}", part_rule, what)
            attempt("GET", f"/admin/v2/namespaces/public/{seg}", part_rule, what)
            attempt("PUT", f"/admin/v2/namespaces/{seg}/ns", part_rule, what)
            attempt("GET", f"/admin/v2/namespaces/{seg}/ns", part_rule, what)
            # Topics: bad local name, bad tenant, bad namespace.
            attempt("PUT", f"/admin/v2/persistent/public/default/{seg}", local_rule, what)
            attempt("GET", f"/admin/v2/persistent/public/default/{seg}/stats", local_rule, what)
            attempt("GET", f"/admin/v2/persistent/public/default/{seg}/internalStats",
                    local_rule, what)
            attempt("PUT", f"/admin/v2/persistent/{seg}/default/t", part_rule, what)
            attempt("PUT", f"/admin/v2/persistent/public/{seg}/t", part_rule, what)
            # Partitioned topics.
            attempt("PUT", f"/admin/v2/persistent/public/default/{seg}/partitions", local_rule,
                    what, b"2")
            attempt("GET", f"/admin/v2/persistent/public/default/{seg}/partitions", local_rule,
                    what)
            attempt("GET", f"/admin/v2/persistent/public/{seg}/t/partitions", part_rule, what)
        assert health(svc) == 200, f"service unhealthy after the {kind} names"
    assert not failures, f"{len(failures)} admin requests broke the rules:\n" + "\n".join(
        failures[:80])


def test_admin_api_raw_request_targets_get_client_errors(service):
    """Bytes no URL may hold, dot segments the router sees unresolved, and a huge target: a 4xx
    (or, for an unparseable request line, a close), never a 5xx, and the service answers on."""
    svc = service
    failures = []
    for target in [b"/admin/v2/tenants/a\x00b", b"/admin/v2/tenants/a\x01b",
                   b"/admin/v2/tenants/a\xffb", b"/admin/v2/persistent/public/default/a\x7fb",
                   f"/admin/v2/tenants/../../../{MARKER}".encode(),
                   f"/admin/v2/persistent/public/default/../../../../{MARKER}".encode(),
                   f"/admin/v2/persistent/public/default/..%2F..%2F{MARKER}/partitions".encode(),
                   b"//admin/v2/tenants/x",
                   f"http://127.0.0.1/admin/v2/tenants/..%2f{MARKER}".encode(),
                   b"/admin/v2/tenants/" + b"y" * 100_000]:
        status, text = http_raw(svc, "PUT", target, TENANT_BODY)
        raw_bytes = any(b < 0x20 or b >= 0x7f for b in target)
        if status is None and raw_bytes:
            continue
        if status is None or not 400 <= status < 500:
            failures.append(f"PUT {target[:80]!r}: {status} {text[:120]!r}")
    assert health(svc) == 200
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------------
# The Pulsar binary protocol, hand-encoded (`rawpulsar`)

def _outcome(kind, fields):
    """'accepted', 'refused (…)' or 'closed' for one answer."""
    if kind in ("closed", "timeout"):
        return kind
    if kind == ERROR:
        return f"refused ({fields.get(2, ['?'])[0]}: {fields.get(3, [b''])[0][:80]!r})"
    if kind == LOOKUP_RESPONSE and fields.get(3) == [2]:
        return f"refused (lookup failed, error {fields.get(6, ['?'])[0]})"
    if kind == PARTITIONED_METADATA_RESPONSE and fields.get(3) == [1]:
        return f"refused (metadata failed, error {fields.get(4, ['?'])[0]})"
    return "accepted"


PREFIX = b"persistent://public/default/"
BINARY_CASES = [
    # (topic bytes, kind); "refuse": an error answer on an open connection; "non-utf8": an
    # error answer or a closed connection (the frame does not decode); "tolerate": any answer.
    (PREFIX + b"nul\x00x", "refuse"), (PREFIX + b"soh\x01x", "refuse"),
    (PREFIX + b"lf\nx", "refuse"), (PREFIX + b"del\x7fx", "refuse"),
    (PREFIX + b"c1\xc2\x85x", "refuse"), (b"persistent://ten\x00ant/default/x", "refuse"),
    (b"persistent://public/n\x1bs/x", "refuse"), (b"persistent://sp ace/default/x", "refuse"),
    (b"persistent://public/caf\xc3\xa9/x", "refuse"), (PREFIX + b"a/b", "refuse"),
    (PREFIX + b"../../../" + MARKER.encode(), "refuse"),
    (b"../../../" + MARKER.encode(), "refuse"), (b"file:///etc/passwd", "refuse"),
    (b"http://public/default/x", "refuse"),
    (PREFIX + b"..", "tolerate"), (b"..", "tolerate"), (PREFIX + b"a..b", "tolerate"),
    (PREFIX + b"..\\..\\" + MARKER.encode(), "tolerate"),
    (PREFIX + b"r" * 300, "tolerate"), (PREFIX + b"s" * 100_000, "tolerate"),
    (PREFIX + b"\xff", "non-utf8"), (PREFIX + b"a\xc3", "non-utf8"),
    (b"persistent://\xc0\xae\xc0\xae/default/x", "non-utf8"),
    (PREFIX + b"\xed\xa0\x80", "non-utf8"),
]


def test_binary_protocol_refuses_or_tolerates_hostile_topic_names(service):
    svc = service
    failures, closes, seen = [], [], []
    conn = RawPulsar(svc.pulsar_port)
    rid = 0
    for topic, kind in BINARY_CASES:
        for name, make in [
            ("PARTITIONED_METADATA", lambda r: (PARTITIONED_METADATA, _fb(1, topic) + _fv(2, r))),
            ("LOOKUP", lambda r: (LOOKUP, _fb(1, topic) + _fv(2, r))),
            ("PRODUCER", lambda r: (PRODUCER, _fb(1, topic) + _fv(2, r) + _fv(3, r))),
            ("SUBSCRIBE", lambda r: (SUBSCRIBE, _fb(1, topic) + _fb(2, b"hostile") + _fv(3, 1)
                                     + _fv(4, r) + _fv(5, r))),
        ]:
            rid += 1
            got, fields = conn.request(*make(rid), rid)
            outcome = _outcome(got, fields)
            shown = f"{name} {topic[:70]!r}{'…' if len(topic) > 70 else ''}"
            if name in ("PARTITIONED_METADATA", "PRODUCER"):
                seen.append(f"{shown}: {outcome}")
            if outcome in ("closed", "timeout"):
                if outcome == "closed":
                    closes.append(shown)
                conn.close()
                conn = RawPulsar(svc.pulsar_port)  # the service must still accept connections
            if outcome == "timeout":
                failures.append(f"{shown}: no answer within 20 s")
            elif kind == "refuse" and not outcome.startswith("refused"):
                failures.append(f"{shown}: {outcome}, want an error answer")
            elif kind == "tolerate" and outcome == "closed":
                failures.append(f"{shown}: connection closed on a well-formed frame")
            elif kind == "non-utf8" and outcome == "accepted":
                failures.append(f"{shown}: accepted a non-UTF-8 name")
    conn.close()
    warnings.warn("binary protocol answers:\n" + "\n".join(seen))
    if closes:
        warnings.warn("binary protocol: connections closed by the service (non-UTF-8 frames are "
                      "allowed to): " + "; ".join(closes))
    assert health(svc) == 200
    assert not failures, f"{len(failures)} binary-protocol requests broke the rules:\n" + \
        "\n".join(failures)


# ---------------------------------------------------------------------------------------------
# The official Python client, through a recording relay


class Relay:
    """A TCP relay to the service's Pulsar port that records what clients send."""

    def __init__(self, port):
        self.port = port
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.url = f"pulsar://127.0.0.1:{self.server.getsockname()[1]}"
        self.sent = bytearray()
        self.lock = threading.Lock()
        self.sockets = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.server.accept()
                upstream = socket.create_connection(("127.0.0.1", self.port))
            except OSError:
                return
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False),
                             daemon=True).start()

    def _pump(self, src, dst, record):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if record:
                    with self.lock:
                        self.sent += data
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def take(self):
        with self.lock:
            data, self.sent = bytes(self.sent), bytearray()
        return data

    def close(self):
        self.server.close()
        for s in self.sockets:
            s.close()


def client_attempts(url, topics):
    """Run in a child process: for each topic, create a producer (then send one message) and a
    consumer; prints one JSON line per attempt: [topic, what, error or null]."""
    client = pulsar.Client(url, operation_timeout_seconds=5)
    for topic in topics:
        for what in ("producer", "consumer"):
            print(json.dumps([topic, what, "start", None]), flush=True)
            try:
                if what == "producer":
                    p = client.create_producer(topic)
                    p.send(b"hostile")
                    p.close()
                else:
                    client.subscribe(topic, "hostile").close()
                error = None
            except Exception as e:  # recorded: the parent judges
                error = f"{type(e).__name__}: {e}"
            print(json.dumps([topic, what, "done", error]), flush=True)
    client.close()


CLIENT_CASES = [
    # (topic, needle identifying it in the relayed bytes, must be refused)
    ("persistent://public/default/nul\x00x", "nul\x00x", True),
    ("persistent://public/default/soh\x01x", "soh\x01x", True),
    ("persistent://public/default/lf\nx", "lf\nx", True),
    ("persistent://public/default/del\x7fx", "del\x7fx", True),
    ("persistent://ten\x00ant/default/x", "ten\x00ant", True),
    ("persistent://sp ace/default/x", "sp ace", True),
    ("persistent://public/caf\u00e9/x", "caf\u00e9", True),
    ("persistent://public/default/a/b", "default/a/b", True),
    (f"persistent://public/default/../../{MARKER}", f"../../{MARKER}", True),
    ("persistent://public/default/..", "default/..", False),
    ("persistent://public/default/c..d", "c..d", False),
    ("persistent://public/default/" + "q" * 300, "q" * 300, False),
]


def test_python_client_with_hostile_topic_names(service):
    """Each hostile name given to the official client: refused (by the client itself or by the
    service) where Pulsar refuses it; which names reach the service is reported as a warning."""
    svc = service
    relay = Relay(svc.pulsar_port)
    here = os.path.dirname(os.path.abspath(__file__))
    script = ("import sys, json; sys.path.insert(0, sys.argv[1]);"
              "from test_hostile_names import client_attempts;"
              "client_attempts(sys.argv[2], json.loads(sys.argv[3]))")
    proc = None
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, here, relay.url,
             json.dumps([t for t, _, _ in CLIENT_CASES])],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        watchdog = threading.Timer(300, proc.kill)  # the child gets 300 s in all
        watchdog.start()
        results, reached = {}, {}
        for line in proc.stdout:
            try:
                topic, what, phase, error = json.loads(line)
            except ValueError:
                continue  # the client's own log lines
            sent = relay.take()
            if phase == "done":
                results[(topic, what)] = error
                needle = next(n for t, n, _ in CLIENT_CASES if t == topic)
                reached[(topic, what)] = needle.encode() in sent
        code = proc.wait(timeout=30)
        watchdog.cancel()
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        relay.close()
    failures = []
    lines = []
    for topic, _, must_refuse in CLIENT_CASES:
        for what in ("producer", "consumer"):
            if (topic, what) not in results:
                failures.append(f"{what} {topic[:60]!r}: no result (client exited {code})")
                continue
            error = results[(topic, what)]
            lines.append(f"{what} {topic[:50]!r}: "
                         f"{'reached the service' if reached[(topic, what)] else 'not sent'}, "
                         f"{error or 'created'}")
            if must_refuse and error is None:
                failures.append(f"{what} {topic[:60]!r}: created, want a refusal")
    warnings.warn("official client, hostile topic names:\n" + "\n".join(lines))
    assert code == 0, f"the client process exited {code} (crashed?)"
    assert health(svc) == 200
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------------
# Names the service accepts end up in the lake only as their own table


def _admin_path(topic):
    return "/admin/v2/persistent/" + topic.split("://", 1)[1]


def test_accepted_odd_names_reach_only_their_own_lake_table(service):
    """Topics whose names the service accepts (dot segments, over-long names) are produced to
    and offloaded: each offload succeeds (or the name was refused up front) and every file lands
    under the warehouse's encoded table directory (checked by the last test)."""
    svc = service
    setup = [("PUT", "/admin/v2/tenants/..", TENANT_BODY), ("PUT", "/admin/v2/namespaces/../..", b""),
             ("PUT", "/admin/v2/namespaces/public/" + "n" * 260, b"")]
    created = {}
    for method, path, body in setup:
        status, text = http_raw(svc, method, path, body)
        assert status is not None and status < 500, (path[:80], status, text[:200])
        created[path] = status in (204, 409)
    # Names the admin test above left alone (it made some of its names partitioned).
    topics = ["persistent://public/default/.....", "persistent://public/default/b..c",
              "persistent://public/default/" + "Lo" * 150,
              "persistent://public/default/" + "z" * 300]
    if created["/admin/v2/namespaces/../.."]:
        topics.append("persistent://../../..")
    if created["/admin/v2/namespaces/public/" + "n" * 260]:
        topics.append("persistent://public/" + "n" * 260 + "/x")
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    produced, failures = [], []
    try:
        for topic in topics:
            try:
                producer = client.create_producer(topic, batching_enabled=False)
            except pulsar.PulsarException as e:
                warnings.warn(f"{topic[:60]!r} refused by the client or the service: {e}")
                continue
            for i in range(3):
                producer.send(f"odd-{i}".encode())
            producer.close()
            produced.append(topic)
    finally:
        client.close()
    tickets = {}
    for topic in produced:
        status, text = http_raw(svc, "PUT", _admin_path(topic) + "/offload")
        if status != 200:
            failures.append(f"offload of {topic[:60]!r}: {status} {text[:160]!r}")
            continue
        tickets[topic] = json.loads(text)["request"]
    deadline = time.time() + 120
    pending = dict(tickets)
    while pending and time.time() < deadline:
        for topic, ticket in list(pending.items()):
            status, text = http_raw(svc, "GET", _admin_path(topic) + "/offload")
            if status is None or status >= 500:
                failures.append(f"offload status of {topic[:60]!r}: {status} {text[:160]!r}")
                del pending[topic]
                continue
            s = json.loads(text)
            if s.get("completedRequest", 0) >= ticket:
                if s.get("status") == "ERROR":
                    failures.append(f"offload of {topic[:60]!r} (len {len(topic)}) failed: "
                                    f"…{str(s.get('lastError'))[-240:]}")
                del pending[topic]
        time.sleep(0.2)
    failures += [f"offload of {t[:60]!r} not done in 120 s" for t in pending]
    assert health(svc) == 200
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------------
# Bodies over the limit


def test_body_over_the_limit_is_refused_with_413(service):
    """A whole body over the limit, sent while the answer is read."""
    svc = service
    body = b" " * (2 * BODY_LIMIT)
    for method, path in [("PUT", "/admin/v2/tenants/bodylimit"), ("POST", "/sql"),
                         ("PUT", "/admin/v2/persistent/public/default/bodylimit/partitions")]:
        sock = socket.create_connection(("127.0.0.1", svc.http_port), timeout=30)
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()

        def write():
            try:
                sock.sendall(head + body)
            except OSError:
                pass
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        data = b""
        try:
            while b"\r\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        sock.close()
        writer.join(timeout=30)
        status, text = _status(data)
        assert status == 413, (method, path, status, text)
    assert health(svc) == 200


def test_body_over_the_limit_is_refused_before_it_is_read(service):
    """Only the head of a request announcing a 1 GiB body is sent: the answer must be 413 at
    once (with and without `Expect: 100-continue`), not a wait for the body."""
    svc = service
    failures = []
    for extra in [b"", b"Expect: 100-continue\r\n"]:
        for method, path in [("PUT", "/admin/v2/tenants/bodylimit2"), ("POST", "/sql")]:
            with socket.create_connection(("127.0.0.1", svc.http_port), timeout=10) as sock:
                sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() + extra
                             + b"Content-Type: application/json\r\n"
                             + b"Content-Length: 1073741824\r\n\r\n" + b" " * 1024)
                data = b""
                started = time.time()
                try:
                    while b"\r\n" not in data:
                        chunk = sock.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                except socket.timeout:
                    pass
                status, text = _status(data)
                if status == 100:  # "go ahead and send 1 GiB": the body would be read
                    failures.append(f"{method} {path} {extra!r}: 100 Continue, want 413")
                elif status != 413:
                    failures.append(f"{method} {path} {extra!r}: {status or 'no answer'} after "
                                    f"{time.time() - started:.1f} s, want 413 before the body")
    assert health(svc) == 200
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------------
# Slow loris


def test_slow_loris_client_is_disconnected(service):
    """A request head trickled one byte a second: the server must close the connection (with or
    without a 408) within SLOW_LORIS_BOUND seconds, and answer others meanwhile."""
    svc = service
    sock = socket.create_connection(("127.0.0.1", svc.http_port), timeout=5)
    sock.settimeout(1)
    started = time.time()
    closed_after = None
    try:
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        while time.time() - started < SLOW_LORIS_BOUND + 5:
            try:
                sock.sendall(b"a")
            except OSError:
                closed_after = time.time() - started
                break
            try:
                if sock.recv(4096) == b"":
                    closed_after = time.time() - started
                    break
                # An answer (408) before the close counts as the close that follows it.
                closed_after = time.time() - started
                break
            except socket.timeout:
                pass
            except OSError:
                closed_after = time.time() - started
                break
            if int(time.time() - started) % 10 == 0:
                assert health(svc) == 200, "the service stopped answering during the slow loris"
    finally:
        sock.close()
    assert closed_after is not None and closed_after <= SLOW_LORIS_BOUND, (
        f"a client trickling its request head was still connected after "
        f"{time.time() - started:.0f} s (bound {SLOW_LORIS_BOUND} s)")


# ---------------------------------------------------------------------------------------------
# After all of the above


def test_service_healthy_and_nothing_escaped_the_data_dir(service):
    svc = service
    assert health(svc) == 200
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    try:
        consumer = client.subscribe("persistent://public/default/after-hostile", "s",
                                    initial_position=pulsar.InitialPosition.Earliest)
        client.create_producer("persistent://public/default/after-hostile").send(b"still here")
        assert consumer.receive(timeout_millis=10000).data() == b"still here"
    finally:
        client.close()

    root = svc.data_dir  # the service's own temporary directory: serve.log and data/
    data = os.path.join(root, "data")
    assert sorted(os.listdir(root)) == ["data", "serve.log"], os.listdir(root)
    # Nothing named after a traversal payload next to the service's directory or above it.
    for outside in [os.path.dirname(root), os.path.dirname(os.path.dirname(root))]:
        escaped = [e for e in os.listdir(outside) if MARKER in e]
        assert not escaped, f"{outside} holds {escaped}"
    warehouse = os.path.join(data, "warehouse")
    real_data = os.path.realpath(data)
    bad = []
    for dirpath, dirnames, filenames in os.walk(data):
        for entry in dirnames + filenames:
            path = os.path.join(dirpath, entry)
            rel = os.path.relpath(path, data)
            if not os.path.realpath(path).startswith(real_data + os.sep):
                bad.append(f"{rel}: resolves outside the data dir")
            if ".." in entry or any(ord(c) < 0x20 or c == "\x7f" for c in entry):
                bad.append(f"{rel!r}: dot segments or control characters in a name")
            try:
                entry.encode("utf-8")
            except UnicodeEncodeError:
                bad.append(f"{rel!r}: a name that is not UTF-8")
            if MARKER in entry and not (path.startswith(warehouse + os.sep)
                                        and re.fullmatch(r"[a-z0-9_]+", entry)):
                bad.append(f"{rel!r}: named after a traversal payload")
    # Warehouse levels 1-3 (tenant, namespace, table) are encoded identifiers.
    if os.path.isdir(warehouse):
        for dirpath, dirnames, _ in os.walk(warehouse):
            depth = os.path.relpath(dirpath, warehouse).count(os.sep) + (dirpath != warehouse)
            if depth < 3:
                for d in dirnames:
                    if not re.fullmatch(r"[a-z0-9_]{1,255}", d):
                        bad.append(f"warehouse/{os.path.relpath(os.path.join(dirpath, d), warehouse)}"
                                   f": not an encoded identifier")
    assert not bad, "\n".join(bad[:50])
    log = open(svc.log_path, errors="replace").read()
    assert "panicked" not in log, [l for l in log.splitlines() if "panicked" in l][:5]
