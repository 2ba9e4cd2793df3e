"""A network partition between the owner of a busy topic and etcd (issue 19): three nodes,
default 3/3/2 replication, deduplication on. The owner's only path to etcd goes through a TCP
proxy that the test turns into a black hole (bytes dropped, nothing closed: as a partition
looks). Two cases:
- the owner keeps its path to the other nodes' bookies, the harder case for fencing: it could
  still reach an ack quorum if nothing fenced it;
- the owner is also cut from its peers, both ways: every bookie connection between it and the
  others goes through a proxy of its own (the nodes reach each other's bookies by named
  listeners, `server.bookie_advertised_listeners` / `server.bookie_listener_name`), and those
  proxies black-hole too. The old owner's replication stalls at once (no ack quorum); once its
  session expires its bookie leaves the membership, and the new owner fences and recovers the
  open ledger on the two others alone.
Its Pulsar clients still reach the cut-off owner directly in both cases.

It must stop acknowledging within its session's lease; another node takes the topic over,
fences the open ledger on its replicas and goes on; every acknowledged message is read exactly
once, in order, and a message read that was not acknowledged is one whose send failed to the
client (its acknowledgement lost, the write kept): nothing never sent is read."""
import os
import signal
import threading
import time
import urllib.request
import uuid

import pulsar
import pytest

from conftest import _free_port, eventually
from tcpproxy import TcpProxy
from test_cluster_ownership import TTL, _owners, _sql
from test_cluster_replication import _ledgers

ENV = {"LEDGERLAKE_METADATA__SESSION_TTL": TTL, "LEDGERLAKE_LAKE__ENABLED": "false"}


def _node(etcd_url, make_service, bookie_port=None, env=None):
    return make_service(env={**ENV, **(env or {})},
                        args=["--metadata-url", etcd_url,
                              "--bookie-addr", f"127.0.0.1:{bookie_port or _free_port()}"])


class _Sender:
    """Sends `m0`, `m1`, … synchronously on a thread of its own until stopped: `acked` holds
    (body, monotonic time) of each acknowledged send (starting with `first`, sent already),
    `failed` the bodies of sends that failed to the client."""

    def __init__(self, producer, first):
        self.acked, self.failed = [(first, time.monotonic())], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(producer,), daemon=True)
        self._thread.start()

    def _run(self, producer):
        i = 0
        while not self._stop.is_set():
            body = f"m{i}".encode()
            try:
                producer.send(body)
                self.acked.append((body, time.monotonic()))
            except pulsar.PulsarException:
                self.failed.append(body)
            i += 1

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=120)
        assert not self._thread.is_alive()

    def bodies(self):
        return [b for b, _ in self.acked]


def _read_exactly_once(client, topic, sender):
    """Reads `topic` from earliest; checks the history: every acknowledged message exactly
    once, in send order, and anything else read a send whose acknowledgement the client never
    saw (retried, deduplicated). Returns what was read."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    try:
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(timeout_millis=30000).data())
    finally:
        reader.close()
    sent = sender.bodies()
    assert len(got) == len(set(got)), "a message read twice"
    assert [b for b in got if b in set(sent)] == sent
    assert set(got) - set(sent) <= set(sender.failed)
    return got


def _deduplicate(node):
    """Turns deduplication on for namespace public/default (every node sees it)."""
    admin = f"{node.http}/admin/v2/namespaces/public/default/deduplication"
    req = urllib.request.Request(admin, data=b"true", method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 204


def _listeners(name, via=None, advertised=None):
    """Environment of a node that dials bookies by listener `name` and whose bookie the nodes
    dialling by `advertised` reach at `via`'s port."""
    env = {"LEDGERLAKE_SERVER__BOOKIE_LISTENER_NAME": name}
    if via is not None:
        env[f"LEDGERLAKE_SERVER__BOOKIE_ADVERTISED_LISTENERS__{advertised.upper()}"] = \
            f"127.0.0.1:{via.port}"
    return env


def _cluster(etcd, prefix, etcd_proxy, make_service, cut_peers):
    """Three nodes, the first reaching etcd through `etcd_proxy`; with `cut_peers`, every bookie
    connection between the first node and the others goes through a proxy of its own. Returns
    the nodes and the proxies the test cuts."""
    cut_url = f"etcd://127.0.0.1:{etcd_proxy.port}{prefix}"
    if not cut_peers:
        return ([_node(cut_url, make_service)]
                + [_node(etcd.url(prefix), make_service) for _ in range(2)], [etcd_proxy])
    ports = [_free_port() for _ in range(3)]
    # into_cut: the others' way to the first node's bookie; from_cut: its way to each other's.
    into_cut = TcpProxy(ports[0])
    from_cut = [TcpProxy(p, capture=1 << 20) for p in ports[1:]]
    nodes = [_node(cut_url, make_service, ports[0],
                   _listeners("cut", into_cut, advertised="peers"))]
    nodes += [_node(etcd.url(prefix), make_service, port, _listeners("peers", via, "cut"))
              for port, via in zip(ports[1:], from_cut)]
    return nodes, [etcd_proxy, into_cut, *from_cut]


@pytest.mark.parametrize("cut_peers", [False, True], ids=["etcd-only", "etcd-and-peers"])
def test_an_owner_cut_off_from_etcd_stops_acknowledging_and_loses_nothing(etcd, make_service,
                                                                          cut_peers):
    prefix = f"/partition-{uuid.uuid4().hex[:6]}"
    proxy = TcpProxy(int(etcd.endpoint.rsplit(":", 1)[1]))
    proxies = [proxy]
    try:
        nodes, proxies = _cluster(etcd, prefix, proxy, make_service, cut_peers)
        cut, others = nodes[0], nodes[1:]
        for n in nodes:
            n.start()
        ids = {f"127.0.0.1:{n.http_port}": n for n in nodes}
        sender = None
        client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{n.pulsar_port}"
                                                      for n in nodes),
                               operation_timeout_seconds=60)
        try:
            _deduplicate(others[0])
            # A topic the partitioned node owns.
            for _ in range(40):
                topic = f"persistent://public/default/part-{uuid.uuid4().hex[:6]}"
                producer = client.create_producer(topic, producer_name="partitioned",
                                                  batching_enabled=False,
                                                  send_timeout_millis=60000)
                producer.send(b"probe")
                if ids.get(_owners(etcd, prefix).get(topic)) is cut:
                    break
                producer.close()
            else:
                raise AssertionError("no topic placed on the node to be cut off")
            sender = _Sender(producer, b"probe")
            eventually(lambda: len(sender.acked) >= 50, timeout=30, interval=0.05)
            if cut_peers:
                # The owner's replication to its peers really goes by the proxies (nothing
                # reads from its bookie yet: the peers' side is checked after the cut).
                def through_proxies():
                    assert all(p.forwarded() > 0 for p in proxies[2:]), \
                        [p.forwarded() for p in proxies]
                eventually(through_proxies, timeout=20, interval=0.05)
                # In the clear without server.bookie_tls (test_cluster_tls.py checks the
                # opposite with it).
                assert any(b"probe" in p.captured() for p in proxies[2:])
            for p in proxies:
                p.partition()
            cut_at = time.monotonic()

            # The owner notices within its lease (2/3 of the 3 s TTL without a renewal) and
            # stops serving; another node owns the topic and acknowledges again.
            def gone():
                assert "coordination session ended: serving no topic" in open(cut.log_path).read()
            eventually(gone, timeout=15, interval=0.05)
            stopped_at = time.monotonic()
            assert stopped_at - cut_at < 3.0 + 1.0, stopped_at - cut_at

            def moved():
                owner = ids.get(_owners(etcd, prefix).get(topic))
                assert owner in others, owner
                assert any(t > stopped_at for _, t in sender.acked), "no send acknowledged since"
            eventually(moved, timeout=60, interval=0.1)
            if cut_peers:
                # The old owner's bookie left the membership with its session, so the new owner
                # fenced and recovered on the two others without asking it: nothing was sent to
                # it through the partition but the failure detector's probes (which send no
                # bytes).
                assert not [b for b in proxies[1].sent_into_the_void() if b], \
                    [_first_request_kind(b) for b in proxies[1].sent_into_the_void()]
            time.sleep(1)
            sender.stop()
            got = _read_exactly_once(client, topic, sender)
            # SQL on each node left reads the same messages (the sealed ledger from its copies,
            # the new owner's open ledger from its bookie).
            name = topic.rsplit("/", 1)[1]
            for n in others:
                status, rows = _sql(n, f'SELECT count(*) AS n, count(DISTINCT payload) AS d '
                                       f'FROM "{name}"')
                assert status == 200 and rows == [{"n": len(got), "d": len(got)}], (n.http, rows)
            # The cut-off owner's open ledger was fenced and sealed by the new owner: no ledger
            # of the topic it wrote is open any more.
            records = _ledgers(etcd, prefix)
            assert not [r for r in records.values()
                        if r["state"] == 1 and r["bookie"] == _bookie(cut)], records
        finally:
            if sender is not None:
                sender.stop()
            client.close()
    finally:
        for p in proxies:
            p.stop()


def _first_request_kind(sent):
    """The kind of the first bookie request in `sent` (bytes a client sent on a connection):
    `[u32 length][version 2][kind][u64 id]…`, or None."""
    if len(sent) < 6 or sent[4] != 2:
        return None
    return sent[5]


def _bookie(node):
    with open(os.path.join(node.data_dir, "data", "ledger", "bookie-id")) as f:
        return f.read().split()[-1]


def test_a_short_etcd_outage_costs_no_owner_its_topics(etcd, make_service):
    """etcd frozen (SIGSTOP) for less than the time a node waits before it gives its session
    up (2/3 of the 3 s TTL): owners keep acknowledging on their open ledgers, which need no
    new metadata, nobody loses a session, and when etcd answers again every message is read
    once."""
    prefix = f"/outage-{uuid.uuid4().hex[:6]}"
    nodes = [_node(etcd.url(prefix), make_service) for _ in range(3)]
    for n in nodes:
        n.start()
    topic = f"persistent://public/default/outage-{uuid.uuid4().hex[:6]}"
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{n.pulsar_port}" for n in nodes),
                           operation_timeout_seconds=60)
    try:
        producer = client.create_producer(topic, batching_enabled=False,
                                          send_timeout_millis=30000)
        sent = []
        for i in range(50):
            producer.send(f"a{i}".encode())
            sent.append(f"a{i}".encode())
        etcd.pause()
        frozen = time.monotonic()
        during = 0
        try:
            while time.monotonic() - frozen < 1.2:
                body = f"b{during}".encode()
                producer.send(body)
                sent.append(body)
                during += 1
        finally:
            etcd.resume()
        assert during > 0, "nothing acknowledged while etcd was frozen"
        for i in range(50):
            producer.send(f"c{i}".encode())
            sent.append(f"c{i}".encode())
        for n in nodes:
            assert n.proc.poll() is None, "a node stopped"
            assert "coordination session ended" not in open(n.log_path).read()
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        try:
            got = [reader.read_next(timeout_millis=30000).data() for _ in sent]
            assert got == sent
            assert not reader.has_message_available()
        finally:
            reader.close()
    finally:
        client.close()


def test_an_owner_frozen_past_its_lease_wakes_up_fenced(etcd, make_service):
    """The owner of a busy topic is frozen (SIGSTOP) for longer than its session's lease: its
    sockets stay open, so neither the failure detector (connections are accepted by the
    kernel) nor its clients notice; its session expires, another node takes the idle-looking
    topic over (fences, recovers and seals its open ledger on the replicas) and serves it.
    Then the frozen owner wakes (SIGCONT) with its client's pending send waiting in its socket,
    and may believe for a moment that it still owns the topic. Whatever it does first (append
    the send, save its deduplication snapshot, or notice its session gone), nothing of it
    counts: the replicas refuse its adds and the store its saves, both fenced. It lets its
    client go to the new owner. Every acknowledged message is read exactly once, in order."""
    prefix = f"/frozen-{uuid.uuid4().hex[:6]}"
    nodes = [_node(etcd.url(prefix), make_service) for _ in range(3)]
    for n in nodes:
        n.start()
    ids = {f"127.0.0.1:{n.http_port}": n for n in nodes}
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{n.pulsar_port}" for n in nodes),
                           operation_timeout_seconds=60)
    sender = None
    try:
        _deduplicate(nodes[1])
        topic = f"persistent://public/default/frozen-{uuid.uuid4().hex[:6]}"
        producer = client.create_producer(topic, producer_name="frozen", batching_enabled=False,
                                          send_timeout_millis=60000)
        producer.send(b"first")
        frozen = ids[_owners(etcd, prefix)[topic]]
        sender = _Sender(producer, b"first")
        eventually(lambda: len(sender.acked) >= 50, timeout=30, interval=0.05)
        os.kill(frozen.proc.pid, signal.SIGSTOP)
        try:
            # Its lease (3 s) runs out, another node takes the topic over and has fenced and
            # sealed the frozen node's open ledger before it wakes.
            def taken_over():
                owner = ids.get(_owners(etcd, prefix).get(topic))
                assert owner is not None and owner is not frozen, owner
                still_open = [r for r in _ledgers(etcd, prefix).values()
                              if r["state"] == 1 and r["bookie"] == _bookie(frozen)]
                assert not still_open, still_open
            eventually(taken_over, timeout=30, interval=0.1)
        finally:
            os.kill(frozen.proc.pid, signal.SIGCONT)
        at_wake = len(sender.acked)
        eventually(lambda: len(sender.acked) >= at_wake + 50, timeout=90, interval=0.1)
        sender.stop()
        _read_exactly_once(client, topic, sender)
        with open(frozen.log_path) as f:
            log = f.read()
        assert "coordination session ended" in log, "the frozen node noticed its session gone"
    finally:
        if sender is not None:
            sender.stop()
        client.close()
