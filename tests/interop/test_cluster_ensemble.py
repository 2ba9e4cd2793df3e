"""Ensemble changes (issue 19, slice 3; ADR 0016): four nodes on one etcd, the namespace's
persistence policy 3/3/2. A replica killed while its ledger takes writes is replaced in that
ledger's ensemble by the fourth node: the ledger does not roll, the new bookie gets every
earlier entry from the writer and every later one, and it alone can serve the whole ledger."""
import signal
import uuid

import pulsar

from conftest import eventually
from test_cluster_replication import (_bookie_id, _cluster, _http, _ledgers, _metric, _owner,
                                      _read_all)

# LedgerState discriminants as etcd stores them.
OPEN, SEALED = 1, 2


def test_a_replica_killed_mid_ledger_is_replaced_in_its_ensemble(etcd, make_service):
    prefix, nodes = _cluster(etcd, make_service, "ensemble", n=4)
    ns = f"{nodes[0].http}/admin/v2/namespaces/public/default/persistence"
    assert _http("POST", ns, {"bookkeeperEnsemble": 3, "bookkeeperWriteQuorum": 3,
                              "bookkeeperAckQuorum": 2,
                              "managedLedgerMaxMarkDeleteRate": 0.0})[0] == 204
    topic = f"persistent://public/default/ensemble-{uuid.uuid4().hex[:6]}"
    path = "/admin/v2/persistent/public/default/" + topic.rsplit("/", 1)[1]
    client = pulsar.Client("pulsar://" + ",".join(f"127.0.0.1:{n.pulsar_port}" for n in nodes),
                           operation_timeout_seconds=60)
    sent = [f"m{i}" for i in range(300)]
    try:
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=60000)
        for body in sent[:150]:
            producer.send(body.encode())
        (writer,) = _owner(etcd, prefix, topic, nodes)
        before = {i: r for i, r in _ledgers(etcd, prefix).items() if r["state"] == OPEN}
        assert len(before) == 1, before
        (ledger,) = before.values()
        assert ledger["bookie"] == _bookie_id(writer)
        by_bookie = {_bookie_id(n): n for n in nodes}
        killed, kept = (by_bookie[b] for b in ledger["replicas"])
        (spare,) = [n for n in nodes if n not in (writer, killed, kept)]

        # A replica dies mid-ledger: the producer goes on, and the same ledger, still open,
        # lists the spare in the dead replica's place.
        killed.stop(signal.SIGKILL)
        for body in sent[150:]:
            producer.send(body.encode())
        def replaced():
            # The change runs in the background of the writes: the record first, then the
            # catch-up, then the metric.
            after = _ledgers(etcd, prefix)
            now = after[ledger["id"]]
            assert now["state"] == OPEN, "the ledger did not roll"
            assert [i for i, r in after.items() if r["topic_id"] == ledger["topic_id"]] \
                == [ledger["id"]], "no other ledger was opened for the topic"
            assert now["replicas"] == [_bookie_id(spare) if b == _bookie_id(killed) else b
                                       for b in ledger["replicas"]], now
            assert _metric(writer, 'ledgerlake_ensemble_changes_total{outcome="replaced"}') == 1
        eventually(replaced, timeout=30)
        assert _read_all(client, topic, len(sent)) == sent

        # Sealed, the ledger lists the spare as a complete copy.
        status, body = _http("PUT", f"{writer.http}{path}/unload")
        assert status == 204, body
        producer.close()

        def sealed():
            record = _ledgers(etcd, prefix)[ledger["id"]]
            assert record["state"] == SEALED and record["seal"]["entry_count"] == len(sent)
            assert _bookie_id(spare) in record["replicas"], record
        eventually(sealed, timeout=30)

        # The spare alone serves the whole ledger, the entries it got from the writer's copy
        # included: every other node is gone.
        writer.stop(signal.SIGKILL)
        kept.stop(signal.SIGKILL)
        alone = pulsar.Client(spare.url, operation_timeout_seconds=60)
        try:
            def all_read():
                assert _read_all(alone, topic, len(sent)) == sent
            eventually(all_read, timeout=60, interval=2)
        finally:
            alone.close()
    finally:
        client.close()
