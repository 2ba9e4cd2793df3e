"""Hostile Pulsar clients (issue 20, "Pulsar protocol"), against one service, while a
well-behaved producer and consumer (the official client) keep working:

1. 10,000 connections opened and abandoned (half never say a word, half CONNECT and never read
   an answer; a quarter of them also send the header of a 5 MiB frame and nothing more);
2. producers that never read their receipts (raw connections that SEND until the service stops
   reading them);
3. consumers that grant permits and never read (on their own subscriptions and beside the good
   consumer on its Shared subscription), consumers that never grant permits, and one that reads
   slowly (its messages must arrive complete and in order);
4. oversized SENDs, malformed batches, a frame larger than any allowed, and garbage bytes.

Each must cost its own connection at most: the good producer's every send is acknowledged, the
good consumer receives everything exactly once, memory stays bounded (the service's peak RSS is
reported and held under a generous bound), and `verify --deep` finds the lake and the log equal
after an offload. Latency is reported (p99 of the good producer in each phase), not asserted.
"""
import os
import resource
import socket
import struct
import threading
import time
import uuid

import pulsar

from conftest import eventually, verify_clean
from rawpulsar import (CONNECT, EXCLUSIVE, FLOW, MESSAGE, PING, PONG, PRODUCER, SEND,
                       SEND_ERROR, SEND_RECEIPT, SHARED, SUBSCRIBE, RawPulsar, connect_body, fb,
                       frame, fv, message, parse, send_frame)
from test_lake_faults import ENV, figures, keep_log, offload_everything

CONNECTIONS = 10_000
UNREAD_PRODUCERS = 8
BIG = 64 * 1024          # bytes of each message on the stuck consumers' topic
BIG_COUNT = 1500
STUCK_SUBSCRIPTIONS = 8  # one stuck Exclusive consumer each
STUCK_SHARED = 4         # stuck consumers beside the good one on its Shared subscription
# The service's peak RSS may not exceed this (a debug build; the stuck consumers' topic alone is
# ~94 MiB, which each stuck subscription would otherwise hold up to in its connection's queue).
RSS_BOUND_MIB = 1024
# ... and may not grow by more than this while the stuck consumers hold their share of it.
STUCK_GROWTH_BOUND_MIB = 256


def rss_mib(svc):
    """(current, peak) resident set of the service, MiB."""
    fields = {}
    with open(f"/proc/{svc.proc.pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def p99(latencies):
    ordered = sorted(latencies)
    return round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 1) if ordered else None


def timed_sends(producer, n, tag):
    """`n` asynchronous sends; every one must be acknowledged. Returns (payloads, latencies)."""
    done = threading.Semaphore(0)
    latencies, errors = [], []

    def callback(started):
        def cb(res, _mid):
            if res == pulsar.Result.Ok:
                latencies.append(time.monotonic() - started)
            else:
                errors.append(str(res))
            done.release()
        return cb
    payloads = []
    for i in range(n):
        payload = f"{tag}-{i}".encode()
        payloads.append(payload)
        producer.send_async(payload, callback(time.monotonic()))
        if i % 50 == 49:
            time.sleep(0.01)  # ~ a steady rate, not one burst
    for _ in range(n):
        assert done.acquire(timeout=120), "a send was never answered"
    assert not errors, errors[:5]
    return payloads, latencies


class Receiver:
    """Receives on a consumer in a thread, acknowledging everything; counts what it got."""

    def __init__(self, consumer):
        self.consumer, self.got, self.stop = consumer, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                m = self.consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            self.got.append(m.data())
            self.consumer.acknowledge(m)

    def close(self):
        self.stop.set()
        self.thread.join(timeout=10)


def at_least(got, n):
    assert len(got) >= n, f"{len(got)} of {n} received"


def close_all(sockets):
    for s in sockets:
        s.close()
    sockets.clear()


def raw_socket(svc):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(20)
    s.connect(("127.0.0.1", svc.pulsar_port))
    return s


def send_until_blocked(sock, frames, quiet=1.0):
    """Writes `frames` without reading until the service stops reading (a write blocked for
    `quiet` seconds) or they run out; returns how many were written whole."""
    sock.setblocking(False)
    sent = 0
    for data in frames:
        view, blocked_since = memoryview(data), None
        while view:
            try:
                view = view[sock.send(view):]
                blocked_since = None
            except BlockingIOError:
                blocked_since = blocked_since or time.monotonic()
                if time.monotonic() - blocked_since > quiet:
                    return sent
                time.sleep(0.01)
        sent += 1
    return sent


def subscribe_raw(svc, topic, subscription, sub_type, consumer_id, permits):
    """A consumer on a raw connection that subscribes, grants `permits` (none when 0) and
    never reads again."""
    conn = RawPulsar(svc.pulsar_port, rcvbuf=4096)
    got = conn.request(SUBSCRIBE, fb(1, topic) + fb(2, subscription) + fv(3, sub_type)
                       + fv(4, consumer_id) + fv(5, consumer_id), consumer_id)
    assert got[0] == 13, got  # SUCCESS
    if permits:
        conn.send(FLOW, fv(1, consumer_id) + fv(2, permits))
    return conn


class SlowReader:
    """A raw Exclusive consumer that reads, slowly (its connection keeps going unwritable and
    writable again), and notes the id of every message in arrival order."""

    def __init__(self, svc, topic, subscription, expect):
        self.conn = subscribe_raw(svc, topic, subscription, EXCLUSIVE, 1, 1_000_000)
        self.expect, self.ids, self.error = expect, [], None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            while len(self.ids) < self.expect:
                kind, fields = self.conn.read()
                if kind == PING:
                    self.conn.send(PONG, b"")
                elif kind == MESSAGE:
                    mid = parse(fields[2][0])
                    self.ids.append((mid[1][0], mid[2][0]))
                    if len(self.ids) % 20 == 0:
                        time.sleep(0.01)
        except Exception as e:  # reported by the test
            self.error = e

    def check(self):
        self.thread.join(timeout=120)
        assert self.error is None and len(self.ids) == self.expect, \
            f"{len(self.ids)} of {self.expect} received, then {self.error!r}"
        assert self.ids == sorted(set(self.ids)), "an Exclusive consumer got messages out of order"
        self.conn.close()


def enough_descriptors(n):
    """Raises this process's open-file limit (which the service inherits) to hold `n`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        assert hard == resource.RLIM_INFINITY or hard >= n, \
            f"the open-file limit ({hard}) cannot hold {n} connections"
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))


def test_hostile_pulsar_clients(make_service):
    enough_descriptors(CONNECTIONS + 2_000)
    svc = make_service(dict(ENV, LEDGERLAKE_LEDGER__ROLLOVER_ENTRIES="500"))
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=60,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    suffix = uuid.uuid4().hex[:6]
    good = f"persistent://public/default/flood-good-{suffix}"
    big = f"persistent://public/default/flood-big-{suffix}"
    bad = f"persistent://public/default/flood-bad-{suffix}"
    unread = f"persistent://public/default/flood-unread-{suffix}"
    producer = client.create_producer(good, batching_enabled=False, send_timeout_millis=0,
                                      block_if_queue_full=True, max_pending_messages=2000)
    receiver = Receiver(client.subscribe(good, "good", consumer_type=pulsar.ConsumerType.Shared))
    sent, p99s, rss, seconds, started = [], {}, {}, {}, [time.monotonic()]
    floods = []
    try:
        def measure(phase, n=1000, with_rss=True):
            """The good producer's sends during `phase`: p99 and the service's RSS noted."""
            seconds[phase] = round(time.monotonic() - started[0], 1)
            started[0] = time.monotonic()
            payloads, lat = timed_sends(producer, n, phase)
            sent.extend(payloads)
            p99s[phase] = p99(lat)
            if with_rss:
                rss[phase] = rss_mib(svc)

        measure("baseline")

        # 1. 10,000 connections opened and abandoned.
        hello = frame(CONNECT, connect_body("flood"))
        for i in range(CONNECTIONS):
            s = raw_socket(svc)
            if i % 2:
                s.sendall(hello)
            if i % 4 == 1:
                # A header announcing a 5 MiB frame, and nothing more.
                s.sendall(struct.pack(">II", 5 * 1024 * 1024, 100))
            floods.append(s)
        measure("10k_connections")
        close_all(floods)

        # 2. Producers that never read their receipts (on a topic of their own: the good
        # consumer is not made to read the ~90,000 messages each writes before it is stopped).
        blasted = []
        for pid in range(1, UNREAD_PRODUCERS + 1):
            conn = RawPulsar(svc.pulsar_port, rcvbuf=4096)
            got = conn.request(PRODUCER, fb(1, unread) + fv(2, pid) + fv(3, pid), pid)
            assert got[0] == 17, got  # PRODUCER_SUCCESS
            name = got[1][2][0]
            frames = (send_frame(pid, seq, message(name, seq, b"r" * 1024))
                      for seq in range(200_000))
            blasted.append(send_until_blocked(conn.sock, frames, quiet=0.5))
            floods.append(conn.sock)
        measure("unread_receipts")
        close_all(floods)

        # 3. Consumers that never read (with permits) or never grant permits.
        stuck = [subscribe_raw(svc, big, f"stuck-{i}", EXCLUSIVE, 1, 1_000_000)
                 for i in range(STUCK_SUBSCRIPTIONS)]
        shared = Receiver(client.subscribe(big, "work", consumer_type=pulsar.ConsumerType.Shared))
        stuck += [subscribe_raw(svc, big, "work", SHARED, 100 + i, 1_000_000)
                  for i in range(STUCK_SHARED)]
        stuck += [subscribe_raw(svc, big, "work", SHARED, 200 + i, 0) for i in range(4)]
        slow = SlowReader(svc, big, "slow", BIG_COUNT)
        big_producer = client.create_producer(big, batching_enabled=False,
                                              block_if_queue_full=True)
        body = os.urandom(BIG)
        for i in range(BIG_COUNT):
            big_producer.send_async(i.to_bytes(4, "big") + body, lambda res, _mid: None)
        big_producer.flush()
        measure("stuck_consumers", with_rss=False)

        # Stuck consumers hold what their sockets and queues took; the rest reaches the good one.
        eventually(lambda: at_least(shared.got, BIG_COUNT // 2), timeout=120, interval=0.5)
        time.sleep(2)
        rss["stuck_consumers"] = rss_mib(svc)
        while_stuck = len(shared.got)
        for conn in stuck:
            conn.close()
        eventually(lambda: at_least(shared.got, BIG_COUNT), timeout=120, interval=0.5)
        assert sorted(shared.got) == sorted(set(shared.got)) and len(shared.got) == BIG_COUNT, \
            f"{len(shared.got)} received, {len(set(shared.got))} distinct, of {BIG_COUNT}"
        slow.check()
        shared.close()

        # 4. Oversized SENDs, malformed batches, an impossible frame, garbage.
        # (On a topic of their own: the official client is not asked to parse them.)
        raw = RawPulsar(svc.pulsar_port)
        got = raw.request(PRODUCER, fb(1, bad) + fv(2, 1) + fv(3, 1), 1)
        assert got[0] == 17, got
        name = got[1][2][0]
        # Over the 5 MiB limit, within the frame's room for metadata: a SEND_ERROR, not a close.
        oversized = b"o" * (5 * 1024 * 1024 + 1024)
        raw.send(SEND, fv(1, 1) + fv(2, 1), message(name, 1, oversized))
        bad_batches = [
            message(name, 2, os.urandom(300), batch=1000),            # garbage records
            message(name, 3, b"\x00\x00\x00\x05\x08", batch=3),        # record cut short
            message(name, 4, b"\xff\xff\xff\xff" + b"x" * 50, batch=1),  # absurd record size
        ]
        for seq, payload in enumerate(bad_batches, start=2):
            raw.send(SEND, fv(1, 1) + fv(2, seq) + fv(3, 3), payload)
        answers = {}
        while len(answers) < 1 + len(bad_batches):
            kind, fields = raw.read()
            if kind in (SEND_RECEIPT, SEND_ERROR):
                answers[fields[2][0]] = kind
        assert answers[1] == SEND_ERROR, answers
        raw.send(SEND, fv(1, 1) + fv(2, 10), message(name, 10, b"after the bad ones"))
        kind, fields = raw.read()
        assert kind == SEND_RECEIPT, (kind, fields)
        raw.close()
        closed = []
        for data in [b"\x7f\xff\xff\xff" + b"\x00" * 64, b"GET / HTTP/1.1\r\n\r\n" * 4,
                     struct.pack(">II", 12, 8) + b"\xff" * 8]:
            s = raw_socket(svc)
            s.sendall(hello + data)
            s.settimeout(20)
            try:
                while s.recv(65536):
                    pass
                closed.append(True)
            except (ConnectionResetError, socket.timeout):
                closed.append(False)
            s.close()
        assert all(closed), closed
        measure("after", n=500, with_rss=False)

        # Everything the good producer sent, exactly once, at the good consumer.
        def all_sent_received():
            missing = set(sent) - set(receiver.got)
            assert not missing, f"{len(missing)} of {len(sent)} not received yet"
        eventually(all_sent_received, timeout=300, interval=0.5)
        assert sorted(receiver.got) == sorted(sent), "the good consumer got duplicates or more"
        _, peak = rss_mib(svc)
        figures("pulsar-floods", connections=CONNECTIONS, p99_ms=p99s, phase_seconds=seconds,
                rss_mib={k: [round(x) for x in v] for k, v in rss.items()},
                peak_rss_mib=round(peak), unread_receipt_sends_written=blasted,
                stuck_consumer_messages=BIG_COUNT, good_shared_received_while_stuck=while_stuck,
                bad_batch_answers={str(k): v for k, v in answers.items()})
        assert peak < RSS_BOUND_MIB, f"peak RSS {peak:.0f} MiB"
        growth = rss["stuck_consumers"][0] - rss["unread_receipts"][0]
        assert growth < STUCK_GROWTH_BOUND_MIB, f"RSS grew {growth:.0f} MiB with stuck consumers"
        offload_everything(svc, good)
        offload_everything(svc, big)
        offload_everything(svc, bad)
        verify_clean(svc, good, big, bad)
    finally:
        close_all(floods)
        receiver.close()
        keep_log(svc, "floods")
        client.close()
