"""A crash in a topic's deletion after its log is gone and before its lake data is (issue 22,
failpoint `ops.before_lake_removal`). The deletion recorded its lake removal first; after the
restart the engine does it on its own, although the topic no longer exists:
- in a namespace's shared table, the deleted topic's rows go and the other topic's stay;
- a topic's own table is dropped.
Before the record, both stayed for good."""
import re
import uuid

import pulsar
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchTableError

from conftest import eventually
from lake import http, offload_and_wait, stats

FAST = {
    "LEDGERLAKE_LAKE__CHECK_INTERVAL": "100ms",
    "LEDGERLAKE_LEDGER__ROLLOVER_ENTRIES": "20",
    "LEDGERLAKE_LAKE__REMOVED_FILE_GRACE": "0s",
}
FAILPOINT = "ops.before_lake_removal"


def produce(client, topic, n):
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(n):
        producer.send(f"{topic}#{i}".encode())
    producer.close()


def catalog_of(svc):
    return SqlCatalog("ledgerlake", uri=f"sqlite:///{svc.data_dir}/data/catalog.db",
                      warehouse="")


def delete_and_crash(svc, topic):
    """DELETE `topic`; the failpoint aborts the service before the lake part."""
    path = topic.replace("persistent://", "persistent/")
    try:
        http("DELETE", f"{svc.http}/admin/v2/{path}")
    except OSError:
        pass  # the connection dies with the process
    eventually(lambda: svc.proc.poll() is not None, 60)
    assert svc.proc.returncode != 0
    with open(svc.log_path) as f:
        assert f"failpoint {FAILPOINT}: aborting" in f.read()


def restart(svc):
    svc.env.pop("LL_FAILPOINTS", None)
    svc.start()


def finished_logged(svc, topic):
    with open(svc.log_path) as f:
        return re.search(rf"finished the lake removal of a deleted topic.*{re.escape(topic)}",
                         f.read()) is not None


def test_a_crash_between_the_log_and_the_lake_leaves_no_rows_of_a_deleted_topic(make_service):
    svc = make_service(dict(FAST, LL_FAILPOINTS=FAILPOINT))
    svc.start()
    ns = f"public/del-{uuid.uuid4().hex[:6]}"
    svc.create_namespace(ns)
    status, body = http("PUT", f"{svc.http}/admin/v2/namespaces/{ns}/lakeTableLayout", "shared")
    assert status == 204, body
    client = pulsar.Client(svc.url, operation_timeout_seconds=30)
    gone, kept = f"persistent://{ns}/gone", f"persistent://{ns}/kept"
    own = f"persistent://public/default/own-{uuid.uuid4().hex[:6]}"
    for topic in (gone, kept, own):
        produce(client, topic, 45)
        offload_and_wait(svc, topic)
    lake = stats(svc, own)["lake"]
    own_ident = tuple(lake["namespace"]) + (lake["tableName"],)
    lake = stats(svc, gone)["lake"]
    shared_ident = tuple(lake["namespace"]) + (lake["tableName"],)
    topics = catalog_of(svc).load_table(shared_ident).scan().to_arrow().column("topic")
    assert sorted(set(topics.to_pylist())) == ["gone", "kept"]
    client.close()

    # The shared table's topic: the crash leaves its rows; the engine removes them.
    delete_and_crash(svc, gone)
    left = catalog_of(svc).load_table(shared_ident).scan().to_arrow().column("topic")
    assert left.to_pylist().count("gone") == 45, "the crash came before the lake removal"
    restart(svc)
    # The topic is gone (the log part was done): nothing of it is left to trigger the removal.
    status, topics = http("GET", f"{svc.http}/admin/v2/persistent/{ns}")
    assert status == 200 and gone not in topics, topics

    # Scanned once the engine says it is done (a scan planned before its commit could find
    # the removed files gone: this test runs with a zero grace).
    eventually(lambda: finished_logged(svc, gone), 60)
    t = catalog_of(svc).load_table(shared_ident)
    assert t.scan().to_arrow().column("topic").to_pylist() == ["kept"] * 45

    # A topic's own table: the crash leaves it; the engine drops it.
    svc.env["LL_FAILPOINTS"] = FAILPOINT
    svc.stop()
    svc.start()
    delete_and_crash(svc, own)
    catalog_of(svc).load_table(own_ident)  # still there
    restart(svc)

    def dropped():
        try:
            catalog_of(svc).load_table(own_ident)
        except NoSuchTableError:
            return True
        raise AssertionError("the deleted topic's table is still there")
    eventually(lambda: finished_logged(svc, own), 60)
    dropped()
    assert svc.stop() == 0
