"""Broker deduplication (Pulsar semantics) across producer reconnects and broker restarts."""
import signal

import pulsar


def _all(client, topic, n):
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out = [reader.read_next(5000).data() for _ in range(n)]
    assert not reader.has_message_available()
    return out


def test_dedup_across_reconnect_and_restarts(dedup_service):
    svc = dedup_service
    svc.start()
    topic = "persistent://public/default/dedup"
    client = pulsar.Client(svc.url, operation_timeout_seconds=20)
    p = client.create_producer(topic, producer_name="dedup-p", batching_enabled=False)
    for i in range(10):
        p.send(f"m{i}".encode(), sequence_id=i)
    dup = p.send(b"dup", sequence_id=5)
    assert (dup.ledger_id(), dup.entry_id()) == (-1, -1)
    p.close()

    # Same producer name again: the broker reports the last sequence id; the client continues.
    p = client.create_producer(topic, producer_name="dedup-p", batching_enabled=False)
    assert p.last_sequence_id() == 9
    p.send(b"m10")
    client.close()

    assert svc.stop(signal.SIGTERM) == 0
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=20)
    p = client.create_producer(topic, producer_name="dedup-p", batching_enabled=False)
    assert p.last_sequence_id() == 10
    again = p.send(b"again", sequence_id=3)
    assert (again.ledger_id(), again.entry_id()) == (-1, -1)
    p.send(b"m11", sequence_id=11)
    client.close()

    # A crash right after appends: the state is rebuilt from the log itself.
    svc.stop(signal.SIGKILL)
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=20)
    p = client.create_producer(topic, producer_name="dedup-p", batching_enabled=False)
    assert p.last_sequence_id() == 11
    assert _all(client, topic, 12) == [f"m{i}".encode() for i in range(12)]
    client.close()


def test_dedup_by_namespace_and_topic_policy(fresh_service):
    """Deduplication set per namespace (POST .../namespaces/{t}/{ns}/deduplication) and
    overridden per topic (.../{topic}/deduplicationEnabled), applied without restart."""
    import urllib.request

    svc = fresh_service
    svc.start()
    base = f"http://127.0.0.1:{svc.http_port}/admin/v2"

    def call(method, path, body=None):
        req = urllib.request.Request(base + path, method=method,
                                     data=body.encode() if body is not None else None)
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read().decode()
            return r.status, text

    assert call("GET", "/namespaces/public/dd/deduplication")[1] == "false"
    assert call("POST", "/namespaces/public/dd/deduplication", "true")[0] == 204
    assert call("GET", "/namespaces/public/dd/deduplication")[1] == "true"
    assert call("POST", "/persistent/public/dd/b/deduplicationEnabled", "false")[0] == 204
    assert call("GET", "/persistent/public/dd/b/deduplicationEnabled")[1] == "false"
    assert call("GET", "/persistent/public/dd/a/deduplicationEnabled")[1] == "true"

    client = pulsar.Client(svc.url, operation_timeout_seconds=20)
    for name, dropped in [("a", True), ("b", False)]:
        p = client.create_producer(f"persistent://public/dd/{name}", producer_name=f"pp-{name}",
                                   batching_enabled=False)
        for i in range(5):
            p.send(f"m{i}".encode(), sequence_id=i)
        dup = p.send(b"dup", sequence_id=2)
        assert ((dup.ledger_id(), dup.entry_id()) == (-1, -1)) == dropped, name
        p.close()

    # Removing the topic's override lets the namespace setting apply to it, at once.
    assert call("DELETE", "/persistent/public/dd/b/deduplicationEnabled")[0] == 204
    p = client.create_producer("persistent://public/dd/b", producer_name="pp-b",
                               batching_enabled=False)
    assert p.last_sequence_id() == 4
    dup = p.send(b"dup", sequence_id=3)
    assert (dup.ledger_id(), dup.entry_id()) == (-1, -1)
    client.close()
