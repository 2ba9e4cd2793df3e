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


def _until(check, timeout=30):
    """Waits until `check()` is true (`eventually` wants a check that asserts)."""
    def asserting():
        assert check()
    eventually(asserting, timeout=timeout)


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

    _until(lambda: _metric(svc, "ledgerlake_topics_loaded") == 1
           and _metric(svc, "ledgerlake_topics_unloaded_idle_total") >= len(topics))
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
    _until(lambda: _metric(svc, "ledgerlake_topics_loaded") == 1)
    watcher.close()
    _until(lambda: _metric(svc, "ledgerlake_topics_loaded") == 0)
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
    _until(lambda: _metric(svc, "ledgerlake_topics_loaded") == 0)
    with urllib.request.urlopen(
            f"{svc.http}/admin/v2/persistent/public/default/idle-stats/stats", timeout=30) as r:
        stats = json.loads(r.read())
    assert stats["subscriptions"]["kept"]["msgBacklog"] == 5, stats
    client.close()


def test_idle_topics_are_offloaded_without_being_loaded_again(make_service):
    """The idle unload seals each topic's ledger; the offload engine, driven by ledger states
    in the metadata store, commits it to the lake through a view of the log that loads
    nothing: the topics stay unloaded, and SQL reads every message from the lake."""
    svc = make_service(env={"LEDGERLAKE_BROKER__UNLOAD_IDLE_AFTER": "1s"})
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=20)
    topics = [f"persistent://public/default/idle-lake-{i}" for i in range(4)]
    for t in topics:
        producer = client.create_producer(t, batching_enabled=False)
        for i in range(20):
            producer.send(f"{t}-{i}".encode())
        producer.close()
    client.close()
    _until(lambda: _metric(svc, "ledgerlake_topics_loaded") == 0)

    def offloaded(t):
        url = f"{svc.http}/admin/v2/persistent/{t.split('://', 1)[1]}/offload"
        with urllib.request.urlopen(url, timeout=30) as r:
            s = json.loads(r.read())
        return s["committedRows"] == 20 and s["firstUnoffloadedMessage"] is None
    _until(lambda: all(offloaded(t) for t in topics), timeout=60)
    assert _metric(svc, "ledgerlake_topics_loaded") == 0
    for t in topics:
        query = f'SELECT count(*) AS n FROM public.default."{t.split("/")[-1]}"'
        req = urllib.request.Request(f"{svc.http}/sql", method="POST", data=query.encode(),
                                     headers={"Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            rows = json.loads(r.read())
        assert rows == [{"n": 20}], (t, rows)
    assert _metric(svc, "ledgerlake_topics_loaded") == 0


def _admin(svc, method, path, body=None):
    req = urllib.request.Request(f"{svc.http}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
            return r.status, (json.loads(text) if text else None)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _exists(svc, topic):
    status, _ = _admin(svc, "GET", f"/admin/v2/persistent/{topic.split('://', 1)[1]}/stats")
    assert status in (200, 404), status
    return status == 200


def test_inactive_topic_policies_delete_what_nobody_uses(make_service):
    """Pulsar's inactive-topic policies: with `delete_when_no_subscriptions`, a topic without
    producers and subscriptions that saw no message for the duration is deleted; one with a
    subscription, a producer, a topic-level override or a partition is kept. With
    `delete_when_subscriptions_caught_up`, a topic whose subscriptions caught up is deleted,
    one with a backlog is kept. Off by default."""
    svc = make_service()
    svc.start()
    svc.create_namespace("public/caught")
    ns = "/admin/v2/namespaces/public/default/inactiveTopicPolicies"
    assert _admin(svc, "GET", ns) == (200, None)
    policy = {"inactiveTopicDeleteMode": "delete_when_no_subscriptions",
              "maxInactiveDurationSeconds": 2, "deleteWhileInactive": True}
    assert _admin(svc, "POST", ns, policy)[0] == 204
    assert _admin(svc, "GET", ns) == (200, policy)
    bad = dict(policy, maxInactiveDurationSeconds=-5)
    assert _admin(svc, "POST", ns, bad)[0] == 400
    caught = {"inactiveTopicDeleteMode": "delete_when_subscriptions_caught_up",
              "maxInactiveDurationSeconds": 2, "deleteWhileInactive": True}
    assert _admin(svc, "POST", "/admin/v2/namespaces/public/caught/inactiveTopicPolicies",
                  caught)[0] == 204
    base = "persistent://public/default/inactive"
    kept_override = f"{base}-override"
    assert _admin(svc, "POST", f"/admin/v2/persistent/public/default/inactive-override/"
                               "inactiveTopicPolicies",
                  dict(policy, deleteWhileInactive=False))[0] == 204
    assert _admin(svc, "PUT", "/admin/v2/persistent/public/default/inactive-parted/partitions",
                  2)[0] == 204

    client = pulsar.Client(svc.url, operation_timeout_seconds=20)
    for t in [f"{base}-gone", kept_override, f"{base}-parted"]:
        p = client.create_producer(t, batching_enabled=False)
        p.send(b"x")
        p.close()
    client.subscribe(f"{base}-subscribed", "s").close()
    attached = client.create_producer(f"{base}-attached")
    # Caught up: everything consumed and acknowledged, then the consumer leaves.
    done, behind = "persistent://public/caught/done", "persistent://public/caught/behind"
    for t in (done, behind):
        c = client.subscribe(t, "s")
        p = client.create_producer(t, batching_enabled=False)
        p.send(b"y")
        p.close()
        if t == done:
            c.acknowledge(c.receive(timeout_millis=10000))
            time.sleep(1.5)  # acknowledgements are grouped and saved every second
        c.close()

    _until(lambda: not _exists(svc, f"{base}-gone") and not _exists(svc, done), timeout=30)
    time.sleep(3)  # more than another duration: the others stay
    for t in [kept_override, f"{base}-subscribed", f"{base}-attached",
              f"{base}-parted-partition-0", behind]:
        assert _exists(svc, t), t
    attached.close()
    _until(lambda: not _exists(svc, f"{base}-attached"), timeout=30)
    assert _admin(svc, "DELETE", ns)[0] == 204
    assert _admin(svc, "GET", ns) == (200, None)
    client.close()
