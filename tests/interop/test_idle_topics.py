"""Idle topics (issue 22): a topic partition without producers, consumers or work in flight is
unloaded after `broker.unload_idle_after`, keeping nothing in memory, and its next producer or
consumer loads it back exactly as it was: the same message ids, the subscription's cursor, the
deduplication state (official Python client)."""
import json
import time
import urllib.request

import pulsar

from conftest import eventually

IDLE = {"LEDGERLAKE_BROKER__UNLOAD_IDLE_AFTER": "1s",
        "LEDGERLAKE_BROKER__DEDUPLICATION": "true"}


def _metric(svc, name):
    """The value of an unlabelled sample of GET /metrics (None when absent)."""
    with urllib.request.urlopen(f"{svc.http}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def _receive(consumer, n):
    receive = consumer.read_next if isinstance(consumer, pulsar.Reader) else consumer.receive
    return [receive(timeout_millis=10000) for _ in range(n)]


def test_idle_topics_unload_and_load_back_exactly(make_service):
    svc = make_service(env=IDLE)
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=20)
    topics = [f"persistent://public/default/idle-{i}" for i in range(12)]
    ids = {}
    for t in topics:
        producer = client.create_producer(t, producer_name=f"p-{t[-2:]}",
                                          batching_enabled=False)
        ids[t] = [producer.send(f"{t}-{i}".encode()) for i in range(30)]
        consumer = client.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
        for m in _receive(consumer, 10):
            consumer.acknowledge(m)
        time.sleep(0.3)  # the client groups acknowledgements (~100 ms)
        consumer.close()
        producer.close()
    # A topic with a consumer attached stays loaded however long it waits.
    busy = "persistent://public/default/idle-busy"
    watcher = client.subscribe(busy, "w")

    eventually(lambda: _metric(svc, "ledgerlake_topics_loaded") == 1
               and _metric(svc, "ledgerlake_topics_unloaded_idle_total") >= len(topics),
               timeout=30)
    time.sleep(2.5)  # two more idle periods: the busy one is still there
    assert _metric(svc, "ledgerlake_topics_loaded") == 1

    for t in topics:
        # The producer finds its deduplication state: the last sequence id and a resend
        # of an old one taken for a duplicate, not stored again.
        producer = client.create_producer(t, producer_name=f"p-{t[-2:]}",
                                          batching_enabled=False)
        assert producer.last_sequence_id() == 29, t
        producer.send(b"resent", sequence_id=5)
        ids[t] += [producer.send(f"{t}-{i}".encode()) for i in range(30, 40)]
        producer.close()
        # The subscription resumes after what was acknowledged, with the same ids.
        consumer = client.subscribe(t, "s")
        got = _receive(consumer, 30)
        assert [m.data() for m in got] == [f"{t}-{i}".encode() for i in range(10, 40)], t
        assert [str(m.message_id()) for m in got] == [str(i) for i in ids[t][10:]], t
        consumer.close()
        reader = client.create_reader(t, pulsar.MessageId.earliest)
        assert [str(m.message_id()) for m in _receive(reader, 40)] == \
            [str(i) for i in ids[t]], t
        reader.close()

    # Loaded again, idle again, unloaded again.
    eventually(lambda: _metric(svc, "ledgerlake_topics_loaded") == 1, timeout=30)
    watcher.close()
    eventually(lambda: _metric(svc, "ledgerlake_topics_loaded") == 0, timeout=30)
    client.close()


def test_stats_of_an_unloaded_topic_list_its_subscriptions(make_service):
    svc = make_service(env=IDLE)
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=20)
    t = "persistent://public/default/idle-stats"
    producer = client.create_producer(t, batching_enabled=False)
    for i in range(5):
        producer.send(b"x")
    client.subscribe(t, "kept", initial_position=pulsar.InitialPosition.Earliest).close()
    producer.close()
    eventually(lambda: _metric(svc, "ledgerlake_topics_loaded") == 0, timeout=30)
    with urllib.request.urlopen(
            f"{svc.http}/admin/v2/persistent/public/default/idle-stats/stats", timeout=30) as r:
        stats = json.loads(r.read())
    assert stats["subscriptions"]["kept"]["msgBacklog"] == 5, stats
    client.close()
