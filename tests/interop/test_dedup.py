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
