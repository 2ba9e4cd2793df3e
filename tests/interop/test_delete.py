"""Deleting topics through Pulsar's admin paths, with the official Python client connected and
then gone: refused (412) while producers or consumers are connected; afterwards the log data,
subscriptions and schema are gone, the lake table is dropped and its files deleted, and a
producer recreates an empty topic of the same name."""
import os
import time

import pulsar

from lake import http, offload_and_wait, stats, table_of

FAST = {"LEDGERLAKE_LAKE__CHECK_INTERVAL": "100ms", "LEDGERLAKE_LEDGER__ROLLOVER_ENTRIES": "20"}


def files_under(location):
    path = location.removeprefix("file:").removeprefix("//")
    return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]


def produce(client, topic, n, prefix="m"):
    p = client.create_producer(topic, batching_enabled=False)
    for i in range(n):
        p.send(f"{prefix}{i}".encode())
    return p


def test_delete_topic_refused_while_in_use_then_everything_goes(make_service):
    svc = make_service(FAST)
    svc.start()
    client = pulsar.Client(svc.url)
    topic = "persistent://public/default/doomed"
    url = f"{svc.http}/admin/v2/persistent/public/default/doomed"
    producer = produce(client, topic, 50)
    consumer = client.subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest)
    for _ in range(10):
        consumer.acknowledge(consumer.receive(timeout_millis=10000))
    offload_and_wait(svc, topic)
    catalog, ident, location = table_of(svc, topic)
    assert files_under(location), "no table files to delete"

    status, body = http("DELETE", url)
    assert status == 412 and "producers" in body["reason"], (status, body)
    producer.close()
    status, body = http("DELETE", url)
    assert status == 412 and "consumers" in body["reason"] and "force" in body["reason"], body
    consumer.close()
    # Nothing was deleted by the refused attempts.
    assert stats(svc, topic)["lake"]["tableExists"]

    status, body = http("DELETE", url)
    assert status == 204, (status, body)
    assert not catalog.table_exists(ident)
    assert files_under(location) == []
    status, _ = http("DELETE", url)
    assert status == 404

    # The name is free again: a new, empty topic without the old subscription.
    p = produce(client, topic, 3, prefix="new")
    c = client.subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest)
    got = [c.receive(timeout_millis=10000).data() for _ in range(3)]
    assert got == [b"new0", b"new1", b"new2"]
    try:
        c.receive(timeout_millis=500)
        raise AssertionError("the deleted topic's messages came back")
    except pulsar.Timeout:
        pass
    p.close()
    c.close()
    client.close()
    assert svc.stop() == 0
    svc.start()  # recovery after a deletion
    client = pulsar.Client(svc.url)
    r = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [r.read_next(timeout_millis=10000).data() for _ in range(3)] == [b"new0", b"new1", b"new2"]
    client.close()


def test_forced_delete_closes_clients_which_reconnect_to_a_new_topic(make_service):
    svc = make_service(FAST)
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    topic = "persistent://public/default/forced"
    producer = produce(client, topic, 20)
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    for i in range(20):
        m = consumer.receive(timeout_millis=10000)
        assert m.data() == f"m{i}".encode()
        consumer.acknowledge(m)
    status, body = http("DELETE", f"{svc.http}/admin/v2/persistent/public/default/forced?force=true")
    assert status == 204, (status, body)
    # The clients were closed by the broker, reconnect, and meet a new, empty topic.
    deadline = time.time() + 30
    while True:
        try:
            producer.send(b"after")
            break
        except pulsar.PulsarException:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
    m = consumer.receive(timeout_millis=30000)
    assert m.data() == b"after"
    assert m.message_id().entry_id() == 0
    st = stats(svc, topic)
    assert all(l["ledger"]["state"] != "deleted" for l in st["ledgers"]), st["ledgers"]
    client.close()


def test_delete_partitioned_topic_and_keep_table_when_configured(make_service):
    svc = make_service(dict(FAST, LEDGERLAKE_LAKE__DROP_TABLE_ON_TOPIC_DELETE="false"))
    svc.start()
    base = f"{svc.http}/admin/v2/persistent/public/default/parted"
    assert http("PUT", f"{base}/partitions", "3")[0] in (200, 204)
    client = pulsar.Client(svc.url)
    topic = "persistent://public/default/parted"
    produce(client, topic, 30).close()
    offload_and_wait(svc, topic)
    catalog, ident, location = table_of(svc, topic)
    status, body = http("DELETE", base)
    assert status == 409, (status, body)  # a partitioned topic is deleted through .../partitions
    # One partition alone cannot be deleted: it would take the topic's metadata and table along.
    status, body = http("DELETE", f"{base}-partition-1?force=true")
    assert status == 409, (status, body)
    assert http("GET", f"{base}/partitions") == (200, {"partitions": 3})
    status, body = http("DELETE", f"{base}/partitions")
    assert status == 204, (status, body)
    assert http("GET", f"{base}/partitions") == (200, {"partitions": 0})
    # Kept by configuration, whole.
    assert catalog.table_exists(ident)
    assert len(catalog.load_table(ident).scan().to_arrow()) == 30
    assert http("DELETE", f"{svc.http}/admin/v2/persistent/public/default/never-was")[0] == 404
    client.close()


def test_a_partition_name_no_partitioned_topic_declares_is_a_topic_of_its_own(make_service):
    """A topic whose name ends in -partition-N with no partitioned topic behind it (a client
    made it) is deleted like any other topic; a partition of a declared partitioned topic
    still is not."""
    svc = make_service(FAST)
    svc.start()
    client = pulsar.Client(svc.url)
    topic = "persistent://public/default/solo-partition-2"
    url = f"{svc.http}/admin/v2/persistent/public/default/solo-partition-2"
    produce(client, topic, 10).close()
    assert http("GET", f"{svc.http}/admin/v2/persistent/public/default/solo/partitions") \
        == (200, {"partitions": 0})
    status, body = http("DELETE", url)
    assert status == 204, (status, body)
    status, body = http("GET", f"{url}/stats")
    assert status == 404, (status, body)
    status, body = http("DELETE", url)
    assert status == 404 and "solo-partition-2" in body["reason"], (status, body)
    # Beside another topic of its base name, whose lake table it shares: refused.
    for i in (0, 1):
        produce(client, f"persistent://public/default/pair-partition-{i}", 3).close()
    status, body = http("DELETE", f"{svc.http}/admin/v2/persistent/public/default/pair-partition-0")
    assert status == 409 and "pair-partition-1" in body["reason"], (status, body)
    # Declared: its partitions go only with it.
    base = f"{svc.http}/admin/v2/persistent/public/default/declared"
    assert http("PUT", f"{base}/partitions", "2")[0] in (200, 204)
    produce(client, "persistent://public/default/declared", 4).close()
    status, body = http("DELETE", f"{base}-partition-1")
    assert status == 409, (status, body)
    client.close()
