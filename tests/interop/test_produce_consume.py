"""Produce and consume with the official Python client (C++ client inside), unchanged."""
import time
import uuid

import pulsar
import pytest

import rawpulsar
from conftest import Sends
from lake import wait_acknowledged

CODECS = {
    "none": pulsar.CompressionType.NONE,
    "lz4": pulsar.CompressionType.LZ4,
    "zlib": pulsar.CompressionType.ZLib,
    "zstd": pulsar.CompressionType.ZSTD,
    "snappy": pulsar.CompressionType.SNAPPY,
}


@pytest.fixture
def client(service):
    c = pulsar.Client(service.url, operation_timeout_seconds=15)
    yield c
    c.close()


def topic():
    return f"persistent://public/default/t-{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("codec", list(CODECS))
def test_round_trip_every_codec(client, codec, batched):
    t = topic()
    n = 100_000
    producer = client.create_producer(
        t, batching_enabled=batched, batching_max_messages=100, block_if_queue_full=True,
        batching_max_publish_delay_ms=5, compression_type=CODECS[codec])
    consumer = client.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
    sent = []
    sends = Sends()
    for i in range(n):
        payload = f"{codec}-{i}-".encode() + bytes(range(i % 200))
        producer.send_async(payload, sends.callback(), properties={"i": str(i)},
                            partition_key=f"k{i % 7}")
        sent.append(payload)
    sends.check(producer, n)
    received = []
    for _ in range(n):
        m = consumer.receive(timeout_millis=10000)
        received.append((m.data(), m.properties()["i"], m.partition_key()))
        consumer.acknowledge(m)
    assert [r[0] for r in received] == sent
    assert [r[1] for r in received] == [str(i) for i in range(n)]
    assert [r[2] for r in received] == [f"k{i % 7}" for i in range(n)]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=300)


def test_receipts_carry_increasing_message_ids(client):
    t = topic()
    producer = client.create_producer(t, batching_enabled=False)
    ids = [producer.send(f"m{i}".encode()) for i in range(50)]
    pairs = [(i.ledger_id(), i.entry_id()) for i in ids]
    assert pairs == sorted(pairs) and len(set(pairs)) == 50


def test_shared_subscription_splits_messages(client):
    t = topic()
    producer = client.create_producer(t, batching_enabled=False)
    c1 = client.subscribe(t, "shared", consumer_type=pulsar.ConsumerType.Shared,
                          initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=10)
    c2 = client.subscribe(t, "shared", consumer_type=pulsar.ConsumerType.Shared,
                          initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=10)
    for i in range(200):
        producer.send(f"m{i}".encode())
    got = {1: [], 2: []}
    for _ in range(400):
        for k, c in ((1, c1), (2, c2)):
            try:
                m = c.receive(timeout_millis=50)
                got[k].append(m.data())
                c.acknowledge(m)
            except pulsar.Timeout:
                pass
        if len(got[1]) + len(got[2]) == 200:
            break
    assert sorted(got[1] + got[2]) == sorted(f"m{i}".encode() for i in range(200))
    assert got[1] and got[2], "both shared consumers must receive messages"


def test_exclusive_subscription_refuses_a_second_consumer(client):
    t = topic()
    client.subscribe(t, "ex")
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(t, "ex")


def test_unacked_messages_are_redelivered_to_the_next_consumer(client):
    t = topic()
    producer = client.create_producer(t, batching_enabled=False)
    c1 = client.subscribe(t, "f", consumer_type=pulsar.ConsumerType.Shared,
                          initial_position=pulsar.InitialPosition.Earliest)
    for i in range(5):
        producer.send(f"m{i}".encode())
    first = [c1.receive(timeout_millis=5000) for _ in range(5)]
    c1.acknowledge(first[0])
    c1.close()
    c2 = client.subscribe(t, "f", consumer_type=pulsar.ConsumerType.Shared)
    again = sorted(c2.receive(timeout_millis=5000).data() for _ in range(4))
    assert again == [b"m1", b"m2", b"m3", b"m4"]


def test_a_wait_for_exclusive_producer_waits_for_the_topic(service):
    """A WaitForExclusive producer created while another producer is on the topic is not
    refused: the broker tells it it waits (PRODUCER_SUCCESS, not ready), and its creation
    returns once the other closes; it then has the topic alone. (This client gives up a
    creation after its operation timeout however the broker answers.)"""
    import threading

    c = pulsar.Client(service.url, operation_timeout_seconds=30)
    try:
        t = topic()
        first = c.create_producer(t, access_mode=pulsar.ProducerAccessMode.Shared)
        first.send(b"before")
        created = {}

        def create():
            try:
                created["producer"] = c.create_producer(
                    t, access_mode=pulsar.ProducerAccessMode.WaitForExclusive)
            except Exception as e:  # noqa: BLE001 - reported by the assertions below
                created["error"] = e
        waiter = threading.Thread(target=create)
        waiter.start()
        waiter.join(timeout=4)
        assert waiter.is_alive(), f"it did not wait: {created}"
        first.send(b"while it waits")
        first.close()
        waiter.join(timeout=30)
        assert "producer" in created, created
        alone = created["producer"]
        alone.send(b"alone")
        # As Pulsar refuses them: a shared producer is busy, an exclusive one fenced.
        with pytest.raises(pulsar.ProducerBusy):
            c.create_producer(t)
        with pytest.raises(pulsar.ProducerFenced):
            c.create_producer(t, access_mode=pulsar.ProducerAccessMode.Exclusive)
        alone.close()
        reader = c.create_reader(t, pulsar.MessageId.earliest)
        got = [reader.read_next(timeout_millis=10_000).data() for _ in range(3)]
        assert got == [b"before", b"while it waits", b"alone"]
        reader.close()
    finally:
        c.close()


def test_reader_from_earliest_latest_and_has_message_available(client):
    t = topic()
    producer = client.create_producer(t, batching_enabled=False)
    for i in range(10):
        producer.send(f"m{i}".encode())
    r = client.create_reader(t, pulsar.MessageId.earliest)
    assert [r.read_next(5000).data() for _ in range(10)] == [f"m{i}".encode() for i in range(10)]
    assert not r.has_message_available()
    latest = client.create_reader(t, pulsar.MessageId.latest)
    assert not latest.has_message_available()
    producer.send(b"new")
    assert latest.read_next(5000).data() == b"new"
    assert r.has_message_available()


def test_empty_topic_has_no_message_available(client):
    t = topic()
    client.create_producer(t)
    r = client.create_reader(t, pulsar.MessageId.earliest)
    assert not r.has_message_available()


def test_invalid_topic_name_is_a_clean_error(client):
    with pytest.raises(pulsar.InvalidTopicName):
        client.create_producer("persistent://bad tenant!/ns/x")


def test_failover_switches_to_the_next_consumer(client):
    # The broker also sends ACTIVE_CONSUMER_CHANGE to both consumers; the C++ client would drop
    # the connection on a command it does not handle, so passing also shows it is accepted.
    t = topic()
    producer = client.create_producer(t, batching_enabled=False)
    a = client.subscribe(t, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name="a",
                         initial_position=pulsar.InitialPosition.Earliest)
    b = client.subscribe(t, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name="b")
    for i in range(10):
        producer.send(f"m{i}".encode())
    first = [a.receive(timeout_millis=5000) for _ in range(4)]
    for m in first:
        a.acknowledge(m)
    with pytest.raises(pulsar.Timeout):
        b.receive(timeout_millis=300)
    a.close()
    rest = [b.receive(timeout_millis=5000).data() for _ in range(6)]
    assert rest == [f"m{i}".encode() for i in range(4, 10)]


def test_key_shared_keeps_per_key_order(client):
    t = topic()
    producer = client.create_producer(t, batching_enabled=False)
    c1 = client.subscribe(t, "ks", consumer_type=pulsar.ConsumerType.KeyShared,
                          initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=20)
    keys = [f"key-{k}" for k in range(16)]
    received = {1: [], 2: []}

    def drain(consumers, want):
        idle = 0
        while sum(len(v) for v in received.values()) < want and idle < 40:
            progress = False
            for n, c in consumers:
                try:
                    m = c.receive(timeout_millis=50)
                except pulsar.Timeout:
                    continue
                received[n].append((m.partition_key(), int(m.data())))
                c.acknowledge(m)
                progress = True
            idle = 0 if progress else idle + 1

    for seq in range(30):
        for k in keys:
            producer.send(str(seq).encode(), partition_key=k)
    drain([(1, c1)], 200)
    c2 = client.subscribe(t, "ks", consumer_type=pulsar.ConsumerType.KeyShared, receiver_queue_size=20)
    for seq in range(30, 60):
        for k in keys:
            producer.send(str(seq).encode(), partition_key=k)
    drain([(1, c1), (2, c2)], 60 * len(keys))
    everything = received[1] + received[2]
    assert len(everything) == 60 * len(keys), "every message exactly once"
    assert sorted(everything) == sorted((k, s) for k in keys for s in range(60))
    for n in (1, 2):
        for k in keys:
            seqs = [s for key, s in received[n] if key == k]
            assert seqs == sorted(seqs), f"consumer {n} got key {k} out of order"
    assert received[2], "the second consumer must take over part of the key space"


def test_batch_index_acks_redeliver_only_unacked_messages(client):
    t = topic()
    producer = client.create_producer(t, batching_enabled=True, batching_max_messages=5,
                                      batching_max_publish_delay_ms=1000, block_if_queue_full=True)
    consumer = client.subscribe(t, "bia", consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest,
                                batch_index_ack_enabled=True)
    sends = Sends()
    for i in range(5):
        producer.send_async(f"m{i}".encode(), sends.callback())
    sends.check(producer, 5)
    msgs = [consumer.receive(timeout_millis=5000) for _ in range(5)]
    assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in msgs}) == 1
    consumer.acknowledge(msgs[0])
    consumer.acknowledge(msgs[1])
    import time
    time.sleep(0.5)  # let the grouped acks reach the broker
    consumer.redeliver_unacknowledged_messages()
    again = sorted(consumer.receive(timeout_millis=5000).data() for _ in range(3))
    assert again == [b"m2", b"m3", b"m4"]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=500)


def test_cumulative_ack_of_a_batch_start_keeps_the_rest_of_the_ledger(make_service):
    """The client acknowledges cumulatively up to a batch's first message as entry -1 of its
    ledger; the broker must read that as "before entry 0", not "after the whole ledger" (which
    once dropped the entries read ahead of the consumer's permits: a silent stall)."""
    svc = make_service({"LEDGERLAKE_LEDGER__ROLLOVER_ENTRIES": "5"})
    svc.start()
    client = pulsar.Client(svc.url)
    t = topic()
    producer = client.create_producer(t, batching_enabled=True, batching_max_messages=10,
                                      batching_max_publish_delay_ms=10000, block_if_queue_full=True)
    sends = Sends()
    for b in range(10):
        for i in range(10):
            producer.send_async(f"m{b * 10 + i}".encode(), sends.callback())
        producer.flush()
    sends.check(producer, 100)
    consumer = client.subscribe(t, "cum", initial_position=pulsar.InitialPosition.Earliest,
                                receiver_queue_size=10)
    got = []
    first_ledger = None
    while True:
        m = consumer.receive(timeout_millis=10000)
        got.append(m.data())
        mid = m.message_id()
        first_ledger = first_ledger or mid.ledger_id()
        if mid.ledger_id() != first_ledger and mid.entry_id() == 0 and mid.batch_index() == 0:
            consumer.acknowledge_cumulative(m)  # sent as (ledger, -1)
            # The grouped ack reaches the broker while it holds read-ahead.
            wait_acknowledged(svc, t, "cum", (mid.ledger_id(), -1))
            break
    assert got[-1] == b"m50", got  # 5 entries of 10 messages per ledger
    while len(got) < 100:
        got.append(consumer.receive(timeout_millis=10000).data())
    assert got == [f"m{i}".encode() for i in range(100)]
    client.close()
    assert svc.stop() == 0


def test_unsubscribing_a_consumer_the_connection_does_not_have_is_an_error(service, client):
    """As Pulsar: UNSUBSCRIBE naming a consumer id this connection never opened answers an
    error (ConsumerNotFound) and changes nothing; the connection stays open, and a real
    consumer's subscription is untouched."""
    t = topic()
    consumer = client.subscribe(t, "kept", initial_position=pulsar.InitialPosition.Earliest)
    conn = rawpulsar.RawPulsar(service.pulsar_port)
    try:
        # CommandUnsubscribe: consumer_id = 1, request_id = 2; CommandError: error = 2.
        kind, fields = conn.request(rawpulsar.UNSUBSCRIBE,
                                    rawpulsar.fv(1, 77) + rawpulsar.fv(2, 5), 5)
        assert kind == rawpulsar.ERROR, (kind, fields)
        assert fields[2] == [rawpulsar.CONSUMER_NOT_FOUND], fields
        body = rawpulsar.fb(1, t) + rawpulsar.fv(2, 6)
        kind, _ = conn.request(rawpulsar.LOOKUP, body, 6)
        assert kind == rawpulsar.LOOKUP_RESPONSE, "the connection is still served"
    finally:
        conn.close()
    client.create_producer(t).send(b"after")
    assert consumer.receive(timeout_millis=10_000).data() == b"after"
