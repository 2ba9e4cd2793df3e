"""SEEK by message id and by publish time, for consumers and readers."""
import time
import uuid

import pulsar


def test_seek_by_message_id_and_publish_time(service):
    client = pulsar.Client(service.url, operation_timeout_seconds=15)
    topic = f"persistent://public/default/seek-{uuid.uuid4().hex[:8]}"
    producer = client.create_producer(topic, batching_enabled=False)
    ids = []
    for i in range(20):
        ids.append(producer.send(f"m{i}".encode()))
        time.sleep(0.005)
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    msgs = [consumer.receive(timeout_millis=5000) for _ in range(20)]
    for m in msgs:
        consumer.acknowledge(m)
    assert [m.data() for m in msgs] == [f"m{i}".encode() for i in range(20)]

    # As with a Pulsar broker, the cursor is reset to the message and the C++ client, whose start
    # id is exclusive by default, delivers from the one after it.
    consumer.seek(ids[5])
    again = [consumer.receive(timeout_millis=5000).data() for _ in range(14)]
    assert again == [f"m{i}".encode() for i in range(6, 20)]

    consumer.seek(msgs[12].publish_timestamp())
    by_time = consumer.receive(timeout_millis=5000).data()
    assert by_time == b"m12"

    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert reader.read_next(5000).data() == b"m0"
    reader.seek(ids[17])
    assert reader.read_next(5000).data() == b"m18"
    client.close()
