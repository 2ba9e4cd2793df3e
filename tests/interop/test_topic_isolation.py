"""One owner per topic: loading (or deleting) one topic holds only that topic, so a topic whose
load is slow never delays lookups, produces or consumes on another (issue 16)."""
import json
import threading
import time
import urllib.request

import pulsar


def _wait_for_log(svc, text, timeout=20):
    deadline = time.time() + timeout
    while text not in open(svc.log_path, errors="replace").read():
        assert time.time() < deadline, f"'{text}' never appeared in the log"
        time.sleep(0.02)


def test_a_slow_topic_load_does_not_delay_other_topics(make_service):
    # Debug builds only: loading any topic whose name contains "slow-" stalls for 8 s.
    svc = make_service({"LL_FAILPOINTS": "broker.load_topic@slow-=sleep(8000)"})
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    slow_done = threading.Event()
    slow_result = []

    def produce_to_the_slow_topic():
        try:
            p = client.create_producer("persistent://public/default/slow-one")
            slow_result.append(p.send(b"late"))
        except Exception as e:  # reported below; the thread must not die silently
            slow_result.append(e)
        finally:
            slow_done.set()

    slow = threading.Thread(target=produce_to_the_slow_topic)
    slow.start()
    _wait_for_log(svc, "failpoint: pausing")

    # While slow-one is loading: lookups, a producer, a consumer and a reader on another topic.
    topic = "persistent://public/default/fast-one"
    assert client.get_topic_partitions(topic) == [topic]
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(20):
        producer.send(f"m{i}".encode())
    got = []
    for _ in range(20):
        m = consumer.receive(timeout_millis=5000)
        consumer.acknowledge(m)
        got.append(m.data())
    assert got == [f"m{i}".encode() for i in range(20)]
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert reader.read_next(5000).data() == b"m0"
    assert not slow_done.is_set(), "the slow topic finished loading first: nothing was proven"

    slow.join(60)
    assert slow_done.is_set() and len(slow_result) == 1
    assert not isinstance(slow_result[0], Exception), slow_result
    assert slow_result[0].ledger_id() >= 0, slow_result
    client.close()


def _metric(svc, name):
    with urllib.request.urlopen(f"{svc.http}/metrics", timeout=30) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def _consumers(svc, topic, sub):
    path = topic.replace("persistent://", "persistent/")
    with urllib.request.urlopen(f"{svc.http}/admin/v2/{path}/stats", timeout=30) as r:
        return len(json.load(r)["subscriptions"][sub]["consumers"])


def test_a_failed_topic_owner_costs_only_its_topic_and_recovers(make_service):
    # Debug builds only: the owner of any topic whose name contains "boom-" panics once, at
    # its sixth SEND (a defect in the owner). Before, the dead topic stayed in its slot and
    # every later command to it failed until a restart.
    svc = make_service({"LL_FAILPOINTS": "broker.owner.publish@boom-=panic#5"})
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    boom = "persistent://public/default/boom-1"
    calm = "persistent://public/default/calm-1"
    consumer = client.subscribe(boom, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(boom, batching_enabled=False, send_timeout_millis=30000)
    calm_producer = client.create_producer(calm, batching_enabled=False)
    sent = [f"m{i}".encode() for i in range(12)]
    for i, payload in enumerate(sent):
        # The sixth SEND meets the panic: the client is told to go, reconnects to the topic
        # loaded anew and resends it.
        producer.send(payload)
        calm_producer.send(f"c{i}".encode())
    _wait_for_log(svc, "its clients are closed")
    assert _metric(svc, "ledgerlake_topic_owner_failures_total") == 1

    # The subscription resumed on the new owner: every message arrives (a message delivered
    # but not yet acknowledged when the old owner went may come twice, as Pulsar allows).
    got = set()
    while got != set(sent):
        m = consumer.receive(timeout_millis=20000)
        consumer.acknowledge(m)
        assert m.data() in sent, m.data()
        got.add(m.data())
    # The log holds each message once, in order.
    reader = client.create_reader(boom, pulsar.MessageId.earliest)
    stored = [reader.read_next(10000).data() for _ in sent]
    assert stored == sent
    assert not reader.has_message_available()
    # The other topic never noticed.
    calm_reader = client.create_reader(calm, pulsar.MessageId.earliest)
    assert [calm_reader.read_next(10000).data() for _ in sent] == [
        f"c{i}".encode() for i in range(12)
    ]
    # The topic keeps working, and the panic was a single one.
    producer.send(b"after")
    while (m := consumer.receive(timeout_millis=20000)).data() != b"after":
        assert m.data() in sent, m.data()
    assert _metric(svc, "ledgerlake_topic_owner_failures_total") == 1
    # One subscription with one consumer: the failed owner's subscription ended.
    assert _consumers(svc, boom, "sub") == 1
    client.close()
