"""A node whose metadata store is etcd (`--metadata-url etcd://…`), the first slice of the
cluster issue: topics, ledgers, cursors, partition counts and policies live in a real etcd
server, survive a SIGKILL of the node, and nothing falls back to the embedded SQLite file."""
import json
import os
import signal
import socket
import subprocess
import urllib.error
import urllib.request

import pulsar
import pytest

from conftest import eventually

TOPIC = "persistent://public/default/on-etcd"


def _admin(svc, method, path, body=None):
    req = urllib.request.Request(svc.http + path, method=method,
                                 data=None if body is None else str(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_a_node_keeps_its_metadata_in_etcd_across_a_kill(etcd, make_service):
    svc = make_service(args=["--metadata-url", etcd.url("/node-a")])
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    try:
        consumer = client.subscribe(TOPIC, "audit",
                                    initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(TOPIC, batching_enabled=False)
        ids = [producer.send(f"m-{i}".encode()) for i in range(200)]
        for _ in range(100):
            consumer.acknowledge(consumer.receive(timeout_millis=10_000))
        parts = "/admin/v2/persistent/public/default/spread/partitions"
        assert _admin(svc, "PUT", parts, 3)[0] == 204
        assert _admin(svc, "POST", "/admin/v2/namespaces/public/default/messageTTL", 3600)[0] == 204
        # Acknowledgements reach the store within the cursor-persist interval.
        def cursor_saved():
            assert any("/cursors/" in k for k in etcd.keys("/node-a/")), etcd.keys("/node-a/")
        eventually(cursor_saved, timeout=15)
    finally:
        client.close()

    keys = etcd.keys("/node-a/")
    assert f"/node-a/topics/name/{TOPIC}" in keys, keys
    assert any(k.startswith("/node-a/ledgers/") for k in keys), keys
    assert "/node-a/partitioned/persistent://public/default/spread" in keys, keys
    assert any(k.startswith("/node-a/policies/") for k in keys), keys
    assert not os.path.exists(os.path.join(svc.data_dir, "data", "metadata.db")), \
        "an etcd node must not write the embedded metadata file"

    # A graceful stop saves every cursor: the subscription resumes exactly after what was
    # acknowledged.
    assert svc.stop(signal.SIGTERM) == 0
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    try:
        consumer = client.subscribe(TOPIC, "audit")
        got = [consumer.receive(timeout_millis=10_000).data().decode() for _ in range(100)]
        assert got == [f"m-{i}" for i in range(100, 200)], got[:5]
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=1_000)
    finally:
        client.close()

    # A SIGKILL loses no acknowledged message: the ledgers etcd records are read back whole.
    svc.stop(signal.SIGKILL)
    svc.start()
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    try:
        reader = client.create_reader(TOPIC, pulsar.MessageId.earliest)
        everything = [reader.read_next(timeout_millis=10_000).message_id() for _ in ids]
        assert [str(m) for m in everything] == [str(m) for m in ids]
    finally:
        client.close()
    status, body = _admin(svc, "GET", "/admin/v2/persistent/public/default/spread/partitions")
    assert status == 200 and json.loads(body) == {"partitions": 3}
    status, body = _admin(svc, "GET", "/admin/v2/namespaces/public/default/messageTTL")
    assert status == 200 and json.loads(body) == 3600


def test_two_prefixes_of_one_etcd_are_two_separate_stores(etcd, make_service):
    a = make_service(args=["--metadata-url", etcd.url("/team-a")])
    b = make_service(args=["--metadata-url", etcd.url("/team-b")])
    a.start()
    b.start()
    assert _admin(a, "PUT", "/admin/v2/persistent/public/default/only-a/partitions", 2)[0] == 204
    status, body = _admin(b, "GET", "/admin/v2/persistent/public/default/partitioned")
    assert status == 200 and json.loads(body) == [], body
    status, body = _admin(a, "GET", "/admin/v2/persistent/public/default/partitioned")
    assert status == 200 and json.loads(body) == ["persistent://public/default/only-a"], body


def test_a_node_without_its_etcd_refuses_to_start(make_service):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    svc = make_service(args=["--metadata-url", f"etcd://127.0.0.1:{port}"])
    with pytest.raises(RuntimeError) as failed:
        svc.start()
    assert "etcd" in str(failed.value), str(failed.value)[-2000:]
    assert svc.proc.poll() not in (None, 0)


@pytest.mark.parametrize("url", ["etcd://", "etcd://host-without-port", "zk://127.0.0.1:2181"])
def test_a_malformed_metadata_url_is_a_configuration_error(url, tmp_path):
    binary = os.environ["LL_TEST_BIN"]
    r = subprocess.run([binary, "serve", "--data-dir", str(tmp_path / "d"), "--metadata-url", url,
                        "--pulsar-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
                        "--pg-addr", "127.0.0.1:0"],
                       capture_output=True, timeout=60)
    assert r.returncode != 0
    assert b"metadata.url" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "d" / "metadata.db").exists()
