"""What one node of a cluster changes, every node enforces (issue 19): namespace policies,
permissions and namespaces are cached by each node, and a change made through one node's admin
API reaches the caches of the others through an etcd watch of the metadata store. Each change
below is made through the node that does *not* own the topic, after the owner has cached what
it replaces."""
import json
import threading
import urllib.error
import urllib.request
import uuid

import pulsar

from conftest import eventually
from test_cluster_auth import APP_TOKEN, AUTH, NODE_TOKEN, VIEWER_TOKEN
from test_cluster_ownership import _cluster, _id, _multi_url, _owners


def _admin(node, method, path, body=None):
    """Status of one admin call as the superuser `app`."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{node.http}/admin/v2{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {APP_TOKEN}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _get(node, path):
    req = urllib.request.Request(f"{node.http}/admin/v2{path}",
                                 headers={"Authorization": f"Bearer {APP_TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def _refusal(client, topic):
    """The class name of the error creating a producer on `topic` raised; None if it was
    accepted (the producer is closed again)."""
    try:
        client.create_producer(topic).close()
        return None
    except pulsar.PulsarException as e:
        return type(e).__name__


def test_a_change_made_on_one_node_is_enforced_by_the_owner_on_another(etcd, make_service):
    prefix = f"/pol-{uuid.uuid4().hex[:6]}"
    nodes = _cluster(etcd, make_service, prefix, env=dict(
        AUTH, LEDGERLAKE_BROKER__AUTHENTICATION__NODE_TOKEN=NODE_TOKEN))
    ns = f"public/pol-{uuid.uuid4().hex[:6]}"
    topic = f"persistent://{ns}/t"
    assert _admin(nodes[0], "PUT", f"/namespaces/{ns}") == 204
    assert _admin(nodes[0], "POST", f"/namespaces/{ns}/permissions/viewer", ["produce"]) == 204
    app = pulsar.Client(_multi_url(nodes), authentication=pulsar.AuthenticationToken(APP_TOKEN),
                        operation_timeout_seconds=15)
    viewer = pulsar.Client(_multi_url(nodes),
                           authentication=pulsar.AuthenticationToken(VIEWER_TOKEN),
                           operation_timeout_seconds=15)
    clients = [app, viewer]
    try:
        # The owner loads the topic, its namespace's policies and the viewer's grant.
        first = viewer.create_producer(topic)
        first.send(b"granted")
        owner_id = _owners(etcd, prefix)[topic]
        (owner,) = [n for n in nodes if _id(n) == owner_id]
        (other,) = [n for n in nodes if _id(n) != owner_id]
        # The checks below talk to the owner alone: the client sends its lookups to the hosts
        # of a multi-host URL in turn, and the node that made a change refuses by itself.
        owner_url = f"pulsar://127.0.0.1:{owner.pulsar_port}"
        app_at_owner = pulsar.Client(owner_url, operation_timeout_seconds=15,
                                     authentication=pulsar.AuthenticationToken(APP_TOKEN))
        viewer_at_owner = pulsar.Client(owner_url, operation_timeout_seconds=15,
                                        authentication=pulsar.AuthenticationToken(VIEWER_TOKEN))
        clients += [app_at_owner, viewer_at_owner]

        # A producer limit set on the other node: the owner refuses a second producer.
        assert _admin(other, "POST", f"/namespaces/{ns}/maxProducersPerTopic", 1) == 204
        eventually(lambda: _refusal(app_at_owner, topic) == "ProducerBusy", timeout=20)
        # And lifted there again: the owner accepts it.
        assert _admin(other, "DELETE", f"/namespaces/{ns}/maxProducersPerTopic") == 204
        eventually(lambda: _refusal(app_at_owner, topic) is None, timeout=20)

        # The grant revoked on the other node: the owner refuses the viewer's new producers.
        assert _admin(other, "DELETE", f"/namespaces/{ns}/permissions/viewer") == 204
        eventually(lambda: _refusal(viewer_at_owner, topic) == "AuthorizationError", timeout=20)
        # Granted again there: accepted again.
        assert _admin(other, "POST", f"/namespaces/{ns}/permissions/viewer", ["produce"]) == 204
        eventually(lambda: _refusal(viewer_at_owner, topic) is None, timeout=20)
        first.send(b"still connected")
    finally:
        for c in clients:
            c.close()


def test_two_nodes_updating_one_namespace_at_once_lose_neither_change(etcd, make_service):
    """Each update of a namespace's policies reads the stored record and writes it back with a
    compare-and-set: two nodes changing two different policies of one namespace at the same
    moment both land (a node updating from its cached copy would write back the other's old
    value)."""
    prefix = f"/pol-{uuid.uuid4().hex[:6]}"
    nodes = _cluster(etcd, make_service, prefix, env=dict(
        AUTH, LEDGERLAKE_BROKER__AUTHENTICATION__NODE_TOKEN=NODE_TOKEN))
    ns = f"public/cas-{uuid.uuid4().hex[:6]}"
    assert _admin(nodes[0], "PUT", f"/namespaces/{ns}") == 204
    fields = ["maxProducersPerTopic", "maxConsumersPerTopic"]
    for n, field in zip(nodes, fields):
        assert _get(n, f"/namespaces/{ns}/{field}") is None, "cached empty on each node"
    for i in range(1, 21):
        statuses = {}

        def put(node, field):
            statuses[field] = _admin(node, "POST", f"/namespaces/{ns}/{field}", i)

        threads = [threading.Thread(target=put, args=(n, f)) for n, f in zip(nodes, fields)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert statuses == dict.fromkeys(fields, 204), statuses
        for n in nodes:
            for field in fields:
                eventually(lambda: _get(n, f"/namespaces/{ns}/{field}") == i, timeout=10)
