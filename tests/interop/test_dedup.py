"""Broker deduplication (Pulsar semantics) across producer reconnects and broker restarts."""
import signal
import time

import pulsar

from conftest import Sends
from lake import http, offload_and_wait, stats


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

    assert call("PUT", "/namespaces/public/dd")[0] == 204
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


FAST_LAKE = {
    "LEDGERLAKE_LAKE__CHECK_INTERVAL": "100ms",
    "LEDGERLAKE_LEDGER__ROLLOVER_ENTRIES": "100",
    "LEDGERLAKE_BROKER__CURSOR_PERSIST_INTERVAL": "200ms",
}


def _send_all(producer, payloads, sequence_ids=None):
    """Sends every payload asynchronously (the producer blocks while its queue is full) and
    checks that each was acknowledged; returns the message ids in send order."""
    sends = Sends()
    for i, payload in enumerate(payloads):
        kwargs = {} if sequence_ids is None else {"sequence_id": sequence_ids[i]}
        producer.send_async(payload, sends.callback(), **kwargs)
    return sends.check(producer, len(payloads))


def _is_duplicate_receipt(msg_id):
    return (msg_id.ledger_id(), msg_id.entry_id()) == (-1, -1)


def _ledgers_left_local(svc, topic):
    return [l["ledger"] for l in stats(svc, topic)["ledgers"]
            if l["ledger"]["entry_count"] > 0 and l["ledger"]["state"] not in ("deleted", "open")]


def test_dedup_enabled_on_a_topic_whose_early_ledgers_are_only_in_the_lake(make_service):
    """Produced without deduplication, offloaded and deleted locally, then deduplication is
    switched on for the namespace: the state is folded from the lake (through replay), so after
    a restart and after SIGKILL re-sent ids are receipted as duplicates and stored once."""
    svc = make_service(FAST_LAKE)
    svc.start()
    status, body = http("PUT", f"{svc.http}/admin/v2/namespaces/public/default/offloadDeletionLagMs", "0")
    assert status == 204, body
    topic = "persistent://public/default/dedup-lake"
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    single = client.create_producer(topic, producer_name="lake-p", batching_enabled=False,
                                    block_if_queue_full=True)
    _send_all(single, [f"p{i}".encode() for i in range(300)], list(range(300)))
    batched = client.create_producer(topic, producer_name="lake-b", batching_enabled=True,
                                     batching_max_messages=50, batching_max_publish_delay_ms=200,
                                     block_if_queue_full=True)
    _send_all(batched, [f"b{i}".encode() for i in range(300)])
    client.close()

    assert offload_and_wait(svc, topic)["status"] == "SUCCESS"
    deadline = time.time() + 120
    while _ledgers_left_local(svc, topic):
        assert time.time() < deadline, _ledgers_left_local(svc, topic)
        time.sleep(0.1)
    ledgers = stats(svc, topic)["ledgers"]
    assert sum(l["ledger"]["state"] == "deleted" for l in ledgers) >= 2, ledgers
    assert ledgers[0]["ledger"]["state"] == "deleted", "the first ledger lives only in the lake"

    status, body = http("POST", f"{svc.http}/admin/v2/namespaces/public/default/deduplication", "true")
    assert status == 204, body
    assert svc.stop(signal.SIGTERM) == 0
    svc.start()

    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    p = client.create_producer(topic, producer_name="lake-p", batching_enabled=False)
    assert p.last_sequence_id() == 299
    for seq in (5, 150, 299):
        assert _is_duplicate_receipt(p.send(b"again", sequence_id=seq)), seq
    for seq in range(300, 310):
        assert not _is_duplicate_receipt(p.send(f"p{seq}".encode(), sequence_id=seq))
    b = client.create_producer(topic, producer_name="lake-b", batching_enabled=False)
    assert b.last_sequence_id() == 299
    assert _is_duplicate_receipt(b.send(b"again", sequence_id=275))
    client.close()

    # A crash: the state comes back from the snapshot and the entries after it.
    svc.stop(signal.SIGKILL)
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    p = client.create_producer(topic, producer_name="lake-p", batching_enabled=False)
    assert p.last_sequence_id() == 309
    assert _is_duplicate_receipt(p.send(b"again", sequence_id=42))
    p.send(b"p310", sequence_id=310)
    expected = ([f"p{i}".encode() for i in range(300)] + [f"b{i}".encode() for i in range(300)]
                + [f"p{i}".encode() for i in range(300, 311)])
    assert _all(client, topic, len(expected)) == expected
    client.close()
    assert svc.stop() == 0


def test_batched_sends_are_deduplicated_by_their_highest_sequence_id(dedup_service):
    """The Python client batches by default: a batch counts by its last sequence id, live and
    after reconnects, restarts and SIGKILL; re-sent ids from inside the last batch (unbatched
    and batched) are not stored again."""
    svc = dedup_service
    svc.start()
    topic = "persistent://public/default/dedup-batches"
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    p = client.create_producer(topic, producer_name="prod-b", batching_enabled=True,
                               batching_max_messages=100, batching_max_publish_delay_ms=1000,
                               max_pending_messages=2000, block_if_queue_full=True)
    ids = _send_all(p, [f"m{i}".encode() for i in range(1000)])
    assert len({(m.ledger_id(), m.entry_id()) for m in ids}) <= 20, "sent in batches"
    assert p.last_sequence_id() == 999
    p.close()

    def check_dedup(client):
        r = client.create_producer(topic, producer_name="prod-b", batching_enabled=False)
        assert r.last_sequence_id() == 999
        for seq in (950, 999, 900, 10):
            assert _is_duplicate_receipt(r.send(b"again", sequence_id=seq)), seq
        r.close()
        # The same ids re-sent in a batch.
        rb = client.create_producer(topic, producer_name="prod-b", batching_enabled=True,
                                    batching_max_messages=20, batching_max_publish_delay_ms=1000,
                                    block_if_queue_full=True)
        _send_all(rb, [b"again"] * 20, list(range(950, 970)))
        rb.close()

    check_dedup(client)  # reconnected, same process
    client.close()
    assert svc.stop(signal.SIGTERM) == 0
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    check_dedup(client)
    client.close()
    svc.stop(signal.SIGKILL)
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    check_dedup(client)
    assert _all(client, topic, 1000) == [f"m{i}".encode() for i in range(1000)]
    client.close()
