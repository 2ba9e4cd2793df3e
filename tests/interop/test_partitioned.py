"""Partitioned topics: created through the admin API, used unchanged by the Python client."""
import json
import urllib.error
import urllib.request
import uuid

import pulsar
import pytest


def _admin(service, method, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{service.http_port}{path}", method=method,
                                 data=None if body is None else str(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_partitioned_topic_of_four(service):
    name = f"p-{uuid.uuid4().hex[:8]}"
    path = f"/admin/v2/persistent/public/default/{name}/partitions"
    assert _admin(service, "PUT", path, 4)[0] == 204
    status, body = _admin(service, "GET", path)
    assert status == 200 and json.loads(body) == {"partitions": 4}
    assert _admin(service, "PUT", path, 4)[0] == 409
    assert _admin(service, "POST", path, 2)[0] == 409
    assert _admin(service, "PUT", path.replace(name, name + "-bad"), "abc")[0] == 400

    client = pulsar.Client(service.url, operation_timeout_seconds=15)
    topic = f"persistent://public/default/{name}"
    producer = client.create_producer(topic, batching_enabled=False,
                                      message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    ids = [producer.send(f"m{i}".encode(), partition_key=f"k{i}") for i in range(200)]
    assert {i.partition() for i in ids} == {0, 1, 2, 3}
    got = []
    for _ in range(200):
        m = consumer.receive(timeout_millis=10000)
        got.append((m.data(), m.message_id().partition(), m.topic_name()))
        consumer.acknowledge(m)
    assert sorted(g[0] for g in got) == sorted(f"m{i}".encode() for i in range(200))
    for data, partition, topic_name in got:
        assert topic_name.endswith(f"-partition-{partition}")
    # Per-key order is kept within each partition.
    assert client.get_topic_partitions(topic) == [f"{topic}-partition-{i}" for i in range(4)]
    client.close()


def test_non_partitioned_topic_reports_zero(service):
    status, body = _admin(service, "GET", "/admin/v2/persistent/public/default/plain/partitions")
    assert status == 200 and json.loads(body) == {"partitions": 0}
