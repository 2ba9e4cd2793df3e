"""A cluster sharing one lake (issue 19): two nodes on one etcd, one S3 warehouse and one
PostgreSQL catalog. A topic moved between the nodes has sealed ledgers on both bookies; each
node offloads the ledgers its bookie holds, in ledger order, into the one table, which then
holds every message exactly once (PyIceberg reads it), and consumers replay it from the lake."""
import json
import threading
import time
import uuid

import pulsar
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError

from conftest import _free_port, eventually
from lake import http, lake_rows, offload_and_wait, read_all, stats


def test_a_moved_topic_is_offloaded_by_each_bookie_in_order(etcd, make_service, s3_server,
                                                            postgres):
    db = f"cat_{uuid.uuid4().hex[:8]}"
    uri = postgres.create_database(db)
    prefix = f"cl-{uuid.uuid4().hex[:8]}"
    env = dict(s3_server.service_env(prefix), LEDGERLAKE_LAKE__CATALOG__URI=uri,
               LEDGERLAKE_METADATA__SESSION_TTL="3s")
    nodes = [make_service(env=env, args=["--metadata-url", etcd.url("/cl-lake"),
                                         "--bookie-addr", f"127.0.0.1:{_free_port()}"])
             for _ in range(2)]
    for n in nodes:
        n.start()
    name = f"moved-{uuid.uuid4().hex[:6]}"
    topic = f"persistent://public/default/{name}"
    path = f"/admin/v2/persistent/public/default/{name}"
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{n.pulsar_port}" for n in nodes),
                           operation_timeout_seconds=30)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(60):
            producer.send(f"a{i}".encode(), partition_key=f"k{i % 5}")
        owners = {}
        for key, value in etcd.items("/cl-lake/cluster/owners/").items():
            owners[key.rsplit("/cluster/owners/", 1)[1]] = json.loads(value[1:])["id"]
        first = [n for n in nodes if f"127.0.0.1:{n.http_port}" == owners[topic]][0]
        second = [n for n in nodes if n is not first][0]
        status, _ = http("PUT", f"{first.http}{path}/unload"
                                f"?destinationBroker=127.0.0.1:{second.http_port}")
        assert status == 204
        for i in range(60):
            producer.send(f"b{i}".encode(), partition_key=f"k{i % 5}")
        produced = read_all(client, topic, 120)

        # Offload everything: the new owner seals its ledger; its engine waits for the old
        # owner's engine to commit the first ledger, then commits its own.
        status, body = http("PUT", f"{second.http}{path}/offload")
        assert status == 200, body

        def load():
            st = stats(second, topic)
            assert st["lake"].get("tableName"), st["lake"]
            catalog = SqlCatalog(st["lake"]["catalog"],
                                 uri=uri.replace("postgres://", "postgresql+psycopg2://"),
                                 warehouse=f"s3://warehouse/{prefix}",
                                 **s3_server.pyiceberg_props())
            ident = tuple(st["lake"]["namespace"]) + (st["lake"]["tableName"],)
            try:
                return catalog.load_table(ident)
            except NoSuchTableError as e:
                raise AssertionError(f"no table yet: {e}") from e

        def all_in_the_lake():
            assert len(lake_rows(load())[0]) == 120
        eventually(all_in_the_lake, timeout=90, interval=1)
        rows, _ = lake_rows(load())
        assert {k: v["payload"] for k, v in rows.items()} == \
            {k: v["payload"] for k, v in produced.items()}
        assert len({k[0] for k in rows}) >= 2, "ledgers of both bookies are in the table"

        # The owner's view follows what the other node offloaded.
        def recorded():
            _, internal = http("GET", f"{second.http}{path}/internalStats")
            held = [l for l in internal["ledgers"] if l["entries"] > 0]
            assert held and all(l["offloaded"] for l in held), internal["ledgers"]
        eventually(recorded, timeout=30)

        # SQL on both nodes agrees with the lake.
        for n in nodes:
            status, body = http("POST", f"{n.http}/sql", f'SELECT count(*) AS n FROM "{name}"')
            assert status == 200 and body == [{"n": 120}], body
    finally:
        client.close()


def test_a_topic_deleted_while_another_node_commits_to_its_shared_table_leaves_no_rows(
        etcd, make_service, s3_server, postgres):
    """Two topics of a namespace in the shared table layout, owned by different nodes. The
    deleting node's removal of its topic's rows is held 6 s before its catalog commit
    (failpoint) while the other node commits the other topic's offload to the same table: the
    removal loses that race, is built again on the new version, and the deletion succeeds
    with none of the deleted topic's rows left in the table (before, the deletion failed after
    the log was gone, and an inactive topic's deletion left its rows for good)."""
    db = f"cat_{uuid.uuid4().hex[:8]}"
    uri = postgres.create_database(db)
    prefix = f"cl-{uuid.uuid4().hex[:8]}"
    env = dict(s3_server.service_env(prefix), LEDGERLAKE_LAKE__CATALOG__URI=uri,
               LEDGERLAKE_METADATA__SESSION_TTL="3s", LEDGERLAKE_LAKE__CHECK_INTERVAL="100ms",
               LEDGERLAKE_BROKER__RETENTION_CHECK_INTERVAL="100ms",
               LL_FAILPOINTS="retention.before_catalog_commit=sleep(6000)")
    nodes = [make_service(env=env, args=["--metadata-url", etcd.url(f"/{prefix}"),
                                         "--bookie-addr", f"127.0.0.1:{_free_port()}"])
             for _ in range(2)]
    for n in nodes:
        n.start()
    ns = f"public/shdel-{uuid.uuid4().hex[:6]}"
    nodes[0].create_namespace(ns)
    status, body = http("PUT", f"{nodes[0].http}/admin/v2/namespaces/{ns}/lakeTableLayout",
                        "shared")
    assert status == 204, body
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{n.pulsar_port}" for n in nodes),
                           operation_timeout_seconds=30)
    try:
        # Twelve topics: all on one node with probability 2/4096.
        names = [f"t{i}" for i in range(12)]
        for name in names:
            producer = client.create_producer(f"persistent://{ns}/{name}")
            for i in range(5):
                producer.send(f"{name}-{i}".encode())
            producer.close()
        owners = {}
        for key, value in etcd.items(f"/{prefix}/cluster/owners/").items():
            owners[key.rsplit("/", 1)[1]] = json.loads(value[1:])["id"]
        node_of = {f"127.0.0.1:{n.http_port}": n for n in nodes}
        a = names[0]
        b = next(n for n in names if owners[n] != owners[a])
        deleter, committer = node_of[owners[a]], node_of[owners[b]]
        for name, node in [(a, deleter), (b, committer)]:
            offload_and_wait(node, f"persistent://{ns}/{name}")
        st = stats(committer, f"persistent://{ns}/{b}")
        catalog = SqlCatalog(st["lake"]["catalog"],
                             uri=uri.replace("postgres://", "postgresql+psycopg2://"),
                             warehouse=f"s3://warehouse/{prefix}", **s3_server.pyiceberg_props())
        ident = tuple(st["lake"]["namespace"]) + (st["lake"]["tableName"],)

        def rows_of(name):
            table = catalog.load_table(ident)
            return table.scan(row_filter=f"topic == '{name}'").to_arrow().num_rows

        assert (rows_of(a), rows_of(b)) == (5, 5)
        deleted = {}

        def delete():
            deleted["answer"] = http("DELETE", f"{deleter.http}/admin/v2/persistent/{ns}/{a}")

        thread = threading.Thread(target=delete)
        thread.start()
        # While the deleting node holds its removal, the other node commits to the table.
        time.sleep(1)
        producer = client.create_producer(f"persistent://{ns}/{b}")
        for i in range(5, 10):
            producer.send(f"{b}-{i}".encode())
        producer.close()
        offload_and_wait(committer, f"persistent://{ns}/{b}")
        assert thread.is_alive(), "the removal was not held while the other node committed"
        thread.join(timeout=120)
        assert deleted["answer"][0] == 204, deleted
        with open(deleter.log_path) as f:
            log = f.read()
        assert "lost a commit race" in log, "the removal did not race the commit"
        assert (rows_of(a), rows_of(b)) == (0, 10)
    finally:
        client.close()
