"""Broker restarts: SIGKILL mid-stream loses no acknowledged message and keeps acknowledged
cursor positions; a graceful restart keeps everything."""
import signal
import time

import pulsar
import pytest

from conftest import Sends


def _consume(consumer, n, timeout_ms=10000):
    receive = consumer.read_next if isinstance(consumer, pulsar.Reader) else consumer.receive
    return [receive(timeout_millis=timeout_ms) for _ in range(n)]


def test_sigkill_keeps_acknowledged_messages_and_cursor(fresh_service):
    svc = fresh_service
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=20)
    topic = "persistent://public/default/restart-kill"
    producer = client.create_producer(topic, batching_enabled=False)
    sent = [f"m{i}".encode() for i in range(200)]
    for payload in sent:
        producer.send(payload)  # returns only after SEND_RECEIPT (durable)
    consumer = client.subscribe(topic, "durable-sub",
                                initial_position=pulsar.InitialPosition.Earliest,
                                receiver_queue_size=10)
    first = _consume(consumer, 100)
    assert [m.data() for m in first] == sent[:100]
    for m in first:
        consumer.acknowledge(m)
    # Acks are grouped by the client (~100 ms) and saved by the broker every second.
    time.sleep(2.5)
    svc.stop(signal.SIGKILL)
    client.close()

    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=20)
    consumer = client.subscribe(topic, "durable-sub")
    rest = _consume(consumer, 100)
    assert [m.data() for m in rest] == sent[100:]
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [m.data() for m in _consume(reader, 200)] == sent
    client.close()


def test_graceful_restart_keeps_unbatched_and_batched_messages(fresh_service):
    svc = fresh_service
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=20)
    topic = "persistent://public/default/restart-graceful"
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=20,
                                      block_if_queue_full=True)
    sends = Sends()
    for i in range(500):
        producer.send_async(f"b{i}".encode(), sends.callback())
    sends.check(producer, 500)
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    got = [m.data() for m in _consume(consumer, 500)]
    assert got == [f"b{i}".encode() for i in range(500)]
    client.close()
    assert svc.stop(signal.SIGTERM) == 0
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=20)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [m.data() for m in _consume(reader, 500)] == got
    client.close()


def test_batch_index_acks_survive_restart(fresh_service):
    """Acknowledging part of a batch is saved with the cursor: after a restart only the
    messages not yet acknowledged are delivered again."""
    import time

    svc = fresh_service
    svc.start()
    t = "persistent://public/default/bia-restart"
    client = pulsar.Client(svc.url, operation_timeout_seconds=20)
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
    for m in msgs[:3]:
        consumer.acknowledge(m)
    time.sleep(1.5)  # grouped acks reach the broker; the cursor is saved every second
    client.close()
    assert svc.stop() == 0

    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=20)
    consumer = client.subscribe(t, "bia", consumer_type=pulsar.ConsumerType.Shared,
                                batch_index_ack_enabled=True)
    again = sorted(consumer.receive(timeout_millis=5000).data() for _ in range(2))
    assert again == [b"m3", b"m4"]
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=500)
    client.close()


def test_a_second_process_on_the_same_data_directory_is_refused(fresh_service):
    """The data directory is locked by its process: a second `serve` on it (other ports) exits
    at once with a clear error and touches nothing; the first keeps serving."""
    import os
    import subprocess
    from conftest import _free_port

    svc = fresh_service
    svc.start()
    second = subprocess.run(
        [svc.binary, "serve", "--data-dir", os.path.join(svc.data_dir, "data"),
         "--pulsar-addr", f"127.0.0.1:{_free_port()}", "--http-addr", f"127.0.0.1:{_free_port()}",
         "--pg-addr", f"127.0.0.1:{_free_port()}"],
        capture_output=True, text=True, timeout=60, env=svc.env)
    assert second.returncode != 0
    assert "in use by another ledgerlake process" in second.stderr, second.stderr
    client = pulsar.Client(svc.url, operation_timeout_seconds=20)
    try:
        topic = "persistent://public/default/locked-dir"
        client.create_producer(topic).send(b"still served")
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        assert reader.read_next(timeout_millis=10000).data() == b"still served"
    finally:
        client.close()
