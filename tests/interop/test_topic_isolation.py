"""One owner per topic: loading (or deleting) one topic holds only that topic, so a topic whose
load is slow never delays lookups, produces or consumes on another (issue 16)."""
import threading
import time

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
